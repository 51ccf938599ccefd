package projections

import (
	"strconv"
	"testing"
	"time"

	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/events"
)

// queued marks the last record as having waited w in its node's append
// queue (events.HeaderQueued): the replay dates it w before it landed.
func (h *history) queued(w time.Duration) {
	r := &h.recs[len(h.recs)-1]
	if r.Headers == nil {
		r.Headers = map[string]string{}
	}
	r.Headers[events.HeaderQueued] = strconv.FormatInt(int64(w), 10)
}

// A member serves a term only after its acquire of it landed. Its events
// dated before that (a jump of its node's clock while they waited in its
// append queue makes the wait look longer: 3 s in the simulator's per-pair
// random seed 183) start its serving at the acquire's landing, not before
// the release it followed: no split brain with the member that released.
func TestServingIsNotDatedBeforeItsAcquireLanded(t *testing.T) {
	h, _ := powerCut(t)
	h.at(21 * time.Second)
	h.start("site-a")
	h.at(23100*time.Millisecond).event("site-b", &failover.DemotionRequested{Seq: 3, Reason: failover.DemoteFailback, Handoff: "site-a"})
	h.chain("site-b", procedure.ChainDemote, 3, false)
	h.at(23200*time.Millisecond).event("site-b", &failover.Demoted{Seq: 3})
	rel := h.leader(failover.Leader{Term: 2, Handoff: "site-a"})
	h.event("site-b", &failover.Released{Term: 2, Rev: rel, Handoff: "site-a"})
	h.at(23300 * time.Millisecond)
	rev := h.leader(failover.Leader{Site: "site-a", Term: 3})
	// site-a's events of its takeover land a second later, each dated
	// 3 s before it landed.
	h.at(24300*time.Millisecond).event("site-a", &failover.AcquireAttempted{Reason: failover.AcquireHandoff, Term: 3, ExpectRev: rel})
	h.queued(3 * time.Second)
	h.event("site-a", &failover.Promoted{Seq: 2, Term: 3, Rev: rev, Reason: failover.AcquireHandoff})
	h.queued(3 * time.Second)
	h.at(24400*time.Millisecond).event("site-a", &failover.ServingStarted{Seq: 2, Term: 3})
	h.queued(3 * time.Second)

	r := foldAll(t, "pg-main", h.recs)
	if len(r.SplitBrain) != 0 {
		t.Errorf("split brain: %+v", r.SplitBrain)
	}
	a := r.Leadership[len(r.Leadership)-1]
	if a.Site != "site-a" || a.Term != 3 || a.FromBasis != "acquire" {
		t.Fatalf("site-a's term 3: %+v", a)
	}
	if want := at(23300 * time.Millisecond); !a.From.Equal(want) {
		t.Errorf("site-a serves term 3 from %s, want its acquire's landing %s", a.From, want)
	}

	// Dated after its acquire landed, the event dates it as before.
	h2, _ := powerCut(t)
	if b := foldAll(t, "pg-main", h2.recs).Leadership[1]; b.FromBasis != "serving_started" {
		t.Errorf("a serving_started dated after its acquire: from_basis %q, want serving_started", b.FromBasis)
	}
}
