package eventstest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"understudy/events"
)

// Harness builds fresh stores of one implementation for Run.
//
// Run calls the constructors from sequential subtests and uses each store
// only inside the subtest that made it, and never holds two Logs at once:
// a JetStream harness may delete the previous stream (t.Cleanup) before
// creating the next one on the same subjects.
type Harness struct {
	// NewLog returns an empty Log whose stream captures subjects "ev.>",
	// using codec.
	NewLog func(t *testing.T, codec *events.Registry) events.Log
	// NewKV returns an empty KV bucket with history HistoryLimit (64).
	NewKV func(t *testing.T) events.KV
	// Advance moves the server clock forward by at least d (a real sleep for
	// JetStream, clock.Advance for memory).
	Advance func(t *testing.T, d time.Duration)
	// DedupWindow is the duplicate window of NewLog's stream (0: JetStream's
	// default of two minutes).
	DedupWindow time.Duration
	// Batches: NewKV's buckets are events.KVBatcher and NewLog's logs
	// events.LogBatcher, and both take batches; Run checks WriteBatch's and
	// AppendBatch's contracts.
	Batches bool
}

const (
	// waitTimeout bounds anything that should happen promptly (a live
	// update, a stopped read); only a broken implementation waits this long.
	waitTimeout = 5 * time.Second
	// opTimeout bounds the context of every store call, so a read that
	// never ends fails the test instead of hanging it.
	opTimeout = 20 * time.Second
	// step separates server timestamps; the whole suite advances the clock
	// by 2*step, keeping a JetStream run's real sleeps short.
	step = 15 * time.Millisecond
	// racers is how many goroutines contend in the concurrency subtests.
	racers = 16
)

// Run checks that h's Log and KV behave as the contracts of package events
// say, and as JetStream does.
func Run(t *testing.T, h Harness) {
	if h.NewLog == nil || h.NewKV == nil || h.Advance == nil {
		t.Fatal("eventstest: Harness needs NewLog, NewKV and Advance")
	}
	s := suite{h: h}
	t.Run("Log", func(t *testing.T) {
		t.Run("AppendReadRoundTrip", s.logRoundTrip)
		t.Run("SequencesIncrease", s.logSequences)
		t.Run("ConcurrentAppends", s.logConcurrentAppends)
		t.Run("Expect", func(t *testing.T) {
			t.Run("ZeroOnEmptySubject", s.expectZeroOnEmpty)
			t.Run("MatchingSequence", s.expectMatching)
			t.Run("StaleSequenceConflicts", s.expectStale)
			t.Run("ZeroOnNonEmptySubjectConflicts", s.expectZeroOnNonEmpty)
			t.Run("UnknownSequenceConflicts", s.expectUnknown)
			t.Run("PerSubject", s.expectPerSubject)
			t.Run("IgnoredUnlessSet", s.expectIgnoredUnlessSet)
			t.Run("ConcurrentWritersOneWins", s.expectConcurrent)
		})
		t.Run("MsgID", func(t *testing.T) {
			t.Run("DuplicateReturnsOriginal", s.msgIDDuplicate)
			t.Run("StreamWide", s.msgIDAcrossSubjects)
			t.Run("RetryWithStaleExpectation", s.msgIDRetryWithExpectation)
			t.Run("RetryPastTheWindow", s.msgIDRetryPastWindow)
			t.Run("ConflictDoesNotRecordID", s.msgIDConflictNotRecorded)
		})
		t.Run("LastSequence", s.logLastSequence)
		t.Run("RecordBySequence", s.logRecord)
		t.Run("RecordOnSubject", s.logRecordOn)
		t.Run("Read", func(t *testing.T) {
			t.Run("FromSequence", s.readFromSequence)
			t.Run("FromTime", s.readFromTime)
			t.Run("SubjectFilter", s.readSubjectFilter)
			t.Run("EmptyLog", s.readEmpty)
			t.Run("EndsAtRecordsPresentAtStart", s.readEndsAtStart)
			t.Run("EarlyBreak", s.readEarlyBreak)
			t.Run("CancelledContext", s.readCancelled)
			t.Run("FollowTail", s.readFollow)
		})
		t.Run("ServerTimestamps", s.logTimestamps)
		t.Run("Headers", s.logHeaders)
		t.Run("AppendRawPreservesBytes", s.logAppendRaw)
		if h.Batches {
			t.Run("Batch", func(t *testing.T) {
				t.Run("AllLandInOrder", s.logBatchLands)
				t.Run("ConflictAppendsNothing", s.logBatchConflict)
				t.Run("StoredIDAppendsNothing", s.logBatchDuplicate)
				t.Run("SubjectTwiceRefused", s.logBatchSubjectTwice)
			})
		}
	})
	t.Run("KV", func(t *testing.T) {
		t.Run("GetNotFound", s.kvGetNotFound)
		t.Run("CreateThenGet", s.kvCreate)
		t.Run("CreateConflictsWhenExists", s.kvCreateConflict)
		t.Run("UpdateCompareAndSet", s.kvUpdate)
		t.Run("UpdateOnAbsentKey", s.kvUpdateAbsent)
		t.Run("Put", s.kvPut)
		t.Run("Delete", s.kvDelete)
		t.Run("DeleteNeverWritten", s.kvDeleteNeverWritten)
		t.Run("RevisionsIncrease", s.kvRevisions)
		t.Run("History", s.kvHistory)
		t.Run("HistoryLimit", s.kvHistoryLimit)
		t.Run("Watch", func(t *testing.T) {
			t.Run("LatestPerKey", s.watchLatest)
			t.Run("History", s.watchHistory)
			t.Run("UpdatesOnly", s.watchUpdatesOnly)
			t.Run("SingleKey", s.watchSingleKey)
			t.Run("StarWildcard", s.watchStar)
			t.Run("EmptyBucket", s.watchEmpty)
			t.Run("StopClosesChannel", s.watchStop)
			t.Run("ContextEndClosesChannel", s.watchContext)
		})
		t.Run("ConcurrentUpdateOneWins", s.kvConcurrentCAS)
		t.Run("InvalidKeyRefused", s.kvInvalidKey)
		if h.Batches {
			t.Run("Batch", func(t *testing.T) {
				t.Run("AllLandInOrder", s.batchLands)
				t.Run("ConflictWritesNothing", s.batchConflict)
				t.Run("KeyTwiceRefused", s.batchKeyTwice)
				t.Run("WatchSeesEveryWrite", s.batchWatched)
			})
		}
	})
}

type suite struct{ h Harness }

// Test events. future is registered only in a second registry, so the
// log's codec sees it as *events.Unknown.

type created struct {
	ID   string   `msgpack:"id"`
	Size int      `msgpack:"size"`
	Tags []string `msgpack:"tags"`
}

func (*created) EventType() string { return "eventstest.created" }

type renamed struct {
	ID   string `msgpack:"id"`
	From string `msgpack:"from"`
	To   string `msgpack:"to"`
}

func (*renamed) EventType() string { return "eventstest.renamed" }

type future struct {
	Note string `msgpack:"note"`
}

func (*future) EventType() string { return "eventstest.future" }

func newCodec() *events.Registry {
	r := events.NewRegistry()
	r.MustRegister(&created{}, 1)
	r.MustRegister(&renamed{}, 2)
	return r
}

func ev(id string) events.Event { return &created{ID: id, Size: len(id)} }

func opCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	t.Cleanup(cancel)
	return ctx
}

func (s suite) newLog(t *testing.T) events.Log {
	t.Helper()
	codec := newCodec()
	log := s.h.NewLog(t, codec)
	if log.Codec() != codec {
		t.Fatalf("Codec() = %p, want the registry the log was made with (%p)", log.Codec(), codec)
	}
	return log
}

func mustAppend(t *testing.T, log events.Log, subject string, e events.Event, opts events.AppendOptions) events.Ack {
	t.Helper()
	ack, err := log.Append(opCtx(t), subject, e, opts)
	if err != nil {
		t.Fatalf("Append(%s, %+v): %v", subject, opts, err)
	}
	if ack.Duplicate {
		t.Fatalf("Append(%s, %+v) = %+v: a new message acked as duplicate", subject, opts, ack)
	}
	return ack
}

func appendConflict(t *testing.T, log events.Log, subject string, opts events.AppendOptions) {
	t.Helper()
	ack, err := log.Append(opCtx(t), subject, ev("late"), opts)
	if !errors.Is(err, events.ErrConflict) {
		t.Fatalf("Append(%s, %+v) = %+v, %v; want ErrConflict", subject, opts, ack, err)
	}
}

func readAll(t *testing.T, log events.Log, opts events.ReadOptions) []events.Record {
	t.Helper()
	var out []events.Record
	for rec, err := range log.Read(opCtx(t), opts) {
		if err != nil {
			t.Fatalf("Read(%+v) after %d records: %v", opts, len(out), err)
		}
		out = append(out, rec)
	}
	return out
}

func lastSeq(t *testing.T, log events.Log, subject string) uint64 {
	t.Helper()
	seq, err := log.LastSequence(opCtx(t), subject)
	if err != nil {
		t.Fatalf("LastSequence(%s): %v", subject, err)
	}
	return seq
}

func seqs(recs []events.Record) []uint64 {
	out := make([]uint64, len(recs))
	for i, r := range recs {
		out[i] = r.Sequence
	}
	return out
}

func wantSeqs(t *testing.T, what string, recs []events.Record, want ...uint64) {
	t.Helper()
	got := seqs(recs)
	if len(want) == 0 {
		want = []uint64{}
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: got sequences %v, want %v", what, got, want)
	}
}

func checkServerTime(t *testing.T, what string, ts time.Time) {
	t.Helper()
	if ts.IsZero() {
		t.Fatalf("%s: zero server timestamp", what)
	}
	if ts.Location() != time.UTC {
		t.Fatalf("%s: server timestamp %v is in %v, want UTC", what, ts, ts.Location())
	}
}

func (s suite) logRoundTrip(t *testing.T) {
	log := s.newLog(t)
	sent := []events.Event{
		&created{ID: "pg-main", Size: 3, Tags: []string{"a", "b"}},
		&renamed{ID: "pg-main", From: "pg-main", To: "pg-primary"},
	}
	var acks []events.Ack
	for _, e := range sent {
		acks = append(acks, mustAppend(t, log, "ev.resource.pg-main", e, events.AppendOptions{}))
	}
	recs := readAll(t, log, events.ReadOptions{})
	if len(recs) != len(sent) {
		t.Fatalf("read %d records, want %d", len(recs), len(sent))
	}
	for i, rec := range recs {
		if rec.Subject != "ev.resource.pg-main" || rec.Sequence != acks[i].Sequence || rec.Stream == "" {
			t.Errorf("record %d = {Stream %q Subject %q Sequence %d}, want subject ev.resource.pg-main, sequence %d, a stream name",
				i, rec.Stream, rec.Subject, rec.Sequence, acks[i].Sequence)
		}
		got, err := log.Codec().DecodeRecord(rec)
		if err != nil {
			t.Fatalf("decode record %d: %v", i, err)
		}
		if !reflect.DeepEqual(got, sent[i]) {
			t.Errorf("record %d decodes to %#v, want %#v", i, got, sent[i])
		}
	}
}

func (s suite) logSequences(t *testing.T) {
	log := s.newLog(t)
	var prev uint64
	var want []uint64
	for i, subj := range []string{"ev.a.1", "ev.b.1", "ev.a.1", "ev.c.1", "ev.a.2"} {
		ack := mustAppend(t, log, subj, ev(fmt.Sprint(i)), events.AppendOptions{})
		if ack.Sequence <= prev {
			t.Fatalf("append %d got sequence %d after %d: not strictly increasing", i, ack.Sequence, prev)
		}
		prev = ack.Sequence
		want = append(want, ack.Sequence)
	}
	wantSeqs(t, "read back", readAll(t, log, events.ReadOptions{}), want...)
}

func (s suite) logConcurrentAppends(t *testing.T) {
	log := s.newLog(t)
	const per = 10
	var wg sync.WaitGroup
	acks := make([][]uint64, racers)
	errs := make([]error, racers)
	for g := range racers {
		wg.Go(func() {
			for i := range per {
				ack, err := log.Append(opCtx(t), fmt.Sprintf("ev.conc.%d", g), ev(fmt.Sprint(i)), events.AppendOptions{})
				if err != nil {
					errs[g] = err
					return
				}
				acks[g] = append(acks[g], ack.Sequence)
			}
		})
	}
	wg.Wait()
	seen := map[uint64]bool{}
	for g := range racers {
		if errs[g] != nil {
			t.Fatalf("writer %d: %v", g, errs[g])
		}
		for i, seq := range acks[g] {
			if seen[seq] {
				t.Fatalf("sequence %d acked twice", seq)
			}
			seen[seq] = true
			if i > 0 && seq <= acks[g][i-1] {
				t.Fatalf("writer %d: sequence %d after %d", g, seq, acks[g][i-1])
			}
		}
	}
	recs := readAll(t, log, events.ReadOptions{})
	if len(recs) != racers*per {
		t.Fatalf("read %d records, want %d", len(recs), racers*per)
	}
	for i, rec := range recs {
		if !seen[rec.Sequence] {
			t.Fatalf("record with sequence %d was never acked", rec.Sequence)
		}
		if i > 0 && rec.Sequence <= recs[i-1].Sequence {
			t.Fatalf("read sequence %d after %d", rec.Sequence, recs[i-1].Sequence)
		}
	}
}

func (s suite) expectZeroOnEmpty(t *testing.T) {
	log := s.newLog(t)
	mustAppend(t, log, "ev.other.x", ev("noise"), events.AppendOptions{})
	ack := mustAppend(t, log, "ev.member.a", ev("first"), events.Expect(0))
	if got := lastSeq(t, log, "ev.member.a"); got != ack.Sequence {
		t.Fatalf("LastSequence = %d, want %d", got, ack.Sequence)
	}
}

func (s suite) expectMatching(t *testing.T) {
	log := s.newLog(t)
	a1 := mustAppend(t, log, "ev.member.a", ev("1"), events.Expect(0))
	a2 := mustAppend(t, log, "ev.member.a", ev("2"), events.Expect(a1.Sequence))
	a3 := mustAppend(t, log, "ev.member.a", ev("3"), events.Expect(a2.Sequence))
	wantSeqs(t, "read back", readAll(t, log, events.ReadOptions{}), a1.Sequence, a2.Sequence, a3.Sequence)
}

func (s suite) expectStale(t *testing.T) {
	log := s.newLog(t)
	a1 := mustAppend(t, log, "ev.member.a", ev("1"), events.Expect(0))
	a2 := mustAppend(t, log, "ev.member.a", ev("2"), events.Expect(a1.Sequence))
	appendConflict(t, log, "ev.member.a", events.Expect(a1.Sequence))
	if got := lastSeq(t, log, "ev.member.a"); got != a2.Sequence {
		t.Fatalf("after the conflict LastSequence = %d, want %d", got, a2.Sequence)
	}
	wantSeqs(t, "a conflicting append stores nothing", readAll(t, log, events.ReadOptions{}), a1.Sequence, a2.Sequence)
}

func (s suite) expectZeroOnNonEmpty(t *testing.T) {
	log := s.newLog(t)
	a1 := mustAppend(t, log, "ev.member.a", ev("1"), events.AppendOptions{})
	appendConflict(t, log, "ev.member.a", events.Expect(0))
	wantSeqs(t, "a conflicting append stores nothing", readAll(t, log, events.ReadOptions{}), a1.Sequence)
}

func (s suite) expectUnknown(t *testing.T) {
	log := s.newLog(t)
	appendConflict(t, log, "ev.member.a", events.Expect(7))
	a1 := mustAppend(t, log, "ev.member.a", ev("1"), events.AppendOptions{})
	appendConflict(t, log, "ev.member.a", events.Expect(a1.Sequence+1))
	wantSeqs(t, "conflicting appends store nothing", readAll(t, log, events.ReadOptions{}), a1.Sequence)
}

func (s suite) expectPerSubject(t *testing.T) {
	log := s.newLog(t)
	a := mustAppend(t, log, "ev.member.a", ev("a1"), events.Expect(0))
	b1 := mustAppend(t, log, "ev.member.b", ev("b1"), events.Expect(0))
	b2 := mustAppend(t, log, "ev.member.b", ev("b2"), events.Expect(b1.Sequence))
	// The stream moved on, but a's subject did not: a's expectation holds.
	a2 := mustAppend(t, log, "ev.member.a", ev("a2"), events.Expect(a.Sequence))
	// The stream's last sequence is not the subject's.
	appendConflict(t, log, "ev.member.b", events.Expect(a2.Sequence))
	mustAppend(t, log, "ev.member.b", ev("b3"), events.Expect(b2.Sequence))
	// A subject that shares a prefix is another subject.
	mustAppend(t, log, "ev.member.a.x", ev("ax"), events.Expect(0))
}

func (s suite) expectIgnoredUnlessSet(t *testing.T) {
	log := s.newLog(t)
	opts := events.AppendOptions{ExpectLastSubjectSeq: 42}
	a1 := mustAppend(t, log, "ev.member.a", ev("1"), opts)
	a2 := mustAppend(t, log, "ev.member.a", ev("2"), opts)
	wantSeqs(t, "read back", readAll(t, log, events.ReadOptions{}), a1.Sequence, a2.Sequence)
}

func (s suite) expectConcurrent(t *testing.T) {
	log := s.newLog(t)
	base := mustAppend(t, log, "ev.member.a", ev("base"), events.Expect(0))
	var wg sync.WaitGroup
	acks := make([]events.Ack, racers)
	errs := make([]error, racers)
	start := make(chan struct{})
	for g := range racers {
		wg.Go(func() {
			<-start
			acks[g], errs[g] = log.Append(opCtx(t), "ev.member.a", ev(fmt.Sprint(g)), events.Expect(base.Sequence))
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for g := range racers {
		switch {
		case errs[g] == nil && winner >= 0:
			t.Fatalf("writers %d and %d both appended with the same expectation", winner, g)
		case errs[g] == nil:
			winner = g
		case !errors.Is(errs[g], events.ErrConflict):
			t.Fatalf("losing writer %d: %v, want ErrConflict", g, errs[g])
		}
	}
	if winner < 0 {
		t.Fatal("no writer won")
	}
	if got := lastSeq(t, log, "ev.member.a"); got != acks[winner].Sequence {
		t.Fatalf("LastSequence = %d, want the winner's %d", got, acks[winner].Sequence)
	}
	wantSeqs(t, "read back", readAll(t, log, events.ReadOptions{}), base.Sequence, acks[winner].Sequence)
}

func (s suite) msgIDDuplicate(t *testing.T) {
	log := s.newLog(t)
	opts := events.AppendOptions{MsgID: "fence-1"}
	first := mustAppend(t, log, "ev.member.a", ev("1"), opts)
	for _, e := range []events.Event{ev("1"), ev("different body, same id")} {
		ack, err := log.Append(opCtx(t), "ev.member.a", e, opts)
		if err != nil {
			t.Fatalf("retry: %v", err)
		}
		if want := (events.Ack{Sequence: first.Sequence, Duplicate: true}); ack != want {
			t.Fatalf("retry acked %+v, want %+v", ack, want)
		}
	}
	if got := lastSeq(t, log, "ev.member.a"); got != first.Sequence {
		t.Fatalf("LastSequence = %d, want %d", got, first.Sequence)
	}
	other := mustAppend(t, log, "ev.member.a", ev("2"), events.AppendOptions{MsgID: "fence-2"})
	wantSeqs(t, "nothing stored twice", readAll(t, log, events.ReadOptions{}), first.Sequence, other.Sequence)
}

// The dedup window is stream-wide: an id stored on one subject makes an
// append under it on another a duplicate, not stored, even with an
// expectation that holds. The ack names the other subject's record, and
// reading from its sequence finds it: that is how the runtime's appender
// tells its own earlier attempt from an id another publisher took.
func (s suite) msgIDAcrossSubjects(t *testing.T) {
	log := s.newLog(t)
	first := mustAppend(t, log, "ev.member.a", ev("1"), events.AppendOptions{MsgID: "m"})
	for _, opts := range []events.AppendOptions{{MsgID: "m"}, {MsgID: "m", ExpectSet: true}} {
		ack, err := log.Append(opCtx(t), "ev.member.b", ev("1"), opts)
		if err != nil {
			t.Fatalf("append %+v: %v", opts, err)
		}
		if want := (events.Ack{Sequence: first.Sequence, Duplicate: true}); ack != want {
			t.Fatalf("same id on another subject (%+v) acked %+v, want %+v (the dedup window is stream-wide)", opts, ack, want)
		}
	}
	if got := lastSeq(t, log, "ev.member.b"); got != 0 {
		t.Fatalf("LastSequence(ev.member.b) = %d, want 0", got)
	}
	recs := readAll(t, log, events.ReadOptions{FromSeq: first.Sequence})
	if len(recs) == 0 || recs[0].Sequence != first.Sequence || recs[0].Subject != "ev.member.a" || recs[0].Headers["Nats-Msg-Id"] != "m" {
		t.Fatalf("read from the duplicate ack's sequence %d: %+v; want ev.member.a's record under id m first", first.Sequence, recs)
	}
}

// A writer whose ack was lost retries the very same append. Its expectation
// is stale now (its own first attempt moved the subject), yet the retry must
// ack as a duplicate: that is what makes "Expect + MsgID" safe to retry.
func (s suite) msgIDRetryWithExpectation(t *testing.T) {
	log := s.newLog(t)
	prev := mustAppend(t, log, "ev.member.a", ev("0"), events.Expect(0))
	opts := events.Expect(prev.Sequence)
	opts.MsgID = "promote-7"
	first := mustAppend(t, log, "ev.member.a", ev("1"), opts)
	ack, err := log.Append(opCtx(t), "ev.member.a", ev("1"), opts)
	if err != nil {
		t.Fatalf("retry of an append that landed: %v; want a duplicate ack", err)
	}
	if want := (events.Ack{Sequence: first.Sequence, Duplicate: true}); ack != want {
		t.Fatalf("retry acked %+v, want %+v", ack, want)
	}
	// A new id with the same stale expectation is a real conflict.
	opts.MsgID = "promote-8"
	appendConflict(t, log, "ev.member.a", opts)
	wantSeqs(t, "read back", readAll(t, log, events.ReadOptions{}), prev.Sequence, first.Sequence)
}

// A retry can come later than the dedup window (a partition held it): with
// an expectation it is still recognised by the record its first attempt
// left right after the expected sequence, even with other subjects'
// records in between; a retry without that record is a conflict.
func (s suite) msgIDRetryPastWindow(t *testing.T) {
	log := s.newLog(t)
	prev := mustAppend(t, log, "ev.member.a", ev("0"), events.Expect(0))
	opts := events.Expect(prev.Sequence)
	opts.MsgID = "ev.member.a@2/5eed"
	first := mustAppend(t, log, "ev.member.a", ev("1"), opts)
	mustAppend(t, log, "ev.member.b", ev("other"), events.AppendOptions{})
	window := s.h.DedupWindow
	if window == 0 {
		window = 2 * time.Minute
	}
	s.h.Advance(t, window+step)
	ack, err := log.Append(opCtx(t), "ev.member.a", ev("1"), opts)
	if err != nil {
		t.Fatalf("retry past the window: %v; want a duplicate ack", err)
	}
	if want := (events.Ack{Sequence: first.Sequence, Duplicate: true}); ack != want {
		t.Fatalf("retry past the window acked %+v, want %+v", ack, want)
	}
	later := mustAppend(t, log, "ev.member.a", ev("2"), events.Expect(first.Sequence))
	opts = events.Expect(first.Sequence)
	opts.MsgID = "ev.member.a@3/0ther"
	appendConflict(t, log, "ev.member.a", opts)
	if got := lastSeq(t, log, "ev.member.a"); got != later.Sequence {
		t.Fatalf("LastSequence = %d, want %d", got, later.Sequence)
	}
}

func (s suite) msgIDConflictNotRecorded(t *testing.T) {
	log := s.newLog(t)
	opts := events.Expect(5)
	opts.MsgID = "m"
	appendConflict(t, log, "ev.member.a", opts)
	// The rejected append did not store, so its id was not recorded.
	ack := mustAppend(t, log, "ev.member.a", ev("1"), events.AppendOptions{MsgID: "m"})
	wantSeqs(t, "read back", readAll(t, log, events.ReadOptions{}), ack.Sequence)
}

func (s suite) logRecord(t *testing.T) {
	log := s.newLog(t)
	ctx := context.Background()
	if _, err := log.Record(ctx, 1); !errors.Is(err, events.ErrNotFound) {
		t.Fatalf("Record(1) on an empty log: err = %v, want ErrNotFound", err)
	}
	mustAppend(t, log, "ev.member.a", ev("a1"), events.AppendOptions{})
	b := mustAppend(t, log, "ev.member.b", ev("b1"), events.AppendOptions{MsgID: "id-b1", Headers: map[string]string{"X-Test": "v"}})
	rec, err := log.Record(ctx, b.Sequence)
	if err != nil {
		t.Fatalf("Record(%d): %v", b.Sequence, err)
	}
	if rec.Sequence != b.Sequence || rec.Subject != "ev.member.b" || rec.Headers["X-Test"] != "v" || rec.Headers["Nats-Msg-Id"] != "id-b1" || rec.Time.IsZero() {
		t.Fatalf("Record(%d) = seq %d subject %q headers %v time %v; want the record appended there", b.Sequence, rec.Sequence, rec.Subject, rec.Headers, rec.Time)
	}
	read := readAll(t, log, events.ReadOptions{FromSeq: b.Sequence})
	if len(read) == 0 || !bytes.Equal(read[0].Data, rec.Data) {
		t.Fatalf("Record(%d).Data differs from what Read yields there", b.Sequence)
	}
	for _, seq := range []uint64{0, b.Sequence + 1} {
		if _, err := log.Record(ctx, seq); !errors.Is(err, events.ErrNotFound) {
			t.Fatalf("Record(%d): err = %v, want ErrNotFound", seq, err)
		}
	}
}

func (s suite) logRecordOn(t *testing.T) {
	log := s.newLog(t)
	ctx := context.Background()
	if _, err := log.RecordOn(ctx, "ev.member.a", 1); !errors.Is(err, events.ErrNotFound) {
		t.Fatalf("RecordOn on an empty log: err = %v, want ErrNotFound", err)
	}
	a1 := mustAppend(t, log, "ev.member.a", ev("a1"), events.AppendOptions{})
	mustAppend(t, log, "ev.member.b", ev("b1"), events.AppendOptions{})
	mustAppend(t, log, "ev.member.a.deeper", ev("ad"), events.AppendOptions{})
	a2 := mustAppend(t, log, "ev.member.a", ev("a2"), events.AppendOptions{})
	for _, c := range []struct {
		from uint64
		want uint64
	}{{0, a1.Sequence}, {1, a1.Sequence}, {a1.Sequence + 1, a2.Sequence}, {a2.Sequence, a2.Sequence}} {
		rec, err := log.RecordOn(ctx, "ev.member.a", c.from)
		if err != nil || rec.Sequence != c.want || rec.Subject != "ev.member.a" {
			t.Fatalf("RecordOn(ev.member.a, %d) = seq %d subject %q, %v; want seq %d", c.from, rec.Sequence, rec.Subject, err, c.want)
		}
	}
	if _, err := log.RecordOn(ctx, "ev.member.a", a2.Sequence+1); !errors.Is(err, events.ErrNotFound) {
		t.Fatalf("RecordOn past the subject's last record: err = %v, want ErrNotFound", err)
	}
	if _, err := log.RecordOn(ctx, "ev.member.*", 1); err == nil || errors.Is(err, events.ErrNotFound) {
		t.Fatalf("RecordOn with a wildcard: err = %v, want a refusal", err)
	}
}

func (s suite) logLastSequence(t *testing.T) {
	log := s.newLog(t)
	if got := lastSeq(t, log, "ev.member.a"); got != 0 {
		t.Fatalf("LastSequence on an empty log = %d, want 0", got)
	}
	mustAppend(t, log, "ev.member.a", ev("a1"), events.AppendOptions{})
	b1 := mustAppend(t, log, "ev.member.b", ev("b1"), events.AppendOptions{})
	a2 := mustAppend(t, log, "ev.member.a", ev("a2"), events.AppendOptions{})
	mustAppend(t, log, "ev.member.a.deeper", ev("ad"), events.AppendOptions{})
	for subj, want := range map[string]uint64{
		"ev.member.a": a2.Sequence,
		"ev.member.b": b1.Sequence,
		"ev.member.c": 0,
	} {
		if got := lastSeq(t, log, subj); got != want {
			t.Errorf("LastSequence(%s) = %d, want %d", subj, got, want)
		}
	}
}

func (s suite) readFromSequence(t *testing.T) {
	log := s.newLog(t)
	var all []uint64
	for i, subj := range []string{"ev.a.1", "ev.b.1", "ev.a.1", "ev.b.1", "ev.a.1"} {
		all = append(all, mustAppend(t, log, subj, ev(fmt.Sprint(i)), events.AppendOptions{}).Sequence)
	}
	wantSeqs(t, "FromSeq 0", readAll(t, log, events.ReadOptions{}), all...)
	wantSeqs(t, "FromSeq 1", readAll(t, log, events.ReadOptions{FromSeq: 1}), all...)
	wantSeqs(t, "FromSeq third", readAll(t, log, events.ReadOptions{FromSeq: all[2]}), all[2:]...)
	wantSeqs(t, "FromSeq last", readAll(t, log, events.ReadOptions{FromSeq: all[4]}), all[4])
	wantSeqs(t, "FromSeq past the end", readAll(t, log, events.ReadOptions{FromSeq: all[4] + 1}))
	wantSeqs(t, "FromSeq second, subject ev.a.1",
		readAll(t, log, events.ReadOptions{FromSeq: all[1], Subject: "ev.a.1"}), all[2], all[4])
}

func (s suite) readFromTime(t *testing.T) {
	log := s.newLog(t)
	a := mustAppend(t, log, "ev.time.a", ev("a"), events.AppendOptions{})
	s.h.Advance(t, step)
	b := mustAppend(t, log, "ev.time.b", ev("b"), events.AppendOptions{})
	s.h.Advance(t, step)
	c := mustAppend(t, log, "ev.time.a", ev("c"), events.AppendOptions{})
	recs := readAll(t, log, events.ReadOptions{})
	wantSeqs(t, "all", recs, a.Sequence, b.Sequence, c.Sequence)
	ta, tb, tc := recs[0].Time, recs[1].Time, recs[2].Time
	if !tb.After(ta) || !tc.After(tb) {
		t.Fatalf("server times %v, %v, %v: Advance did not separate them", ta, tb, tc)
	}
	cases := []struct {
		name string
		opts events.ReadOptions
		want []uint64
	}{
		{"before everything", events.ReadOptions{FromTime: ta.Add(-time.Hour)}, []uint64{a.Sequence, b.Sequence, c.Sequence}},
		{"exactly the first", events.ReadOptions{FromTime: ta}, []uint64{a.Sequence, b.Sequence, c.Sequence}},
		{"exactly b", events.ReadOptions{FromTime: tb}, []uint64{b.Sequence, c.Sequence}},
		{"just after b", events.ReadOptions{FromTime: tb.Add(time.Nanosecond)}, []uint64{c.Sequence}},
		{"after everything", events.ReadOptions{FromTime: tc.Add(time.Nanosecond)}, nil},
		{"wins over FromSeq", events.ReadOptions{FromTime: tb, FromSeq: c.Sequence}, []uint64{b.Sequence, c.Sequence}},
		{"with a subject filter", events.ReadOptions{FromTime: tb, Subject: "ev.time.a"}, []uint64{c.Sequence}},
		{"in another zone", events.ReadOptions{FromTime: tb.In(time.FixedZone("UTC+5", 5*3600))}, []uint64{b.Sequence, c.Sequence}},
	}
	for _, tc := range cases {
		wantSeqs(t, tc.name, readAll(t, log, tc.opts), tc.want...)
	}
}

func (s suite) readSubjectFilter(t *testing.T) {
	log := s.newLog(t)
	seq := map[string]uint64{}
	for _, subj := range []string{"ev.a.1", "ev.a.2", "ev.b.1", "ev.a.1.x", "ev.b.2", "ev.ab.1", "ev.a"} {
		seq[subj] = mustAppend(t, log, subj, ev(subj), events.AppendOptions{}).Sequence
	}
	cases := []struct {
		filter string
		want   []string
	}{
		{"ev.a.1", []string{"ev.a.1"}},
		{"ev.a.*", []string{"ev.a.1", "ev.a.2"}},
		{"ev.*.1", []string{"ev.a.1", "ev.b.1", "ev.ab.1"}},
		{"ev.a.>", []string{"ev.a.1", "ev.a.2", "ev.a.1.x"}}, // ">" needs at least one token
		{"ev.*.*.x", []string{"ev.a.1.x"}},
		{"ev.*", []string{"ev.a"}},
		{"ev.>", []string{"ev.a.1", "ev.a.2", "ev.b.1", "ev.a.1.x", "ev.b.2", "ev.ab.1", "ev.a"}},
		{"", []string{"ev.a.1", "ev.a.2", "ev.b.1", "ev.a.1.x", "ev.b.2", "ev.ab.1", "ev.a"}},
		{"ev.c.*", nil},
		{"ev.a", []string{"ev.a"}},
		{"ev.b", nil},
	}
	for _, tc := range cases {
		var want []uint64
		for _, subj := range tc.want {
			want = append(want, seq[subj])
		}
		recs := readAll(t, log, events.ReadOptions{Subject: tc.filter})
		wantSeqs(t, fmt.Sprintf("filter %q", tc.filter), recs, want...)
		for i, rec := range recs {
			if rec.Subject != tc.want[i] {
				t.Errorf("filter %q: record %d has subject %q, want %q", tc.filter, i, rec.Subject, tc.want[i])
			}
		}
	}
}

func (s suite) readEmpty(t *testing.T) {
	log := s.newLog(t)
	for _, opts := range []events.ReadOptions{
		{},
		{Subject: "ev.a.*"},
		{FromSeq: 10},
		{FromTime: time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		done := make(chan []events.Record, 1)
		go func() {
			var recs []events.Record
			for rec, err := range log.Read(opCtx(t), opts) {
				if err != nil {
					t.Errorf("Read(%+v) on an empty log: %v", opts, err)
					break
				}
				recs = append(recs, rec)
			}
			done <- recs
		}()
		select {
		case recs := <-done:
			if len(recs) != 0 {
				t.Fatalf("Read(%+v) on an empty log yielded %d records", opts, len(recs))
			}
		case <-time.After(waitTimeout):
			t.Fatalf("Read(%+v) on an empty log did not end", opts)
		}
	}
}

func (s suite) readEndsAtStart(t *testing.T) {
	log := s.newLog(t)
	var want []uint64
	for i := range 3 {
		want = append(want, mustAppend(t, log, "ev.end.a", ev(fmt.Sprint(i)), events.AppendOptions{}).Sequence)
	}
	var got []events.Record
	for rec, err := range log.Read(opCtx(t), events.ReadOptions{}) {
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			// Appends made while the read runs are not part of it.
			mustAppend(t, log, "ev.end.a", ev("late-1"), events.AppendOptions{})
			mustAppend(t, log, "ev.end.b", ev("late-2"), events.AppendOptions{})
		}
		got = append(got, rec)
	}
	wantSeqs(t, "read that began before two appends", got, want...)
	if n := len(readAll(t, log, events.ReadOptions{})); n != 5 {
		t.Fatalf("a new read sees %d records, want 5", n)
	}
}

func (s suite) readEarlyBreak(t *testing.T) {
	log := s.newLog(t)
	for i := range 3 {
		mustAppend(t, log, "ev.brk.a", ev(fmt.Sprint(i)), events.AppendOptions{})
	}
	for _, follow := range []bool{false, true} {
		n := 0
		for _, err := range log.Read(opCtx(t), events.ReadOptions{Follow: follow}) {
			if err != nil {
				t.Fatal(err)
			}
			n++
			break
		}
		if n != 1 {
			t.Fatalf("Follow=%v: loop body ran %d times before break, want 1", follow, n)
		}
	}
	mustAppend(t, log, "ev.brk.a", ev("after"), events.AppendOptions{})
}

func (s suite) readCancelled(t *testing.T) {
	log := s.newLog(t)
	mustAppend(t, log, "ev.cancel.a", ev("1"), events.AppendOptions{})
	mustAppend(t, log, "ev.cancel.a", ev("2"), events.AppendOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()

	var last error
	for _, err := range log.Read(ctx, events.ReadOptions{}) {
		last = err
		if err != nil {
			break
		}
	}
	if !errors.Is(last, context.Canceled) {
		t.Fatalf("non-follow read with a cancelled context ended with %v, want context.Canceled", last)
	}

	done := make(chan error, 1)
	go func() {
		var firstErr error
		for _, err := range log.Read(ctx, events.ReadOptions{Follow: true}) {
			if err != nil && firstErr == nil {
				firstErr = err
			}
		}
		done <- firstErr
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("followed read with a cancelled context yielded %v; it should simply stop", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("followed read with a cancelled context did not stop")
	}
}

func (s suite) readFollow(t *testing.T) {
	log := s.newLog(t)
	a := mustAppend(t, log, "ev.tail.a", ev("a"), events.AppendOptions{})
	mustAppend(t, log, "ev.other.a", ev("not followed"), events.AppendOptions{})
	b := mustAppend(t, log, "ev.tail.b", ev("b"), events.AppendOptions{})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Buffered so the reader never blocks on the test; the test reads each
	// record before appending more than a handful.
	got := make(chan events.Record, 16)
	done := make(chan error, 1)
	go func() {
		var firstErr error
		for rec, err := range log.Read(ctx, events.ReadOptions{Subject: "ev.tail.>", Follow: true}) {
			if err != nil {
				firstErr = err
				break
			}
			got <- rec
		}
		done <- firstErr
	}()
	next := func(what string) events.Record {
		t.Helper()
		select {
		case rec := <-got:
			return rec
		case err := <-done:
			t.Fatalf("followed read ended (%v) while waiting for %s", err, what)
		case <-time.After(waitTimeout):
			t.Fatalf("followed read yielded no %s within %v", what, waitTimeout)
		}
		panic("unreachable")
	}
	for _, want := range []uint64{a.Sequence, b.Sequence} {
		if rec := next("existing record"); rec.Sequence != want {
			t.Fatalf("existing record: got sequence %d, want %d", rec.Sequence, want)
		}
	}
	c := mustAppend(t, log, "ev.tail.c", ev("c"), events.AppendOptions{})
	mustAppend(t, log, "ev.other.b", ev("not followed"), events.AppendOptions{})
	d := mustAppend(t, log, "ev.tail.a", ev("d"), events.AppendOptions{})
	for _, want := range []struct {
		seq uint64
		id  string
	}{{c.Sequence, "c"}, {d.Sequence, "d"}} {
		rec := next("live record")
		if rec.Sequence != want.seq {
			t.Fatalf("live record: got sequence %d (%s), want %d", rec.Sequence, rec.Subject, want.seq)
		}
		if e, err := log.Codec().DecodeRecord(rec); err != nil || !reflect.DeepEqual(e, ev(want.id)) {
			t.Fatalf("live record %d decodes to %#v, %v; want %#v", rec.Sequence, e, err, ev(want.id))
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("cancelled followed read yielded %v; it should simply stop", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("followed read did not stop after its context was cancelled")
	}
	if len(got) != 0 {
		t.Fatalf("followed read yielded %v beyond what was appended", <-got)
	}
}

func (s suite) logTimestamps(t *testing.T) {
	log := s.newLog(t)
	for i := range 5 {
		mustAppend(t, log, fmt.Sprintf("ev.ts.%d", i%2), ev(fmt.Sprint(i)), events.AppendOptions{})
	}
	recs := readAll(t, log, events.ReadOptions{})
	for i, rec := range recs {
		checkServerTime(t, fmt.Sprintf("record %d", rec.Sequence), rec.Time)
		if i > 0 && rec.Time.Before(recs[i-1].Time) {
			t.Fatalf("record %d at %v is before record %d at %v", rec.Sequence, rec.Time, recs[i-1].Sequence, recs[i-1].Time)
		}
	}
}

func (s suite) logHeaders(t *testing.T) {
	log := s.newLog(t)
	hdr := map[string]string{"Understudy-Trace": "abc-123", "Understudy-Site": "basement"}
	ack := mustAppend(t, log, "ev.hdr.a", ev("1"), events.AppendOptions{Headers: hdr, MsgID: "h-1"})
	hdr["Understudy-Trace"] = "changed after append" // the map is read, not kept
	plain := mustAppend(t, log, "ev.hdr.a", ev("2"), events.AppendOptions{})
	recs := readAll(t, log, events.ReadOptions{})
	wantSeqs(t, "read back", recs, ack.Sequence, plain.Sequence)
	for k, want := range map[string]string{"Understudy-Trace": "abc-123", "Understudy-Site": "basement"} {
		if got := recs[0].Headers[k]; got != want {
			t.Errorf("header %s = %q, want %q (all: %v)", k, got, want, recs[0].Headers)
		}
	}
	for _, k := range []string{"Understudy-Trace", "Understudy-Site"} {
		if v, ok := recs[1].Headers[k]; ok {
			t.Errorf("record appended without headers has %s = %q", k, v)
		}
	}
}

func (s suite) logAppendRaw(t *testing.T) {
	log := s.newLog(t)
	// An event this build does not know, as a newer release would store it.
	newer := events.NewRegistry()
	newer.MustRegister(&future{}, 3)
	orig := &future{Note: "from a newer release"}
	data, err := newer.Encode(orig)
	if err != nil {
		t.Fatal(err)
	}
	decoded, err := log.Codec().Decode("ev.raw.a", 0, data)
	if err != nil {
		t.Fatal(err)
	}
	unknown, ok := decoded.(*events.Unknown)
	if !ok {
		t.Fatalf("the log's codec decoded a foreign event to %T, want *events.Unknown", decoded)
	}
	raw := bytes.Clone(unknown.Raw)
	a1, err := log.AppendRaw(opCtx(t), "ev.raw.a", raw, events.AppendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	raw[0] ^= 0xff // the log copied the bytes, or they are on the server
	a2 := mustAppend(t, log, "ev.raw.a", unknown, events.AppendOptions{})
	garbage := []byte{0xc1, 0x00, 'n', 'o', 't', ' ', 'a', 'n', ' ', 'e', 'n', 'v'}
	a3, err := log.AppendRaw(opCtx(t), "ev.raw.b", garbage, events.AppendOptions{})
	if err != nil {
		t.Fatal(err)
	}
	recs := readAll(t, log, events.ReadOptions{})
	wantSeqs(t, "read back", recs, a1.Sequence, a2.Sequence, a3.Sequence)
	for _, rec := range recs[:2] {
		if !bytes.Equal(rec.Data, data) {
			t.Fatalf("record %d holds %x, want the original bytes %x", rec.Sequence, rec.Data, data)
		}
		e, err := log.Codec().DecodeRecord(rec)
		if err != nil {
			t.Fatal(err)
		}
		u, ok := e.(*events.Unknown)
		if !ok || u.Type != "eventstest.future" || u.Version != 3 || !bytes.Equal(u.Raw, data) {
			t.Fatalf("record %d decodes to %#v, want the same Unknown", rec.Sequence, e)
		}
		again, err := newer.DecodeRecord(rec)
		if err != nil || !reflect.DeepEqual(again, orig) {
			t.Fatalf("a build that knows the type decodes record %d to %#v, %v; want %#v", rec.Sequence, again, err, orig)
		}
	}
	if !bytes.Equal(recs[2].Data, garbage) {
		t.Fatalf("raw non-envelope bytes came back as %x, want %x", recs[2].Data, garbage)
	}
	if _, err := log.Codec().DecodeRecord(recs[2]); !errors.Is(err, events.ErrCorrupt) {
		t.Fatalf("decoding non-envelope bytes: %v, want ErrCorrupt", err)
	}
}

// KV

func getNotFound(t *testing.T, kv events.KV, key string) {
	t.Helper()
	e, err := kv.Get(opCtx(t), key)
	if !errors.Is(err, events.ErrNotFound) {
		t.Fatalf("Get(%s) = %s, %v; want ErrNotFound", key, show(e), err)
	}
}

func get(t *testing.T, kv events.KV, key string) events.Entry {
	t.Helper()
	e, err := kv.Get(opCtx(t), key)
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	return e
}

func put(t *testing.T, kv events.KV, key, value string) uint64 {
	t.Helper()
	rev, err := kv.Put(opCtx(t), key, []byte(value))
	if err != nil {
		t.Fatalf("Put(%s): %v", key, err)
	}
	return rev
}

func del(t *testing.T, kv events.KV, key string) uint64 {
	t.Helper()
	if err := kv.Delete(opCtx(t), key); err != nil {
		t.Fatalf("Delete(%s): %v", key, err)
	}
	h := history(t, kv, key)
	return h[len(h)-1].Revision
}

func history(t *testing.T, kv events.KV, key string) []events.Entry {
	t.Helper()
	h, err := kv.History(opCtx(t), key)
	if err != nil {
		t.Fatalf("History(%s): %v", key, err)
	}
	return h
}

func show(e events.Entry) string {
	if e.Revision == 0 && e.Key == "" {
		return "<marker>"
	}
	return fmt.Sprintf("%s@%d %v %q", e.Key, e.Revision, e.Op, e.Value)
}

// want describes an expected entry; revision 0 is the initial-values marker.
type want struct {
	key   string
	rev   uint64
	op    events.Op
	value string
}

func (w want) String() string {
	if w.rev == 0 {
		return "<marker>"
	}
	return fmt.Sprintf("%s@%d %v %q", w.key, w.rev, w.op, w.value)
}

var marker = want{}

func checkEntry(t *testing.T, kv events.KV, what string, got events.Entry, w want) {
	t.Helper()
	if w.rev == 0 {
		if !reflect.DeepEqual(got, events.Entry{}) {
			t.Fatalf("%s: got %s, want the zero Entry marking the end of initial values", what, show(got))
		}
		return
	}
	if got.Key != w.key || got.Revision != w.rev || got.Op != w.op || string(got.Value) != w.value {
		t.Fatalf("%s: got %s, want %v", what, show(got), w)
	}
	if got.Bucket != kv.Bucket() {
		t.Fatalf("%s: entry of bucket %q, want %q", what, got.Bucket, kv.Bucket())
	}
	checkServerTime(t, what, got.Time)
}

func (s suite) kvGetNotFound(t *testing.T) {
	kv := s.h.NewKV(t)
	if kv.Bucket() == "" {
		t.Fatal("Bucket() is empty")
	}
	getNotFound(t, kv, "pair.leader")
	put(t, kv, "pair.config", "cfg")
	getNotFound(t, kv, "pair.leader")
	getNotFound(t, kv, "pair")
}

func (s suite) kvCreate(t *testing.T) {
	kv := s.h.NewKV(t)
	rev, err := kv.Create(opCtx(t), "pair.leader", []byte("site-a"))
	if err != nil {
		t.Fatal(err)
	}
	if rev == 0 {
		t.Fatal("Create returned revision 0")
	}
	checkEntry(t, kv, "Get after Create", get(t, kv, "pair.leader"), want{"pair.leader", rev, events.OpPut, "site-a"})
}

func (s suite) kvCreateConflict(t *testing.T) {
	kv := s.h.NewKV(t)
	rev, err := kv.Create(opCtx(t), "pair.leader", []byte("site-a"))
	if err != nil {
		t.Fatal(err)
	}
	if r, err := kv.Create(opCtx(t), "pair.leader", []byte("site-b")); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("second Create = %d, %v; want ErrConflict", r, err)
	}
	checkEntry(t, kv, "Get after the refused Create", get(t, kv, "pair.leader"), want{"pair.leader", rev, events.OpPut, "site-a"})
}

func (s suite) kvUpdate(t *testing.T) {
	kv := s.h.NewKV(t)
	r1, err := kv.Create(opCtx(t), "pair.leader", []byte("a-1"))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := kv.Update(opCtx(t), "pair.leader", []byte("a-2"), r1)
	if err != nil {
		t.Fatalf("Update on the latest revision: %v", err)
	}
	if r2 <= r1 {
		t.Fatalf("Update returned revision %d after %d", r2, r1)
	}
	for _, stale := range []uint64{r1, 0, r2 + 1} {
		if r, err := kv.Update(opCtx(t), "pair.leader", []byte("b"), stale); !errors.Is(err, events.ErrConflict) {
			t.Fatalf("Update expecting revision %d (latest %d) = %d, %v; want ErrConflict", stale, r2, r, err)
		}
	}
	checkEntry(t, kv, "Get after refused updates", get(t, kv, "pair.leader"), want{"pair.leader", r2, events.OpPut, "a-2"})
	// Another key's writes do not move this key's revision.
	put(t, kv, "pair.hb.b", "beat")
	r3, err := kv.Update(opCtx(t), "pair.leader", []byte("a-3"), r2)
	if err != nil {
		t.Fatalf("Update after another key moved the bucket: %v", err)
	}
	checkEntry(t, kv, "Get", get(t, kv, "pair.leader"), want{"pair.leader", r3, events.OpPut, "a-3"})
}

func (s suite) kvUpdateAbsent(t *testing.T) {
	kv := s.h.NewKV(t)
	if r, err := kv.Update(opCtx(t), "pair.leader", []byte("x"), 3); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("Update of an absent key expecting revision 3 = %d, %v; want ErrConflict", r, err)
	}
	// Revision 0 is what an absent key is at.
	r, err := kv.Update(opCtx(t), "pair.leader", []byte("x"), 0)
	if err != nil {
		t.Fatalf("Update of an absent key expecting revision 0: %v", err)
	}
	checkEntry(t, kv, "Get", get(t, kv, "pair.leader"), want{"pair.leader", r, events.OpPut, "x"})
}

func (s suite) kvPut(t *testing.T) {
	kv := s.h.NewKV(t)
	r1 := put(t, kv, "pair.hb.a", "1")
	r2 := put(t, kv, "pair.hb.a", "2")
	if r2 <= r1 {
		t.Fatalf("Put returned revision %d after %d", r2, r1)
	}
	checkEntry(t, kv, "Get", get(t, kv, "pair.hb.a"), want{"pair.hb.a", r2, events.OpPut, "2"})
	r3 := put(t, kv, "pair.hb.a", "")
	checkEntry(t, kv, "Get of an empty value", get(t, kv, "pair.hb.a"), want{"pair.hb.a", r3, events.OpPut, ""})
}

func (s suite) kvDelete(t *testing.T) {
	kv := s.h.NewKV(t)
	r1 := put(t, kv, "pair.leader", "a")
	rd := del(t, kv, "pair.leader")
	if rd <= r1 {
		t.Fatalf("delete marker at revision %d after %d", rd, r1)
	}
	getNotFound(t, kv, "pair.leader")
	h := history(t, kv, "pair.leader")
	if len(h) != 2 {
		t.Fatalf("History after put and delete has %d entries, want 2", len(h))
	}
	checkEntry(t, kv, "history[0]", h[0], want{"pair.leader", r1, events.OpPut, "a"})
	checkEntry(t, kv, "history[1]", h[1], want{"pair.leader", rd, events.OpDelete, ""})
	// A deleted key can be created again.
	rc, err := kv.Create(opCtx(t), "pair.leader", []byte("b"))
	if err != nil {
		t.Fatalf("Create after Delete: %v", err)
	}
	checkEntry(t, kv, "Get after re-create", get(t, kv, "pair.leader"), want{"pair.leader", rc, events.OpPut, "b"})
	// And a delete marker's revision is what a CAS expects.
	rd2 := del(t, kv, "pair.leader")
	ru, err := kv.Update(opCtx(t), "pair.leader", []byte("c"), rd2)
	if err != nil {
		t.Fatalf("Update on the delete marker's revision: %v", err)
	}
	checkEntry(t, kv, "Get after update", get(t, kv, "pair.leader"), want{"pair.leader", ru, events.OpPut, "c"})
}

func (s suite) kvDeleteNeverWritten(t *testing.T) {
	kv := s.h.NewKV(t)
	rd := del(t, kv, "pair.ghost")
	getNotFound(t, kv, "pair.ghost")
	h := history(t, kv, "pair.ghost")
	if len(h) != 1 {
		t.Fatalf("History has %d entries, want the delete marker only", len(h))
	}
	checkEntry(t, kv, "delete marker", h[0], want{"pair.ghost", rd, events.OpDelete, ""})
	if _, err := kv.Create(opCtx(t), "pair.ghost", []byte("v")); err != nil {
		t.Fatalf("Create after Delete: %v", err)
	}
}

func (s suite) kvRevisions(t *testing.T) {
	kv := s.h.NewKV(t)
	var revs []uint64
	keys := []string{"pair.leader", "pair.hb.a", "pair.leader", "pair.config", "pair.hb.a"}
	for i, key := range keys {
		revs = append(revs, put(t, kv, key, fmt.Sprint(i)))
	}
	revs = append(revs, del(t, kv, "pair.config"))
	r, err := kv.Update(opCtx(t), "pair.leader", []byte("u"), revs[2])
	if err != nil {
		t.Fatal(err)
	}
	revs = append(revs, r)
	for i := range revs {
		if i > 0 && revs[i] <= revs[i-1] {
			t.Fatalf("revisions %v are not strictly increasing across the bucket", revs)
		}
	}
	for _, key := range []string{"pair.leader", "pair.hb.a", "pair.config"} {
		for _, e := range history(t, kv, key) {
			checkServerTime(t, show(e), e.Time)
		}
	}
	// Server times follow revisions.
	var prevTime time.Time
	for _, e := range history(t, kv, "pair.leader") {
		if e.Time.Before(prevTime) {
			t.Fatalf("%s at %v is before the previous revision at %v", show(e), e.Time, prevTime)
		}
		prevTime = e.Time
	}
}

func (s suite) kvHistory(t *testing.T) {
	kv := s.h.NewKV(t)
	if h, err := kv.History(opCtx(t), "pair.leader"); !errors.Is(err, events.ErrNotFound) {
		t.Fatalf("History of a key never written = %d entries, %v; want ErrNotFound", len(h), err)
	}
	var wants []want
	for i := range 4 {
		wants = append(wants, want{"pair.leader", put(t, kv, "pair.leader", fmt.Sprint("v", i)), events.OpPut, fmt.Sprint("v", i)})
		put(t, kv, "pair.hb.a", fmt.Sprint(i)) // interleaved writes to another key
	}
	h := history(t, kv, "pair.leader")
	if len(h) != len(wants) {
		t.Fatalf("History has %d entries, want %d", len(h), len(wants))
	}
	for i := range h {
		checkEntry(t, kv, fmt.Sprintf("history[%d]", i), h[i], wants[i])
	}
}

func (s suite) kvHistoryLimit(t *testing.T) {
	kv := s.h.NewKV(t)
	const writes = events.HistoryLimit + 6
	var revs []uint64
	for i := range writes {
		revs = append(revs, put(t, kv, "pair.hb.a", fmt.Sprint("beat-", i)))
		if i == events.HistoryLimit {
			if n := len(history(t, kv, "pair.hb.a")); n != events.HistoryLimit {
				t.Fatalf("History after %d writes has %d entries, want %d", i+1, n, events.HistoryLimit)
			}
		}
	}
	other := put(t, kv, "pair.config", "cfg")
	h := history(t, kv, "pair.hb.a")
	if len(h) != events.HistoryLimit {
		t.Fatalf("History after %d writes has %d entries, want %d", writes, len(h), events.HistoryLimit)
	}
	for i, e := range h {
		n := writes - events.HistoryLimit + i // the oldest writes were dropped
		checkEntry(t, kv, fmt.Sprintf("history[%d]", i), e, want{"pair.hb.a", revs[n], events.OpPut, fmt.Sprint("beat-", n)})
	}
	checkEntry(t, kv, "Get", get(t, kv, "pair.hb.a"), want{"pair.hb.a", revs[writes-1], events.OpPut, fmt.Sprint("beat-", writes-1)})
	checkEntry(t, kv, "another key", get(t, kv, "pair.config"), want{"pair.config", other, events.OpPut, "cfg"})
}

// watchSeed writes the bucket the watch subtests start from.
type watchSeed struct {
	cfg, l1, l2, other, hb, hbDel uint64
}

func seedWatch(t *testing.T, kv events.KV) watchSeed {
	t.Helper()
	var s watchSeed
	s.cfg = put(t, kv, "pair.config", "c1")
	s.l1 = put(t, kv, "pair.leader", "l1")
	s.l2 = put(t, kv, "pair.leader", "l2")
	s.other = put(t, kv, "other.leader", "o1")
	s.hb = put(t, kv, "pair.hb.a", "h1")
	s.hbDel = del(t, kv, "pair.hb.a")
	put(t, kv, "pair", "not matched by pair.> nor pair.*")
	return s
}

func watch(t *testing.T, kv events.KV, ctx context.Context, pattern string, opts events.WatchOptions) events.Watcher {
	t.Helper()
	w, err := kv.Watch(ctx, pattern, opts)
	if err != nil {
		t.Fatalf("Watch(%s, %+v): %v", pattern, opts, err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	return w
}

func nextEntry(t *testing.T, w events.Watcher, what string) events.Entry {
	t.Helper()
	select {
	case e, ok := <-w.Updates():
		if !ok {
			t.Fatalf("watch closed while waiting for %s", what)
		}
		return e
	case <-time.After(waitTimeout):
		t.Fatalf("watch delivered no %s within %v", what, waitTimeout)
	}
	panic("unreachable")
}

func expectEntries(t *testing.T, kv events.KV, w events.Watcher, wants ...want) {
	t.Helper()
	for i, wt := range wants {
		checkEntry(t, kv, fmt.Sprintf("watch entry %d", i), nextEntry(t, w, wt.String()), wt)
	}
}

func expectClosed(t *testing.T, w events.Watcher) {
	t.Helper()
	deadline := time.After(waitTimeout)
	for {
		select {
		case _, ok := <-w.Updates():
			if !ok {
				return
			}
		case <-deadline:
			t.Fatalf("watch channel still open %v after the watch ended", waitTimeout)
		}
	}
}

func (s suite) watchLatest(t *testing.T) {
	kv := s.h.NewKV(t)
	sd := seedWatch(t, kv)
	w := watch(t, kv, opCtx(t), "pair.>", events.WatchOptions{})
	expectEntries(t, kv, w,
		want{"pair.config", sd.cfg, events.OpPut, "c1"},
		want{"pair.leader", sd.l2, events.OpPut, "l2"},
		want{"pair.hb.a", sd.hbDel, events.OpDelete, ""},
		marker)
	put(t, kv, "other.leader", "o2") // not matched: must not show up
	l3 := put(t, kv, "pair.leader", "l3")
	cfgDel := del(t, kv, "pair.config")
	hb := put(t, kv, "pair.hb.a", "h2")
	expectEntries(t, kv, w,
		want{"pair.leader", l3, events.OpPut, "l3"},
		want{"pair.config", cfgDel, events.OpDelete, ""},
		want{"pair.hb.a", hb, events.OpPut, "h2"})
}

func (s suite) watchHistory(t *testing.T) {
	kv := s.h.NewKV(t)
	sd := seedWatch(t, kv)
	w := watch(t, kv, opCtx(t), "pair.>", events.WatchOptions{History: true})
	expectEntries(t, kv, w,
		want{"pair.config", sd.cfg, events.OpPut, "c1"},
		want{"pair.leader", sd.l1, events.OpPut, "l1"},
		want{"pair.leader", sd.l2, events.OpPut, "l2"},
		want{"pair.hb.a", sd.hb, events.OpPut, "h1"},
		want{"pair.hb.a", sd.hbDel, events.OpDelete, ""},
		marker)
	l3 := put(t, kv, "pair.leader", "l3")
	expectEntries(t, kv, w, want{"pair.leader", l3, events.OpPut, "l3"})
}

func (s suite) watchUpdatesOnly(t *testing.T) {
	kv := s.h.NewKV(t)
	seedWatch(t, kv)
	for _, history := range []bool{false, true} {
		w := watch(t, kv, opCtx(t), "pair.>", events.WatchOptions{UpdatesOnly: true, History: history})
		expectEntries(t, kv, w, marker)
		put(t, kv, "other.leader", "o2")
		l := put(t, kv, "pair.leader", fmt.Sprint("l-", history))
		expectEntries(t, kv, w, want{"pair.leader", l, events.OpPut, fmt.Sprint("l-", history)})
		if err := w.Stop(); err != nil {
			t.Fatal(err)
		}
	}
}

func (s suite) watchSingleKey(t *testing.T) {
	kv := s.h.NewKV(t)
	sd := seedWatch(t, kv)
	put(t, kv, "pair.leader.old", "not this key")
	w := watch(t, kv, opCtx(t), "pair.leader", events.WatchOptions{})
	expectEntries(t, kv, w, want{"pair.leader", sd.l2, events.OpPut, "l2"}, marker)
	put(t, kv, "pair.config", "c2")
	put(t, kv, "pair.leader.old", "still not this key")
	l3 := put(t, kv, "pair.leader", "l3")
	expectEntries(t, kv, w, want{"pair.leader", l3, events.OpPut, "l3"})
}

func (s suite) watchStar(t *testing.T) {
	kv := s.h.NewKV(t)
	sd := seedWatch(t, kv)
	w := watch(t, kv, opCtx(t), "pair.*", events.WatchOptions{})
	expectEntries(t, kv, w,
		want{"pair.config", sd.cfg, events.OpPut, "c1"},
		want{"pair.leader", sd.l2, events.OpPut, "l2"},
		marker)
	put(t, kv, "pair.hb.a", "two tokens deeper: not matched")
	c2 := put(t, kv, "pair.config", "c2")
	expectEntries(t, kv, w, want{"pair.config", c2, events.OpPut, "c2"})
}

func (s suite) watchEmpty(t *testing.T) {
	kv := s.h.NewKV(t)
	w := watch(t, kv, opCtx(t), "pair.>", events.WatchOptions{})
	expectEntries(t, kv, w, marker)
	r, err := kv.Create(opCtx(t), "pair.leader", []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	expectEntries(t, kv, w, want{"pair.leader", r, events.OpPut, "a"})
}

func (s suite) watchStop(t *testing.T) {
	kv := s.h.NewKV(t)
	sd := seedWatch(t, kv)
	w := watch(t, kv, opCtx(t), "pair.>", events.WatchOptions{})
	expectEntries(t, kv, w, want{"pair.config", sd.cfg, events.OpPut, "c1"})
	// Stop while entries are still undelivered.
	if err := w.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	expectClosed(t, w)
	if err := w.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	put(t, kv, "pair.leader", "after stop") // writing after Stop is harmless
}

func (s suite) watchContext(t *testing.T) {
	kv := s.h.NewKV(t)
	seedWatch(t, kv)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := watch(t, kv, ctx, "pair.>", events.WatchOptions{})
	nextEntry(t, w, "first initial value")
	cancel()
	expectClosed(t, w)
}

func (s suite) kvConcurrentCAS(t *testing.T) {
	kv := s.h.NewKV(t)
	base, err := kv.Create(opCtx(t), "pair.leader", []byte("base"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	revs := make([]uint64, racers)
	errs := make([]error, racers)
	start := make(chan struct{})
	for g := range racers {
		wg.Go(func() {
			<-start
			revs[g], errs[g] = kv.Update(opCtx(t), "pair.leader", fmt.Appendf(nil, "racer-%d", g), base)
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for g := range racers {
		switch {
		case errs[g] == nil && winner >= 0:
			t.Fatalf("racers %d and %d both won the compare-and-set on revision %d", winner, g, base)
		case errs[g] == nil:
			winner = g
		case !errors.Is(errs[g], events.ErrConflict):
			t.Fatalf("losing racer %d: %v, want ErrConflict", g, errs[g])
		}
	}
	if winner < 0 {
		t.Fatal("no racer won")
	}
	checkEntry(t, kv, "Get after the race", get(t, kv, "pair.leader"),
		want{"pair.leader", revs[winner], events.OpPut, fmt.Sprintf("racer-%d", winner)})
	if n := len(history(t, kv, "pair.leader")); n != 2 {
		t.Fatalf("History after the race has %d entries, want 2 (base and the winner)", n)
	}
}

// kvInvalidKey: a key breaking NATS key syntax is refused with ErrInvalid,
// and nothing is written.
func (s suite) kvInvalidKey(t *testing.T) {
	kv := s.h.NewKV(t)
	ctx := context.Background()
	for _, key := range []string{"bad key", "a..b", "", "a.*"} {
		if _, err := kv.Put(ctx, key, []byte("v")); !errors.Is(err, events.ErrInvalid) {
			t.Errorf("Put(%q) = %v, want ErrInvalid", key, err)
		}
	}
	if _, err := kv.Get(ctx, "bad key"); !errors.Is(err, events.ErrInvalid) {
		t.Errorf("Get(bad key) = %v, want ErrInvalid", err)
	}
}

// Batches (events.KVBatcher)

func (s suite) batcher(t *testing.T) events.KVBatcher {
	t.Helper()
	b, ok := s.h.NewKV(t).(events.KVBatcher)
	if !ok {
		t.Fatal("Harness.Batches is set but NewKV's bucket is no events.KVBatcher")
	}
	return b
}

// batchLands: an update, a first write and a put land together at
// consecutive revisions, in the order given.
func (s suite) batchLands(t *testing.T) {
	kv := s.batcher(t)
	r1 := put(t, kv, "a.leader", "a0")
	put(t, kv, "c.leader", "c0")
	revs, err := kv.WriteBatch(opCtx(t), []events.KVWrite{
		{Key: "a.leader", Value: []byte("a1"), Revision: r1},
		{Key: "b.leader", Value: []byte("b1")},
		{Key: "c.leader", Value: []byte("c1"), Put: true},
	})
	if err != nil {
		t.Fatalf("WriteBatch: %v", err)
	}
	if len(revs) != 3 || revs[1] != revs[0]+1 || revs[2] != revs[1]+1 || revs[0] <= r1 {
		t.Fatalf("WriteBatch revisions %v, want three consecutive ones after %d", revs, r1)
	}
	for i, k := range []string{"a.leader", "b.leader", "c.leader"} {
		checkEntry(t, kv, "Get after the batch", get(t, kv, k), want{k, revs[i], events.OpPut, string(rune('a'+i)) + "1"})
	}
}

// batchConflict: one stale expectation fails the whole batch with
// ErrConflict, and nothing of it is written.
func (s suite) batchConflict(t *testing.T) {
	kv := s.batcher(t)
	r1 := put(t, kv, "a.leader", "a0")
	r2 := put(t, kv, "b.leader", "b0")
	_, err := kv.WriteBatch(opCtx(t), []events.KVWrite{
		{Key: "a.leader", Value: []byte("a1"), Revision: r1},
		{Key: "b.leader", Value: []byte("b1"), Revision: r1}, // stale: b is at r2
		{Key: "c.leader", Value: []byte("c1"), Put: true},
	})
	if !errors.Is(err, events.ErrConflict) {
		t.Fatalf("WriteBatch with a stale expectation: %v, want ErrConflict", err)
	}
	checkEntry(t, kv, "a after the failed batch", get(t, kv, "a.leader"), want{"a.leader", r1, events.OpPut, "a0"})
	checkEntry(t, kv, "b after the failed batch", get(t, kv, "b.leader"), want{"b.leader", r2, events.OpPut, "b0"})
	getNotFound(t, kv, "c.leader")
	if next := put(t, kv, "d.leader", "d0"); next != r2+1 {
		t.Fatalf("the next write landed at revision %d, want %d: the failed batch took revisions", next, r2+1)
	}
}

// batchKeyTwice: a batch writing one key twice is refused before anything
// is written (the second write's expectation could not be checked).
func (s suite) batchKeyTwice(t *testing.T) {
	kv := s.batcher(t)
	r1 := put(t, kv, "a.leader", "a0")
	_, err := kv.WriteBatch(opCtx(t), []events.KVWrite{
		{Key: "a.leader", Value: []byte("a1"), Revision: r1},
		{Key: "a.leader", Value: []byte("a2"), Put: true},
	})
	if err == nil || errors.Is(err, events.ErrConflict) {
		t.Fatalf("WriteBatch writing a key twice: %v, want a refusal (not a conflict)", err)
	}
	if _, err := kv.WriteBatch(opCtx(t), nil); err == nil {
		t.Fatal("WriteBatch of no write: no error")
	}
	checkEntry(t, kv, "a after the refused batch", get(t, kv, "a.leader"), want{"a.leader", r1, events.OpPut, "a0"})
}

// batchWatched: a watch delivers every write of a batch, in order.
func (s suite) batchWatched(t *testing.T) {
	kv := s.batcher(t)
	w := watch(t, kv, opCtx(t), "*.leader", events.WatchOptions{UpdatesOnly: true})
	if e := nextEntry(t, w, "marker"); e.Revision != 0 {
		t.Fatalf("first delivery %s, want the marker", show(e))
	}
	writes := make([]events.KVWrite, 20)
	for i := range writes {
		writes[i] = events.KVWrite{Key: fmt.Sprintf("p%02d.leader", i), Value: []byte{byte(i)}}
	}
	revs, err := kv.WriteBatch(opCtx(t), writes)
	if err != nil {
		t.Fatalf("WriteBatch: %v", err)
	}
	for i := range writes {
		e := nextEntry(t, w, "batch write")
		if e.Key != writes[i].Key || e.Revision != revs[i] {
			t.Fatalf("delivery %d: %s, want %s@%d", i, show(e), writes[i].Key, revs[i])
		}
	}
}

// Batches (events.LogBatcher)

func (s suite) logBatcher(t *testing.T) events.LogBatcher {
	t.Helper()
	b, ok := s.newLog(t).(events.LogBatcher)
	if !ok {
		t.Fatal("Harness.Batches is set but NewLog's log is no events.LogBatcher")
	}
	if !b.Batches() {
		t.Fatal("Harness.Batches is set but NewLog's log says it takes no batches")
	}
	return b
}

// encoded is ev's envelope as the log's codec writes it.
func encoded(t *testing.T, log events.Log, e events.Event) []byte {
	t.Helper()
	data, err := log.Codec().Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// logBatchLands: an append with an expectation, one with a message id and
// headers, and a plain one land together at consecutive sequences, in the
// order given, each with what it carried.
func (s suite) logBatchLands(t *testing.T) {
	log := s.logBatcher(t)
	first := mustAppend(t, log, "ev.a", ev("a0"), events.AppendOptions{})
	acks, err := log.AppendBatch(opCtx(t), []events.LogAppend{
		{Subject: "ev.a", Data: encoded(t, log, ev("a1")), Opts: events.Expect(first.Sequence)},
		{Subject: "ev.b", Data: encoded(t, log, ev("b1")), Opts: events.AppendOptions{MsgID: "b-1", Headers: map[string]string{"Understudy-Test": "b"}}},
		{Subject: "ev.c", Data: encoded(t, log, ev("c1"))},
	})
	if err != nil {
		t.Fatalf("AppendBatch: %v", err)
	}
	if len(acks) != 3 || acks[0].Sequence != first.Sequence+1 || acks[1].Sequence != acks[0].Sequence+1 || acks[2].Sequence != acks[1].Sequence+1 {
		t.Fatalf("AppendBatch acks %+v, want three consecutive sequences after %d", acks, first.Sequence)
	}
	for _, a := range acks {
		if a.Duplicate {
			t.Fatalf("AppendBatch acks %+v: a fresh append acked as a duplicate", acks)
		}
	}
	recs := readAll(t, log, events.ReadOptions{FromSeq: acks[0].Sequence})
	wantSeqs(t, "records of the batch", recs, acks[0].Sequence, acks[1].Sequence, acks[2].Sequence)
	for i, subj := range []string{"ev.a", "ev.b", "ev.c"} {
		if recs[i].Subject != subj {
			t.Fatalf("record %d on %q, want %q", i, recs[i].Subject, subj)
		}
		got, err := log.Codec().DecodeRecord(recs[i])
		if err != nil {
			t.Fatal(err)
		}
		if id := got.(*created).ID; id != subj[len("ev."):]+"1" {
			t.Fatalf("record %d holds %q", i, id)
		}
	}
	if recs[1].Headers["Understudy-Test"] != "b" || recs[1].Headers["Nats-Msg-Id"] != "b-1" {
		t.Fatalf("record of the append with headers and an id: headers %v", recs[1].Headers)
	}
	if got := lastSeq(t, log, "ev.a"); got != acks[0].Sequence {
		t.Fatalf("LastSequence(ev.a) = %d after the batch, want %d", got, acks[0].Sequence)
	}
	// The id is stored: the same append alone is its duplicate.
	again, err := log.AppendRaw(opCtx(t), "ev.b", encoded(t, log, ev("b1")), events.AppendOptions{MsgID: "b-1"})
	if err != nil || !again.Duplicate || again.Sequence != acks[1].Sequence {
		t.Fatalf("the batch's append sent again alone: %+v, %v; want a duplicate of %d", again, err, acks[1].Sequence)
	}
}

// logBatchConflict: one stale expectation fails the whole batch with
// ErrConflict, and nothing of it is stored; alone, the other appends land.
func (s suite) logBatchConflict(t *testing.T) {
	log := s.logBatcher(t)
	a := mustAppend(t, log, "ev.a", ev("a0"), events.AppendOptions{})
	mustAppend(t, log, "ev.b", ev("b0"), events.AppendOptions{})
	_, err := log.AppendBatch(opCtx(t), []events.LogAppend{
		{Subject: "ev.a", Data: encoded(t, log, ev("a1")), Opts: events.AppendOptions{ExpectSet: true, ExpectLastSubjectSeq: a.Sequence, MsgID: "a-1"}},
		{Subject: "ev.b", Data: encoded(t, log, ev("b1")), Opts: events.Expect(a.Sequence)}, // stale: ev.b is past it
		{Subject: "ev.c", Data: encoded(t, log, ev("c1"))},
	})
	if !errors.Is(err, events.ErrConflict) {
		t.Fatalf("AppendBatch with a stale expectation: %v, want ErrConflict", err)
	}
	last := lastSeq(t, log, "ev.b")
	if got := lastSeq(t, log, "ev.c"); got != 0 {
		t.Fatalf("ev.c at %d after the refused batch, want nothing", got)
	}
	next := mustAppend(t, log, "ev.a", ev("a1"), events.AppendOptions{ExpectSet: true, ExpectLastSubjectSeq: a.Sequence, MsgID: "a-1"})
	if next.Duplicate || next.Sequence != last+1 {
		t.Fatalf("the refused batch's first append alone: %+v, want a fresh append at %d (the batch stored nothing, not even its id)", next, last+1)
	}
}

// logBatchDuplicate: an append whose message id the stream holds refuses
// the batch with ErrBatchDuplicate, and nothing of it is stored.
func (s suite) logBatchDuplicate(t *testing.T) {
	log := s.logBatcher(t)
	stored := mustAppend(t, log, "ev.a", ev("a0"), events.AppendOptions{MsgID: "a-0"})
	_, err := log.AppendBatch(opCtx(t), []events.LogAppend{
		{Subject: "ev.b", Data: encoded(t, log, ev("b1")), Opts: events.Expect(0)},
		{Subject: "ev.a", Data: encoded(t, log, ev("a0")), Opts: events.AppendOptions{MsgID: "a-0"}},
	})
	if !errors.Is(err, events.ErrBatchDuplicate) {
		t.Fatalf("AppendBatch holding a stored message id: %v, want ErrBatchDuplicate", err)
	}
	if got := lastSeq(t, log, "ev.b"); got != 0 {
		t.Fatalf("ev.b at %d after the refused batch, want nothing", got)
	}
	if got := lastSeq(t, log, "ev.a"); got != stored.Sequence {
		t.Fatalf("ev.a at %d after the refused batch, want %d", got, stored.Sequence)
	}
}

// logBatchSubjectTwice: a batch appending twice to one subject is refused
// before anything is stored (the second expectation could not be checked).
func (s suite) logBatchSubjectTwice(t *testing.T) {
	log := s.logBatcher(t)
	_, err := log.AppendBatch(opCtx(t), []events.LogAppend{
		{Subject: "ev.a", Data: encoded(t, log, ev("a1")), Opts: events.Expect(0)},
		{Subject: "ev.a", Data: encoded(t, log, ev("a2"))},
	})
	if err == nil || errors.Is(err, events.ErrConflict) {
		t.Fatalf("AppendBatch on one subject twice: %v, want a refusal (not a conflict)", err)
	}
	if _, err := log.AppendBatch(opCtx(t), nil); err == nil {
		t.Fatal("AppendBatch of no append: no error")
	}
	if got := lastSeq(t, log, "ev.a"); got != 0 {
		t.Fatalf("ev.a at %d after the refused batch, want nothing", got)
	}
}
