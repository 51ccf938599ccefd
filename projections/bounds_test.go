package projections

import (
	"testing"
	"time"

	"understudy/actors/failover"
	"understudy/actors/procedure"
)

// A power cut records no stop: the record shows site-a serving until its
// last register write (10s) and, by the rules, stopped by 15s. The outage
// before site-b serves (15.11s) is at most 5.11s and at least 110ms, and
// says so.
func TestPowerCutOutageIsBounded(t *testing.T) {
	h, _ := powerCut(t)
	r := foldAll(t, "pg-main", h.recs)
	a := r.Availability
	if len(a.Outages) != 1 {
		t.Fatalf("outages %+v", a.Outages)
	}
	o := a.Outages[0]
	if !o.Bounded || o.MS != 5110 || o.MinMS != 110 || o.FromLatest == nil || !o.FromLatest.Equal(at(15*time.Second)) {
		t.Errorf("outage %+v, want 5110 ms at most, 110 ms at least, begun by 15s", o)
	}
	if len(o.Certain) != 1 || !o.Certain[0].From.Equal(at(15*time.Second)) || !o.Certain[0].To.Equal(at(15110*time.Millisecond)) || o.Why == "" {
		t.Errorf("certain %+v, why %q", o.Certain, o.Why)
	}
	if a.Bounded != 1 || a.OutageMS != 5110 || a.OutageMinMS != 110 || a.LongestGapMS != 5110 || a.LongestGapMinMS != 110 {
		t.Errorf("availability %+v", a)
	}
	if l := r.Leadership[0]; l.ToLatest == nil || !l.ToLatest.Equal(at(15*time.Second)) {
		t.Errorf("site-a's to_latest %v, want the rules' bound", l.ToLatest)
	}
}

// A recorded stop dates the outage: nothing is bounded.
func TestRecordedStopIsExact(t *testing.T) {
	h := newHistory(t, "pg-main")
	last := h.bootstrap(10*time.Second, 20*time.Second)
	h.at(10500*time.Millisecond).event("site-a", &failover.FenceRequested{Seq: 3, Reason: failover.FenceHeartbeatFailures, Term: 1, Then: failover.AfterSuspend})
	h.takeover(15100*time.Millisecond, last, 5100*time.Millisecond, 20*time.Second)
	a := foldAll(t, "pg-main", h.recs).Availability
	if a.Bounded != 0 || len(a.Outages) != 1 || a.Outages[0].MS != 4610 || a.Outages[0].MinMS != 4610 || a.OutageMinMS != a.OutageMS || a.LongestGapMinMS != a.LongestGapMS {
		t.Errorf("availability %+v", a)
	}
}

// A member whose events after 10s died with its process (its queue dies
// with it) while its register writes landed: fenced writes show it had
// stopped serving by 11s; unfenced ones after them that it may have
// served again (13s, until the rules' bound after its last write at 15s),
// though no serving_started of it is in the record.
func TestLostEventsBoundedByTheRegister(t *testing.T) {
	h := newHistory(t, "pg-main")
	h.bootstrap(10*time.Second, 30*time.Second)
	for _, w := range []struct {
		at     time.Duration
		fenced bool
	}{{11, true}, {12, true}, {13, false}, {14, false}, {15, false}} {
		h.at(w.at * time.Second).leader(failover.Leader{Site: "site-a", Term: 1, Beat: uint64(w.at), Fenced: w.fenced})
	}
	h.at(30*time.Second).hb("site-b", 31)
	r := foldAll(t, "pg-main", h.recs)
	if len(r.Leadership) != 1 {
		t.Fatalf("leadership %+v", r.Leadership)
	}
	l := r.Leadership[0]
	if l.To == nil || !l.To.Equal(at(10*time.Second)) || l.ToLatest == nil || !l.ToLatest.Equal(at(11*time.Second)) {
		t.Errorf("site-a to %v, to_latest %v; want its last unfenced write before the fenced ones (10s) and the first fenced one (11s)", l.To, l.ToLatest)
	}
	a := r.Availability
	if len(a.Outages) != 1 {
		t.Fatalf("outages %+v", a.Outages)
	}
	o := a.Outages[0]
	if !o.Open || !o.Bounded || len(o.MayHaveServed) != 1 {
		t.Fatalf("outage %+v", o)
	}
	m := o.MayHaveServed[0]
	if m.Site != "site-a" || m.Term != 1 || !m.From.Equal(at(13*time.Second)) || !m.To.Equal(at(20*time.Second)) {
		t.Errorf("may have served %+v, want site-a 13s–20s", m)
	}
	// Certain: 11–13s and 20s to the end of the record (30.003s).
	if o.MS != 20003 || o.MinMS != 12003 || a.LongestGapMinMS != 10003 {
		t.Errorf("outage %.0f ms at most, %.0f at least (longest %.0f); want 20003, 12003, 10003", o.MS, o.MinMS, a.LongestGapMinMS)
	}

	// Its resource's procedure events outlived the member's: a promote step
	// that succeeded at 13.2s (no serving_started names its chain) is when
	// the database served; a fence chain starting at 16s when it stopped.
	h.at(13200*time.Millisecond).proc("site-a", &procedure.StepFinished{Resource: "pg-main.site-a", Kind: procedure.ChainPromote, Seq: 9, Name: "pg-promote", Result: procedure.ResultOK})
	h.at(16*time.Second).proc("site-a", &procedure.ChainStarted{Resource: "pg-main.site-a", Kind: procedure.ChainFence, Seq: 10, Steps: 3})
	r = foldAll(t, "pg-main", h.recs)
	if len(r.Leadership) != 2 {
		t.Fatalf("leadership %+v", r.Leadership)
	}
	if l = r.Leadership[0]; l.To == nil || !l.To.Equal(at(10*time.Second)) || l.ToLatest == nil || !l.ToLatest.Equal(at(11*time.Second)) {
		t.Errorf("the first interval %+v: a promote after it shows it had stopped", l)
	}
	l = r.Leadership[1]
	if l.FromBasis != "promote_step" || !l.From.Equal(at(13200*time.Millisecond)) || l.To == nil || !l.To.Equal(at(16*time.Second)) || l.EndBasis != "recorded" || l.Term != 1 {
		t.Errorf("the second interval %+v, want 13.2s (promote step) to 16s (fence chain), term 1", l)
	}
}
