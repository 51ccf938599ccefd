package simulations

import (
	"testing"
	"time"
)

// TestTakeoverInWaves keeps the world's bug of a 10,000-pair node death on
// real NATS (run 30, ad2c548: the last register 16.0s after the kill; the
// store's record showed the registers landing in waves a second apart,
// the store idle for 9 of the 13s between them, and as many member
// heartbeats as registers among what landed). In the simulator: node
// leadership, 4,000 pairs a node, a store serving a write alone in 150µs
// and a batch in 150µs plus 300µs a write (as slow as the survivor saw
// its batches in that run: about 80ms a batch of 256), the runtime's
// bound, batches and raises made once; the primaries' node is cut at 40s.
//
// Before the fix (AcquireOneHeartbeat, HostBeatsInOrder) an acquire
// waited one heartbeat_timeout and the gate issued a write only in the
// first half of it, in arrival order with the members' heartbeats: most
// acquires were dropped at their turn, their members tried again a
// second later, and each wave took the store's turns from the next
// (the last register 8.4s after the cut, 1,342 pairs past
// failover_timeout + 2 × heartbeat_timeout, 10,674 failed acquires). With
// it an acquire of node leadership waits two heartbeat_timeouts, is
// issued until half a heartbeat_timeout before its deadline, and register
// writes go before member heartbeats: every pair within the bound (the
// last 6.5s after the cut, 106 failed acquires).
func TestTakeoverInWaves(t *testing.T) {
	const cut = takeoverCut
	cfg := takeoverSetting(t, 4000)
	rules := DefaultPair()
	bound := rules.FailoverTimeout + 2*rules.HeartbeatTimeout

	old := cfg
	old.AcquireOneHeartbeat, old.HostBeatsInOrder = true, true
	before, after := runBoth(t, old, cfg)
	beforeWon, _ := takeoverSpan(before, cut)
	won, serving := takeoverSpan(after, cut)
	t.Logf("before the fix: the last register %v after the cut, %d failed acquires; with it: %v (serving %v), %d failed acquires",
		beforeWon, countOf(before, "acquire-failed"), won, serving, countOf(after, "acquire-failed"))
	if beforeWon <= bound || countOf(before, "acquire-failed") < cfg.Pairs {
		t.Errorf("before the fix: the last register %v after the cut, %d failed acquires; want past %v and at least one a pair: the model no longer reproduces the waves",
			beforeWon, countOf(before, "acquire-failed"), bound)
	}
	if after.Failovers != cfg.Pairs || won > bound || serving < 0 {
		t.Errorf("with the fix: %d failovers, the last register %v after the cut, serving %v; want %d within %v", after.Failovers, won, serving, cfg.Pairs, bound)
	}
	if n := countOf(after, "acquire-failed"); n > cfg.Pairs/10 {
		t.Errorf("with the fix: %d failed acquires, want at most %d", n, cfg.Pairs/10)
	}
	for _, v := range after.Violations {
		t.Errorf("with the fix: %+v", v)
	}
}

// takeoverCut is when takeoverSetting cuts the primaries' node.
const takeoverCut = 40 * time.Second

// takeoverSetting is the whole-node takeover the world's 10,000-pair runs
// are reproduced in: node leadership, pairs a node, a store serving a
// write alone in 150µs and a batch in 150µs plus 300µs a write, the
// runtime's bound, batches and raises made once; the replicas' node
// starts 20s late, the primaries' node is cut at takeoverCut.
func takeoverSetting(t *testing.T, pairs int) Config {
	t.Helper()
	faults, err := ParseFaults("crash(site-b)@1ms+20s;powercut(site-a)@40s", "site-a", "site-b")
	if err != nil {
		t.Fatal(err)
	}
	return Config{Scenario: "power-cut", Seed: 1, Duration: 50 * time.Second, Leadership: LeadershipNode, Pairs: pairs,
		StoreWriteTime: 150 * time.Microsecond, StoreBatchWritePart: 300 * time.Microsecond,
		HostWriteBound: HostWriteBoundRuntime, HostBatch: HostBatchRuntime, HostRaiseOnce: true,
		Faults: faults, FaultsSet: true}
}

// runBoth runs the setting before a fix (old) and with it (cfg).
func runBoth(t *testing.T, old, cfg Config) (before, after *Result) {
	t.Helper()
	var err error
	if before, err = Run(old); err != nil {
		t.Fatal(err)
	}
	if after, err = Run(cfg); err != nil {
		t.Fatal(err)
	}
	return before, after
}
