package runtime

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anthdm/hollywood/actor"

	"understudy/actors/failover"
	"understudy/events"
)

// Node liveness (leadership: node) as the runtime hosts it: one
// livenessActor per Host writes the node's liveness record
// (failover.NodeLiveness) and hands every result to every member of the
// node; the node's one watch (nodeWatch) hands every liveness record to
// every member; members' raises of another node's epoch go through the
// host's raiseDeduper, so that the pairs of one dead node raise its epoch
// with one write.

// livenessEntryOf is an entry of node's liveness record as members and
// the node's writer see it: a delete marker, a value that does not decode
// or (with a trust) whose signature does not verify is Forged — never a
// beat, never a raise — and why is returned.
func livenessEntryOf(node string, e events.Entry, trust *ValueTrust) (failover.LivenessEntry, error) {
	le := failover.LivenessEntry{Rev: e.Revision, Time: e.Time.UTC(), Value: failover.Liveness{Node: node}}
	if e.Op != events.OpPut {
		le.Forged = true
		return le, errors.New("the record was deleted")
	}
	l, err := failover.DecodeLiveness(e.Value)
	if err != nil {
		le.Forged = true
		return le, err
	}
	le.Value = l
	if err := trust.VerifyLiveness(node, e.Value, l); err != nil {
		le.Forged = true
		return le, err
	}
	if trust == nil && l.Node != node {
		le.Forged = true
		return le, errors.New("it is node " + l.Node + "'s value, in node " + node + "'s record")
	}
	return le, nil
}

// readLiveness reads key, a liveness record, back after a lost
// compare-and-set (nil when it cannot be read). A deleted record is read
// from its history, so that the next compare-and-set expects the delete
// marker's revision.
func readLiveness(ctx context.Context, kv events.KV, trust *ValueTrust, key string) *failover.LivenessEntry {
	node := failover.LivenessNode(key)
	e, err := kv.Get(ctx, key)
	if errors.Is(err, events.ErrNotFound) {
		hist, herr := kv.History(ctx, key)
		if herr != nil || len(hist) == 0 {
			return nil
		}
		e, err = hist[len(hist)-1], nil
	}
	if err != nil {
		return nil
	}
	le, _ := livenessEntryOf(node, e, trust)
	return &le
}

// Messages of the liveness actor.
type (
	livenessTick  struct{ gen uint64 }
	livenessInput struct{ in failover.Input }
)

// livenessActor hosts the node's failover.NodeLiveness: it feeds it the
// node's own record from the node's watch, real timers and its writes'
// results, performs its writes, and hands every failover.LivenessResult to
// every member of the node, in order.
type livenessActor struct {
	node     string
	interval time.Duration
	kv       events.KV
	trust    *ValueTrust
	watch    *nodeWatch
	health   *storeHealth
	gate     *storeGate // its writes go before the host's appends; nil in tests
	log      *slog.Logger

	nl      *failover.NodeLiveness
	base    time.Time
	pid     *actor.PID
	engine  *actor.Engine
	ctx     context.Context
	cancel  context.CancelFunc
	timer   *time.Timer
	tickGen uint64
	epoch   uint64 // the latest epoch logged
}

func newLivenessActor(node string, interval time.Duration, kv events.KV, trust *ValueTrust, watch *nodeWatch, health *storeHealth, gate *storeGate, log *slog.Logger) actor.Producer {
	return func() actor.Receiver {
		return &livenessActor{node: node, interval: interval, kv: kv, trust: trust, watch: watch, health: health, gate: gate,
			log: log.With("node", node, "component", "liveness")}
	}
}

func (a *livenessActor) now() time.Duration { return time.Since(a.base) }

func (a *livenessActor) Receive(c *actor.Context) {
	switch msg := c.Message().(type) {
	case actor.Started:
		// A restart starts afresh: the record as the watch shows it, then
		// Synced, and the writer carries on its epoch.
		a.pid, a.engine, a.base = c.PID(), c.Engine(), time.Now()
		a.ctx, a.cancel = context.WithCancel(context.Background())
		a.nl = failover.NewNodeLiveness(a.node, a.interval)
		pid, engine := a.pid, a.engine
		a.watch.setLiveness(func(in failover.Input) { engine.Send(pid, livenessInput{in}) })
		a.handle(a.nl.Start(a.now()))
	case actor.Stopped:
		a.watch.setLiveness(nil)
		if a.cancel != nil {
			a.cancel()
		}
		if a.timer != nil {
			a.timer.Stop()
		}
	case livenessTick:
		if msg.gen == a.tickGen {
			a.handle(a.nl.Step(a.now(), failover.Tick{}))
		}
	case livenessInput:
		if _, ok := msg.in.(failover.LivenessProbe); ok {
			a.watch.probing.Store(false)
		}
		a.handle(a.nl.Step(a.now(), msg.in))
	}
}

func (a *livenessActor) handle(r failover.NodeReady) {
	for _, w := range r.Writes {
		v, err := a.trust.SignLiveness(w.Live)
		if err != nil {
			// Unsigned, it counts for nobody: the writer counts it failed
			// at its deadline, as any write lost.
			a.log.Error("liveness write not signed, not written", "err", err)
			continue
		}
		go a.write(w, v)
	}
	for _, res := range r.Results {
		if res.Err == failover.WriteConflict && res.Epoch != a.epoch {
			a.log.Warn("node liveness epoch raised by another node: every member of this node fences what it led in the old epoch",
				"epoch", res.Epoch, "cause", res.Cause)
		}
		a.epoch = res.Epoch
		a.watch.broadcast(res)
	}
	last, worst := a.nl.Latency()
	a.health.set(last, worst, a.nl.Degraded(), a.interval)
	a.schedule()
}

func (a *livenessActor) schedule() {
	a.tickGen++
	gen := a.tickGen
	d := max(a.nl.NextWake()-a.now(), time.Millisecond)
	if a.timer != nil {
		a.timer.Stop()
	}
	pid, engine := a.pid, a.engine
	a.timer = time.AfterFunc(d, func() { engine.Send(pid, livenessTick{gen}) })
}

// write performs one liveness write by compare-and-set (Create when it
// expects no revision) within its deadline, and answers it; a lost
// compare-and-set reads the record back.
func (a *livenessActor) write(w failover.Write, value []byte) {
	timeout := w.Deadline - a.now()
	if timeout <= 0 {
		return
	}
	ctx, cancel := context.WithTimeout(a.ctx, timeout)
	defer cancel()
	if a.gate != nil {
		defer a.gate.priority()()
	}
	res := casLiveness(ctx, a.kv, a.trust, w, value)
	if a.ctx.Err() != nil {
		return
	}
	if res.Err == failover.WriteOK {
		a.watch.acked(res.Revision)
	}
	a.engine.Send(a.pid, livenessInput{res})
}

// casLiveness writes value to w.Key by compare-and-set on w.ExpectRev (0:
// Create) and answers as the member or the node's writer must see it: a
// lost compare-and-set carries the record read back (CurrentLive).
func casLiveness(ctx context.Context, kv events.KV, trust *ValueTrust, w failover.Write, value []byte) failover.WriteResult {
	var rev uint64
	var err error
	if w.ExpectRev == 0 {
		rev, err = kv.Create(ctx, w.Key, value)
	} else {
		rev, err = kv.Update(ctx, w.Key, value, w.ExpectRev)
	}
	res := failover.WriteResult{Op: w.Op, Err: failover.WriteErrOf(err), Revision: rev}
	switch res.Err {
	case failover.WriteOK:
	case failover.WriteConflict:
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		res.CurrentLive = readLiveness(rctx, kv, trust, w.Key)
		rcancel()
	default:
		res.Cause = err.Error()
	}
	return res
}

// raiseDeduper performs the members' raises of other nodes' epochs
// (failover.WriteBump): identical raises (same key, same expected
// revision) in flight, or answered within the last heartbeat, make one
// write and share its answer, so that the pairs of one dead node raise its
// epoch with one write. The values of identical raises are identical: the
// raise names the dead node, the epoch above the record it judged stale,
// this node as the writer and that record's revision. Safe for
// concurrent use.
type raiseDeduper struct {
	kv    events.KV
	trust *ValueTrust
	keep  time.Duration // how long an answer serves later identical raises

	mu      sync.Mutex
	flights map[raiseKey]*raiseFlight
	written atomic.Uint64 // raises written
	joined  atomic.Uint64 // raises answered by another's write
}

type raiseKey struct {
	key    string
	expect uint64
}

type raiseFlight struct {
	done chan struct{} // closed when res is set
	res  failover.WriteResult
	at   time.Time // when it was answered
}

func newRaiseDeduper(kv events.KV, trust *ValueTrust, keep time.Duration) *raiseDeduper {
	return &raiseDeduper{kv: kv, trust: trust, keep: keep, flights: map[raiseKey]*raiseFlight{}}
}

// raise performs raise w with the signed value, or joins an identical
// raise, and returns its answer with w's Op; ok is false when ctx ended
// first (the member counts the raise failed at its deadline). deadline
// bounds the write when this call performs it.
func (d *raiseDeduper) raise(ctx context.Context, w failover.Write, value []byte, deadline time.Time) (failover.WriteResult, bool) {
	k := raiseKey{w.Key, w.ExpectRev}
	now := time.Now()
	d.mu.Lock()
	for key, f := range d.flights { // few: one per node raised
		if !f.at.IsZero() && now.Sub(f.at) > d.keep {
			delete(d.flights, key)
		}
	}
	f, joined := d.flights[k]
	if !joined {
		f = &raiseFlight{done: make(chan struct{})}
		d.flights[k] = f
	}
	d.mu.Unlock()
	if joined {
		d.joined.Add(1)
	} else {
		d.written.Add(1)
		go func() {
			// Its own context: a member that stops does not cancel the
			// raise the others wait for.
			wctx, cancel := context.WithDeadline(context.Background(), deadline)
			res := casLiveness(wctx, d.kv, d.trust, w, value)
			cancel()
			d.mu.Lock()
			f.res, f.at = res, time.Now()
			d.mu.Unlock()
			close(f.done)
		}()
	}
	select {
	case <-f.done:
	case <-ctx.Done():
		return failover.WriteResult{}, false
	}
	res := f.res
	res.Op = w.Op
	return res, true
}

// storeHealth is what the node reports of its store's write latency:
// the latest and worst recent answer times of its heartbeat writes, and
// whether they approach heartbeat_timeout (degraded: overload, not yet
// failure; members fence only at failure_threshold missed writes). It
// logs one warning per degraded episode. Safe for concurrent use.
type storeHealth struct {
	log     *slog.Logger
	metrics *MemberMetrics

	mu       sync.Mutex
	degraded bool
	since    time.Time
	last     time.Duration
	worst    time.Duration
	interval time.Duration
	// Per-pair leadership: the members' own writes, over two windows.
	cur, prev healthWindow
}

// healthWindow is the writes of one window of per-pair leadership.
type healthWindow struct {
	start time.Time
	worst time.Duration
	slow  bool // a write took more than half its heartbeat_timeout
}

// healthWindowLen is the length of a window of member writes: a write
// slow within the last one or two windows keeps the node degraded.
const healthWindowLen = 5 * time.Second

func newStoreHealth(log *slog.Logger, m *MemberMetrics) *storeHealth {
	return &storeHealth{log: log, metrics: m}
}

// set records the node liveness writer's view (leadership: node).
func (h *storeHealth) set(last, worst time.Duration, degraded bool, interval time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last, h.worst, h.interval = last, worst, interval
	h.update(degraded)
}

// observeWrite records one member write's answer time d (per-pair
// leadership); interval is the member's heartbeat_timeout.
func (h *storeHealth) observeWrite(d, interval time.Duration) {
	if h == nil {
		return
	}
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if now.Sub(h.cur.start) > healthWindowLen {
		h.prev, h.cur = h.cur, healthWindow{start: now}
		if now.Sub(h.prev.start) > 2*healthWindowLen {
			h.prev = healthWindow{}
		}
	}
	h.cur.worst = max(h.cur.worst, d)
	h.cur.slow = h.cur.slow || d > interval/2
	h.last, h.worst, h.interval = d, max(h.cur.worst, h.prev.worst), interval
	h.update(h.cur.slow || h.prev.slow)
}

// update records whether the node is degraded, logging the start and end
// of an episode once each. h.mu is held.
func (h *storeHealth) update(degraded bool) {
	h.metrics.storeHealth(h.worst, degraded)
	switch {
	case degraded && !h.degraded:
		h.since = time.Now()
		h.log.Warn("store writes are slow: heartbeats are at risk (overload, not failure); members fence only if writes keep missing heartbeat_timeout",
			"write_latency", h.last, "worst_recent", h.worst, "heartbeat_timeout", h.interval)
	case !degraded && h.degraded:
		h.log.Info("store write latency is back to normal", "write_latency", h.last, "worst_recent", h.worst, "degraded_for", time.Since(h.since).Round(time.Millisecond))
	}
	h.degraded = degraded
}

// StoreHealth is the node's view of its store's write latency.
type StoreHealth struct {
	// Degraded: recent heartbeat writes took more than half of
	// heartbeat_timeout; Since when.
	Degraded bool
	Since    time.Time
	// Latest and Worst recent answer times of the node's heartbeat writes
	// (the liveness record's with leadership: node, the members' own
	// otherwise); HeartbeatTimeout is theirs.
	Latest, Worst    time.Duration
	HeartbeatTimeout time.Duration
}

func (h *storeHealth) snapshot() StoreHealth {
	if h == nil {
		return StoreHealth{}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.cur.start.IsZero() && time.Since(h.cur.start) > 2*healthWindowLen {
		// Per-pair members that stopped writing: nothing is slow any more.
		h.cur, h.prev = healthWindow{}, healthWindow{}
		h.worst = 0
		h.update(false)
	}
	return StoreHealth{Degraded: h.degraded, Since: h.since, Latest: h.last, Worst: h.worst, HeartbeatTimeout: h.interval}
}
