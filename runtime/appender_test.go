package runtime

import (
	"context"
	"errors"
	"log/slog"
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
