package simulations

import "time"

// evKind is what a queued item does when its time comes.
type evKind uint8

const (
	evTick          evKind = iota + 1 // a member's timer (node, gen)
	evUp                              // a message reaches the server from a node (ref)
	evDown                            // a message reaches a node from the server (ref)
	evStepDone                        // a resource step's driver reports (ref)
	evProcDone                        // a chain result reaches the member (ref)
	evAppendTimeout                   // an event append got no answer in time (node, gen = attempt)
	evFaultStart                      // fault ref begins
	evFaultEnd                        // fault ref ends
	evRestart                         // a node's process starts again (node)
	evWatchdog                        // a paused node's watchdog looks (node, gen = pause id)
	evServerUp                        // the NATS server is back (ref = outage id)
	evAppendRetry                     // an appender's backoff after a failed attempt is over (node, ref = stream, gen = attempt)
	evElection                        // a leader without quorum has been silent for the election timeout (gen)
	evEnd                             // the run is over
	evCommit                          // database mode: the writer commits on whatever serves
	evDBDone                          // database mode: a workload call (check, rejoin, sync) ends (node, gen = call id, ref = 1 for a check)
	evForge                           // a forger writes again (ref = fault)
	evLiveTick                        // node leadership: a machine's liveness writer's timer (node, gen)
	evStored                          // StoreWriteTime: the server has served a write that waited (ref)
	evSlotDeadline                    // HostWriteBound: a request's deadline, its gate slot freed if held (node, ref = gate, gen = token)
	evBatchDeadline                   // HostBatch: the earliest deadline of a batch part's writes, which fails it if unanswered (node, ref = batch, gen = its send)
	evConnCheck                       // HostConnWatch: a machine judges its connection (node; gen 1: a reconnection attempt only)
	evStarted                         // Config.CPU.StartCost: a step's process has started (node, ref = the mStep, gen = the machine's incarnation)
	evLiveProbe                       // node leadership: a member asked its machine's liveness writer for a write now (node)
)

// item is one entry of the event queue: ordered by (at, seq). It holds no
// pointers, so the heap costs the garbage collector nothing. node is the
// machine; a member's item names its pair in ref when ref is no message
// (evTick: the pair; evAppendTimeout, evAppendRetry: stream | pair<<1;
// evDBDone: check | pair<<1; evCommit: the pair), in the message otherwise.
type item struct {
	at   time.Duration
	seq  uint64
	gen  uint64
	ref  int32
	node int8
	kind evKind
	// served: the machine's CPU was reserved for it (cpu.go); it is taken
	// in when it comes out of the queue.
	served bool
}

// queue is a binary min-heap of items on a plain slice (no container/heap:
// no interface boxing on the hot path).
type queue struct{ h []item }

func (q *queue) less(i, j int) bool {
	a, b := &q.h[i], &q.h[j]
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

func (q *queue) push(it item) {
	q.h = append(q.h, it)
	i := len(q.h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !q.less(i, p) {
			break
		}
		q.h[i], q.h[p] = q.h[p], q.h[i]
		i = p
	}
}

func (q *queue) pop() item {
	top := q.h[0]
	n := len(q.h) - 1
	q.h[0] = q.h[n]
	q.h = q.h[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && q.less(r, l) {
			m = r
		}
		if !q.less(m, i) {
			break
		}
		q.h[i], q.h[m] = q.h[m], q.h[i]
		i = m
	}
	return top
}

func (q *queue) len() int { return len(q.h) }
