package runtime

import (
	goruntime "runtime"
	"testing"
)

func TestReadBuildInfo(t *testing.T) {
	b := ReadBuildInfo()
	if b.Version != Version || b.GoVersion != goruntime.Version() || b.Platform != goruntime.GOOS+"/"+goruntime.GOARCH {
		t.Errorf("ReadBuildInfo() = %+v", b)
	}
	if Version != "dev" {
		t.Errorf("Version = %q without -ldflags, want dev", Version)
	}
}

func TestBuildInfoString(t *testing.T) {
	for _, tc := range []struct {
		b    BuildInfo
		want string
	}{
		{BuildInfo{Version: "dev", GoVersion: "go1.26.8", Platform: "linux/amd64"},
			"understudy dev (go1.26.8 linux/amd64)"},
		{BuildInfo{Version: "v1.0.0", GoVersion: "go1.26.8", Platform: "linux/arm64", Revision: "abc123", Time: "2025-01-02T03:04:05Z"},
			"understudy v1.0.0 (go1.26.8 linux/arm64, rev abc123 2025-01-02T03:04:05Z)"},
		{BuildInfo{Version: "v1.0.0", GoVersion: "go1.26.8", Platform: "linux/arm64", Revision: "abc123", Modified: true},
			"understudy v1.0.0 (go1.26.8 linux/arm64, rev abc123, modified)"},
	} {
		if got := tc.b.String(); got != tc.want {
			t.Errorf("%+v.String() = %q, want %q", tc.b, got, tc.want)
		}
	}
}
