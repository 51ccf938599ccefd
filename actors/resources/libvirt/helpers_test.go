package libvirt

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	lv "libvirt.org/go/libvirt"

	"understudy/actors/resources/libvirt/rules"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the golden files in testdata/")

// testConn opens libvirt's built-in test driver, the one every test here
// runs against, and keeps it open for the test: while it is, all
// connections of this process to test:///default share one state. A
// machine without libvirt0 fails the test: the suite never skips it.
func testConn(t *testing.T) *lv.Connect {
	t.Helper()
	conn, err := lv.NewConnect(rules.TestURI)
	if err != nil {
		if errors.Is(plain(err), ErrLibraryMissing) {
			t.Fatalf("libvirt0 is missing: run scripts/install-test-deps.sh (it installs libvirt0, whose built-in test:///default driver these tests use): %v", plain(err))
		}
		t.Fatalf("cannot open %s (is libvirt0 complete? run scripts/install-test-deps.sh): %v", rules.TestURI, plain(err))
	}
	t.Cleanup(func() { closeConn(conn) })
	return conn
}

// golden compares got with testdata/name, or rewrites it with -rewrite.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *rewrite {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -tags libvirt_dlopen ./actors/resources/libvirt -rewrite to create it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from the rendering (review, then rerun with -rewrite):\n--- want\n%s\n--- got\n%s", path, want, got)
	}
}

func contains(t *testing.T, what, got, want string) {
	t.Helper()
	if !strings.Contains(got, want) {
		t.Errorf("%s: %q does not contain %q", what, got, want)
	}
}
