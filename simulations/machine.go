package simulations

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/events"
)

// machine is one site's node: a machine whose process hosts one member of
// every pair, with a local clock and one link to NATS.
type machine struct {
	idx   int
	site  string
	name  string     // the node's name (its liveness key's)
	rng   *rand.Rand // links, procedure timings
	idRNG *rand.Rand // draws the random part of its events' message ids (a stream of its own)
	clk   nodeClock
	up    dirState
	down  dirState

	running bool   // the process runs (a member stopped for good leaves it running)
	nAlive  int    // members alive
	nonce   string // its appenders' message-id nonce, one per incarnation
	powered bool
	paused  bool
	holds   int // crash and power-cut faults keeping the process down
	inc     uint32
	pauseID uint64

	watch        bool // the KV watch is established
	deliveredRev uint64
	deferred     []item // what arrived while paused
	proc         [procedure.ChainSync + 1][5]int
	jumping      bool

	// Node leadership: the node's liveness writer and its timer.
	live        *failover.NodeLiveness
	liveGen     uint64
	liveAt      time.Duration
	liveSet     bool
	livePending [4]pendingWrite
	liveNext    int
	// lives: the liveness records and results the node saw, for its
	// members to take in at their next step (see takeLive); livesSeq: the
	// seq of the latest; liveLast: each node's latest record logged.
	lives    []liveSeen
	livesSeq uint64
	liveLast map[string]failover.LivenessEntry
	// resultEpoch: the epoch of its liveness writer's latest result logged
	// (0: none since it started); probeQueued: a member's liveness probe
	// waits in the queue (evLiveProbe).
	resultEpoch uint64
	probeQueued bool

	// HostWriteBound: its members' KV writes and appends in flight.
	gates [2]gate
	// HostBatch (batch.go): the latest register revision its watch
	// delivered, by pair (node leadership: the runtime gate's seen), and
	// the keys whose latest write may have landed unanswered, with when
	// that became so (the gate's uncertainAt). A process has its own.
	regSeen   []uint64
	uncertain map[string]time.Duration
	// With append batches (appendbatch.go): the subjects whose latest
	// append may have landed unanswered, with when that became so.
	appendUncertain map[string]time.Duration
	// HostRaiseOnce: the raises of other nodes' epochs it has in flight
	// or just answered.
	raises map[raiseKey]*raiseFlight
	// The writes of its connection the store holds while its disk stalls
	// (conn.go), and with HostConnWatch its judgement of the connection:
	// which one it is on (counted from 0), when it last heard anything on
	// it, whether it is reconnecting or kept for a busy server, and until
	// when its batches are off (HostConnNaive, by gate).
	diskHeld     int
	conn         uint32
	heard        time.Duration
	reconnecting bool
	keptBusy     bool
	batchOff     [2]time.Duration

	// Config.CPU (cpu.go): when each core is free next, the steps'
	// starts waiting for a slot (mStep refs) and the starts being served.
	cpu      []time.Duration
	startQ   []int32
	starting int
}

// nodeName is the name of the node at site: node-a for site-a.
func nodeName(site string) string {
	if rest, ok := strings.CutPrefix(site, "site-"); ok && rest != "" {
		return "node-" + rest
	}
	return "node-" + site
}

func (w *world) newMachine(i int, site string) *machine {
	m := &machine{idx: i, site: site, name: nodeName(site), powered: true}
	m.rng = rand.New(rand.NewPCG(w.cfg.Seed, streamNode+uint64(i)))
	m.idRNG = rand.New(rand.NewPCG(w.cfg.Seed, streamEventID+uint64(i)))
	m.clk = nodeClock{base: time.Duration(m.rng.Int64N(int64(24 * time.Hour))), ppm: m.rng.Int64N(201) - 100}
	span := int64(max(w.maxLat/4, time.Millisecond))
	m.up.base = minLatency + time.Duration(m.rng.Int64N(span))
	m.down.base = minLatency + time.Duration(m.rng.Int64N(span))
	return m
}

// hosts: the process runs and hosts something: a member, or the node's
// liveness writer (node leadership).
func (w *world) hosts(m *machine) bool { return m.running && (w.nodeMode || m.nAlive > 0) }

// latency samples one message's one-way latency: the link's base plus a
// jitter (capped at maxLat), plus what latency faults add (±10%).
func (w *world) latency(m *machine, d *dirState) time.Duration {
	j := time.Duration(m.rng.ExpFloat64() * float64(w.maxLat/8))
	lat := min(d.base+j, w.maxLat)
	if d.extra > 0 {
		lat += d.extra - d.extra/10 + time.Duration(m.rng.Int64N(int64(d.extra/5)+1))
	}
	return max(lat, minLatency)
}

// send puts message ref on a machine's link, up (to NATS) or down.
func (w *world) send(m *machine, up bool, ref int32) {
	d, kind := &m.down, evDown
	if up {
		d, kind = &m.up, evUp
	}
	if w.connWatch() && w.onConn(m, up, ref) {
		return // refused at once: the client reconnects (conn.go)
	}
	if d.drop > 0 {
		d.dropped = true
		w.release(ref)
		return
	}
	if d.stall > 0 || d.buffer > 0 {
		d.held = append(d.held, ref)
		return
	}
	k := w.msgs[ref].kind
	watch := !up && (k == mEntry || k == mSynced)
	var extra time.Duration
	if d.loss > 0 && m.rng.IntN(1000) < d.loss {
		if !watch {
			w.release(ref)
			return
		}
		// The watch runs on TCP: a lost segment is retransmitted, late.
		extra = 200 * time.Millisecond << m.rng.IntN(3)
	}
	at := max(w.now+w.latency(m, d)+extra, d.last)
	if watch {
		// A lagging server applies committed entries late: the watch
		// falls behind the answers, which do not wait for it.
		lag := w.cl.lag[m.idx]
		at = max(at+lag, d.wlast)
		d.wlast = at
		if lag > 0 {
			w.count(cWatchLagged)
			w.push(item{at: at, kind: kind, node: int8(m.idx), ref: ref})
			return
		}
	}
	d.last = at
	w.push(item{at: at, kind: kind, node: int8(m.idx), ref: ref})
}

// flush delivers what a stall held, in order.
func (w *world) flush(m *machine, up bool) {
	d := &m.down
	if up {
		d = &m.up
	}
	held := d.held
	d.held = nil
	for _, ref := range held {
		w.send(m, up, ref)
	}
}

// reachable: the machine can talk to a running NATS both ways, and its
// server to the stream leader.
func (w *world) reachable(m *machine) bool {
	return !w.server.down && m.up.clear() && m.down.clear() && w.cl.isolated[m.idx] == 0
}

// storeRead reports whether a read request of the machine's NATS client
// (one message get) is answered before by: it needs the server reachable,
// is lost like any request or answer on a lossy link, and with a store
// service time waits for the writes queued ahead of it (a read costs the
// store nothing itself). It takes no time in the model: the read is done
// where its answer is awaited, as the register read after a CAS conflict.
func (w *world) storeRead(m *machine, by time.Duration) bool {
	if !w.reachable(m) {
		return false
	}
	for _, d := range []*dirState{&m.up, &m.down} {
		if d.loss > 0 && m.rng.IntN(1000) < d.loss {
			return false
		}
	}
	if w.diskUntil >= by && w.diskHolds(m) {
		return false // it waits behind its connection's writes, which wait for the disk (conn.go)
	}
	if w.connWatch() && m.reconnecting {
		return false
	}
	return w.cfg.StoreWriteTime <= 0 || max(w.now, w.storeFree) < by
}

// start (re)starts a machine's process: every member replays its event
// subject and starts fenced (startMember), the node's liveness writer
// starts (node leadership), then the watch.
func (w *world) start(m *machine) {
	m.powered, m.running, m.paused = true, true, false
	m.inc++
	m.nonce = "i" + strconv.FormatUint(uint64(m.inc), 10)
	w.cpuRestart(m)                                          // before its members start their chains
	m.lives, m.liveLast, m.resultEpoch = m.lives[:0], nil, 0 // a new process: a new log (members start at its end)
	for _, s := range w.pairs {
		s.startMember(s.nodes[m.idx])
	}
	if w.nodeMode {
		m.live, m.liveSet = failover.NewNodeLiveness(m.name, w.base.HeartbeatTimeout), false
		w.liveHandle(m, m.live.Start(m.clk.local(w.now)))
	}
	m.watch, m.deliveredRev = false, 0
	m.regSeen, m.uncertain, m.appendUncertain = nil, nil, nil
	m.heard, m.reconnecting, m.keptBusy, m.batchOff = w.now, false, false, [2]time.Duration{}
	w.resync(m)
	for _, s := range w.pairs {
		s.armTick(s.nodes[m.idx])
	}
	if m.live != nil {
		w.armLive(m)
	}
}

// crash kills a machine's process: every member and the liveness writer;
// the resources die with them (see docs/failover.md, "Assumption").
// Messages it already sent stay on the wire; with power, what the link
// held is lost too and the machine stays off until the fault ends.
func (w *world) crash(m *machine, power bool) {
	if power {
		m.powered = false
	}
	for _, d := range []*dirState{&m.up, &m.down} {
		if !power && d.buffer == 0 {
			continue
		}
		// Lost with the machine, or with the process whose NATS client
		// buffered them while disconnected.
		for _, ref := range d.held {
			w.release(ref)
		}
		d.held = nil
	}
	for _, s := range w.pairs {
		n := s.nodes[m.idx]
		n.halted = false
		s.stopMember(n)
		if s.db != nil {
			s.dbGone(n, true)
		}
	}
	m.running = false
	w.resetGates(m)
	m.raises = nil
	w.processGone(m)
}

// processGone forgets what dies with a machine's process (or with its
// last member, per-pair leadership: its watch).
func (w *world) processGone(m *machine) {
	m.paused = false
	for _, it := range m.deferred {
		switch it.kind {
		case evDown, evStepDone, evProcDone:
			w.release(it.ref)
		}
	}
	m.deferred = nil
	m.watch = false
	if !m.running {
		m.live, m.liveSet = nil, false
	}
}

// pause stops a machine's process (SIGSTOP); what reaches it waits.
func (w *world) pause(m *machine) bool {
	if !w.hosts(m) || m.paused {
		return false
	}
	m.paused = true
	m.pauseID++
	w.push(item{at: w.now + w.watchdog(), kind: evWatchdog, node: int8(m.idx), gen: m.pauseID})
	return true
}

// watchdog is how long the resource's watchdog tolerates a silent member:
// short enough that a pause cannot stretch a fence past fence_grace.
func (w *world) watchdog() time.Duration { return max(w.base.FenceGrace/5, time.Millisecond) }

func (w *world) resume(m *machine, id uint64) {
	if !w.hosts(m) || !m.paused || m.pauseID != id {
		return
	}
	m.paused = false
	items := m.deferred
	m.deferred = nil
	for _, it := range items {
		w.dispatch(it)
	}
	for _, s := range w.pairs {
		s.armTick(s.nodes[m.idx])
	}
	if m.live != nil {
		w.armLive(m)
	}
}

// resync (re)establishes a machine's watch when it can reach NATS: a new
// watch delivers the current value of every key, then Synced; a resumed
// one delivers what was written since the last revision it delivered (an
// ordered consumer), and the machine skips what it has already seen. One
// watch per machine, demultiplexed to its members by key.
func (w *world) resync(m *machine) {
	if !w.hosts(m) || !w.reachable(m) || m.reconnecting {
		return
	}
	if !m.watch {
		entries, _, err := w.server.kv.Snapshot(w.pattern, events.WatchOptions{})
		if err != nil {
			panic("simulator: snapshot: " + err.Error())
		}
		for _, e := range entries {
			if p, in := w.entryInput(e); in != nil {
				w.send(m, false, w.alloc(msg{kind: mEntry, inc: m.inc, rev: e.Revision, in: in, pair: p}))
			}
		}
		w.send(m, false, w.alloc(msg{kind: mSynced, inc: m.inc, pair: all}))
		m.watch = true
		return
	}
	m.down.dropped = false
	entries, err := w.server.kv.Changes(w.pattern, m.deliveredRev)
	if err != nil {
		panic("simulator: changes: " + err.Error())
	}
	for _, e := range entries {
		if p, in := w.entryInput(e); in != nil {
			w.send(m, false, w.alloc(msg{kind: mEntry, inc: m.inc, rev: e.Revision, in: in, pair: p}))
		}
	}
}

// entryInput turns a KV entry into the input of the member of its pair,
// or of every member and the liveness writer (a liveness record: pair
// all). nil: a key of nobody's, or a value that does not decode.
func (w *world) entryInput(e events.Entry) (int32, failover.Input) {
	if node := failover.LivenessNode(e.Key); node != "" {
		l, err := failover.DecodeLiveness(e.Value)
		if err != nil {
			return all, nil
		}
		return all, failover.LivenessObserved{Node: node, Entry: failover.LivenessEntry{Rev: e.Revision, Time: e.Time, Value: l}}
	}
	p := int32(0)
	if w.multi() {
		name, _, _ := strings.Cut(e.Key, ".")
		i, ok := w.pairIdx[name]
		if !ok {
			return 0, nil
		}
		p = i
	}
	s := w.pairs[p]
	return p, s.entryInput(e)
}

// broadcast queues a new entry on every established watch, in machine
// order (pair: the pair whose key it is; all: a liveness record).
func (w *world) broadcast(pair int32, rev uint64, in failover.Input) {
	for _, m := range w.machines {
		if !w.hosts(m) || !m.watch {
			continue
		}
		if !w.cl.connected(m.idx) || m.reconnecting {
			m.down.dropped = true // its server has not applied it, or its subscription is gone: the watch resumes on heal
			continue
		}
		w.send(m, false, w.alloc(msg{kind: mEntry, inc: m.inc, rev: rev, in: in, pair: pair}))
	}
}

// atNode handles a message that reached a machine: its watch's entries
// (for the member of their pair, or for all) and Synced, a member's
// answers, its liveness writer's answers.
func (w *world) atNode(m *machine, it item) {
	if w.msgs[it.ref].kind == mBatchResult {
		w.batchAnswered(m, it)
		return
	}
	if !m.paused {
		if mg := &w.msgs[it.ref]; w.cfg.HostBatch > 0 && mg.slot != 0 && mg.inc == m.inc {
			w.answeredAlone(m, it.ref)
		}
		w.answeredSlot(m, it.ref)
	}
	mg := &w.msgs[it.ref]
	if m.raises != nil && !m.paused && mg.kind == mWriteResult && mg.write.Kind == failover.WriteBump && mg.inc == m.inc && m.running {
		w.raiseAnswered(m, mg)
		mg = &w.msgs[it.ref]
	}
	var s *sim
	var n *node
	if mg.pair >= 0 {
		s = w.pairs[mg.pair]
		n = s.nodes[m.idx]
	}
	if mg.inc != m.inc || (n != nil && !n.alive) || (n == nil && !w.hosts(m)) {
		w.release(it.ref)
		return
	}
	if m.paused {
		m.deferred = append(m.deferred, it)
		return
	}
	switch {
	case mg.kind == mEntry:
		// The machine's one watch: an entry for a member, or for all.
		rev, in := mg.rev, mg.in
		w.release(it.ref)
		if rev <= m.deliveredRev {
			return // the watch resumed and delivered it already
		}
		m.deliveredRev = rev
		if n != nil {
			w.watchSeen(m, s.pi, rev, in)
			s.step(n, in)
		} else {
			w.deliverAll(m, in)
		}
	case mg.kind == mSynced:
		w.release(it.ref)
		w.deliverAll(m, failover.Synced{})
	case n != nil:
		s.atMember(n, it)
	case mg.kind == mWriteResult:
		res := mg.res
		w.release(it.ref)
		if m.live != nil {
			w.onLiveResult(m, &res)
			w.liveStep(m, res)
		}
	default:
		w.release(it.ref)
	}
}

// deliverAll feeds a watch delivery to the machine's liveness writer (its
// own record, Synced) and to every member it hosts.
func (w *world) deliverAll(m *machine, in failover.Input) {
	if m.live != nil {
		if lo, ok := in.(failover.LivenessObserved); !ok || lo.Node == m.name {
			w.liveStep(m, in)
		}
	}
	if lo, ok := in.(failover.LivenessObserved); ok {
		w.stepLive(m, w.logLive(m, lo))
		return
	}
	for _, s := range w.pairs {
		if n := s.nodes[m.idx]; n.alive {
			s.step(n, in)
		}
	}
}

func (w *world) machineBySite(site string) *machine {
	for _, m := range w.machines {
		if m.site == site {
			return m
		}
	}
	return nil
}
