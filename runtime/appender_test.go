package runtime

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

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
			return events.Ack{Sequence: o.ExpectLastSubjectSeq + 41, Duplicate: true}, nil
		},
		func(o events.AppendOptions) (events.Ack, error) {
			return events.Ack{Sequence: o.ExpectLastSubjectSeq + 3}, nil
		},
	}
	app := newAppender(log, subject, slog.New(slog.DiscardHandler))
	app.setLast(7)
	conflict := make(chan error, 1)
	appended := make(chan events.Ack, 2)
	app.onConflict = func(err error) { conflict <- err }
	app.onAppended = func(_ events.Event, ack events.Ack) { appended <- ack }
	app.start()
	defer app.stop()
	app.add(&failover.HeartbeatRecovered{Term: 1, AfterFailures: 1}, &failover.HeartbeatRecovered{Term: 1, AfterFailures: 2})
	for i := 0; i < 2; i++ {
		select {
		case err := <-conflict:
			t.Fatalf("conflict: %v", err)
		case ack := <-appended:
			if i == 0 && (ack.Sequence != 48 || !ack.Duplicate) {
				t.Fatalf("first ack %+v, want the duplicate at 48", ack)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the appender did not carry on")
		}
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	if n := len(log.sent); n != 3 || log.sent[0].MsgID != log.sent[1].MsgID || log.sent[2].ExpectLastSubjectSeq != 48 {
		t.Fatalf("appends %+v: want a retry with the same message id, then an append expecting 48", log.sent)
	}
}
