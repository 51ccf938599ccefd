package resources

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
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
	} {
		err := File{}.Validate(tc.spec)
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
