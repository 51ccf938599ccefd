package runtime

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"understudy/events"
)

// Append batches. A member appends its events one at a time, each synced
// to disk by the store on its own: a node taking over 10,000 pairs
// appends a handful of events per pair, and those syncs, one after
// another, were most of the store's time in the takeover (the register
// writes, batched, waited behind them). Appends waiting for their turn
// now go together: when a turn frees, the appends queued for one (oldest
// first, distinct subjects, up to events.MaxLogBatch) go as one atomic
// batch on the events stream, which the store checks as a whole and syncs
// once. With turns free, an append goes alone as before; the bounds on
// turns are appendTurn's, and at most maxBatches batches of appends are
// in flight (JetStream bounds the open batches of a stream, 50 by
// default, over every node that writes it): while they all fly, the
// appends wait for the next.
//
// While KV writes wait or fly, appends are held to appendsBesideWrites in
// flight as before, one append a turn: a batch of 256 appends costs the
// store about what a batch of 256 registers does (its checks and its
// writes, not one sync), and in a 10,000-pair takeover 4 such batches
// beside the register batches took half the store from them (the last
// register taken 43 s after the kill instead of 13.5 s). Appends record
// what was decided already; the registers decide.
//
// A batch the store refuses whole (a stale expectation, a message id it
// holds, a subject with a write still being proposed) stored nothing: it
// is halved and each half sent again, down to single appends, which get
// the answers an appender knows how to read. A batch or append not
// answered in time may still have been stored: its appenders retry under
// the same message ids, and for uncertainFor those retries go alone (in a
// batch, the retry of an append that landed would refuse the batch).
// A stream that takes no batches is appended to one append per turn for
// batchRetry.

// appendTimeout is the store's time to answer one send of appends, alone
// or batched (an appender's own wait for its turn has no deadline).
const appendTimeout = 5 * time.Second

// appendJob is one member append waiting in the gate.
type appendJob struct {
	ctx   context.Context // the appender's: once it ends, a job still queued is dropped
	log   events.LogBatcher
	a     events.LogAppend
	born  time.Time // when its appender queued the event (dated by events.HeaderQueued at the send)
	alone bool      // its subject's last append may have landed unanswered
	done  chan appendResult
	// queued: in appendQueue.jobs (under its mu); whoever takes it out
	// answers it or drops it, once.
	queued bool
}

type appendResult struct {
	ack events.Ack
	err error
}

// appendQueue is a gate's member appends waiting for a turn.
type appendQueue struct {
	start     sync.Once
	wake      chan struct{} // size 1
	batches   chan struct{} // batches in flight (maxBatches)
	mu        sync.Mutex
	jobs      []*appendJob
	uncertain uncertainSet // subjects whose last append may have landed unanswered
	off       atomic.Int64 // unix nanos before which no batch is tried (the stream refused one)
}

// appendQueued appends a on log at its turn, alone or in a batch with
// the appends waiting beside it, and returns its ack (or the error of its
// send, as log.AppendRaw would answer it alone). The wait for the turn
// ends only with ctx; the send has appendTimeout. born dates the event.
func (g *storeGate) appendQueued(ctx context.Context, log events.LogBatcher, a events.LogAppend, born time.Time) (events.Ack, error) {
	q := &g.aq
	q.start.Do(func() { go g.dispatchAppends() })
	j := &appendJob{ctx: ctx, log: log, a: a, born: born, alone: g.aq.uncertain.has(a.Subject), done: make(chan appendResult, 1), queued: true}
	g.pending.Add(1)
	q.mu.Lock()
	q.jobs = append(q.jobs, j)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	select {
	case r := <-j.done:
		return r.ack, r.err
	case <-ctx.Done():
		q.mu.Lock()
		if j.queued {
			j.queued = false
			q.jobs = removeJob(q.jobs, j)
			g.pending.Add(-1)
		}
		q.mu.Unlock()
		return events.Ack{}, ctx.Err() // never sent, or sent and its answer unread
	}
}

func removeJob(jobs []*appendJob, j *appendJob) []*appendJob {
	for i, x := range jobs {
		if x == j {
			copy(jobs[i:], jobs[i+1:])
			jobs[len(jobs)-1] = nil
			return jobs[:len(jobs)-1]
		}
	}
	return jobs
}

// dispatchAppends takes a turn whenever appends wait, and sends those
// waiting at that moment (see takeAppends) on it.
func (g *storeGate) dispatchAppends() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-g.done
		cancel()
	}()
	q := &g.aq
	for {
		q.mu.Lock()
		n := len(q.jobs)
		q.mu.Unlock()
		if n == 0 {
			select {
			case <-q.wake:
				continue
			case <-g.done:
				return
			}
		}
		release, narrow, err := g.turn(ctx)
		if err != nil {
			return
		}
		batch := false
		if !narrow && g.batchWanted() {
			select {
			case q.batches <- struct{}{}:
				batch = true
				prev := release
				release = func() { <-q.batches; prev() }
			case <-ctx.Done():
				release()
				return
			}
		}
		jobs := g.takeAppends(batch)
		if len(jobs) == 0 {
			release()
			continue
		}
		go func() {
			defer release()
			g.sendAppends(ctx, jobs)
		}()
	}
}

// batchWanted reports whether the appends waiting would go as a batch:
// more than one, the oldest not bound to go alone.
func (g *storeGate) batchWanted() bool {
	q := &g.aq
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.jobs) > 1 && !q.jobs[0].aloneNow(q.off.Load())
}

// aloneNow reports whether j goes alone: its subject uncertain, or its
// stream taking no batches (now, or before off).
func (j *appendJob) aloneNow(off int64) bool {
	return j.alone || !j.log.Batches() || time.Now().UnixNano() < off
}

// takeAppends takes the appends for one send from the queue: its oldest,
// and, when batch is set and that one may be batched (aloneNow), those
// behind it on the same log and on other subjects, up to
// events.MaxLogBatch; appends whose appender stopped are dropped.
func (g *storeGate) takeAppends(batch bool) []*appendJob {
	q := &g.aq
	q.mu.Lock()
	defer q.mu.Unlock()
	var take []*appendJob
	var subjects map[string]struct{}
	limit := events.MaxLogBatch
	if !batch {
		limit = 1
	}
	rest := q.jobs[:0]
	for i, j := range q.jobs {
		if len(take) == limit {
			rest = append(rest, q.jobs[i:]...)
			break
		}
		if j.ctx.Err() != nil {
			j.queued = false
			g.pending.Add(-1)
			continue
		}
		if len(take) == 0 {
			take = append(take, j)
			if j.aloneNow(q.off.Load()) {
				limit = 1
			}
			subjects = map[string]struct{}{j.a.Subject: {}}
			continue
		}
		if _, twice := subjects[j.a.Subject]; twice || j.alone || j.log != take[0].log {
			rest = append(rest, j)
			continue
		}
		take = append(take, j)
		subjects[j.a.Subject] = struct{}{}
	}
	clear(q.jobs[len(rest):])
	q.jobs = rest
	for _, j := range take {
		j.queued = false
	}
	return take
}

// requeue puts appends back at the head of the queue, oldest first.
func (g *storeGate) requeue(jobs []*appendJob) {
	q := &g.aq
	q.mu.Lock()
	for _, j := range jobs {
		j.queued = true
	}
	q.jobs = append(jobs[:len(jobs):len(jobs)], q.jobs...)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// sendAppends sends jobs on one turn: alone, or as one atomic batch,
// halved while the store refuses it whole.
func (g *storeGate) sendAppends(ctx context.Context, jobs []*appendJob) {
	if len(jobs) == 1 {
		g.sendAlone(ctx, jobs[0])
		return
	}
	appends := make([]events.LogAppend, len(jobs))
	for i, j := range jobs {
		appends[i] = j.stamped()
	}
	actx, cancel := context.WithTimeout(ctx, appendTimeout)
	acks, err := jobs[0].log.AppendBatch(actx, appends)
	cancel()
	switch {
	case err == nil:
		g.metrics.appendBatchOutcome("landed")
		g.metrics.appended("batched", len(jobs))
		for i, j := range jobs {
			g.answer(j, acks[i], nil)
		}
	case errors.Is(err, events.ErrConflict), errors.Is(err, events.ErrBatchDuplicate), errors.Is(err, events.ErrInFlight):
		// Nothing stored; which append is not said: halve.
		g.metrics.appendBatchOutcome("split")
		h := len(jobs) / 2
		g.sendAppends(ctx, jobs[:h])
		g.sendAppends(ctx, jobs[h:])
	case errors.Is(err, events.ErrBatchUnsupported):
		// Nothing stored: one append per turn for a while.
		g.metrics.appendBatchOutcome("refused")
		if g.aq.off.Swap(time.Now().Add(batchRetry).UnixNano()) == 0 && g.onRefused != nil {
			g.onRefused(err)
		}
		g.requeue(jobs)
	case errors.Is(err, events.ErrBatchNotCommitted):
		// Nothing stored, this time only (its connection failed before
		// the commit, too many batches open): each appender retries at
		// its own pace, and nothing is uncertain. Requeued, a batch would
		// be sent again at once, as fast as a broken connection refuses.
		g.metrics.appendBatchOutcome("not_committed")
		for _, j := range jobs {
			g.answer(j, events.Ack{}, err)
		}
	default:
		g.metrics.appendBatchOutcome("failed")
		for _, j := range jobs {
			g.aq.uncertain.mark(j.a.Subject)
			g.answer(j, events.Ack{}, err)
		}
	}
}

// sendAlone sends one append.
func (g *storeGate) sendAlone(ctx context.Context, j *appendJob) {
	a := j.stamped()
	actx, cancel := context.WithTimeout(ctx, appendTimeout)
	ack, err := j.log.AppendRaw(actx, a.Subject, a.Data, a.Opts)
	cancel()
	g.metrics.appended("alone", 1)
	if err != nil && !errors.Is(err, events.ErrConflict) {
		g.aq.uncertain.mark(a.Subject)
	}
	g.answer(j, ack, err)
}

// answer hands j's appender the outcome of its send.
func (g *storeGate) answer(j *appendJob, ack events.Ack, err error) {
	j.done <- appendResult{ack: ack, err: err} // buffered: never blocks
	g.pending.Add(-1)
}

// stamped is j's append as sent now: dated by how long its event waited
// since its appender queued it (behind others, for its turn, or retried),
// when that is worth a header.
func (j *appendJob) stamped() events.LogAppend {
	a := j.a
	if w := time.Since(j.born); w >= minQueued {
		h := make(map[string]string, len(a.Opts.Headers)+1)
		for k, v := range a.Opts.Headers {
			h[k] = v
		}
		h[events.HeaderQueued] = strconv.FormatInt(int64(w), 10)
		a.Opts.Headers = h
	}
	return a
}
