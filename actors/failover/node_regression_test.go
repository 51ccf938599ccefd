package failover

import (
	"fmt"
	"testing"
	"time"
)

// Node mode: the holder's heartbeats are its node's liveness writes, and
// failure_threshold of them in a row fence it (docs/failover.md, "Node
// liveness and epochs"). A register write the holder issues because its
// value changed (here: the pair is paused) is no liveness write. Found by
// the node-mode transcripts: the member counted it as one more heartbeat
// failure when it was not answered in time, so one failed liveness write
// plus one slow register write in the same heartbeat_timeout fenced a
// serving holder — half the tolerance the rule promises, exactly when the
// store is slow. A register write is now no heartbeat, landed or not.
func TestNodeModeRegisterWriteCountsAsLivenessFailure(t *testing.T) {
	d, now := bootstrapLeader(t)
	m, r := d.m, d.m.Rules()
	// The pair is paused: the register's value changes, the holder writes it.
	d.feed(now, m.Step(now, PauseObserved{Rev: 4, Pause: Pause{ID: "op-1", Paused: true}}))
	for end := now + 2*time.Second; now < end; now += 10 * time.Millisecond {
		if _, ok := d.find(WriteBeat); ok {
			break
		}
		d.feed(now, m.Step(now, Tick{}))
	}
	if _, ok := d.find(WriteBeat); !ok {
		t.Fatalf("no register write after the pause; writes %+v", d.writes)
	}
	now -= 10 * time.Millisecond // when the register write was issued
	// The store is slow for one heartbeat_timeout: the node's next liveness
	// write fails, and the register write is not answered by its deadline.
	// Every liveness write after that lands.
	start := now
	d.feed(now+500*time.Millisecond, m.Step(now+500*time.Millisecond, LivenessResult{Err: WriteUnavailable, Epoch: 1, Cause: "timeout: no answer within heartbeat_timeout"}))
	rev := uint64(5)
	for now = start + 510*time.Millisecond; now < start+3*time.Second; now += 10 * time.Millisecond {
		if (now-start)%time.Second == 500*time.Millisecond {
			rev++
			d.feed(now, m.Step(now, LivenessResult{Err: WriteOK, Epoch: 1, Revision: rev}))
		}
		d.feed(now, m.Step(now, Tick{}))
	}
	if d.fences > 0 {
		var failed []string
		for _, ev := range d.events {
			if f, ok := ev.(*HeartbeatFailed); ok {
				failed = append(failed, fmt.Sprintf("%d: %s", f.Failures, f.Cause))
			}
		}
		t.Fatalf("a serving holder fenced after one failed liveness write (failure_threshold %d) and one slow register write; heartbeat failures %q", r.FailureThreshold, failed)
	}
}

// A node's new process starts while another node raises its epoch: the
// watch shows the raise before the answer to the new writer's first
// write, whose compare-and-set the raise beat. Before its first landed
// write the writer carries on the record as the watch shows it, so it
// has taken epoch 2 already. Found by the node-mode transcripts: the
// conflict's read-back (the raise) matched no case of onResult, and was
// reported to the members as a failed write, "a value the node did not
// write", rather than as the raise it is.
func TestNodeLivenessRestartMeetsRaise(t *testing.T) {
	n := NewNodeLiveness("node-a", time.Second)
	n.Start(0)
	own := LivenessEntry{Rev: 15, Value: Liveness{Node: "node-a", Epoch: 1, Beat: 5, By: "node-a"}}
	n.Step(0, LivenessObserved{Node: "node-a", Entry: own})
	r := n.Step(0, Synced{})
	if len(r.Writes) != 1 || r.Writes[0].ExpectRev != 15 {
		t.Fatalf("first write: %+v", r.Writes)
	}
	raise := LivenessEntry{Rev: 24, Value: Liveness{Node: "node-a", Epoch: 2, By: "node-b", Prev: 15}}
	n.Step(10*time.Millisecond, LivenessObserved{Node: "node-a", Entry: raise})
	r = n.Step(20*time.Millisecond, WriteResult{Op: r.Writes[0].Op, Err: WriteConflict, CurrentLive: &raise})
	for _, res := range r.Results {
		if res.Err == WriteUnavailable {
			t.Fatalf("the raise read back after the first write's conflict is reported as a failed write: %+v", res)
		}
	}
	if n.Epoch() != 2 {
		t.Fatalf("epoch %d after the raise; want 2", n.Epoch())
	}
}
