package simulations

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/events"
)

// Leadership is how the pairs' leadership is kept (Config.Leadership).
type Leadership int

const (
	// LeadershipPerPair: every holder writes its pair's register every
	// heartbeat_timeout, every follower its heartbeat key (failover.Options
	// without Node).
	LeadershipPerPair Leadership = iota + 1
	// LeadershipNode: each node heartbeats one liveness record with its
	// epoch (failover.NodeLiveness); a pair's register names its holder's
	// node and epoch and is written only when it changes (Options.Node).
	LeadershipNode
)

func (l Leadership) String() string {
	switch l {
	case LeadershipPerPair:
		return "per-pair"
	case LeadershipNode:
		return "node"
	}
	return "unset"
}

// ParseLeadership reads "node" or "per-pair".
func ParseLeadership(s string) (Leadership, error) {
	switch s {
	case "node":
		return LeadershipNode, nil
	case "per-pair":
		return LeadershipPerPair, nil
	}
	return 0, fmt.Errorf("leadership must be node or per-pair, got %q", s)
}

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
}

// liveRec is a liveness record as a server holds it.
type liveRec struct {
	e     failover.LivenessEntry
	known bool
}

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
		w.atServer(w.machines[it.node], it.ref)
		return p
	case evDown:
		p := w.msgs[it.ref].pair
		w.atNode(w.machines[it.node], it)
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

// start (re)starts a machine's process: every member replays its event
// subject and starts fenced (startMember), the node's liveness writer
// starts (node leadership), then the watch.
func (w *world) start(m *machine) {
	m.powered, m.running, m.paused = true, true, false
	m.inc++
	m.nonce = "i" + strconv.FormatUint(uint64(m.inc), 10)
	for _, s := range w.pairs {
		s.startMember(s.nodes[m.idx])
	}
	if w.nodeMode {
		m.live, m.liveSet = failover.NewNodeLiveness(m.name, w.base.HeartbeatTimeout), false
		w.liveHandle(m, m.live.Start(m.clk.local(w.now)))
	}
	m.watch, m.deliveredRev = false, 0
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
	if !w.hosts(m) || !w.reachable(m) {
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
		if !w.cl.connected(m.idx) {
			m.down.dropped = true // its server has not applied it: the watch resumes on heal
			continue
		}
		w.send(m, false, w.alloc(msg{kind: mEntry, inc: m.inc, rev: rev, in: in, pair: pair}))
	}
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

// isLive reports whether a write is of a liveness record (a node's beat or
// a raise of its epoch).
func isLive(wr *failover.Write) bool {
	return wr.Kind == failover.WriteLiveness || wr.Kind == failover.WriteBump
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
	case mAppend:
		s := w.pairs[mg.pair]
		n := s.nodes[m.idx]
		res := w.server.appendEvent(w.now, n.apps[mg.stream].subject, mg.data, mg.last, mg.known, mg.queued, mg.id, mg.event)
		if res.code == 0 && !res.duplicate {
			s.eventLanded(n, int(mg.stream), mg.mark, res.seq, mg.queued)
		}
		*mg = msg{kind: mAppendAck, inc: mg.inc, stream: mg.stream, attempt: mg.attempt, seq: res.seq, code: res.code, dup: res.duplicate, last: res.last, id: res.id, pair: mg.pair}
		w.send(m, false, ref)
	default:
		w.release(ref)
	}
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
		switch {
		case wr.Put:
		case isLive(wr):
			if li := w.liveIndex(key); li >= 0 {
				if v := &w.liveViews[at][li]; (create && v.known) || (!create && wr.ExpectRev != v.e.Rev) {
					w.refuseWrite(m, ref, events.KVAPIError(create, codeWrongLast, descWrongLast))
					return
				}
			}
		case mg.pair >= 0 && key == failover.LeaderKey(w.pairs[mg.pair].rules.Pair):
			if v := &w.pairs[mg.pair].views[at]; (create && v.known) || (!create && wr.ExpectRev != v.rev) {
				w.refuseWrite(m, ref, events.KVAPIError(create, codeWrongLast, descWrongLast))
				return
			}
		}
	case mAppend:
		key = w.pairs[mg.pair].nodes[m.idx].apps[mg.stream].subject
		if c.inFlight(at, key) {
			w.count(cInFlightRefused)
			*mg = msg{kind: mAppendAck, inc: mg.inc, stream: mg.stream, attempt: mg.attempt, code: codeInFlight, last: mg.last, id: mg.id, pair: mg.pair}
			w.send(m, false, ref)
			return
		}
	default:
		w.release(ref)
		return
	}
	c.pending[at] = append(c.pending[at], proposal{ref: ref, node: int8(m.idx), key: key})
}

// refuseWrite answers a KV write the server refused with err, as the
// runtime would: classified by failover.WriteErrOf; after a conflict on
// the register or a liveness record, the key as the machine's own NATS
// server reads it (a cut-off leader's is stale).
func (w *world) refuseWrite(m *machine, ref int32, err error) {
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
	w.reply(m, ref, out)
}

func (w *world) reply(m *machine, ref int32, out failover.WriteResult) {
	mg := &w.msgs[ref]
	mg.kind, mg.res = mWriteResult, out
	w.send(m, false, ref)
}

// atNode handles a message that reached a machine: its watch's entries
// (for the member of their pair, or for all) and Synced, a member's
// answers, its liveness writer's answers.
func (w *world) atNode(m *machine, it item) {
	mg := &w.msgs[it.ref]
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
	for _, s := range w.pairs {
		if n := s.nodes[m.idx]; n.alive {
			s.step(n, in)
		}
	}
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

func (w *world) machineBySite(site string) *machine {
	for _, m := range w.machines {
		if m.site == site {
			return m
		}
	}
	return nil
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
