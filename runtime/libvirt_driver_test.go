package runtime

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"understudy/actors/procedure"
	"understudy/actors/resources/libvirt"
	"understudy/actors/resources/libvirt/libvirttest"
	"understudy/actors/resources/libvirt/rules"
	"understudy/capabilities/postgres"
)

// The understudy-libvirt binary, built once per test binary: the agent's
// libvirt kinds and the libvirt fence steps run their calls in it.

func TestMain(m *testing.M) {
	if os.Getenv("UNDERSTUDY_PG_KEEPER") == "1" {
		// The test binary is the PostgreSQL keeper of the postgres-pair
		// tests' members (AgentConfig.pgKeeper).
		os.Exit(postgres.KeeperMain(os.Args[1:]))
	}
	libvirttest.Main(m)
}

// libvirtDriverBinary builds understudy-libvirt and checks that it loads
// libvirt; either failing fails the test (never a skip).
func libvirtDriverBinary(t *testing.T) string { return libvirttest.DriverBinary(t) }

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

// A Host's libvirt fence steps each run in an understudy-libvirt of their
// own, started for the step and gone after it; Stop kills one whose step
// still runs.
func TestHostRunsEachLibvirtStepInAProcessOfItsOwn(t *testing.T) {
	bin := libvirtDriverBinary(t)
	fn := startFailoverNATS(t)
	h, err := StartHost(context.Background(), fn.js, fn.names.EventsStream, fn.names.FailoverBucket, nil,
		HostOptions{Logger: slog.New(slog.DiscardHandler), LibvirtDriver: libvirt.DriverConfig{Path: bin}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop(context.Background())
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
	waitChildren(t, bin, 0, "after the step")

	// A step that hangs: its process runs until Stop.
	silent := libvirttest.SilentLibvirtd(t)
	done := make(chan procedure.Outcome, 1)
	go func() {
		hung := procedure.StepSpec{Name: "off", Driver: procedure.DriverLibvirtDestroy, Timeout: time.Minute,
			Libvirt: &procedure.LibvirtSpec{URI: silent.URI(), Domain: "pg-a"}}
		done <- DefaultDrivers(h.libvirt).Run(context.Background(), hung)
	}()
	select {
	case <-silent.Accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("the hung step never reached the silent libvirtd")
	}
	if pids := childrenRunning(t, bin); len(pids) != 1 {
		t.Fatalf("understudy-libvirt processes during a step: %v, want one", pids)
	}
	h.Stop(context.Background())
	if pids := childrenRunning(t, bin); len(pids) != 0 {
		t.Fatalf("understudy-libvirt still runs after the Host stopped: %v", pids)
	}
	if o := <-done; o.Result != procedure.ResultFailed || !strings.Contains(o.Detail, "was stopped during the call") {
		t.Fatalf("the hung step after Stop: %+v", o)
	}
}

// waitChildren waits until n understudy-libvirt children run.
func waitChildren(t *testing.T, bin string, n int, when string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		pids := childrenRunning(t, bin)
		if len(pids) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("understudy-libvirt processes %s: %v, want %d", when, pids, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
