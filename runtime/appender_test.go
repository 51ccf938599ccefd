package runtime

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"understudy/actors/failover"
	"understudy/events"
)

// Two processes appending to one actor's subject from the same position
// (a zombie and its successor): the second must see a conflict, never a
// "duplicate" that it would take for its own append.
func TestAppenderTwinSeesConflict(t *testing.T) {
	f := startFailoverNATS(t)
	subject := failover.Subject("twin", "site-a")
	logger := slog.New(slog.DiscardHandler)

	appended := make(chan events.Ack, 4)
	first := newAppender(f.evlog, subject, logger)
	first.setLast(0)
	first.onAppended = func(_ events.Event, ack events.Ack) { appended <- ack }
	first.start()
	defer first.stop()
	first.add(&failover.HeartbeatRecovered{Term: 1, AfterFailures: 1})
	select {
	case ack := <-appended:
		if ack.Sequence == 0 || ack.Duplicate {
			t.Fatalf("first append: %+v", ack)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("first appender did not append")
	}

	conflict := make(chan error, 1)
	twinAppended := make(chan events.Ack, 1)
	twin := newAppender(f.evlog, subject, logger)
	twin.setLast(0) // it believes the subject is still empty
	twin.onConflict = func(err error) { conflict <- err }
	twin.onAppended = func(_ events.Event, ack events.Ack) { twinAppended <- ack }
	twin.start()
	defer twin.stop()
	twin.add(&failover.HeartbeatRecovered{Term: 7, AfterFailures: 7})
	select {
	case err := <-conflict:
		if !errors.Is(err, events.ErrConflict) {
			t.Fatalf("conflict error %v is not ErrConflict", err)
		}
	case ack := <-twinAppended:
		t.Fatalf("the twin took %+v for its own append", ack)
	case <-time.After(10 * time.Second):
		t.Fatal("the twin neither conflicted nor appended")
	}

	// The subject holds the first writer's event only.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n := 0
	for rec, err := range f.evlog.Read(ctx, events.ReadOptions{Subject: subject}) {
		if err != nil {
			t.Fatal(err)
		}
		n++
		ev, err := Codec().DecodeRecord(rec)
		if e, ok := ev.(*failover.HeartbeatRecovered); err != nil || !ok || e.Term != 1 {
			t.Errorf("record %d: %#v %v", rec.Sequence, ev, err)
		}
	}
	if n != 1 {
		t.Fatalf("subject holds %d events, want 1", n)
	}
}

// scriptedLog answers the appender's appends from a script, then stores
// them in a MemoryLog.
type scriptedLog struct {
	events.Log
	mu     sync.Mutex
	script []func(opts events.AppendOptions) (events.Ack, error)
	sent   []events.AppendOptions
}

func (l *scriptedLog) Append(ctx context.Context, subject string, ev events.Event, opts events.AppendOptions) (events.Ack, error) {
	l.mu.Lock()
	l.sent = append(l.sent, opts)
	var step func(events.AppendOptions) (events.Ack, error)
	if len(l.script) > 0 {
		step, l.script = l.script[0], l.script[1:]
	}
	l.mu.Unlock()
	if step != nil {
		return step(opts)
	}
	return l.Log.Append(ctx, subject, ev, opts)
}

// What real partitions showed: the appender's first attempt, buffered by
// the NATS client while disconnected, lands at the heal; the retry gets the
// duplicate ack at the first attempt's stream sequence, which other
// subjects have moved past last+1. And a stream leader cut off from its
// quorum answers 10164 while the first attempt is still being proposed.
// Neither is another writer: the appender retries and carries on.
func TestAppenderOwnDuplicateAndInFlightAreNotConflicts(t *testing.T) {
	mem := events.NewMemoryLog("EV", nil, Codec())
	subject := failover.Subject("dup", "site-a")
	log := &scriptedLog{Log: mem}
	log.script = []func(events.AppendOptions) (events.Ack, error){
		func(events.AppendOptions) (events.Ack, error) {
			return events.Ack{}, events.APIError(10164, "last sequence by subject mismatch")
		},
		func(o events.AppendOptions) (events.Ack, error) {
			// The first attempt landed after 40 records of other subjects.
			for i := 0; i < 40; i++ {
				if _, err := mem.Append(context.Background(), failover.Subject("other", "site-b"), &failover.HeartbeatRecovered{Term: 9}, events.AppendOptions{}); err != nil {
					return events.Ack{}, err
				}
			}
			first, err := mem.Append(context.Background(), subject, &failover.HeartbeatRecovered{Term: 1, AfterFailures: 1}, events.AppendOptions{MsgID: o.MsgID})
			return events.Ack{Sequence: first.Sequence, Duplicate: true}, err
		},
		func(o events.AppendOptions) (events.Ack, error) {
			return events.Ack{Sequence: o.ExpectLastSubjectSeq + 3}, nil
		},
	}
	app := newAppender(log, subject, slog.New(slog.DiscardHandler))
	app.setLast(7)
	conflict, appended := startAppender(t, app)
	app.add(&failover.HeartbeatRecovered{Term: 1, AfterFailures: 1}, &failover.HeartbeatRecovered{Term: 1, AfterFailures: 2})
	for i := 0; i < 2; i++ {
		select {
		case err := <-conflict:
			t.Fatalf("conflict: %v", err)
		case ack := <-appended:
			if i == 0 && (ack.Sequence != 41 || !ack.Duplicate) {
				t.Fatalf("first ack %+v, want the duplicate at 41", ack)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the appender did not carry on")
		}
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	if n := len(log.sent); n != 3 || log.sent[0].MsgID != log.sent[1].MsgID || log.sent[2].ExpectLastSubjectSeq != 41 {
		t.Fatalf("appends %+v: want a retry with the same message id, then an append expecting 41", log.sent)
	}
}

// eventPart is the random part an appender's message id ends with:
// subject@pos/nonce/event.
func eventPart(t *testing.T, a *appender, msgID string) string {
	t.Helper()
	prefix, event, ok := strings.Cut(msgID, "/"+a.nonce+"/")
	if !ok || !strings.HasPrefix(prefix, a.subject+"@") || len(event) != 16 || strings.Trim(event, "0123456789abcdef") != "" {
		t.Fatalf("message id %q is not %s@<pos>/%s/<16 hex digits>", msgID, a.subject, a.nonce)
	}
	return event
}

// An event's message id has a random part of its own, drawn once: its
// retries deduplicate against its earlier attempts, while nobody can tell
// the id of the next event from the records of the last. A duplicate ack
// naming no record of this appender is no append: the event is appended
// again under a new id.
func TestAppenderEventIDs(t *testing.T) {
	mem := events.NewMemoryLog("EV", nil, Codec())
	subject := failover.Subject("ids", "site-a")
	log := &scriptedLog{Log: mem}
	log.script = []func(events.AppendOptions) (events.Ack, error){
		func(events.AppendOptions) (events.Ack, error) {
			return events.Ack{}, events.APIError(10164, "last sequence by subject mismatch")
		},
		func(events.AppendOptions) (events.Ack, error) {
			return events.Ack{Sequence: 999, Duplicate: true}, nil // no record there
		},
	}
	logger, logs := newLogRecorder(t)
	app := newAppender(log, subject, logger)
	app.setLast(0)
	conflict, appended := startAppender(t, app)
	app.add(&failover.HeartbeatRecovered{Term: 1, AfterFailures: 1}, &failover.HeartbeatRecovered{Term: 1, AfterFailures: 2})
	for i := 0; i < 2; i++ {
		select {
		case err := <-conflict:
			t.Fatalf("conflict: %v", err)
		case ack := <-appended:
			if ack.Duplicate || ack.Sequence != uint64(i+1) {
				t.Fatalf("ack %d: %+v, want sequence %d stored", i, ack, i+1)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the appender did not carry on")
		}
	}
	log.mu.Lock()
	sent := append([]events.AppendOptions(nil), log.sent...)
	log.mu.Unlock()
	if len(sent) != 4 {
		t.Fatalf("appends %+v: want 4", sent)
	}
	ids := make([]string, len(sent))
	for i, o := range sent {
		ids[i] = eventPart(t, app, o.MsgID)
	}
	if sent[0].MsgID != sent[1].MsgID {
		t.Errorf("the retry of an append that was not decided changed its id: %s, then %s", sent[0].MsgID, sent[1].MsgID)
	}
	if ids[2] == ids[1] || sent[2].ExpectLastSubjectSeq != 0 {
		t.Errorf("after a duplicate ack naming no record of its own, the event was appended again as %+v; want a new id at the same position", sent[2])
	}
	if ids[3] == ids[2] {
		t.Errorf("two events share the random part %s of their ids", ids[3])
	}
	if n := len(logs.matching("the record a duplicate ack named is gone; the event was not stored and is appended again under a new id")); n != 1 {
		t.Errorf("%d reports of the duplicate ack naming no record, want 1", n)
	}
	for i, o := range sent[2:] {
		recs := 0
		for rec, err := range mem.Read(context.Background(), events.ReadOptions{Subject: subject, FromSeq: uint64(i + 1)}) {
			if err != nil {
				t.Fatal(err)
			}
			if rec.Headers["Nats-Msg-Id"] != o.MsgID {
				t.Errorf("record %d has message id %q, want %q", rec.Sequence, rec.Headers["Nats-Msg-Id"], o.MsgID)
			}
			recs++
			break
		}
		if recs == 0 {
			t.Errorf("no record of event %d", i)
		}
	}
}

// Whoever may publish on a subject of the events stream of its own (in a
// secured deployment: another node, on its own ev.failover.<pair>.<site>)
// and has read an appender's records could store, on its own subject, a
// message under the id the appender uses next: JetStream deduplicates ids
// across the whole stream, and the server answers the appender's append
// "duplicate" without storing it. The random part of each id keeps it
// from guessing the id; should an id be taken all the same (here a known
// one is injected), the appender reads the record the ack names, sees it
// is not its own and appends the event again under a new id: the event is
// stored, and the appender neither loses it nor stops.
func TestAppenderIDTakenOnAnotherSubject(t *testing.T) {
	f := startFailoverNATS(t)
	subject := failover.Subject("victim", "site-a")
	other := failover.Subject("victim", "site-b")
	logger, logs := newLogRecorder(t)
	app := newAppender(f.evlog, subject, logger)
	app.setLast(0)
	const known = "0123456789abcdef"
	drawn := 0 // the run goroutine's only
	app.eventID = func() string {
		if drawn++; drawn == 1 {
			return known
		}
		return randomHex()
	}

	// The other identity, on a connection of its own, takes the id of the
	// victim's next append.
	taken := events.AppenderMsgID(subject, 1, app.nonce, known)
	js, err := jetstream.New(connectTo(t, f.server.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pa, err := js.Publish(ctx, other, []byte("not an event"), jetstream.WithMsgID(taken))
	if err != nil || pa.Duplicate {
		t.Fatalf("publish on %s under %s: %+v %v", other, taken, pa, err)
	}
	// What the server answers the victim's append under that id.
	if ack, err := f.evlog.Append(ctx, subject, &failover.HeartbeatRecovered{Term: 1}, events.AppendOptions{MsgID: taken, ExpectSet: true}); err != nil || !ack.Duplicate || ack.Sequence != pa.Sequence {
		t.Fatalf("append under the taken id: %+v %v; want a duplicate ack naming sequence %d", ack, err, pa.Sequence)
	}

	conflict, appended := startAppender(t, app)
	sent := []*failover.HeartbeatRecovered{{Term: 3, AfterFailures: 1}, {Term: 3, AfterFailures: 2}}
	app.add(sent[0], sent[1])
	for i := range sent {
		select {
		case err := <-conflict:
			t.Fatalf("the appender stopped on a conflict: %v", err)
		case ack := <-appended:
			if ack.Duplicate || ack.Sequence <= pa.Sequence {
				t.Fatalf("ack %d: %+v; want a record stored after the taken id's sequence %d", i, ack, pa.Sequence)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("event %d was not appended", i)
		}
	}

	var got []events.Record
	for rec, err := range f.evlog.Read(ctx, events.ReadOptions{Subject: subject}) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, rec)
	}
	if len(got) != len(sent) {
		t.Fatalf("%s holds %d records, want %d", subject, len(got), len(sent))
	}
	for i, rec := range got {
		ev, err := Codec().DecodeRecord(rec)
		if e, ok := ev.(*failover.HeartbeatRecovered); err != nil || !ok || *e != *sent[i] {
			t.Errorf("record %d: %#v %v, want %#v", rec.Sequence, ev, err, sent[i])
		}
		if id := rec.Headers["Nats-Msg-Id"]; id == taken {
			t.Errorf("record %d is stored under the taken id %s", rec.Sequence, id)
		}
		if nonce, ok := events.AppendedBy(rec); !ok || nonce != app.nonce {
			t.Errorf("record %d: appended by %q %v, want the appender's nonce %s", rec.Sequence, nonce, ok, app.nonce)
		}
	}
	reports := logs.matching("a message on another subject carried this appender's message id; its event was not stored and is appended again under a new id")
	if len(reports) != 1 {
		t.Fatalf("%d reports of the taken id, want 1", len(reports))
	}
	if s := reports[0].Attrs["other_subject"].String(); s != other {
		t.Errorf("report names subject %q, want %q", s, other)
	}
	if n := len(logs.matching("event append failed, retrying")); n != 0 {
		t.Errorf("%d more warnings of failed appends, want none", n)
	}
}

// readFailingLog fails the first reads by sequence (RecordOn) it is asked
// for: the store is too slow to serve them in time.
type readFailingLog struct {
	*scriptedLog
	fail atomic.Int64
}

func (l *readFailingLog) RecordOn(ctx context.Context, subject string, from uint64) (events.Record, error) {
	if l.fail.Add(-1) >= 0 {
		return events.Record{}, context.DeadlineExceeded
	}
	return l.scriptedLog.RecordOn(ctx, subject, from)
}

// What a 10,000-pair node death did to the store: an attempt landed but
// its answer never came (timeout); the retry met the subject moved (the
// client could not recognise its own record in time, so it answers a
// conflict, not a duplicate); and reading the subject's records failed at
// first. The appender must neither stop its member (no twin was seen) nor
// take its own record for a foreign one and append the event twice: it
// retries the read and finds its own attempt stored.
func TestAppenderOwnRecordAfterAmbiguousConflict(t *testing.T) {
	mem := events.NewMemoryLog("EV", nil, Codec())
	subject := failover.Subject("ambiguous", "site-a")
	sl := &scriptedLog{Log: mem}
	sl.script = []func(events.AppendOptions) (events.Ack, error){
		func(o events.AppendOptions) (events.Ack, error) {
			if _, err := mem.Append(context.Background(), subject, &failover.HeartbeatRecovered{Term: 1, AfterFailures: 1}, o); err != nil {
				return events.Ack{}, err
			}
			return events.Ack{}, context.DeadlineExceeded // stored; the answer lost
		},
	}
	for range 3 { // every retry meets the conflict
		sl.script = append(sl.script, func(events.AppendOptions) (events.Ack, error) {
			return events.Ack{}, events.APIError(10071, "wrong last sequence: 1")
		})
	}
	log := &readFailingLog{scriptedLog: sl}
	log.fail.Store(2)
	logger, rec := newLogRecorder(t)
	app := newAppender(log, subject, logger)
	app.setLast(0)
	conflict, appended := startAppender(t, app)
	app.add(&failover.HeartbeatRecovered{Term: 1, AfterFailures: 1}, &failover.HeartbeatRecovered{Term: 1, AfterFailures: 2})
	var acks []events.Ack
	for len(acks) < 2 {
		select {
		case err := <-conflict:
			t.Fatalf("the member was stopped for a conflict: %v", err)
		case ack := <-appended:
			acks = append(acks, ack)
		case <-time.After(20 * time.Second):
			t.Fatalf("the appender did not carry on (acks %+v)", acks)
		}
	}
	if acks[0].Sequence != 1 || acks[1].Sequence != 2 {
		t.Errorf("acks %+v: want the first event at 1 (its landed attempt), the second at 2", acks)
	}
	if f := rec.matching("foreign record on an actor's subject: skipped, never folded into its state"); len(f) != 0 {
		t.Errorf("its own record reported as foreign: %+v", f)
	}
	if n := len(rec.matching("event append conflict not resolved: the subject's records could not be read; retrying")); n != 2 {
		t.Errorf("unresolved conflict reported %d times, want 2 (one per failed read)", n)
	}
	n := 0
	for r, err := range mem.Read(context.Background(), events.ReadOptions{Subject: subject}) {
		if err != nil {
			t.Fatal(err)
		}
		n++
		if _, ok := events.AppendedBy(r); !ok {
			t.Errorf("record %d not an appender's", r.Sequence)
		}
	}
	if n != 2 {
		t.Errorf("subject holds %d records, want 2 (each event once)", n)
	}
}

// startAppender starts app with its conflicts and appends reported on the
// channels it returns; the test's cleanup stops it.
func startAppender(t *testing.T, app *appender) (conflict chan error, appended chan events.Ack) {
	conflict, appended = make(chan error, 1), make(chan events.Ack, 2)
	app.onConflict = func(err error) { conflict <- err }
	app.onAppended = func(_ events.Event, ack events.Ack) { appended <- ack }
	app.start()
	t.Cleanup(app.stop)
	return conflict, appended
}
