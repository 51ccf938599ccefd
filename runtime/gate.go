package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"understudy/events"
)

// A host bounds what its members have in flight at the store: when many
// members act at once (a node's pairs all failing over), thousands of
// register writes and event appends would queue ahead of the node's own
// liveness write, which would then miss its deadline and make every member
// of the node count a failed heartbeat — overload turned into failure. The
// node's liveness writes are not bounded. A member write that waits past
// its deadline counts as failed, as any write lost; an append waits
// within its own timeout and is retried.
//
// Register and liveness writes come first: while any waits or flies,
// appends are held to appendsBesideWrites in flight. Appends record facts
// already decided, dated by how long they waited (events.HeaderQueued);
// a register write a heartbeat late is a failed heartbeat or a takeover
// missed. Every append and write goes to the same disk: a takeover of
// thousands of pairs writes each register once but appends a handful of
// events per pair, and those appends would otherwise take most of the
// store's writes while the registers wait.
const (
	maxMemberWrites     = 64
	maxAppends          = 64
	appendsBesideWrites = 4
)

// storeGate is a host's bounds on its writes to the store. Its members'
// KV writes run on maxMemberWrites workers of its own, goroutines that
// live on (a goroutine per write grew and copied its stack every time, a
// sixth of a node's CPU in a 10,000-pair takeover): register writes
// before member heartbeats (kvWrite.beat), each in the order they were
// asked for.
type storeGate struct {
	jobs    chan *gateJob // member KV writes waiting for a worker: register writes
	beats   chan *gateJob // member heartbeats waiting for a worker, taken when no register write waits (see beat)
	busy    atomic.Int64  // member KV writes being performed
	start   sync.Once     // the workers
	done    chan struct{} // closed by stop: the workers end
	stopped sync.Once
	kv      atomic.Int64  // KV writes waiting or in flight: members' and the node's liveness
	appends chan struct{} // appends in flight
	narrow  chan struct{} // appends in flight while KV writes wait
	pending atomic.Int64  // appends waiting or in flight

	batches       chan struct{} // batches in flight (maxBatches)
	uncertainKeys uncertainSet  // keys whose latest write may have landed unanswered (see uncertain)
	heldMu        sync.Mutex
	held          []*gateJob   // member writes waiting for a batch slot, oldest first (see run)
	batchOff      atomic.Int64 // unix nanos before which no batch is tried (the bucket refused one)
	onRefused     func(error)  // told when the bucket refuses a batch (nil: nobody)
	// seen is the latest revision of key the node's watch delivered (0:
	// none; nil: no node watch). See stale.
	seen    atomic.Pointer[func(key string) uint64]
	metrics *MemberMetrics // the node's (nil: none); the gate's only counts
	aq      appendQueue    // member appends waiting for a turn (gate_appends.go)
}

// gateJob is one member KV write waiting in the gate: a kvWrite, or (in
// tests) any function.
type gateJob struct {
	issueBy time.Time
	w       *kvWrite
	fn      func()
	alone   bool // its key's last write may have landed unanswered: never in a batch (see uncertain)
}

// kvWrite is one member's KV write: the write, its times (issued by
// issueBy or never; answered by deadline or counted failed by the
// member), and done, which hands the member the outcome.
type kvWrite struct {
	ctx      context.Context
	kv       events.KV
	w        events.KVWrite
	issueBy  time.Time
	deadline time.Time
	// beat marks a member's heartbeat (its state, for readers): issued
	// after the register writes waiting beside it. A register write
	// decides who serves; in a takeover of 10,000 pairs each new holder
	// also writes its heartbeat once or twice, and in arrival order half
	// the store's writes went to heartbeats while acquires waited.
	beat bool
	done func(rev uint64, err error, took time.Duration)
}

// Batches. When several member writes wait, a worker sends up to
// events.MaxKVBatch of them (distinct keys) as one atomic batch: the store
// syncs its disk once for the batch where it would sync once per write —
// a node taking over 10,000 registers waits for 40 syncs, not 10,000 in a
// row. At most maxBatches are in flight (JetStream bounds the open batches
// of a stream, 50 by default, over every node that writes it). A batch
// that fails on a conflict is split in two and each half sent again, down
// to single writes, which go as before (a conflict answer names the
// register's holder); a bucket that takes no batches is written one write
// at a time for batchRetry.
const (
	maxBatches = 4
	batchRetry = time.Minute
)

// maxQueuedWrites bounds the member writes waiting for a worker; past it
// a write runs on a goroutine of its own (unbounded, as before the
// workers): a member never blocks on the store.
const maxQueuedWrites = 1 << 16

func newStoreGate() *storeGate {
	return &storeGate{jobs: make(chan *gateJob, maxQueuedWrites), beats: make(chan *gateJob, maxQueuedWrites), done: make(chan struct{}), appends: make(chan struct{}, maxAppends),
		narrow: make(chan struct{}, appendsBesideWrites), batches: make(chan struct{}, maxBatches),
		aq: appendQueue{wake: make(chan struct{}, 1), batches: make(chan struct{}, maxBatches)}}
}

// submitWrite queues a member's KV write, to run on a worker after those
// asked for before it, alone or in a batch with others waiting at its
// turn; it never blocks. A write whose turn comes after its issueBy is
// dropped, never issued: the member counts it failed at its deadline, as
// any write not answered (see memberActor.kvWrite).
func (g *storeGate) submitWrite(w *kvWrite) {
	g.enqueue(&gateJob{issueBy: w.issueBy, w: w})
}

func (g *storeGate) enqueue(j *gateJob) {
	g.start.Do(func() {
		for range maxMemberWrites {
			go g.work()
		}
	})
	g.kv.Add(1)
	g.toWorkers(j)
}

// toWorkers queues j for a worker, in its queue (see kvWrite.beat); past
// maxQueuedWrites it runs on a goroutine of its own.
func (g *storeGate) toWorkers(j *gateJob) {
	q := g.jobs
	if j.w != nil && j.w.beat {
		q = g.beats
	}
	select {
	case q <- j:
	default:
		go g.run(j)
	}
}

func (g *storeGate) work() {
	for {
		var j *gateJob
		select {
		case j = <-g.jobs:
		default:
			select {
			case j = <-g.jobs:
			case j = <-g.beats:
			case <-g.done:
				return
			}
		}
		g.busy.Add(1)
		g.run(j)
		g.busy.Add(-1)
	}
}

// next takes a waiting job without waiting: a register write, else a
// member heartbeat (nil: none).
func (g *storeGate) next() *gateJob {
	select {
	case j := <-g.jobs:
		return j
	default:
	}
	select {
	case j := <-g.beats:
		return j
	default:
		return nil
	}
}

// queued is how many jobs wait for a worker.
func (g *storeGate) queued() int { return len(g.jobs) + len(g.beats) }

// late drops j if its turn came after its issue-by time.
func (g *storeGate) late(j *gateJob) bool {
	if !time.Now().After(j.issueBy) {
		return false
	}
	g.metrics.memberWrites("not_issued", 1) // before the count ends: a write is counted once it is no longer pending
	g.kv.Add(-1)
	return true
}

// run performs j at its turn: alone, or in a batch with the writes
// waiting behind it. While every batch slot is taken, j is held for the
// next batch rather than written alone beside them: each write alone
// costs the store a disk sync of its own, and in a 10,000-pair takeover
// 60 single writes in flight beside 4 batches took most of the store's
// syncs while the batches, and the writes queued behind them, waited past
// their turn (3,000–8,000 acquires a second not issued).
func (g *storeGate) run(j *gateJob) {
	if g.late(j) {
		return
	}
	if j.w == nil {
		j.fn()
		g.kv.Add(-1)
		return
	}
	if g.stale(j.w) {
		return
	}
	if j.alone {
		g.single(j.w)
		return
	}
	b, ok := j.w.kv.(events.KVBatcher)
	if !ok || time.Now().UnixNano() < g.batchOff.Load() || g.queued() == 0 && g.heldLen() == 0 {
		g.single(j.w)
		return
	}
	g.hold(j)
	g.drain(b)
}

// hold keeps j for the next batch: held writes are older than the
// queue's, and batches take them first.
func (g *storeGate) hold(j ...*gateJob) {
	g.heldMu.Lock()
	g.held = append(g.held, j...)
	g.heldMu.Unlock()
}

// holdFirst puts back writes a batch could not take (a key twice, another
// bucket): ahead of every other, once that batch is answered.
func (g *storeGate) holdFirst(j []*gateJob) {
	g.heldMu.Lock()
	g.held = append(j, g.held...)
	g.heldMu.Unlock()
}

func (g *storeGate) heldLen() int {
	g.heldMu.Lock()
	defer g.heldMu.Unlock()
	return len(g.held)
}

// nextHeld takes the oldest held write (nil: none).
func (g *storeGate) nextHeld() *gateJob {
	g.heldMu.Lock()
	defer g.heldMu.Unlock()
	if len(g.held) == 0 {
		return nil
	}
	j := g.held[0]
	g.held[0] = nil
	g.held = g.held[1:]
	return j
}

// drain sends the held writes, and those queued behind them, in batches
// while it can take a batch slot; with every slot taken it returns, and
// whoever holds one drains after giving it back (a write held is never
// left behind: it is held before its holder tries for a slot, and a slot
// is given back before its holder looks for held writes again).
func (g *storeGate) drain(b events.KVBatcher) {
	for g.heldLen() > 0 {
		select {
		case g.batches <- struct{}{}:
		default:
			return
		}
		var run []*gateJob // others' jobs (tests' functions) met in the queue
		for {
			j := g.nextHeld()
			if j == nil {
				j = g.next()
			}
			if j == nil {
				break
			}
			if j.w == nil {
				run = append(run, j)
				continue
			}
			if g.late(j) || g.stale(j.w) {
				continue
			}
			if g.uncertain(j.w) {
				j.alone = true
				run = append(run, j)
				continue
			}
			after, others := g.batch(b, j)
			run = append(run, others...)
			g.holdFirst(after)
		}
		<-g.batches
		for _, o := range run {
			if o.alone {
				// To the workers: a few hundred writes alone, one after
				// another here, would pass their turn.
				g.toWorkers(o)
				continue
			}
			g.run(o)
		}
	}
}

// batch sends j with the writes held and waiting behind it (up to
// events.MaxKVBatch, distinct keys) as one batch, within the batch slot
// its caller holds, and returns the writes it took but could not put in
// (after, to go next) and the queue's other jobs it met.
func (g *storeGate) batch(b events.KVBatcher, j *gateJob) (after, others []*gateJob) {
	batch := []*kvWrite{j.w}
	keys := map[string]bool{j.w.w.Key: true}
	take := func(o *gateJob) {
		switch {
		case o.w == nil:
			others = append(others, o)
		case o.w.kv != j.w.kv || keys[o.w.w.Key]:
			after = append(after, o)
		case g.late(o) || g.stale(o.w):
		case g.uncertain(o.w):
			o.alone = true
			others = append(others, o)
		default:
			batch = append(batch, o.w)
			keys[o.w.w.Key] = true
		}
	}
	for len(batch) < events.MaxKVBatch {
		o := g.nextHeld()
		if o == nil {
			break
		}
		take(o)
	}
	for len(batch) < events.MaxKVBatch {
		o := g.next()
		if o == nil {
			break
		}
		take(o)
	}
	g.writeBatch(b, batch) // one write alone goes alone
	return after, others
}

// stale answers w at once, without the store, when it is a
// compare-and-set on a revision the node's watch has already seen
// replaced: revisions only grow, so the store would refuse it too. In a
// batch such a write fails the whole batch, which is then halved down to
// it (eight more round trips for one write of 256); in a takeover of
// thousands of pairs these are the acquires whose earlier attempt landed
// after its member stopped waiting (a batch answered past its deadline),
// retried on the revision before it — 2,550 batches split in one
// 10,000-pair takeover, twice the batches that landed.
func (g *storeGate) stale(w *kvWrite) bool {
	seen := g.seen.Load()
	if seen == nil || w.w.Put || w.w.Revision == 0 {
		return false
	}
	rev := (*seen)(w.w.Key)
	if rev <= w.w.Revision {
		return false
	}
	g.metrics.memberWrites("stale", 1)
	g.kv.Add(-1)
	w.done(0, fmt.Errorf("%w: key %q is at revision %d already (the node's watch delivered it), write expected %d", events.ErrConflict, w.w.Key, rev, w.w.Revision), 0)
	return true
}

// single performs one member write on its own.
func (g *storeGate) single(w *kvWrite) {
	defer g.kv.Add(-1)
	g.metrics.memberWrites("alone", 1)
	if performWrite(w) {
		g.uncertainKeys.forget(w.w.Key)
	}
}

// performWrite performs w alone, within its deadline, and answers it;
// it reports whether the store's answer was definite (landed, or refused
// as a conflict).
func performWrite(w *kvWrite) (definite bool) {
	timeout := time.Until(w.deadline)
	if timeout <= 0 {
		return false // the member has already counted it as failed
	}
	ctx, cancel := context.WithTimeout(w.ctx, timeout)
	defer cancel()
	var rev uint64
	var err error
	began := time.Now()
	switch {
	case w.w.Put:
		rev, err = w.kv.Put(ctx, w.w.Key, w.w.Value)
	case w.w.Revision == 0:
		rev, err = w.kv.Create(ctx, w.w.Key, w.w.Value)
	default:
		rev, err = w.kv.Update(ctx, w.w.Key, w.w.Value, w.w.Revision)
	}
	w.done(rev, err, time.Since(began))
	return err == nil || errors.Is(err, events.ErrConflict)
}

// writeBatch sends batch as one atomic batch and answers every write of
// it: a conflict (or, on a replicated stream, a key with a write still
// being proposed) splits it in two, a refusal sends each alone, any
// other error is every write's answer. Writes whose turn to be issued
// has passed (half their window) are dropped first, as at their first
// turn; the batch must be answered by its earliest deadline, as each
// write alone would be.
func (g *storeGate) writeBatch(b events.KVBatcher, batch []*kvWrite) {
	now := time.Now()
	kept := batch[:0:0]
	for _, w := range batch {
		if now.After(w.issueBy) {
			g.metrics.memberWrites("not_issued", 1)
			g.kv.Add(-1)
			continue
		}
		kept = append(kept, w)
	}
	batch = kept
	switch len(batch) {
	case 0:
		return
	case 1:
		g.single(batch[0])
		return
	}
	deadline := batch[0].deadline
	writes := make([]events.KVWrite, len(batch))
	for i, w := range batch {
		writes[i] = w.w
		if w.deadline.Before(deadline) {
			deadline = w.deadline
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	began := time.Now()
	revs, err := b.WriteBatch(ctx, writes)
	took := time.Since(began)
	// A write the bucket refuses (a conflict, a key still being proposed,
	// an invalid key) fails the batch with nothing written: halves, so
	// that it fails alone and not its neighbours.
	split := errors.Is(err, events.ErrConflict) || errors.Is(err, events.ErrInFlight) || errors.Is(err, events.ErrInvalid)
	if !split {
		defer g.kv.Add(-int64(len(batch))) // the halves count for themselves
	}
	switch {
	case err == nil:
		g.metrics.batch("landed")
		g.metrics.memberWrites("batched", len(batch))
		for i, w := range batch {
			w.done(revs[i], nil, took)
		}
	case split:
		// Nothing was written, and which write was refused is not said.
		// Writes the node's watch has seen replaced meanwhile are answered
		// and the rest sent again whole; else halves, until the single
		// writes refused answer for themselves.
		g.metrics.batch("split")
		kept := batch[:0:0]
		for _, w := range batch {
			if !g.stale(w) {
				kept = append(kept, w)
			}
		}
		if len(kept) < len(batch) {
			g.writeBatch(b, kept)
			return
		}
		half := len(batch) / 2
		g.writeBatch(b, batch[:half])
		g.writeBatch(b, batch[half:])
	case errors.Is(err, events.ErrBatchUnsupported), errors.Is(err, events.ErrBatchNotCommitted):
		// Nothing was written: each alone, a few at a time; refused by the
		// bucket, no batch for batchRetry either. A batch only not
		// committed (its connection failed before the commit, too many
		// batches open) says nothing of the next: batches go on.
		if errors.Is(err, events.ErrBatchUnsupported) {
			g.metrics.batch("refused")
			if g.batchOff.Swap(time.Now().Add(batchRetry).UnixNano()) == 0 && g.onRefused != nil {
				g.onRefused(err)
			}
		} else {
			g.metrics.batch("not_committed")
		}
		g.metrics.memberWrites("alone", len(batch))
		next := make(chan *kvWrite, len(batch))
		for _, w := range batch {
			next <- w
		}
		close(next)
		var wg sync.WaitGroup
		for range min(len(batch), refusedWriters) {
			wg.Go(func() {
				for w := range next {
					performWrite(w)
				}
			})
		}
		wg.Wait()
	default:
		g.metrics.batch("failed")
		for _, w := range batch {
			g.uncertainKeys.mark(w.w.Key)
			w.done(0, err, took)
		}
	}
}

// uncertainFor is how long a key whose write may have landed unanswered
// keeps its next writes out of batches (a few heartbeats: by then the
// node's watch has delivered what landed, and stale answers for it).
const uncertainFor = 5 * time.Second

// uncertainSet holds names (register keys, event subjects) whose latest
// write failed without a definite answer (a batch not answered by its
// deadline may still have been committed), each for uncertainFor.
type uncertainSet struct {
	mu sync.Mutex
	at map[string]time.Time
}

// mark records name as uncertain from now.
func (u *uncertainSet) mark(name string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.at == nil {
		u.at = map[string]time.Time{}
	}
	now := time.Now()
	if len(u.at) > maxQueuedWrites {
		for k, at := range u.at {
			if now.Sub(at) > uncertainFor {
				delete(u.at, k)
			}
		}
	}
	u.at[name] = now
}

// has reports whether name was marked within uncertainFor.
func (u *uncertainSet) has(name string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	at, ok := u.at[name]
	if ok && time.Since(at) > uncertainFor {
		delete(u.at, name)
		return false
	}
	return ok
}

// forget ends name's uncertainty (its write was answered).
func (u *uncertainSet) forget(name string) {
	u.mu.Lock()
	delete(u.at, name)
	u.mu.Unlock()
}

// uncertain reports whether w is a compare-and-set on a key whose latest
// write may have landed unanswered: the member retries on the revision
// before it, and if that write landed the retry is refused — alone it
// costs one answer, in a batch it fails the batch, which is then halved
// down to it. Such a write goes alone; its answer ends the uncertainty.
func (g *storeGate) uncertain(w *kvWrite) bool {
	if w.w.Put || w.w.Revision == 0 {
		return false
	}
	return g.uncertainKeys.has(w.w.Key)
}

// refusedWriters bounds the single writes of a refused batch in flight.
const refusedWriters = 16

// stop ends the workers once the host's members have stopped; a write
// still waiting is never issued (its member counts it failed, as any
// write not answered by its deadline).
func (g *storeGate) stop() {
	if g != nil {
		g.stopped.Do(func() { close(g.done) })
	}
}

// priority marks a KV write that takes no member slot (the node's
// liveness): appends make way for it all the same.
func (g *storeGate) priority() (release func()) {
	g.kv.Add(1)
	return func() { g.kv.Add(-1) }
}

// appendTurn waits for an append's turn; release ends it.
func (g *storeGate) appendTurn(ctx context.Context) (release func(), err error) {
	g.pending.Add(1)
	end, _, err := g.turn(ctx)
	if err != nil {
		g.pending.Add(-1)
		return nil, err
	}
	return func() { end(); g.pending.Add(-1) }, nil
}

// turn waits for a turn to send appends (one, or a batch of them);
// narrow says it is one of the appendsBesideWrites turns given while KV
// writes wait or fly.
func (g *storeGate) turn(ctx context.Context) (release func(), narrow bool, err error) {
	select {
	case g.appends <- struct{}{}:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	if g.kv.Load() == 0 {
		return func() { <-g.appends }, false, nil
	}
	// KV writes wait: the turn comes only while fewer than
	// appendsBesideWrites others fly beside them. (No polling for the
	// writes' end: thousands of waiting appenders waking every few
	// milliseconds starve the process. At most maxAppends wait here, and
	// narrow turns last one send each.)
	select {
	case g.narrow <- struct{}{}:
		return func() { <-g.narrow; <-g.appends }, true, nil
	case <-ctx.Done():
		<-g.appends
		return nil, false, ctx.Err()
	}
}

// settled reports whether the host's appends and member writes in flight
// are back within their bounds (see Host.settle).
func (g *storeGate) settled() bool {
	return g.pending.Load() <= maxAppends && g.queued() == 0 && g.heldLen() == 0 && g.busy.Load() < maxMemberWrites/2
}

// boundedLog is a host's event log with its appends gated. An appender
// recognises it and waits for its turn itself, before its append's
// deadline starts, then appends on the ungated log.
type boundedLog struct {
	events.Log
	gate *storeGate
}

func (l boundedLog) Append(ctx context.Context, subject string, ev events.Event, opts events.AppendOptions) (events.Ack, error) {
	release, err := l.gate.appendTurn(ctx)
	if err != nil {
		return events.Ack{}, err
	}
	defer release()
	return l.Log.Append(ctx, subject, ev, opts)
}

func (l boundedLog) AppendRaw(ctx context.Context, subject string, data []byte, opts events.AppendOptions) (events.Ack, error) {
	release, err := l.gate.appendTurn(ctx)
	if err != nil {
		return events.Ack{}, err
	}
	defer release()
	return l.Log.AppendRaw(ctx, subject, data, opts)
}
