package runtime

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"understudy/actors/failover"
	"understudy/events"
)

// countingLog is a memory log that counts its sends, and may fail its
// batches as a test scripts.
type countingLog struct {
	*events.MemoryLog
	batches, alone atomic.Int64
	inBatch, maxIn atomic.Int64  // batches being sent, and the most at once
	gate           chan struct{} // non-nil: a batch waits for it to close before it is stored
	mu             sync.Mutex
	sizes          []int
	failBatch      func([]events.LogAppend) error // nil: none fails
	noBatches      bool
}

func newCountingLog() *countingLog {
	return &countingLog{MemoryLog: events.NewMemoryLog("EV", nil, Codec())}
}

func (l *countingLog) Batches() bool { return !l.noBatches }

func (l *countingLog) AppendBatch(ctx context.Context, as []events.LogAppend) ([]events.Ack, error) {
	l.batches.Add(1)
	l.mu.Lock()
	l.sizes = append(l.sizes, len(as))
	fail := l.failBatch
	l.mu.Unlock()
	n := l.inBatch.Add(1)
	defer l.inBatch.Add(-1)
	for m := l.maxIn.Load(); n > m && !l.maxIn.CompareAndSwap(m, n); m = l.maxIn.Load() {
	}
	if l.gate != nil {
		<-l.gate
	}
	if fail != nil {
		if err := fail(as); err != nil {
			return nil, err
		}
	}
	return l.MemoryLog.AppendBatch(ctx, as)
}

func (l *countingLog) AppendRaw(ctx context.Context, subject string, data []byte, opts events.AppendOptions) (events.Ack, error) {
	l.alone.Add(1)
	return l.MemoryLog.AppendRaw(ctx, subject, data, opts)
}

// testAppend is an append of a heartbeat-recovered event on subject,
// expecting the subject at last, under message id id.
func testAppend(t *testing.T, subject string, last uint64, id string) events.LogAppend {
	t.Helper()
	data, err := Codec().Encode(&failover.HeartbeatRecovered{Term: 1, AfterFailures: 1})
	if err != nil {
		t.Fatal(err)
	}
	opts := events.Expect(last)
	opts.MsgID = id
	return events.LogAppend{Subject: subject, Data: data, Opts: opts}
}

// holdTurns takes every append turn of g; the returned function gives
// them back.
func holdTurns(t *testing.T, g *storeGate) (release func()) {
	t.Helper()
	var rels []func()
	for range maxAppends {
		r, _, err := g.turn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		rels = append(rels, r)
	}
	return func() {
		for _, r := range rels {
			r()
		}
	}
}

func queuedAppends(g *storeGate) int {
	g.aq.mu.Lock()
	defer g.aq.mu.Unlock()
	return len(g.aq.jobs)
}

func waitQueued(t *testing.T, g *storeGate, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); queuedAppends(g) < n; {
		if time.Now().After(deadline) {
			t.Fatalf("%d appends queued, want %d", queuedAppends(g), n)
		}
		time.Sleep(time.Millisecond)
	}
}

type appendOutcome struct {
	ack events.Ack
	err error
}

// queueAll queues appends concurrently and returns their outcomes once
// every one is answered.
func queueAll(g *storeGate, log events.LogBatcher, appends []events.LogAppend, born time.Time) func() []appendOutcome {
	out := make([]appendOutcome, len(appends))
	var wg sync.WaitGroup
	for i, a := range appends {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ack, err := g.appendQueued(context.Background(), log, a, born)
			out[i] = appendOutcome{ack, err}
		}()
	}
	return func() []appendOutcome { wg.Wait(); return out }
}

// testAppends is n fresh appends, one per subject (ev.failover.pNNNN.site-a).
func testAppends(t *testing.T, n int) []events.LogAppend {
	t.Helper()
	appends := make([]events.LogAppend, n)
	for i := range appends {
		appends[i] = testAppend(t, fmt.Sprintf("ev.failover.p%04d.site-a", i), 0, fmt.Sprintf("id-%d", i))
	}
	return appends
}

// queueHeld queues appends while every turn is held (held: the turns,
// taken by the caller), gives the turns back once all wait, and returns
// the wait for their outcomes.
func queueHeld(t *testing.T, g *storeGate, log events.LogBatcher, held func(), appends []events.LogAppend, born time.Time) func() []appendOutcome {
	t.Helper()
	wait := queueAll(g, log, appends, born)
	waitQueued(t, g, len(appends))
	held()
	return wait
}

// mustLand fails t unless every outcome is an ack.
func mustLand(t *testing.T, out []appendOutcome) {
	t.Helper()
	for i, o := range out {
		if o.err != nil {
			t.Fatalf("append %d: %v", i, o.err)
		}
	}
}

// Appends waiting for a turn go together: 300 queued while every turn
// was taken land in two atomic batches (256 and 44), each record on its
// subject at its ack, dated by how long it waited.
func TestStoreGateBatchesWaitingAppends(t *testing.T) {
	g := countedGate()
	defer g.stop()
	log := newCountingLog()
	release := holdTurns(t, g)
	appends := testAppends(t, 300)
	out := queueHeld(t, g, log, func() { time.Sleep(20 * time.Millisecond); release() }, appends, time.Now())()
	for i, o := range out {
		if o.err != nil || o.ack.Duplicate {
			t.Fatalf("append %d: %+v, %v", i, o.ack, o.err)
		}
		rec, err := log.Record(context.Background(), o.ack.Sequence)
		if err != nil || rec.Subject != appends[i].Subject || rec.Headers["Nats-Msg-Id"] != appends[i].Opts.MsgID {
			t.Fatalf("append %d acked at %d: record %+v, %v", i, o.ack.Sequence, rec, err)
		}
		q, err := strconv.ParseInt(rec.Headers[events.HeaderQueued], 10, 64)
		if err != nil || time.Duration(q) < 20*time.Millisecond {
			t.Fatalf("append %d: queued header %q, want at least the 20 ms it waited", i, rec.Headers[events.HeaderQueued])
		}
	}
	if b, a := log.batches.Load(), log.alone.Load(); b != 2 || a != 0 {
		t.Fatalf("300 waiting appends sent in %d batches (sizes %v) and %d alone, want 2 batches", b, log.sizes, a)
	}
	if n := counterValue(t, g.metrics.appends, "batched"); n != 300 {
		t.Fatalf("appends counted batched: %v, want 300", n)
	}
	if p := g.pending.Load(); p != 0 {
		t.Fatalf("%d appends still counted pending after every one was answered", p)
	}
	// With turns free, an append goes alone at once.
	if _, err := g.appendQueued(context.Background(), log, testAppend(t, "ev.failover.alone.site-a", 0, "alone"), time.Now()); err != nil {
		t.Fatal(err)
	}
	if a := log.alone.Load(); a != 1 {
		t.Fatalf("an append with turns free: %d sent alone, want 1", a)
	}
}

// While a KV write waits or flies, appends go one a turn on the
// appendsBesideWrites turns, never batched: the registers keep the store.
func TestStoreGateBatchesNoAppendsBesideWrites(t *testing.T) {
	g := countedGate()
	defer g.stop()
	log := newCountingLog()
	release := holdTurns(t, g)
	done := g.priority() // the node's liveness write flies
	mustLand(t, queueHeld(t, g, log, release, testAppends(t, 20), time.Now())())
	if b, a := log.batches.Load(), log.alone.Load(); b != 0 || a != 20 {
		t.Fatalf("beside a KV write: %d batches, %d appends alone; want all 20 alone", b, a)
	}
	done()
}

// At most maxBatches batches of appends fly at once (JetStream bounds a
// stream's open batches): with the store slow to answer, 2,000 appends
// waiting go 256 at a time in 4 batches, and the rest wait for them.
func TestStoreGateBoundsAppendBatchesInFlight(t *testing.T) {
	g := countedGate()
	defer g.stop()
	log := newCountingLog()
	log.gate = make(chan struct{})
	wait := queueHeld(t, g, log, holdTurns(t, g), testAppends(t, 2000), time.Now())
	for deadline := time.Now().Add(5 * time.Second); log.inBatch.Load() < maxBatches && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // a fifth would be sent by now
	if n, alone := log.inBatch.Load(), log.alone.Load(); n != maxBatches || alone != 0 {
		t.Fatalf("%d batches in flight and %d appends alone while the store answers none, want %d batches and none alone", n, alone, maxBatches)
	}
	close(log.gate)
	mustLand(t, wait())
	if m := log.maxIn.Load(); m != maxBatches {
		t.Fatalf("at most %d batches at once, want %d", m, maxBatches)
	}
	if b := log.batches.Load(); b != 8 {
		t.Fatalf("2,000 appends in %d batches (sizes %v), want 8 (7 of 256 and one of 208)", b, log.sizes)
	}
}

// sendJobs sends appends as the dispatcher sends what it took on one
// turn, and returns their outcomes.
func sendJobs(g *storeGate, log events.LogBatcher, appends []events.LogAppend) []appendOutcome {
	jobs := make([]*appendJob, len(appends))
	for i, a := range appends {
		jobs[i] = &appendJob{ctx: context.Background(), log: log, a: a, born: time.Now(), done: make(chan appendResult, 1)}
		g.pending.Add(1)
	}
	g.sendAppends(context.Background(), jobs)
	out := make([]appendOutcome, len(jobs))
	for i, j := range jobs {
		r := <-j.done
		out[i] = appendOutcome(r)
	}
	return out
}

// A batch the store refuses whole is halved down to the append it
// refused: the others land, a stale expectation is answered as a
// conflict and a stored message id as the duplicate of its record, as
// alone.
func TestStoreGateSplitsARefusedAppendBatch(t *testing.T) {
	g := countedGate()
	defer g.stop()
	log := newCountingLog()
	ctx := context.Background()
	stale := "ev.failover.p0002.site-a"
	if _, err := log.MemoryLog.AppendRaw(ctx, stale, []byte("x"), events.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	appends := testAppends(t, 8)
	out := sendJobs(g, log, appends) // appends[2] expects 0 on a subject at 1
	for i, o := range out {
		switch {
		case i == 2 && !errors.Is(o.err, events.ErrConflict):
			t.Fatalf("the stale append: %+v, %v; want a conflict", o.ack, o.err)
		case i != 2 && (o.err != nil || o.ack.Duplicate):
			t.Fatalf("append %d: %+v, %v", i, o.ack, o.err)
		}
	}
	// 8 refused → 4 refused + 4 landed → 2 refused + 2 landed → 1 + 1 alone.
	if s, l, a := counterValue(t, g.metrics.appendBatch, "split"), counterValue(t, g.metrics.appendBatch, "landed"), log.alone.Load(); s != 3 || l != 2 || a != 2 {
		t.Fatalf("splits %v, batches landed %v, alone %d; want 3, 2, 2", s, l, a)
	}

	// The retry of an append that landed (its id stored), batched.
	retry := appends[5]
	retry.Opts = events.AppendOptions{MsgID: retry.Opts.MsgID}
	fresh := testAppend(t, "ev.failover.p0009.site-a", 0, "id-9")
	out = sendJobs(g, log, []events.LogAppend{fresh, retry})
	if out[0].err != nil || out[0].ack.Duplicate {
		t.Fatalf("the fresh append beside a retry: %+v, %v", out[0].ack, out[0].err)
	}
	if out[1].err != nil || !out[1].ack.Duplicate {
		t.Fatalf("the retry of a stored append: %+v, %v; want its duplicate ack", out[1].ack, out[1].err)
	}
}

// A batch not answered may have been stored: its appends are answered
// with the error, and their retries go alone for uncertainFor, while
// others still batch.
func TestStoreGateSendsRetriesOfUnansweredAppendBatchesAlone(t *testing.T) {
	g := countedGate()
	defer g.stop()
	log := newCountingLog()
	unanswered := errors.New("nats: timeout")
	log.failBatch = func([]events.LogAppend) error { return unanswered }
	a, b := testAppend(t, "ev.failover.a.site-a", 0, "a"), testAppend(t, "ev.failover.b.site-a", 0, "b")
	for _, o := range sendJobs(g, log, []events.LogAppend{a, b}) {
		if !errors.Is(o.err, unanswered) {
			t.Fatalf("an append of an unanswered batch: %+v, %v; want its error", o.ack, o.err)
		}
	}
	log.failBatch = nil
	if !g.aq.uncertain.has(a.Subject) || !g.aq.uncertain.has(b.Subject) || g.aq.uncertain.has("ev.failover.c.site-a") {
		t.Fatal("the subjects of an unanswered batch are not uncertain, or another is")
	}
	c, d := testAppend(t, "ev.failover.c.site-a", 0, "c"), testAppend(t, "ev.failover.d.site-a", 0, "d")
	mustLand(t, queueHeld(t, g, log, holdTurns(t, g), []events.LogAppend{c, a, d}, time.Now())())
	if n, alone := log.batches.Load(), log.alone.Load(); n != 2 || alone != 1 {
		t.Fatalf("after the unanswered batch: %d batches (sizes %v), %d alone; want the retry alone and the other two batched", n, log.sizes, alone)
	}
}

// A stream that refuses batches (allow_atomic off after the log opened)
// is appended to one append at a time; the node is told once.
func TestStoreGateAppendsAloneWhenBatchesAreRefused(t *testing.T) {
	g := countedGate()
	defer g.stop()
	var told atomic.Int64
	g.onRefused = func(error) { told.Add(1) }
	log := newCountingLog()
	log.failBatch = func([]events.LogAppend) error {
		return fmt.Errorf("batch: %w", events.ErrBatchUnsupported)
	}
	mustLand(t, queueHeld(t, g, log, holdTurns(t, g), testAppends(t, 10), time.Now())())
	if n, a := log.batches.Load(), log.alone.Load(); n != 1 || a != 10 {
		t.Fatalf("%d batches tried, %d appends alone; want the one refused batch, then 10 alone", n, a)
	}
	if told.Load() != 1 {
		t.Fatalf("the node was told %d times of refused batches, want once", told.Load())
	}
}

// A batch only not committed (its connection failed before the commit)
// stored nothing: its appends are answered with the error, for their
// appenders to retry, none is uncertain, and batches stay on — the
// appends after it batch again and the node is told of no refusal.
func TestStoreGateKeepsBatchingAfterAnAppendBatchNotCommitted(t *testing.T) {
	g := countedGate()
	defer g.stop()
	var told atomic.Int64
	g.onRefused = func(error) { told.Add(1) }
	log := newCountingLog()
	log.failBatch = func([]events.LogAppend) error {
		return fmt.Errorf("batch: %w: nats: outbound buffer limit exceeded", events.ErrBatchNotCommitted)
	}
	appends := testAppends(t, 10)
	for i, o := range queueHeld(t, g, log, holdTurns(t, g), appends, time.Now())() {
		if !errors.Is(o.err, events.ErrBatchNotCommitted) {
			t.Fatalf("append %d of the batch not committed: %+v, %v; want its error", i, o.ack, o.err)
		}
		if g.aq.uncertain.has(appends[i].Subject) {
			t.Fatalf("append %d of a batch not committed is uncertain", i)
		}
	}
	log.failBatch = nil
	mustLand(t, queueHeld(t, g, log, holdTurns(t, g), appends, time.Now())())
	if n, a := log.batches.Load(), log.alone.Load(); n != 2 || a != 0 {
		t.Fatalf("%d batches, %d appends alone; want the batch not committed, then the retries batched", n, a)
	}
	if told.Load() != 0 {
		t.Fatalf("the node was told %d times of refused batches, want never", told.Load())
	}
}

// An append whose appender stops while it waits for its turn is dropped,
// never sent, and no longer counted pending.
func TestStoreGateDropsAppendsOfStoppedAppenders(t *testing.T) {
	g := countedGate()
	defer g.stop()
	log := newCountingLog()
	release := holdTurns(t, g)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := g.appendQueued(ctx, log, testAppend(t, "ev.failover.gone.site-a", 0, "gone"), time.Now())
		errc <- err
	}()
	waitQueued(t, g, 1)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the stopped appender's append: %v", err)
	}
	release()
	time.Sleep(50 * time.Millisecond)
	if n := log.batches.Load() + log.alone.Load(); n != 0 || queuedAppends(g) != 0 || g.pending.Load() != 0 {
		t.Fatalf("after the appender stopped: %d sends, %d queued, %d pending", n, queuedAppends(g), g.pending.Load())
	}
}

// Appenders on a host's log queue in its gate: 40 members' events,
// appended while the turns are taken, land in order on each subject, in
// batches.
func TestAppendersOnAHostBatchTheirEvents(t *testing.T) {
	g := countedGate()
	defer g.stop()
	log := newCountingLog()
	logger, _ := newLogRecorder(t)
	release := holdTurns(t, g)
	const members, each = 40, 3
	apps := make([]*appender, members)
	var landed sync.WaitGroup
	for i := range apps {
		apps[i] = newAppender(boundedLog{Log: log, gate: g}, failover.Subject(fmt.Sprintf("p%02d", i), "site-a"), logger)
		apps[i].setLast(0)
		landed.Add(each)
		apps[i].onAppended = func(events.Event, events.Ack) { landed.Done() }
		apps[i].start()
		defer apps[i].stop()
		for n := range each {
			apps[i].add(&failover.HeartbeatRecovered{Term: 1, AfterFailures: n + 1})
		}
	}
	waitQueued(t, g, members)
	release()
	landed.Wait()
	ctx := context.Background()
	for i, a := range apps {
		var got []int
		for rec, err := range log.Read(ctx, events.ReadOptions{Subject: a.subject}) {
			if err != nil {
				t.Fatal(err)
			}
			ev, err := Codec().DecodeRecord(rec)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, ev.(*failover.HeartbeatRecovered).AfterFailures)
		}
		if fmt.Sprint(got) != "[1 2 3]" {
			t.Fatalf("member %d's events: %v, want [1 2 3] in order", i, got)
		}
	}
	if b := log.batches.Load(); b < 1 || b > members {
		t.Fatalf("%d batches for %d events of %d members", b, members*each, members)
	}
	if n := counterValue(t, g.metrics.appends, "batched"); n < members {
		t.Fatalf("%v appends batched, want at least the %d that waited together", n, members)
	}
}
