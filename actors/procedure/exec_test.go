package procedure

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func execStep(command string, args ...string) StepSpec {
	return StepSpec{Name: "t", Driver: "exec", Timeout: 10 * time.Second, Exec: &ExecSpec{Command: command, Args: args}}
}

func runExec(t *testing.T, step StepSpec, timeout time.Duration) Outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return DefaultDrivers().Run(ctx, step)
}

func TestExecOK(t *testing.T) {
	o := runExec(t, execStep("true"), 10*time.Second)
	if o.Result != ResultOK || o.ExitCode != 0 {
		t.Fatalf("true: %+v", o)
	}
}

func TestExecExitCode(t *testing.T) {
	o := runExec(t, execStep("sh", "-c", "echo going down >&2; exit 3"), 10*time.Second)
	if o.Result != ResultFailed || o.ExitCode != 3 {
		t.Fatalf("exit 3: %+v", o)
	}
	if !strings.Contains(o.Detail, "exit status 3") || !strings.Contains(o.Detail, "going down") {
		t.Errorf("detail must give the status and the output: %q", o.Detail)
	}
}

func TestExecEnvAndDir(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("UNDERSTUDY_PARENT", "inherited")
	step := execStep("sh", "-c", `test "$UNDERSTUDY_STEP" = hello && test "$UNDERSTUDY_PARENT" = inherited && pwd`)
	step.Exec.Env = map[string]string{"UNDERSTUDY_STEP": "hello"}
	step.Exec.Dir = dir
	o := runExec(t, step, 10*time.Second)
	if o.Result != ResultOK {
		t.Fatalf("env not visible: %+v", o)
	}
	if got := strings.TrimSpace(o.Detail); got != dir {
		t.Errorf("ran in %q, want %q", got, dir)
	}
}

func TestExecMissingBinary(t *testing.T) {
	o := runExec(t, execStep("understudy-no-such-binary"), 10*time.Second)
	if o.Result != ResultFailed || o.ExitCode != -1 {
		t.Fatalf("missing binary: %+v", o)
	}
	if !strings.Contains(o.Detail, "understudy-no-such-binary") || !strings.Contains(o.Detail, "not found") {
		t.Errorf("detail must name the missing binary: %q", o.Detail)
	}
}

// The deadline kills the whole process group: the shell and its
// background child both die, and Run returns promptly.
func TestExecTimeoutKillsGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	step := execStep("sh", "-c", `sleep 30 & echo $! > "$1"; echo started; sleep 30`, "sh", pidFile)
	begin := time.Now()
	o := runExec(t, step, 200*time.Millisecond)
	took := time.Since(begin)
	if o.Result != ResultTimedOut {
		t.Fatalf("want timed out, got %+v", o)
	}
	if took > time.Second {
		t.Errorf("Run returned %v after start; the deadline was 200ms", took)
	}
	if !strings.Contains(o.Detail, "started") {
		t.Errorf("detail must keep the output: %q", o.Detail)
	}
	pid := readPid(t, pidFile)
	deadline := time.Now().Add(time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("background child %d still alive after the group kill", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A command that exits 0 but leaves a child holding its output succeeds
// once WaitDelay gives up on the pipe.
func TestExecChildHoldsOutput(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "child.pid")
	step := execStep("sh", "-c", `setsid sleep 30 & echo $! > "$1"; echo promoted`, "sh", pidFile)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	begin := time.Now()
	o := ExecDriver{WaitDelay: 100 * time.Millisecond}.Run(ctx, step)
	took := time.Since(begin)
	t.Cleanup(func() { _ = syscall.Kill(readPid(t, pidFile), syscall.SIGKILL) })
	if o.Result != ResultOK || !strings.Contains(o.Detail, "promoted") || !strings.Contains(o.Detail, "kept the output open") {
		t.Fatalf("want OK with a note, got %+v", o)
	}
	if took > 2*time.Second {
		t.Errorf("Run took %v; WaitDelay was 100ms", took)
	}
}

func TestExecOutputTail(t *testing.T) {
	o := runExec(t, execStep("sh", "-c", `i=0; while [ $i -lt 2000 ]; do echo "line $i"; i=$((i+1)); done; echo LAST; exit 1`), 10*time.Second)
	if o.Result != ResultFailed {
		t.Fatalf("%+v", o)
	}
	if len(o.Detail) > execTail+100 || !strings.HasSuffix(o.Detail, "LAST\n") || strings.Contains(o.Detail, "line 0\n") {
		t.Errorf("detail must be the last ~2 KiB of output: %d bytes, starts %q", len(o.Detail), o.Detail[:40])
	}
}

func TestExecContextAlreadyDone(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if o := (ExecDriver{}).Run(ctx, execStep("true")); o.Result != ResultTimedOut {
		t.Fatalf("want timed out, got %+v", o)
	}
}

func TestDriversUnknown(t *testing.T) {
	o := DefaultDrivers().Run(context.Background(), StepSpec{Driver: "libvirt-destroy"})
	if o.Result != ResultFailed || !strings.Contains(o.Detail, "libvirt-destroy") {
		t.Fatalf("%+v", o)
	}
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("child pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("child pid %q: %v", b, err)
	}
	return pid
}

// alive reports whether pid runs; a zombie (killed, not yet reaped by
// whoever inherited it) counts as dead.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z' && stat[i+2] != 'X'
	}
	return true
}

// A StartLimit of n lets at most n starts run at once, and every start
// runs; a nil limit does not wait.
func TestStartLimitBoundsStartsAtOnce(t *testing.T) {
	const n, starts = 3, 40
	l := NewStartLimit(n)
	var now, most atomic.Int32
	var wg sync.WaitGroup
	for range starts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = l.do(func() error {
				c := now.Add(1)
				for m := most.Load(); c > m && !most.CompareAndSwap(m, c); m = most.Load() {
				}
				time.Sleep(2 * time.Millisecond)
				now.Add(-1)
				return nil
			})
		}()
	}
	wg.Wait()
	if m := most.Load(); m > n || m < 2 {
		t.Errorf("%d starts at once with a limit of %d", m, n)
	}
	var nilLimit *StartLimit
	if err := nilLimit.do(func() error { return errors.New("ran") }); err == nil || err.Error() != "ran" {
		t.Errorf("a nil limit: %v", err)
	}
	// The driver starts through its limit: with the only slot held, its
	// command does not start; freed, it does.
	one := NewStartLimit(1)
	one.slots <- struct{}{}
	done := make(chan Outcome, 1)
	go func() { done <- (ExecDriver{Starts: one}).Run(context.Background(), execStep("true")) }()
	select {
	case o := <-done:
		t.Fatalf("the step ran while its start limit was full: %+v", o)
	case <-time.After(300 * time.Millisecond):
	}
	<-one.slots
	if o := <-done; o.Result != ResultOK {
		t.Errorf("step after the slot freed: %+v", o)
	}
}
