package failover

import (
	"container/heap"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"understudy/actors/capability"
	"understudy/events"
)

// world is a tiny deterministic host for transcripts: one KV "server" with
// a server clock, two members, a link per member with latency and drops,
// and a resource per member whose procedures take time. It checks on every
// step that the two resources never serve at once. With `pair
// leadership=node` each member runs on its own node, whose liveness writer
// shares the member's link and process (a crash ends both).
type world struct {
	t      *testing.T
	rules  Rules
	config Rules // last written to <pair>.config
	opts   Options
	now    time.Duration
	seq    uint64
	queue  eventQueue
	kv     map[string]kvEntry
	rev    uint64
	sites  []string
	node   map[string]*node
	out    *strings.Builder
	splits int
	wdb    dbWorld
	// maxTerm is the highest term the register's history shows (the
	// runtime reads it from the key's history when a value is corrupt).
	maxTerm uint64
	// The register's history, and the revisions a forger wrote unsigned
	// (the runtime's verification fails on them: Forged).
	regHist []kvEntry
	forged  map[uint64]bool
	// nodeMode: leadership: node. Each site runs on its own node
	// (site-a on node-a), whose NodeLiveness writes the node's liveness
	// record over the site's link and feeds the member its results.
	nodeMode bool
}

type kvEntry struct {
	rev   uint64
	at    time.Time
	value []byte
}

type procBehaviour struct {
	delay time.Duration
	fail  bool
}

type node struct {
	site        string
	m           *Member
	alive       bool
	incarnation int
	log         []events.Event
	clockOffset time.Duration
	up, down    time.Duration
	dropUp      bool
	dropDown    bool
	lastUp      time.Duration
	lastDown    time.Duration
	// watchLag delays what the watch delivers (not write answers): an
	// ordered consumer catching up after a partition.
	watchLag  time.Duration
	lastWatch time.Duration
	// Every lateEvery-th write answer comes lateBy later than the link's
	// latency (a lossy link retransmitting), the others on time.
	lateEvery int
	lateBy    time.Duration
	answers   int
	serving   bool
	procs     map[ProcKind]procBehaviour
	db        *db // with a replicating workload (pair workload=db)
	// Node mode: the node's liveness writer (new with each start of the
	// site: a crash takes the node's process down with the member), and
	// what the transcript has said of its writes so far.
	nodeName    string
	live        *NodeLiveness
	liveLanded  bool
	liveFailing int
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type scheduled struct {
	at  time.Duration
	seq uint64
	fn  func()
}

type eventQueue []scheduled

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(scheduled)) }
func (q *eventQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

// newWorld makes a world; with nodeMode each site runs on its own node
// (leadership: node), site-a on node-a.
func newWorld(t *testing.T, rules Rules, opts Options, nodeMode bool, out *strings.Builder) *world {
	w := &world{t: t, rules: rules, config: rules, opts: opts, kv: map[string]kvEntry{}, node: map[string]*node{}, out: out, forged: map[uint64]bool{}, nodeMode: nodeMode}
	for _, s := range []string{rules.Primary, rules.Replica} {
		w.sites = append(w.sites, s)
		w.node[s] = &node{site: s, up: 10 * time.Millisecond, down: 10 * time.Millisecond, procs: map[ProcKind]procBehaviour{
			ProcFence:   {delay: 500 * time.Millisecond},
			ProcPromote: {delay: 200 * time.Millisecond},
			ProcDemote:  {delay: 200 * time.Millisecond},
			ProcCheck:   {delay: 50 * time.Millisecond},
			ProcRejoin:  {delay: 300 * time.Millisecond},
			ProcSync:    {delay: 20 * time.Millisecond},
		}}
		if opts.Rejoin {
			w.node[s].db = &db{role: capability.RoleDown}
		}
		if nodeMode {
			// node-a rather than node-site-a: the transcript's columns stay aligned.
			w.node[s].nodeName = "node-" + strings.TrimPrefix(s, "site-")
		}
	}
	w.put(ConfigKey(rules.Pair), EncodeRules(rules))
	return w
}

func (w *world) at(d time.Duration, fn func()) {
	w.seq++
	heap.Push(&w.queue, scheduled{at: d, seq: w.seq, fn: fn})
}

func (w *world) logf(site, format string, args ...any) {
	fmt.Fprintf(w.out, "%7.3fs %-6s %s\n", w.now.Seconds(), site, fmt.Sprintf(format, args...))
}

func (w *world) serverTime() time.Time { return epoch.Add(w.now) }

// put applies an unconditional write on the server and fans it out.
func (w *world) put(key string, value []byte) kvEntry {
	w.rev++
	e := kvEntry{rev: w.rev, at: w.serverTime(), value: value}
	if key == LeaderKey(w.rules.Pair) {
		if l, err := DecodeLeader(value); err == nil {
			w.maxTerm = max(w.maxTerm, l.Term)
		}
		w.regHist = append(w.regHist, e)
	}
	w.kv[key] = e
	for _, s := range w.sites {
		w.deliverEntry(w.node[s], key, e)
	}
	return e
}

func (w *world) deliverEntry(n *node, key string, e kvEntry) {
	if !n.alive || n.dropDown {
		return
	}
	in := w.inputFor(key, e)
	if in == nil {
		return
	}
	if n.watchLag > 0 {
		at := max(w.now+n.down+n.watchLag, n.lastWatch)
		n.lastWatch = at
		inc := n.incarnation
		w.at(at, func() {
			if n.alive && n.incarnation == inc {
				w.deliver(n, in)
			}
		})
		return
	}
	w.down(n, in)
}

func (w *world) inputFor(key string, e kvEntry) Input {
	p := w.rules.Pair
	switch {
	case key == LeaderKey(p):
		return LeaderObserved{Entry: w.leaderEntry(e)}
	case HeartbeatSite(p, key) != "":
		h, err := DecodeHeartbeat(e.value)
		if err != nil {
			w.t.Fatalf("heartbeat value: %v", err)
		}
		return HeartbeatObserved{Rev: e.rev, Time: e.at, Site: HeartbeatSite(p, key), Value: h}
	case key == ConfigKey(p):
		r, err := DecodeRules(e.value)
		if err != nil {
			return ConfigObserved{Rev: e.rev, DecodeErr: err.Error()}
		}
		return ConfigObserved{Rev: e.rev, Rules: r}
	case key == SwitchoverKey(p):
		s, err := DecodeSwitchover(e.value)
		if err != nil {
			w.t.Fatalf("switchover value: %v", err)
		}
		return SwitchoverObserved{Rev: e.rev, Request: s}
	case LivenessNode(key) != "":
		l, err := DecodeLiveness(e.value)
		if err != nil {
			w.t.Fatalf("liveness value: %v", err)
		}
		return LivenessObserved{Node: LivenessNode(key), Entry: LivenessEntry{Rev: e.rev, Time: e.at, Value: l}}
	case key == PauseKey(p), key == ManualFailoverKey(p):
		in, err := InputOf(p, events.Entry{Key: key, Value: e.value, Revision: e.rev, Time: e.at, Op: events.OpPut})
		if err != nil {
			w.t.Fatalf("%s value: %v", key, err)
		}
		return in
	}
	return nil
}

// leaderEntry is a register revision as the runtime hands it to a member:
// Forged when a forger wrote it unsigned, with the latest genuine holder's
// write before it when WantsGenuine.
func (w *world) leaderEntry(e kvEntry) LeaderEntry {
	le, _ := LeaderEntryOf(events.Entry{Key: LeaderKey(w.rules.Pair), Value: e.value, Revision: e.rev, Time: e.at, Op: events.OpPut}, w.maxTerm)
	le.Forged = w.forged[e.rev]
	if WantsGenuine(le) {
		for i := len(w.regHist) - 1; i >= 0; i-- {
			h := w.regHist[i]
			if h.rev >= e.rev || w.forged[h.rev] {
				continue
			}
			if g, err := LeaderEntryOf(events.Entry{Key: LeaderKey(w.rules.Pair), Value: h.value, Revision: h.rev, Time: h.at, Op: events.OpPut}, 0); err == nil && !g.Value.ForAnother() {
				le.Genuine = &g
				break
			}
		}
	}
	return le
}

// forge has a forger write a value no member wrote, every for a while
// (once without every): unsigned register values are Forged, by names
// the site whose node key signs them; heartbeats go under key's key. A
// replay re-writes the latest three register values site wrote (newest
// first, then round again) as they were stored: their signatures verify.
func (w *world) forge(kind, site, by, key string, every, until time.Duration) {
	p := w.rules.Pair
	var beat uint64
	var term uint64
	var replay [][]byte
	var write func()
	write = func() {
		switch kind {
		case "replay":
			if replay == nil {
				seen := map[string]bool{}
				for i := len(w.regHist) - 1; i >= 0 && len(replay) < 3; i-- {
					h := w.regHist[i]
					if l, err := DecodeLeader(h.value); err == nil && l.By == site && !w.forged[h.rev] && !seen[string(h.value)] {
						seen[string(h.value)] = true
						replay = append(replay, h.value)
					}
				}
			}
			if len(replay) == 0 {
				w.t.Fatalf("forge kind=replay site=%s: %s wrote no register value", site, site)
			}
			v := replay[int(beat)%len(replay)]
			beat++
			l, _ := DecodeLeader(v)
			w.logf("forger", "replays %s = %v by=%q", LeaderKey(p), l, l.By)
			w.putForged(LeaderKey(p), v, false)
		case "handoff":
			cur, _ := DecodeLeader(w.kv[LeaderKey(p)].value)
			l := Leader{Term: cur.Term, Handoff: site, By: by}
			w.logf("forger", "writes %s = %v by=%q", LeaderKey(p), l, by)
			w.putForged(LeaderKey(p), EncodeLeader(l), by == "")
		case "beats":
			if term == 0 {
				for i := len(w.regHist) - 1; i >= 0; i-- {
					if l, err := DecodeLeader(w.regHist[i].value); err == nil && l.Site == site && !w.forged[w.regHist[i].rev] {
						term, beat = l.Term, l.Beat
						break
					}
				}
			}
			beat++
			l := Leader{Site: site, Term: term, Beat: beat, By: by}
			w.logf("forger", "writes %s = %v by=%q", LeaderKey(p), l, by)
			w.putForged(LeaderKey(p), EncodeLeader(l), by == "")
		case "ready":
			beat++
			w.logf("forger", "writes %s = ready heartbeat claiming %s", HeartbeatKey(p, key), site)
			w.put(HeartbeatKey(p, key), EncodeHeartbeat(Heartbeat{Site: site, Beat: beat, Phase: PhaseFollower, Ready: true}))
		}
		if every > 0 && w.now+every <= until {
			w.at(w.now+every, write)
		}
	}
	write()
}

// putForged is put for a forged register value: flagged before it fans out.
func (w *world) putForged(key string, value []byte, forged bool) {
	w.forged[w.rev+1] = forged
	w.put(key, value)
}

// down sends an input from the server to n over its link, FIFO.
func (w *world) down(n *node, in Input) {
	w.downTo(n, func() { w.deliver(n, in) })
}

// downTo runs fn when something sent now from the server reaches n over
// its link (FIFO), unless n's process died meanwhile.
func (w *world) downTo(n *node, fn func()) {
	at := max(w.now+n.down, n.lastDown)
	n.lastDown = at
	inc := n.incarnation
	w.at(at, func() {
		if n.alive && n.incarnation == inc {
			fn()
		}
	})
}

// deliver hands what n's watch delivers to its process: to the member,
// and in node mode also to its node's liveness writer (Synced, and its
// own record), first, as one watch per node demultiplexed.
func (w *world) deliver(n *node, in Input) {
	if n.live != nil {
		switch v := in.(type) {
		case Synced, Resynced:
			w.handleLive(n, n.live.Step(w.local(n), in))
		case LivenessObserved:
			if v.Node == n.nodeName {
				w.handleLive(n, n.live.Step(w.local(n), in))
			}
		}
	}
	w.step(n, in)
}

func (w *world) local(n *node) time.Duration { return w.now + n.clockOffset }

func (w *world) step(n *node, in Input) {
	w.handle(n, n.m.Step(w.local(n), in))
}

func (w *world) start(n *node) {
	if n.alive {
		w.t.Fatalf("start %s: already running", n.site)
	}
	opts := w.opts
	if w.nodeMode {
		opts.Node = n.nodeName
	}
	m, err := NewMember(n.site, w.rules, opts)
	if err != nil {
		w.t.Fatalf("new member: %v", err)
	}
	for _, ev := range n.log {
		m.Apply(ev)
	}
	n.m, n.alive = m, true
	n.incarnation++
	n.lastDown, n.lastUp = 0, 0
	w.handle(n, m.Start(w.local(n)))
	if w.nodeMode {
		// A new process: a new liveness writer, which writes once the
		// watch has shown it its record.
		n.live, n.liveLanded, n.liveFailing = NewNodeLiveness(n.nodeName, w.rules.HeartbeatTimeout), false, 0
		w.handleLive(n, n.live.Start(w.local(n)))
	}
	// The watch: every existing entry in revision order, then Synced.
	keys := make([]string, 0, len(w.kv))
	for k := range w.kv {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return w.kv[keys[i]].rev < w.kv[keys[j]].rev })
	if !n.dropDown {
		for _, k := range keys {
			if in := w.inputFor(k, w.kv[k]); in != nil {
				w.down(n, in)
			}
		}
		w.down(n, Synced{})
	}
	w.scheduleTick(n)
	if n.live != nil {
		w.scheduleLiveTick(n)
	}
}

func (w *world) scheduleLiveTick(n *node) {
	w.wakeAt(n, n.live.NextWake(), func() {
		w.handleLive(n, n.live.Step(w.local(n), Tick{}))
		w.scheduleLiveTick(n)
	})
}

// wakeAt runs tick at n's local time next (at once if that has passed),
// unless n died or restarted meanwhile.
func (w *world) wakeAt(n *node, next time.Duration, tick func()) {
	inc := n.incarnation
	wake := next - n.clockOffset
	if wake <= w.now {
		wake = w.now + time.Millisecond
	}
	w.at(wake, func() {
		if n.alive && n.incarnation == inc {
			tick()
		}
	})
}

// handleLive issues the liveness writer's writes over n's link and hands
// every result to n's member, in order. The transcript shows a node's
// first landed write, every write that did not land, a raised epoch, and
// the first write that lands after failures; not the steady beats.
func (w *world) handleLive(n *node, r NodeReady) {
	live := n.live
	for _, wr := range r.Writes {
		w.sendTo(n, func() { w.apply(n, wr, live) })
	}
	for _, res := range r.Results {
		switch {
		case res.Err == WriteOK && (!n.liveLanded || n.liveFailing > 0):
			note := "the first of this process"
			if n.liveLanded {
				note = fmt.Sprintf("after %d that did not land", n.liveFailing)
			}
			beat := ""
			if e := w.kv[LivenessKey(n.nodeName)]; e.rev == res.Revision {
				l, _ := DecodeLiveness(e.value)
				beat = fmt.Sprintf(", beat %d", l.Beat)
			}
			w.logf(n.nodeName, "liveness write landed: epoch %d%s, rev %d (%s)", res.Epoch, beat, res.Revision, note)
			n.liveLanded, n.liveFailing = true, 0
		case res.Err == WriteOK:
		case res.Err == WriteConflict:
			w.logf(n.nodeName, "liveness write refused: %s; the node carries on in epoch %d (rev %d)", res.Cause, res.Epoch, res.Revision)
			n.liveFailing = 0
		default:
			n.liveFailing++
			w.logf(n.nodeName, "liveness write failed (%d in a row): %s", n.liveFailing, res.Cause)
		}
		if n.alive {
			w.step(n, res)
		}
	}
}

func (w *world) scheduleTick(n *node) {
	w.wakeAt(n, n.m.NextWake(), func() {
		w.step(n, Tick{})
		w.scheduleTick(n)
	})
}

func (w *world) handle(n *node, r Ready) {
	for _, ev := range r.Events {
		n.log = append(n.log, ev)
		w.logf(n.site, "%s", formatEvent(ev))
	}
	for _, wr := range r.Writes {
		w.send(n, wr)
	}
	for _, p := range r.Procedures {
		w.runProc(n, p)
	}
}

func (w *world) send(n *node, wr Write) {
	w.sendTo(n, func() { w.apply(n, wr, nil) })
}

// sendTo runs fn on the server when something sent now by n reaches it
// over its link (FIFO), unless the link drops it.
func (w *world) sendTo(n *node, fn func()) {
	if n.dropUp {
		return
	}
	at := max(w.now+n.up, n.lastUp)
	n.lastUp = at
	w.at(at, fn)
}

// apply executes a write on the server, even from a dead process (a zombie
// write already on the wire), and answers it: to n's member, or to the
// liveness writer live that issued it (a restarted node's new writer
// never sees its predecessor's answers).
func (w *world) apply(n *node, wr Write, live *NodeLiveness) {
	cur, exists := w.kv[wr.Key]
	res := WriteResult{Op: wr.Op}

	switch {
	case wr.Put, exists && cur.rev == wr.ExpectRev && wr.ExpectRev != 0, !exists && wr.ExpectRev == 0:
		e := w.put(wr.Key, wr.Value)
		res.Err, res.Revision, res.Time = WriteOK, e.rev, e.at
	default:
		res.Err = WriteConflict
		if exists && wr.Key == LeaderKey(w.rules.Pair) {
			le := w.leaderEntry(cur)
			res.Current = &le
		}
		if exists && LivenessNode(wr.Key) != "" {
			in := w.inputFor(wr.Key, cur).(LivenessObserved)
			res.CurrentLive = &in.Entry
		}
	}
	if !n.alive || n.dropDown {
		return
	}
	answer := func() { w.step(n, res) }
	if live != nil {
		answer = func() {
			if n.live == live {
				w.handleLive(n, live.Step(w.local(n), res))
			}
		}
	}
	n.answers++
	if n.lateEvery > 0 && n.answers%n.lateEvery == 0 {
		inc := n.incarnation
		w.at(w.now+n.down+n.lateBy, func() {
			if n.alive && n.incarnation == inc {
				answer()
			}
		})
		return
	}
	w.downTo(n, answer)
}

func (w *world) runProc(n *node, p Procedure) {
	b := n.procs[p.Kind]
	inc := n.incarnation
	w.at(w.now+b.delay, func() {
		if !n.alive || n.incarnation != inc {
			return
		}
		ok, detail := !b.fail, map[bool]string{true: "step failed"}[b.fail]
		var st *capability.Status
		if ok && n.db != nil {
			ok, detail, st = w.dbProc(n, p)
		}
		if ok {
			switch p.Kind {
			case ProcFence, ProcDemote:
				w.setServing(n, false)
			case ProcPromote:
				w.setServing(n, true)
			}
		}
		w.step(n, ProcedureResult{Kind: p.Kind, Seq: p.Seq, OK: ok, Detail: detail, Status: st})
	})
}

func (w *world) setServing(n *node, on bool) {
	if n.serving == on {
		return
	}
	n.serving = on
	w.logf(n.site, "resource %s", map[bool]string{true: "SERVING", false: "stopped"}[on])
	if on {
		for _, s := range w.sites {
			if s != n.site && w.node[s].serving {
				w.splits++
				w.logf(n.site, "!! SPLIT BRAIN: %s and %s both serving", s, n.site)
			}
		}
	}
}

func (w *world) run(until time.Duration) {
	for w.queue.Len() > 0 && w.queue[0].at <= until {
		s := heap.Pop(&w.queue).(scheduled)
		w.now = s.at
		s.fn()
	}
	w.now = until
}

func formatEvent(ev events.Event) string {
	v := reflect.ValueOf(ev).Elem()
	var b strings.Builder
	b.WriteString(ev.EventType())
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		fv := v.Field(i)
		if fv.IsZero() {
			continue
		}
		if f.Name == "Rules" {
			r := fv.Interface().(Rules)
			fmt.Fprintf(&b, " rules={hb=%v ft=%d st=%d fo=%v fg=%v failback=%v}", r.HeartbeatTimeout, r.FailureThreshold, r.SuccessThreshold, r.FailoverTimeout, r.FenceGrace, r.Failback)
			continue
		}
		fmt.Fprintf(&b, " %s=%v", strings.ToLower(f.Name), fv.Interface())
	}
	return b.String()
}
