package vm

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"understudy/actors/capability"
	"understudy/actors/resources/libvirt"
	"understudy/actors/resources/libvirt/libvirttest"
	"understudy/actors/resources/libvirt/rules"
)

// The tests run against libvirt's real test:///default driver, in a real
// understudy-libvirt process: never a mock. They fail — never skip — when
// it cannot be built or libvirt0 is missing (scripts/install-test-deps.sh).

func TestMain(m *testing.M) { libvirttest.Main(m) }

// world is one understudy-libvirt on a unix socket, with a test:///default
// state of its own (libvirt keeps one per process): the VM under test
// reaches it through conn, and the test looks at it (and defines domains)
// behind the VM's back through behind. behind's connection stays open for
// the whole test, which keeps that state alive between the VM's Fresh
// calls (each opens and closes a connection of its own).
type world struct {
	conn   *libvirt.DriverProcess
	behind libvirt.Hypervisor
	logs   *logBuffer
}

func newWorld(t *testing.T) *world {
	t.Helper()
	sock := driverSocket(t)
	logs := &logBuffer{}
	conn := libvirt.NewDriverProcess(libvirt.DriverConfig{Socket: sock}, slog.New(slog.NewTextHandler(logs, nil)))
	t.Cleanup(func() { conn.Close() })
	behindConn := libvirt.NewDriverProcess(libvirt.DriverConfig{Socket: sock}, nil)
	t.Cleanup(func() { behindConn.Close() })
	w := &world{conn: conn, behind: behindConn.Hypervisor(rules.TestURI), logs: logs}
	if st := w.state(t, "test"); st != libvirt.StateRunning {
		t.Fatalf("test:///default's domain test is %s; want it running, as libvirt defines it", st)
	}
	return w
}

// driverSocket runs one understudy-libvirt --listen for the test.
func driverSocket(t *testing.T) string {
	t.Helper()
	bin := libvirttest.DriverBinary(t)
	sock := filepath.Join(t.TempDir(), "libvirt.sock")
	cmd := exec.Command(bin, "--listen", sock)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("%s --listen did not exit on SIGTERM", libvirt.DriverName)
		}
		if t.Failed() {
			t.Logf("%s's stderr:\n%s", libvirt.DriverName, stderr.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return sock
		}
		select {
		case err := <-exited:
			t.Fatalf("%s --listen exited: %v\n%s", libvirt.DriverName, err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never listened on %s", libvirt.DriverName, sock)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// define defines domain name on the test driver, shut off.
func (w *world) define(t *testing.T, name string) {
	t.Helper()
	spec := libvirt.NewVM(name).WithType(libvirt.DomainTest).WithDisk(libvirt.Disk{Path: "/" + name + ".img"})
	st, err := w.behind.EnsureVM(ctx(t), spec, libvirt.StateShutoff, false)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != libvirt.StateShutoff {
		t.Fatalf("domain %s defined %s; want shut off", name, st.State)
	}
}

// state is the domain's state, as libvirt reports it behind the VM's back.
func (w *world) state(t *testing.T, name string) string {
	t.Helper()
	st, err := w.behind.DomainStatus(ctx(t), name)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Defined {
		t.Fatalf("domain %s is not defined", name)
	}
	return st.State
}

// vm is the workload of domain name in w.
func (w *world) vm(t *testing.T, cfg Config) *VM {
	t.Helper()
	if cfg.URI == "" {
		cfg.URI = rules.TestURI
	}
	v, err := New(cfg, w.conn, slog.New(slog.NewTextHandler(w.logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// ctx bounds a test's libvirt call.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

// req is a Request of a member of pair db at site a.
func req(serving bool) capability.Request {
	return capability.Request{Pair: "db", Site: "a", Term: 3, Leader: "b", Reason: "test", Serving: serving}
}

// logBuffer is a slog handler's output, safe to read while written.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// deafConnector is a Connector whose domains ignore the ACPI power-off
// request (a guest without ACPI, or hung): Shutdown succeeds and does
// nothing. Everything else is the real Connector's.
type deafConnector struct{ libvirt.Connector }

func (c deafConnector) Hypervisor(uri string) libvirt.Hypervisor {
	return deafGuest{c.Connector.Hypervisor(uri)}
}

func (c deafConnector) Fresh(uri string) libvirt.Hypervisor { return deafGuest{c.Connector.Fresh(uri)} }

type deafGuest struct{ libvirt.Hypervisor }

func (deafGuest) Shutdown(context.Context, string) error { return nil }
