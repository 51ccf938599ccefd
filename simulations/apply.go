package simulations

import (
	"strconv"
	"time"

	"understudy/actors/failover"
)

// faultStart applies fault i of the schedule.
func (s *sim) faultStart(i int) {
	f := s.faults[i]
	s.tracef("fault", "%s begins", f)
	scope := s.scope(f.Site)
	delta := 0
	if !f.instant() {
		delta = 1
	}
	if s.db != nil {
		s.dbFault(f, 1)
	}
	if f.Kind == FaultReplCut || f.Kind == FaultReplLag {
		// A fault of the databases, not of the members or NATS: the calm
		// periods go on (database.go).
		s.push(item{at: f.At + f.For, kind: evFaultEnd, ref: int32(i)})
		return
	}
	if f.Kind == FaultForge {
		// Nor is a forger's: a forged value must change nothing (forge.go).
		s.forgeStart(i)
		return
	}
	s.inv.faultEvent(s, scope, delta)
	switch {
	case f.Kind == FaultIsolate:
		s.isolate(f.Site, 1)
	case f.Kind == FaultLeader:
		s.moveLeader(f.Site)
	case f.Site == NATS:
		s.natsDown(f.Kind == FaultPowerCut)
	default:
		n := s.nodeBySite(f.Site)
		switch f.Kind {
		case FaultPartition, FaultStall, FaultLoss, FaultLatency:
			s.linkFault(n, f, 1)
			if f.For > s.rules.FailoverTimeout && n.alive && !n.m.Holding() {
				// A follower cut off for long: does it stay put?
				s.aux[i] = faultAux{on: true, wins: n.wins}
			}
		case FaultCrash, FaultPowerCut:
			n.holds++
			s.crash(n, f.Kind == FaultPowerCut)
		case FaultPause:
			if s.pause(n) {
				s.aux[i] = faultAux{on: true, pause: n.pauseID}
			}
		case FaultJump:
			n.clk.jump(s.now, f.Value)
			if n.alive && !n.paused {
				if f.Value > s.rules.FailoverTimeout && !n.m.Holding() {
					n.jumpUntil, n.jumpWins = s.now+s.rules.FailoverTimeout+2*s.rules.HeartbeatTimeout, n.wins
				}
				n.jumping = true
				s.step(n, failover.Tick{})
				n.jumping = false
			}
		case FaultServerClock:
		case FaultProc:
			n.proc[f.Chain][f.Mode]++
		case FaultWatchLag:
			s.cl.lag[n.idx] += f.Value
		case FaultSwitchover:
			s.switchover(f.Site)
		}
	}
	if f.Kind == FaultServerClock {
		s.server.offset += f.Value
		s.count(cServerClockBump)
	}
	if delta > 0 && f.For > 0 {
		s.push(item{at: f.At + f.For, kind: evFaultEnd, ref: int32(i)})
	}
}

// faultEnd undoes fault i.
func (s *sim) faultEnd(i int) {
	f := s.faults[i]
	s.tracef("fault", "%s ends", f)
	if s.db != nil {
		s.dbFault(f, -1)
	}
	if f.Kind == FaultReplCut || f.Kind == FaultReplLag {
		return
	}
	s.inv.faultEvent(s, s.scope(f.Site), -1)
	if f.Kind == FaultIsolate {
		s.isolate(f.Site, -1)
		return
	}
	if f.Site == NATS {
		s.natsHolds--
		if s.natsHolds == 0 {
			s.serverUp()
		}
		return
	}
	n := s.nodeBySite(f.Site)
	switch f.Kind {
	case FaultPartition, FaultStall, FaultLoss, FaultLatency:
		s.linkFault(n, f, -1)
		if a := s.aux[i]; a.on && n.alive && n.wins == a.wins && (f.Kind == FaultPartition || f.Kind == FaultStall) {
			s.count(cReplicaCutOff)
		}
	case FaultCrash, FaultPowerCut:
		n.holds--
		if n.holds == 0 && !n.alive {
			s.start(n)
		}
	case FaultPause:
		if a := s.aux[i]; a.on {
			s.resume(n, a.pause)
		}
	case FaultProc:
		n.proc[f.Chain][f.Mode]--
	case FaultWatchLag:
		s.cl.lag[n.idx] -= f.Value
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

func (s *sim) scope(site string) int {
	if n := s.nodeBySite(site); n != nil {
		return n.idx
	}
	return scopeNATS
}

// linkFault adds (delta 1) or removes (-1) a link fault on a node.
func (s *sim) linkFault(n *node, f Fault, delta int) {
	for _, up := range []bool{true, false} {
		d, dir := &n.down, DirDown
		if up {
			d, dir = &n.up, DirUp
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
				s.count(cBufferedFlushed)
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
			s.flush(n, up)
		}
	}
	// A healed link lets a pending watch start, or a watch that lost
	// deliveries resume from where it was.
	if delta < 0 && (!n.watch || n.down.dropped) && s.reachable(n) {
		n.down.dropped = false
		s.resync(n)
	}
}

// natsDown takes the server down (crash, or power cut).
func (s *sim) natsDown(power bool) {
	s.natsHolds++
	if s.natsHolds > 1 {
		return
	}
	s.count(cNatsOutage)
	for _, n := range s.nodes {
		n.down.dropped = true // every connection breaks: watches resume later
	}
	for i := range s.cl.pending {
		s.dropProposals(i) // a restarted leader has not committed them
	}
	lostKV, lostEvents := s.server.stop(s.now, power)
	if lostKV+lostEvents > 0 {
		s.count(cLostAckedWrites)
		s.tracef("nats", "power cut lost %d acknowledged KV writes and %d events (fsync: interval)", lostKV, lostEvents)
		s.reloadRegister()
		s.recordLost()
	} else {
		s.tracef("nats", "down (%s)", map[bool]string{true: "power cut", false: "crash"}[power])
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
func (s *sim) serverUp() {
	s.server.start(s.now)
	s.tracef("nats", "up")
	for _, n := range s.nodes {
		s.resync(n)
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
