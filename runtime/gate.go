package runtime

import (
	"context"
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
// KV writes run on maxMemberWrites workers of its own, in the order they
// were asked for: goroutines that live on (a goroutine per write grew
// and copied its stack every time, a sixth of a node's CPU in a
// 10,000-pair takeover).
type storeGate struct {
	jobs    chan func()   // member KV writes waiting for a worker
	busy    atomic.Int64  // member KV writes being performed
	dropped atomic.Int64  // member KV writes whose turn came too late to issue
	start   sync.Once     // the workers
	done    chan struct{} // closed by stop: the workers end
	stopped sync.Once
	kv      atomic.Int64  // KV writes waiting or in flight: members' and the node's liveness
	appends chan struct{} // appends in flight
	narrow  chan struct{} // appends in flight while KV writes wait
	pending atomic.Int64  // appends waiting or in flight
}

// maxQueuedWrites bounds the member writes waiting for a worker; past it
// a write runs on a goroutine of its own (unbounded, as before the
// workers): a member never blocks on the store.
const maxQueuedWrites = 1 << 16

func newStoreGate() *storeGate {
	return &storeGate{jobs: make(chan func(), maxQueuedWrites), done: make(chan struct{}), appends: make(chan struct{}, maxAppends),
		narrow: make(chan struct{}, appendsBesideWrites)}
}

// submit runs a member's KV write on a worker, after those asked for
// before it; it never blocks. A write whose turn comes after issueBy is
// dropped, never issued: the member counts it failed at its deadline, as
// any write not answered (see member.write).
func (g *storeGate) submit(issueBy time.Time, write func()) {
	g.start.Do(func() {
		for range maxMemberWrites {
			go g.work()
		}
	})
	g.kv.Add(1)
	job := func() {
		if time.Now().After(issueBy) {
			g.dropped.Add(1)
			return
		}
		write()
	}
	select {
	case g.jobs <- job:
	default:
		go func() {
			defer g.kv.Add(-1)
			job()
		}()
	}
}

func (g *storeGate) work() {
	for {
		select {
		case write := <-g.jobs:
			g.busy.Add(1)
			write()
			g.busy.Add(-1)
			g.kv.Add(-1)
		case <-g.done:
			return
		}
	}
}

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
	select {
	case g.appends <- struct{}{}:
	case <-ctx.Done():
		g.pending.Add(-1)
		return nil, ctx.Err()
	}
	if g.kv.Load() == 0 {
		return func() { <-g.appends; g.pending.Add(-1) }, nil
	}
	// KV writes wait: the append goes only while fewer than
	// appendsBesideWrites others fly beside them. (No polling for the
	// writes' end: thousands of waiting appenders waking every few
	// milliseconds starve the process. At most maxAppends wait here, and
	// narrow turns last one append each.)
	select {
	case g.narrow <- struct{}{}:
		return func() { <-g.narrow; <-g.appends; g.pending.Add(-1) }, nil
	case <-ctx.Done():
		<-g.appends
		g.pending.Add(-1)
		return nil, ctx.Err()
	}
}

// settled reports whether the host's appends and member writes in flight
// are back within their bounds (see Host.settle).
func (g *storeGate) settled() bool {
	return g.pending.Load() <= maxAppends && len(g.jobs) == 0 && g.busy.Load() < maxMemberWrites/2
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
