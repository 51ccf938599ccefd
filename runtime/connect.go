package runtime

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// ConnectOptions describe a client connection to NATS.
type ConnectOptions struct {
	// URL is one or more comma-separated server URLs.
	URL string
	// User and Password, or Creds (a .creds file), authenticate; all optional.
	User     string
	Password string
	Creds    string
	// TLS, when not nil, is used for the connection (and required of the server).
	// It is kept, not copied.
	TLS *tls.Config
	// Retry paces the attempts while no server answers; its zero value
	// means DefaultRetryInitial and DefaultRetryMax.
	Retry RetryConfig
	// Name identifies the connection in the server's monitoring.
	Name string
}

// Connect opens a connection to NATS, retrying until it succeeds or ctx is
// done; a NATS that is not up yet is normal at boot, not a reason to exit.
// Each failed attempt logs one warning "nats not reachable, retrying" with
// the url, the attempt number, the delay before the next attempt and the
// error. Delays grow exponentially from Retry.Initial to Retry.Max and are
// jittered (uniform in [d/2, d]) so that a fleet restarting together does
// not retry in lockstep. When ctx is done, Connect returns an error wrapping
// ctx's error.
//
// Once connected, the client reconnects by itself forever (nats.go's
// reconnect logic); disconnections and reconnections are logged.
func Connect(ctx context.Context, o ConnectOptions, log *slog.Logger) (*nats.Conn, error) {
	retry := o.Retry
	if retry.Initial <= 0 {
		retry.Initial = DefaultRetryInitial
	}
	if retry.Max < retry.Initial {
		retry.Max = max(DefaultRetryMax, retry.Initial)
	}
	url := redactURLs(o.URL)
	log = log.With("component", "nats-client")
	dialer := &ctxDialer{ctx: ctx, d: net.Dialer{Timeout: 2 * time.Second}}
	opts := []nats.Option{
		nats.Name(o.Name),
		nats.SetCustomDialer(dialer),
		nats.Timeout(2 * time.Second),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(retry.Initial),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "error", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			log.Warn("nats asynchronous error", "subject", subject, "error", err)
		}),
	}
	if o.User != "" {
		opts = append(opts, nats.UserInfo(o.User, o.Password))
	}
	if o.Creds != "" {
		opts = append(opts, nats.UserCredentials(o.Creds))
	}
	if o.TLS != nil {
		opts = append(opts, nats.Secure(o.TLS))
	}

	delay := retry.Initial
	for attempt := 1; ; attempt++ {
		nc, err := nats.Connect(o.URL, opts...)
		if err == nil {
			dialer.detached.Store(true)
			log.Info("nats connected", "url", nc.ConnectedUrlRedacted(), "server", nc.ConnectedServerName(), "attempt", attempt)
			return nc, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("runtime: connecting to nats %s: %w", url, ctx.Err())
		}
		next := jitter(delay)
		log.Warn("nats not reachable, retrying", "url", url, "attempt", attempt, "next_delay", next, "error", err)
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("runtime: connecting to nats %s (gave up after %d attempts): %w", url, attempt, ctx.Err())
		case <-t.C:
		}
		delay = min(2*delay, retry.Max)
	}
}

// jitter picks a delay uniformly in [d/2, d].
func jitter(d time.Duration) time.Duration {
	half := d / 2
	return half + rand.N(d-half+1)
}

// ctxDialer makes the initial connection attempts end when ctx does, so a
// shutdown while NATS is unreachable does not wait for a dial timeout.
// Once connected it is detached: later reconnections outlive Connect's ctx.
type ctxDialer struct {
	ctx      context.Context
	d        net.Dialer
	detached atomic.Bool
}

func (c *ctxDialer) Dial(network, address string) (net.Conn, error) {
	if c.detached.Load() {
		return c.d.Dial(network, address)
	}
	return c.d.DialContext(c.ctx, network, address)
}
