package simulations

import (
	"fmt"
	"time"

	"understudy/actors/capability"
	"understudy/actors/failover"
)

// Invariants of the database mode (database.go), checked as the others
// are, on the step where what they judge happens.
const (
	// InvLostCommit: a database was promoted from a position below the
	// highest acknowledged commit: with synchronous on or strict, by any
	// amount; with synchronous off, by more than maximum_lag_on_failover
	// plus what was acknowledged after the flush the leader last
	// published in the register (what the lag rule cannot see).
	InvLostCommit = "lost-acknowledged-commit"
	// InvOverLagLimit: with synchronous off, a takeover of a stale leader
	// won the register while the taker's database had received more than
	// maximum_lag_on_failover less than the flush the leader last
	// published (its received position, on the leader's history).
	InvOverLagLimit = "promoted-over-lag-limit"
	// InvFailbackUnready: a holder decided to fail back to a member whose
	// database was not a standby streaming from the holder's, nor had been
	// within 3 heartbeat_timeout + 6 × the link's latency cap (what the
	// target's ready heartbeats could show), unless a link, process or
	// NATS fault on the target made those heartbeats late.
	InvFailbackUnready = "failback-to-unready"
)

func syncRule(r failover.Rules) bool {
	return r.Synchronous == failover.SyncOn || r.Synchronous == failover.SyncStrict
}

// dbPromoted runs when n's database is about to become a primary (a
// promote step succeeded on a standby or a stopped database): does its
// history hold every acknowledged commit?
func (v *invariants) dbPromoted(s *sim, n *node) {
	w := s.db
	if w.ref < 0 {
		return
	}
	acked := w.lins[w.ref].acked
	have := capability.LSN(0)
	if n.db.exists {
		have = s.dbCommon(n.db.lin, n.db.pos, w.ref, acked)
	}
	if have >= acked {
		return
	}
	loss := uint64(acked - have)
	var allowed uint64
	if !syncRule(s.rules) {
		allowed = s.rules.MaxLagOnFailover + capability.Lag(acked, w.published)
	}
	if loss <= allowed {
		s.count(cDBLossWithinLimit)
		s.tracef(n.site, "db promoted %d bytes behind the highest acknowledged commit (allowed %d: synchronous off)", loss, allowed)
		return
	}
	s.violate(InvLostCommit, "%s's database was promoted at %v (%v) although commits were acknowledged up to %v on timeline %d: %d bytes of acknowledged commits lost (synchronous: %s, allowed %d bytes)",
		n.site, n.db.pos, n.db.role, acked, w.ref+1, loss, s.rules.Synchronous, allowed)
}

// dbRegisterWritten runs when n's register write lands, before s.reg
// moves: a takeover from another site's holder is judged by the lag rule.
func (v *invariants) dbRegisterWritten(s *sim, n *node, w *failover.Write) {
	if w.Kind != failover.WriteAcquire || !s.regKnown || s.reg.Site == "" || s.reg.Site == n.site || syncRule(s.rules) {
		return
	}
	o := s.nodeBySite(s.reg.Site)
	if o == nil {
		return
	}
	flush, lin := s.reg.Flush, o.db.pubLin
	if flush == 0 {
		flush = o.db.pubFlush
	}
	if flush == 0 || lin < 0 {
		return // nothing published: nothing to measure against
	}
	recv := capability.LSN(0)
	if n.db.exists {
		recv = s.dbCommon(n.db.lin, n.db.pos, lin, flush)
	}
	if lag := capability.Lag(flush, recv); lag > s.rules.MaxLagOnFailover {
		s.violate(InvOverLagLimit, "%s took the register from %s (term %d) with its database at %v (%v; %v of %s's history): %d bytes behind the flush %v %s last published, over maximum_lag_on_failover %d",
			n.site, o.site, w.Leader.Term, n.db.pos, n.db.role, recv, o.site, lag, flush, o.site, s.rules.MaxLagOnFailover)
	}
}

// dbFailback runs when holder h decides to fail back to site to.
func (v *invariants) dbFailback(s *sim, h *node, to string) {
	t := s.nodeBySite(to)
	if t == nil {
		return
	}
	s.dbStream()
	hb := s.rules.HeartbeatTimeout
	recent := 3*hb + 6*s.maxLat
	if s.dbStreaming(t, h) || (int(t.db.streamFrom) == h.idx && s.now-t.db.streamAt <= recent) {
		s.count(cDBFailbackStreamed)
		return
	}
	excuse := s.now - recent - time.Duration(s.rules.SuccessThreshold)*hb
	if t.db.faultsOn > 0 || t.db.lastFault > excuse || v.active[scopeNATS] > 0 || v.lastChange[scopeNATS] > excuse {
		return
	}
	last := "never"
	if int(t.db.streamFrom) == h.idx {
		last = fmt.Sprintf("last at %.3fs", t.db.streamAt.Seconds())
	}
	s.violate(InvFailbackUnready, "%s decided to fail back to %s, whose database is %v (timeline %d at %v, following %q) and does not stream from %s's (%s; allowed %v ago)",
		h.site, t.site, t.db.role, t.db.timeline(), t.db.pos, s.followsName(t.db.follows), h.site, last, recent)
}
