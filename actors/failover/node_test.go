package failover

import (
	"fmt"
	"testing"
	"time"

	"understudy/events"
)

// nodeWorld is a minimal host of node mode: a KV with a server clock that
// answers at once, one NodeLiveness per node, and the members of several
// pairs per node; procedures finish at once. A node that is down neither
// writes nor sees anything; its members keep their state (a partition).
type nodeWorld struct {
	t      *testing.T
	now    time.Duration
	base   time.Time
	kv     map[string]kvEntry
	rev    uint64
	nodes  map[string]*simNode
	order  []string
	writes int
}

type simNode struct {
	name    string
	up      bool
	live    *NodeLiveness
	members []*Member
	serving map[string]bool // pair -> serving
}

func newNodeWorld(t *testing.T, pairs int, rules func(pair string) Rules) *nodeWorld {
	w := &nodeWorld{t: t, base: time.Unix(1_700_000_000, 0), kv: map[string]kvEntry{}, nodes: map[string]*simNode{}}
	for _, site := range []string{"a", "b"} {
		n := &simNode{name: "node-" + site, up: true, serving: map[string]bool{}}
		n.live = NewNodeLiveness(n.name, rules("p0").HeartbeatTimeout)
		for i := range pairs {
			m, err := NewMember(site, rules(fmt.Sprintf("p%d", i)), Options{Node: n.name})
			if err != nil {
				t.Fatal(err)
			}
			n.members = append(n.members, m)
		}
		w.nodes[n.name] = n
		w.order = append(w.order, n.name)
	}
	for _, name := range w.order {
		n := w.nodes[name]
		w.nodeReady(n, n.live.Start(0))
		for _, m := range n.members {
			w.memberReady(n, m, m.Start(0))
			w.memberReady(n, m, m.Step(0, Synced{}))
		}
		w.nodeReady(n, n.live.Step(0, Synced{}))
	}
	return w
}

func (w *nodeWorld) write(wr Write) WriteResult {
	w.writes++
	cur, exists := w.kv[wr.Key]
	res := WriteResult{Op: wr.Op}
	switch {
	case wr.Put, wr.ExpectRev == 0 && !exists, exists && wr.ExpectRev == cur.rev:
		w.rev++
		e := kvEntry{rev: w.rev, at: w.base.Add(w.now), value: wr.Value}
		w.kv[wr.Key] = e
		res.Err, res.Revision = WriteOK, w.rev
		w.deliver(wr.Key, e)
	default:
		res.Err = WriteConflict
		if exists {
			if LivenessNode(wr.Key) != "" {
				l, _ := DecodeLiveness(cur.value)
				res.CurrentLive = &LivenessEntry{Rev: cur.rev, Time: cur.at, Value: l}
			} else {
				l, _ := DecodeLeader(cur.value)
				res.Current = &LeaderEntry{Rev: cur.rev, Time: cur.at, Value: l}
			}
		}
	}
	return res
}

// deliver hands a new entry to every node that is up (a watch per node,
// demultiplexed to its members and its liveness writer).
func (w *nodeWorld) deliver(key string, e kvEntry) {
	for _, name := range w.order {
		n := w.nodes[name]
		if !n.up {
			continue
		}
		if node := LivenessNode(key); node != "" {
			l, err := DecodeLiveness(e.value)
			if err != nil {
				w.t.Fatal(err)
			}
			in := LivenessObserved{Node: node, Entry: LivenessEntry{Rev: e.rev, Time: e.at, Value: l}}
			w.nodeReady(n, n.live.Step(w.now, in))
			for _, m := range n.members {
				w.memberReady(n, m, m.Step(w.now, in))
			}
			continue
		}
		for _, m := range n.members {
			in, err := InputOf(m.Rules().Pair, events.Entry{Key: key, Value: e.value, Revision: e.rev, Time: e.at, Op: events.OpPut})
			if err != nil {
				w.t.Fatal(err)
			}
			if in != nil {
				w.memberReady(n, m, m.Step(w.now, in))
			}
		}
	}
}

func (w *nodeWorld) nodeReady(n *simNode, r NodeReady) {
	for _, wr := range r.Writes {
		if !n.up {
			continue // lost; the writer times it out
		}
		res := w.write(wr)
		w.nodeReady(n, n.live.Step(w.now, res))
	}
	for _, res := range r.Results {
		for _, m := range n.members {
			w.memberReady(n, m, m.Step(w.now, res))
		}
	}
}

func (w *nodeWorld) memberReady(n *simNode, m *Member, r Ready) {
	for _, wr := range r.Writes {
		if !n.up {
			continue
		}
		res := w.write(wr)
		w.memberReady(n, m, m.Step(w.now, res))
	}
	for _, p := range r.Procedures {
		switch p.Kind {
		case ProcFence, ProcDemote:
			n.serving[m.Rules().Pair] = false
		case ProcPromote:
			n.serving[m.Rules().Pair] = true
		}
		w.memberReady(n, m, m.Step(w.now, ProcedureResult{Kind: p.Kind, Seq: p.Seq, OK: true}))
	}
}

// run advances time in 10 ms steps, ticking every machine, and checks that
// no pair is served by both nodes.
func (w *nodeWorld) run(d time.Duration) {
	end := w.now + d
	for w.now < end {
		w.now += 10 * time.Millisecond
		for _, name := range w.order {
			n := w.nodes[name]
			if n.live.NextWake() <= w.now {
				w.nodeReady(n, n.live.Step(w.now, Tick{}))
			}
			for _, m := range n.members {
				if m.NextWake() <= w.now {
					w.memberReady(n, m, m.Step(w.now, Tick{}))
				}
			}
		}
		for _, m := range w.nodes["node-a"].members {
			p := m.Rules().Pair
			if w.nodes["node-a"].serving[p] && w.nodes["node-b"].serving[p] {
				w.t.Fatalf("at %v: %s served on both nodes", w.now, p)
			}
		}
	}
}

func (w *nodeWorld) servingOn(node string) int {
	k := 0
	for _, s := range w.nodes[node].serving {
		if s {
			k++
		}
	}
	return k
}

func TestNodeModeWholeNodeFailover(t *testing.T) {
	const pairs = 20
	rules := func(p string) Rules { return DefaultRules(p, "a", "b") }
	w := newNodeWorld(t, pairs, rules)
	w.run(10 * time.Second)
	if got := w.servingOn("node-a"); got != pairs {
		t.Fatalf("after 10 s, %d of %d pairs serve on the preferred primary's node", got, pairs)
	}
	// Steady state: one liveness write per node per heartbeat, nothing else.
	before := w.writes
	w.run(20 * time.Second)
	if per := float64(w.writes-before) / 20; per > 2.5 {
		t.Fatalf("steady state: %.1f writes per second for %d pairs over two nodes; want about 2 (one liveness write per node per second)", per, pairs)
	}
	// The primary's node is cut off: every pair serves on node-b within
	// failover_timeout + 2 × heartbeat_timeout, after one raise of node-a's epoch.
	r := rules("p0")
	w.nodes["node-a"].up = false
	cut := w.now
	var last time.Duration
	for w.now-cut < 30*time.Second && w.servingOn("node-b") < pairs {
		w.run(10 * time.Millisecond)
		last = w.now - cut
	}
	if got := w.servingOn("node-b"); got != pairs {
		t.Fatalf("%d of %d pairs serve on node-b 30 s after node-a was cut off", got, pairs)
	}
	t.Logf("last pair served on node-b %v after the cut; steady writes %d", last, w.writes-before)
	if bound := r.FailoverTimeout + 2*r.HeartbeatTimeout + r.HeartbeatTimeout; last > bound {
		t.Fatalf("the last pair served on node-b %v after the cut; want within %v", last, bound)
	}
	e, _ := DecodeLiveness(w.kv[LivenessKey("node-a")].value)
	if e.Epoch != 2 || e.By != "node-b" {
		t.Fatalf("node-a's liveness record after the takeover: %v; want epoch 2 raised by node-b", e)
	}
	// node-a comes back: its first liveness write finds its epoch raised;
	// every member there has lost its lease (they were fenced already).
	w.nodes["node-a"].up = true
	w.run(15 * time.Second)
	if w.servingOn("node-a") != 0 && w.servingOn("node-b") != 0 && w.servingOn("node-a")+w.servingOn("node-b") != pairs {
		t.Fatalf("after node-a returned: %d serve on node-a, %d on node-b", w.servingOn("node-a"), w.servingOn("node-b"))
	}
	// Failback: auto, once node-a's members are ready again.
	w.run(30 * time.Second)
	if got := w.servingOn("node-a"); got != pairs {
		t.Fatalf("60 s after node-a returned, %d of %d pairs serve there (failback: auto)", got, pairs)
	}
}

// A cut shorter than the safety margin moves nothing: no raise, no
// takeover; the holder's members may count failures but keep the pairs.
func TestNodeModeShortCutMovesNothing(t *testing.T) {
	const pairs = 5
	w := newNodeWorld(t, pairs, func(p string) Rules { return DefaultRules(p, "a", "b") })
	w.run(10 * time.Second)
	w.nodes["node-a"].up = false
	w.run(1500 * time.Millisecond) // fewer than failure_threshold missed writes
	w.nodes["node-a"].up = true
	w.run(10 * time.Second)
	if got := w.servingOn("node-a"); got != pairs {
		t.Fatalf("%d of %d pairs serve on node-a after a 1.5 s cut", got, pairs)
	}
	if e, _ := DecodeLiveness(w.kv[LivenessKey("node-a")].value); e.Epoch != 1 {
		t.Fatalf("node-a's epoch is %d after a short cut; want 1 (nobody raised it)", e.Epoch)
	}
}

// nodeDriver drives one node-mode member by hand: it records what the
// member asks and completes every procedure at once.
type nodeDriver struct {
	m      *Member
	writes []Write
	events []events.Event
	fences int
	probes int // Ready.ProbeLiveness asked
}

func (d *nodeDriver) feed(now time.Duration, rd Ready) {
	if rd.ProbeLiveness {
		d.probes++
	}
	d.writes = append(d.writes, rd.Writes...)
	d.events = append(d.events, rd.Events...)
	for _, p := range rd.Procedures {
		if p.Kind == ProcFence {
			d.fences++
		}
		d.feed(now, d.m.Step(now, ProcedureResult{Kind: p.Kind, Seq: p.Seq, OK: true}))
	}
}

func (d *nodeDriver) find(kind WriteKind) (Write, bool) {
	for _, w := range d.writes {
		if w.Kind == kind {
			return w, true
		}
	}
	return Write{}, false
}

// bootstrapLeader makes the preferred primary of DefaultRules("p0", "a",
// "b") on node-a take the register nobody held and serve; it returns the
// driver and the local time it serves at (its node's liveness: epoch 1).
func bootstrapLeader(t *testing.T) (*nodeDriver, time.Duration) {
	t.Helper()
	m, err := NewMember("a", DefaultRules("p0", "a", "b"), Options{Node: "node-a"})
	if err != nil {
		t.Fatal(err)
	}
	d := &nodeDriver{m: m}
	d.feed(0, m.Start(0))
	d.feed(0, m.Step(0, Synced{}))
	d.feed(0, m.Step(0, LivenessResult{Err: WriteOK, Epoch: 1, Revision: 1}))
	now := time.Duration(0)
	for ; now < 5*time.Second; now += 10 * time.Millisecond {
		if _, ok := d.find(WriteAcquire); ok {
			break
		}
		d.feed(now, m.Step(now, Tick{}))
	}
	acq, ok := d.find(WriteAcquire)
	if !ok || acq.Leader.Node != "node-a" || acq.Leader.Epoch != 1 {
		t.Fatalf("bootstrap acquire: %+v (found %v)", acq, ok)
	}
	d.feed(now, m.Step(now, WriteResult{Op: acq.Op, Err: WriteOK, Revision: 2}))
	d.feed(now, m.Step(now, LivenessResult{Err: WriteOK, Epoch: 1, Revision: 3}))
	if !m.Serving() {
		t.Fatalf("phase %v after the bootstrap; want leader", m.Phase())
	}
	d.writes, d.events, d.fences = nil, nil, 0
	return d, now
}

// A holder whose node's liveness writer stops answering (while the member
// runs) fences within (failure_threshold+1) × heartbeat_timeout of its last
// answer: the member counts the silence as failed writes.
func TestNodeModeSilentWriterFences(t *testing.T) {
	d, now := bootstrapLeader(t)
	r := d.m.Rules()
	last := now
	fenced := time.Duration(0)
	for ; now < last+10*time.Second && fenced == 0; now += 10 * time.Millisecond {
		d.feed(now, d.m.Step(now, Tick{}))
		if d.fences > 0 {
			fenced = now - last
		}
	}
	bound := time.Duration(r.FailureThreshold+1) * r.HeartbeatTimeout
	if fenced == 0 || fenced > bound+20*time.Millisecond {
		t.Fatalf("fenced %v after the writer's last answer; want within %v", fenced, bound)
	}
	t.Logf("fenced %v after the writer's last answer (bound %v)", fenced, bound)
}

// A holder its node's failed liveness writes fenced records no more of
// them, whether the store stays out or its answers flap (every second
// write failing, as an overloaded store's do): each one would be an
// append per holder of the node. It records the failures that led to its
// fence, and one recovery after them.
func TestNodeModeFencedHolderRecordsNoMoreFailures(t *testing.T) {
	d, now := bootstrapLeader(t)
	r := d.m.Rules()
	step := func(in Input) { d.feed(now, d.m.Step(now, in)) }
	for i := 0; i < r.FailureThreshold; i++ {
		now += r.HeartbeatTimeout
		step(LivenessResult{Err: WriteUnavailable, Epoch: 1, Cause: "no answer"})
	}
	if d.fences != 1 || d.m.Phase() != PhaseSuspended {
		t.Fatalf("after %d failed liveness writes: %d fences, phase %v; want fenced and suspended", r.FailureThreshold, d.fences, d.m.Phase())
	}
	count := func(typ string) int {
		n := 0
		for _, ev := range d.events {
			if ev.EventType() == typ {
				n++
			}
		}
		return n
	}
	if n := count("failover.heartbeat_failed"); n != r.FailureThreshold {
		t.Fatalf("%d heartbeat_failed up to the fence, want %d", n, r.FailureThreshold)
	}
	d.events = nil
	rev := uint64(10)
	for i := 0; i < 40; i++ { // flapping: a failure, then a success
		now += r.HeartbeatTimeout / 2
		if i%2 == 0 {
			step(LivenessResult{Err: WriteUnavailable, Epoch: 1, Cause: "no answer"})
		} else {
			rev++
			step(LivenessResult{Err: WriteOK, Epoch: 1, Revision: rev})
		}
		step(Tick{})
	}
	// One recovery closes the failures it recorded; nothing after.
	if n, m := count("failover.heartbeat_failed"), count("failover.heartbeat_recovered"); n != 0 || m != 1 {
		t.Fatalf("a fenced holder recorded %d heartbeat_failed and %d heartbeat_recovered while the store flapped; want none and one", n, m)
	}
}
