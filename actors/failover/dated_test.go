package failover

import (
	"testing"
	"time"
)

// Liveness inputs the host hands over later than it saw them carry when
// it saw them (LivenessObserved.At, LivenessResult.At): the runtime hands
// routine beats to a member at its next step, not at once.

// A holder's lease runs from when its node had the liveness answer, not
// from when the member took it in: a result handed over 1.5 s late does
// not keep the holder serving past (failure_threshold+1) × heartbeat of
// the answer.
func TestDatedLivenessResultDoesNotLengthenTheLease(t *testing.T) {
	for _, dated := range []bool{true, false} {
		d, now := bootstrapLeader(t)
		r := d.m.Rules()
		answered := now + 100*time.Millisecond
		res := LivenessResult{Err: WriteOK, Epoch: 1, Revision: 4}
		if dated {
			res.At = answered
		}
		handed := answered + 1500*time.Millisecond
		for ; now < handed; now += 10 * time.Millisecond {
			d.feed(now, d.m.Step(now, Tick{}))
		}
		d.feed(handed, d.m.Step(handed, res))
		fenced := time.Duration(0)
		for now = handed; now < handed+10*time.Second && fenced == 0; now += 10 * time.Millisecond {
			d.feed(now, d.m.Step(now, Tick{}))
			if d.fences > 0 {
				fenced = now - answered
			}
		}
		bound := time.Duration(r.FailureThreshold+1) * r.HeartbeatTimeout
		switch {
		case fenced == 0:
			t.Fatalf("dated %v: never fenced", dated)
		case dated && fenced > bound+20*time.Millisecond:
			t.Errorf("fenced %v after its node had the last answer (handed over 1.5 s late); want within %v", fenced, bound)
		case !dated && fenced <= bound:
			// The control: undated, the late hand-over is when it counts.
			t.Errorf("undated: fenced %v after the answer; want later than %v (counted from the hand-over)", fenced, bound)
		}
		t.Logf("dated %v: fenced %v after the answer (bound %v)", dated, fenced, bound)
	}
}

// A follower judges the holder's node stale failover_timeout after its
// node saw the holder's last beat, not after the member took it in: the
// raise comes no later for a beat handed over 0.9 s late, and never
// before failover_timeout from when the node saw it.
func TestDatedBeatTimesTheTakeover(t *testing.T) {
	for _, dated := range []bool{true, false} {
		m, err := NewMember("b", DefaultRules("p0", "a", "b"), Options{Node: "node-b"})
		if err != nil {
			t.Fatal(err)
		}
		d := &nodeDriver{m: m}
		rules := m.Rules()
		server := time.Unix(1_700_000_000, 0)
		rev := uint64(10)
		beat := map[string]uint64{}
		liveOf := func(node string, at time.Duration) LivenessObserved {
			rev++
			beat[node]++
			return LivenessObserved{Node: node, Entry: LivenessEntry{Rev: rev, Time: server.Add(at),
				Value: Liveness{Node: node, Epoch: 1, Beat: beat[node], By: node}}}
		}
		d.feed(0, m.Start(0))
		d.feed(0, m.Step(0, LivenessObserved{Node: "node-a", Entry: LivenessEntry{Rev: 1, Time: server,
			Value: Liveness{Node: "node-a", Epoch: 1, Beat: 1, By: "node-a"}}}))
		beat["node-a"] = 1
		d.feed(0, m.Step(0, LeaderObserved{Entry: LeaderEntry{Rev: 2, Time: server,
			Value: Leader{Site: "a", Term: 1, Node: "node-a", Epoch: 1, By: "a"}}}))
		d.feed(0, m.Step(0, Synced{}))
		now := time.Duration(0)
		step := 10 * time.Millisecond
		var lastSeen time.Duration
		nextB := time.Duration(0)
		for ; now < 3*time.Second; now += step {
			if now >= nextB {
				d.feed(now, m.Step(now, liveOf("node-b", now)))
				d.feed(now, m.Step(now, LivenessResult{Err: WriteOK, Epoch: 1, Revision: rev}))
				d.feed(now, m.Step(now, liveOf("node-a", now)))
				lastSeen, nextB = now, now+rules.HeartbeatTimeout
			}
			d.feed(now, m.Step(now, Tick{}))
		}
		// node-a's next beat, seen by the node at seen, handed over late.
		seen := nextB
		last := liveOf("node-a", seen)
		if dated {
			last.At = seen
		}
		handed := seen + 900*time.Millisecond
		var raisedAt time.Duration
		for now = lastSeen + step; now < seen+20*time.Second && raisedAt == 0; now += step {
			if now >= nextB {
				d.feed(now, m.Step(now, liveOf("node-b", now)))
				d.feed(now, m.Step(now, LivenessResult{Err: WriteOK, Epoch: 1, Revision: rev}))
				nextB = now + 100*time.Millisecond // its own beats often: the server's clock is not what sets the time here
			}
			if now == handed {
				d.feed(now, m.Step(now, last))
			}
			d.feed(now, m.Step(now, Tick{}))
			if _, ok := d.find(WriteBump); ok {
				raisedAt = now
			}
		}
		if raisedAt == 0 {
			t.Fatalf("dated %v: node-a's epoch never raised", dated)
		}
		// Stale by its own clock before its node's beats showed it by the
		// server's, it asked its node once for a liveness write (which this
		// test does not make: its node beats every 100 ms anyway). Undated,
		// it was stale by both at once and raised without asking.
		if want := map[bool]int{true: 1, false: 0}[dated]; d.probes != want {
			t.Errorf("dated %v: %d liveness probes asked, want %d", dated, d.probes, want)
		}
		fo := rules.FailoverTimeout
		after := raisedAt - seen
		switch {
		case after <= fo:
			t.Errorf("dated %v: raised %v after the node saw node-a's last beat; never within failover_timeout %v", dated, after, fo)
		case dated && after > fo+rules.HeartbeatTimeout:
			t.Errorf("raised %v after the node saw node-a's last beat (handed over 0.9 s late); want within %v", after, fo+rules.HeartbeatTimeout)
		case !dated && after < fo+900*time.Millisecond:
			t.Errorf("undated: raised %v after the node saw the beat; want from the hand-over (%v on)", after, fo+900*time.Millisecond)
		}
		t.Logf("dated %v: raised %v after the node saw node-a's last beat", dated, after)
	}
}

// Inputs handed over together are judged together: a holder that takes in
// an older record and then the liveness result that answers the silence
// check does not count the silence in between (found by the runtime's
// TestSlowStoreIsDegradedNotFailed, when the runtime stepped its log's
// items one Step each). One Step each, as the control, counts it.
func TestStepAllJudgesTheInputsTogether(t *testing.T) {
	for _, together := range []bool{true, false} {
		d, now := bootstrapLeader(t)
		hb := d.m.Rules().HeartbeatTimeout
		seen := now + 2*hb - 100*time.Millisecond // the answer, in time
		late := now + 2*hb + 200*time.Millisecond // handed over past the silence bound
		record := LivenessObserved{Node: "node-b", At: seen - 50*time.Millisecond,
			Entry: LivenessEntry{Rev: 7, Value: Liveness{Node: "node-b", Epoch: 1, Beat: 3, By: "node-b"}}}
		res := LivenessResult{Err: WriteOK, Epoch: 1, Revision: 8, At: seen}
		if together {
			d.feed(late, d.m.StepAll(late, record, res))
		} else {
			d.feed(late, d.m.Step(late, record))
			d.feed(late, d.m.Step(late, res))
		}
		failed := 0
		for _, ev := range d.events {
			if _, ok := ev.(*HeartbeatFailed); ok {
				failed++
			}
		}
		switch {
		case together && failed != 0:
			t.Errorf("together: %d failed heartbeats counted; the result that answers the silence came with the record", failed)
		case !together && failed == 0:
			t.Errorf("one Step each: no failed heartbeat; the control no longer shows the silence judged between them")
		}
	}
}
