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
// liveness writes unbounded): none of these; longest outage 8.8 s.
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
