package projections

import (
	"strings"
	"testing"
	"time"

	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/events"
)

// live writes node's liveness record (its own beat in epoch).
func (h *history) live(node string, epoch, beat uint64) {
	h.kv(failover.LivenessKey(node), failover.EncodeLiveness(failover.Liveness{Node: node, Epoch: epoch, Beat: beat}), true)
}

// nodeBootstrap: node leadership. site-a (node-a, epoch 1) takes term 1
// and serves at 100ms; node-a beats every second up to lastA, node-b up
// to upTo. The register is written only at the acquire.
func (h *history) nodeBootstrap(lastA, upTo time.Duration) {
	h.at(0).config()
	h.start("site-a")
	h.start("site-b")
	h.at(10*time.Millisecond).live("node-a", 1, 1)
	h.live("node-b", 1, 1)
	h.at(50 * time.Millisecond)
	h.event("site-a", &failover.AcquireAttempted{Reason: failover.AcquireBootstrap, Term: 1})
	rev := h.leader(failover.Leader{Site: "site-a", Term: 1, Node: "node-a", Epoch: 1})
	h.event("site-a", &failover.Promoted{Seq: 2, Term: 1, Rev: rev, Reason: failover.AcquireBootstrap})
	h.chain("site-a", procedure.ChainPromote, 2, false)
	h.at(100*time.Millisecond).event("site-a", &failover.ServingStarted{Seq: 2, Term: 1})
	for s := time.Second; s <= max(lastA, upTo); s += time.Second {
		if s <= lastA {
			h.at(s).live("node-a", 1, uint64(s/time.Second)+1)
		}
		if s <= upTo {
			h.at(s+3*time.Millisecond).live("node-b", 1, uint64(s/time.Second)+1)
		}
	}
}

// nodeTakeover: site-b raises node-a's epoch and takes the register at
// attempt, serving 10ms later.
func (h *history) nodeTakeover(attempt time.Duration, expect uint64) {
	h.at(attempt-5*time.Millisecond).kv(failover.LivenessKey("node-a"), failover.EncodeLiveness(failover.Liveness{Node: "node-a", Epoch: 2, By: "node-b"}), true)
	h.at(attempt).event("site-b", &failover.AcquireAttempted{Reason: failover.AcquireStale, Term: 2, ExpectRev: expect, Stale: 5 * time.Second})
	rev := h.at(attempt + 2*time.Millisecond).leader(failover.Leader{Site: "site-b", Term: 2, Node: "node-b", Epoch: 1})
	h.at(attempt+3*time.Millisecond).event("site-b", &failover.Promoted{Seq: 2, Term: 2, Rev: rev, Reason: failover.AcquireStale})
	h.chain("site-b", procedure.ChainPromote, 2, false)
	h.at(attempt+10*time.Millisecond).event("site-b", &failover.ServingStarted{Seq: 2, Term: 2})
}

// lateFence: site-a's stop events land at 40s, all of them (their wait in
// its queue not known): a fence for heartbeat failures whose first
// attempt failed, its retry's chain, fenced.
func (h *history) lateFence() {
	h.at(40 * time.Second)
	h.event("site-a", &failover.FenceRequested{Seq: 3, Reason: failover.FenceHeartbeatFailures, Term: 1, Then: failover.AfterSuspend})
	h.event("site-a", &failover.FenceFailed{Seq: 3, Detail: "not started"})
	h.event("site-a", &failover.FenceRequested{Seq: 4, Reason: failover.FenceHeartbeatFailures, Term: 1, Then: failover.AfterSuspend})
	h.chain("site-a", procedure.ChainFence, 4, false)
	h.event("site-a", &failover.Fenced{Seq: 4})
}

// In node leadership a holder writes its register once, at its acquire:
// its lease goes on with its node's beats. Its node dies at 40s (no event
// of its stop in the record): it may have served until its node's last
// beat + the rules' bound, not its register write's.
func TestNodeLeaseFromLiveness(t *testing.T) {
	h := newHistory(t, "pg-main")
	h.nodeBootstrap(40*time.Second, 60*time.Second)
	h.nodeTakeover(45200*time.Millisecond, 3)
	r := foldAll(t, "pg-main", h.recs)
	if r.Records.Liveness == 0 || r.Records.Foreign != 0 {
		t.Fatalf("records %+v", r.Records.RecordCounts)
	}
	a := r.Leadership[0]
	if a.Site != "site-a" || a.LastLiveness == nil {
		t.Fatalf("site-a's tenure %+v", a)
	}
	timeEq(t, "site-a last liveness", a.LastLiveness, at(40*time.Second))
	timeEq(t, "site-a to (its last evidence)", a.To, at(40*time.Second))
	timeEq(t, "site-a up_until", a.UpUntil, at(45*time.Second))
	if !strings.Contains(a.UpBasis, "liveness") {
		t.Errorf("up basis %q", a.UpBasis)
	}
	if len(r.SplitBrain) != 0 {
		t.Errorf("split brain: %+v", r.SplitBrain)
	}

	// The same takeover 1s earlier is within the holder's lease: a split
	// brain, which reading the register alone (its one write at 50ms)
	// missed.
	h = newHistory(t, "pg-main")
	h.nodeBootstrap(40*time.Second, 60*time.Second)
	h.nodeTakeover(44*time.Second, 3)
	r = foldAll(t, "pg-main", h.recs)
	if len(r.SplitBrain) != 1 {
		t.Fatalf("split brain within the lease: %+v", r.SplitBrain)
	}
}

// Seen in a 10,000-pair run: a holder fences for heartbeat failures, its
// first fence attempt fails (so the rules' bound does not hold), the
// retry succeeds and the suspended holder writes a fenced register value;
// its stop events land minutes late behind a slow append queue. The
// follower takes the fenced holder over. The fenced register write, which
// only a suspended member writes, shows it had stopped: no split brain.
func TestFencedRegisterWriteBoundsALateFence(t *testing.T) {
	h := newHistory(t, "pg-main")
	h.nodeBootstrap(60*time.Second, 60*time.Second)
	h.at(10 * time.Second).leader(failover.Leader{Site: "site-a", Term: 1, Beat: 1, Fenced: true, Node: "node-a", Epoch: 1})
	fenced := h.now
	h.nodeTakeover(16*time.Second, 4)
	h.lateFence()
	r := foldAll(t, "pg-main", h.recs)
	if len(r.SplitBrain) != 0 {
		t.Fatalf("split brain: %+v", r.SplitBrain)
	}
	a := r.Leadership[0]
	timeEq(t, "site-a up_until", a.UpUntil, fenced)
	if !strings.Contains(a.UpBasis, "by the fenced register write") {
		t.Errorf("up basis %q", a.UpBasis)
	}

	// Without the fenced write, the failed attempt leaves only the late
	// completion: reported.
	h = newHistory(t, "pg-main")
	h.nodeBootstrap(60*time.Second, 60*time.Second)
	h.nodeTakeover(16*time.Second, 3)
	h.lateFence()
	if r := foldAll(t, "pg-main", h.recs); len(r.SplitBrain) != 1 {
		t.Fatalf("no fenced write, a failed fence and a late completion: split brain %+v", r.SplitBrain)
	}
}

// A fenced value that an unfenced one of a higher beat follows before the
// interval's recorded stop does not bound it: the holder unfenced and
// served again, and the record lost what it recorded of that.
func TestFencedWriteFollowedByAnUnfencingDoesNotBound(t *testing.T) {
	h := newHistory(t, "pg-main")
	h.nodeBootstrap(60*time.Second, 60*time.Second)
	h.at(10 * time.Second).leader(failover.Leader{Site: "site-a", Term: 1, Beat: 1, Fenced: true, Node: "node-a", Epoch: 1})
	h.at(12 * time.Second).leader(failover.Leader{Site: "site-a", Term: 1, Beat: 2, Node: "node-a", Epoch: 1})
	h.at(30 * time.Second)
	h.event("site-a", &failover.FenceRequested{Seq: 3, Reason: failover.FenceHeartbeatFailures, Term: 1, Then: failover.AfterSuspend})
	h.chain("site-a", procedure.ChainFence, 3, false)
	h.at(30100*time.Millisecond).event("site-a", &failover.Fenced{Seq: 3})
	r := foldAll(t, "pg-main", h.recs)
	a := r.Leadership[0]
	if strings.Contains(a.UpBasis, "fenced register write") {
		t.Fatalf("bounded by a fenced write it unfenced after: %+v", a)
	}
	timeEq(t, "site-a up_until", a.UpUntil, at(30100*time.Millisecond))
}

// A delete marker of a liveness key is a marker, not a corrupt record.
func TestLivenessDeleteMarkerIsNotCorrupt(t *testing.T) {
	h := newHistory(t, "pg-main")
	h.nodeBootstrap(5*time.Second, 5*time.Second)
	h.kvSeq++
	rec := events.KVRecord(DefaultBucket, events.Entry{Key: failover.LivenessKey("node-a"), Revision: h.kvSeq, Time: h.now, Op: events.OpDelete})
	h.recs = append(h.recs, rec)
	r := foldAll(t, "pg-main", h.recs)
	if r.Records.Corrupt != 0 {
		t.Fatalf("a liveness key's delete marker read as corrupt: %+v", r.Records.RecordCounts)
	}
}
