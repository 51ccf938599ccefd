package resources

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestFileReconcileAndDrift(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "etc", "motd")
	spec := Spec{"path": path, "mode": "0640", "content": "hello\n"}
	var f File
	if o, err := f.Observe(ctx, "motd", spec); err != nil || o.InSync || o.Drift != "file missing" {
		t.Fatalf("before: %+v %v", o, err)
	}
	o, err := f.Reconcile(ctx, "motd", spec)
	if err != nil || !o.InSync || o.Details["mode"] != "0640" || o.Details["size"] != "6" {
		t.Fatalf("reconcile: %+v %v", o, err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("x"), 0o666); err != nil {
		t.Fatal(err)
	}
	o, _ = f.Observe(ctx, "motd", spec)
	if o.InSync || !strings.Contains(o.Drift, "content changed") || !strings.Contains(o.Drift, "mode 0666, want 0640") {
		t.Errorf("drift: %+v", o)
	}
	if o, err := f.Reconcile(ctx, "motd", spec); err != nil || !o.InSync {
		t.Errorf("repair: %+v %v", o, err)
	}
	// Pinned by sha256 only: the agent checks, it has nothing to write.
	pinned := Spec{"path": path, "sha256": strings.Repeat("0", 64)}
	if _, err := f.Reconcile(ctx, "motd", pinned); err == nil || !strings.Contains(err.Error(), "no content to write") {
		t.Errorf("pinned mismatch: %v", err)
	}
	if err := f.Delete(ctx, "motd", spec); err != nil {
		t.Fatal(err)
	}
	if err := f.Delete(ctx, "motd", spec); err != nil {
		t.Errorf("delete is idempotent: %v", err)
	}
}

func TestFileSpecRules(t *testing.T) {
	for _, tc := range []struct {
		spec Spec
		want string
	}{
		{Spec{"content": "x"}, "file spec: path: required"},
		{Spec{"path": "/a/../b", "content": "x"}, "path: must be an absolute, clean path"},
		{Spec{"path": "/a"}, "content: give content, or sha256"},
		{Spec{"path": "/a", "content": strings.Repeat("x", MaxInlineContent+1)}, "content: at most 65536 bytes inline"},
		{Spec{"path": "/a", "content": "x", "sha256": strings.Repeat("0", 64)}, "sha256: does not match content"},
		{Spec{"path": "/a", "content": "x", "owner": "no-such-user-here"}, "owner: no user no-such-user-here"},
		{Spec{"path": "/a", "content": "x", "colour": "red"}, "colour: unknown field"},
		{Spec{"path": "/", "content": "x"}, "path: must name a file, not the root directory"},
		{Spec{"path": "/a", "content": "x", "max_size": "lots"}, "max_size: must be a size in bytes such as 65536 or 64MiB (got lots)"},
		{Spec{"path": "/a", "content": "xx", "max_size": 1}, "max_size: must be at least the content's 2 bytes"},
		{Spec{"path": "/a", "sha256": strings.Repeat("0", 64), "max_size": "2TiB"}, "max_size: must be from 1 byte to 1TiB"},
	} {
		err := (&File{}).Validate(tc.spec)
		var se *SpecError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.spec, err, tc.want)
		}
	}
}

// recordedRuns keeps what a reconciler reported running.
type recordedRuns struct {
	mu   sync.Mutex
	runs []string
}

func (r *recordedRuns) Started(id, step string, cmd []string) func(int, bool, string) {
	return func(code int, timedOut bool, detail string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.runs = append(r.runs, strings.Join([]string{id, step, strings.Join(cmd, " "), map[bool]string{true: "timed-out", false: "exited"}[timedOut], detail}, "|"))
	}
}

func TestShellJob(t *testing.T) {
	runs := &recordedRuns{}
	ctx := WithRuns(context.Background(), runs)
	spec := Spec{"command": "echo ran; exit 0"}
	if _, err := (&ShellJob{}).Reconcile(ctx, "j", spec); !errors.Is(err, ErrRefused) {
		t.Errorf("not allowed: %v", err)
	}
	j := &ShellJob{Allowed: true}
	for range 2 {
		if o, err := j.Reconcile(ctx, "j", spec); err != nil || !o.InSync {
			t.Fatalf("%+v %v", o, err)
		}
	}
	if len(runs.runs) != 1 || runs.runs[0] != "j|job|/bin/sh -c echo ran; exit 0|exited|ran" {
		t.Errorf("runs once per spec, audited: %q", runs.runs)
	}
	if _, err := j.Reconcile(ctx, "k", Spec{"command": "exit 4"}); err == nil || err.Error() != "exited 4" {
		t.Errorf("failing job: %v", err)
	}
}

func TestProcessInitStepsThenService(t *testing.T) {
	runs := &recordedRuns{}
	ctx := WithRuns(context.Background(), runs)
	p := NewProcess()
	t.Cleanup(p.StopAll)
	marker := filepath.Join(t.TempDir(), "ready")
	spec := Spec{"command": "sleep", "args": []any{"60"}, "init": []any{
		map[string]any{"name": "one", "command": "true"},
		map[string]any{"name": "two", "command": "touch", "args": []any{marker}},
	}}
	o, err := p.Reconcile(ctx, "svc", spec)
	if err != nil || !o.InSync || o.Details["init_completed"] != "one,two" || o.Details["services"] != "svc" {
		t.Fatalf("%+v %v", o, err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Error("init step two did not run")
	}
	if len(runs.runs) != 2 || !strings.HasPrefix(runs.runs[0], "svc|one|true|exited") {
		t.Errorf("runs %q", runs.runs)
	}
	// A spec change restarts it; the same spec does not.
	pid := o.Details["pid"]
	if o, _ := p.Reconcile(ctx, "svc", spec); o.Details["pid"] != pid {
		t.Error("an unchanged spec restarted the process")
	}
	spec["env"] = map[string]any{"X": "1"}
	if o, _ := p.Observe(ctx, "svc", spec); o.InSync || o.Drift != "spec changed" {
		t.Errorf("changed spec: %+v", o)
	}
	if err := p.Delete(ctx, "svc", spec); err != nil {
		t.Fatal(err)
	}
	if o, _ := p.Observe(ctx, "svc", spec); o.InSync || o.Drift != "not running" {
		t.Errorf("after delete: %+v", o)
	}
	// restart: never — a finished process is in sync, and not a service.
	once := Spec{"command": "true", "restart": "never"}
	if _, err := p.Reconcile(ctx, "once", once); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	done := p.procs["once"].done
	p.mu.Unlock()
	<-done
	if o, _ := p.Observe(ctx, "once", once); !o.InSync || o.Details["exit_code"] != "0" || o.Details["services"] != "" {
		t.Errorf("restart never, exited: %+v", o)
	}
}

// An init step cut off by the call's deadline (the agent's
// agent.call_timeout) is told apart from one that reached its own timeout:
// in the error and in the audit record, with the real wait. Either way
// its process group is killed.
func TestProcessInitCutOffByCallDeadline(t *testing.T) {
	cutOff := regexp.MustCompile(`^cut off after waiting ([0-9.]+m?s): the reconcile's deadline passed$`)
	for _, tc := range []struct {
		name    string
		call    time.Duration // 0: no deadline
		cancel  time.Duration // cancel the call after this
		timeout string
		want    string // the outcome, or "cut off" checked with the pattern
	}{
		{"call deadline first", 500 * time.Millisecond, 0, "", "cut off"},
		{"call deadline before a short step timeout", 500 * time.Millisecond, 0, "10s", "cut off"},
		{"step timeout first", 10 * time.Second, 0, "300ms", "timed out: waited 300ms"},
		{"no call deadline", 0, 0, "300ms", "timed out: waited 300ms"},
		{"call cancelled", 10 * time.Second, 300 * time.Millisecond, "", "cut off: the reconcile was cancelled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runs := &recordedRuns{}
			ctx, cancel := context.WithCancel(WithRuns(context.Background(), runs))
			defer cancel()
			if tc.call > 0 {
				ctx, cancel = context.WithTimeout(ctx, tc.call)
				defer cancel()
			}
			if tc.cancel > 0 {
				stop := time.AfterFunc(tc.cancel, cancel)
				defer stop.Stop()
			}
			p := NewProcess()
			t.Cleanup(p.StopAll)
			step := map[string]any{"name": "slow", "command": "sh", "args": []any{"-c", "sleep 30 & wait"}}
			if tc.timeout != "" {
				step["timeout"] = tc.timeout
			}
			start := time.Now()
			o, err := p.Reconcile(ctx, "svc", Spec{"command": "sleep", "args": []any{"60"}, "init": []any{step}})
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("took %v: the step's process group was not killed", took)
			}
			if err == nil || o.Drift != "init step slow failed" {
				t.Fatalf("%+v %v", o, err)
			}
			t.Log(err)
			msg, ok := strings.CutPrefix(err.Error(), "init step slow: ")
			if !ok {
				t.Fatalf("error %q", err)
			}
			if tc.want == "cut off" {
				m := cutOff.FindStringSubmatch(msg)
				if m == nil {
					t.Fatalf("error %q, want %s", err, cutOff)
				}
				if waited, _ := time.ParseDuration(m[1]); waited <= tc.call/2 || waited > tc.call {
					t.Errorf("waited %v: not the real wait (the call's bound is %v)", waited, tc.call)
				}
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("errors.Is(%v, DeadlineExceeded) = false", err)
				}
			} else if msg != tc.want {
				t.Fatalf("error %q, want %q", msg, tc.want)
			}
			if tc.cancel > 0 && !errors.Is(err, context.Canceled) {
				t.Errorf("errors.Is(%v, Canceled) = false", err)
			}
			if len(runs.runs) != 1 || runs.runs[0] != "svc|slow|sh -c sleep 30 & wait|timed-out|"+msg {
				t.Errorf("runs %q, want the outcome %q", runs.runs, msg)
			}
			if o, _ := p.Observe(ctx, "svc", Spec{"command": "sleep", "args": []any{"60"}, "init": []any{step}}); o.InSync {
				t.Errorf("the service runs after a step was cut off: %+v", o)
			}
		})
	}
	// A shell job runs the same way.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := (&ShellJob{Allowed: true}).Reconcile(ctx, "j", Spec{"command": "sleep 30"}); err == nil || !cutOff.MatchString(err.Error()) {
		t.Errorf("shell job: %v, want %s", err, cutOff)
	}
}

func TestProcessMinCallTime(t *testing.T) {
	p := NewProcess()
	for _, tc := range []struct {
		spec Spec
		want time.Duration
	}{
		{Spec{"command": "x"}, 0},
		{Spec{"command": "x", "init": []any{map[string]any{"name": "a", "command": "y"}}}, DefaultInitTimeout},
		{Spec{"command": "x", "init": []any{map[string]any{"name": "a", "command": "y", "timeout": "90s"},
			map[string]any{"name": "b", "command": "y", "timeout": 30}, map[string]any{"name": "c", "command": "y"}}}, 120*time.Second + DefaultInitTimeout},
		{Spec{"init": []any{map[string]any{"name": "a", "command": "y"}}}, 0}, // invalid: no command
	} {
		if got := p.MinCallTime(tc.spec); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.spec, got, tc.want)
		}
	}
	j := &ShellJob{}
	if got := j.MinCallTime(Spec{"command": "x"}); got != DefaultInitTimeout {
		t.Errorf("shell job, default timeout: %v", got)
	}
	if got := j.MinCallTime(Spec{"command": "x", "timeout": "10s"}); got != 10*time.Second {
		t.Errorf("shell job: %v", got)
	}
	if got := j.MinCallTime(Spec{"timeout": "10s"}); got != 0 {
		t.Errorf("shell job, invalid: %v", got)
	}
}
