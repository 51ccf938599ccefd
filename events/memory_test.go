package events_test

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"understudy/events"
	"understudy/events/eventstest"
)

// t0 is deliberately not in UTC: the stores must normalise server time.
var t0 = time.Date(2025, 3, 1, 3, 12, 0, 0, time.FixedZone("CET", 3600))

type noted struct {
	Note string `msgpack:"note"`
}

func (*noted) EventType() string { return "memorytest.noted" }

func newCodec() *events.Registry {
	r := events.NewRegistry()
	r.MustRegister(&noted{}, 1)
	return r
}

func TestMemoryConformance(t *testing.T) {
	clock := events.NewManualClock(t0)
	eventstest.Run(t, eventstest.Harness{
		NewLog: func(t *testing.T, codec *events.Registry) events.Log {
			return events.NewMemoryLog("UNDERSTUDY_EVENTS", clock, codec)
		},
		NewKV: func(t *testing.T) events.KV {
			return events.NewMemoryKV("understudy_failover", clock)
		},
		Advance: func(t *testing.T, d time.Duration) { clock.Advance(d) },
		Batches: true,
	})
}

func TestManualClock(t *testing.T) {
	c := events.NewManualClock(t0)
	if got := c.Now(); !got.Equal(t0) {
		t.Fatalf("Now = %v, want %v", got, t0)
	}
	if got := c.Advance(time.Second); !got.Equal(t0.Add(time.Second)) || !c.Now().Equal(got) {
		t.Fatalf("Advance returned %v, Now %v; want %v", got, c.Now(), t0.Add(time.Second))
	}
	back := t0.Add(-time.Hour)
	c.Set(back)
	if got := c.Now(); !got.Equal(back) {
		t.Fatalf("after Set backwards Now = %v, want %v", got, back)
	}

	const goroutines, steps = 8, 100
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range steps {
				c.Advance(time.Millisecond)
				_ = c.Now()
			}
		})
	}
	wg.Wait()
	if got, want := c.Now(), back.Add(goroutines*steps*time.Millisecond); !got.Equal(want) {
		t.Fatalf("after concurrent Advance Now = %v, want %v", got, want)
	}
}

func TestMemoryStampsWithInjectedClock(t *testing.T) {
	ctx := context.Background()
	clock := events.NewManualClock(t0)
	log := events.NewMemoryLog("S", clock, newCodec())
	kv := events.NewMemoryKV("B", clock)
	clock.Advance(1500 * time.Millisecond)
	if _, err := log.Append(ctx, "ev.a", &noted{}, events.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	want := t0.Add(1500 * time.Millisecond).UTC()
	for rec, err := range log.Read(ctx, events.ReadOptions{}) {
		if err != nil {
			t.Fatal(err)
		}
		if rec.Time != want {
			t.Fatalf("record time %v, want exactly %v", rec.Time, want)
		}
		if rec.Stream != "S" {
			t.Fatalf("record stream %q, want S", rec.Stream)
		}
	}
	e, err := kv.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if e.Time != want {
		t.Fatalf("entry time %v, want exactly %v", e.Time, want)
	}
}

func appendID(t *testing.T, log events.Log, id string) events.Ack {
	t.Helper()
	ack, err := log.Append(context.Background(), "ev.a", &noted{Note: id}, events.AppendOptions{MsgID: id})
	if err != nil {
		t.Fatal(err)
	}
	return ack
}

func TestMemoryDedupWindowExpires(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   []events.MemoryLogOption
		window time.Duration
	}{
		{"default two minutes", nil, 2 * time.Minute},
		{"non-positive keeps the default", []events.MemoryLogOption{events.MemoryDedupWindow(0)}, 2 * time.Minute},
		{"configured", []events.MemoryLogOption{events.MemoryDedupWindow(10 * time.Second)}, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := events.NewManualClock(t0)
			log := events.NewMemoryLog("S", clock, newCodec(), tc.opts...)
			first := appendID(t, log, "m")
			other := appendID(t, log, "n")
			clock.Advance(tc.window - time.Nanosecond)
			if ack := appendID(t, log, "m"); ack != (events.Ack{Sequence: first.Sequence, Duplicate: true}) {
				t.Fatalf("just inside the window: %+v, want duplicate of %d", ack, first.Sequence)
			}
			clock.Advance(time.Nanosecond)
			again := appendID(t, log, "m")
			if again.Duplicate || again.Sequence <= other.Sequence {
				t.Fatalf("after the window: %+v, want a new sequence after %d", again, other.Sequence)
			}
			if ack := appendID(t, log, "n"); ack.Duplicate {
				t.Fatalf("id n expired too: %+v, want a new sequence", ack)
			}
			// The new message restarts the id's window.
			if ack := appendID(t, log, "m"); ack != (events.Ack{Sequence: again.Sequence, Duplicate: true}) {
				t.Fatalf("retry of the re-stored id: %+v, want duplicate of %d", ack, again.Sequence)
			}
		})
	}
}

func TestMemoryLogStoresNatsHeaders(t *testing.T) {
	ctx := context.Background()
	log := events.NewMemoryLog("S", events.NewManualClock(t0), newCodec())
	opts := events.Expect(0)
	opts.MsgID = "id-1"
	if _, err := log.Append(ctx, "ev.a", &noted{}, opts); err != nil {
		t.Fatal(err)
	}
	if _, err := log.Append(ctx, "ev.a", &noted{}, events.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	var recs []events.Record
	for rec, err := range log.Read(ctx, events.ReadOptions{}) {
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, rec)
	}
	if h := recs[0].Headers; h["Nats-Msg-Id"] != "id-1" || h["Nats-Expected-Last-Subject-Sequence"] != "0" {
		t.Fatalf("headers %v, want what JetStream stores for a MsgID and an expectation", h)
	}
	if recs[1].Headers != nil {
		t.Fatalf("a plain append has headers %v, want none", recs[1].Headers)
	}
}

func TestMemoryReadFromTimeAfterClockJump(t *testing.T) {
	ctx := context.Background()
	clock := events.NewManualClock(t0)
	log := events.NewMemoryLog("S", clock, newCodec())
	at := func(d time.Duration) {
		clock.Set(t0.Add(d))
		if _, err := log.Append(ctx, "ev.a", &noted{}, events.AppendOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	at(10 * time.Second) // 1
	at(20 * time.Second) // 2
	at(5 * time.Second)  // 3: the server clock jumped back
	at(15 * time.Second) // 4
	for _, tc := range []struct {
		from time.Duration
		want []uint64
	}{
		{0, []uint64{1, 2, 3, 4}},
		{12 * time.Second, []uint64{2, 3, 4}}, // the first record at or after, and everything after it
		{20 * time.Second, []uint64{2, 3, 4}},
		{21 * time.Second, nil},
	} {
		var got []uint64
		for rec, err := range log.Read(ctx, events.ReadOptions{FromTime: t0.Add(tc.from)}) {
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, rec.Sequence)
		}
		if !equalSeqs(got, tc.want) {
			t.Errorf("FromTime t0+%v: %v, want %v", tc.from, got, tc.want)
		}
	}
}

func equalSeqs(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestMemoryRejectsInvalidNames(t *testing.T) {
	ctx := context.Background()
	log := events.NewMemoryLog("S", events.NewManualClock(t0), newCodec())
	for _, subj := range []string{"", "ev..a", ".ev", "ev.", "ev.*", "ev.>", "ev.a b"} {
		if _, err := log.Append(ctx, subj, &noted{}, events.AppendOptions{}); err == nil || errors.Is(err, events.ErrConflict) {
			t.Errorf("Append(%q) = %v, want an invalid-subject error", subj, err)
		}
		if _, err := log.LastSequence(ctx, subj); err == nil {
			t.Errorf("LastSequence(%q) succeeded, want an invalid-subject error", subj)
		}
	}
	for _, filter := range []string{"ev.>.a", "ev..*", "ev.a "} {
		n := 0
		for _, err := range log.Read(ctx, events.ReadOptions{Subject: filter}) {
			n++
			if err == nil {
				t.Errorf("Read(Subject %q) yielded a record, want an error", filter)
			}
		}
		if n != 1 {
			t.Errorf("Read(Subject %q) yielded %d items, want one error", filter, n)
		}
	}
	kv := events.NewMemoryKV("B", events.NewManualClock(t0))
	for _, key := range []string{"", ".a", "a.", "a..b", "a b", "a*", "a.>", "ä"} {
		if _, err := kv.Put(ctx, key, nil); err == nil {
			t.Errorf("Put(%q) succeeded, want an invalid-key error", key)
		}
	}
	for _, pattern := range []string{"a.>.b", "a..*", ">.a", "a b"} {
		if w, err := kv.Watch(ctx, pattern, events.WatchOptions{}); err == nil {
			_ = w.Stop()
			t.Errorf("Watch(%q) succeeded, want an invalid-pattern error", pattern)
		}
	}
	for _, ok := range []string{"pair-1.hb.site_a", "a/b=c", "A9"} {
		if _, err := kv.Put(ctx, ok, nil); err != nil {
			t.Errorf("Put(%q): %v", ok, err)
		}
	}
}

func TestMemoryCancelledContextWritesNothing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	log := events.NewMemoryLog("S", events.NewManualClock(t0), newCodec())
	if _, err := log.Append(ctx, "ev.a", &noted{}, events.AppendOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Append: %v, want context.Canceled", err)
	}
	if seq, _ := log.LastSequence(context.Background(), "ev.a"); seq != 0 {
		t.Fatalf("a cancelled append stored sequence %d", seq)
	}
	kv := events.NewMemoryKV("B", events.NewManualClock(t0))
	if _, err := kv.Put(ctx, "k", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Put: %v, want context.Canceled", err)
	}
	if kv.Revision() != 0 {
		t.Fatalf("a cancelled put moved the bucket to revision %d", kv.Revision())
	}
}

func TestMemoryReturnsCopies(t *testing.T) {
	ctx := context.Background()
	log := events.NewMemoryLog("S", events.NewManualClock(t0), newCodec())
	data := []byte("raw bytes")
	if _, err := log.AppendRaw(ctx, "ev.a", data, events.AppendOptions{Headers: map[string]string{"H": "1"}}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		for rec, err := range log.Read(ctx, events.ReadOptions{}) {
			if err != nil {
				t.Fatal(err)
			}
			if string(rec.Data) != "raw bytes" || rec.Headers["H"] != "1" {
				t.Fatalf("stored record changed: %q %v", rec.Data, rec.Headers)
			}
			rec.Data[0] = 'X'
			rec.Headers["H"] = "changed"
		}
	}
	kv := events.NewMemoryKV("B", events.NewManualClock(t0))
	if _, err := kv.Put(ctx, "k", []byte("value")); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		e, err := kv.Get(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if string(e.Value) != "value" {
			t.Fatalf("stored value changed: %q", e.Value)
		}
		e.Value[0] = 'X'
		h, _ := kv.History(ctx, "k")
		h[0].Value[1] = 'X'
	}
}

func TestMemoryKVHistoryOption(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		n, want int
	}{{3, 3}, {0, 1}, {1000, events.HistoryLimit}} {
		kv := events.NewMemoryKV("B", events.NewManualClock(t0), events.MemoryHistory(tc.n))
		var last uint64
		for i := range events.HistoryLimit + 5 {
			r, err := kv.Put(ctx, "k", []byte{byte(i)})
			if err != nil {
				t.Fatal(err)
			}
			last = r
		}
		h, err := kv.History(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if len(h) != tc.want || h[len(h)-1].Revision != last {
			t.Fatalf("MemoryHistory(%d): %d entries ending at %d, want %d ending at %d", tc.n, len(h), h[len(h)-1].Revision, tc.want, last)
		}
		// A reader that falls behind misses revisions the limit dropped,
		// as a JetStream consumer would.
		ch, err := kv.Changes("k", 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(ch) != tc.want {
			t.Fatalf("MemoryHistory(%d): Changes from 0 returned %d entries, want the %d retained", tc.n, len(ch), tc.want)
		}
	}
}

// Snapshot and Changes are Watch without a goroutine, for the simulator:
// their results must be exactly what a Watch delivers.
func TestMemoryKVSnapshotAndChangesMatchWatch(t *testing.T) {
	ctx := context.Background()
	kv := events.NewMemoryKV("B", events.NewManualClock(t0))
	mustPut := func(key, value string) uint64 {
		r, err := kv.Put(ctx, key, []byte(value))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	mustPut("pair.config", "c")
	mustPut("pair.leader", "l1")
	mustPut("other.x", "o")
	mustPut("pair.leader", "l2")
	if err := kv.Delete(ctx, "pair.config"); err != nil {
		t.Fatal(err)
	}

	for _, opts := range []events.WatchOptions{{}, {History: true}, {UpdatesOnly: true}} {
		snap, rev, err := kv.Snapshot("pair.>", opts)
		if err != nil {
			t.Fatal(err)
		}
		if rev != kv.Revision() {
			t.Fatalf("Snapshot revision %d, bucket at %d", rev, kv.Revision())
		}
		w, err := kv.Watch(ctx, "pair.>", opts)
		if err != nil {
			t.Fatal(err)
		}
		var got []events.Entry
		for e := range w.Updates() {
			if e.Revision == 0 {
				break
			}
			got = append(got, e)
		}
		if err := w.Stop(); err != nil {
			t.Fatal(err)
		}
		if !equalEntries(got, snap) {
			t.Fatalf("%+v: Watch delivered %v, Snapshot %v", opts, got, snap)
		}
	}

	_, rev, _ := kv.Snapshot("pair.>", events.WatchOptions{})
	want := []uint64{mustPut("pair.leader", "l3")}
	mustPut("other.x", "o2")
	want = append(want, mustPut("pair.hb.a", "h"))
	ch, err := kv.Changes("pair.>", rev)
	if err != nil {
		t.Fatal(err)
	}
	if len(ch) != 2 || ch[0].Revision != want[0] || ch[1].Revision != want[1] {
		t.Fatalf("Changes after %d: %v, want revisions %v", rev, ch, want)
	}
	if ch, _ := kv.Changes("pair.>", want[1]); len(ch) != 0 {
		t.Fatalf("Changes at the head: %v, want none", ch)
	}
}

func equalEntries(a, b []events.Entry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Key != b[i].Key || a[i].Revision != b[i].Revision || a[i].Op != b[i].Op ||
			!bytes.Equal(a[i].Value, b[i].Value) || !a[i].Time.Equal(b[i].Time) || a[i].Bucket != b[i].Bucket {
			return false
		}
	}
	return true
}

// Stop returns only once the pump has ended, so no goroutine outlives it.
func TestMemoryWatchStopIsSynchronous(t *testing.T) {
	ctx := context.Background()
	kv := events.NewMemoryKV("B", events.NewManualClock(t0))
	if _, err := kv.Put(ctx, "pair.leader", []byte("a")); err != nil {
		t.Fatal(err)
	}
	w, err := kv.Watch(ctx, "pair.>", events.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-w.Updates():
		if ok {
			t.Fatal("Updates delivered an entry after Stop returned")
		}
	default:
		t.Fatal("Updates still open after Stop returned")
	}
}

// Many writers and watchers at once: every watcher sees every matching
// revision in order (the race detector checks the rest).
func TestMemoryKVConcurrentWritersAndWatchers(t *testing.T) {
	ctx := context.Background()
	kv := events.NewMemoryKV("B", events.NewManualClock(t0))
	const writers, writes, watchers = 4, 50, 3
	var ws []events.Watcher
	for range watchers {
		w, err := kv.Watch(ctx, "pair.>", events.WatchOptions{UpdatesOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		if e := <-w.Updates(); e.Revision != 0 {
			t.Fatalf("first delivery %+v, want the marker", e)
		}
		ws = append(ws, w)
	}
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := range writes {
				key := "pair.hb." + string(rune('a'+g))
				if i%10 == 9 {
					key = "other.x"
				}
				if _, err := kv.Put(ctx, key, []byte{byte(i)}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	matching := writers * (writes - writes/10)
	for i, w := range ws {
		var prev uint64
		for n := range matching {
			select {
			case e := <-w.Updates():
				if e.Revision <= prev || e.Key == "other.x" {
					t.Fatalf("watcher %d entry %d: %+v after revision %d", i, n, e, prev)
				}
				prev = e.Revision
			case <-time.After(5 * time.Second):
				t.Fatalf("watcher %d got %d of %d entries", i, n, matching)
			}
		}
		if err := w.Stop(); err != nil {
			t.Fatal(err)
		}
	}
}
