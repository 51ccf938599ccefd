package simulations

import (
	"time"

	"understudy/actors/failover"
)

// The store's disk and the node's connection to it, after a 10,000-pair
// node death on real NATS (runtime 30869e0): the store's disk stalled for
// a second under the takeover's synced writes, the survivor's connection
// heard nothing, its client gave the server up and reconnected, and the
// batch it was sending failed before its commit; taken for a refusal of
// batches, it turned the node's batches off for a minute.
//
// diskstall(nats)@AT+FOR: while it lasts the server serves no write — a
// KV write, a batch, an append, reaching it or queued at its store
// (StoreWriteTime) — and holds them, in arrival order, until it ends; then
// they are served in order (through the store's queue, with a service
// time). The server stays reachable: it answers a new connection. A read
// of a connection whose writes it holds waits behind them (nats-server
// reads a connection's requests in order): it fails when its deadline
// comes before the stall's end. Watch deliveries of entries already
// stored go on.
//
// With HostConnWatch, each machine judges its connection as the runtime's
// deadWatch does (runtime/connect.go): DeadAfter is heartbeat_timeout; a
// check every half ping interval (DeadAfter / 6) hears a pong when the
// link is clear both ways, the server is up and does not hold a write of
// the connection (its read loop would wait behind it), and latency faults
// add less than DeadAfter; any message that reaches the machine on the
// connection is heard too. Silent for more than DeadAfter, the connection
// is kept while a side connection would be answered (the server up, the
// link clear: a busy server, not a dead one) for up to maxBusyFor
// DeadAfters of silence; otherwise — or always, with HostConnNaive — it is
// given up:
//   - every request in flight fails at once, its outcome unknown (nats.go's
//     ForceReconnect fails the requests waiting for an answer): a KV write
//     is answered unavailable, an append retried after its backoff (its
//     subject uncertain), a batch fails as one unanswered by its deadline
//     (batch.go's late batches); those the server received are still
//     applied. No answer of the old connection is read, and what the link
//     held for it is lost;
//   - the client reconnects after a handshake (two round trips), and
//     again at every check while the link or the server is not there;
//     meanwhile it buffers nothing (runtime: ReconnectBufSize(-1)): a
//     request is refused at once, nothing sent — a KV write answered
//     unavailable, an append retried after its backoff, and a batch of
//     two or more is "not committed" (events.ErrBatchNotCommitted);
//   - the watch resumes after the reconnection from the last revision it
//     delivered.
//
// A batch of KV writes not committed sends its writes alone, one after
// the other on its turn, and batches stay on (runtime 30869e0); one of
// appends fails each append, whose appender retries at its own pace
// (nothing uncertain: nothing was sent). With HostConnNaive, as before
// that commit, a batch not committed is taken for a refusal of batches:
// the node sends none of that kind for batchRetry.
//
// Not modelled: the server's per-connection read order beyond the disk
// stall (a read or a ping behind a write the store queues, without a
// stall, is answered at once) and reconnecting to another server of a
// list.

const (
	// maxBusyFor bounds, in DeadAfters, how long a silent connection is
	// kept because its server answers a side connection (the runtime's).
	maxBusyFor = 5
	// batchRetry is how long a refused kind of batch stays off (the
	// runtime's; HostConnNaive only here).
	batchRetry = time.Minute
	// codeNotSent stands for the client's own refusal of an append while
	// it reconnects (nats.ErrReconnectBufExceeded): no JetStream code, no
	// conflict; the appender retries.
	codeNotSent = 503
	// causeGivenUp is the cause of a request in flight on a connection
	// given up.
	causeGivenUp = "nats: connection closed, request in flight failed (connection given up)"
	// causeReconnecting is the cause of a request refused at once.
	causeReconnecting = "nats: connection reconnecting, nothing sent (outbound buffer limit exceeded)"
)

// connWatch: the run models the node's judgement of its connection.
func (w *world) connWatch() bool { return w.cfg.HostConnWatch || w.cfg.HostConnNaive }

// deadAfter is the runtime's DeadAfter: the smallest heartbeat_timeout.
func (w *world) deadAfter() time.Duration { return w.base.HeartbeatTimeout }

// connEvery is the period of a machine's checks of its connection (the
// runtime's deadWatch ticker: half a ping interval of DeadAfter / 3).
func (w *world) connEvery() time.Duration {
	ping := max(w.deadAfter()/3, 10*time.Millisecond)
	return max(ping/2, 10*time.Millisecond)
}

// diskHold holds a write that reached the server (evUp) or its turn at
// the store (evStored) while the disk stalls; false: it goes on.
func (w *world) diskHold(it item) bool {
	if w.diskStall == 0 || w.server.down {
		return false
	}
	switch w.msgs[it.ref].kind {
	case mWrite, mBatch, mAppend:
	default:
		return false
	}
	w.count(cDiskHeld)
	w.diskHeld = append(w.diskHeld, it)
	w.machines[it.node].diskHeld++
	return true
}

// diskResume serves, in order, the writes held while the disk stalled:
// those that had waited their turn at the store at once, the others
// through the store's queue.
func (w *world) diskResume() {
	held := w.diskHeld
	w.diskHeld = nil
	for _, it := range held {
		m := w.machines[it.node]
		m.diskHeld--
		if it.kind == evUp && w.storeQueue(it) {
			continue
		}
		w.atServer(m, it.ref)
	}
}

// diskDrop loses the writes held while the disk stalled (the server went
// down).
func (w *world) diskDrop() {
	for _, it := range w.diskHeld {
		w.machines[it.node].diskHeld = 0
		w.release(it.ref)
	}
	w.diskHeld = nil
}

// connStamp names machine m's current connection in its messages
// (never 0: a message that went on no link).
func connStamp(m *machine) uint32 { return (m.conn+1)<<1 | uint32(m.idx) }

// diskHolds: the server holds a write of machine m's connection while
// its disk stalls, so that the connection's read loop waits behind it (a
// connection opened since is read on its own).
func (w *world) diskHolds(m *machine) bool {
	if w.diskStall == 0 || m.diskHeld == 0 {
		return false
	}
	if !w.connWatch() {
		return true
	}
	for _, it := range w.diskHeld {
		if w.msgs[it.ref].conn == connStamp(m) {
			return true
		}
	}
	return false
}

// onConn stamps message ref with the connection it goes on, up or down
// (an answer keeps its request's), and refuses a request at once while
// the machine reconnects: true, its refusal is queued.
func (w *world) onConn(m *machine, up bool, ref int32) bool {
	mg := &w.msgs[ref]
	if !up {
		if mg.conn == 0 {
			mg.conn = connStamp(m)
		}
		return false
	}
	if !m.reconnecting {
		mg.conn = connStamp(m)
		return false
	}
	switch mg.kind {
	case mWrite:
		mg.kind, mg.res = mWriteResult, failover.WriteResult{Op: mg.write.Op, Err: failover.WriteUnavailable, Cause: causeReconnecting}
	case mAppend:
		*mg = msg{kind: mAppendAck, inc: mg.inc, stream: mg.stream, attempt: mg.attempt, code: codeNotSent, last: mg.last, id: mg.id, pair: mg.pair, slot: mg.slot}
	case mBatch:
		w.batches[mg.batch-1].notCommitted = true
		mg.kind = mBatchResult
	default:
		return false
	}
	w.count(cConnRefusedAtOnce)
	mg.conn = 0 // the client's own answer: heard on no connection
	w.push(item{at: w.now, kind: evDown, node: int8(m.idx), ref: ref})
	return true
}

// heardOn takes message ref reaching machine m: heard on its connection,
// or (false) released, an answer of a connection it gave up.
func (w *world) heardOn(m *machine, ref int32) bool {
	c := w.msgs[ref].conn
	if c == 0 {
		return true
	}
	if c != connStamp(m) {
		w.release(ref)
		return false
	}
	m.heard = w.now
	return true
}

// pongs: a ping of machine m's connection would be answered now.
func (w *world) pongs(m *machine) bool {
	return w.sideAnswers(m) && !w.diskHolds(m) && m.up.extra+m.down.extra < w.deadAfter()
}

// sideAnswers: a new connection of machine m to its server would be
// answered now (the server up, the link clear both ways).
func (w *world) sideAnswers(m *machine) bool {
	return !w.server.down && m.up.clear() && m.down.clear()
}

// connCheck is machine m's judgement of its connection (gen 1: only a
// reconnection attempt); true when it changed something.
func (w *world) connCheck(m *machine, gen uint64) bool {
	if gen == 0 {
		w.push(item{at: w.now + w.connEvery(), kind: evConnCheck, node: int8(m.idx)})
	}
	if !w.hosts(m) || m.paused {
		m.heard = w.now // no client runs, or none judges (SIGSTOP)
		return false
	}
	if m.reconnecting {
		if !w.sideAnswers(m) {
			return false
		}
		m.reconnecting, m.heard = false, w.now
		w.tracef(m.site, "nats reconnected")
		w.resync(m)
		return true
	}
	if gen != 0 {
		return false
	}
	if w.pongs(m) {
		m.heard = w.now
	}
	silent := w.now - m.heard
	switch {
	case silent <= w.deadAfter():
		if m.keptBusy {
			m.keptBusy = false
			w.tracef(m.site, "nats server answers this connection again")
		}
		return false
	case !w.cfg.HostConnNaive && w.sideAnswers(m) && silent <= maxBusyFor*w.deadAfter():
		if !m.keptBusy {
			m.keptBusy = true
			w.count(cConnKeptBusy)
			w.tracef(m.site, "nats server busy: silent for %v, it answers a side connection; kept", silent)
		}
		return false
	}
	w.giveUp(m, silent)
	return true
}

// giveUp: machine m gives its connection up and reconnects.
func (w *world) giveUp(m *machine, silent time.Duration) {
	w.count(cConnGivenUp)
	w.tracef(m.site, "nats server not answering: no pong and no message for %v; connection given up", silent)
	old := connStamp(m)
	m.conn++
	m.reconnecting, m.keptBusy = true, false
	// nats.go's ForceReconnect fails every request waiting for its
	// answer at once: a single KV write or append of the old connection,
	// unanswered or its answer still on the way, is answered failed (an
	// append's subject uncertain: it may have landed), its slot freed.
	for ref := range w.msgs {
		mg := &w.msgs[ref]
		if mg.conn != old || mg.inc != m.inc || mg.batch != 0 {
			continue
		}
		var a msg
		switch mg.kind {
		case mWrite, mWriteResult:
			a = msg{kind: mWriteResult, inc: mg.inc, write: mg.write, pair: mg.pair, slot: mg.slot,
				res: failover.WriteResult{Op: mg.write.Op, Err: failover.WriteUnavailable, Cause: causeGivenUp}}
		case mAppend, mAppendAck:
			a = msg{kind: mAppendAck, inc: mg.inc, stream: mg.stream, attempt: mg.attempt, code: codeNotSent, last: mg.last, id: mg.id, pair: mg.pair, slot: mg.slot}
			w.markAppendUncertain(m, w.appendSubject(m, int32(ref)))
		default:
			continue
		}
		mg.slot = 0
		w.push(item{at: w.now, kind: evDown, node: int8(m.idx), ref: w.alloc(a)})
	}
	type flying struct {
		bi  int32
		gen uint64
	}
	var fl []flying
	for bi := range w.batches {
		if b := &w.batches[bi]; b.sent != 0 && !b.abandoned && int(b.node) == m.idx && b.inc == m.inc {
			fl = append(fl, flying{bi: int32(bi), gen: b.sent})
		}
	}
	for _, f := range fl {
		w.batchDeadline(m, f.bi, f.gen)
	}
	for _, d := range []*dirState{&m.up, &m.down} {
		for _, ref := range d.held {
			w.release(ref)
		}
		d.held = nil
	}
	if m.watch {
		m.down.dropped = true
	}
	w.push(item{at: w.now + 2*(m.up.base+m.down.base), kind: evConnCheck, node: int8(m.idx), gen: 1})
}

// batchesOff (HostConnNaive): machine m's batches of gate g are off, a
// batch of them having been taken for a refusal.
func (w *world) batchesOff(m *machine, g int) bool {
	return w.cfg.HostConnNaive && w.now < m.batchOff[g]
}

// batchNotCommitted: batch request ref (batch bi) could not be sent. Its
// KV writes go alone, one after the other on its turn (a part of one
// write is refused as the write would be); its appends fail, each
// appender retrying at its own pace. HostConnNaive takes it for a refusal:
// no batch of its kind for batchRetry.
func (w *world) batchNotCommitted(m *machine, bi int32, ref int32) {
	b := &w.batches[bi]
	var live []int
	for i := b.lo; i < b.hi; i++ {
		if b.refs[i] >= 0 {
			live = append(live, i)
		}
	}
	if len(live) > 1 {
		w.count(cBatchNotCommitted)
		if w.cfg.HostConnNaive {
			if w.now >= m.batchOff[b.g] {
				w.count(cBatchesOff)
				what := "KV writes"
				if b.g == gateAppends {
					what = "appends"
				}
				w.tracef(m.site, "a batch of %s not committed, taken for a refusal: no batch of them for %v", what, batchRetry)
			}
			m.batchOff[b.g] = w.now + batchRetry
		}
	}
	switch {
	case b.g == gateAppends:
		for _, i := range live {
			r := b.refs[i]
			b.refs[i] = -1
			w.appendFailed(m, r)
			w.release(r)
		}
	case len(live) == 1:
		r := b.refs[live[0]]
		b.refs[live[0]] = -1
		mg := &w.msgs[r]
		mg.kind, mg.res = mWriteResult, failover.WriteResult{Op: mg.write.Op, Err: failover.WriteUnavailable, Cause: causeReconnecting}
		w.atNode(m, item{at: w.now, kind: evDown, node: int8(m.idx), ref: r})
	default:
		for j := len(live) - 1; j >= 0; j-- {
			b.todo = append(b.todo, [2]int{live[j], live[j] + 1})
		}
	}
	w.batchNext(m, ref)
}
