package resources

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func alive(pid int) bool { _, err := procStart(pid); return err == nil }

func waitGone(t *testing.T, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if !alive(pid) {
			return
		}
	}
	t.Fatalf("process %d still runs", pid)
}

// Finding: after kill -9 of serve and a restart every process ran twice,
// and the orphan survived its resource's removal. An agent that starts
// again adopts the service from its record, and deletes it.
func TestProcessAdoptsWhatAnEarlierAgentStarted(t *testing.T) {
	ctx := context.Background()
	state := t.TempDir()
	spec := Spec{"command": "sleep", "args": []any{"300"}}
	first := &Process{StateDir: state, procs: map[string]*proc{}}
	o, err := first.Reconcile(ctx, "svc", spec)
	if err != nil || !o.InSync {
		t.Fatalf("%+v %v", o, err)
	}
	pid, _ := strconv.Atoi(o.Details["pid"])
	t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })
	// The first agent dies without cleaning up; a second one starts.
	second := &Process{StateDir: state, procs: map[string]*proc{}}
	o, err = second.Reconcile(ctx, "svc", spec)
	if err != nil || !o.InSync || o.Details["pid"] != strconv.Itoa(pid) || o.Details["adopted"] != "true" {
		t.Fatalf("not adopted: %+v %v", o, err)
	}
	// Deleted while it was the first agent's: stopped all the same.
	if err := second.Delete(ctx, "svc", spec); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pid)
	if o, _ := (&Process{StateDir: state, procs: map[string]*proc{}}).Observe(ctx, "svc", spec); o.InSync {
		t.Errorf("a deleted service still observed: %+v", o)
	}
}

// An adopted service of a changed spec is stopped and the new one
// started; an adopted service that ended is started again.
func TestProcessAdoptedServiceChangesAndEnds(t *testing.T) {
	ctx := context.Background()
	state := t.TempDir()
	first := &Process{StateDir: state, procs: map[string]*proc{}}
	o, err := first.Reconcile(ctx, "svc", Spec{"command": "sleep", "args": []any{"300"}})
	if err != nil {
		t.Fatal(err)
	}
	old, _ := strconv.Atoi(o.Details["pid"])
	second := &Process{StateDir: state, procs: map[string]*proc{}}
	t.Cleanup(second.StopAll)
	o, err = second.Reconcile(ctx, "svc", Spec{"command": "sleep", "args": []any{"301"}})
	if err != nil || !o.InSync || o.Details["pid"] == strconv.Itoa(old) {
		t.Fatalf("%+v %v", o, err)
	}
	waitGone(t, old)
	// A stale record (the process ended while no agent ran) is dropped.
	third := &Process{StateDir: state, procs: map[string]*proc{}}
	pid, _ := strconv.Atoi(o.Details["pid"])
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	waitGone(t, pid)
	if o, _ := third.Observe(ctx, "svc", Spec{"command": "sleep", "args": []any{"301"}}); o.InSync || o.Drift != "not running" {
		t.Errorf("an ended service: %+v", o)
	}
}

// TestProcessHelperAgent is not a test: run with UNDERSTUDY_HELPER_AGENT
// set, it plays an agent that starts a service, prints its pid and
// waits to be killed.
func TestProcessHelperAgent(t *testing.T) {
	state := os.Getenv("UNDERSTUDY_HELPER_AGENT")
	if state == "" {
		return
	}
	p := &Process{StateDir: state, procs: map[string]*proc{}}
	spec := Spec{"command": "sleep", "args": []any{"300"}, "detach": os.Getenv("UNDERSTUDY_HELPER_DETACH") == "1"}
	o, err := p.Reconcile(context.Background(), "svc", spec)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("pid", o.Details["pid"])
	time.Sleep(time.Minute)
	os.Exit(0)
}

// helperAgent runs TestProcessHelperAgent in a process of its own and
// returns it and its service's pid.
func helperAgent(t *testing.T, detach bool) (*exec.Cmd, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestProcessHelperAgent$")
	cmd.Env = append(os.Environ(), "UNDERSTUDY_HELPER_AGENT="+t.TempDir())
	if detach {
		cmd.Env = append(cmd.Env, "UNDERSTUDY_HELPER_DETACH=1")
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "pid ") {
		t.Fatalf("helper: %q %v", line, err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, "pid ")))
	return cmd, pid
}

// A service dies with its agent (kill -9 of the agent's process), unless
// its spec says detach: true.
func TestProcessDiesWithItsAgentUnlessDetached(t *testing.T) {
	agent, pid := helperAgent(t, false)
	_ = agent.Process.Kill()
	_ = agent.Wait()
	waitGone(t, pid)

	agent, pid = helperAgent(t, true)
	t.Cleanup(func() { _ = syscall.Kill(-pid, syscall.SIGKILL) })
	_ = agent.Process.Kill()
	_ = agent.Wait()
	time.Sleep(300 * time.Millisecond)
	if !alive(pid) {
		t.Errorf("a detached service died with its agent")
	}
}
