package simulations

import (
	"testing"
	"time"
)

// A node's members that find a dead node's holders stale by their own
// clock ask their node for a liveness write at once (failover.Ready's
// ProbeLiveness): the write's server time shows the holders stale by the
// store's clock too, so the epoch is raised failover_timeout after the
// last beat seen, not at the survivor's next regular liveness write, up to
// heartbeat_timeout later (where that write falls depends on the two
// nodes' phases: the survivor starts 20 s plus a part of a heartbeat
// after the other). Found in the world: run 42
// raised the dead node's epoch 6.1 s after its last beat (runs 31 and 34:
// 6.0 and 5.78 s), failover_timeout 5 s (docs/benchmarks.md).
func TestLivenessProbeRaisesSooner(t *testing.T) {
	const pairs = 200
	var sumOld, sumNew, worstNew time.Duration
	phases := []time.Duration{0, 250 * time.Millisecond, 500 * time.Millisecond, 750 * time.Millisecond}
	for _, phase := range phases {
		cfg := takeoverSetting(t, pairs)
		faults, err := ParseFaults("crash(site-b)@1ms+"+(20*time.Second+phase).String()+";powercut(site-a)@40s", "site-a", "site-b")
		if err != nil {
			t.Fatal(err)
		}
		cfg.Faults = faults
		old := cfg
		old.NoLivenessProbe = true
		before, after := runBoth(t, old, cfg)
		wonOld, _ := takeoverSpan(before, takeoverCut)
		wonNew, servingNew := takeoverSpan(after, takeoverCut)
		t.Logf("phase %v: the last register %v after the cut without probes, %v with them (serving %v)", phase, wonOld, wonNew, servingNew)
		if after.Failovers != pairs || before.Failovers != pairs {
			t.Errorf("phase %v: %d and %d failovers, want %d", phase, before.Failovers, after.Failovers, pairs)
		}
		for _, v := range append(before.Violations, after.Violations...) {
			t.Errorf("phase %v: %+v", phase, v)
		}
		if wonNew > wonOld+50*time.Millisecond { // the probe is one store write more
			t.Errorf("phase %v: with probes the last register came later (%v against %v)", phase, wonNew, wonOld)
		}
		sumOld += wonOld
		sumNew += wonNew
		worstNew = max(worstNew, wonNew)
	}
	n := time.Duration(len(phases))
	t.Logf("mean last register: %v without probes, %v with them; worst with them %v", sumOld/n, sumNew/n, worstNew)
	if sumOld-sumNew < n*200*time.Millisecond {
		t.Errorf("probes gained %v on average, want 200ms or more (the phases' mean lateness is 375ms)", (sumOld-sumNew)/n)
	}
	if worstNew > 4400*time.Millisecond {
		t.Errorf("with probes the worst last register %v after the cut; want the phase not to matter (4.24 s at phase 0)", worstNew)
	}
}
