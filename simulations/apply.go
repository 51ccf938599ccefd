package simulations

import (
	"strconv"
	"time"

	"understudy/actors/failover"
)

// faultStart applies fault i of the schedule. A fault of a site hits its
// machine: the process, the link and the clock every member there shares.
func (w *world) faultStart(i int) {
	f := w.faults[i]
	w.tracef("fault", "%s begins", f)
	scope := w.scope(f.Site)
	delta := 0
	if !f.instant() {
		delta = 1
	}
	for _, s := range w.pairs {
		if s.db != nil {
			s.dbFault(f, 1)
		}
	}
	if f.Kind == FaultReplCut || f.Kind == FaultReplLag {
		// A fault of the databases, not of the members or NATS: the calm
		// periods go on (database.go).
		w.push(item{at: f.At + f.For, kind: evFaultEnd, ref: int32(i)})
		return
	}
	if f.Kind == FaultForge {
		// Nor is a forger's: a forged value must change nothing (forge.go).
		// It writes the first pair's keys.
		w.pairs[0].forgeStart(i)
		return
	}
	w.faultEvent(scope, delta)
	switch {
	case f.Kind == FaultIsolate:
		w.isolate(f.Site, 1)
	case f.Kind == FaultLeader:
		w.moveLeader(f.Site)
	case f.Kind == FaultDiskStall:
		w.diskStall++
		w.diskUntil = max(w.diskUntil, f.At+f.For)
	case f.Site == NATS:
		w.natsDown(f.Kind == FaultPowerCut)
	default:
		m := w.machineBySite(f.Site) // nil for a server clock bump
		switch f.Kind {
		case FaultPartition, FaultStall, FaultLoss, FaultLatency:
			w.linkFault(m, f, 1)
			n0 := w.pairs[0].nodes[m.idx] // the counters follow the first pair
			if f.For > w.base.FailoverTimeout && n0.alive && !n0.m.Holding() {
				// A follower cut off for long: does it stay put?
				w.aux[i] = faultAux{on: true, wins: n0.wins}
			}
		case FaultCrash, FaultPowerCut:
			m.holds++
			w.crash(m, f.Kind == FaultPowerCut)
		case FaultPause:
			if w.pause(m) {
				w.aux[i] = faultAux{on: true, pause: m.pauseID}
			}
		case FaultJump:
			w.jump(m, f.Value)
		case FaultServerClock:
		case FaultProc:
			m.proc[f.Chain][f.Mode]++
		case FaultWatchLag:
			w.cl.lag[m.idx] += f.Value
		case FaultSwitchover:
			for _, s := range w.pairs {
				s.switchover(f.Site)
			}
		}
	}
	if f.Kind == FaultServerClock {
		w.server.offset += f.Value
		w.count(cServerClockBump)
	}
	if delta > 0 && f.For > 0 {
		w.push(item{at: f.At + f.For, kind: evFaultEnd, ref: int32(i)})
	}
}

// jump moves a machine's monotonic clock forward by d: every member (and
// the liveness writer) sees the time it missed at once.
func (w *world) jump(m *machine, d time.Duration) {
	m.clk.jump(w.now, d)
	if !m.running || m.paused {
		return
	}
	m.jumping = true
	if m.live != nil {
		w.liveStep(m, failover.Tick{})
	}
	for _, s := range w.pairs {
		n := s.nodes[m.idx]
		if !n.alive {
			continue
		}
		if d > s.rules.FailoverTimeout && !n.m.Holding() {
			n.jumpUntil, n.jumpWins = s.now+s.rules.FailoverTimeout+2*s.rules.HeartbeatTimeout, n.wins
		}
		s.step(n, failover.Tick{})
	}
	m.jumping = false
}

// faultEnd undoes fault i.
func (w *world) faultEnd(i int) {
	f := w.faults[i]
	w.tracef("fault", "%s ends", f)
	for _, s := range w.pairs {
		if s.db != nil {
			s.dbFault(f, -1)
		}
	}
	if f.Kind == FaultReplCut || f.Kind == FaultReplLag {
		return
	}
	w.faultEvent(w.scope(f.Site), -1)
	if f.Kind == FaultIsolate {
		w.isolate(f.Site, -1)
		return
	}
	if f.Kind == FaultDiskStall {
		w.diskStall--
		if w.diskStall == 0 {
			w.diskResume()
		}
		return
	}
	if f.Site == NATS {
		w.natsHolds--
		if w.natsHolds == 0 {
			w.serverUp()
		}
		return
	}
	m := w.machineBySite(f.Site)
	switch f.Kind {
	case FaultPartition, FaultStall, FaultLoss, FaultLatency:
		w.linkFault(m, f, -1)
		n0 := w.pairs[0].nodes[m.idx]
		if a := w.aux[i]; a.on && n0.alive && n0.wins == a.wins && (f.Kind == FaultPartition || f.Kind == FaultStall) {
			w.count(cReplicaCutOff)
		}
	case FaultCrash, FaultPowerCut:
		m.holds--
		if m.holds == 0 && !m.running {
			w.start(m)
		}
	case FaultPause:
		if a := w.aux[i]; a.on {
			w.resume(m, a.pause)
		}
	case FaultProc:
		m.proc[f.Chain][f.Mode]--
	case FaultWatchLag:
		w.cl.lag[m.idx] -= f.Value
	}
}

// faultAux is what a fault's end needs to know about its start.
type faultAux struct {
	on    bool   // it took effect
	wins  int    // the node's acquires won when it began
	pause uint64 // the pause it started
	// A forger's: the term and beat count of its latest forged value; a
	// replaying forger's values to replay (newest first) and how many it
	// wrote.
	fterm, fbeat uint64
	replay       []failover.Leader
	replays      int
}

func (w *world) scope(site string) int {
	if m := w.machineBySite(site); m != nil {
		return m.idx
	}
	return scopeNATS
}

// linkFault adds (delta 1) or removes (-1) a link fault on a machine.
func (w *world) linkFault(m *machine, f Fault, delta int) {
	for _, up := range []bool{true, false} {
		d, dir := &m.down, DirDown
		if up {
			d, dir = &m.up, DirUp
		}
		if !f.Dir.has(dir) {
			continue
		}
		wasClear := d.clear()
		switch {
		case f.Kind == FaultPartition && up:
			// The connection is broken: the NATS client buffers what the
			// member publishes (its reconnect buffer) and flushes it when
			// it reconnects — writes the member gave up on land then.
			d.buffer += delta
			if delta < 0 && d.buffer == 0 && len(d.held) > 0 {
				w.count(cBufferedFlushed)
			}
		case f.Kind == FaultPartition:
			d.drop += delta
		case f.Kind == FaultStall:
			d.stall += delta
		case f.Kind == FaultLoss:
			d.loss += delta * f.Loss
		case f.Kind == FaultLatency:
			d.extra += time.Duration(delta) * f.Value
		}
		if d.clear() && !wasClear {
			w.flush(m, up)
		}
	}
	// A healed link lets a pending watch start, or a watch that lost
	// deliveries resume from where it was.
	if delta < 0 && (!m.watch || m.down.dropped) && w.reachable(m) {
		m.down.dropped = false
		w.resync(m)
	}
}

// natsDown takes the server down (crash, or power cut).
func (w *world) natsDown(power bool) {
	w.natsHolds++
	if w.natsHolds > 1 {
		return
	}
	w.count(cNatsOutage)
	for _, m := range w.machines {
		m.down.dropped = true // every connection breaks: watches resume later
	}
	w.diskDrop() // the writes its disk held are lost with it
	for i := range w.cl.pending {
		w.dropProposals(i) // a restarted leader has not committed them
	}
	lostKV, lostEvents := w.server.stop(w.now, power)
	if lostKV+lostEvents > 0 {
		w.count(cLostAckedWrites)
		w.tracef("nats", "power cut lost %d acknowledged KV writes and %d events (fsync: interval)", lostKV, lostEvents)
		for _, p := range w.pairs {
			p.reloadRegister()
			p.recordLost()
		}
		w.reloadLive()
	} else {
		w.tracef("nats", "down (%s)", map[bool]string{true: "power cut", false: "crash"}[power])
	}
}

// reloadRegister re-reads the register after the server lost writes: the
// latest value, and the latest one the forger did not write.
func (s *sim) reloadRegister() {
	s.regKnown, s.top = false, regView{}
	s.forgetForged(s.server.kv.Revision())
	e, err := s.server.kv.Get(bg, failover.LeaderKey(s.rules.Pair))
	if err != nil {
		return
	}
	l, err := failover.DecodeLeader(e.Value)
	if err != nil {
		return
	}
	s.top = regView{l: l, rev: e.Revision, ts: e.Time, known: true, forged: s.forged[e.Revision]}
	if g := s.genuineBefore(e.Revision+1, false); g != nil {
		s.reg, s.regRev, s.regTime, s.regKnown = g.Value, g.Rev, g.Time, true
	}
	s.refreshViews()
}

// serverUp brings the server back; every watch resumes.
func (w *world) serverUp() {
	w.server.start(w.now)
	w.tracef("nats", "up")
	for _, m := range w.machines {
		w.resync(m)
	}
}

// switchover is an operator's `understudy switchover --to site`.
func (s *sim) switchover(site string) {
	if s.server.down {
		s.tracef("oper", "switchover to %s refused: NATS is down", site)
		return
	}
	s.sw++
	req := failover.Switchover{ID: "sim-" + strconv.Itoa(s.sw), To: site}
	s.server.at(s.now)
	req.Requested = s.server.Now()
	key := failover.SwitchoverKey(s.rules.Pair)
	rev, _ := s.server.put(s.now, key, failover.EncodeSwitchover(req))
	s.tracef("oper", "switchover requested to %s", site)
	s.tr.u64(rev)
	s.fanOut(rev, failover.SwitchoverObserved{Rev: rev, Request: req})
}
