package runtime

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"understudy/actors/procedure"
	"understudy/actors/resources/libvirt"
	"understudy/actors/resources/libvirt/rules"
)

// The understudy-libvirt binary, built once per test binary: the agent's
// libvirt kinds and the libvirt fence steps run their calls in it.

var (
	driverOnce sync.Once
	driverDir  string // removed by TestMain
	driverPath string
	driverErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if driverDir != "" {
		_ = os.RemoveAll(driverDir)
	}
	os.Exit(code)
}

// libvirtDriverBinary builds understudy-libvirt and checks that it loads
// libvirt; either failing fails the test (never a skip).
func libvirtDriverBinary(t *testing.T) string {
	t.Helper()
	driverOnce.Do(func() {
		driverDir, driverErr = os.MkdirTemp("", "understudy-runtime-test-")
		if driverErr != nil {
			return
		}
		driverPath = filepath.Join(driverDir, libvirt.DriverName)
		out, err := exec.Command("go", "build", "-tags", "libvirt_dlopen", "-o", driverPath, "understudy/cmd/understudy-libvirt").CombinedOutput()
		if err != nil {
			driverErr = fmt.Errorf("cannot build %s (it links libvirt through cgo: it needs gcc): %v\n%s", libvirt.DriverName, err, out)
			return
		}
		if out, err := exec.Command(driverPath, "--version").CombinedOutput(); err != nil {
			driverErr = fmt.Errorf("%s cannot load libvirt: run scripts/install-test-deps.sh (it installs libvirt0, whose test:///default driver these tests use): %v\n%s", libvirt.DriverName, err, out)
		}
	})
	if driverErr != nil {
		t.Fatal(driverErr)
	}
	return driverPath
}

// libvirtDriverSocket runs one understudy-libvirt on a unix socket for the
// test: the agent and the test both connect to it, so the test sees (and
// changes, behind the agent's back) the same test:///default state —
// which libvirt keeps per process.
func libvirtDriverSocket(t *testing.T) string {
	t.Helper()
	bin := libvirtDriverBinary(t)
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

// childrenRunning lists this process's children that run path.
func childrenRunning(t *testing.T, path string) []int {
	t.Helper()
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …; comm may hold spaces and parentheses.
		rest := string(stat[bytes.LastIndexByte(stat, ')')+1:])
		f := strings.Fields(rest)
		if len(f) < 2 || f[0] == "Z" || f[1] != strconv.Itoa(os.Getpid()) {
			continue
		}
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && exe == path {
			pids = append(pids, pid)
		}
	}
	return pids
}

// A Host's libvirt fence steps run in an understudy-libvirt of the Host's
// own: started by the first step, stopped with the Host.
func TestHostStopsItsLibvirtDriverProcess(t *testing.T) {
	bin := libvirtDriverBinary(t)
	fn := startFailoverNATS(t)
	h, err := StartHost(context.Background(), fn.js, fn.names.EventsStream, fn.names.FailoverBucket, nil,
		HostOptions{Logger: slog.New(slog.DiscardHandler), LibvirtDriver: libvirt.DriverConfig{Path: bin}})
	if err != nil {
		t.Fatal(err)
	}
	if h.libvirt == nil {
		t.Fatal("a Host with the default drivers has no libvirt driver process")
	}
	if pids := childrenRunning(t, bin); len(pids) != 0 {
		t.Fatalf("understudy-libvirt runs (%v) before any libvirt step", pids)
	}
	step := procedure.StepSpec{Name: "off", Driver: procedure.DriverLibvirtDestroy, Timeout: 5 * time.Second,
		Libvirt: &procedure.LibvirtSpec{URI: rules.TestURI, Domain: "pg-typo"}}
	o := DefaultDrivers(h.libvirt).Run(context.Background(), step)
	if o.Result != procedure.ResultFailed || !strings.Contains(o.Detail, "domain pg-typo: not found") {
		t.Fatalf("%+v", o)
	}
	if pids := childrenRunning(t, bin); len(pids) != 1 {
		t.Fatalf("understudy-libvirt processes after a step: %v, want one", pids)
	}
	h.Stop(context.Background())
	if pids := childrenRunning(t, bin); len(pids) != 0 {
		t.Fatalf("understudy-libvirt still runs after the Host stopped: %v", pids)
	}
}
