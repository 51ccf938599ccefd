package libvirt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"understudy/actors/procedure"
	"understudy/actors/resources"
	"understudy/actors/resources/libvirt/libvirttest"
	"understudy/actors/resources/libvirt/rules"
)

func TestMain(m *testing.M) { libvirttest.Main(m) }

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

// gone waits until pid no longer exists (killed and reaped, or a zombie
// left to whoever reaps orphans).
func gone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still exists", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state …; comm may hold spaces and parentheses.
	rest := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return len(rest) > 0 && rest[0] != "Z"
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
	d, logs := newDriver(t, DriverConfig{Path: libvirttest.DriverBinary(t)})
	r := NewVMReconciler(d.Hypervisor(rules.TestURI), "")
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

// killedPID is the process a timed-out step's detail says was killed.
func killedPID(t *testing.T, detail string) int {
	t.Helper()
	m := regexp.MustCompile(`understudy-libvirt \(pid (\d+)\) was killed to stop the call`).FindStringSubmatch(detail)
	if m == nil {
		t.Fatalf("no killed process in %q", detail)
	}
	pid, _ := strconv.Atoi(m[1])
	return pid
}

// The fence drivers on the process: each step runs in an understudy-libvirt
// of its own. A step against a libvirtd that never answers times out at its
// deadline and its process is killed (nothing else stops a libvirt call);
// the shared process of the kinds' calls goes on, and the next step runs.
func TestFenceStepKillsItsProcessAtDeadline(t *testing.T) {
	d, logs := newDriver(t, DriverConfig{Path: libvirttest.DriverBinary(t)})
	uri := libvirttest.SilentLibvirtd(t).URI()
	shared := started(t, d)
	for _, driver := range []string{procedure.DriverLibvirtDestroy, procedure.DriverLibvirtLinkDown} {
		step := procedure.StepSpec{Name: driver, Driver: driver, Timeout: 300 * time.Millisecond,
			Libvirt: &procedure.LibvirtSpec{URI: uri, Domain: "pg-c"}}
		if driver == procedure.DriverLibvirtLinkDown {
			step.Libvirt.MAC = "52:54:00:00:0c:01"
		}
		ctx, cancel := context.WithTimeout(context.Background(), step.Timeout)
		start := time.Now()
		o := FenceDrivers(d).Run(ctx, step)
		took := time.Since(start)
		cancel()
		if o.Result != procedure.ResultTimedOut || !strings.Contains(o.Detail, "deadline exceeded") {
			t.Fatalf("%s against a hung libvirtd: %+v", driver, o)
		}
		if took > 2*time.Second {
			t.Fatalf("%s took %v with a 300ms step timeout", driver, took)
		}
		pid := killedPID(t, o.Detail)
		if pid == shared {
			t.Fatalf("%s ran in the shared process", driver)
		}
		gone(t, pid)
		if now := d.PID(); now != shared {
			t.Fatalf("the shared process changed (%d, then %d)", shared, now)
		}
		if !strings.Contains(logs.String(), fmt.Sprintf("killed the understudy-libvirt that ran it alone\" pid=%d", pid)) {
			t.Errorf("no kill in the log:\n%s", logs)
		}
		// The next step runs.
		o = FenceDrivers(d).Run(context.Background(), procedure.StepSpec{Name: "x", Driver: procedure.DriverLibvirtDestroy, Timeout: 5 * time.Second,
			Libvirt: &procedure.LibvirtSpec{URI: rules.TestURI, Domain: "pg-typo"}})
		if o.Result != procedure.ResultFailed || !strings.Contains(o.Detail, "domain pg-typo: not found") {
			t.Fatalf("the step after the kill: %+v", o)
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

// Two pairs fence at once through one DriverProcess (a Host's): the step
// whose deadline passes first kills its own process only; the other runs
// until its own deadline.
func TestConcurrentFenceStepsKillOnlyTheirOwnProcess(t *testing.T) {
	d, _ := newDriver(t, DriverConfig{Path: libvirttest.DriverBinary(t)})
	uri := libvirttest.SilentLibvirtd(t).URI()
	type result struct {
		o    procedure.Outcome
		took time.Duration
	}
	run := func(domain string, timeout time.Duration, out chan<- result) {
		step := procedure.StepSpec{Name: "off", Driver: procedure.DriverLibvirtDestroy, Timeout: timeout,
			Libvirt: &procedure.LibvirtSpec{URI: uri, Domain: domain}}
		start := time.Now() // before the deadline is set: took >= timeout
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		o := FenceDrivers(d).Run(ctx, step)
		out <- result{o, time.Since(start)}
	}
	short, long := make(chan result, 1), make(chan result, 1)
	go run("pg-a", 300*time.Millisecond, short)
	go run("pg-b", 3*time.Second, long)
	s := <-short
	if s.o.Result != procedure.ResultTimedOut || s.took < 300*time.Millisecond || s.took > 2*time.Second {
		t.Fatalf("the 300ms step: %+v after %v", s.o, s.took)
	}
	l := <-long
	if l.o.Result != procedure.ResultTimedOut || !strings.Contains(l.o.Detail, "deadline exceeded") || l.took < 3*time.Second || l.took > 5*time.Second {
		t.Fatalf("the 3s step, killed by the other's deadline?: %+v after %v", l.o, l.took)
	}
	if killedPID(t, s.o.Detail) == killedPID(t, l.o.Detail) {
		t.Fatal("both steps ran in one process")
	}
}

// Killing understudy-libvirt kills libvirt's own children with it: the
// ssh of a qemu+ssh URI (here a fake that never answers).
func TestFenceStepKillsLibvirtsSSH(t *testing.T) {
	d, _ := newDriver(t, DriverConfig{Path: libvirttest.DriverBinary(t)})
	dir := t.TempDir()
	pids := filepath.Join(dir, "pids")
	ssh := filepath.Join(dir, "ssh")
	if err := os.WriteFile(ssh, []byte("#!/bin/sh\necho $$ >> "+pids+"\nexec sleep 60\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	step := procedure.StepSpec{Name: "off", Driver: procedure.DriverLibvirtDestroy, Timeout: time.Second,
		Libvirt: &procedure.LibvirtSpec{URI: "qemu+ssh://root@kvm1.invalid/system", Domain: "pg-a"}}
	ctx, cancel := context.WithTimeout(context.Background(), step.Timeout)
	defer cancel()
	if o := FenceDrivers(d).Run(ctx, step); o.Result != procedure.ResultTimedOut {
		t.Fatalf("a step through an ssh that never answers: %+v", o)
	}
	b, err := os.ReadFile(pids)
	if err != nil || len(strings.Fields(string(b))) == 0 {
		t.Fatalf("libvirt never ran the fake ssh (%v)", err)
	}
	for _, f := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(f)
		gone(t, pid)
	}
}

// A process that dies is reported (exit status, stderr) and replaced by
// the next call; a call it was running fails at once with the news.
func TestDriverProcessDeathReportedAndRestarted(t *testing.T) {
	d, logs := newDriver(t, DriverConfig{Path: libvirttest.DriverBinary(t)})
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
	silent := libvirttest.SilentLibvirtd(t)
	errc := make(chan error, 1)
	go func() {
		_, err := d.Hypervisor(silent.URI()).Destroy(context.Background(), "pg-c")
		errc <- err
	}()
	select {
	case <-silent.Accepted: // the call is under way
	case err := <-errc:
		t.Fatalf("the call returned before it connected: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("the call never connected to the silent libvirtd")
	}
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
	d, _ := newDriver(t, DriverConfig{Path: libvirttest.DriverBinary(t)})
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
	bin := libvirttest.DriverBinary(t)
	t.Setenv("PATH", t.TempDir())
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := FindDriver(); !errors.Is(err, ErrDriverMissing) ||
		!strings.HasPrefix(err.Error(), "understudy-libvirt not found next to "+exe+" or in PATH: build it with make build, or set libvirt.driver") {
		t.Fatalf("nowhere: %v", err)
	}
	d, _ := newDriver(t, DriverConfig{})
	if _, err := d.Hypervisor(rules.TestURI).DomainStatus(context.Background(), "test"); !errors.Is(err, ErrDriverMissing) {
		t.Fatalf("a call without a driver: %v", err)
	}
	t.Setenv("PATH", filepath.Dir(bin))
	if p, err := FindDriver(); err != nil || p != bin {
		t.Fatalf("in PATH: %s %v", p, err)
	}
	// Next to the running executable comes first.
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
	bin := libvirttest.DriverBinary(b)
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
