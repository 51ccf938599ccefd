package simulations

import (
	"time"

	"understudy/actors/failover"
)

// A node's raises of another node's epoch, as the runtime's host performs
// them (Config.HostRaiseOnce; runtime/liveness.go, raiseDeduper): not
// through the node's bound, and identical raises (same key, same expected
// revision) — every member of the node judging the same dead node stale —
// make one write: those asked for while it flies, or within a heartbeat
// of its answer, share that answer. Without it the model sends each
// member's raise through the bound, one write each: a node taking over
// thousands of pairs queues thousands of raises, of which one lands.

// raiseKey names identical raises.
type raiseKey struct {
	key    string
	expect uint64
}

// raiseFlight is the one write of identical raises.
type raiseFlight struct {
	by       time.Duration // its deadline: unanswered past it, it is forgotten
	answered time.Duration // when its answer came (0: not yet)
	res      failover.WriteResult
	joined   []raiseJoined
}

// raiseJoined is a member's raise waiting for another's answer.
type raiseJoined struct {
	pair int32
	op   uint64
}

// raiseOnce sends member n's raise wr as the node's one write of it, or
// joins the identical raise in flight or just answered; false: the
// model sends it as any member write.
func (s *sim) raiseOnce(n *node, wr *failover.Write) bool {
	if !s.cfg.HostRaiseOnce || wr.Kind != failover.WriteBump {
		return false
	}
	m := n.machine
	k := raiseKey{wr.Key, wr.ExpectRev}
	f := m.raises[k]
	if f != nil && ((f.answered == 0 && s.now >= f.by) || (f.answered > 0 && s.now-f.answered > s.base.HeartbeatTimeout)) {
		f = nil
	}
	if f == nil {
		if m.raises == nil {
			m.raises = map[raiseKey]*raiseFlight{}
		}
		m.raises[k] = &raiseFlight{by: n.clk.virtual(wr.Deadline)}
		ref := s.alloc(msg{kind: mWrite, inc: n.inc, write: *wr, sent: s.now, effect: n.available(), pair: s.pi})
		s.send(m, true, ref)
		return true
	}
	s.count(cRaiseJoined)
	if f.answered == 0 {
		f.joined = append(f.joined, raiseJoined{pair: s.pi, op: wr.Op})
		return true
	}
	s.raiseShare(m, s.pi, wr.Op, f.res)
	return true
}

// raiseAnswered: the answer to a node's one write of identical raises
// reached it (mg); the members that joined it get the same answer.
func (w *world) raiseAnswered(m *machine, mg *msg) {
	k := raiseKey{mg.write.Key, mg.write.ExpectRev}
	f := m.raises[k]
	if f == nil || f.answered > 0 {
		return
	}
	f.answered, f.res = max(w.now, 1), mg.res
	joined := f.joined
	f.joined = nil
	for _, j := range joined {
		w.raiseShare(m, j.pair, j.op, f.res)
	}
}

// raiseShare hands a member (of pair) that joined a raise its answer, as
// an answer reaching the node now.
func (w *world) raiseShare(m *machine, pair int32, op uint64, res failover.WriteResult) {
	res.Op = op
	ref := w.alloc(msg{kind: mWriteResult, inc: m.inc, res: res, pair: pair})
	w.push(item{at: w.now, kind: evDown, node: int8(m.idx), ref: ref})
}
