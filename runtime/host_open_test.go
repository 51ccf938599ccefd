package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// StartHost waits for assets that do not answer yet (a restarted node's
// server electing leaders), and fails at once for assets that do not exist.
func TestRetryOpen(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	calls := 0
	err := retryOpen(context.Background(), logger, func() error {
		calls++
		if calls < 3 {
			return fmt.Errorf("events: look up stream %q: %w", "UNDERSTUDY_EVENTS", context.DeadlineExceeded)
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("retryOpen: %v after %d calls; want success at the third", err, calls)
	}
	calls = 0
	err = retryOpen(context.Background(), logger, func() error {
		calls++
		return fmt.Errorf("events: stream %q does not exist: %w", "UNDERSTUDY_EVENTS", jetstream.ErrStreamNotFound)
	})
	if !errors.Is(err, jetstream.ErrStreamNotFound) || calls != 1 {
		t.Fatalf("retryOpen of a missing stream: %v after %d calls; want the error at once", err, calls)
	}
}
