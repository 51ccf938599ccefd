package simulations

import (
	"strings"
	"time"

	"understudy/actors/failover"
	"understudy/events"
)

// Invariant names, as reported.
const (
	// InvSplitBrain: two databases serve at once (resource level: a promote
	// step that succeeded starts serving; a fence or demote step that
	// succeeded, a crash or a power cut stops it).
	InvSplitBrain = "split-brain"
	// InvPromotionWhileWrites: an acquire CAS won the register from another
	// site although that site's unfenced register writes were still landing
	// within failover_timeout before it (virtual time: the server's clock
	// without the bumps a schedule gives it).
	InvPromotionWhileWrites = "promotion-while-primary-writes-land"
	// InvDeadNotReplaced: the register named a dead member, the survivor and
	// NATS were healthy, and the survivor was not serving within the bound
	// failover_timeout + 2 heartbeat_timeout + fence chain + promote chain +
	// 6 × the link's maximum latency.
	InvDeadNotReplaced = "dead-primary-not-replaced"
	// InvFlapping: more leadership changes once every fault had cleared
	// than the rules allow (calmChanges).
	InvFlapping = "leadership-flapping"
	// InvUnavailable: every fault had cleared, both members and NATS ran,
	// and still nobody served for longer than the settle bound (the
	// liveness bound plus success_threshold + 2 heartbeats and the fence
	// and demote chains).
	InvUnavailable = "unavailable-after-faults-cleared"
	// InvScenario: a scenario's own expectation failed (something it says
	// must never happen in it did).
	InvScenario = "scenario-expectation"
	// InvMemberStopped: a member stopped for good on an append conflict
	// although no other process had appended to its subject: every record
	// past the sequence its appender expected is its own (same message-id
	// nonce). A conflict with a dead predecessor's late append is a true
	// conflict and is not reported.
	InvMemberStopped = "member-stopped-without-rival"
	// InvWriteStorm: a member issued more KV writes within one
	// heartbeat_timeout than the rules let it (writeStormLimit): it writes
	// its heartbeat or the register once per interval, plus at most a probe,
	// an acquire or release and one rewrite after its own late write.
	InvWriteStorm = "write-storm"
	// InvHandoverVacant: a hand-over (a release naming the member to take
	// over: failback, switchover, shutdown) was not taken by the member it
	// named within promote chain + 4 heartbeat_timeout + 6 × the link's
	// latency cap, although that member ran on a clean link (a lagging watch
	// included) and no fault began on it or NATS since: the holder handed
	// over to a member that could not take it.
	InvHandoverVacant = "handover-left-vacant"
	// InvUnavailableStandby: nobody served while one member (the standby)
	// and NATS were free of faults, for longer than the liveness bound plus
	// the fence chain and one heartbeat_timeout, counted from the later of
	// the outage's start, the last fault on the standby or NATS, and the
	// landing of the other member's last unfenced register write sent while
	// it served or of its last acquire (a new holder promotes, or fails to
	// and hands back, first). Derivation: from then on the holder's writes say fenced
	// (its first one once its fence chain has run, within a heartbeat) or
	// are lone unfencing announcements, or stop landing; either way the
	// standby's clock runs, and failover_timeout later it takes over as for
	// a dead holder. A holder that recovers serves again, ending the outage.
	InvUnavailableStandby = "unavailable-while-standby-healthy"
	// InvFailbackToAbsent: a holder decided to fail back (demotion
	// requested for failback) to a member whose process had been down for
	// more than 2 × heartbeat_timeout, counted from the later of its going
	// down and the landing of its last heartbeat, while the holder's link
	// and NATS had no fault since 2 × heartbeat_timeout before then. A
	// holder fails back only on success_threshold ready heartbeats of the
	// preferred primary; the last of them reaches it within the link's
	// latency of landing, and no dead member writes one: it counted
	// heartbeats its member did not write.
	InvFailbackToAbsent = "failback-to-absent-member"
)

// writeStormLimit is how many KV writes a member may issue within one
// heartbeat_timeout: its beat (register or heartbeat key), a staleness
// probe, an acquire or a release, one rewrite after its own late write,
// with as much again to spare.
const writeStormLimit = 8

// calmChanges is how many times the register may change hands once every
// fault has cleared (both members and NATS up, links clean). A change is a
// takeover or a failback. A takeover needs the holder's writes to stop
// landing, or it to stay fenced, for failover_timeout: with no fault a
// live holder's writes land every heartbeat_timeout, so only a takeover
// the fault set going (the holder died, went stale, or fenced itself
// before it cleared) remains — one. A failback needs failback: auto, the
// replica holding and the preferred primary ready; once the primary holds,
// nothing moves it — one more. Any further change needs another fault.
func calmChanges(r failover.Rules) int {
	n := 1
	if r.Failback == failover.FailbackAuto {
		n++
	}
	return n
}

// scopes of faults, for calm periods: one per node, and NATS itself.
const scopeNATS = 2

// invariants is the checkers' state. Everything is O(1) per step.
type invariants struct {
	// leadership
	lastHolder  string
	changes     int
	calmChanges int
	// availability (see availabilityChanged)
	everServed bool
	gap        bool
	gapStart   time.Duration
	maxGap     time.Duration
	totalGap   time.Duration
	outages    []Outage    // the last one is open while gap
	orec       []outageRec // what the record shows of each (record.go)
	takeovers  []Takeover
	// calm periods
	active     [3]int
	lastChange [3]time.Duration
	// liveness
	lastStop      time.Duration // a database stopped and nobody served
	unavailReport bool
	standbyReport bool
	// hand-over
	hoArmed  bool
	hoTarget int
	hoAt     time.Duration
	hoSince  time.Duration // faults on the target that began after this are excused
	demoteAt time.Duration // the latest demotion request of a holder
	armed    bool
	dead     int
	armedAt  time.Duration
	reported bool
}

func (v *invariants) init(*sim) {}

func (v *invariants) calm() bool { return v.active[0]+v.active[1]+v.active[scopeNATS] == 0 }

// faultEvent: a fault started (windowed: it stays in force) or ended, or an
// instant one happened, in a scope.
func (v *invariants) faultEvent(s *sim, scope int, delta int) {
	v.active[scope] += delta
	v.lastChange[scope] = s.now
	v.calmChanges = 0
}

// registerWritten runs when a register write lands, before s.reg moves.
func (v *invariants) registerWritten(s *sim, n *node, w *failover.Write, res writeResult) {
	n.lastLanded = s.now
	if w.Leader.Site != "" && !w.Leader.Fenced {
		n.lastUnfenced, n.unfenced = s.now, true
	}
	if w.Leader.Site == "" && w.Leader.Handoff != "" {
		if t := s.nodeBySite(w.Leader.Handoff); t != nil && !(v.hoArmed && v.hoTarget == t.idx) {
			// The first of repeated hand-overs to the same member counts.
			// The holder demoted on success_threshold ready heartbeats of
			// the target: a fault that began on the target after the first
			// of them could have been written is not the target's to report.
			v.hoArmed, v.hoTarget, v.hoAt = true, t.idx, s.now
			v.hoSince = min(s.now, v.demoteAt) - time.Duration(s.rules.SuccessThreshold)*s.rules.HeartbeatTimeout
		}
	}
	if w.Kind == failover.WriteAcquire {
		n.wins++
		n.lastAcquired = s.now
		prev := s.reg
		switch {
		case !s.regKnown:
		case prev.Site != "" && prev.Site != n.site:
			o := s.other(n)
			s.count(cFailover)
			v.takeovers = append(v.takeovers, Takeover{At: s.now.Seconds(), From: prev.Site, To: n.site, Term: w.Leader.Term, ServingAt: -1, OldAlive: o.alive})
			n.takeover, o.takeover = len(v.takeovers), 0
			if prev.Fenced {
				s.count(cFencedTakeover)
			}
			if !o.serving {
				s.count(cStoppedBeforeTakeover)
			}
			fo := s.foCheck
			// The CAS replaced a value that says fenced: the holder's latest
			// write (they land in CAS order) says it does not serve, and it
			// serves again only after a later unfenced write has landed,
			// which would have made this CAS fail. Its earlier unfenced
			// writes, lone unfencing announcements included, are superseded.
			if !prev.Fenced && o.unfenced && s.now-o.lastUnfenced < fo {
				s.violate(InvPromotionWhileWrites,
					"%s's acquire (term %d, expecting rev %d) won at %.3fs; %s's last unfenced register write landed at %.3fs, %v before (failover_timeout %v)",
					n.site, w.Leader.Term, w.ExpectRev, s.now.Seconds(), o.site, o.lastUnfenced.Seconds(), s.now-o.lastUnfenced, fo)
			}
		case prev.Site == "" && prev.Planned:
			s.count(cSwitchover)
		case prev.Site == "" && prev.Handoff == n.site && n.primary:
			s.count(cFailback)
		}
		if v.lastHolder != "" && v.lastHolder != n.site {
			v.changes++
			if v.calm() {
				v.calmChanges++
				if v.calmChanges > s.calmLimit {
					s.violate(InvFlapping, "%d leadership changes since every fault cleared at %.3fs (the rules allow %d: a takeover already under way, then a failback when failback is auto)",
						v.calmChanges, max(v.lastChange[0], v.lastChange[1], v.lastChange[scopeNATS]).Seconds(), s.calmLimit)
				}
			}
		}
		v.lastHolder = n.site
	}
}

// servingChanged runs whenever a database starts or stops serving.
func (v *invariants) servingChanged(s *sim, n *node) {
	o := s.other(n)
	if n.serving && s.db != nil {
		s.dbWithholds(n, false)
		s.dbWithholds(o, false)
	}
	if n.serving {
		if o.serving {
			s.violate(InvSplitBrain, "%s serving since %.3fs and %s serving since %.3fs: both at once",
				o.site, o.servingSince.Seconds(), n.site, s.now.Seconds())
		}
		if n.takeover > 0 {
			v.takeovers[n.takeover-1].ServingAt = s.now.Seconds()
			n.takeover = 0
		}
		return
	}
	if !o.serving {
		v.lastStop = s.now
	}
}

// availabilityChanged runs whenever a database becomes available or stops
// being so. Available is narrower than serving: a database whose fence or
// demote chain has started is stopping (pg_ctl stop -m fast refuses new
// sessions and ends the running ones at once) although it serves, for the
// split-brain check, until the step completes. Unavailability is counted
// from the first moment something was available, as the record's
// availability is (docs/replay.md): from a stop's start, or a crash, to
// the next promote step that completes.
func (v *invariants) availabilityChanged(s *sim, n *node, cause string) {
	up := s.nodes[0].available() || s.nodes[1].available()
	if !n.available() {
		n.endOutage = 0 // what it appends now dates no outage's end
		n.unavailAt = s.now
	}
	switch {
	case up && v.gap:
		v.closeGap(s, n.site, false)
		n.endOutage = int32(len(v.outages))
	case up:
		v.everServed = true
	case v.everServed && !v.gap:
		v.gap, v.gapStart = true, s.now
		v.outages = append(v.outages, Outage{TrueFrom: s.now.Seconds(), Site: n.site, Cause: cause})
		s.outageOpened(n, len(v.outages)-1, strings.HasPrefix(cause, "stop: "))
	}
}

func (v *invariants) closeGap(s *sim, by string, open bool) {
	d := s.now - v.gapStart
	v.maxGap = max(v.maxGap, d)
	v.totalGap += d
	o := &v.outages[len(v.outages)-1]
	o.TrueTo, o.TrueMS, o.By, o.Open = s.now.Seconds(), msOf(d), by, open
	r := &v.orec[len(v.orec)-1]
	r.toSrv = s.srv(s.now)
	if n := s.nodeBySite(by); n != nil {
		r.toNode = int8(n.idx)
		if n.m != nil {
			r.toTerm = n.m.Term()
		}
	}
	v.gap = false
	v.standbyReport = false
}

// failbackDecided runs when holder n requests its demotion to fail back to
// site (see InvFailbackToAbsent).
func (v *invariants) failbackDecided(s *sim, n *node, site string) {
	t := s.nodeBySite(site)
	if t == nil || (t.alive && !t.halted) {
		return
	}
	hb2 := 2 * s.rules.HeartbeatTimeout
	since := max(t.downAt, t.lastBeatLanded)
	if s.now-since <= hb2 || v.active[n.idx] > 0 || v.active[scopeNATS] > 0 || max(v.lastChange[n.idx], v.lastChange[scopeNATS]) >= since-hb2 {
		return
	}
	s.violate(InvFailbackToAbsent, "%s decided to fail back to %s, whose process has been down since %.3fs (its last heartbeat landed at %.3fs): it counted ready heartbeats %s's member did not write",
		n.site, t.site, t.downAt.Seconds(), t.lastBeatLanded.Seconds(), t.site)
}

// memberStopped runs when a node's appender concludes that another process
// appends to its subject (expected last sequence last): the server's
// records say whether one did.
func (v *invariants) memberStopped(s *sim, n *node, subject string, last uint64, err error) {
	own, rival := 0, 0
	s.server.recordsAfter(subject, last, func(rec events.Record) {
		if nonce, ok := events.AppendedBy(rec); ok && nonce == n.nonce {
			own++
		} else {
			rival++
		}
	})
	if rival > 0 {
		return // a true conflict (a dead predecessor's late append)
	}
	s.violate(InvMemberStopped, "%s's member stopped for good on an append conflict on %s (%v), yet no other process appended to it: the %d records after sequence %d are its own",
		n.site, subject, err, own, last)
}

// writeIssued counts a member's KV writes per heartbeat_timeout window.
func (v *invariants) writeIssued(s *sim, n *node) {
	if s.now-n.wsStart >= s.rules.HeartbeatTimeout {
		n.wsStart, n.wsCount = s.now, 0
	}
	n.wsCount++
	if n.wsCount > writeStormLimit && !n.wsReported {
		n.wsReported = true
		s.violate(InvWriteStorm, "%s issued %d KV writes within %v (from %.3fs; the rules allow %d per heartbeat_timeout)",
			n.site, n.wsCount, s.rules.HeartbeatTimeout, n.wsStart.Seconds(), writeStormLimit)
	}
}

// cleanLink: nothing degrades a node's link or its server's place in the
// cluster. (A lagging watch does not count: a member can see its own
// acknowledged writes come back late, and must not say ready then.)
func (s *sim) cleanLink(n *node) bool {
	for _, d := range []*dirState{&n.up, &n.down} {
		if !d.clear() || d.loss > 0 || d.extra > 0 {
			return false
		}
	}
	return s.cl.isolated[n.idx] == 0
}

// checkArm arms the liveness check when the register names a dead member
// (or hands over to one). It stays armed until the dead member is back or
// the survivor serves.
func (v *invariants) checkArm(s *sim) {
	if !s.regKnown || v.armed {
		return
	}
	target := s.reg.Site
	if target == "" {
		target = s.reg.Handoff
	}
	if d := s.nodeBySite(target); d != nil && !d.alive {
		v.armed, v.dead, v.armedAt, v.reported = true, d.idx, s.now, false
	}
}

// step runs after every queue item.
func (v *invariants) step(s *sim) {
	a, b := s.nodes[0], s.nodes[1]
	for _, n := range s.nodes {
		if s.dbWithheld(n) {
			n.db.excusedAt = s.now // the liveness bounds count from the end of a withheld promotion
		}
		if n.jumpUntil != 0 && s.now > n.jumpUntil {
			if n.wins == n.jumpWins {
				s.count(cJumpNoPromotion)
			}
			n.jumpUntil = 0
		}
	}
	if v.hoArmed {
		t := s.nodes[v.hoTarget]
		switch {
		case t.serving || (s.regKnown && s.reg.Site == t.site) || !t.alive || v.lastChange[t.idx] > v.hoSince || v.lastChange[scopeNATS] > v.hoSince || v.active[scopeNATS] > 0:
			v.hoArmed = false
		case s.dbWithheld(t):
			// An unplanned handoff (failed promotion or checks) to a member
			// the lag or synchronous rule forbids to take it: waiting is what
			// the rules want.
			v.hoArmed = false
		case s.now > v.hoAt+s.hoBound:
			v.hoArmed = false
			if s.cleanLink(t) {
				s.violate(InvHandoverVacant, "the register was handed over to %s at %.3fs and %s has not taken it %v later (bound %v; the register now names %q), although its link is clean and no fault began on it or NATS since",
					t.site, v.hoAt.Seconds(), t.site, s.now-v.hoAt, s.hoBound, s.reg.Site)
			}
		}
	}
	if v.gap && !v.standbyReport && !v.calm() && v.active[scopeNATS] == 0 {
		for _, st := range s.nodes {
			h := s.other(st)
			if !st.alive || st.paused || v.active[st.idx] > 0 || !h.alive || s.dbWithheld(st) {
				continue
			}
			since := max(v.gapStart, v.lastChange[st.idx], v.lastChange[scopeNATS], h.lastAvailUnfenced, h.lastAcquired, st.db.excusedAt)
			if s.now > since+s.standbyBound {
				v.standbyReport = true
				s.violate(InvUnavailableStandby, "nobody has served since %.3fs; %s and NATS have been free of faults since %.3fs and %s's last unfenced register write sent while serving landed at %.3fs, yet %s has not taken over within the bound %v",
					v.gapStart.Seconds(), st.site, max(v.lastChange[st.idx], v.lastChange[scopeNATS]).Seconds(), h.site, h.lastAvailUnfenced.Seconds(), st.site, s.standbyBound)
			}
		}
	}
	up := func(n *node) bool { return n.alive || n.halted } // a stopped member's process runs on
	if !a.serving && !b.serving && up(a) && up(b) && v.calm() && !v.unavailReport && !s.dbWithheld(a) && !s.dbWithheld(b) {
		since := max(v.lastStop, v.lastChange[0], v.lastChange[1], v.lastChange[scopeNATS], a.db.excusedAt, b.db.excusedAt)
		if s.now > since+s.settle {
			v.unavailReport = true
			s.violate(InvUnavailable, "every fault cleared by %.3fs and both members run, yet nobody has served since %.3fs (settle bound %v)",
				max(v.lastChange[0], v.lastChange[1], v.lastChange[scopeNATS]).Seconds(), v.lastStop.Seconds(), s.settle)
		}
	}
	if !v.armed {
		return
	}
	d := s.nodes[v.dead]
	surv := s.other(d)
	switch {
	case d.alive:
		v.armed = false
		return
	case surv.serving:
		s.count(cDeadReplaced)
		v.armed = false
		return
	case v.reported || !surv.alive || v.active[surv.idx] > 0 || v.active[scopeNATS] > 0 || s.dbWithheld(surv):
		return
	}
	start := max(v.armedAt, d.downAt, d.lastLanded, v.lastChange[surv.idx], v.lastChange[scopeNATS], surv.db.excusedAt)
	if s.now > start+s.bound {
		v.reported = true
		s.violate(InvDeadNotReplaced, "the register names %s, dead since %.3fs (its last register write landed at %.3fs); %s and NATS healthy since %.3fs, yet %s does not serve after the bound %v",
			d.site, d.downAt.Seconds(), d.lastLanded.Seconds(), surv.site, start.Seconds(), surv.site, s.bound)
	}
}

// finish runs once at the end of the run (the scenario's expectations
// are checked once for the whole run: world.run).
func (v *invariants) finish(s *sim) {
	if v.gap {
		v.closeGap(s, "", true)
	}
}

// leaseRenewed runs when a liveness write of n's node lands in epoch
// (node leadership): to the checkers it is what a holder's register write
// is in per-pair leadership when the register names n in that epoch — the
// holder's lease goes on — and, for every member of the node, a heartbeat
// (its heartbeat key's value stands until it writes another). sent is
// when the node sent it: it counts as sent while n served if n was
// available then or became unavailable since (the checkers' bounds then
// count from it, later: never a false alarm).
func (v *invariants) leaseRenewed(s *sim, n *node, epoch uint64, sent time.Duration) {
	n.lastBeatLanded = s.now
	if !s.regKnown || s.reg.Site != n.site || s.reg.Node != n.name || s.reg.Epoch != epoch {
		return
	}
	n.lastLanded = s.now
	if !s.reg.Fenced {
		n.lastUnfenced, n.unfenced = s.now, true
		if n.available() || n.unavailAt >= sent {
			n.lastAvailUnfenced = s.now
		}
	}
}
