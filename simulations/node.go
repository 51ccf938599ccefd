package simulations

import (
	"math/rand/v2"
	"strconv"
	"time"

	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/events"
)

// pendingWrite remembers a write a member issued, to notice late answers.
type pendingWrite struct {
	op       uint64
	deadline time.Duration
	kind     failover.WriteKind
}

// appender is the runtime's event appender: one append in flight per
// subject, expected last subject sequence and a message id per event
// (events.AppenderMsgID), retried after a timeout. Its queue dies with the
// process.
type appender struct {
	subject  string
	queue    [][]byte
	born     []time.Duration // the node's local clock when each queued event was produced
	marks    []int32         // 1 + the index of the outage a queued serving_started ends (0: none)
	ids      []string        // the random part of each queued event's message id ("": not drawn yet)
	inflight bool
	waiting  bool          // a failed attempt's backoff runs
	backoff  time.Duration // the next backoff (0: the first)
	attempt  uint64
	last     uint64
	known    bool
	stopped  bool
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

// node is one site: a machine with a member process (the failover member
// and its resource's procedure runner), a local clock and a link to NATS.
type node struct {
	idx     int
	site    string
	primary bool
	rng     *rand.Rand
	idRNG   *rand.Rand // draws the random part of its events' message ids (a stream of its own)

	alive   bool   // the member process runs
	halted  bool   // its member stopped for good (append conflict); the process runs on
	nonce   string // its appenders' message-id nonce, one per incarnation
	powered bool
	paused  bool
	holds   int // crash and power-cut faults keeping the process down
	inc     uint32
	starts  int

	m      *failover.Member
	runner *procedure.Runner
	curRun uint64 // the step whose completion has a physical effect
	clk    nodeClock
	up     dirState
	down   dirState
	apps   [2]appender

	serving      bool
	servingSince time.Duration
	stopping     bool  // a fence or demote chain runs on the serving database
	takeover     int   // 1 + index of the takeover it won and has not yet served (0: none)
	endOutage    int32 // 1 + index of the outage its serving ended, while it stays available (0: none)

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

	watch        bool // the KV watch is established
	deliveredRev uint64
	deferred     []item // what arrived while paused
	pauseID      uint64

	pending     [16]pendingWrite
	pendingNext int
	proc        [procedure.ChainSync + 1][5]int // procedure faults in force, by chain kind and mode

	// The replicating database (database mode only, see database.go).
	db database

	// Invariant bookkeeping.
	wsStart           time.Duration // writes issued in the window starting here
	wsCount           int
	wsReported        bool
	lastAvailUnfenced time.Duration // landing of its latest unfenced register write sent while available
	lastAcquired      time.Duration // landing of its latest acquire
	downAt            time.Duration
	lastLanded        time.Duration // the node's latest register write landed
	lastBeatLanded    time.Duration // ... and its latest heartbeat
	lastUnfenced      time.Duration // ... of those with fenced = false
	unfenced          bool
	wins              int // acquires won
	jumping           bool
	jumpUntil         time.Duration
	jumpWins          int
}

func (s *sim) newNode(i int, site string) *node {
	n := &node{idx: i, site: site, primary: site == s.rules.Primary, powered: true}
	n.rng = rand.New(rand.NewPCG(s.cfg.Seed, streamNode+uint64(i)))
	n.idRNG = rand.New(rand.NewPCG(s.cfg.Seed, streamEventID+uint64(i)))
	n.clk = nodeClock{base: time.Duration(n.rng.Int64N(int64(24 * time.Hour))), ppm: n.rng.Int64N(201) - 100}
	span := int64(max(s.maxLat/4, time.Millisecond))
	n.up.base = minLatency + time.Duration(n.rng.Int64N(span))
	n.down.base = minLatency + time.Duration(n.rng.Int64N(span))
	n.apps[0].subject = failover.Subject(s.rules.Pair, site)
	n.apps[1].subject = procedure.Subject(s.resource(site))
	return n
}

func (s *sim) resource(site string) string { return s.rules.Pair + "." + site }

// latency samples one message's one-way latency: the link's base plus a
// jitter (capped at maxLat), plus what latency faults add (±10%).
func (s *sim) latency(n *node, d *dirState) time.Duration {
	j := time.Duration(n.rng.ExpFloat64() * float64(s.maxLat/8))
	lat := min(d.base+j, s.maxLat)
	if d.extra > 0 {
		lat += d.extra - d.extra/10 + time.Duration(n.rng.Int64N(int64(d.extra/5)+1))
	}
	return max(lat, minLatency)
}

// send puts message ref on a node's link, up (to NATS) or down.
func (s *sim) send(n *node, up bool, ref int32) {
	d, kind := &n.down, evDown
	if up {
		d, kind = &n.up, evUp
	}
	if d.drop > 0 {
		d.dropped = true
		s.release(ref)
		return
	}
	if d.stall > 0 || d.buffer > 0 {
		d.held = append(d.held, ref)
		return
	}
	k := s.msgs[ref].kind
	watch := !up && (k == mEntry || k == mSynced)
	var extra time.Duration
	if d.loss > 0 && n.rng.IntN(1000) < d.loss {
		if !watch {
			s.release(ref)
			return
		}
		// The watch runs on TCP: a lost segment is retransmitted, late.
		extra = 200 * time.Millisecond << n.rng.IntN(3)
	}
	at := max(s.now+s.latency(n, d)+extra, d.last)
	if watch {
		// A lagging server applies committed entries late: the watch
		// falls behind the answers, which do not wait for it.
		lag := s.cl.lag[n.idx]
		at = max(at+lag, d.wlast)
		d.wlast = at
		if lag > 0 {
			s.count(cWatchLagged)
			s.push(item{at: at, kind: kind, node: int8(n.idx), ref: ref})
			return
		}
	}
	d.last = at
	s.push(item{at: at, kind: kind, node: int8(n.idx), ref: ref})
}

// flush delivers what a stall held, in order.
func (s *sim) flush(n *node, up bool) {
	d := &n.down
	if up {
		d = &n.up
	}
	held := d.held
	d.held = nil
	for _, ref := range held {
		s.send(n, up, ref)
	}
}

// reachable: the node can talk to a running NATS both ways, and its
// server to the stream leader.
func (s *sim) reachable(n *node) bool {
	return !s.server.down && n.up.clear() && n.down.clear() && s.cl.isolated[n.idx] == 0
}

// start (re)starts a node's member process: a fresh member replays its
// event subject from the log (when NATS is reachable; otherwise it starts
// without history, as the runtime does), then Start brings it up fenced.
func (s *sim) start(n *node) {
	n.powered, n.alive, n.paused, n.halted = true, true, false, false
	n.inc++
	n.nonce = "i" + strconv.FormatUint(uint64(n.inc), 10)
	m, err := failover.NewMember(n.site, s.rules, s.opts)
	if err != nil {
		panic("simulator: rules were validated: " + err.Error())
	}
	n.m = m
	n.apps[0] = appender{subject: n.apps[0].subject}
	n.apps[1] = appender{subject: n.apps[1].subject}
	replayed := 0
	if s.reachable(n) {
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
	s.handle(n, m.Start(n.clk.local(s.now)))
	n.watch, n.deliveredRev = false, 0
	s.resync(n)
	s.armTick(n)
}

// crash kills a node's member process; the resource dies with it (see
// docs/failover.md, "Assumption"). Messages it already sent stay on the
// wire; with power, what the link held is lost too and the machine stays
// off until the fault ends.
func (s *sim) crash(n *node, power bool) {
	if power {
		n.powered = false
	}
	for _, d := range []*dirState{&n.up, &n.down} {
		if !power && d.buffer == 0 {
			continue
		}
		// Lost with the machine, or with the process whose NATS client
		// buffered them while disconnected.
		for _, ref := range d.held {
			s.release(ref)
		}
		d.held = nil
	}
	n.halted = false
	s.stopMember(n)
	if s.db != nil {
		s.dbGone(n, true)
	}
}

// halt stops a node's member for good while its process runs on: the
// resource is fenced (modelled as stopping at once), the member takes no
// more input, its appenders stop; what its NATS client holds still goes
// out when the connection is back.
func (s *sim) halt(n *node) {
	s.stopMember(n)
	n.halted = true
	if s.db != nil {
		s.dbGone(n, false)
	}
}

func (s *sim) stopMember(n *node) {
	if !n.alive {
		return
	}
	s.setServing(n, false, "process gone")
	n.alive, n.paused = false, false
	n.m, n.runner, n.curRun = nil, nil, 0
	for _, it := range n.deferred {
		switch it.kind {
		case evDown, evStepDone, evProcDone:
			s.release(it.ref)
		}
	}
	n.deferred = nil
	n.apps[0] = appender{subject: n.apps[0].subject}
	n.apps[1] = appender{subject: n.apps[1].subject}
	n.watch, n.tickSet = false, false
	n.downAt = s.now
	s.inv.checkArm(s)
}

// pause stops a node's member process (SIGSTOP); what reaches it waits.
func (s *sim) pause(n *node) bool {
	if !n.alive || n.paused {
		return false
	}
	n.paused = true
	n.pauseID++
	s.push(item{at: s.now + s.watchdog(), kind: evWatchdog, node: int8(n.idx), gen: n.pauseID})
	return true
}

// watchdog is how long the resource's watchdog tolerates a silent member:
// short enough that a pause cannot stretch a fence past fence_grace.
func (s *sim) watchdog() time.Duration { return max(s.rules.FenceGrace/5, time.Millisecond) }

func (s *sim) resume(n *node, id uint64) {
	if !n.alive || !n.paused || n.pauseID != id {
		return
	}
	n.paused = false
	items := n.deferred
	n.deferred = nil
	for _, it := range items {
		s.dispatch(it)
	}
	s.armTick(n)
}

// resync (re)establishes a node's watch when it can reach NATS: a new
// watch delivers the current value of every key, then Synced; a resumed
// one delivers what was written since the last revision it delivered (an
// ordered consumer), and the node skips what it has already seen.
func (s *sim) resync(n *node) {
	if !n.alive || !s.reachable(n) {
		return
	}
	pattern := s.rules.Pair + ".>"
	if !n.watch {
		entries, _, err := s.server.kv.Snapshot(pattern, events.WatchOptions{})
		if err != nil {
			panic("simulator: snapshot: " + err.Error())
		}
		for _, e := range entries {
			if in := s.entryInput(e); in != nil {
				s.send(n, false, s.alloc(msg{kind: mEntry, inc: n.inc, rev: e.Revision, in: in}))
			}
		}
		s.send(n, false, s.alloc(msg{kind: mSynced, inc: n.inc}))
		n.watch = true
		return
	}
	n.down.dropped = false
	entries, err := s.server.kv.Changes(pattern, n.deliveredRev)
	if err != nil {
		panic("simulator: changes: " + err.Error())
	}
	for _, e := range entries {
		if in := s.entryInput(e); in != nil {
			s.send(n, false, s.alloc(msg{kind: mEntry, inc: n.inc, rev: e.Revision, in: in}))
		}
	}
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
	for i := range n.pending {
		p := &n.pending[i]
		if p.op != r.Op || p.op == 0 {
			continue
		}
		if r.Err == failover.WriteOK && n.clk.local(s.now) > p.deadline {
			s.count(cLateAck)
		}
		if p.kind == failover.WriteBeat && r.Err == failover.WriteConflict && r.Current != nil &&
			r.Current.Value.Site == n.site && r.Current.Value.Term == n.m.Term() {
			s.count(cOwnLateWrite)
		}
		p.op = 0
		return
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
