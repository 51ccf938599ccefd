package failover

import (
	"testing"
	"time"
)

func TestLivenessKeys(t *testing.T) {
	if k := LivenessKey("node-a"); k != "_live.node-a" || LivenessNode(k) != "node-a" {
		t.Fatalf("LivenessKey/LivenessNode: %q -> %q", k, LivenessNode(k))
	}
	for _, k := range []string{"pg.leader", "_live.", "_live.a.b", "_livex.a"} {
		if LivenessNode(k) != "" {
			t.Errorf("LivenessNode(%q) = %q; want none", k, LivenessNode(k))
		}
	}
	if err := DefaultRules(LivenessPrefix, "a", "b").Validate(); err == nil {
		t.Fatal("a pair named _live was accepted")
	}
	if err := DefaultRules(DeploymentPrefix, "a", "b").Validate(); err == nil {
		t.Fatal("a pair named _deployment was accepted")
	}
	if LivenessNode(DeploymentLeadershipKey) != "" {
		t.Fatalf("the deployment's leadership key %s reads as a node's liveness record", DeploymentLeadershipKey)
	}
}

// The writer beats by CAS on its own last write, adopts a raised epoch
// (telling its members with a conflict), and never writes an epoch below
// one its own earlier process wrote.
func TestNodeLivenessWriter(t *testing.T) {
	hb := time.Second
	n := NewNodeLiveness("node-a", hb)
	if r := n.Start(0); len(r.Writes) != 0 {
		t.Fatalf("wrote before the watch synced: %+v", r.Writes)
	}
	r := n.Step(0, Synced{})
	if len(r.Writes) != 1 || r.Writes[0].ExpectRev != 0 || r.Writes[0].Live.Epoch != 1 {
		t.Fatalf("first write: %+v", r.Writes)
	}
	// The key existed after all (its previous process, epoch 3): the
	// create fails; the writer adopts epoch 3 and writes again at once.
	cur := &LivenessEntry{Rev: 7, Value: Liveness{Node: "node-a", Epoch: 3, Beat: 40, By: "node-a"}}
	r = n.Step(10*time.Millisecond, WriteResult{Op: r.Writes[0].Op, Err: WriteConflict, CurrentLive: cur})
	if len(r.Writes) != 1 || r.Writes[0].ExpectRev != 7 || r.Writes[0].Live.Epoch != 3 || r.Writes[0].Live.Beat != 41 {
		t.Fatalf("write after finding its own record: %+v", r.Writes)
	}
	if len(r.Results) != 0 {
		t.Fatalf("its own record is no failure: %+v", r.Results)
	}
	r = n.Step(20*time.Millisecond, WriteResult{Op: r.Writes[0].Op, Err: WriteOK, Revision: 8})
	if len(r.Results) != 1 || r.Results[0].Err != WriteOK || r.Results[0].Epoch != 3 {
		t.Fatalf("result: %+v", r.Results)
	}
	// Another node raised the epoch: the next write conflicts; members
	// hear the new epoch with a conflict, and the writer beats on in it.
	r = n.Step(1100*time.Millisecond, Tick{})
	if len(r.Writes) != 1 || r.Writes[0].ExpectRev != 8 {
		t.Fatalf("second beat: %+v", r.Writes)
	}
	raised := &LivenessEntry{Rev: 9, Value: Liveness{Node: "node-a", Epoch: 4, By: "node-b"}}
	r = n.Step(1110*time.Millisecond, WriteResult{Op: r.Writes[0].Op, Err: WriteConflict, CurrentLive: raised})
	if len(r.Results) != 1 || r.Results[0].Err != WriteConflict || r.Results[0].Epoch != 4 {
		t.Fatalf("members must hear of the raise: %+v", r.Results)
	}
	if len(r.Writes) != 1 || r.Writes[0].ExpectRev != 9 || r.Writes[0].Live.Epoch != 4 {
		t.Fatalf("beat in the new epoch: %+v", r.Writes)
	}
	// A write not answered within the interval is a failure, and the
	// latency report says the store is too slow.
	r = n.Step(3*time.Second, Tick{})
	if len(r.Results) != 1 || r.Results[0].Err != WriteUnavailable {
		t.Fatalf("timeout: %+v", r.Results)
	}
	if !n.Degraded() {
		t.Fatal("a write that timed out must make the node degraded")
	}
}

// The host hands the writer the latest genuine value before a forged
// latest one: it carries on the genuine epoch and expects the forged
// value's revision.
func TestNodeLivenessForgedLatestRecord(t *testing.T) {
	n := NewNodeLiveness("node-a", time.Second)
	n.Start(0)
	n.Step(0, LivenessObserved{Node: "node-a", Entry: LivenessEntry{Rev: 10, Value: Liveness{Node: "node-a", Epoch: 5, Beat: 9, By: "node-a"}}})
	n.Step(0, LivenessObserved{Node: "node-a", Entry: LivenessEntry{Rev: 11, Value: Liveness{Node: "node-a", Epoch: 1, By: "node-a"}, Forged: true}})
	r := n.Step(0, Synced{})
	if len(r.Writes) != 1 || r.Writes[0].Live.Epoch != 5 || r.Writes[0].ExpectRev != 11 {
		t.Fatalf("first write after a forged latest value: %+v; want epoch 5 expecting revision 11", r.Writes)
	}
}

// A probe makes the writer write as soon as no write is in flight, one
// write for the probes before it, at most once a quarter interval, and
// leaves its cadence as it was.
func TestNodeLivenessProbe(t *testing.T) {
	hb := time.Second
	n := NewNodeLiveness("node-a", hb)
	n.Start(0)
	r := n.Step(0, Synced{})
	w := r.Writes[0]
	if r := n.Step(10*time.Millisecond, LivenessProbe{}); len(r.Writes) != 0 {
		t.Fatalf("a probe while a write is in flight wrote: %+v", r.Writes)
	}
	n.Step(20*time.Millisecond, WriteResult{Op: w.Op, Err: WriteOK, Revision: 5})
	if r := n.Step(30*time.Millisecond, Tick{}); len(r.Writes) != 0 {
		t.Fatalf("a probe within a quarter interval of the last write wrote at once: %+v", r.Writes)
	}
	if got := n.NextWake(); got != hb/4 {
		t.Errorf("next wake %v with a probe waiting; want %v (a quarter interval after the last write)", got, hb/4)
	}
	r = n.Step(hb/4, Tick{})
	if len(r.Writes) != 1 || n.Probes() != 1 {
		t.Fatalf("probed write at %v: %+v (probes %d)", hb/4, r.Writes, n.Probes())
	}
	p := r.Writes[0]
	if p.ExpectRev != 5 || p.Live.Beat != w.Live.Beat+1 {
		t.Errorf("probed write %+v: want a beat on revision 5", p.Live)
	}
	n.Step(hb/4+10*time.Millisecond, WriteResult{Op: p.Op, Err: WriteOK, Revision: 9})
	for range 5 { // many members asking at once: one write
		now := hb / 2
		for _, x := range n.Step(now, LivenessProbe{}).Writes {
			n.Step(now, WriteResult{Op: x.Op, Err: WriteOK, Revision: 10})
		}
	}
	if n.Probes() != 2 {
		t.Errorf("probes %d after five more asks past a quarter interval; want one write for them", n.Probes())
	}
	// The regular write comes at its time, a second after the first.
	var regular []Write
	for now := hb/2 + 10*time.Millisecond; now <= hb; now += 10 * time.Millisecond {
		r := n.Step(now, Tick{})
		for _, x := range r.Writes {
			n.Step(now, WriteResult{Op: x.Op, Err: WriteOK, Revision: 20})
			if now >= hb {
				regular = append(regular, x)
			}
		}
	}
	if len(regular) != 1 || n.Probes() != 2 {
		t.Errorf("at %v: %d regular writes, %d probes; want the cadence unchanged", hb, len(regular), n.Probes())
	}
}

// A probe's write that fails is not a heartbeat missed: no failure
// result for the members; the regular write's failure is.
func TestNodeLivenessFailedProbeIsNoMissedBeat(t *testing.T) {
	hb := time.Second
	n := NewNodeLiveness("node-a", hb)
	n.Start(0)
	w := n.Step(0, Synced{}).Writes[0]
	n.Step(10*time.Millisecond, WriteResult{Op: w.Op, Err: WriteOK, Revision: 5})
	p := n.Step(hb/2, LivenessProbe{}).Writes
	if len(p) != 1 {
		t.Fatalf("probe: %+v", p)
	}
	if r := n.Step(hb/2+10*time.Millisecond, WriteResult{Op: p[0].Op, Err: WriteUnavailable, Cause: "no responders"}); len(r.Results) != 0 {
		t.Errorf("a failed probe's write told the members %+v; want nothing", r.Results)
	}
	r := n.Step(hb, Tick{})
	if len(r.Writes) != 1 {
		t.Fatalf("regular write at %v: %+v", hb, r.Writes)
	}
	r = n.Step(hb+10*time.Millisecond, WriteResult{Op: r.Writes[0].Op, Err: WriteUnavailable, Cause: "no responders"})
	if len(r.Results) != 1 || r.Results[0].Err != WriteUnavailable {
		t.Errorf("a failed regular write told the members %+v; want one failure", r.Results)
	}
}

// Routine beats, and anything of another node's, wait for the member's
// next step; anything else of its own node's wakes every member.
func TestLivenessUrgent(t *testing.T) {
	beat := func(epoch, n uint64, by string) LivenessObserved {
		return LivenessObserved{Node: "node-a", Entry: LivenessEntry{Rev: n, Value: Liveness{Node: "node-a", Epoch: epoch, Beat: n, By: by}}}
	}
	forged := beat(3, 8, "node-a")
	forged.Entry.Forged = true
	prev := beat(3, 7, "node-a").Entry
	for _, c := range []struct {
		name      string
		in        Input
		prev      LivenessEntry
		known     bool
		prevEpoch uint64
		urgent    bool
	}{
		{"a beat in the same epoch", beat(3, 8, "node-a"), prev, true, 0, false},
		{"another node's raise", LivenessObserved{Node: "node-b", Entry: LivenessEntry{Rev: 9, Value: Liveness{Node: "node-b", Epoch: 4, By: "node-c"}}}, prev, true, 0, false},
		{"the node's first record", beat(3, 8, "node-a"), LivenessEntry{}, false, 0, true},
		{"a new epoch", beat(4, 8, "node-a"), prev, true, 0, true},
		{"a raise by another node", beat(4, 8, "node-b"), prev, true, 0, true},
		{"a value not genuine", forged, prev, true, 0, true},
		{"a write that landed", LivenessResult{Err: WriteOK, Epoch: 3}, LivenessEntry{}, false, 3, false},
		{"the first write that landed", LivenessResult{Err: WriteOK, Epoch: 3}, LivenessEntry{}, false, 0, true},
		{"a write that landed in a new epoch", LivenessResult{Err: WriteOK, Epoch: 4}, LivenessEntry{}, false, 3, true},
		{"a write that failed", LivenessResult{Err: WriteUnavailable, Epoch: 3}, LivenessEntry{}, false, 3, true},
		{"a write that met a raise", LivenessResult{Err: WriteConflict, Epoch: 4}, LivenessEntry{}, false, 3, true},
	} {
		if got := LivenessUrgent("node-a", c.in, c.prev, c.known, c.prevEpoch); got != c.urgent {
			t.Errorf("%s: urgent %v, want %v", c.name, got, c.urgent)
		}
	}
}
