package simulations

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// The contract of the default rules: with any schedule of the random
// scenario and every built-in scenario, no invariant is ever violated.
// A failure prints the command that reproduces it and the minimal
// schedule; run it with --trace to see the timeline.
func TestDefaultRulesHoldInvariants(t *testing.T) {
	for _, sc := range Scenarios() {
		if sc.Name == "random" || sc.Name == "db-random" || sc.Name == "db-random-sync" {
			continue // swarm scenarios: see TestDatabaseSwarm
		}
		for seed := uint64(1); seed <= 5; seed++ {
			cfg := Config{Scenario: sc.Name, Seed: seed}
			r, err := Run(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range r.Violations {
				t.Errorf("%s: %s at %.3fs: %s", Command(cfg, ""), v.Invariant, v.At, v.Detail)
			}
		}
	}
	res := Swarm(context.Background(), SwarmConfig{Seeds: 200, FirstSeed: 1, Duration: 10 * time.Minute, ShrinkBudget: 100})
	for _, f := range res.Failed {
		t.Errorf("seed %d: %s at %.3fs: %s\n\treproduce: %s\n\tminimal: %s", f.Seed, f.Invariant, f.At, f.Detail, f.Reproduce, f.MinimalReproduce)
	}
	if len(res.Errors) > 0 {
		t.Fatal(res.Errors)
	}
}

// Rules that break the safety inequality are refused, unless allowed;
// then the swarm finds the split brain (the checker can fail), shrinking
// keeps it, and the printed reproduce command brings it back.
func TestUnsafeRulesSplitBrainIsFound(t *testing.T) {
	rules := DefaultPair()
	rules.FailoverTimeout = 2 * time.Second // needs (2+1) × 1s + 2s = 5s
	if _, err := Run(Config{Scenario: "random", Seed: 1, Rules: rules}); err == nil || !strings.Contains(err.Error(), "safety inequality") {
		t.Fatalf("unsafe rules accepted: %v", err)
	}
	res := Swarm(context.Background(), SwarmConfig{Seeds: 20, FirstSeed: 1, Duration: 10 * time.Minute, Rules: rules, AllowUnsafe: true, ShrinkBudget: 200})
	i := slices.IndexFunc(res.Failed, func(f SwarmFailure) bool { return f.Invariant == InvSplitBrain })
	if i < 0 {
		t.Fatalf("20 seeds with failover_timeout 2s found no split brain: %+v", res.Failed)
	}
	f := res.Failed[i]
	if !strings.Contains(f.Reproduce, "--allow-unsafe-config") || f.Minimal == "" || f.MinimalFaults > f.Faults {
		t.Fatalf("failure %+v: want a reproduce command with --allow-unsafe-config and a minimal schedule", f)
	}
	faults, err := ParseFaults(f.Minimal, rules.Primary, rules.Replica)
	if err != nil {
		t.Fatal(err)
	}
	cfg := SwarmConfig{Duration: 10 * time.Minute, Rules: rules, AllowUnsafe: true}.SeedConfig(f.Seed)
	cfg.Faults, cfg.FaultsSet = faults, true
	r, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(r.Violations, func(v Violation) bool { return v.Invariant == InvSplitBrain }) {
		t.Fatalf("the minimal schedule %q of seed %d no longer splits the brain: %v", f.Minimal, f.Seed, r.Violations)
	}
	if want := Command(cfg, ""); f.MinimalReproduce != want {
		t.Errorf("minimal reproduce %q, want %q", f.MinimalReproduce, want)
	}
}

// runWith runs cfg with a hook on the simulation before it starts.
func runWith(t *testing.T, cfg Config, hook func(*sim)) *Result {
	t.Helper()
	s, err := newSim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hook(s)
	s.run()
	return s.result(0)
}

func hasViolation(r *Result, name string) bool {
	return slices.ContainsFunc(r.Violations, func(v Violation) bool { return v.Invariant == name })
}

// Each checker can fail: tighten what it allows below what the algorithm
// guarantees and it fires.
func TestCheckersCanFail(t *testing.T) {
	for _, tc := range []struct {
		name, invariant string
		cfg             Config
		hook            func(*sim)
		plain           Config // the same without the tightening; default cfg
	}{
		{"liveness bound shorter than failover_timeout", InvDeadNotReplaced,
			Config{Scenario: "power-cut", Seed: 1}, func(s *sim) { s.bound = s.rules.FailoverTimeout / 2 }, Config{}},
		{"checker's failover_timeout above the members'", InvPromotionWhileWrites,
			Config{Scenario: "power-cut", Seed: 1}, func(s *sim) { s.foCheck = time.Minute }, Config{}},
		{"no leadership change allowed after the faults", InvFlapping,
			Config{Scenario: "return-to-normal", Seed: 1}, func(s *sim) { s.calmLimit = 0 }, Config{}},
		{"settle bound shorter than a failover", InvUnavailable,
			Config{Scenario: "return-to-normal", Seed: 1, Faults: []Fault{{Kind: FaultCrash, Site: "site-a", At: 30 * time.Second, For: time.Second}}, FaultsSet: true},
			func(s *sim) { s.settle = time.Second }, Config{}},
		{"a scenario expectation", InvScenario,
			Config{Scenario: "switchover", Seed: 1, Faults: []Fault{{Kind: FaultPowerCut, Site: "site-a", At: 30 * time.Second}}, FaultsSet: true},
			func(*sim) {}, Config{Scenario: "switchover", Seed: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runWith(t, tc.cfg, tc.hook)
			if !hasViolation(r, tc.invariant) {
				t.Fatalf("want %s, got %v", tc.invariant, r.Violations)
			}
			if tc.plain.Scenario == "" {
				tc.plain = tc.cfg
			}
			plain, err := Run(tc.plain)
			if err != nil {
				t.Fatal(err)
			}
			if hasViolation(plain, tc.invariant) {
				t.Fatalf("the same run without the tightening also violates %s: %v", tc.invariant, plain.Violations)
			}
		})
	}
}

// Shrinking keeps the invariant and never grows the schedule.
func TestShrinkFindsMinimalSchedule(t *testing.T) {
	rules := DefaultPair()
	rules.FailoverTimeout = 2 * time.Second
	cfg := Config{Scenario: "random", Seed: 2, Duration: 10 * time.Minute, Rules: rules, AllowUnsafe: true}
	r, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Failed() {
		t.Fatalf("seed 2 with unsafe rules did not fail; pick another seed")
	}
	min, v, runs := Shrink(cfg, r.Violations[0].Invariant, 300)
	if v == nil || v.Invariant != r.Violations[0].Invariant {
		t.Fatalf("shrunk schedule lost the violation: %v", v)
	}
	all, _ := newSim(cfg)
	if len(min) == 0 || len(min) >= len(all.faults) || runs > 300 {
		t.Fatalf("shrunk %d faults to %d in %d runs", len(all.faults), len(min), runs)
	}
	// 1-minimal: dropping any one fault loses the violation.
	for i := range min {
		c := cfg
		c.Faults, c.FaultsSet = slices.Delete(slices.Clone(min), i, i+1), true
		rr, err := Run(c)
		if err != nil {
			t.Fatal(err)
		}
		if hasViolation(rr, v.Invariant) {
			t.Errorf("without %s the schedule still fails: not minimal", min[i])
		}
	}
}
