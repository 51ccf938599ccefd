package runtime

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

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

// A member's KV write is issued until half its window before its
// deadline, and at most half a heartbeat_timeout before it: a node's
// acquire, waiting two heartbeat_timeouts, is still issued 1.5 s after it
// was asked for (in a 10,000-pair takeover those still waiting after the
// first second were dropped while the store had turns for them).
func TestIssueMargin(t *testing.T) {
	for _, tc := range []struct{ window, heartbeat, want time.Duration }{
		{time.Second, time.Second, 500 * time.Millisecond},
		{2 * time.Second, time.Second, 500 * time.Millisecond},
		{400 * time.Millisecond, time.Second, 200 * time.Millisecond},
		{4 * time.Second, 3 * time.Second, 1500 * time.Millisecond},
	} {
		if got := issueMargin(tc.window, tc.heartbeat); got != tc.want {
			t.Errorf("issueMargin(%v, %v) = %v, want %v", tc.window, tc.heartbeat, got, tc.want)
		}
	}
}
