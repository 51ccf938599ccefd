package vm

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"understudy/actors/capability"
	"understudy/actors/resources/libvirt"
	"understudy/actors/resources/libvirt/libvirttest"
)

// check runs Check and compares the role and whether it failed.
func check(t *testing.T, v *VM, serving bool, role capability.Role, fails bool) capability.Status {
	t.Helper()
	st, err := v.Check(ctx(t), req(serving))
	if st.Role != role || (err != nil) != fails {
		t.Fatalf("Check(serving=%v) = %v, %v; want role %v, failing %v", serving, st.Role, err, role, fails)
	}
	if st.Positions {
		t.Errorf("Check reports positions; a VM has none")
	}
	if !strings.Contains(st.Detail, "domain "+v.cfg.Domain) {
		t.Errorf("Check's detail %q does not name the domain", st.Detail)
	}
	return st
}

func TestPromoteStartsAStandbyAndIsIdempotent(t *testing.T) {
	w := newWorld(t)
	w.define(t, "guest")
	v := w.vm(t, Config{Domain: "guest"})

	// A stopped VM is a healthy standby, and no leader.
	check(t, v, false, capability.RoleStandby, false)
	check(t, v, true, capability.RoleStandby, true)

	for i := range 2 { // the second promotes a primary: it succeeds
		if err := v.Promote(ctx(t), req(false)); err != nil {
			t.Fatalf("promote %d: %v", i+1, err)
		}
		if st := w.state(t, "guest"); st != libvirt.StateRunning {
			t.Fatalf("after promote %d the domain is %s", i+1, st)
		}
	}
	check(t, v, true, capability.RolePrimary, false)
	// Running on a member that follows: found, and unhealthy.
	st := check(t, v, false, capability.RolePrimary, true)
	if !strings.Contains(st.Detail, "running") {
		t.Errorf("detail %q does not say running", st.Detail)
	}
}

func TestPromoteLeavesARunningDomainAlone(t *testing.T) {
	w := newWorld(t)
	v := w.vm(t, Config{Domain: "test"}) // test:///default's own, running
	if err := v.Promote(ctx(t), req(false)); err != nil {
		t.Fatal(err)
	}
	if st := w.state(t, "test"); st != libvirt.StateRunning {
		t.Fatalf("domain is %s", st)
	}
	if strings.Contains(w.logs.String(), "started") || strings.Contains(w.logs.String(), "destroy") {
		t.Errorf("promoting a running domain did something:\n%s", w.logs)
	}
}

func TestFenceDestroysAndIsIdempotent(t *testing.T) {
	w := newWorld(t)
	v := w.vm(t, Config{Domain: "test"})
	check(t, v, true, capability.RolePrimary, false)
	for i := range 2 { // the second fences a fenced domain: it succeeds
		if err := v.Fence(ctx(t), req(true)); err != nil {
			t.Fatalf("fence %d: %v", i+1, err)
		}
		if st := w.state(t, "test"); st != libvirt.StateShutoff {
			t.Fatalf("after fence %d the domain is %s", i+1, st)
		}
	}
	logs := w.logs.String()
	for _, want := range []string{"fenced: domain destroyed", "fenced: domain already shut off", "pair=db", "site=a"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
	check(t, v, false, capability.RoleStandby, false)
	// And it can be promoted again: fenced is a standby.
	if err := v.Promote(ctx(t), req(false)); err != nil {
		t.Fatal(err)
	}
	check(t, v, true, capability.RolePrimary, false)
}

func TestDemoteShutsDownAndIsIdempotent(t *testing.T) {
	w := newWorld(t)
	v := w.vm(t, Config{Domain: "test"})
	for i := range 2 {
		if err := v.Demote(ctx(t), req(true)); err != nil {
			t.Fatalf("demote %d: %v", i+1, err)
		}
		if st := w.state(t, "test"); st != libvirt.StateShutoff {
			t.Fatalf("after demote %d the domain is %s", i+1, st)
		}
	}
	if logs := w.logs.String(); !strings.Contains(logs, "guest powered off") || strings.Contains(logs, "destroyed") {
		t.Errorf("demote of a guest that honours ACPI should power it off, never destroy it:\n%s", logs)
	}
	check(t, v, false, capability.RoleStandby, false)
}

// A guest that ignores the ACPI request is destroyed once the shutdown
// timeout has passed.
func TestDemoteDestroysAGuestThatIgnoresShutdown(t *testing.T) {
	w := newWorld(t)
	v, err := New(Config{URI: "test:///default", Domain: "test", ShutdownTimeout: 500 * time.Millisecond},
		deafConnector{w.conn}, slog.New(slog.NewTextHandler(w.logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := v.Demote(ctx(t), req(true)); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 500*time.Millisecond {
		t.Errorf("demote took %v: it did not wait the shutdown timeout", took)
	}
	if st := w.state(t, "test"); st != libvirt.StateShutoff {
		t.Fatalf("domain is %s", st)
	}
	logs := w.logs.String()
	for _, want := range []string{"did not power off in time", "demoted: domain destroyed"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
}

// The graceful wait leaves fence_timeout of ctx's deadline for the
// destroy: a demote with a deadline shorter than shutdown_timeout still
// stops the domain in time.
func TestDemoteKeepsTimeToDestroyBeforeItsDeadline(t *testing.T) {
	w := newWorld(t)
	v, err := New(Config{URI: "test:///default", Domain: "test", ShutdownTimeout: time.Minute, FenceTimeout: time.Second},
		deafConnector{w.conn}, slog.New(slog.NewTextHandler(w.logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := v.Demote(c, req(true)); err != nil {
		t.Fatalf("demote: %v", err)
	}
	if st := w.state(t, "test"); st != libvirt.StateShutoff {
		t.Fatalf("domain is %s", st)
	}
}

func TestRejoinDestroysARunningDomainAndIsIdempotent(t *testing.T) {
	w := newWorld(t)
	w.define(t, "guest")
	fenced := w.vm(t, Config{Domain: "guest"})
	for i := range 2 { // fenced (shut off): nothing to do
		if err := fenced.Rejoin(ctx(t), req(false)); err != nil {
			t.Fatalf("rejoin %d: %v", i+1, err)
		}
		if st := w.state(t, "guest"); st != libvirt.StateShutoff {
			t.Fatalf("rejoin %d left the domain %s", i+1, st)
		}
	}

	running := w.vm(t, Config{Domain: "test"})
	check(t, running, false, capability.RolePrimary, true)
	for i := range 2 {
		if err := running.Rejoin(ctx(t), req(false)); err != nil {
			t.Fatalf("rejoin %d: %v", i+1, err)
		}
		if st := w.state(t, "test"); st != libvirt.StateShutoff {
			t.Fatalf("rejoin %d left the domain %s", i+1, st)
		}
	}
	if logs := w.logs.String(); !strings.Contains(logs, "while its member follows b") {
		t.Errorf("logs do not say the domain ran while following:\n%s", logs)
	}
	check(t, running, false, capability.RoleStandby, false)
}

// A domain that does not exist is neither fenced nor promoted: a misspelt
// name must not pass for a fence.
func TestMissingDomainFailsEveryMethod(t *testing.T) {
	w := newWorld(t)
	v := w.vm(t, Config{Domain: "no-such-guest"})
	st, err := v.Check(ctx(t), req(false))
	if st.Role != capability.RoleDown || !errors.Is(err, libvirt.ErrNotFound) {
		t.Fatalf("Check = %v, %v; want down, not found", st.Role, err)
	}
	for name, call := range map[string]func(context.Context, capability.Request) error{
		"fence": v.Fence, "promote": v.Promote, "demote": v.Demote, "rejoin": v.Rejoin,
	} {
		err := call(ctx(t), req(false))
		if !errors.Is(err, libvirt.ErrNotFound) || !strings.Contains(err.Error(), "no-such-guest") {
			t.Errorf("%s: %v; want an error naming the domain, wrapping libvirt.ErrNotFound", name, err)
		}
	}
}

// Check may run concurrently with the others (the host's contract).
func TestCheckRunsBesideTheOthers(t *testing.T) {
	w := newWorld(t)
	v := w.vm(t, Config{Domain: "test"})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 3 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				st, _ := v.Check(ctx(t), req(true))
				if st.Role != capability.RolePrimary && st.Role != capability.RoleStandby {
					t.Errorf("Check found %v: %s", st.Role, st.Detail)
					return
				}
			}
		})
	}
	for range 3 {
		if err := v.Fence(ctx(t), req(true)); err != nil {
			t.Error(err)
		}
		if err := v.Promote(ctx(t), req(true)); err != nil {
			t.Error(err)
		}
	}
	close(stop)
	wg.Wait()
}

// Fence is bounded by FenceBudget even when libvirt never answers: the
// understudy-libvirt process running the destroy is killed at the budget.
func TestFenceReturnsWithinItsBudgetWhenLibvirtHangs(t *testing.T) {
	silent := libvirttest.SilentLibvirtd(t)
	conn := libvirt.NewDriverProcess(libvirt.DriverConfig{Path: libvirttest.DriverBinary(t)}, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { conn.Close() })
	v, err := New(Config{URI: silent.URI(), Domain: "guest", FenceTimeout: 500 * time.Millisecond}, conn, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v.FenceBudget() != 500*time.Millisecond {
		t.Fatalf("FenceBudget = %v", v.FenceBudget())
	}
	start := time.Now()
	err = v.Fence(context.Background(), req(true))
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "killed") {
		t.Errorf("fence against a libvirtd that never answers: %v; want the deadline, and the process killed", err)
	}
	if took > v.FenceBudget()+time.Second {
		t.Errorf("fence took %v; its budget is %v", took, v.FenceBudget())
	}
}

// What each domain state reads as, for a member that serves and one that
// follows.
func TestJudge(t *testing.T) {
	type verdict struct {
		role  capability.Role
		fails bool
	}
	for _, tc := range []struct {
		state              string
		serving, following verdict
	}{
		{libvirt.StateRunning, verdict{capability.RolePrimary, false}, verdict{capability.RolePrimary, true}},
		{stateBlocked, verdict{capability.RolePrimary, false}, verdict{capability.RolePrimary, true}},
		{libvirt.StateShutoff, verdict{capability.RoleStandby, true}, verdict{capability.RoleStandby, false}},
		{statePaused, verdict{capability.RoleDown, true}, verdict{capability.RoleDown, true}},
		{statePMSuspended, verdict{capability.RoleDown, true}, verdict{capability.RoleDown, true}},
		{stateCrashed, verdict{capability.RoleDown, true}, verdict{capability.RoleDown, true}},
		{stateShuttingDown, verdict{capability.RoleDown, true}, verdict{capability.RoleDown, true}},
		{"nostate", verdict{capability.RoleDown, true}, verdict{capability.RoleDown, true}},
	} {
		for serving, want := range map[bool]verdict{true: tc.serving, false: tc.following} {
			st, err := judge(libvirt.DomainStatus{Defined: true, Name: "g", State: tc.state}, serving)
			if st.Role != want.role || (err != nil) != want.fails || st.Positions {
				t.Errorf("%s, serving %v: %v, %v; want %v, failing %v", tc.state, serving, st.Role, err, want.role, want.fails)
			}
			if st.Detail != tc.state {
				t.Errorf("%s: detail %q", tc.state, st.Detail)
			}
		}
	}
	if st, err := judge(libvirt.DomainStatus{}, false); st.Role != capability.RoleDown || !errors.Is(err, libvirt.ErrNotFound) {
		t.Errorf("undefined: %v, %v", st.Role, err)
	}
}
