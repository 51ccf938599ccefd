package simulations

import (
	"time"

	"understudy/actors/failover"
	"understudy/events"
)

// A node's batches of member KV writes (Config.HostBatch), as the
// runtime's host sends them (runtime/gate.go, cdbd960 and fb8463e)
// through events.KVBatcher: a store that syncs every write syncs a batch
// once, so a node taking over thousands of registers does not wait for
// thousands of syncs one after another.
//
// The rule, on top of the node's bound (throughput.go), whose slots are
// the runtime's workers:
//   - a member KV write waits in the node's queue as before (an epoch
//     raise too, in this model, but it always goes alone; the liveness
//     writer's writes are not gated at all);
//   - when a write's turn comes (a slot frees) with nothing waiting behind
//     it, it goes alone as before; with writes waiting behind it, it goes
//     in a batch: once fewer than hostBatches batches are in flight (until
//     then it holds its slot and waits: parked), the node takes the
//     waiting writes after it, in order, up to HostBatch with distinct
//     keys (a write whose turn comes after half its window is dropped, as
//     before; an epoch raise, or a key already taken, stays waiting where
//     it was), and sends them as one request on its slot (a batch of one
//     goes as a single write, on the batch's turn all the same);
//   - the store serves a batch in one service time (StoreWriteTime) plus
//     batchWritePart per write beyond the first; every write of it lands,
//     at consecutive revisions, or none does (events.MemoryKV.WriteBatch);
//   - a batch refused on a conflict comes back whole; the node splits
//     what it sent in two halves and sends them again, one after the
//     other on the same slot, each as a batch (recursively), a single
//     write alone (its conflict answered with the register's current
//     value, as any write). A part is not sent once the latest deadline
//     of its writes has passed (every member counted its write failed).
//
// The slot, and the batch's turn, are held until the last part is
// answered or the latest deadline of the batch's writes passes, whichever
// comes first; a part not answered by the earliest deadline of its writes
// fails then, as the runtime's context ends (its writes answered failed,
// its slot freed, its answer not read, the parts left after a split not
// sent), and the store may still commit it. With that, the runtime's
// rules for writes known stale or uncertain (fd9708f, abba055; see
// staleWrite and uncertainWrite below).

// HostBatchRuntime is the runtime host's batch size (events.MaxKVBatch).
const HostBatchRuntime = events.MaxKVBatch

const (
	// hostBatches bounds a node's batches in flight (the runtime's
	// maxBatches).
	hostBatches = 4
	// batchWritePart is what each write of a batch beyond the first adds
	// to its service time: the store handles every message of a batch,
	// and syncs once.
	batchWritePart = 10 * time.Microsecond
)

// batchJob is one batch of a node: its writes, the part in flight, and
// the parts still to send after a split.
type batchJob struct {
	g        int             // its gate: gateWrites (member KV writes), or gateAppends (appendbatch.go)
	refs     []int32         // the writes in the order taken (-1: answered or dropped)
	by       []time.Duration // each write's deadline
	lo, hi   int             // the part in flight: refs[lo:hi]
	todo     [][2]int        // parts still to send, the next last
	conflict bool            // the part in flight was refused whole: an expectation failed
	// notCommitted: the part in flight could not be sent, its node's
	// client reconnecting (conn.go).
	notCommitted bool
	// The part in flight: its send (0: none unanswered), its request, the
	// slot it holds, its node's process, and its earliest deadline, past
	// which the node gives up on it (failed, abandoned: its answer is not
	// read).
	sent      uint64
	ref       int32
	tok       uint64
	node      int8
	inc       uint32
	partBy    time.Duration
	abandoned bool
}

// parked is a write whose turn came while hostBatches batches flew: it
// holds slot tok until a batch's turn frees.
type parked struct {
	x   gated
	tok uint64
}

// batchTurn: x's turn came with writes waiting behind it; it takes a
// slot and goes in a batch, now or once a batch's turn frees.
func (w *world) batchTurn(m *machine, x gated) {
	gt := &m.gates[gateWrites]
	w.tokens++
	tok := w.tokens
	if gt.batches < hostBatches {
		w.sendBatch(m, x, tok)
		return
	}
	gt.held[tok] = slotParked
	gt.parked = append(gt.parked, parked{x: x, tok: tok})
}

// unpark gives the batches' turns that are free to the writes parked for
// one, in order; one that waited past its turn is dropped and frees its
// slot.
func (w *world) unpark(m *machine) {
	gt := &m.gates[gateWrites]
	for len(gt.parked) > 0 && gt.batches < hostBatches {
		p := gt.parked[0]
		gt.parked = gt.parked[1:]
		if w.now >= p.x.by || w.now > p.x.issueBy {
			w.count(cNotIssued)
			w.release(p.x.ref)
			delete(gt.held, p.tok)
			continue
		}
		if w.staleWrite(m, p.x.ref) {
			delete(gt.held, p.tok)
			continue
		}
		if w.uncertainWrite(m, p.x.ref) {
			w.count(cUncertain)
			w.sendAlone(m, p.x, p.tok)
			continue
		}
		if w.batchesOff(m, gateWrites) {
			w.sendAlone(m, p.x, p.tok) // conn.go: batches off
			continue
		}
		w.sendBatch(m, p.x, p.tok)
	}
}

// sendBatch takes x and the writes waiting after it into a batch and
// sends it on slot tok.
func (w *world) sendBatch(m *machine, x gated, tok uint64) {
	gt := &m.gates[gateWrites]
	if w.batchKeys == nil {
		w.batchKeys = map[string]struct{}{}
	}
	clear(w.batchKeys)
	w.batchKeys[w.msgs[x.ref].write.Key] = struct{}{}
	bi := w.newBatch()
	b := &w.batches[bi]
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
		wr := &w.msgs[y.ref].write
		if _, dup := w.batchKeys[wr.Key]; dup || isLive(wr) {
			kept = append(kept, y)
			continue
		}
		if w.staleWrite(m, y.ref) {
			continue
		}
		if w.uncertainWrite(m, y.ref) {
			kept = append(kept, y) // alone, at its turn
			continue
		}
		w.batchKeys[wr.Key] = struct{}{}
		b.refs, b.by = append(b.refs, y.ref), append(b.by, y.by)
	}
	gt.wait = append(kept, gt.wait[i:]...)
	gt.held[tok] = slotBatch
	gt.batches++
	by := b.by[0]
	for j, ref := range b.refs {
		by = max(by, b.by[j])
		w.msgs[ref].slot, w.msgs[ref].batch = 0, bi+1
	}
	b.lo, b.hi = 0, len(b.refs)
	ref := w.alloc(msg{kind: mBatch, inc: m.inc, batch: bi + 1, slot: tok, pair: all})
	w.push(item{at: max(by, w.now+1), kind: evSlotDeadline, node: int8(m.idx), ref: gateWrites, gen: tok})
	if len(b.refs) > 1 {
		w.count(cBatchSent)
	}
	w.partSent(m, bi, ref)
	w.send(m, true, ref)
}

// sendAlone sends x on its own on slot tok, which it holds parked.
func (w *world) sendAlone(m *machine, x gated, tok uint64) {
	m.gates[gateWrites].held[tok] = slotAlone
	w.msgs[x.ref].slot = tok
	w.push(item{at: max(x.by, w.now+1), kind: evSlotDeadline, node: int8(m.idx), ref: gateWrites, gen: tok})
	w.send(m, true, x.ref)
}

// newBatch returns the index of an empty batch.
func (w *world) newBatch() int32 {
	if n := len(w.freeBatch); n > 0 {
		bi := w.freeBatch[n-1]
		w.freeBatch = w.freeBatch[:n-1]
		return bi
	}
	w.batches = append(w.batches, batchJob{})
	return int32(len(w.batches) - 1)
}

// freeBatchJob empties batch bi for reuse (its slices kept).
func (w *world) freeBatchJob(bi int32) {
	b := &w.batches[bi]
	*b = batchJob{refs: b.refs[:0], by: b.by[:0], todo: b.todo[:0]}
	w.freeBatch = append(w.freeBatch, bi)
}

// dropBatch forgets batch bi with the writes it still holds (its request
// was lost, or its process is gone): their members count them failed at
// their deadlines.
func (w *world) dropBatch(bi int32) {
	if b := &w.batches[bi]; b.sent != 0 && !b.abandoned && b.g == gateWrites {
		// Its part in flight is lost: the node learns so at the part's
		// deadline, and cannot tell whether it landed (rule 3).
		if m := w.machines[b.node]; m.running && m.inc == b.inc {
			for _, ref := range b.refs[b.lo:b.hi] {
				if ref >= 0 {
					w.markUncertain(m, ref, b.partBy)
				}
			}
		}
	}
	for _, ref := range w.batches[bi].refs {
		if ref >= 0 {
			w.release(ref)
		}
	}
	w.freeBatchJob(bi)
}

// part returns the writes of batch bi's part in flight (in buf's array).
func (w *world) part(bi int32, buf []int32) []int32 {
	b := &w.batches[bi]
	buf = buf[:0]
	for _, ref := range b.refs[b.lo:b.hi] {
		if ref >= 0 {
			buf = append(buf, ref)
		}
	}
	return buf
}

// partLen counts the writes of batch bi's part in flight.
func (w *world) partLen(bi int32) int {
	b := &w.batches[bi]
	n := 0
	for _, ref := range b.refs[b.lo:b.hi] {
		if ref >= 0 {
			n++
		}
	}
	return n
}

// batchService is the store's service time for the batch request ref.
func (w *world) batchService(ref int32) time.Duration {
	n := w.partLen(w.msgs[ref].batch - 1)
	part := batchWritePart
	if w.cfg.StoreBatchWritePart > 0 {
		part = w.cfg.StoreBatchWritePart
	}
	return w.cfg.StoreWriteTime + time.Duration(max(n-1, 0))*part
}

// serveBatch has the stream leader carry out a batch request: a part of
// one write as any write, a larger one atomically; the answer goes back
// on the node's link (a conflict: the part, whole), beside the watch
// deliveries of what landed. The answer is sent last: a link that drops
// it forgets the batch.
func (w *world) serveBatch(m *machine, ref int32) {
	bi := w.msgs[ref].batch - 1
	if w.batches[bi].g == gateAppends {
		w.serveAppendBatch(m, ref)
		return
	}
	part := w.part(bi, nil)
	if len(part) == 1 {
		s := w.pairs[w.msgs[part[0]].pair]
		s.serverWrite(s.nodes[m.idx], part[0])
	} else {
		ws := make([]*failover.Write, len(part))
		for i, r := range part {
			ws[i] = &w.msgs[r].write
		}
		revs, ts, ok := w.server.writeBatch(w.now, ws)
		if !ok {
			w.batches[bi].conflict = true
		}
		for i, r := range part {
			if !ok {
				break
			}
			s := w.pairs[w.msgs[r].pair]
			s.writeServed(s.nodes[m.idx], r, writeResult{ok: true, rev: revs[i], ts: ts})
		}
	}
	// The answer and the watch deliveries race on the node's connection;
	// either may come first.
	fan := w.batchFan
	replyFirst := len(fan) > 0 && m.rng.IntN(2) == 0
	if !replyFirst {
		for _, f := range fan {
			w.broadcast(f.pair, f.rev, f.in)
		}
	}
	w.msgs[ref].kind = mBatchResult
	w.send(m, false, ref)
	if replyFirst {
		for _, f := range fan {
			w.broadcast(f.pair, f.rev, f.in)
		}
	}
	clear(fan)
	w.batchFan = fan[:0]
}

// fanned is a watch delivery held while its batch is served.
type fanned struct {
	pair int32
	rev  uint64
	in   failover.Input
}

// proposeBatch: a leader without quorum (at site at) takes a batch
// request as a proposal (its keys), or refuses it at once — with 10164
// every write of it when a proposal for one of its keys is in flight, as
// a whole when an expectation fails (a part of one write: as any write).
func (w *world) proposeBatch(m *machine, ref int32, at int) ([]string, bool) {
	bi := w.msgs[ref].batch - 1
	if w.batches[bi].g == gateAppends {
		return w.proposeAppendBatch(m, ref, at)
	}
	part := w.part(bi, nil)
	inFlight, wrong := false, false
	keys := make([]string, len(part))
	for i, r := range part {
		wr := &w.msgs[r].write
		keys[i] = wr.Key
		inFlight = inFlight || (!wr.Put && w.cl.inFlight(at, wr.Key))
		wrong = wrong || w.wrongAtLeader(at, w.msgs[r].pair, wr)
	}
	switch {
	case inFlight:
		w.count(cInFlightRefused)
		for _, r := range part {
			wr := &w.msgs[r].write
			w.refuseWrite(m, r, events.KVAPIError(!wr.Put && wr.ExpectRev == 0, codeInFlight, descInFlight))
		}
	case wrong && len(part) == 1:
		wr := &w.msgs[part[0]].write
		w.refuseWrite(m, part[0], events.KVAPIError(!wr.Put && wr.ExpectRev == 0, codeWrongLast, descWrongLast))
	case wrong:
		w.batches[bi].conflict = true
	default:
		return keys, true
	}
	w.msgs[ref].kind = mBatchResult
	w.send(m, false, ref)
	return nil, false
}

// batchAnswered handles a batch's answer at its node: each write's answer
// to its member, or after a conflict the part split in two; then the next
// part, or the slot freed.
func (w *world) batchAnswered(m *machine, it item) {
	ref := it.ref
	if w.msgs[ref].inc != m.inc || !m.running {
		if !m.paused {
			w.answeredSlot(m, ref)
		}
		w.release(ref)
		return
	}
	if m.paused {
		m.deferred = append(m.deferred, it)
		return
	}
	bi := w.msgs[ref].batch - 1
	if b := &w.batches[bi]; b.abandoned {
		// The node gave up on it at its deadline (batchDeadline): its
		// answer is not read, whatever landed.
		w.release(ref)
		return
	}
	w.batches[bi].sent = 0
	if b := &w.batches[bi]; b.notCommitted {
		b.notCommitted = false
		w.batchNotCommitted(m, bi, ref)
		return
	}
	if b := &w.batches[bi]; b.conflict && b.g == gateAppends {
		// Appends: halves, one after the other (appendbatch.go).
		b.conflict = false
		w.count(cAppendBatchSplit)
		w.halve(bi)
	} else if b.conflict {
		b.conflict = false
		w.count(cBatchSplit)
		// Rule 2: the writes the node's watch has seen replaced are
		// answered, and the rest sent again whole; if none is, halves.
		stale := false
		for i := b.lo; i < b.hi; i++ {
			if r := b.refs[i]; r >= 0 && w.staleWrite(m, r) {
				b.refs[i] = -1
				stale = true
			}
		}
		if stale {
			b.todo = append(b.todo, [2]int{b.lo, b.hi})
			w.batchNext(m, ref)
			return
		}
		w.halve(bi)
	} else {
		if w.partLen(bi) == 1 && b.g == gateWrites {
			// A part of one write went alone (the runtime's single):
			// its definite answer ends its key's uncertainty.
			for _, r := range b.refs[b.lo:b.hi] {
				if r >= 0 {
					w.answeredAlone(m, r)
				}
			}
		}
		for i, hi := b.lo, b.hi; i < hi; i++ {
			r := w.batches[bi].refs[i]
			if r < 0 {
				continue
			}
			w.batches[bi].refs[i] = -1
			w.atNode(m, item{at: w.now, kind: evDown, node: int8(m.idx), ref: r})
		}
	}
	w.batchNext(m, ref)
}

// batchNext sends batch request ref's next part, unless the latest
// deadline of its writes has passed (they are dropped); with none left,
// the batch ends and its slot is freed.
func (w *world) batchNext(m *machine, ref int32) {
	bi := w.msgs[ref].batch - 1
	for {
		b := &w.batches[bi]
		if len(b.todo) == 0 {
			break
		}
		p := b.todo[len(b.todo)-1]
		b.todo = b.todo[:len(b.todo)-1]
		live, by := 0, time.Duration(0)
		for i := p[0]; i < p[1]; i++ {
			if b.refs[i] >= 0 {
				live, by = live+1, max(by, b.by[i])
			}
		}
		if live == 0 {
			continue
		}
		if w.now >= by {
			for i := p[0]; i < p[1]; i++ {
				if r := b.refs[i]; r >= 0 {
					b.refs[i] = -1
					w.release(r)
				}
			}
			continue
		}
		b.lo, b.hi = p[0], p[1]
		w.msgs[ref].kind = mBatch
		w.partSent(m, bi, ref)
		w.send(m, true, ref)
		return
	}
	tok, g := w.msgs[ref].slot, w.batches[bi].g
	w.release(ref)
	w.freeSlot(m, g, tok)
}

// halve puts batch bi's part in flight back as its two halves, the first
// to be sent next.
func (w *world) halve(bi int32) {
	b := &w.batches[bi]
	live := w.partLen(bi)
	mid, seen := b.lo, 0
	for ; seen < live/2; mid++ {
		if b.refs[mid] >= 0 {
			seen++
		}
	}
	b.todo = append(b.todo, [2]int{mid, b.hi}, [2]int{b.lo, mid})
}

// The runtime's three rules for writes it knows stale or uncertain
// (runtime/gate.go, fd9708f and abba055), found in a 10,000-pair node
// death: a batch that misses its deadline may still commit; its members
// retry on the revision before their own landed write, and that one
// write fails a whole batch, halved eight times down to it.
//   1. stale: a compare-and-set whose key the node's watch has delivered
//      at a later revision than it expects is answered as a conflict at
//      its turn, without the store (node leadership: the node's watch).
//   2. a batch refused on a conflict answers its writes known stale and
//      sends the rest again whole; only if none is, it is halved.
//   3. uncertain: a part not answered by its earliest deadline fails (the
//      runtime's context ends; its answer, if it comes, is not read) and
//      its keys are uncertain for uncertainFor; a compare-and-set on an
//      uncertain key goes alone, never in a batch, and a definite answer
//      to a write gone alone (landed, or a conflict) ends it.

// uncertainFor is how long a key stays uncertain (the runtime's).
const uncertainFor = 5 * time.Second

// registerWrite: a write of its pair's register.
func registerWrite(wr *failover.Write) bool {
	return wr.Kind == failover.WriteBeat || wr.Kind == failover.WriteAcquire || wr.Kind == failover.WriteRelease
}

// watchSeen records a register revision the machine's watch delivered to
// pair's member (rule 1's seen).
func (w *world) watchSeen(m *machine, pair int32, rev uint64, in failover.Input) {
	if w.cfg.HostBatch <= 0 || !w.nodeMode {
		return
	}
	if _, ok := in.(failover.LeaderObserved); !ok {
		return
	}
	if m.regSeen == nil {
		m.regSeen = make([]uint64, len(w.pairs))
	}
	m.regSeen[pair] = max(m.regSeen[pair], rev)
}

// staleWrite answers member write ref at once as a conflict, without the
// store, when its node's watch has delivered its register at a revision
// past the one it expects (rule 1); false: it goes on.
func (w *world) staleWrite(m *machine, ref int32) bool {
	mg := &w.msgs[ref]
	wr := &mg.write
	if m.regSeen == nil || w.cfg.HostBatchNoStaleRules || mg.pair < 0 || wr.Put || wr.ExpectRev == 0 || !registerWrite(wr) || m.regSeen[mg.pair] <= wr.ExpectRev {
		return false
	}
	w.count(cStale)
	out := w.refusal(m, ref, events.KVAPIError(false, codeWrongLast, descWrongLast))
	mg.kind, mg.res, mg.slot, mg.batch = mWriteResult, out, 0, 0
	w.push(item{at: w.now, kind: evDown, node: int8(m.idx), ref: ref})
	return true
}

// markUncertain records that member write ref's key may have landed
// unanswered, as of from (rule 3).
func (w *world) markUncertain(m *machine, ref int32, from time.Duration) {
	wr := &w.msgs[ref].write
	if isLive(wr) {
		return
	}
	if m.uncertain == nil {
		m.uncertain = map[string]time.Duration{}
	}
	m.uncertain[wr.Key] = from
}

// uncertainWrite reports whether member write ref is a compare-and-set on
// a key whose latest write may have landed unanswered: it goes alone
// (rule 3).
func (w *world) uncertainWrite(m *machine, ref int32) bool {
	if len(m.uncertain) == 0 || w.cfg.HostBatchNoStaleRules {
		return false
	}
	wr := &w.msgs[ref].write
	if wr.Put || wr.ExpectRev == 0 {
		return false
	}
	from, ok := m.uncertain[wr.Key]
	if !ok || w.now < from {
		return false
	}
	if w.now-from > uncertainFor {
		delete(m.uncertain, wr.Key)
		return false
	}
	return true
}

// answeredAlone: the answer to member write ref, gone alone, reached its
// node; a definite one (landed, or a conflict) within its deadline ends
// its key's uncertainty (the runtime's single).
func (w *world) answeredAlone(m *machine, ref int32) {
	mg := &w.msgs[ref]
	if len(m.uncertain) == 0 || mg.kind != mWriteResult || (mg.res.Err != failover.WriteOK && mg.res.Err != failover.WriteConflict) ||
		m.clk.local(w.now) > mg.write.Deadline {
		return
	}
	delete(m.uncertain, mg.write.Key)
}

// partSent records that batch bi's part in flight went as request ref,
// and sets its deadline: its earliest write's, as the runtime's context.
func (w *world) partSent(m *machine, bi int32, ref int32) {
	b := &w.batches[bi]
	by := time.Duration(-1)
	for i := b.lo; i < b.hi; i++ {
		if b.refs[i] >= 0 && (by < 0 || b.by[i] < by) {
			by = b.by[i]
		}
	}
	w.tokens++
	b.sent, b.ref, b.tok, b.node, b.inc, b.partBy = w.tokens, ref, w.msgs[ref].slot, int8(m.idx), m.inc, by
	w.push(item{at: max(by, w.now+1), kind: evBatchDeadline, node: int8(m.idx), ref: bi, gen: b.sent})
}

// batchDeadline: batch bi's part sent as send gen has no answer by its
// earliest deadline. The runtime's batch fails without a definite answer:
// every write of it is answered failed, its keys are uncertain (rule 3),
// its slot is freed and its answer, if it comes, is not read; the store
// may still commit it. The parts left after a split are not sent (their
// writes' turns are past in all but a few cases: the model drops them).
func (w *world) batchDeadline(m *machine, bi int32, gen uint64) {
	if int(bi) >= len(w.batches) {
		return
	}
	b := &w.batches[bi]
	if gen == 0 || b.sent != gen || b.inc != m.inc || !m.running {
		return
	}
	if b.g == gateAppends {
		w.appendBatchDeadline(m, bi)
		return
	}
	w.count(cBatchLate)
	b.sent, b.abandoned = 0, true
	for i := b.lo; i < b.hi; i++ {
		r := b.refs[i]
		if r < 0 {
			continue
		}
		w.markUncertain(m, r, w.now)
		mg := &w.msgs[r]
		res := failover.WriteResult{Op: mg.write.Op, Err: failover.WriteUnavailable, Cause: "context deadline exceeded (its batch was not answered in time)"}
		a := w.alloc(msg{kind: mWriteResult, inc: mg.inc, res: res, pair: mg.pair})
		w.push(item{at: w.now, kind: evDown, node: int8(m.idx), ref: a})
	}
	for _, p := range b.todo {
		for i := p[0]; i < p[1]; i++ {
			if r := b.refs[i]; r >= 0 && (i < b.lo || i >= b.hi) {
				b.refs[i] = -1
				w.release(r)
			}
		}
	}
	b.todo = b.todo[:0]
	tok := b.tok
	w.msgs[b.ref].slot = 0
	w.freeSlot(m, gateWrites, tok)
}
