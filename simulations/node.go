package simulations

import (
	"time"

	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/events"
)

// pendingWrite remembers a write a member or a liveness writer issued, to
// notice late answers.
type pendingWrite struct {
	op       uint64
	deadline time.Duration
	kind     failover.WriteKind
}

// remember keeps write wr in ring, in place of the oldest (*next counts
// the writes issued).
func remember(ring []pendingWrite, next *int, wr *failover.Write) {
	ring[*next%len(ring)] = pendingWrite{op: wr.Op, deadline: wr.Deadline, kind: wr.Kind}
	*next++
}

// answered finds the write r answers in ring (a machine's or a member's),
// forgets it and counts a late answer by the machine's clock; false: not
// remembered.
func (w *world) answered(m *machine, ring []pendingWrite, r *failover.WriteResult) (pendingWrite, bool) {
	for i := range ring {
		p := ring[i]
		if p.op != r.Op || p.op == 0 {
			continue
		}
		if r.Err == failover.WriteOK && m.clk.local(w.now) > p.deadline {
			w.count(cLateAck)
		}
		ring[i].op = 0
		return p, true
	}
	return pendingWrite{}, false
}

// dirState is one direction of a node's link to NATS: FIFO, with the
// faults in force.
type dirState struct {
	last    time.Duration // delivery time of the latest message: FIFO
	base    time.Duration // the link's own one-way latency
	drop    int           // partitions in force (down): messages are dropped
	stall   int           // stalls in force: messages are held
	buffer  int           // partitions in force (up): the client buffers its publishes until it reconnects
	wlast   time.Duration // delivery time of the latest watch delivery (a lagging watch has a FIFO of its own)
	loss    int           // per mille, summed over loss faults in force
	extra   time.Duration // latency faults in force
	held    []int32
	dropped bool // something was dropped since the last heal
}

// available: the database serves and is not being stopped.
func (n *node) available() bool { return n.serving && !n.stopping }

func (d *dirState) clear() bool { return d.drop == 0 && d.stall == 0 && d.buffer == 0 }

// node is one member of a pair on one machine (a site): the failover
// member and its resource's procedure runner, hosted by the machine's
// process, which it shares with the other pairs' members there. The
// machine's fields (index, site, clock, link, process state, watch) are
// reached through embedding.
type node struct {
	*machine
	primary bool

	alive  bool // the member runs
	halted bool // its member stopped for good (append conflict); the process runs on
	starts int

	m      *failover.Member
	runner *procedure.Runner
	curRun uint64 // the step whose completion has a physical effect
	apps   [2]appender

	serving      bool
	servingSince time.Duration
	stopping     bool          // a fence or demote chain runs on the serving database
	takeover     int           // 1 + index of the takeover it won and has not yet served (0: none)
	endOutage    int32         // 1 + index of the outage its serving ended, while it stays available (0: none)
	unavailAt    time.Duration // the latest time it stopped being available

	// What the record shows (record.go).
	stopMark    [2]int32          // 1 + the record mark of the stop event of its current serving, by subject (0: none yet)
	named       map[chainKey]bool // the chains its landed member events name
	recWrites   []landing         // its unfenced register writes that landed, in order
	recUnsorted bool              // ... not in server-time order (the server's clock stepped back)
	stopOutage  int32             // 1 + index of the latest outage its stop opened (0: none)
	stopAt      time.Duration     // when
	evTerm      uint64            // its last unfenced register write that landed: term,
	evLanded    time.Duration     // server time,
	evRev       uint64            // revision
	evOK        bool
	lastRec     [2]time.Duration // the record date of the latest event on its member and procedure subjects
	recSeen     [2]bool

	tickGen uint64
	tickAt  time.Duration
	tickSet bool
	// liveSeen: the seq of the latest item of its machine's liveness log
	// it took in (takeLive).
	liveSeen uint64
	liveBuf  []failover.Input // reused by step

	pending     [16]pendingWrite
	pendingNext int

	// The replicating database (database mode only, see database.go).
	db database

	// Invariant bookkeeping.
	wsStart           time.Duration // writes issued in the window starting here
	wsCount           int
	wsReported        bool
	lastAvailUnfenced time.Duration // landing of its latest unfenced register write (or lease renewal) sent while available
	lastAcquired      time.Duration // landing of its latest acquire
	downAt            time.Duration
	lastLanded        time.Duration // the node's latest register write (or lease renewal) landed
	lastBeatLanded    time.Duration // ... and its latest heartbeat (or its node's liveness write)
	lastUnfenced      time.Duration // ... of those with fenced = false
	unfenced          bool
	wins              int // acquires won
	jumpUntil         time.Duration
	jumpWins          int
}

func (s *sim) newNode(m *machine) *node {
	n := &node{machine: m, primary: m.site == s.rules.Primary}
	n.apps[0].subject = failover.Subject(s.rules.Pair, m.site)
	n.apps[1].subject = procedure.Subject(s.resource(m.site))
	return n
}

func (s *sim) resource(site string) string { return s.rules.Pair + "." + site }

// startMember starts a node's member with its (re)started process: a
// fresh member replays its event subject from the log (when NATS is
// reachable; otherwise it starts without history, as the runtime does),
// then Start brings it up fenced.
func (s *sim) startMember(n *node) {
	n.alive, n.halted = true, false
	n.nAlive++
	opts := s.opts
	if s.nodeMode {
		opts.Node = n.name
	}
	m, err := failover.NewMember(n.site, s.rules, opts)
	if err != nil {
		panic("simulator: rules were validated: " + err.Error())
	}
	n.m = m
	n.apps[0] = appender{subject: n.apps[0].subject}
	n.apps[1] = appender{subject: n.apps[1].subject}
	replayed := 0
	if s.reachable(n.machine) {
		for _, rec := range s.server.records(n.apps[0].subject) {
			n.apps[0].last, n.apps[0].known = rec.Sequence, true
			ev, err := s.codec.DecodeRecord(rec)
			if err != nil {
				continue
			}
			if _, unknown := ev.(*events.Unknown); unknown {
				continue
			}
			m.Apply(ev)
			replayed++
		}
		if !n.apps[0].known {
			n.apps[0].known = true // empty subject: last sequence 0
		}
	}
	n.runner = procedure.NewRunner(s.resource(n.site), s.spec)
	n.curRun = 0
	if n.starts > 0 {
		s.count(cRestartFenced)
		s.tracef(n.site, "process restarts (replayed %d events, term %d)", replayed, m.Term())
	}
	n.starts++
	s.tr.u64(uint64(replayed))
	n.liveSeen = n.livesSeq // what the node saw before, its watch delivers again
	s.handle(n, m.Start(n.clk.local(s.now)))
}

// halt stops a node's member for good while its process runs on: the
// resource is fenced (modelled as stopping at once), the member takes no
// more input, its appenders stop; what its NATS client holds still goes
// out when the connection is back.
func (s *sim) halt(n *node) {
	s.stopMember(n)
	n.halted = true
	if !s.hosts(n.machine) {
		s.processGone(n.machine) // the process runs on with nothing to watch for
	}
	if s.db != nil {
		s.dbGone(n, false)
	}
}

// stopMember stops a node's member: its process died, or it stopped for
// good (halt).
func (s *sim) stopMember(n *node) {
	if !n.alive {
		return
	}
	s.setServing(n, false, "process gone")
	n.alive = false
	n.nAlive--
	n.m, n.runner, n.curRun = nil, nil, 0
	n.apps[0] = appender{subject: n.apps[0].subject}
	n.apps[1] = appender{subject: n.apps[1].subject}
	n.tickSet = false
	n.downAt = s.now
	s.inv.checkArm(s)
}

// entryInput turns a KV entry of the pair into a member input, as the
// runtime's watch does (nil: not one of the pair's keys, or a value that
// does not decode — the simulator writes none).
func (s *sim) entryInput(e events.Entry) failover.Input {
	in, _ := failover.InputOf(s.rules.Pair, e)
	if lo, ok := in.(failover.LeaderObserved); ok && !lo.Entry.Corrupt {
		lo.Entry = s.leaderEntry(e.Revision, e.Time, lo.Entry.Value, s.forged[e.Revision])
		return lo
	}
	return in
}

// onWriteResult notices, before the member does, what a write's answer says.
func (s *sim) onWriteResult(n *node, r *failover.WriteResult) {
	p, ok := s.answered(n.machine, n.pending[:], r)
	if !ok {
		return
	}
	if p.kind == failover.WriteBeat && r.Err == failover.WriteConflict && r.Current != nil &&
		r.Current.Value.Site == n.site && r.Current.Value.Term == n.m.Term() {
		s.count(cOwnLateWrite)
	}
	if p.kind == failover.WriteBump && r.Err == failover.WriteConflict && r.CurrentLive != nil && r.CurrentLive.Value.Own() {
		// Node leadership: the raise of a stale holder node's epoch
		// found that the node had written since — the takeover's first
		// compare-and-set is the one that rejects a lagging follower.
		s.count(cPromotionRejected)
	}
}

// onMemberEvent counts what a member's events show.
func (s *sim) onMemberEvent(n *node, ev events.Event) {
	switch e := ev.(type) {
	case *failover.HeartbeatFailed:
		if n.jumping {
			s.count(cJumpFalseFailure)
		}
	case *failover.HeartbeatRecovered:
		if n.m.Phase() == failover.PhaseLeader {
			s.count(cRiddenOut)
		}
	case *failover.FenceRequested:
		if e.Reason == failover.FenceHeartbeatFailures {
			s.count(cSelfFenced)
		}
	case *failover.PromotionRejected:
		s.count(cPromotionRejected)
	case *failover.AcquireFailed:
		s.count(cAcquireFailed)
	case *failover.Resumed:
		s.count(cResumed)
	case *failover.LeadershipLost:
		s.count(cLeadershipLost)
		if s.forged[e.Rev] || s.replayed[e.Rev] {
			s.count(cLostToForger)
		}
	case *failover.DemotionRequested:
		s.inv.demoteAt = s.now
		if e.Reason == failover.DemoteFailback {
			s.inv.failbackDecided(s, n, e.Handoff)
		}
		if s.db != nil && e.Reason == failover.DemoteFailback {
			s.inv.dbFailback(s, n, e.Handoff)
		}
	case *failover.FenceFailed:
		s.count(cFenceRetried)
	case *failover.PromotionWithheld:
		s.dbWithholds(n, true)
		s.count(cDBWithheld)
	case *failover.AcquireAttempted:
		if s.db != nil {
			s.dbWithholds(n, false)
		}
	case *failover.RejoinFailed:
		s.count(cDBRejoinFailed)
	case *failover.ForgedValueIgnored:
		s.count(cForgedIgnored)
	}
}
