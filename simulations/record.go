package simulations

import (
	"slices"
	"sort"
	"time"

	"understudy/actors/failover"
	"understudy/actors/procedure"
)

// What the record shows of an outage.
//
// The simulator knows when a database stopped and started serving; the
// record (the export `replay` reads) knows when a fact reached the server:
// an event at its server timestamp less the time it waited on its node
// (events.HeaderQueued), which is late by the one-way latency of its
// append — invisible to any record, since the node's clock and the
// server's are not the same clock. So that a replay of the run can be
// compared with the run's own report figure for figure, the report dates
// each outage edge as the record does, from the simulator's own facts (when
// its appends and writes landed), and keeps the true times beside them:
//
//   - an edge marked by an event — the stop that began it (the first of
//     fence_requested, demotion_requested, leadership_lost), the
//     serving_started that ended it, and their procedure's fence or demote
//     chain_started and successful promote step_finished, which the replay
//     reads when no member event of the record names their chain (it died
//     with the process) — is dated when the earliest of them landed less
//     its wait, kept in order on its subject as the replay keeps it (basis
//     "recorded");
//   - a stop dated later than the rules allow after the site's last
//     unfenced register write before that date ((failure_threshold + 1) ×
//     heartbeat_timeout + fence_grace: a slow append) is dated when it
//     happened, on the server's clock, but not before that write (basis
//     "late"); one with no event in the record (it died with the process:
//     "lost"; a crash or power cut has none: "down") when it happened, but
//     not before the last unfenced write the site sent before it landed:
//     the record shows the site serving until then. The replay only bounds
//     such an edge, between that write and the rules' bound, and the
//     truth is within;
//   - a serving the record holds no event of is dated when it happened
//     (basis "lost"); the replay shows it only as a stretch where the site
//     may have served.

// recMark is an outage edge that a queued member event will date when it
// lands.
type recMark struct {
	outage int32 // index into invariants.outages; -1: none (yet)
	to     bool  // serving_started, the outage's end; else the stop, its start
	stream int8  // 0: a member event, 1: a procedure event
	date   bool  // it dates the edge
	// key: the procedure chain a procedure event is of, or that a member
	// event names (serving_started, fence_requested, demotion_requested).
	key chainKey
}

// chainKey names a procedure chain of a node: kind and sequence.
type chainKey struct {
	kind procedure.ChainKind
	seq  uint64
}

// recDate is an event's date in the record (server clock, since Epoch):
// raw is its timestamp less its wait; mono also keeps its subject's dates
// in sequence order, as the replay does once any event carries a wait.
type recDate struct {
	raw, mono time.Duration
	seq       uint64
	ok        bool
}

func (d recDate) at(s *sim) time.Duration {
	if s.anyQueued {
		return d.mono
	}
	return d.raw
}

// dated is an edge's date in the record, as the replay reads it: its
// member event's; and its procedure event's when the record holds no
// member event naming that chain (it died with the process) — the earlier
// of the two.
func dated(s *sim, d [2]recDate, n *node, k chainKey) (time.Duration, bool) {
	named := n.named[k]
	switch {
	case d[0].ok && d[1].ok && !named:
		return min(d[0].at(s), d[1].at(s)), true
	case d[0].ok:
		return d[0].at(s), true
	case d[1].ok && !named:
		return d[1].at(s), true
	}
	return 0, false
}

// outageRec is what the record will show of one outage's edges.
type outageRec struct {
	node     int8   // the node that stopped being available
	toNode   int8   // the node that became available
	term     uint64 // its term then
	toTerm   uint64 // the term toNode serves in
	event    bool   // the stop was a member event (else: its process went)
	fromSrv  time.Duration
	toSrv    time.Duration
	from, to [2]recDate // by subject: member, procedure
	fromKey  chainKey   // the chain of the procedure event dating from
	toKey    chainKey   // ... to
	// evidence: the landing of the stopping node's last unfenced register
	// write of the term sent before the stop (evidenceRev its revision);
	// inflight: the same for one that landed after the stop. -1: none.
	evidence, inflight       time.Duration
	evidenceRev, inflightRev uint64
}

// landing is one of a node's unfenced register writes that landed.
type landing struct {
	term uint64
	at   time.Duration // server clock
	rev  uint64
}

// acquireLanding is when n's acquire of term landed, its first register
// write of the term (-1: none, or it was the register's first write, with
// none before it in the record): the replay dates a serving no earlier
// (projections, servedFrom).
func (s *sim) acquireLanding(n *node, term uint64) time.Duration {
	for _, l := range n.recWrites {
		if l.term != term {
			continue
		}
		key := failover.LeaderKey(s.rules.Pair)
		for _, e := range s.server.journal {
			if e.Key == key {
				if e.Revision == l.rev {
					return -1
				}
				break
			}
		}
		return l.at
	}
	return -1
}

// writeBefore is when n's last unfenced register write of term that
// landed by at (server clock) landed (-1: none).
func (n *node) writeBefore(term uint64, at time.Duration) time.Duration {
	i := len(n.recWrites) - 1
	if !n.recUnsorted { // landings in server-time order: skip the later ones
		i = sort.Search(len(n.recWrites), func(i int) bool { return n.recWrites[i].at > at }) - 1
	}
	for ; i >= 0; i-- {
		if l := n.recWrites[i]; l.term == term && l.at <= at {
			return l.at
		}
	}
	return -1
}

// srv is virtual time t on the server's clock, since Epoch.
func (s *sim) srv(t time.Duration) time.Duration { return t + s.server.offset }

// markEvent returns the record mark of an event appended on n's member
// (stream 0) or procedure (stream 1) subject (0: none): the member events
// that date an outage's edges or name a chain, and the procedure events
// that date an edge when the member's are missing.
func (s *sim) markEvent(n *node, stream int, ev any) int32 {
	var k chainKey
	switch e := ev.(type) {
	case *failover.ServingStarted:
		k = chainKey{procedure.ChainPromote, e.Seq}
	case *procedure.StepFinished:
		if e.Kind != procedure.ChainPromote || e.Result != procedure.ResultOK {
			return 0
		}
		k = chainKey{e.Kind, e.Seq}
	case *failover.LeadershipLost:
		return s.markStop(n, stream, chainKey{})
	case *failover.FenceRequested:
		return s.markStop(n, stream, chainKey{procedure.ChainFence, e.Seq})
	case *failover.DemotionRequested:
		return s.markStop(n, stream, chainKey{procedure.ChainDemote, e.Seq})
	case *procedure.ChainStarted:
		if e.Kind != procedure.ChainFence && e.Kind != procedure.ChainDemote {
			return 0
		}
		return s.markStop(n, stream, chainKey{e.Kind, e.Seq})
	default:
		return 0
	}
	m := recMark{outage: -1, to: true, stream: int8(stream), key: k}
	if n.endOutage > 0 {
		m.outage, m.date = n.endOutage-1, true
		if stream == 1 {
			s.inv.orec[m.outage].toKey = k
		}
	}
	s.recMarks = append(s.recMarks, m)
	return int32(len(s.recMarks))
}

// markStop marks a stop event: the first on each subject of n's current
// serving dates the outage it opens.
func (s *sim) markStop(n *node, stream int, k chainKey) int32 {
	m := recMark{outage: -1, stream: int8(stream), key: k}
	if n.available() && n.stopMark[stream] == 0 {
		m.date = true
	}
	s.recMarks = append(s.recMarks, m)
	if m.date {
		n.stopMark[stream] = int32(len(s.recMarks))
	}
	return int32(len(s.recMarks))
}

// eventLanded: an append of n's subject (stream 0: member, 1: procedure)
// was stored at sequence seq, having waited queued on the node.
func (s *sim) eventLanded(n *node, stream int, mark int32, seq uint64, queued time.Duration) {
	raw := s.srv(s.now) - queued
	if queued > 0 {
		s.anyQueued = true
	}
	mono := raw
	if n.recSeen[stream] && n.lastRec[stream] > mono {
		mono = n.lastRec[stream]
	}
	n.lastRec[stream], n.recSeen[stream] = mono, true
	if mark == 0 {
		return
	}
	rm := s.recMarks[mark-1]
	if stream == 0 && rm.key != (chainKey{}) {
		if n.named == nil {
			n.named = map[chainKey]bool{}
		}
		n.named[rm.key] = true
	}
	if rm.outage < 0 || !rm.date {
		return
	}
	o := &s.inv.orec[rm.outage]
	d := recDate{raw: raw, mono: mono, seq: seq, ok: true}
	if rm.to {
		o.to[rm.stream] = d
	} else {
		o.from[rm.stream] = d
	}
}

// registerLanded: n's unfenced register write, sent at sent, landed.
func (s *sim) registerLanded(n *node, w *failover.Write, rev uint64, sent time.Duration) {
	if w.Leader.Site != n.site || w.Leader.Fenced {
		return
	}
	at := s.srv(s.now)
	if k := len(n.recWrites); k > 0 && n.recWrites[k-1].at > at {
		n.recUnsorted = true // the server's clock stepped back
	}
	n.recWrites = append(n.recWrites, landing{term: w.Leader.Term, at: at, rev: rev})
	if n.stopOutage > 0 && sent <= n.stopAt {
		if o := &s.inv.orec[n.stopOutage-1]; o.term == w.Leader.Term {
			o.inflight, o.inflightRev = at, rev
			return
		}
	}
	n.evTerm, n.evLanded, n.evRev, n.evOK = w.Leader.Term, at, rev, true
}

// outageOpened: n's stop (or its process going) opened outage i.
func (s *sim) outageOpened(n *node, i int, event bool) {
	o := outageRec{node: int8(n.idx), event: event, fromSrv: s.srv(s.now), evidence: -1, inflight: -1}
	if n.m != nil {
		o.term = n.m.Term()
	}
	if n.evOK && n.evTerm == o.term {
		o.evidence, o.evidenceRev = n.evLanded, n.evRev
	}
	for _, m := range n.stopMark {
		if event && m > 0 {
			s.recMarks[m-1].outage = int32(i)
		}
	}
	if m := n.stopMark[1]; event && m > 0 {
		o.fromKey = s.recMarks[m-1].key
	}
	s.inv.orec = append(s.inv.orec, o)
	n.stopOutage, n.stopAt = int32(i+1), s.now
}

// recordLost: a NATS power cut lost what the server acknowledged after its
// last sync; the record no longer holds it.
func (s *sim) recordLost() {
	seq, rev := s.server.syncedSeq, s.server.syncedRev
	for i := range s.inv.orec {
		o := &s.inv.orec[i]
		for k := range 2 {
			if o.from[k].ok && o.from[k].seq > seq {
				o.from[k].ok = false
			}
			if o.to[k].ok && o.to[k].seq > seq {
				o.to[k].ok = false
			}
		}
		if o.inflight >= 0 && o.inflightRev > rev {
			o.inflight = -1
		}
		if o.evidence >= 0 && o.evidenceRev > rev {
			o.evidence = s.lastUnfencedBefore(s.nodes[o.node].site, o.term, o.fromSrv)
		}
	}
	for _, n := range s.nodes {
		if n.evOK && n.evRev > rev {
			n.evOK = false
		}
		n.recWrites = slices.DeleteFunc(n.recWrites, func(l landing) bool { return l.rev > rev })
		for k := range 2 {
			n.recSeen[k] = false
			if recs := s.server.records(n.apps[k].subject); len(recs) > 0 {
				r := recs[len(recs)-1]
				n.lastRec[k], n.recSeen[k] = r.Time.Sub(s.server.opts.Start)-r.Queued(), true
			}
		}
	}
}

// lastUnfencedBefore finds, in the server's journal, the landing of site's
// last unfenced register write of term before at (-1: none).
func (s *sim) lastUnfencedBefore(site string, term uint64, at time.Duration) time.Duration {
	key := failover.LeaderKey(s.rules.Pair)
	for i := len(s.server.journal) - 1; i >= 0; i-- {
		e := s.server.journal[i]
		t := e.Time.Sub(s.server.opts.Start)
		if e.Key != key || t > at {
			continue
		}
		if l, err := failover.DecodeLeader(e.Value); err == nil && l.Site == site && l.Term == term && !l.Fenced {
			return t
		}
	}
	return -1
}

// recordView dates every outage as the record does (see above) and
// returns the total and the longest.
func (s *sim) recordView() (total, longest time.Duration) {
	stopBound := s.rules.StopBound()
	end := s.now // the export's window ends at virtual time, as its header says
	prevTo, run := time.Duration(-1), time.Duration(0)
	// A serving the record dates earlier than a previous outage's end (its
	// wait inflated by a forward clock jump before it landed) ends that
	// outage in the record: the end of each outage is the earliest recorded
	// end of it and of every outage after it.
	ends := make([]time.Duration, len(s.inv.outages))
	for i := len(s.inv.outages) - 1; i >= 0; i-- {
		ends[i] = -1
		o, r := &s.inv.outages[i], &s.inv.orec[i]
		if !o.Open {
			if to, ok := dated(s, r.to, s.nodes[r.toNode], r.toKey); ok {
				// Not before the serving's acquire landed, as the replay
				// dates it (a forward jump of the node's clock while the
				// event waited makes its wait look longer).
				ends[i] = max(to, s.acquireLanding(s.nodes[r.toNode], r.toTerm))
			}
		}
		if i+1 < len(ends) && ends[i+1] >= 0 && (ends[i] < 0 || ends[i+1] < ends[i]) && !o.Open {
			ends[i] = ends[i+1]
		}
	}
	for i := range s.inv.outages {
		o, r := &s.inv.outages[i], &s.inv.orec[i]
		from, recorded := dated(s, r.from, s.nodes[r.node], r.fromKey)
		switch {
		case recorded:
			// In time, as the replay judges it: by the site's last unfenced
			// register write of the term that landed before the stop's date
			// (whenever it was sent: the date is late by the append's
			// latency, and the record cannot tell).
			cut := s.nodes[r.node].writeBefore(r.term, from)
			if cut < 0 || from <= cut+stopBound {
				o.FromBasis = "recorded"
				break
			}
			o.FromBasis = "late"
			from = max(r.fromSrv, cut)
		default:
			o.FromBasis = "down"
			if r.event {
				o.FromBasis = "lost"
			}
			from = max(r.fromSrv, r.evidence, r.inflight)
		}
		from = max(from, prevTo)
		var to time.Duration
		switch {
		case o.Open:
			o.ToBasis, to = "open", end
		default:
			if ends[i] >= 0 {
				o.ToBasis, to = "recorded", ends[i]
				break
			}
			o.ToBasis, to = "lost", r.toSrv
		}
		to = max(to, from)
		if i == 0 || from > prevTo {
			run = 0
		}
		// Outages the record shows no serving between (none, in its time)
		// are one to it.
		run += to - from
		prevTo = to
		o.From, o.To, o.MS = from.Seconds(), to.Seconds(), msOf(to-from)
		total += to - from
		longest = max(longest, run)
	}
	return total, longest
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
