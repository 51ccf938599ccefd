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

// N9 (docs/simulation.md): a suspended holder's unfencing announcement was
// acknowledged while its node's writes were failing again, so it did not
// unfence then and went back to writing fenced values; those landed with
// their answers lost. On its node's next liveness successes it unfenced,
// judging by the announcement acknowledged before them, while the register
// said fenced — and the follower had taken it over, by the "holder stays
// fenced for failover_timeout" rule: split brain. Found by the simulator
// with 200 pairs a node, a store of 1,000 writes a second and 20% loss on
// the primary's link. A fenced write issued after the announcement ends
// what its acknowledgement proved: the holder unfences only on a newer
// unfenced value acknowledged.
func TestNodeModeFencedWriteAfterAnnouncementKeepsHolderFenced(t *testing.T) {
	d, now := bootstrapLeader(t)
	m, r := d.m, d.m.Rules()
	hb := r.HeartbeatTimeout
	rev := uint64(10)
	step := func(in Input) { d.feed(now, m.Step(now, in)) }
	until := func(to time.Duration) {
		for now < to {
			now += 10 * time.Millisecond
			step(Tick{})
		}
	}
	live := func(ok bool) {
		if ok {
			rev++
			step(LivenessResult{Err: WriteOK, Epoch: 1, Revision: rev})
			return
		}
		step(LivenessResult{Err: WriteUnavailable, Epoch: 1, Cause: "timeout: no answer within heartbeat_timeout"})
	}
	// registerWrite ticks until the holder issues a register write saying
	// fenced as asked, after the first `after` writes; no answer is given
	// to the writes it passes.
	registerWrite := func(after int, fenced bool) (Write, int) {
		t.Helper()
		for end := now + 3*hb; now < end; {
			for i := after; i < len(d.writes); i++ {
				if w := d.writes[i]; w.Kind == WriteBeat && w.Leader.Fenced == fenced {
					return w, i
				}
			}
			now += 10 * time.Millisecond
			step(Tick{})
		}
		t.Fatalf("no register write with fenced=%v in 3 heartbeats; writes %+v", fenced, d.writes[after:])
		return Write{}, 0
	}
	unfenced := func() bool {
		for _, ev := range d.events {
			if _, ok := ev.(*Unfenced); ok {
				return true
			}
		}
		return false
	}

	// Its node's writes fail: the holder fences and suspends.
	for range r.FailureThreshold {
		until(now + hb)
		live(false)
	}
	if m.Phase() != PhaseSuspended {
		t.Fatalf("phase %v after %d failed liveness writes; want suspended", m.Phase(), r.FailureThreshold)
	}
	// They land again: the holder announces its unfencing. Before the
	// announcement's answer, one more fails: the announcement is
	// acknowledged, but the holder has no success_threshold successes.
	for range r.SuccessThreshold {
		until(now + hb)
		live(true)
	}
	announce, i := registerWrite(0, false)
	now += 100 * time.Millisecond
	live(false)
	step(WriteResult{Op: announce.Op, Err: WriteOK, Revision: 100})
	if unfenced() {
		t.Fatalf("unfenced on an announcement acknowledged after a failed liveness write")
	}
	// So it writes fenced again; that value lands (rev 101), its answer
	// is lost: the register says fenced, the follower's clock runs.
	fenced, j := registerWrite(i+1, true)
	step(LeaderObserved{Entry: LeaderEntry{Rev: 101, Time: time.Unix(1_700_000_000, 0).Add(now), Value: fenced.Leader}})
	// Its node's writes land again, more than success_threshold of them;
	// no register write is answered.
	for range r.SuccessThreshold + 2 {
		until(now + hb)
		live(true)
		if unfenced() {
			t.Fatalf("unfenced on its node's liveness successes while its latest landed register value (a fenced one issued after the acknowledged announcement) says fenced")
		}
	}
	// It has announced its unfencing again; it unfences once that
	// announcement (the write in flight) is acknowledged.
	registerWrite(j+1, false)
	again := d.writes[len(d.writes)-1]
	if again.Kind != WriteBeat || again.Leader.Fenced {
		t.Fatalf("the write in flight is %+v; want an unfencing announcement", again)
	}
	step(WriteResult{Op: again.Op, Err: WriteOK, Revision: 102})
	if !unfenced() {
		t.Fatalf("no unfencing after the new announcement was acknowledged; phase %v", m.Phase())
	}
}

// N10 (docs/simulation.md): a suspended holder's unfencing announcement
// landed, but its answer came after its deadline (a lossy, loaded link);
// the watch showed it. The follower, seeing the unfenced value stand while
// the node beat, took the holder for recovered; the holder, waiting for an
// answer in time, stayed suspended: nobody served. A holder now takes its
// announcement's landing from the watch, or from a late answer, as it
// takes an answer in time: its node's next beat unfences it.
func TestNodeModeAnnouncementSeenOnWatchUnfences(t *testing.T) {
	d, now := bootstrapLeader(t)
	m, r := d.m, d.m.Rules()
	hb := r.HeartbeatTimeout
	step := func(in Input) { d.feed(now, m.Step(now, in)) }
	until := func(to time.Duration) {
		for now < to {
			now += 10 * time.Millisecond
			step(Tick{})
		}
	}
	rev := uint64(10)
	for range r.FailureThreshold {
		until(now + hb)
		step(LivenessResult{Err: WriteUnavailable, Epoch: 1, Cause: "timeout: no answer within heartbeat_timeout"})
	}
	if m.Phase() != PhaseSuspended {
		t.Fatalf("phase %v after %d failed liveness writes; want suspended", m.Phase(), r.FailureThreshold)
	}
	for range r.SuccessThreshold {
		until(now + hb)
		rev++
		step(LivenessResult{Err: WriteOK, Epoch: 1, Revision: rev})
	}
	var announce Write
	for end := now + 3*hb; now < end && announce.Op == 0; {
		for _, w := range d.writes {
			if w.Kind == WriteBeat && !w.Leader.Fenced {
				announce = w
			}
		}
		now += 10 * time.Millisecond
		step(Tick{})
	}
	if announce.Op == 0 {
		t.Fatalf("no unfencing announcement; writes %+v", d.writes)
	}
	// It lands; its answer never comes in time. The watch shows it.
	step(LeaderObserved{Entry: LeaderEntry{Rev: 100, Time: time.Unix(1_700_000_000, 0).Add(now), Value: announce.Leader}})
	rev++
	now += hb / 2
	step(LivenessResult{Err: WriteOK, Epoch: 1, Revision: rev})
	for _, ev := range d.events {
		if _, ok := ev.(*Unfenced); ok {
			return
		}
	}
	t.Fatalf("a suspended holder whose announcement the watch showed landed did not unfence on its node's next beat; phase %v", m.Phase())
}

// Node mode: an acquire waits two heartbeat_timeouts for its answer
// (acquireWindow). A node taking over thousands of pairs sends all their
// acquires at once, and its host issues each only within its window: with
// one heartbeat_timeout most were never issued and tried again a second
// later, in waves (found in a 10,000-pair node death on real NATS;
// simulations' TestTakeoverInWaves). An answer 1.5 s late promotes; only
// silence for the whole window counts as a failure. Per-pair leadership
// keeps one heartbeat_timeout.
func TestNodeModeAcquireWaitsTwoHeartbeats(t *testing.T) {
	for _, tc := range []struct {
		node   string
		window time.Duration
	}{{"node-a", 2 * time.Second}, {"", time.Second}} {
		m, err := NewMember("a", DefaultRules("p0", "a", "b"), Options{Node: tc.node})
		if err != nil {
			t.Fatal(err)
		}
		d := &nodeDriver{m: m}
		d.feed(0, m.Start(0))
		d.feed(0, m.Step(0, Synced{}))
		if tc.node != "" {
			d.feed(0, m.Step(0, LivenessResult{Err: WriteOK, Epoch: 1, Revision: 1}))
		}
		issued := time.Duration(-1)
		for now := time.Duration(0); now < 5*time.Second && issued < 0; now += 10 * time.Millisecond {
			d.feed(now, m.Step(now, Tick{}))
			if _, ok := d.find(WriteAcquire); ok {
				issued = now
			}
		}
		acq, ok := d.find(WriteAcquire)
		if !ok {
			t.Fatalf("node %q: no acquire", tc.node)
		}
		if got := acq.Deadline - issued; got != tc.window {
			t.Errorf("node %q: the acquire waits %v, want %v", tc.node, got, tc.window)
		}
		// Silent until just before the deadline: no failure yet, no retry.
		for now := issued; now < acq.Deadline; now += 10 * time.Millisecond {
			d.feed(now, m.Step(now, Tick{}))
		}
		for _, ev := range d.events {
			if f, ok := ev.(*AcquireFailed); ok {
				t.Fatalf("node %q: the acquire failed within its window: %+v", tc.node, f)
			}
		}
		if tc.node == "" {
			continue
		}
		// Answered 1.5 s after it was issued, within two heartbeat_timeouts.
		d.feed(issued+1500*time.Millisecond, m.Step(issued+1500*time.Millisecond, WriteResult{Op: acq.Op, Err: WriteOK, Revision: 2}))
		d.feed(issued+1500*time.Millisecond, m.Step(issued+1500*time.Millisecond, LivenessResult{Err: WriteOK, Epoch: 1, Revision: 3}))
		if !m.Serving() {
			t.Errorf("node mode: phase %v after an answer 1.5 s late; want leader", m.Phase())
		}
	}
}

// A member's KV write is issued until half its window before its
// deadline, and at most half a heartbeat_timeout before it: a node's
// acquire, waiting two heartbeat_timeouts, is still issued 1.5 s after it
// was asked for (in a 10,000-pair takeover those still waiting after the
// first second were dropped while the store had turns for them).
func TestIssueMargin(t *testing.T) {
	for _, tc := range []struct{ window, heartbeat, want time.Duration }{
		{time.Second, time.Second, 500 * time.Millisecond},
		{2 * time.Second, time.Second, 500 * time.Millisecond},
		{400 * time.Millisecond, time.Second, 200 * time.Millisecond},
		{4 * time.Second, 3 * time.Second, 1500 * time.Millisecond},
	} {
		if got := IssueMargin(tc.window, tc.heartbeat); got != tc.want {
			t.Errorf("IssueMargin(%v, %v) = %v, want %v", tc.window, tc.heartbeat, got, tc.want)
		}
	}
}
