package runtime

import (
	"testing"
	"time"

	"understudy/actors/failover"
)

// The node's liveness log hands a member what came after its last seq,
// in order, and says how much it fell behind when the log no longer
// keeps it.
func TestLiveLogSince(t *testing.T) {
	var l liveLog
	if got, latest, missed := l.since(0, nil); len(got) != 0 || latest != 0 || missed != 0 {
		t.Fatalf("empty log: %d items, latest %d, missed %d", len(got), latest, missed)
	}
	t0 := time.Now()
	for i := range 10 {
		l.add(failover.LivenessResult{Err: failover.WriteOK, Revision: uint64(i + 1)}, t0.Add(time.Duration(i)*time.Millisecond))
	}
	got, latest, missed := l.since(7, nil)
	if latest != 10 || missed != 0 || len(got) != 3 || got[0].seq != 8 || got[2].seq != 10 {
		t.Fatalf("since 7: %+v, latest %d, missed %d", got, latest, missed)
	}
	if r := got[0].in.(failover.LivenessResult); r.Revision != 8 || !got[0].at.Equal(t0.Add(7*time.Millisecond)) {
		t.Errorf("item 8: %+v at %v", r, got[0].at)
	}
	for i := 10; i < liveLogSize+20; i++ {
		l.add(failover.LivenessResult{Err: failover.WriteOK, Revision: uint64(i + 1)}, t0)
	}
	got, latest, missed = l.since(5, got[:0])
	if latest != liveLogSize+20 || missed != latest-5-liveLogSize || len(got) != liveLogSize || got[0].seq != latest-liveLogSize+1 {
		t.Errorf("fallen behind: %d items from %d, latest %d, missed %d", len(got), got[0].seq, latest, missed)
	}
}

// Routine beats, and anything of another node's, wait for the member's
// next step; anything else of its own node's wakes every member.
func TestUrgentLive(t *testing.T) {
	beat := func(epoch, n uint64, by string) failover.LivenessObserved {
		return failover.LivenessObserved{Node: "node-a", Entry: failover.LivenessEntry{Rev: n, Value: failover.Liveness{Node: "node-a", Epoch: epoch, Beat: n, By: by}}}
	}
	prev := beat(3, 7, "node-a").Entry
	for _, c := range []struct {
		name   string
		in     failover.Input
		prev   failover.LivenessEntry
		known  bool
		urgent bool
	}{
		{"a beat in the same epoch", beat(3, 8, "node-a"), prev, true, false},
		{"another node's raise", failover.LivenessObserved{Node: "node-b", Entry: failover.LivenessEntry{Rev: 9, Value: failover.Liveness{Node: "node-b", Epoch: 4, By: "node-c"}}}, prev, true, false},
		{"the node's first record", beat(3, 8, "node-a"), failover.LivenessEntry{}, false, true},
		{"a new epoch", beat(4, 8, "node-a"), prev, true, true},
		{"a raise by another node", beat(4, 8, "node-b"), prev, true, true},
		{"a value not genuine", func() failover.LivenessObserved { b := beat(3, 8, "node-a"); b.Entry.Forged = true; return b }(), prev, true, true},
		{"a write that landed", failover.LivenessResult{Err: failover.WriteOK, Epoch: 3}, failover.LivenessEntry{}, true, false},
		{"a write that failed", failover.LivenessResult{Err: failover.WriteUnavailable, Epoch: 3}, failover.LivenessEntry{}, true, true},
		{"a write that met a raise", failover.LivenessResult{Err: failover.WriteConflict, Epoch: 4}, failover.LivenessEntry{}, true, true},
	} {
		if got := urgentLive("node-a", c.in, c.prev, c.known); got != c.urgent {
			t.Errorf("%s: urgent %v, want %v", c.name, got, c.urgent)
		}
	}
}
