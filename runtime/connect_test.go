package runtime

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// Nothing listens at first; a server appears on the port after a few
// attempts; Connect must be connected to it soon after, having logged each
// failed attempt with a growing, capped delay.
func TestConnectRetriesUntilNATSAppears(t *testing.T) {
	log, rec := newLogRecorder(t)
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	retry := RetryConfig{Initial: 20 * time.Millisecond, Max: 80 * time.Millisecond}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type result struct {
		nc  *nats.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		nc, err := Connect(ctx, ConnectOptions{URL: url, Retry: retry, Name: "test"}, log)
		done <- result{nc, err}
	}()

	const attempts = 4
	retries := rec.waitFor(t, "nats not reachable, retrying", attempts, 10*time.Second)
	for i, l := range retries {
		if got := l.Attrs["attempt"].Int64(); got != int64(i+1) {
			t.Errorf("retry %d logged attempt=%d", i, got)
		}
		if got := l.Attrs["url"].String(); got != url {
			t.Errorf("retry %d logged url=%q, want %q", i, got, url)
		}
		if l.Attrs["error"].Any() == nil {
			t.Errorf("retry %d logged no error", i)
		}
		// Delay i is jittered in [d/2, d] with d = min(Initial*2^i, Max).
		d := min(retry.Initial<<i, retry.Max)
		if got := l.Attrs["next_delay"].Duration(); got < d/2 || got > d {
			t.Errorf("retry %d: next_delay %s outside [%s, %s]", i, got, d/2, d)
		}
	}
	select {
	case r := <-done:
		t.Fatalf("Connect returned before any server listened: %v, %v", r.nc, r.err)
	default:
	}

	e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir(), Host: "127.0.0.1", Port: port}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown()

	select {
	case r := <-done:
		if r.err != nil {
			t.Fatal(r.err)
		}
		defer r.nc.Close()
		if !r.nc.IsConnected() {
			t.Fatal("returned connection is not connected")
		}
		// The connection works.
		if err := r.nc.Publish("x", nil); err != nil {
			t.Fatal(err)
		}
		if err := r.nc.FlushTimeout(time.Second); err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not connected 5s after the server started")
	}
	connected := rec.waitFor(t, "nats connected", 1, time.Second)[0]
	if got := connected.Attrs["attempt"].Int64(); got <= attempts {
		t.Errorf("connected at attempt %d, want after the %d failed ones", got, attempts)
	}
}

func TestConnectGivesUpOnlyWhenCancelled(t *testing.T) {
	log, rec := newLogRecorder(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", freePort(t))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := Connect(ctx, ConnectOptions{URL: url, Retry: RetryConfig{Initial: 10 * time.Millisecond, Max: 10 * time.Millisecond}}, log)
		done <- err
	}()
	rec.waitFor(t, "nats not reachable, retrying", 5, 5*time.Second)
	select {
	case err := <-done:
		t.Fatalf("gave up before cancellation: %v", err)
	default:
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v does not wrap context.Canceled", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Connect still running 3s after cancellation")
	}
}

func TestConnectRedactsPasswordInLogs(t *testing.T) {
	log, rec := newLogRecorder(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url := fmt.Sprintf("nats://alice:s3cret@127.0.0.1:%d", freePort(t))
	go func() {
		_, _ = Connect(ctx, ConnectOptions{URL: url, Retry: RetryConfig{Initial: 10 * time.Millisecond, Max: 10 * time.Millisecond}}, log)
	}()
	l := rec.waitFor(t, "nats not reachable, retrying", 1, 5*time.Second)[0]
	if got := l.Attrs["url"].String(); got == url || !containsAll(got, "alice", "127.0.0.1") || containsAll(got, "s3cret") {
		t.Fatalf("logged url %q: want the password redacted", got)
	}
}

func TestJitterStaysInBounds(t *testing.T) {
	for _, d := range []time.Duration{1, 2, 3, time.Millisecond, 30 * time.Second} {
		for range 1000 {
			if j := jitter(d); j < d/2 || j > d {
				t.Fatalf("jitter(%s) = %s, outside [%s, %s]", d, j, d/2, d)
			}
		}
	}
}
