package failover

import (
	"errors"
	"strings"
	"testing"
	"time"

	"understudy/actors"
)

// A fence chain that can outlast fence_grace breaks the safety argument:
// refused at start, and a run-time change that lowers fence_grace under
// it is refused with the old rules kept.
func TestFenceBudgetMustFitFenceGrace(t *testing.T) {
	rules := DefaultRules("pg", "a", "b") // fence_grace 2s
	_, err := NewMember("a", rules, Options{FenceBudget: 3 * time.Second})
	var ce *actors.ConfigError
	if !errors.As(err, &ce) || ce.Field != "fence_grace" || !strings.Contains(ce.Rule, "(3s)") {
		t.Fatalf("NewMember with a 3s fence chain and 2s grace: %v", err)
	}

	m, err := NewMember("a", rules, Options{FenceBudget: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	m.Start(0)
	lower := rules
	lower.FenceGrace = time.Second
	r := m.Step(time.Millisecond, ConfigObserved{Rev: 5, Rules: lower})
	var rejected *ConfigRejected
	for _, ev := range r.Events {
		if e, ok := ev.(*ConfigRejected); ok {
			rejected = e
		}
	}
	if rejected == nil || rejected.Field != "fence_grace" || rejected.Value != "1s" {
		t.Fatalf("config lowering fence_grace under the fence chain: events %v", r.Events)
	}
	if m.Rules().FenceGrace != 2*time.Second {
		t.Fatalf("rules in force changed to %+v", m.Rules())
	}

	raise := rules
	raise.FenceGrace, raise.FailoverTimeout = 3*time.Second, 6*time.Second
	r = m.Step(2*time.Millisecond, ConfigObserved{Rev: 6, Rules: raise})
	applied := false
	for _, ev := range r.Events {
		_, ok := ev.(*ConfigApplied)
		applied = applied || ok
	}
	if !applied || m.Rules() != raise {
		t.Fatalf("a change that keeps the budget: events %v, rules %+v", r.Events, m.Rules())
	}
}

// Thresholds and durations are bounded so the safety inequality's sum
// cannot overflow into a small, passing number.
func TestRulesBoundsPreventOverflow(t *testing.T) {
	r := DefaultRules("pg", "a", "b")
	r.FailureThreshold = 1 << 40
	r.HeartbeatTimeout = 1 << 40
	if err := r.Validate(); err == nil {
		t.Fatal("huge failure_threshold accepted")
	}
	r = DefaultRules("pg", "a", "b")
	r.HeartbeatTimeout = 25 * time.Hour
	var ce *actors.ConfigError
	if err := r.Validate(); !errors.As(err, &ce) || ce.Field != "heartbeat_timeout" {
		t.Fatalf("25h heartbeat_timeout: %v", err)
	}
	r = DefaultRules("pg", "a", "b")
	r.FailureThreshold, r.HeartbeatTimeout = MaxThreshold, MaxDuration
	r.FenceGrace, r.FailoverTimeout = MaxDuration, MaxDuration
	if err := r.Validate(); !errors.As(err, &ce) || ce.Field != "failover_timeout" {
		t.Fatalf("largest thresholds: the inequality must still be computed and fail: %v", err)
	}
}

// Rules with no lower bound let a pair never serve (1ms heartbeats) or a
// member never work (a name longer than a NATS control line allows): both
// are refused, naming the field and the rule, at load and at run time.
func TestRulesFloorsAndNameLengths(t *testing.T) {
	base := DefaultRules("pg-main", "site-a", "site-b")
	for _, c := range []struct {
		name  string
		edit  func(*Rules)
		field string
		rule  string
	}{
		{"1ms heartbeat", func(r *Rules) { r.HeartbeatTimeout = time.Millisecond }, "heartbeat_timeout", "must be at least 50ms"},
		{"1ns heartbeat", func(r *Rules) { r.HeartbeatTimeout = 1 }, "heartbeat_timeout", "must be at least 50ms"},
		{"long pair", func(r *Rules) { r.Pair = strings.Repeat("p", 100000) }, "pair", "at most 64 characters (it has 100000)"},
		{"65 character site", func(r *Rules) { r.Replica = strings.Repeat("s", 65) }, "replica", "at most 64 characters"},
		{"non-ASCII site", func(r *Rules) { r.Primary = "sité" }, "primary", "'é' is not allowed"},
		{"wildcard", func(r *Rules) { r.Pair = "pg>" }, "pair", "'>' is not allowed"},
	} {
		r := base
		c.edit(&r)
		err := r.Validate()
		var ce *actors.ConfigError
		if !errors.As(err, &ce) || ce.Field != c.field || !strings.Contains(ce.Rule, c.rule) {
			t.Errorf("%s: %v, want field %s rule containing %q", c.name, err, c.field, c.rule)
		}
		// The same check refuses it as a run-time change.
		m, merr := NewMember("site-a", base, Options{})
		if merr != nil {
			t.Fatal(merr)
		}
		m.Start(0)
		ready := m.Step(0, ConfigObserved{Rev: 9, Rules: r})
		if len(ready.Events) != 1 || ready.Events[0].EventType() != "failover.config_rejected" {
			t.Errorf("%s at run time: %v", c.name, ready.Events)
		}
	}
	ok := base
	ok.HeartbeatTimeout, ok.FailoverTimeout, ok.FenceGrace = MinHeartbeat, time.Second, 100*time.Millisecond
	ok.Pair = strings.Repeat("p", MaxNameLen)
	if err := ok.Validate(); err != nil {
		t.Errorf("the floors themselves: %v", err)
	}
}

// A gap in the follower's own heartbeats is a stall of the store — the
// staleness clock restarts after it — unless the watch was established
// afresh (Resynced): a new watch delivers only the latest heartbeat, and
// the gap is the watch's.
func TestStoreStallAndRewatchGaps(t *testing.T) {
	r := DefaultRules("pg", "site-a", "site-b")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	run := func(rewatch bool) bool {
		m, err := NewMember("site-b", r, Options{})
		if err != nil {
			t.Fatal(err)
		}
		m.Start(0)
		m.Step(0, ProcedureResult{Kind: ProcFence, Seq: 1, OK: true})
		m.Step(0, Synced{})
		m.Step(0, LeaderObserved{Entry: LeaderEntry{Rev: 5, Time: t0, Value: Leader{Site: "site-a", Term: 1, Beat: 3}}})
		for i := 1; i <= 2; i++ {
			m.Step(time.Duration(i)*time.Second, HeartbeatObserved{Rev: uint64(5 + i), Time: t0.Add(time.Duration(i) * time.Second), Site: "site-b", Value: Heartbeat{Site: "site-b", Beat: uint64(i)}})
		}
		if rewatch {
			m.Step(6*time.Second, Resynced{})
		}
		ready := m.Step(6500*time.Millisecond, HeartbeatObserved{Rev: 20, Time: t0.Add(6500 * time.Millisecond), Site: "site-b", Value: Heartbeat{Site: "site-b", Beat: 7}})
		for _, w := range ready.Writes {
			if w.Kind == WriteAcquire {
				return true
			}
		}
		return false
	}
	if run(false) {
		t.Error("after a 4.5s gap in its own acknowledged heartbeats (a stall) the follower promoted at once")
	}
	if !run(true) {
		t.Error("after a fresh watch skipped its heartbeats the follower did not promote a leader silent for 6.5s")
	}
}

// The stop bound is (failure_threshold + 1) × heartbeat_timeout +
// fence_grace, and the safety inequality's floor is that bound: a
// failover_timeout one nanosecond under it is refused, at it accepted.
func TestStopBoundIsTheSafetyFloor(t *testing.T) {
	r := DefaultRules("p", "a", "b")
	r.HeartbeatTimeout, r.FailureThreshold, r.FenceGrace = 700*time.Millisecond, 4, 1500*time.Millisecond
	if got, want := r.StopBound(), 5*700*time.Millisecond+1500*time.Millisecond; got != want {
		t.Fatalf("StopBound = %v, want %v", got, want)
	}
	if r.MinFailoverTimeout() != r.StopBound() {
		t.Errorf("MinFailoverTimeout %v, StopBound %v", r.MinFailoverTimeout(), r.StopBound())
	}
	r.FailoverTimeout = r.StopBound()
	if err := r.Validate(); err != nil {
		t.Errorf("failover_timeout at the stop bound: %v", err)
	}
	r.FailoverTimeout = r.StopBound() - time.Nanosecond
	if err := r.Validate(); err == nil {
		t.Errorf("failover_timeout under the stop bound accepted")
	}
}
