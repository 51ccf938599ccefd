package runtime

import (
	goruntime "runtime"
	"runtime/debug"
	"strings"
)

// Version is the release version, set at build time:
//
//	go build -ldflags "-X understudy/runtime.Version=v1.2.3" ./cmd/understudy
var Version = "dev"

// BuildInfo describes the running binary.
type BuildInfo struct {
	Version   string // Version
	GoVersion string // e.g. go1.26.8
	Platform  string // GOOS/GOARCH
	// Revision, Time and Modified come from the VCS stamp go build embeds;
	// empty when the binary was built without one (go test, -buildvcs=false).
	Revision string
	Time     string
	Modified bool
}

// ReadBuildInfo returns the build information of the running binary.
func ReadBuildInfo() BuildInfo {
	b := BuildInfo{
		Version:   Version,
		GoVersion: goruntime.Version(),
		Platform:  goruntime.GOOS + "/" + goruntime.GOARCH,
	}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Revision = s.Value
			case "vcs.time":
				b.Time = s.Value
			case "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	return b
}

// String is one line: "understudy dev (go1.26.8 linux/amd64, rev 1a2b3c4 2025-01-01T00:00:00Z, modified)".
func (b BuildInfo) String() string {
	parts := []string{b.GoVersion + " " + b.Platform}
	if b.Revision != "" {
		rev := "rev " + b.Revision
		if b.Time != "" {
			rev += " " + b.Time
		}
		parts = append(parts, rev)
		if b.Modified {
			parts = append(parts, "modified")
		}
	}
	return "understudy " + b.Version + " (" + strings.Join(parts, ", ") + ")"
}
