package simulations

import (
	"testing"
	"time"
)

// TestStoreThroughputTakeoverBurst keeps the simulator's reproduction of
// the bug 726af8e fixed in the runtime (found in a real-process scale
// run): node leadership, 250 pairs per node, power cut of the primaries'
// node (power-cut, seed 1, at 21.7 s), a store that serves one write per
// 1.04 ms (the load of 2,000 pairs at 130 µs). Without a bound on what a
// node's members have in flight, the survivor's 250 takeovers and their
// appends queued ahead of its own liveness write, which missed its
// deadline twice: its members counted 500 failed heartbeats
// (survivor-heartbeat-failed-during-takeover), 70 healthy new holders
// fenced themselves (self-fenced-on-heartbeat-failures), 133 lost
// leadership, all 250 pairs failed back; longest outage 11.5 s. With the
// runtime's bound (64 member writes and 64 appends in flight per node,
// liveness writes unbounded): none of these; longest outage 8.8 s (7.5 s
// since a waiting write is not issued after half its window, finding N8).
func TestStoreThroughputTakeoverBurst(t *testing.T) {
	cfg := Config{Scenario: "power-cut", Seed: 1, Duration: 35 * time.Second, Leadership: LeadershipNode, Pairs: 250,
		StoreWriteTime: 1040 * time.Microsecond}
	count := func(r *Result, name string) int {
		for _, c := range r.Sometimes {
			if c.Name == name {
				return c.Count
			}
		}
		return 0
	}

	unbounded, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n := count(unbounded, "survivor-heartbeat-failed-during-takeover"); n == 0 {
		t.Errorf("without a node bound: no survivor heartbeat failed; the model no longer reproduces the overload")
	}

	cfg.HostWriteBound = HostWriteBoundRuntime
	bounded, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"survivor-heartbeat-failed-during-takeover", "self-fenced-on-heartbeat-failures", "leadership-lost", "failback"} {
		if n := count(bounded, name); n > 0 {
			t.Errorf("with the runtime's bound: %s = %d, want 0", name, n)
		}
	}
	if bounded.Failovers != cfg.Pairs {
		t.Errorf("with the runtime's bound: %d failovers, want %d", bounded.Failovers, cfg.Pairs)
	}
	for _, v := range bounded.Violations {
		t.Errorf("with the runtime's bound: %+v", v)
	}
}

// TestTakeoverRegisterStorm keeps the simulator's reproduction of the
// bug 5b6e2d2 fixed in the runtime (found in a real 10,000-pair run):
// node leadership, 1,000 pairs per node, a store that serves one write
// per 1.2 ms (833 a second: fewer than one register write per pair per
// heartbeat_timeout), the runtime's bound of 64. The replicas' node starts
// 20 s late, so that each node's start-up settles on its own (the model
// starts a node's members at once, not in the runtime's waves); the
// primaries' node is cut at 40 s; 60 simulated seconds. With the bound's
// rule before 5b6e2d2 (a queued write issued until its deadline), the
// survivor's takeovers filled its queue, the writes issued after waiting
// most of their window landed after their deadline, counted failed and
// were written again: a fixed point from 50 s on, 482 holders rewriting
// their register every second (4,817 register writes in the last 10 s,
// 2,994 landed after their deadline) while the 518 other pairs retried
// their acquire every second and never took over (482 failovers, the last
// at 48.5 s; dead-primary-not-replaced for all 1,000 pairs). With
// 5b6e2d2's rule (a write whose turn comes after half its window is not
// issued): 1,000 failovers by 49.6 s, no register write in the last 10 s,
// none landed late, no violation, longest outage 11.0 s.
func TestTakeoverRegisterStorm(t *testing.T) {
	faults, err := ParseFaults("crash(site-b)@1ms+20s;powercut(site-a)@40s", "site-a", "site-b")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Scenario: "power-cut", Seed: 1, Duration: 60 * time.Second, Leadership: LeadershipNode, Pairs: 1000,
		StoreWriteTime: 1200 * time.Microsecond, HostWriteBound: HostWriteBoundRuntime,
		Faults: faults, FaultsSet: true}
	count := func(r *Result, name string) int {
		for _, c := range r.Sometimes {
			if c.Name == name {
				return c.Count
			}
		}
		return 0
	}

	late := cfg
	late.HostIssueLate = true
	late.AcquireOneHeartbeat = true // the members' acquires of that time
	before, err := Run(late)
	if err != nil {
		t.Fatal(err)
	}
	if before.RegisterWritesTail < 10*cfg.Pairs/5 {
		t.Errorf("issued until their deadline: %d register writes in the last 10s, want at least %d (a fifth of the pairs every second); the model no longer reproduces the storm",
			before.RegisterWritesTail, 10*cfg.Pairs/5)
	}
	if n := count(before, "register-write-landed-after-deadline"); n == 0 {
		t.Errorf("issued until their deadline: no register write landed after its deadline")
	}

	after, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if after.RegisterWritesTail > cfg.Pairs/100 {
		t.Errorf("issued within half their window: %d register writes in the last 10s, want at most %d", after.RegisterWritesTail, cfg.Pairs/100)
	}
	if n := count(after, "register-write-landed-after-deadline"); n > cfg.Pairs/100 {
		t.Errorf("issued within half their window: %d register writes landed after their deadline, want at most %d", n, cfg.Pairs/100)
	}
	if after.Failovers != cfg.Pairs {
		t.Errorf("issued within half their window: %d failovers, want %d", after.Failovers, cfg.Pairs)
	}
	for _, v := range after.Violations {
		t.Errorf("issued within half their window: %+v", v)
	}
}
