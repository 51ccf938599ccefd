package simulations

import (
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
		for _, s := range w.pairs {
			if n := s.nodes[m.idx]; n.alive {
				s.step(n, res)
			}
		}
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
