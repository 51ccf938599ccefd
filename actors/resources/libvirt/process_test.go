package libvirt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"understudy/actors/procedure"
	"understudy/actors/resources"
	"understudy/actors/resources/libvirt/rules"
)

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

// driverBinary builds understudy-libvirt once per test binary and checks
// that it loads libvirt. Either failing fails the test: never a skip.
func driverBinary(t testing.TB) string {
	t.Helper()
	driverOnce.Do(func() {
		driverDir, driverErr = os.MkdirTemp("", "understudy-libvirt-test-")
		if driverErr != nil {
			return
		}
		driverPath = filepath.Join(driverDir, DriverName)
		out, err := exec.Command("go", "build", "-tags", "libvirt_dlopen", "-o", driverPath, "understudy/cmd/understudy-libvirt").CombinedOutput()
		if err != nil {
			driverErr = fmt.Errorf("cannot build %s (it links libvirt through cgo: it needs gcc): %v\n%s", DriverName, err, out)
			return
		}
		if out, err := exec.Command(driverPath, "--version").CombinedOutput(); err != nil {
			driverErr = fmt.Errorf("%s cannot load libvirt: run scripts/install-test-deps.sh (it installs libvirt0, whose test:///default driver these tests use): %v\n%s", DriverName, err, out)
		}
	})
	if driverErr != nil {
		t.Fatal(driverErr)
	}
	return driverPath
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

func newDriver(t *testing.T, cfg DriverConfig) (*DriverProcess, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	d := NewDriverProcess(cfg, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { d.Close() })
	return d, logs
}

// gone waits until pid no longer exists (killed and reaped).
func gone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still exists", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// started makes d start its process with a cheap call and returns its pid.
func started(t testing.TB, d *DriverProcess) int {
	t.Helper()
	if st, err := d.Hypervisor(rules.TestURI).DomainStatus(context.Background(), "test"); err != nil || !st.Defined {
		t.Fatalf("a call on test:///default: %+v %v", st, err)
	}
	pid := d.PID()
	if pid == 0 {
		t.Fatal("no process after a call")
	}
	return pid
}

func TestDriverProcessStartsLazilyAndStops(t *testing.T) {
	d, logs := newDriver(t, DriverConfig{Path: driverBinary(t)})
	r := NewVMReconciler(d.Hypervisor(rules.TestURI))
	if err := r.Validate(resources.Spec{"memory": "1GiB", "disks": []any{map[string]any{"path": "/x.img"}}}); err != nil {
		t.Fatal(err)
	}
	if d.PID() != 0 {
		t.Fatal("validation started the driver process")
	}
	// A bad spec refused by the caller starts nothing either.
	if _, err := d.Hypervisor(rules.TestURI).EnsureVM(context.Background(), NewVM("Bad Name"), StateRunning, false); err == nil || d.PID() != 0 {
		t.Fatalf("a bad VM: %v, pid %d", err, d.PID())
	}
	pid := started(t, d)
	if !strings.Contains(logs.String(), "understudy-libvirt started") {
		t.Errorf("no start in the log:\n%s", logs)
	}
	if again := started(t, d); again != pid {
		t.Fatalf("a second call started another process (%d, then %d)", pid, again)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	gone(t, pid)
	if _, err := d.Hypervisor(rules.TestURI).DomainStatus(context.Background(), "test"); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
	if strings.Contains(logs.String(), "died") {
		t.Errorf("a stop is no death:\n%s", logs)
	}
}

// The fence drivers on the process: a step against a libvirtd that never
// answers times out at its deadline, the process running the call is
// killed (nothing else stops a libvirt call), and the next step runs on a
// fresh process.
func TestFenceStepKillsDriverAtDeadline(t *testing.T) {
	d, logs := newDriver(t, DriverConfig{Path: driverBinary(t)})
	addr := silentLibvirtd(t)
	for _, driver := range []string{procedure.DriverLibvirtDestroy, procedure.DriverLibvirtLinkDown} {
		pid := started(t, d)
		step := procedure.StepSpec{Name: driver, Driver: driver, Timeout: 300 * time.Millisecond,
			Libvirt: &procedure.LibvirtSpec{URI: "qemu+tcp://" + addr + "/system", Domain: "pg-c"}}
		if driver == procedure.DriverLibvirtLinkDown {
			step.Libvirt.MAC = "52:54:00:00:0c:01"
		}
		ctx, cancel := context.WithTimeout(context.Background(), step.Timeout)
		start := time.Now()
		o := FenceDrivers(d).Run(ctx, step)
		took := time.Since(start)
		cancel()
		if o.Result != procedure.ResultTimedOut || !strings.Contains(o.Detail, "deadline exceeded") ||
			!strings.Contains(o.Detail, fmt.Sprintf("understudy-libvirt (pid %d) was killed to stop the call", pid)) {
			t.Fatalf("%s against a hung libvirtd: %+v", driver, o)
		}
		if took > 2*time.Second {
			t.Fatalf("%s took %v with a 300ms step timeout", driver, took)
		}
		gone(t, pid)
		if d.PID() != 0 {
			t.Fatalf("the killed process is still the current one (%d)", d.PID())
		}
		if !strings.Contains(logs.String(), fmt.Sprintf("killed understudy-libvirt to stop it (the next call starts a new one)\" pid=%d", pid)) {
			t.Errorf("no kill in the log:\n%s", logs)
		}
		// The next step runs, on a new process.
		o = FenceDrivers(d).Run(context.Background(), procedure.StepSpec{Name: "x", Driver: procedure.DriverLibvirtDestroy, Timeout: 5 * time.Second,
			Libvirt: &procedure.LibvirtSpec{URI: rules.TestURI, Domain: "pg-typo"}})
		if o.Result != procedure.ResultFailed || !strings.Contains(o.Detail, "domain pg-typo: not found") {
			t.Fatalf("the step after the kill: %+v", o)
		}
		if next := d.PID(); next == 0 || next == pid {
			t.Fatalf("the step after the kill ran on pid %d (killed: %d)", next, pid)
		}
	}
	// A context already done starts nothing.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	o := DestroyDriver{Connector: d}.Run(ctx, procedure.StepSpec{Driver: procedure.DriverLibvirtDestroy, Libvirt: &procedure.LibvirtSpec{URI: rules.TestURI, Domain: "x"}})
	if o.Result != procedure.ResultTimedOut || !strings.Contains(o.Detail, "not started") {
		t.Fatalf("%+v", o)
	}
}

// A process that dies is reported (exit status, stderr) and replaced by
// the next call; a call it was running fails at once with the news.
func TestDriverProcessDeathReportedAndRestarted(t *testing.T) {
	d, logs := newDriver(t, DriverConfig{Path: driverBinary(t)})
	pid := started(t, d)
	if err := syscall.Kill(pid, syscall.SIGSEGV); err != nil {
		t.Fatal(err)
	}
	gone(t, pid)
	deadline := time.Now().Add(2 * time.Second)
	for !strings.Contains(logs.String(), "understudy-libvirt died") {
		if time.Now().After(deadline) {
			t.Fatalf("no death in the log:\n%s", logs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The Go runtime dies of SIGSEGV with a crash dump and exit status 2.
	for _, want := range []string{fmt.Sprintf("pid=%d", pid), `status="exit status 2"`, "SIGSEGV: segmentation violation", "goroutine 1"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the death report lacks %q:\n%s", want, logs)
		}
	}
	next := started(t, d)
	if next == pid {
		t.Fatal("no new process")
	}

	// Dying during a call: the call returns with the exit status.
	addr := silentLibvirtd(t)
	errc := make(chan error, 1)
	go func() {
		_, err := d.Fresh("qemu+tcp://"+addr+"/system").Destroy(context.Background(), "pg-c")
		errc <- err
	}()
	time.Sleep(200 * time.Millisecond) // the call is under way
	if err := syscall.Kill(next, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("understudy-libvirt (pid %d) died during the call (signal: killed)", next)) {
			t.Fatalf("%v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the call did not return when its process died")
	}
	if again := started(t, d); again == next {
		t.Fatal("no new process after the second death")
	}
}

func TestDriverProcessConcurrentCalls(t *testing.T) {
	d, _ := newDriver(t, DriverConfig{Path: driverBinary(t)})
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for i := range 32 {
		hv := d.Hypervisor(rules.TestURI)
		if i%4 == 0 {
			hv = d.Fresh(rules.TestURI)
		}
		wg.Go(func() {
			if st, err := hv.NetworkStatus(context.Background(), "default"); err != nil || !st.Defined || !st.Active {
				errs <- fmt.Errorf("the test driver's network default: %+v %v", st, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestFindDriver(t *testing.T) {
	bin := driverBinary(t)
	t.Setenv("PATH", t.TempDir())
	if _, err := FindDriver(); !errors.Is(err, ErrDriverMissing) || !strings.Contains(err.Error(), "agent.libvirt_driver") {
		t.Fatalf("nowhere: %v", err)
	}
	d, _ := newDriver(t, DriverConfig{})
	if _, err := d.Hypervisor(rules.TestURI).DomainStatus(context.Background(), "test"); !errors.Is(err, ErrDriverMissing) {
		t.Fatalf("a call without a driver: %v", err)
	}
	t.Setenv("PATH", driverDir)
	if p, err := FindDriver(); err != nil || p != bin {
		t.Fatalf("in PATH: %s %v", p, err)
	}
	// Next to the running executable comes first.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	beside := filepath.Join(filepath.Dir(exe), DriverName)
	if err := os.Symlink(bin, beside); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(beside) })
	if p, err := FindDriver(); err != nil || p != beside {
		t.Fatalf("next to %s: %s %v", exe, p, err)
	}
	started(t, d) // found now: looked up at each start
}

func TestStderrLog(t *testing.T) {
	logs := &logBuffer{}
	s := &stderrLog{logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})), pid: 42}
	fmt.Fprint(s, `{"time":"2025-01-01T00:00:00Z","level":"WARN","msg":"libvirt: connection is dead; reconnecting","uri":"qemu:///system"}`+"\n"+`{"level":"DEBUG","msg":"deb`)
	fmt.Fprint(s, `ug"}`+"\npanic: boom\n")
	got := logs.String()
	for _, want := range []string{
		`level=WARN msg="libvirt: connection is dead; reconnecting" pid=42 uri=qemu:///system`,
		`level=DEBUG msg=debug pid=42`,
		`level=DEBUG msg="understudy-libvirt: panic: boom" pid=42`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("log lacks %q:\n%s", want, got)
		}
	}
	if tail := s.tail(); !strings.HasSuffix(tail, `"msg":"debug"}`+"\npanic: boom") {
		t.Errorf("tail %q", tail)
	}
	// A crash dump: its start is kept, the rest counted.
	for i := range 100 {
		fmt.Fprintf(s, "line %d\n", i)
	}
	tail := strings.Split(s.tail(), "\n")
	if len(tail) != 2+reportAfterLines+1 || tail[2] != "panic: boom" || tail[len(tail)-1] != "… 71 more lines" {
		t.Errorf("tail:\n%s", strings.Join(tail, "\n"))
	}
}

// The resident memory of an idle understudy-libvirt holding a connection
// to test:///default (the agent's, between drift checks), for
// docs/agents.md.
//
//	go test -tags libvirt_dlopen -run '^$' -bench DriverProcessIdleRSS ./actors/resources/libvirt/
func BenchmarkDriverProcessIdleRSS(b *testing.B) {
	bin := driverBinary(b)
	for b.Loop() {
		d := NewDriverProcess(DriverConfig{Path: bin}, slog.New(slog.DiscardHandler))
		pid := started(b, d) // the pooled connection stays open
		time.Sleep(3 * time.Second)
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			b.Fatal(err)
		}
		for _, line := range strings.Split(string(status), "\n") {
			var kb float64
			if _, err := fmt.Sscanf(line, "VmRSS: %f kB", &kb); err == nil {
				b.ReportMetric(kb/1024, "MiB-rss")
			}
			if _, err := fmt.Sscanf(line, "VmHWM: %f kB", &kb); err == nil {
				b.ReportMetric(kb/1024, "MiB-peak")
			}
		}
		d.Close()
	}
}

// silentLibvirtd accepts connections and never answers: a libvirtd that
// hangs. It closes them when the test ends.
func silentLibvirtd(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		for {
			select {
			case c := <-accepted:
				c.Close()
			default:
				return
			}
		}
	})
	return ln.Addr().String()
}
