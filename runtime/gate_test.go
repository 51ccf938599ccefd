package runtime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"understudy/actors/failover"
	"understudy/events"
)

// While a register or liveness write waits or flies, appends get only
// appendsBesideWrites turns; once none does, they get maxAppends again.
func TestStoreGateAppendsMakeWayForWrites(t *testing.T) {
	g := newStoreGate()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := g.priority() // the node's liveness write flies

	var in, finished atomic.Int64
	hold := make(chan struct{})
	var wg sync.WaitGroup
	for range maxAppends {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rel, err := g.appendTurn(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			in.Add(1)
			<-hold
			in.Add(-1)
			finished.Add(1)
			rel()
		}()
	}
	time.Sleep(100 * time.Millisecond)
	if n := in.Load(); n != appendsBesideWrites {
		t.Fatalf("%d appends in flight beside a liveness write, want %d", n, appendsBesideWrites)
	}
	// A member write still gets its turn at once.
	ran := make(chan struct{})
	g.submit(time.Now().Add(time.Minute), func() { close(ran) })
	select {
	case <-ran:
	case <-time.After(time.Second):
		t.Fatal("a member write waited behind appends")
	}
	defer g.stop()
	done()
	close(hold)
	wg.Wait()
	if n := finished.Load(); n != maxAppends {
		t.Fatalf("%d of %d appends went through once the write was done", n, maxAppends)
	}
	waitNoKV(t, g) // the member write's count ends just after it ran
	if !g.settled() || g.pending.Load() != 0 || g.kv.Load() != 0 || len(g.appends) != 0 || len(g.narrow) != 0 {
		t.Fatalf("after every turn ended: pending %d, kv %d, turns %d/%d", g.pending.Load(), g.kv.Load(), len(g.appends), len(g.narrow))
	}
	// No write waits: maxAppends turns at once.
	var rels []func()
	for range maxAppends {
		sctx, scancel := context.WithTimeout(ctx, 50*time.Millisecond)
		r, err := g.appendTurn(sctx)
		scancel()
		if err != nil {
			t.Fatalf("append %d of %d waited with no write in flight: %v", len(rels)+1, maxAppends, err)
		}
		rels = append(rels, r)
	}
	for _, r := range rels {
		r()
	}
	// A turn given up (its context ends) leaves nothing taken.
	done = g.priority()
	defer done()
	for range appendsBesideWrites {
		if _, err := g.appendTurn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	short, scancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer scancel()
	if _, err := g.appendTurn(short); err == nil {
		t.Fatal("an append beyond the narrow bound got a turn")
	}
	if n := len(g.appends); n != appendsBesideWrites {
		t.Errorf("%d append turns held after one was given up, want %d", n, appendsBesideWrites)
	}
}

// An appender whose turn comes late (register writes keep the appends
// narrow for longer than an append's 5 s deadline) waits for it: no
// failed append is reported or retried, and the event lands once its turn
// comes.
func TestAppenderWaitsForItsTurnWithoutFailing(t *testing.T) {
	t.Parallel()
	g := newStoreGate()
	mem := events.NewMemoryLog("EV", nil, Codec())
	logger, rec := newLogRecorder(t)
	app := newAppender(boundedLog{Log: mem, gate: g}, failover.Subject("turn", "site-a"), logger)
	app.setLast(0)
	appended := make(chan events.Ack, 1)
	app.onAppended = func(_ events.Event, ack events.Ack) { appended <- ack }
	app.start()
	defer app.stop()

	done := g.priority()
	var held []func()
	for range appendsBesideWrites {
		r, err := g.appendTurn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, r)
	}
	app.add(&failover.HeartbeatRecovered{Term: 1, AfterFailures: 1})
	select {
	case ack := <-appended:
		t.Fatalf("appended %+v while every turn was taken", ack)
	case <-time.After(5500 * time.Millisecond):
	}
	if f := rec.matching("event append failed, retrying"); len(f) != 0 {
		t.Fatalf("waiting for a turn reported as failed appends: %+v", f)
	}
	done()
	for _, r := range held {
		r()
	}
	select {
	case ack := <-appended:
		if ack.Sequence != 1 {
			t.Fatalf("ack %+v", ack)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the event did not land once its turn came")
	}
}

// A member write whose turn comes after its issue-by time is dropped,
// never issued; the others run in the order asked.
func TestStoreGateDropsWritesTooLateToIssue(t *testing.T) {
	g := countedGate()
	defer g.stop()
	var ran []int
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Add(2)
	g.submit(time.Now().Add(-time.Millisecond), func() { t.Error("a write past its issue-by time was issued") })
	for i := 1; i <= 2; i++ {
		g.submit(time.Now().Add(time.Minute), func() {
			defer wg.Done()
			mu.Lock()
			ran = append(ran, i)
			mu.Unlock()
		})
	}
	wg.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for g.kv.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := counterValue(t, g.metrics.writes, "not_issued"); n != 1 || len(ran) != 2 || g.kv.Load() != 0 {
		t.Fatalf("dropped %v, ran %v, kv %d; want one dropped, both others run, none pending", n, ran, g.kv.Load())
	}
}

// holdWorkers takes every worker of g with a job that waits until the
// returned channel is closed.
func holdWorkers(g *storeGate) chan struct{} {
	hold := make(chan struct{})
	for range maxMemberWrites {
		g.submit(time.Now().Add(time.Minute), func() { <-hold })
	}
	return hold
}

// submit queues any function as a member write would be (issued by
// issueBy or dropped): the tests hold the workers with it.
func (g *storeGate) submit(issueBy time.Time, write func()) {
	g.enqueue(&gateJob{issueBy: issueBy, fn: write})
}

// batchCountingKV counts a KV's batches and single writes; refuse makes every
// batch answer ErrBatchUnsupported.
type batchCountingKV struct {
	*events.MemoryKV
	batches, singles atomic.Int64
	refuse           bool
	notCommitted     atomic.Int64 // this many batches more answer ErrBatchNotCommitted
	// busy: a batch holding this key is refused as a replicated stream
	// refuses one with a write to the key still being proposed (10164).
	busy string
}

func (k *batchCountingKV) WriteBatch(ctx context.Context, ws []events.KVWrite) ([]uint64, error) {
	k.batches.Add(1)
	if k.refuse {
		return nil, events.ErrBatchUnsupported
	}
	if k.notCommitted.Add(-1) >= 0 {
		return nil, fmt.Errorf("%w: nats: outbound buffer limit exceeded", events.ErrBatchNotCommitted)
	}
	for _, w := range ws {
		if w.Key == k.busy {
			return nil, fmt.Errorf("%w: 10164", events.ErrInFlight)
		}
	}
	return k.MemoryKV.WriteBatch(ctx, ws)
}

func (k *batchCountingKV) Create(ctx context.Context, key string, v []byte) (uint64, error) {
	k.singles.Add(1)
	return k.MemoryKV.Create(ctx, key, v)
}

func (k *batchCountingKV) Put(ctx context.Context, key string, v []byte) (uint64, error) {
	k.singles.Add(1)
	return k.MemoryKV.Put(ctx, key, v)
}

func (k *batchCountingKV) Update(ctx context.Context, key string, v []byte, rev uint64) (uint64, error) {
	k.singles.Add(1)
	return k.MemoryKV.Update(ctx, key, v, rev)
}

// gateWrites submits n register writes (one stale) while every worker is
// busy, then frees the workers, and returns each write's answer. Every
// 50th key is written twice, by two puts (in either order): a batch holds
// a key once, so the second waits for a later turn.
func gateWrites(t *testing.T, g *storeGate, kv *batchCountingKV, n, stale int) []error {
	t.Helper()
	revs := make([]uint64, n)
	defer func() {
		// Each answer names the revision its write landed at.
		for i, rev := range revs {
			key := failover.LeaderKey(fmt.Sprintf("p%04d", i))
			if i%50 == 0 || rev == 0 {
				continue // written twice, in either order; or not landed
			}
			if e, err := kv.Get(context.Background(), key); err != nil || e.Revision != rev || string(e.Value) != "new" {
				t.Errorf("%s answered landed at %d; the bucket has %+v, %v", key, rev, e, err)
			}
		}
	}()
	hold := holdWorkers(g)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		key := failover.LeaderKey(fmt.Sprintf("p%04d", i))
		rev, err := kv.MemoryKV.Put(context.Background(), key, []byte("old"))
		if err != nil {
			t.Fatal(err)
		}
		if i == stale {
			rev-- // a rival wrote since this member read the register
		}
		wg.Add(1)
		g.submitWrite(&kvWrite{ctx: context.Background(), kv: kv,
			w:       events.KVWrite{Key: key, Value: []byte("new"), Revision: rev, Put: i%50 == 0},
			issueBy: time.Now().Add(time.Minute), deadline: time.Now().Add(2 * time.Minute),
			done: func(rev uint64, err error, _ time.Duration) {
				errs[i], revs[i] = err, rev
				wg.Done()
			}})
		if i%50 == 0 {
			wg.Add(1)
			g.submitWrite(&kvWrite{ctx: context.Background(), kv: kv,
				w:       events.KVWrite{Key: key, Value: []byte("again"), Put: true},
				issueBy: time.Now().Add(time.Minute), deadline: time.Now().Add(2 * time.Minute),
				done: func(_ uint64, err error, _ time.Duration) {
					if err != nil {
						t.Errorf("second write of %s: %v", key, err)
					}
					wg.Done()
				}})
		}
	}
	close(hold)
	wg.Wait()
	return errs
}

// Member writes that wait behind others go in batches: one stale write
// fails alone (its batch is halved until it stands alone), every other
// lands, with far fewer calls to the store than writes.
func TestStoreGateBatchesWaitingWrites(t *testing.T) {
	g := countedGate()
	defer g.stop()
	kv := &batchCountingKV{MemoryKV: events.NewMemoryKV("kv", nil)}
	const n, stale = 600, 301
	errs := gateWrites(t, g, kv, n, stale)
	for i, err := range errs {
		switch {
		case i == stale && !errors.Is(err, events.ErrConflict):
			t.Errorf("the stale write: %v, want a conflict", err)
		case i != stale && err != nil:
			t.Errorf("write %d: %v", i, err)
		}
	}
	// Far fewer calls to the store than writes; every write went alone
	// or in a batch that landed (the 12 second writes included), none
	// dropped. (The stale write's batch was split, or the stale write was
	// one whose turn came with nothing waiting and went alone.)
	calls := kv.batches.Load() + kv.singles.Load()
	alone, batched := counterValue(t, g.metrics.writes, "alone"), counterValue(t, g.metrics.writes, "batched")
	splits, landed := counterValue(t, g.metrics.batches, "split"), counterValue(t, g.metrics.batches, "landed")
	if calls > n/4 || batched < n/2 || alone+batched != n+12 || landed == 0 {
		t.Errorf("%d batches and %d single writes for %d writes; metrics: %v alone, %v batched, %v batches split, %v landed: want batches, %d writes in all",
			kv.batches.Load(), kv.singles.Load(), n, alone, batched, splits, landed, n+12)
	}
	waitNoKV(t, g)
}

// slowBatchKV answers its batches only once open is closed.
type slowBatchKV struct {
	*batchCountingKV
	open chan struct{}
}

func (k *slowBatchKV) WriteBatch(ctx context.Context, ws []events.KVWrite) ([]uint64, error) {
	<-k.open
	return k.batchCountingKV.WriteBatch(ctx, ws)
}

// While every batch slot is taken by a batch the store has not answered,
// the writes waiting behind them wait for the next batches: none goes
// alone beside them (each alone costs the store a disk sync, and 60 of
// them beside 4 batches starved a 10,000-pair takeover).
func TestStoreGateWritesWaitForABatchWhileSlotsAreTaken(t *testing.T) {
	g := countedGate()
	defer g.stop()
	kv := &slowBatchKV{batchCountingKV: &batchCountingKV{MemoryKV: events.NewMemoryKV("kv", nil)}, open: make(chan struct{})}
	hold := holdWorkers(g)
	const n = 3000
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range n {
		wg.Add(1)
		g.submitWrite(&kvWrite{ctx: context.Background(), kv: kv,
			w:       events.KVWrite{Key: failover.LeaderKey(fmt.Sprintf("p%04d", i)), Value: []byte("v"), Put: true},
			issueBy: time.Now().Add(time.Minute), deadline: time.Now().Add(2 * time.Minute),
			done: func(_ uint64, err error, _ time.Duration) {
				if err != nil {
					failed.Add(1)
				}
				wg.Done()
			}})
	}
	close(hold)
	time.Sleep(200 * time.Millisecond) // the workers meet the taken slots
	singlesWhileTaken := kv.singles.Load()
	close(kv.open)
	wg.Wait()
	// (Once the slots are free, a write whose turn comes with nothing
	// waiting behind it goes alone: a few at the end.)
	if singlesWhileTaken != 0 || kv.singles.Load() > maxMemberWrites || failed.Load() != 0 {
		t.Errorf("%d writes went alone while the batch slots were taken (%d in all), %d failed: want none alone then, none failed",
			singlesWhileTaken, kv.singles.Load(), failed.Load())
	}
	if b := kv.batches.Load(); b < n/events.MaxKVBatch || b > 2*n/events.MaxKVBatch {
		t.Errorf("%d batches for %d writes, want about %d (full batches)", b, n, n/events.MaxKVBatch)
	}
	waitNoKV(t, g)
}

// A compare-and-set on a revision the node's watch has seen replaced is
// answered as a conflict at once, without the store: in a batch it would
// fail the batch and have it halved down to it.
func TestStoreGateAnswersKnownStaleWritesWithoutTheStore(t *testing.T) {
	g := countedGate()
	defer g.stop()
	kv := &batchCountingKV{MemoryKV: events.NewMemoryKV("kv", nil)}
	const n = 600
	seenAt := map[string]uint64{}
	for i := range n {
		if i%30 == 7 {
			// A rival (or this node's own late write) landed since: the
			// watch delivered the key one revision on.
			key := failover.LeaderKey(fmt.Sprintf("p%04d", i))
			seenAt[key] = 1 << 40
		}
	}
	seen := func(key string) uint64 { return seenAt[key] }
	g.seen.Store(&seen)
	errs := gateWrites(t, g, kv, n, -1)
	stale := 0
	for i, err := range errs {
		key := failover.LeaderKey(fmt.Sprintf("p%04d", i))
		switch {
		case seenAt[key] != 0 && i%50 != 0:
			stale++
			if !errors.Is(err, events.ErrConflict) {
				t.Errorf("write %d on a revision seen replaced: %v, want a conflict", i, err)
			}
		case err != nil:
			t.Errorf("write %d: %v", i, err)
		}
	}
	if splits, counted := counterValue(t, g.metrics.batches, "split"), counterValue(t, g.metrics.writes, "stale"); splits != 0 || int(counted) != stale {
		t.Errorf("%v batches split, %v writes counted stale: want none split, %d stale", splits, counted, stale)
	}
	waitNoKV(t, g)
}

// scriptedBatchKV runs hook before each batch (nil: none).
type scriptedBatchKV struct {
	*batchCountingKV
	hook func(n int64, ws []events.KVWrite) error
}

func (k *scriptedBatchKV) WriteBatch(ctx context.Context, ws []events.KVWrite) ([]uint64, error) {
	n := k.batches.Load()
	if k.hook != nil {
		if err := k.hook(n, ws); err != nil {
			k.batches.Add(1)
			return nil, err
		}
	}
	return k.batchCountingKV.WriteBatch(ctx, ws)
}

// submitAll submits a compare-and-set per key (at its revision in revs)
// while every worker is held, frees them, and returns the answers.
func submitAll(t *testing.T, g *storeGate, kv events.KV, keys []string, revs map[string]uint64) map[string]error {
	t.Helper()
	hold := holdWorkers(g)
	var mu sync.Mutex
	errs := map[string]error{}
	var wg sync.WaitGroup
	for _, key := range keys {
		wg.Add(1)
		g.submitWrite(&kvWrite{ctx: context.Background(), kv: kv, w: events.KVWrite{Key: key, Value: []byte("new"), Revision: revs[key]},
			issueBy: time.Now().Add(time.Minute), deadline: time.Now().Add(2 * time.Minute),
			done: func(_ uint64, err error, _ time.Duration) {
				mu.Lock()
				errs[key] = err
				mu.Unlock()
				wg.Done()
			}})
	}
	close(hold)
	wg.Wait()
	return errs
}

// A batch refused for a conflict the node's watch has seen by then is not
// halved: the write it names is answered, the rest sent again whole.
func TestStoreGateResendsABatchWithoutTheWriteSeenStale(t *testing.T) {
	g := countedGate()
	defer g.stop()
	mem := events.NewMemoryKV("kv", nil)
	var keys []string
	revs := map[string]uint64{}
	for i := range 200 {
		key := failover.LeaderKey(fmt.Sprintf("p%04d", i))
		rev, err := mem.Put(context.Background(), key, []byte("old"))
		if err != nil {
			t.Fatal(err)
		}
		keys, revs[key] = append(keys, key), rev
	}
	rival := keys[77]
	// A rival wrote the register after this node's member read it; the
	// node's watch delivers it only while the batch holding the member's
	// write is answered.
	rivalRev, err := mem.Put(context.Background(), rival, []byte("rival"))
	if err != nil {
		t.Fatal(err)
	}
	var seenRival atomic.Uint64
	seen := func(key string) uint64 {
		if key == rival {
			return seenRival.Load()
		}
		return 0
	}
	g.seen.Store(&seen)
	kv := &scriptedBatchKV{batchCountingKV: &batchCountingKV{MemoryKV: mem}, hook: func(n int64, ws []events.KVWrite) error {
		for _, w := range ws {
			if w.Key == rival {
				seenRival.Store(rivalRev)
			}
		}
		return nil
	}}
	// One batch of all 200, as a batch slot's holder sends it.
	writes := make([]events.KVWrite, len(keys))
	for i, key := range keys {
		writes[i] = events.KVWrite{Key: key, Value: []byte("new"), Revision: revs[key]}
	}
	errs := sendBatch(g, kv, writes)
	for i, err := range errs {
		switch {
		case keys[i] == rival && !errors.Is(err, events.ErrConflict):
			t.Errorf("the write a rival beat: %v, want a conflict", err)
		case keys[i] != rival && err != nil:
			t.Errorf("%s: %v", keys[i], err)
		}
	}
	if splits, b := counterValue(t, g.metrics.batches, "split"), kv.batches.Load(); splits != 1 || b != 2 {
		t.Errorf("%v splits, %d batches: want the refused batch sent again whole once (2 batches), not halved", splits, b)
	}
	waitNoKV(t, g)
}

// sendBatch sends writes as one batch through g, as the holder of a batch
// slot does, and returns each write's answer.
func sendBatch(g *storeGate, kv events.KVBatcher, writes []events.KVWrite) []error {
	errs := make([]error, len(writes))
	batch := make([]*kvWrite, len(writes))
	for i, w := range writes {
		batch[i] = &kvWrite{ctx: context.Background(), kv: kv.(events.KV), w: w,
			issueBy: time.Now().Add(time.Minute), deadline: time.Now().Add(2 * time.Minute),
			done: func(_ uint64, err error, _ time.Duration) { errs[i] = err }}
	}
	g.kv.Add(int64(len(batch)))
	g.writeBatch(kv, batch)
	return errs
}

// A batch that failed without a definite answer (its deadline passed: it
// may have been committed) leaves its keys uncertain: the members'
// retries of them go alone, so that one that landed is refused alone,
// not with a batch it would fail.
func TestStoreGateSendsRetriesOfUnansweredBatchesAlone(t *testing.T) {
	g := countedGate()
	defer g.stop()
	mem := events.NewMemoryKV("kv", nil)
	var keys []string
	revs := map[string]uint64{}
	for i := range 600 {
		key := failover.LeaderKey(fmt.Sprintf("p%04d", i))
		rev, err := mem.Put(context.Background(), key, []byte("old"))
		if err != nil {
			t.Fatal(err)
		}
		keys, revs[key] = append(keys, key), rev
	}
	var failing atomic.Bool
	failing.Store(true)
	kv := &scriptedBatchKV{batchCountingKV: &batchCountingKV{MemoryKV: mem}, hook: func(n int64, ws []events.KVWrite) error {
		if failing.Load() {
			return fmt.Errorf("events: batch of %d: %w", len(ws), context.DeadlineExceeded)
		}
		return nil
	}}
	first := submitAll(t, g, kv, keys, revs)
	failing.Store(false)
	uncertain := 0
	for _, err := range first {
		if errors.Is(err, context.DeadlineExceeded) {
			uncertain++
		}
	}
	if uncertain < len(keys)/2 {
		t.Fatalf("%d of %d writes failed in an unanswered batch, want most (the rest went alone)", uncertain, len(keys))
	}
	singles, batches := kv.singles.Load(), kv.batches.Load()
	var retried []string
	for _, key := range keys {
		if first[key] != nil {
			retried = append(retried, key)
		}
	}
	for key, err := range submitAll(t, g, kv, retried, revs) {
		if err != nil {
			t.Errorf("retry of %s: %v", key, err)
		}
	}
	if alone, b := kv.singles.Load()-singles, kv.batches.Load()-batches; alone < int64(uncertain) || b != 0 {
		t.Errorf("%d retries alone, %d batches: want the %d retries of unanswered writes alone, no batch", alone, b, uncertain)
	}
	waitNoKV(t, g)
}

// A store that refuses batches gets every write one at a time, and the
// host hears of it once.
func TestStoreGateWritesAloneWhenBatchesAreRefused(t *testing.T) {
	g := countedGate()
	defer g.stop()
	var told atomic.Int64
	g.onRefused = func(error) { told.Add(1) }
	kv := &batchCountingKV{MemoryKV: events.NewMemoryKV("kv", nil), refuse: true}
	errs := gateWrites(t, g, kv, 300, -1)
	for i, err := range errs {
		if err != nil {
			t.Errorf("write %d: %v", i, err)
		}
	}
	if b := counterValue(t, g.metrics.writes, "batched"); kv.singles.Load() != 306 || told.Load() != 1 || b != 0 || counterValue(t, g.metrics.batches, "refused") == 0 {
		t.Errorf("%d single writes, refusal told %d times, %v batched: want 306 (300 and 6 second writes), 1, 0, and a refused batch counted", kv.singles.Load(), told.Load(), b)
	}
	waitNoKV(t, g)
}

// A batch only not committed (its connection failed before the commit)
// wrote nothing: its writes go alone at once, and batches stay on — the
// writes after it still batch, and the node is told of no refusal (a
// real takeover whose connection was given up mid-batch once ran a
// minute of single writes).
func TestStoreGateKeepsBatchingAfterABatchNotCommitted(t *testing.T) {
	g := countedGate()
	defer g.stop()
	var told atomic.Int64
	g.onRefused = func(error) { told.Add(1) }
	kv := &batchCountingKV{MemoryKV: events.NewMemoryKV("kv", nil)}
	kv.notCommitted.Store(1)
	errs := gateWrites(t, g, kv, 300, -1)
	for i, err := range errs {
		if err != nil {
			t.Errorf("write %d: %v", i, err)
		}
	}
	nc, landed := counterValue(t, g.metrics.batches, "not_committed"), counterValue(t, g.metrics.batches, "landed")
	if nc != 1 || landed == 0 || told.Load() != 0 || g.batchOff.Load() != 0 || kv.singles.Load() >= 300 {
		t.Errorf("%v batches not committed, %v landed, refusal told %d times, batches off until %d, %d single writes: want 1, some, never, never, the rest batched",
			nc, landed, told.Load(), g.batchOff.Load(), kv.singles.Load())
	}
	waitNoKV(t, g)
}

// waitNoKV waits for the gate to count no KV write pending: a write's
// answer comes just before its count ends.
func waitNoKV(t *testing.T, g *storeGate) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for g.kv.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := g.kv.Load(); n != 0 {
		t.Errorf("%d KV writes still counted pending", n)
	}
}

// On a replicated stream a batch holding a key with a write still being
// proposed is refused whole (10164): it is halved like a conflict, so
// only that write is answered "in flight"; the others land.
func TestStoreGateSplitsABatchRefusedForAKeyInFlight(t *testing.T) {
	g := countedGate()
	defer g.stop()
	kv := &batchCountingKV{MemoryKV: events.NewMemoryKV("kv", nil), busy: failover.LeaderKey("p0123")}
	errs := gateWrites(t, g, kv, 400, -1)
	for i, err := range errs {
		if i != 123 && err != nil {
			t.Errorf("write %d: %v (refused for another key's write in flight)", i, err)
		}
	}
	if splits, batched := counterValue(t, g.metrics.batches, "split"), counterValue(t, g.metrics.writes, "batched"); splits == 0 || batched < 200 {
		t.Errorf("%v splits, %v writes in batches: want the refused batch halved and the rest batched", splits, batched)
	}
	waitNoKV(t, g)
}

func TestServerVersionForAtomicBatches(t *testing.T) {
	for v, want := range map[string]bool{"2.15.2": true, "2.12.0": true, "2.12.0-beta.1": true, "3.0.0": true,
		"2.11.9": false, "2.9.25": false, "1.99.0": false, "": false, "garbage": false} {
		if got := versionAtLeast(v, 2, 12); got != want {
			t.Errorf("versionAtLeast(%q, 2, 12) = %v, want %v", v, got, want)
		}
	}
}

func counterValue(t *testing.T, c *prometheus.CounterVec, label string) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.WithLabelValues(label).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// countedGate is a gate whose counts the tests read from its metrics.
func countedGate() *storeGate {
	g := newStoreGate()
	g.metrics = NewMemberMetrics(promRegistry())
	return g
}

// One write with a key the bucket refuses fails alone, not the writes
// batched with it.
func TestStoreGateBadKeyFailsAlone(t *testing.T) {
	g := countedGate()
	defer g.stop()
	kv := &batchCountingKV{MemoryKV: events.NewMemoryKV("kv", nil)}
	hold := holdWorkers(g)
	const n, bad = 100, 37
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		key := failover.LeaderKey(fmt.Sprintf("p%04d", i))
		if i == bad {
			key = "bad key"
		}
		wg.Add(1)
		g.submitWrite(&kvWrite{ctx: context.Background(), kv: kv, w: events.KVWrite{Key: key, Value: []byte("v"), Put: true},
			issueBy: time.Now().Add(time.Minute), deadline: time.Now().Add(2 * time.Minute),
			done: func(_ uint64, err error, _ time.Duration) { errs[i] = err; wg.Done() }})
	}
	close(hold)
	wg.Wait()
	for i, err := range errs {
		switch {
		case i == bad && !errors.Is(err, events.ErrInvalid):
			t.Errorf("the bad key's write: %v, want ErrInvalid", err)
		case i != bad && err != nil:
			t.Errorf("write %d failed beside the bad key: %v", i, err)
		}
	}
	if counterValue(t, g.metrics.writes, "batched") == 0 {
		// (The bad key may be the one write whose turn came with nothing
		// waiting behind it: alone, it fails alone all the same.)
		t.Error("no write batched: the test did not batch")
	}
	waitNoKV(t, g)

	// In one batch for sure, it is halved down to.
	splits := counterValue(t, g.metrics.batches, "split")
	writes := make([]events.KVWrite, n)
	for i := range n {
		writes[i] = events.KVWrite{Key: failover.LeaderKey(fmt.Sprintf("q%04d", i)), Value: []byte("v"), Put: true}
	}
	writes[bad].Key = "bad key"
	for i, err := range sendBatch(g, kv, writes) {
		switch {
		case i == bad && !errors.Is(err, events.ErrInvalid):
			t.Errorf("the bad key's write in one batch: %v, want ErrInvalid", err)
		case i != bad && err != nil:
			t.Errorf("write %d of the batch failed beside the bad key: %v", i, err)
		}
	}
	if counterValue(t, g.metrics.batches, "split") == splits {
		t.Error("the batch holding the bad key was not split")
	}
	waitNoKV(t, g)
}

// Register writes go before member heartbeats: with every worker busy,
// heartbeats queued first and register writes queued after them are
// taken register writes first (a 10,000-pair takeover on real NATS landed
// as many heartbeats as registers while acquires waited), each kind in
// the order it came; and once the workers are free every write lands.
func TestStoreGateIssuesRegisterWritesBeforeMemberHeartbeats(t *testing.T) {
	g := countedGate()
	defer g.stop()
	kv := &batchCountingKV{MemoryKV: events.NewMemoryKV("kv", nil)}
	hold := holdWorkers(g)
	for g.busy.Load() < maxMemberWrites {
		time.Sleep(time.Millisecond)
	}
	const n = 300
	var wg sync.WaitGroup
	write := func(key string, beat bool) *kvWrite {
		wg.Add(1)
		return &kvWrite{ctx: context.Background(), kv: kv,
			w:       events.KVWrite{Key: key, Value: []byte("v"), Put: beat},
			issueBy: time.Now().Add(time.Minute), deadline: time.Now().Add(2 * time.Minute), beat: beat,
			done: func(_ uint64, err error, _ time.Duration) {
				defer wg.Done()
				if err != nil {
					t.Errorf("%s: %v", key, err)
				}
			}}
	}
	for i := range n {
		g.submitWrite(write(failover.HeartbeatKey(fmt.Sprintf("p%04d", i), "site-b"), true))
	}
	for i := range n {
		g.submitWrite(write(failover.LeaderKey(fmt.Sprintf("p%04d", i)), false))
	}
	// Take them as a free worker would, then give them back.
	var taken []*gateJob
	for j := g.next(); j != nil; j = g.next() {
		taken = append(taken, j)
	}
	if len(taken) != 2*n {
		t.Fatalf("%d writes waiting, want %d", len(taken), 2*n)
	}
	for i, j := range taken {
		want := failover.LeaderKey(fmt.Sprintf("p%04d", i))
		if i >= n {
			want = failover.HeartbeatKey(fmt.Sprintf("p%04d", i-n), "site-b")
		}
		if j.w.w.Key != want {
			t.Fatalf("write %d taken is %s, want %s: register writes first, each kind in order", i, j.w.w.Key, want)
		}
	}
	for _, j := range taken {
		g.toWorkers(j)
	}
	close(hold)
	wg.Wait()
	if kv.batches.Load() == 0 {
		t.Errorf("no batch: the writes held went one by one")
	}
}
