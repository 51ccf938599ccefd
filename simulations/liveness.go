package simulations

import (
	"time"

	"understudy/actors/failover"
	"understudy/events"
)

// liveRec is a liveness record as a server holds it.
type liveRec struct {
	e     failover.LivenessEntry
	known bool
}

// isLive reports whether a write is of a liveness record (a node's beat or
// a raise of its epoch).
func isLive(wr *failover.Write) bool {
	return wr.Kind == failover.WriteLiveness || wr.Kind == failover.WriteBump
}

// liveIndex is the machine whose node the liveness key names (-1: none).
func (w *world) liveIndex(key string) int {
	node := failover.LivenessNode(key)
	for _, m := range w.machines {
		if m.name == node {
			return m.idx
		}
	}
	return -1
}

// liveStep feeds the machine's liveness writer one input.
func (w *world) liveStep(m *machine, in failover.Input) {
	w.liveHandle(m, m.live.Step(m.clk.local(w.now), in))
	w.armLive(m)
}

// liveHandle carries out what the liveness writer asks: its write onto
// the link, its results to every member of the node, in order.
func (w *world) liveHandle(m *machine, r failover.NodeReady) {
	for i := range r.Writes {
		wr := &r.Writes[i]
		remember(m.livePending[:], &m.liveNext, wr)
		w.send(m, true, w.alloc(msg{kind: mWrite, inc: m.inc, write: *wr, sent: w.now, pair: all}))
	}
	for _, res := range r.Results {
		w.countLivenessFailed(m, res)
		w.stepLive(m, w.logLive(m, res))
	}
}

func (w *world) armLive(m *machine) {
	if !m.running || m.live == nil {
		return
	}
	v := m.clk.virtual(m.live.NextWake())
	if v <= w.now {
		v = w.now + 1
	}
	if m.liveSet && m.liveAt <= v {
		return
	}
	m.liveGen++
	m.liveAt, m.liveSet = v, true
	w.push(item{at: v, kind: evLiveTick, node: int8(m.idx), gen: m.liveGen})
}

// onLiveResult notices, before the liveness writer does, what an answer
// says: a late one, or a conflict with its own late write.
func (w *world) onLiveResult(m *machine, r *failover.WriteResult) {
	if _, ok := w.answered(m, m.livePending[:], r); !ok {
		return
	}
	if r.Err == failover.WriteConflict && r.CurrentLive != nil && r.CurrentLive.Value.Own() && r.CurrentLive.Value.Node == m.name &&
		r.CurrentLive.Value.Epoch == m.live.Epoch() {
		w.count(cOwnLateWrite)
	}
}

// liveWrite applies a liveness write — a node's beat, or a member's raise
// of a node's epoch — fans it out to the watches and answers the writer.
func (w *world) liveWrite(m *machine, ref int32) {
	mg := &w.msgs[ref]
	wr := &mg.write
	res := w.server.write(w.now, wr)
	if !res.ok {
		w.refuseWrite(m, ref, events.KVAPIError(wr.ExpectRev == 0, codeWrongLast, descWrongLast))
		return
	}
	li := w.liveIndex(wr.Key)
	e := failover.LivenessEntry{Rev: res.rev, Time: res.ts, Value: wr.Live}
	if li >= 0 {
		w.live[li] = liveRec{e: e, known: true}
	}
	w.refreshLiveViews()
	if mg.pair < 0 && (!m.running || mg.inc != m.inc) {
		w.count(cZombieWrite)
		w.tracef(m.site, "zombie write landed: %s rev %d (its process is gone)", wr.Kind, res.rev)
	}
	switch {
	case wr.Kind == failover.WriteLiveness && li == m.idx && wr.Live.Own():
		w.tracef(m.site, "liveness rev %d = %v", res.rev, wr.Live)
		for _, s := range w.pairs {
			s.inv.leaseRenewed(s, s.nodes[m.idx], wr.Live.Epoch, mg.sent)
		}
	case wr.Kind == failover.WriteBump:
		w.count(cEpochRaised)
		w.tracef(m.site, "raised %s's epoch to %d (rev %d)", wr.Live.Node, wr.Live.Epoch, res.rev)
	}
	w.tr.u64(res.rev)
	out := failover.WriteResult{Op: wr.Op, Err: failover.WriteOK, Revision: res.rev, Time: res.ts}
	in := failover.LivenessObserved{Node: failover.LivenessNode(wr.Key), Entry: e}
	// The writer's answer and the watch delivery of the same entry race
	// on the writer's connection; either may come first.
	replyFirst := m.rng.IntN(2) == 0
	if !replyFirst {
		w.broadcast(all, res.rev, in)
	}
	w.reply(m, ref, out)
	if replyFirst {
		w.broadcast(all, res.rev, in)
	}
}

// refreshLiveViews: every site connected to a leader with quorum has
// applied the liveness records as they stand.
func (w *world) refreshLiveViews() {
	for i := range w.liveViews {
		if w.cl.connected(i) {
			w.liveViews[i] = w.live
		}
	}
}

// reloadLive re-reads the liveness records after the server lost writes.
func (w *world) reloadLive() {
	for _, m := range w.machines {
		w.live[m.idx] = liveRec{}
		e, err := w.server.kv.Get(bg, failover.LivenessKey(m.name))
		if err != nil {
			continue
		}
		if l, err := failover.DecodeLiveness(e.Value); err == nil {
			w.live[m.idx] = liveRec{e: failover.LivenessEntry{Rev: e.Revision, Time: e.Time, Value: l}, known: true}
		}
	}
	w.refreshLiveViews()
}

// The node's liveness log, as the runtime keeps it (runtime/livelog.go):
// every node's liveness records its watch delivers and its own liveness
// results are logged with when the node saw them, and each member takes
// in what was logged since its last step at the start of its next one,
// dated (failover.LivenessObserved.At) — not a step per member per beat.
// What is not a routine beat (a raised or new epoch, a failed write) has
// every member step at once, taking the log in first.

// liveLogKept is how many items a machine's log keeps (the runtime's
// liveLogSize).
const liveLogKept = 4096

// liveSeen is one item of a machine's liveness log.
type liveSeen struct {
	seq uint64
	in  failover.Input
	at  time.Duration // the node's local time when it saw it (its members share its clock)
}

// logLive logs in (a liveness record or result) on m and reports whether
// every member must take it in now (urgent) rather than at its next step.
func (w *world) logLive(m *machine, in failover.Input) bool {
	m.livesSeq++
	if len(m.lives) >= liveLogKept {
		copy(m.lives, m.lives[len(m.lives)-liveLogKept/2:])
		m.lives = m.lives[:liveLogKept/2]
	}
	m.lives = append(m.lives, liveSeen{seq: m.livesSeq, in: in, at: m.clk.local(w.now)})
	switch in := in.(type) {
	case failover.LivenessObserved:
		prev, ok := m.liveLast[in.Node]
		if m.liveLast == nil {
			m.liveLast = map[string]failover.LivenessEntry{}
		}
		m.liveLast[in.Node] = in.Entry
		return failover.LivenessUrgent(m.name, in, prev, ok, 0)
	case failover.LivenessResult:
		urgent := failover.LivenessUrgent(m.name, in, failover.LivenessEntry{}, false, m.resultEpoch)
		if in.Epoch != 0 {
			m.resultEpoch = in.Epoch
		}
		return urgent
	}
	return true
}

// stepLive has m's members take in its liveness log now: all of them (urgent), or only those that act on
// their node's next routine beat (failover.Member.Prompt); the others
// take it in at their next step.
func (w *world) stepLive(m *machine, urgent bool) {
	for _, s := range w.pairs {
		if n := s.nodes[m.idx]; n.alive && n.m != nil && (urgent || n.m.Prompt()) {
			s.step(n, nil)
		}
	}
}

// takeLive returns what member n's machine's liveness log gained since
// its last step, dated by when the machine saw it, in n.liveBuf: the step
// hands them to the member with its input, in one StepAll.
func (s *sim) takeLive(n *node) []failover.Input {
	m := n.machine
	ins := n.liveBuf[:0]
	if len(m.lives) == 0 || n.liveSeen >= m.livesSeq {
		n.liveSeen = m.livesSeq
		return ins
	}
	first := m.lives[0].seq
	i := 0
	if n.liveSeen >= first {
		i = int(n.liveSeen - first + 1)
	} else if n.liveSeen+1 < first {
		s.count(cLiveMissed)
	}
	n.liveSeen = m.livesSeq
	for _, it := range m.lives[i:] {
		at := it.at
		switch v := it.in.(type) {
		case failover.LivenessObserved:
			v.At = at
			ins = append(ins, v)
		case failover.LivenessResult:
			v.At = at
			ins = append(ins, v)
		default:
			ins = append(ins, v)
		}
	}
	return ins
}
