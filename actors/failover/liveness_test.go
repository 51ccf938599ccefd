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
