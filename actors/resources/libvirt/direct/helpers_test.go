package direct

import (
	"errors"
	"testing"

	lv "libvirt.org/go/libvirt"

	"understudy/actors/resources/libvirt"
	"understudy/actors/resources/libvirt/rules"
)

// testConn opens libvirt's built-in test driver, the one every test here
// runs against, and keeps it open for the test: while it is, all
// connections of this process to test:///default share one state. A
// machine without libvirt0 fails the test: the suite never skips it.
func testConn(t *testing.T) *lv.Connect {
	t.Helper()
	conn, err := lv.NewConnect(rules.TestURI)
	if err != nil {
		if errors.Is(plain(err), libvirt.ErrLibraryMissing) {
			t.Fatalf("libvirt0 is missing: run scripts/install-test-deps.sh (it installs libvirt0, whose built-in test:///default driver these tests use): %v", plain(err))
		}
		t.Fatalf("cannot open %s (is libvirt0 complete? run scripts/install-test-deps.sh): %v", rules.TestURI, plain(err))
	}
	t.Cleanup(func() { closeConn(conn) })
	return conn
}

func mustXML(t *testing.T, vm *libvirt.VM) string {
	t.Helper()
	x, err := vm.DomainXML()
	if err != nil {
		t.Fatal(err)
	}
	return x
}
