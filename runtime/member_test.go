package runtime

import (
	"fmt"
	"log/slog"
	"testing"

	"understudy/actors/failover"
	"understudy/events"
)

// An acquire that fails again for the same reason is logged at debug:
// a takeover of thousands of pairs on a slow store retries each every
// heartbeat. The first failure of a run and one for a new reason are
// warned of, and the outcome that ends the run carries the count.
func TestRepeatedAcquireFailuresAreLoggedOnce(t *testing.T) {
	a := &memberActor{}
	timeout := &failover.AcquireFailed{Term: 2, Cause: "timeout: no answer within heartbeat_timeout"}
	batch := func(n int) *failover.AcquireFailed { // details that change every time
		return &failover.AcquireFailed{Term: 2, Cause: fmt.Sprintf("unavailable: events: batch of %d in bucket \"b\": nats: timeout", n)}
	}
	later := &failover.AcquireFailed{Term: 3, Cause: timeout.Cause}
	for i, step := range []struct {
		ev     events.Event
		lvl    slog.Level
		failed int
	}{
		{timeout, slog.LevelWarn, 0},
		{timeout, slog.LevelDebug, 0},
		{timeout, slog.LevelDebug, 0},
		{batch(229), slog.LevelWarn, 0},
		{batch(17), slog.LevelDebug, 0},
		{&failover.Promoted{Term: 2}, slog.LevelInfo, 5},
		{timeout, slog.LevelWarn, 0},
		{&failover.PromotionRejected{Term: 3}, slog.LevelWarn, 1},
		{&failover.ServingStarted{}, slog.LevelInfo, 0},
		{timeout, slog.LevelWarn, 0},
		{later, slog.LevelWarn, 0}, // another outage: a new term, warned of again
		{later, slog.LevelDebug, 0},
	} {
		lvl, failed := a.logLevel(step.ev)
		if lvl != step.lvl || failed != step.failed {
			t.Errorf("step %d (%s): level %s, %d failed attempts; want %s, %d", i, step.ev.EventType(), lvl, failed, step.lvl, step.failed)
		}
	}
}
