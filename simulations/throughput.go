package simulations

import (
	"slices"
	"sort"
	"time"

	"understudy/actors/failover"
)

// The store's throughput (Config.StoreWriteTime) and a node's bound on
// what its members have in flight there (Config.HostWriteBound).
//
// Without a service time the simulated server answers every request after
// link latency only: a burst of writes costs nothing, and a node's
// liveness write is never delayed behind its members' writes. With one,
// the stream leader serves the writes (KV writes and appends) one after
// another in arrival order, each taking StoreWriteTime: a burst queues,
// and what arrives behind it waits.

// HostWriteBoundRuntime is the runtime host's bound (runtime/host.go:
// maxMemberWrites, maxAppends).
const HostWriteBoundRuntime = 64

// gate bounds one kind of a node's member requests in flight: at most
// bound issued and not yet answered nor past their deadline; the others
// wait in arrival order, and one still waiting when its turn is due is
// never issued (the member counts it failed, as any write lost). A KV
// write's turn is due at half its window (runtime 5b6e2d2: one issued
// later lands after its deadline under load, counts failed all the same,
// and is written again — finding N8); an append's at its deadline.
type gate struct {
	held map[uint64]slotKind // the tokens of the slots taken: requests in flight, and (HostBatch) writes waiting for a batch's turn
	wait []gated
	// HostBatch (batch.go): batches in flight, and the writes whose turn
	// came while hostBatches flew, each holding a slot (the runtime's
	// worker) until a batch's turn frees.
	batches int
	parked  []parked
	// Appends with HostBatch (appendbatch.go): the turns taken while the
	// node's member KV writes waited or flew (slotNarrow).
	narrow int
}

// slotKind is what holds a gate slot.
type slotKind uint8

const (
	slotAlone  slotKind = iota // a request on its own
	slotBatch                  // a batch of member writes, or of appends
	slotParked                 // a write waiting for a batch's turn

	// slotNarrow marks an append turn taken while member KV writes
	// waited or flew (appendbatch.go): one of appendsBesideWrites.
	slotNarrow slotKind = 1 << 7
)

type gated struct {
	ref     int32
	by      time.Duration // virtual time of its deadline
	issueBy time.Duration // virtual time after which it is not issued
}

const (
	gateWrites  = 0
	gateAppends = 1
)

// storeQueue has a write that reached the server wait for the writes
// ahead of it (StoreWriteTime each); false: it is served now.
func (w *world) storeQueue(it item) bool {
	if w.cfg.StoreWriteTime <= 0 || w.server.down {
		return false
	}
	service := w.cfg.StoreWriteTime
	switch mg := &w.msgs[it.ref]; mg.kind {
	case mWrite:
	case mAppend:
		w.storeAppendWrites++
		w.storeAppends++
	case mBatch:
		service = w.batchService(it.ref)
		if w.batches[mg.batch-1].g == gateAppends {
			w.storeAppendWrites++
			w.storeAppends += w.partLen(mg.batch - 1)
		}
	default:
		return false
	}
	w.storeWrites++
	done := max(w.now, w.storeFree) + service
	w.storeFree = done
	it.kind, it.at = evStored, done
	w.push(it)
	return true
}

// issue sends a member's request (a KV write or an append) onto its
// node's link, through the node's gate when it has one.
func (w *world) issue(m *machine, g int, ref int32, by time.Duration) {
	if w.cfg.HostWriteBound <= 0 {
		w.send(m, true, ref)
		return
	}
	gt := &m.gates[g]
	if !w.turnFree(m, g) || len(gt.wait) > 0 {
		issueBy := by
		if g == gateWrites && !w.cfg.HostIssueLate {
			issueBy = by - failover.IssueMargin(by-w.now, w.base.HeartbeatTimeout)
		}
		x := gated{ref: ref, by: by, issueBy: issueBy}
		if g == gateWrites && !w.cfg.HostBeatsInOrder && !isMemberBeat(&w.msgs[ref].write) {
			// Register writes before member heartbeats (the runtime's
			// gate): the waiting list holds every register write ahead of
			// every member heartbeat, each part in arrival order.
			i := sort.Search(len(gt.wait), func(i int) bool { return isMemberBeat(&w.msgs[gt.wait[i].ref].write) })
			gt.wait = slices.Insert(gt.wait, i, x)
			return
		}
		gt.wait = append(gt.wait, x)
		return
	}
	if g == gateWrites && w.staleWrite(m, ref) {
		return // its turn: known stale (batch.go, rule 1)
	}
	w.admit(m, g, ref, by)
}

// isMemberBeat: a member's heartbeat, which its node's gate issues after
// the register writes waiting beside it (runtime/gate.go: a member
// heartbeat reports a member's state; a register write decides who
// serves).
func isMemberBeat(wr *failover.Write) bool { return wr.Kind == failover.WriteMemberBeat }

func (w *world) admit(m *machine, g int, ref int32, by time.Duration) {
	w.tokens++
	tok := w.tokens
	w.take(m, g, tok, slotAlone)
	w.msgs[ref].slot = tok
	if g == gateAppends {
		w.appendIssued(m, ref)
	}
	w.push(item{at: max(by, w.now+1), kind: evSlotDeadline, node: int8(m.idx), ref: int32(g), gen: tok})
	w.send(m, true, ref)
}

// freeSlot ends a request's time in flight (answered, or its deadline
// passed) and issues what waited, dropping what waited past its deadline.
func (w *world) freeSlot(m *machine, g int, tok uint64) {
	gt := &m.gates[g]
	kind, ok := gt.held[tok]
	if !ok {
		return
	}
	delete(gt.held, tok)
	if kind&slotNarrow != 0 {
		kind &^= slotNarrow
		gt.narrow--
	}
	if kind == slotBatch {
		gt.batches--
		if g == gateWrites {
			w.unpark(m)
		}
	}
	w.turns(m, g)
	if g == gateWrites && w.appendBatches() && !w.kvBusy(m) {
		w.turns(m, gateAppends) // the appends' narrow turns end
	}
}

// turns issues what waits at one of a node's gates while it has turns
// free, dropping what waited past its deadline.
func (w *world) turns(m *machine, g int) {
	gt := &m.gates[g]
	for len(gt.wait) > 0 && w.turnFree(m, g) {
		x := gt.wait[0]
		if g == gateAppends && w.appendBatchWaits(m, x) {
			break // appendbatch.go: hostBatches batches of appends fly
		}
		gt.wait = gt.wait[1:]
		if w.now >= x.by || w.now > x.issueBy {
			w.count(cNotIssued)
			w.release(x.ref)
			continue
		}
		if g == gateWrites && w.staleWrite(m, x.ref) {
			continue // batch.go, rule 1
		}
		if g == gateWrites && len(gt.wait) > 0 && w.cfg.HostBatch > 1 && !isLive(&w.msgs[x.ref].write) && !w.batchesOff(m, g) {
			if w.uncertainWrite(m, x.ref) {
				w.count(cUncertain) // batch.go, rule 3: alone
				w.admit(m, g, x.ref, x.by)
				continue
			}
			w.batchTurn(m, x)
			continue
		}
		if g == gateAppends && len(gt.wait) > 0 && w.appendBatches() && !w.msgs[x.ref].alone && !w.kvBusy(m) && !w.batchesOff(m, g) {
			w.sendAppendBatch(m, x) // appendbatch.go
			continue
		}
		w.admit(m, g, x.ref, x.by)
	}
}

// turnFree reports whether a node's gate g has a turn free: a slot
// under its bound, and for an append with HostBatch, while the node's
// member KV writes wait or fly, one of appendsBesideWrites.
func (w *world) turnFree(m *machine, g int) bool {
	gt := &m.gates[g]
	if len(gt.held) >= w.cfg.HostWriteBound {
		return false
	}
	return g == gateWrites || !w.appendBatches() || gt.narrow < appendsBesideWrites || !w.kvBusy(m)
}

// kvBusy: a node's member KV writes wait or fly.
func (w *world) kvBusy(m *machine) bool {
	gw := &m.gates[gateWrites]
	return len(gw.held) > 0 || len(gw.wait) > 0
}

// take gives slot tok of a node's gate g to a request (kind), marked
// narrow when it is an append turn taken beside member KV writes.
func (w *world) take(m *machine, g int, tok uint64, kind slotKind) {
	gt := &m.gates[g]
	if gt.held == nil {
		gt.held = map[uint64]slotKind{}
	}
	if g == gateAppends && w.appendBatches() && w.kvBusy(m) {
		kind |= slotNarrow
		gt.narrow++
	}
	gt.held[tok] = kind
}

// answeredSlot frees the slot of a request whose answer reached its node.
func (w *world) answeredSlot(m *machine, ref int32) {
	mg := &w.msgs[ref]
	if mg.slot == 0 {
		return
	}
	g := gateWrites
	if mg.kind == mAppendAck || (mg.kind == mBatchResult && mg.batch != 0 && w.batches[mg.batch-1].g == gateAppends) {
		g = gateAppends
	}
	tok := mg.slot
	mg.slot = 0
	w.freeSlot(m, g, tok)
}

// resetGates forgets what a node's process had in flight or waiting.
func (w *world) resetGates(m *machine) {
	for g := range m.gates {
		for _, x := range m.gates[g].wait {
			w.release(x.ref)
		}
		for _, p := range m.gates[g].parked {
			w.release(p.x.ref)
		}
		m.gates[g] = gate{}
	}
	m.uncertain, m.appendUncertain = nil, nil
}

// countLivenessFailed counts, per member that counts it, a failed
// liveness write of a node whose peer is down while its own link is
// clear: the surviving node's heartbeat failing under load alone. It is
// counted with a store service time only (without one there is no load),
// so that runs without it report what they always did.
func (w *world) countLivenessFailed(m *machine, res failover.Input) {
	if w.cfg.StoreWriteTime <= 0 {
		return
	}
	lr, ok := res.(failover.LivenessResult)
	if !ok || lr.Err == failover.WriteOK || lr.Err == failover.WriteConflict || !w.reachable(m) {
		return
	}
	peer := w.machines[1-m.idx]
	if peer.running {
		return
	}
	for _, s := range w.pairs {
		if s.nodes[m.idx].alive {
			w.count(cSurvivorHeartbeatFailed)
		}
	}
}
