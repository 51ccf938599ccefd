package simulations

import (
	"fmt"
	"time"
)

// A node's batches of event appends (Config.HostBatch, unless
// Config.HostBatchNoAppends), as the runtime's host sends them through
// events.LogBatcher: appends waiting for an append turn go together as
// one JetStream atomic batch on the events stream, which a store that
// syncs every write syncs once.
//
// The rule, on top of the node's bound on appends (throughput.go):
//   - an appender has one append outstanding (appender.go), so the
//     appends of a batch are on distinct subjects (one waiting for a
//     subject already taken, an attempt past its deadline whose retry
//     waits too, stays where it was);
//   - an append whose turn comes with nothing waiting behind it goes
//     alone, as before, and so does one whose turn comes while the
//     node's member KV writes wait or fly (one of appendsBesideWrites
//     turns, one append each: a batch of appends costs the store about
//     what a batch of registers does, and beside the register batches of
//     a 10,000-pair takeover it took half the store from them, runtime
//     adaf933); with appends waiting and no KV write, it takes them,
//     oldest first, up to HostBatch (one past its deadline is dropped, as
//     before), and they go as one request on its turn (a batch of one
//     goes as a single append);
//   - the store serves the batch as it serves a batch of KV writes
//     (batchService): every append of it is stored, at consecutive
//     sequences, or none is — none when one of them would not be stored
//     alone as a new record (its expected subject sequence is stale, or
//     the stream holds its message id: events.ErrConflict,
//     events.ErrBatchDuplicate), or when a leader without quorum holds a
//     proposal on one of its subjects (events.ErrInFlight);
//   - a batch refused so comes back whole and is halved, the halves sent
//     one after the other on the same turn, down to single appends,
//     answered as any append (a duplicate ack, a conflict resolved by the
//     appender, 10164);
//   - a part not answered by the earliest deadline of its appends fails
//     every append of the batch (each appender retries after its
//     backoff, as after a timeout), frees its turn, and is not read if
//     its answer comes; the store may still commit it (batch.go's late
//     batches). Its subjects are uncertain for uncertainFor, as is the
//     subject of an append sent alone and unanswered by its deadline: an
//     append queued on an uncertain subject goes alone at its turn (the
//     runtime's appendUncertain).
//
// Append batches in flight are bounded as KV batches are (hostBatches):
// while that many fly, an append that would go in a batch waits, and
// what is behind it, for one to end; and append turns by the node's
// bound, and by appendsBesideWrites while its member KV writes wait or
// fly.

// appendsBesideWrites bounds a node's append turns while its member KV
// writes wait or fly (the runtime's; with append batches only, as the
// model before them did not hold appends so).
const appendsBesideWrites = 4

// appendBatches: waiting appends go in batches.
func (w *world) appendBatches() bool { return w.cfg.HostBatch > 1 && !w.cfg.HostBatchNoAppends }

// appendBatchWaits reports whether append x, at the head of its node's
// queue, would go in a batch (appends wait behind it; it is neither past
// its deadline nor uncertain) while hostBatches batches of appends fly:
// it waits, and what is behind it, for one of them to end (the runtime's
// maxBatches: JetStream bounds a stream's open batches).
func (w *world) appendBatchWaits(m *machine, x gated) bool {
	gt := &m.gates[gateAppends]
	return w.appendBatches() && !w.kvBusy(m) && !w.batchesOff(m, gateAppends) && gt.batches >= hostBatches && len(gt.wait) > 1 &&
		w.now < x.by && w.now <= x.issueBy && !w.msgs[x.ref].alone
}

// appendSubject is the subject of append request ref of machine m.
func (w *world) appendSubject(m *machine, ref int32) string {
	mg := &w.msgs[ref]
	return w.pairs[mg.pair].nodes[m.idx].apps[mg.stream].subject
}

// sendAppendBatch: x's turn came with appends waiting behind it; it takes
// them into a batch, on one new slot of the node's appends.
func (w *world) sendAppendBatch(m *machine, x gated) {
	gt := &m.gates[gateAppends]
	if w.batchKeys == nil {
		w.batchKeys = map[string]struct{}{}
	}
	clear(w.batchKeys)
	w.batchKeys[w.appendSubject(m, x.ref)] = struct{}{}
	bi := w.newBatch()
	b := &w.batches[bi]
	b.g = gateAppends
	b.refs, b.by = append(b.refs, x.ref), append(b.by, x.by)
	kept := gt.wait[:0]
	i := 0
	for ; i < len(gt.wait) && len(b.refs) < w.cfg.HostBatch; i++ {
		y := gt.wait[i]
		if w.now >= y.by || w.now > y.issueBy {
			w.count(cNotIssued)
			w.release(y.ref)
			continue
		}
		subject := w.appendSubject(m, y.ref)
		if _, dup := w.batchKeys[subject]; dup || w.msgs[y.ref].alone {
			kept = append(kept, y)
			continue
		}
		w.batchKeys[subject] = struct{}{}
		b.refs, b.by = append(b.refs, y.ref), append(b.by, y.by)
	}
	gt.wait = append(kept, gt.wait[i:]...)
	w.tokens++
	tok := w.tokens
	w.take(m, gateAppends, tok, slotBatch)
	gt.batches++
	by := b.by[0]
	for j, ref := range b.refs {
		by = max(by, b.by[j])
		w.msgs[ref].slot, w.msgs[ref].batch = 0, bi+1
		w.appendIssued(m, ref)
	}
	b.lo, b.hi = 0, len(b.refs)
	ref := w.alloc(msg{kind: mBatch, inc: m.inc, batch: bi + 1, slot: tok, pair: all})
	w.push(item{at: max(by, w.now+1), kind: evSlotDeadline, node: int8(m.idx), ref: gateAppends, gen: tok})
	if n := len(b.refs); n > 1 {
		w.count(cAppendBatchSent)
		w.counters[cAppendBatched] += n
	}
	w.partSent(m, bi, ref)
	w.send(m, true, ref)
}

// serveAppendBatch has the stream leader carry out a batch of appends: a
// part of one append as any append, a larger one atomically (refused
// whole: conflict); the answer goes back on the node's link.
func (w *world) serveAppendBatch(m *machine, ref int32) {
	bi := w.msgs[ref].batch - 1
	part := w.part(bi, nil)
	switch {
	case len(part) == 1:
		w.serveAppend(m, part[0])
	case !w.appendable(m, part):
		w.batches[bi].conflict = true
	default:
		for _, r := range part {
			w.serveAppend(m, r)
			if mg := &w.msgs[r]; mg.code != 0 || mg.dup {
				panic(fmt.Sprintf("simulator: an append of an atomic batch checked appendable was answered code %d, duplicate %v", mg.code, mg.dup))
			}
		}
	}
	w.msgs[ref].kind = mBatchResult
	w.send(m, false, ref)
}

// appendable reports whether every append of part would be stored as a
// new record: JetStream's checks of an atomic batch, before it stores any.
func (w *world) appendable(m *machine, part []int32) bool {
	for _, r := range part {
		mg := &w.msgs[r]
		if !w.server.appendable(w.appendSubject(m, r), mg.last, mg.known, mg.id, mg.event) {
			return false
		}
	}
	return true
}

// proposeAppendBatch: a leader without quorum (at site at) takes a batch
// of appends as a proposal (its subjects), or refuses it at once when a
// proposal for one of its subjects is in flight: whole (it is halved),
// a part of one append with 10164, as any append.
func (w *world) proposeAppendBatch(m *machine, ref int32, at int) ([]string, bool) {
	bi := w.msgs[ref].batch - 1
	part := w.part(bi, nil)
	subjects := make([]string, len(part))
	inFlight := false
	for i, r := range part {
		subjects[i] = w.appendSubject(m, r)
		inFlight = inFlight || w.cl.inFlight(at, subjects[i])
	}
	if !inFlight {
		return subjects, true
	}
	w.count(cInFlightRefused)
	if len(part) > 1 {
		w.batches[bi].conflict = true
	} else {
		mg := &w.msgs[part[0]]
		*mg = msg{kind: mAppendAck, inc: mg.inc, stream: mg.stream, attempt: mg.attempt, code: codeInFlight, last: mg.last, id: mg.id, pair: mg.pair, batch: mg.batch}
	}
	w.msgs[ref].kind = mBatchResult
	w.send(m, false, ref)
	return nil, false
}

// appendIssued records that append request ref of machine m was issued
// by its node's gate (alone or in a batch): its appender's attempt, if
// unanswered by its deadline, may have landed.
func (w *world) appendIssued(m *machine, ref int32) {
	mg := &w.msgs[ref]
	if mg.pair < 0 || mg.inc != m.inc {
		return
	}
	w.pairs[mg.pair].nodes[m.idx].apps[mg.stream].issued = mg.attempt
}

// markAppendUncertain records that subject's latest append on machine m
// may have landed unanswered: for uncertainFor its appends go alone (in
// a batch, the retry of an append that landed would refuse it whole).
func (w *world) markAppendUncertain(m *machine, subject string) {
	if !w.appendBatches() {
		return
	}
	if m.appendUncertain == nil {
		m.appendUncertain = map[string]time.Duration{}
	}
	m.appendUncertain[subject] = w.now
}

// appendUncertain reports whether an append on subject queued now on
// machine m goes alone (markAppendUncertain); counted when it does.
func (w *world) appendUncertain(m *machine, subject string) bool {
	at, ok := m.appendUncertain[subject]
	if !ok {
		return false
	}
	if w.now-at > uncertainFor {
		delete(m.appendUncertain, subject)
		return false
	}
	w.count(cAppendUncertain)
	return true
}

// appendBatchDeadline: batch bi of appends has no answer by the earliest
// deadline of its part in flight. Every append of the batch fails (its
// appender retries after its backoff); the part's answer, if it comes, is
// not read; the parts left are not sent; its turn is freed.
func (w *world) appendBatchDeadline(m *machine, bi int32) {
	w.count(cAppendBatchLate)
	b := &w.batches[bi]
	b.sent, b.abandoned = 0, true
	for i, r := range b.refs {
		if r < 0 {
			continue
		}
		if i >= b.lo && i < b.hi {
			w.markAppendUncertain(m, w.appendSubject(m, r))
		}
		w.appendFailed(m, r)
		if i < b.lo || i >= b.hi {
			b.refs[i] = -1
			w.release(r)
		}
	}
	b.todo = b.todo[:0]
	tok := b.tok
	w.msgs[b.ref].slot = 0
	w.freeSlot(m, gateAppends, tok)
}

// appendFailed: append request ref of machine m failed without an
// answer; its appender, if that attempt is still its own, retries after
// its backoff, as after its timeout.
func (w *world) appendFailed(m *machine, ref int32) {
	mg := &w.msgs[ref]
	s := w.pairs[mg.pair]
	n := s.nodes[m.idx]
	a := &n.apps[mg.stream]
	if !n.alive || mg.inc != m.inc || !a.inflight || a.attempt != mg.attempt {
		return
	}
	a.inflight = false
	s.count(cAppendRetried)
	s.retryLater(n, int(mg.stream))
}
