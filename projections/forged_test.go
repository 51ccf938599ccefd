package projections

import (
	"testing"
	"time"

	"understudy/actors/failover"
)

// Register values no member wrote leave the leadership history: those a
// member recorded as forged (failover.forged_value_ignored) and those that
// name a holder and say another site wrote them. The power cut's one
// failover stays the only one, though forged beats of the dead primary
// were written before the takeover and on top of the new holder's.
func TestForgedRegisterValuesAreLeftOut(t *testing.T) {
	h := newHistory(t, "pg-main")
	last := h.bootstrap(10*time.Second, 15*time.Second)
	for i, d := range []time.Duration{11 * time.Second, 12 * time.Second, 13 * time.Second} {
		rev := h.at(d + 500*time.Millisecond).leader(failover.Leader{Site: "site-a", Term: 1, Beat: uint64(20 + i)})
		h.at(d+510*time.Millisecond).event("site-b", &failover.ForgedValueIgnored{Rev: rev, Reason: "its signature does not verify",
			Value: failover.Leader{Site: "site-a", Term: 1, Beat: uint64(20 + i)}})
		last = rev
	}
	h.takeover(15100*time.Millisecond, last, 5100*time.Millisecond, 20*time.Second)
	// Signed by site-b, naming site-a: nobody recorded it (site-b's member
	// was down, say), the record alone tells it apart.
	h.at(17500 * time.Millisecond).leader(failover.Leader{Site: "site-a", Term: 1, Beat: 40, By: "site-b"})
	r := foldAll(t, "pg-main", h.recs)
	if len(r.Failovers) != 1 || r.Failovers[0].From != "site-a" || r.Failovers[0].To != "site-b" {
		t.Fatalf("failovers %+v, want site-a to site-b once", r.Failovers)
	}
	if got := r.Records.ForgedRegister; got != 4 {
		t.Errorf("forged register writes %d, want 4", got)
	}
	if len(r.Leadership) != 2 {
		t.Errorf("leadership %+v, want site-a then site-b", r.Leadership)
	}
}
