package simulations

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"understudy/actors/failover"
	"understudy/events"
)

// Leadership is how each node of a run keeps leadership: failover.Leadership.
type Leadership = failover.Leadership

const (
	LeadershipPerPair = failover.LeadershipPerPair
	LeadershipNode    = failover.LeadershipNode
)

// ParseLeadership reads "node" or "per-pair" (failover.ParseLeadership).
func ParseLeadership(s string) (Leadership, error) { return failover.ParseLeadership(s) }

// MaxPairs is the most pairs per node a run may host.
const MaxPairs = 16000

// The world is what the pairs of a run share: the loop (queue, virtual
// time, the trace), the NATS server and cluster, the faults, and the two
// machines. A machine is one site's node: its clock, its link to NATS, its
// process — which hosts one member of every pair (and, with node
// leadership, the node's liveness writer) — and its watch. Each pair (sim)
// keeps its own members, register view, databases and invariants, and
// reaches the world's fields through embedding. With one pair per node in
// per-pair leadership, the run is the single-pair simulation it always
// was, draw for draw.
type world struct {
	cfg       Config
	sc        *Scenario
	base      failover.Rules // the rules of every pair but for its name (pair 0's)
	nodeMode  bool
	end       time.Duration
	now       time.Duration
	seq       uint64
	steps     uint64
	q         queue
	server    *Server
	cl        cluster
	codec     *events.Registry
	machines  [2]*machine
	pairs     []*sim
	pairIdx   map[string]int32 // pair name → index (several pairs)
	pattern   string           // what a machine's watch watches
	msgs      []msg
	free      []int32
	faults    []Fault
	aux       []faultAux
	natsHolds int
	tr        tracer
	tw        io.Writer
	log       *slog.Logger
	counters  [numCounters]int
	viol      []Violation
	stopNow   bool
	attempts  uint64
	maxLat    time.Duration // the links' latency cap
	// The liveness records (node leadership), by machine: as the server
	// holds them, and as each site's server last applied them.
	live      [2]liveRec
	liveViews [3][2]liveRec
	storeFree time.Duration // StoreWriteTime: when the server has served the writes it holds
	tokens    uint64        // the last gate slot token drawn
	batches   []batchJob    // HostBatch: the nodes' batches, by index (batch.go)
	freeBatch []int32       // ... those free for reuse
	batchKeys map[string]struct{}
	batchFan  []fanned // the watch deliveries of a batch's writes, sent beside its answer
	regTail   int      // node leadership: register writes asked for in the run's last tailWindow
	regWrites int      // node leadership: register writes asked for
	// StoreWriteTime: the writes the store served (Result.StoreWrites),
	// those of appends, and the appends they carried.
	storeWrites, storeAppendWrites, storeAppends int
	// diskstall(nats) (conn.go): stalls in force, the latest end of one,
	// and the writes the server holds until then, in arrival order.
	diskStall int
	diskUntil time.Duration
	diskHeld  []item
}

// multi: the run has several pairs (names in traces and violations).
func (w *world) multi() bool { return len(w.pairs) > 1 }

func (w *world) push(it item) {
	w.seq++
	it.seq = w.seq
	w.q.push(it)
}

func (w *world) alloc(m msg) int32 {
	if n := len(w.free); n > 0 {
		ref := w.free[n-1]
		w.free = w.free[:n-1]
		w.msgs[ref] = m
		return ref
	}
	w.msgs = append(w.msgs, m)
	return int32(len(w.msgs) - 1)
}

func (w *world) release(ref int32) {
	if k := w.msgs[ref].kind; k == mBatch || k == mBatchResult {
		w.dropBatch(w.msgs[ref].batch - 1)
	}

	w.msgs[ref] = msg{}
	w.free = append(w.free, ref)
}

func (w *world) count(c counterID) { w.counters[c]++ }

// all: a queue item that concerns every pair (their checkers run after it).
const all = -1

func (w *world) run() {
	for w.q.len() > 0 {
		it := w.q.pop()
		if it.at > w.end {
			break
		}
		if w.cpuWait(it) {
			continue
		}
		w.now = it.at
		w.steps++
		w.tr.item(it)
		if p := w.dispatch(it); p >= 0 {
			s := w.pairs[p]
			s.inv.step(s)
		} else {
			for _, s := range w.pairs {
				s.inv.step(s)
			}
		}
		if w.stopNow {
			return
		}
	}
	w.now = w.end
	for _, s := range w.pairs {
		s.inv.finish(s)
	}
	for _, c := range w.sc.Forbidden {
		if w.counters[c] > 0 {
			w.violate(Violation{Invariant: InvScenario, Detail: fmt.Sprintf("scenario %s: %q must never happen in it, happened %d times", w.sc.Name, c, w.counters[c])})
		}
	}
}

// dispatch carries out one queue item and says which pair it concerned
// (all: every pair, or none in particular).
func (w *world) dispatch(it item) int32 {
	switch it.kind {
	case evTick:
		s := w.pairs[it.ref]
		n := s.nodes[it.node]
		if it.gen != n.tickGen || !n.alive {
			return s.pi
		}
		n.tickSet = false
		if n.paused {
			n.deferred = append(n.deferred, it)
			return s.pi
		}
		s.step(n, failover.Tick{})
		return s.pi
	case evLiveProbe:
		m := w.machines[it.node]
		m.probeQueued = false
		if m.running && !m.paused && m.live != nil {
			w.liveStep(m, failover.LivenessProbe{})
		}
		return all
	case evLiveTick:
		m := w.machines[it.node]
		if it.gen != m.liveGen || !m.running || m.live == nil {
			return all
		}
		m.liveSet = false
		if m.paused {
			m.deferred = append(m.deferred, it)
			return all
		}
		w.liveStep(m, failover.Tick{})
		return all
	case evUp:
		p := w.msgs[it.ref].pair
		if w.diskHold(it) || w.storeQueue(it) {
			return p
		}
		w.atServer(w.machines[it.node], it.ref)
		return p
	case evStored:
		p := w.msgs[it.ref].pair
		if w.diskHold(it) {
			return p
		}
		w.atServer(w.machines[it.node], it.ref)
		return p
	case evSlotDeadline:
		m := w.machines[it.node]
		if m.paused {
			m.deferred = append(m.deferred, it)
			return all
		}
		w.freeSlot(m, int(it.ref), it.gen)
	case evBatchDeadline:
		m := w.machines[it.node]
		if m.paused {
			m.deferred = append(m.deferred, it)
			return all
		}
		w.batchDeadline(m, it.ref, it.gen)
	case evDown:
		p := w.msgs[it.ref].pair
		if w.connWatch() && !w.heardOn(w.machines[it.node], it.ref) {
			return p // the answer of a connection given up: never read
		}
		w.atNode(w.machines[it.node], it)
		return p
	case evConnCheck:
		if !w.connCheck(w.machines[it.node], it.gen) {
			return 0
		}
	case evStarted:
		p := w.msgs[it.ref].pair
		w.started(w.machines[it.node], it)
		return p
	case evStepDone:
		s := w.pairs[w.msgs[it.ref].pair]
		s.stepDone(s.nodes[it.node], it)
		return s.pi
	case evProcDone:
		s := w.pairs[w.msgs[it.ref].pair]
		n := s.nodes[it.node]
		m := &w.msgs[it.ref]
		if !n.alive || m.inc != n.inc {
			w.release(it.ref)
			return s.pi
		}
		if n.paused {
			n.deferred = append(n.deferred, it)
			return s.pi
		}
		d := m.done
		w.release(it.ref)
		s.step(n, failover.ProcedureResult{Kind: failover.ProcKind(d.Kind), Seq: d.Seq, OK: d.OK, Detail: d.Detail})
		return s.pi
	case evAppendTimeout, evAppendRetry:
		s, stream := w.pairs[it.ref>>1], int(it.ref&1)
		n := s.nodes[it.node]
		if n.paused {
			n.deferred = append(n.deferred, it)
			return s.pi
		}
		s.appenderTimer(n, stream, it)
		return s.pi
	case evElection:
		w.election(it.gen)
	case evFaultStart:
		w.faultStart(int(it.ref))
	case evFaultEnd:
		w.faultEnd(int(it.ref))
	case evRestart:
		m := w.machines[it.node]
		if !m.running && m.holds == 0 {
			w.start(m)
		}
	case evWatchdog:
		m := w.machines[it.node]
		if m.running && m.paused && m.pauseID == it.gen {
			w.count(cWatchdogKill)
			w.tracef(m.site, "watchdog: member silent for %v while paused; the unit is killed", w.watchdog())
			w.crash(m, false)
			w.push(item{at: w.now + restartDelay, kind: evRestart, node: it.node})
		}
	case evServerUp:
		w.serverUp()
	case evCommit:
		s := w.pairs[it.ref]
		s.dbCommit()
		return s.pi
	case evDBDone:
		s := w.pairs[it.ref>>1]
		s.dbDone(s.nodes[it.node], it)
		return s.pi
	case evForge:
		w.pairs[0].forgeStart(int(it.ref))
		return 0
	}
	return all
}

// atServer handles a message that reached the machine's NATS server: the
// cluster routes it to the stream leader, to a leader without quorum that
// holds it as a proposal, or nowhere (cluster.go).
func (w *world) atServer(m *machine, ref int32) {
	if w.server.down {
		w.release(ref)
		return
	}
	switch r, at := w.cl.route(m.idx); r {
	case routeDrop:
		w.release(ref)
		return
	case routePropose:
		w.propose(m, ref, at)
		return
	}
	w.serve(m, ref)
}

// serve has the stream leader, with its quorum, carry out a request.
func (w *world) serve(m *machine, ref int32) {
	mg := &w.msgs[ref]
	switch mg.kind {
	case mWrite:
		if isLive(&mg.write) {
			w.liveWrite(m, ref)
			return
		}
		s := w.pairs[mg.pair]
		s.serverWrite(s.nodes[m.idx], ref)
	case mBatch:
		w.serveBatch(m, ref)
	case mAppend:
		w.serveAppend(m, ref)
	default:
		w.release(ref)
	}
}

// serveAppend has the stream leader carry out append ref and answers it
// (in a batch, the batch's answer carries it: appendbatch.go).
func (w *world) serveAppend(m *machine, ref int32) {
	mg := &w.msgs[ref]
	s := w.pairs[mg.pair]
	n := s.nodes[m.idx]
	res := w.server.appendEvent(w.now, n.apps[mg.stream].subject, mg.data, mg.last, mg.known, mg.queued, mg.id, mg.event)
	if res.code == 0 && !res.duplicate {
		s.eventLanded(n, int(mg.stream), mg.mark, res.seq, mg.queued)
	}
	*mg = msg{kind: mAppendAck, inc: mg.inc, stream: mg.stream, attempt: mg.attempt, seq: res.seq, code: res.code, dup: res.duplicate, retried: res.retried, last: res.last, id: res.id, pair: mg.pair, slot: mg.slot, batch: mg.batch}
	if mg.batch != 0 {
		return
	}
	w.send(m, false, ref)
}

// propose: a leader without quorum (at site at) takes a request as a
// proposal it cannot commit, or refuses it at once: 10164 when a proposal
// for the same subject is in flight, 10071 when a conditional write
// expects other than what it holds.
func (w *world) propose(m *machine, ref int32, at int) {
	mg := &w.msgs[ref]
	c := &w.cl
	var key string
	switch mg.kind {
	case mWrite:
		wr := &mg.write
		key = wr.Key
		create := !wr.Put && wr.ExpectRev == 0
		if !wr.Put && c.inFlight(at, key) {
			w.count(cInFlightRefused)
			w.refuseWrite(m, ref, events.KVAPIError(create, codeInFlight, descInFlight))
			return
		}
		if w.wrongAtLeader(at, mg.pair, wr) {
			w.refuseWrite(m, ref, events.KVAPIError(create, codeWrongLast, descWrongLast))
			return
		}
	case mBatch:
		keys, ok := w.proposeBatch(m, ref, at)
		if !ok {
			return
		}
		c.pending[at] = append(c.pending[at], proposal{ref: ref, node: int8(m.idx), keys: keys})
		return
	case mAppend:
		key = w.pairs[mg.pair].nodes[m.idx].apps[mg.stream].subject
		if c.inFlight(at, key) {
			w.count(cInFlightRefused)
			*mg = msg{kind: mAppendAck, inc: mg.inc, stream: mg.stream, attempt: mg.attempt, code: codeInFlight, last: mg.last, id: mg.id, pair: mg.pair, slot: mg.slot}
			w.send(m, false, ref)
			return
		}
	default:
		w.release(ref)
		return
	}
	c.pending[at] = append(c.pending[at], proposal{ref: ref, node: int8(m.idx), key: key})
}

// wrongAtLeader reports whether a leader without quorum (at site at)
// refuses a KV write of pair's member at once (10071): its expectation
// does not hold on the register or liveness record that leader applied.
func (w *world) wrongAtLeader(at int, pair int32, wr *failover.Write) bool {
	create := !wr.Put && wr.ExpectRev == 0
	switch {
	case wr.Put:
	case isLive(wr):
		if li := w.liveIndex(wr.Key); li >= 0 {
			v := &w.liveViews[at][li]
			return (create && v.known) || (!create && wr.ExpectRev != v.e.Rev)
		}
	case pair >= 0 && wr.Key == failover.LeaderKey(w.pairs[pair].rules.Pair):
		v := &w.pairs[pair].views[at]
		return (create && v.known) || (!create && wr.ExpectRev != v.rev)
	}
	return false
}

// refuseWrite answers a KV write the server refused with err, as the
// runtime would: classified by failover.WriteErrOf; after a conflict on
// the register or a liveness record, the key as the machine's own NATS
// server reads it (a cut-off leader's is stale).
func (w *world) refuseWrite(m *machine, ref int32, err error) {
	w.reply(m, ref, w.refusal(m, ref, err))
}

// refusal is refuseWrite's answer to KV write ref, refused with err.
func (w *world) refusal(m *machine, ref int32, err error) failover.WriteResult {
	mg := &w.msgs[ref]
	wr := &mg.write
	out := failover.WriteResult{Op: wr.Op, Err: failover.WriteErrOf(err)}
	switch out.Err {
	case failover.WriteConflict:
		switch {
		case isLive(wr):
			if li := w.liveIndex(wr.Key); li >= 0 {
				if v := w.liveViews[m.idx][li]; v.known {
					e := v.e
					out.CurrentLive = &e
					if v.e.Rev < w.live[li].e.Rev {
						w.count(cStaleRead)
					}
				}
			}
		case mg.pair >= 0:
			s := w.pairs[mg.pair]
			if v := &s.views[m.idx]; wr.Key == failover.LeaderKey(s.rules.Pair) && v.known {
				le := s.leaderEntry(v.rev, v.ts, v.l, v.forged)
				out.Current = &le
				if v.rev < s.top.rev {
					w.count(cStaleRead)
				}
			}
		}
	default:
		out.Cause = err.Error()
	}
	return out
}

func (w *world) reply(m *machine, ref int32, out failover.WriteResult) {
	mg := &w.msgs[ref]
	mg.kind, mg.res = mWriteResult, out
	if mg.batch != 0 {
		return // its batch's answer carries it (batch.go)
	}
	w.send(m, false, ref)
}

func (w *world) violate(v Violation) {
	v.At = w.now.Seconds()
	w.viol = append(w.viol, v)
	w.tr.bytes([]byte(v.Invariant))
	w.log.Warn("invariant violated", "invariant", v.Invariant, "pair", v.Pair, "at", w.now, "detail", v.Detail)
	w.tracef("!!", "VIOLATION %s: %s", v.Invariant, v.Detail)
	if w.cfg.StopAtFirstViolation {
		w.stopNow = true
	}
}

func (w *world) tracef(who, format string, args ...any) {
	if w.tw == nil {
		return
	}
	fmt.Fprintf(w.tw, "%10.3fs %-7s %s\n", w.now.Seconds(), who, fmt.Sprintf(format, args...))
}

// result builds the run's Result: one pair's figures, or every pair's
// together (outages and takeovers named by pair, the longest outage of
// any, the total of all).
func (w *world) result(wall time.Duration) *Result {
	p0 := w.pairs[0]
	r := &Result{
		Scenario: w.sc.Name, Seed: w.cfg.Seed,
		SimulatedSeconds: w.now.Seconds(), WallSeconds: wall.Seconds(),
		Steps: w.steps, Digest: w.tr.sum(), Violations: w.viol,
		Failovers: w.counters[cFailover],
		Fsync:     w.cfg.Fsync.String(), Faults: FormatFaults(w.faults),
	}
	if w.nodeMode {
		r.RegisterWritesTail, r.RegisterWrites = w.regTail, w.regWrites
	}
	r.StoreWrites, r.StoreAppendWrites, r.StoreAppends = w.storeWrites, w.storeAppendWrites, w.storeAppends
	if w.nodeMode || w.multi() {
		r.Leadership = w.cfg.Leadership.String()
	}
	if w.multi() {
		r.Pairs = len(w.pairs)
	}
	var maxGap, totalGap, total, longest time.Duration
	for _, s := range w.pairs {
		r.LeadershipChanges += s.inv.changes
		maxGap, totalGap = max(maxGap, s.inv.maxGap), totalGap+s.inv.totalGap
		t, l := s.recordView()
		total, longest = total+t, max(longest, l)
		for _, o := range s.inv.outages {
			if w.multi() {
				o.Pair = s.rules.Pair
			}
			r.Outages = append(r.Outages, o)
		}
		for _, t := range s.inv.takeovers {
			if w.multi() {
				t.Pair = s.rules.Pair
			}
			r.Takeovers = append(r.Takeovers, t)
		}
	}
	r.TrueMaxUnavailableMS, r.TrueUnavailableMS = msOf(maxGap), msOf(totalGap)
	r.UnavailableMS, r.MaxUnavailableMS = msOf(total), msOf(longest)
	if r.Violations == nil {
		r.Violations = []Violation{}
	}
	if r.Outages == nil {
		r.Outages = []Outage{}
	}
	if r.Takeovers == nil {
		r.Takeovers = []Takeover{}
	}
	if wall > 0 {
		r.Speedup = w.now.Seconds() / wall.Seconds()
	}
	required := w.sc.required(p0.rules)
	for c := counterID(0); c < numCounters; c++ {
		req := required[c]
		if w.counters[c] == 0 && !req {
			continue
		}
		r.Sometimes = append(r.Sometimes, Counter{Name: c.String(), Count: w.counters[c], Required: req})
		if req && w.counters[c] == 0 {
			r.Unexercised = append(r.Unexercised, c.String())
		}
	}
	if r.Sometimes == nil {
		r.Sometimes = []Counter{}
	}
	if r.Unexercised == nil {
		r.Unexercised = []string{}
	}
	return r
}
