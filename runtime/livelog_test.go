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
