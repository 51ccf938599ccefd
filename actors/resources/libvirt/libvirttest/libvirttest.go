// Package libvirttest helps the tests of the libvirt driver process: it
// builds understudy-libvirt once per test binary, and runs a libvirtd that
// accepts connections and never answers. Tests only; the packages that use
// it (actors/resources/libvirt and its direct subpackage, runtime) run
// against libvirt's real test:///default driver, never a mock, and fail —
// never skip — when the driver cannot be built or libvirt0 is missing.
package libvirttest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sync"
	"testing"
)

// driverPackage is understudy-libvirt's package; the binary is named
// after it, as go build names it. (This package imports no understudy
// package: the libvirt package's own tests use it.)
const driverPackage = "understudy/cmd/understudy-libvirt"

var driverName = path.Base(driverPackage)

var (
	driverOnce sync.Once
	driverDir  string // removed by Main
	driverPath string
	driverErr  error
)

// Main runs a package's tests (call it from TestMain) and removes the
// understudy-libvirt DriverBinary built.
func Main(m *testing.M) {
	code := m.Run()
	if driverDir != "" {
		_ = os.RemoveAll(driverDir)
	}
	os.Exit(code)
}

// DriverBinary builds understudy-libvirt once per test binary (into a
// directory of its own, where nothing else is) and checks that it loads
// libvirt; either failing fails the test.
func DriverBinary(t testing.TB) string {
	t.Helper()
	driverOnce.Do(func() {
		driverDir, driverErr = os.MkdirTemp("", "understudy-libvirt-test-")
		if driverErr != nil {
			return
		}
		driverPath = filepath.Join(driverDir, driverName)
		out, err := exec.Command("go", "build", "-tags", "libvirt_dlopen", "-o", driverPath, driverPackage).CombinedOutput()
		if err != nil {
			driverErr = fmt.Errorf("cannot build %s (it links libvirt through cgo: it needs gcc): %v\n%s", driverName, err, out)
			return
		}
		if out, err := exec.Command(driverPath, "--version").CombinedOutput(); err != nil {
			driverErr = fmt.Errorf("%s cannot load libvirt: run scripts/install-test-deps.sh (it installs libvirt0, whose test:///default driver these tests use): %v\n%s", driverName, err, out)
		}
	})
	if driverErr != nil {
		t.Fatal(driverErr)
	}
	return driverPath
}

// Silent is a libvirtd that hangs: it accepts connections and never
// answers. A libvirt call to it blocks until the connection closes.
type Silent struct {
	Addr string // host:port
	// Accepted receives once per connection accepted: a test waits on it
	// to know a call is under way. Buffered for 64 connections; more are
	// accepted all the same, without notice.
	Accepted <-chan struct{}
}

// URI is the qemu+tcp URI of s.
func (s *Silent) URI() string { return "qemu+tcp://" + s.Addr + "/system" }

// SilentLibvirtd starts a Silent on a loopback port; it closes its
// connections when the test ends, which fails the calls still waiting.
func SilentLibvirtd(t testing.TB) *Silent {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan struct{}, 64)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			select {
			case accepted <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return &Silent{Addr: ln.Addr().String(), Accepted: accepted}
}
