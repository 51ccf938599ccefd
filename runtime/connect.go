package runtime

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"strings"
	"sync"
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
	// NKey is a file holding a user nkey seed (nats.nkey): the client
	// answers the server's challenge with it. Excludes User and Creds.
	// The seed is read at each (re)connection, never kept in memory.
	NKey string
	// TLS, when not nil, is used for the connection (and required of the server).
	// It is kept, not copied.
	TLS *tls.Config
	// Retry paces the attempts while no server answers; its zero value
	// means DefaultRetryInitial and DefaultRetryMax.
	Retry RetryConfig
	// Name identifies the connection in the server's monitoring.
	Name string
	// DeadAfter bounds how long a connection whose server stopped
	// answering (a partition, not a closed socket) goes unnoticed: the
	// client pings every DeadAfter/(MaxPingsOutstanding+1) and gives the
	// server up once DeadAfter has passed with no pong and no message
	// received, then moves to the next server of URL — unless the server
	// answers a new connection meanwhile (busy, not cut off: kept up to
	// maxBusyFor DeadAfters; see deadWatch).
	// Serve sets it to the smallest heartbeat_timeout of the node's
	// pairs; zero means DefaultDeadAfter.
	DeadAfter time.Duration
	// HomeProbe is how often, while connected to any server but the first
	// of URL (the node's own site's), the client checks whether the first
	// one answers again, to move back to it. Zero means DefaultHomeProbe;
	// negative turns the return off. Unused with a single URL.
	HomeProbe time.Duration
}

// Dead-connection detection and the return to the first server.
const (
	// DefaultDeadAfter is ConnectOptions.DeadAfter of a node with no pairs.
	DefaultDeadAfter = 2 * time.Second
	// MaxPingsOutstanding: DeadAfter is MaxPingsOutstanding+1 ping
	// intervals, so that one pong delayed by a busy link is no reason to
	// leave a server.
	MaxPingsOutstanding = 2
	// DefaultHomeProbe paces the checks of the first server while away.
	DefaultHomeProbe = 5 * time.Second
	// homeProbesNeeded consecutive answers of the first server bring the
	// client back: one answer after a partition may be a flap.
	homeProbesNeeded = 2
	minPingInterval  = 10 * time.Millisecond
)

// pingInterval is the client ping period that detects a dead server within
// deadAfter (see ConnectOptions.DeadAfter).
func pingInterval(deadAfter time.Duration) time.Duration {
	return max(deadAfter/(MaxPingsOutstanding+1), minPingInterval)
}

// dialTimeoutFor bounds a dial (TCP, TLS and the NATS handshake): a server
// that does not answer within the detection time is not worth more, but
// a cross-site TLS handshake needs some room.
func dialTimeoutFor(deadAfter time.Duration) time.Duration {
	return min(max(deadAfter, 500*time.Millisecond), 2*time.Second)
}

// jetStreamTimeout is the timeout of JetStream API calls made without a
// deadline of their own (jetstream.WithDefaultTimeout; nats.go's default is
// 5 s): twice the detection time, within [1s, 5s]. The member's writes
// carry their own deadline (heartbeat_timeout) and are not affected.
func jetStreamTimeout(deadAfter time.Duration) time.Duration {
	return min(max(2*deadAfter, time.Second), 5*time.Second)
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
// reconnect logic); disconnections and reconnections are logged. The
// servers of URL are tried in the order given (never shuffled): list the
// node's own site's server first. A server that stops answering is given
// up within DeadAfter (a server that answers a new connection meanwhile
// is busy, and kept up to maxBusyFor DeadAfters), logged as "nats server
// not answering, moving to the next server", and the client moves to
// the next server of the list;
// while it is away from the first one, it checks every HomeProbe whether
// that one answers again and then moves back (see HomeProbe).
//
// Publishes made while reconnecting fail at once instead of being
// buffered and sent after the reconnection: a heartbeat write its member
// already gave up must not land seconds later.
func Connect(ctx context.Context, o ConnectOptions, log *slog.Logger) (*nats.Conn, error) {
	retry := o.Retry
	if retry.Initial <= 0 {
		retry.Initial = DefaultRetryInitial
	}
	if retry.Max < retry.Initial {
		retry.Max = max(DefaultRetryMax, retry.Initial)
	}
	deadAfter := o.DeadAfter
	if deadAfter <= 0 {
		deadAfter = DefaultDeadAfter
	}
	url := RedactURLs(o.URL)
	log = log.With("component", "nats-client")
	dialTimeout := dialTimeoutFor(deadAfter)
	dialer := &ctxDialer{ctx: ctx, d: net.Dialer{Timeout: dialTimeout}}
	home := newHomeward(o, deadAfter, dialer, log)
	opts := []nats.Option{
		nats.Name(o.Name),
		nats.SetCustomDialer(dialer),
		nats.Timeout(dialTimeout),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(retry.Initial),
		nats.ReconnectJitter(retry.Initial/2, retry.Initial/2),
		nats.DontRandomize(),
		// deadWatch pings and judges the connection; nats.go's own pings
		// (which give a server up on unanswered pongs alone) stay out.
		nats.PingInterval(noClientPings),
		nats.ReconnectBufSize(-1),
		nats.ReconnectToServer(home.pick),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			// A server given up by deadWatch is logged there (err is nil:
			// a forced reconnection); nats.go's own pings never run.
			if err != nil {
				from, server := home.last()
				log.Warn("nats disconnected", "url", from, "server", server, "error", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			home.connected(nc)
			log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted(), "server", nc.ConnectedServerName())
		}),
		nats.ClosedHandler(func(*nats.Conn) { home.stop() }),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			log.Warn("nats asynchronous error", "subject", subject, "error", err)
		}),
	}
	auth, err := AuthOptions(o)
	if err != nil {
		return nil, err
	}
	opts = append(opts, auth...)

	delay := retry.Initial
	for attempt := 1; ; attempt++ {
		nc, err := nats.Connect(o.URL, opts...)
		if err == nil {
			dialer.detached.Store(true)
			home.connected(nc)
			home.start(nc)
			side := sideOptions(o.Name+" (probe of a silent connection's server)", dialer, auth)
			go (&deadWatch{deadAfter: deadAfter, log: log, home: home, sideOpts: side}).run(nc)
			log.Info("nats connected", "url", nc.ConnectedUrlRedacted(), "server", nc.ConnectedServerName(), "attempt", attempt,
				"detect_within", deadAfter)
			return nc, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("runtime: connecting to nats %s: %w", url, ctx.Err())
		}
		if IsAuthError(err) {
			// Retrying the same credentials gets the same answer: this is a
			// configuration to fix, not an outage to wait out.
			return nil, fmt.Errorf("runtime: nats %s refused the credentials (attempt %d): %w; check nats.user and nats.password, nats.creds, or nats.nkey and the server's security section", url, attempt, err)
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

// AuthOptions are o's credentials, TLS and, with an nkey, the inbox
// prefix of its identity (see [InboxPrefix]): what a client connecting
// with nats.Connect rather than [Connect] (the CLI) needs to pass the
// embedded server's security.
func AuthOptions(o ConnectOptions) ([]nats.Option, error) {
	var opts []nats.Option
	if o.User != "" {
		opts = append(opts, nats.UserInfo(o.User, o.Password))
	}
	if o.Creds != "" {
		opts = append(opts, nats.UserCredentials(o.Creds))
	}
	if o.NKey != "" {
		kp, err := LoadUserKey(o.NKey)
		if err != nil {
			return nil, fmt.Errorf("runtime: nats nkey %s: %w", o.NKey, err)
		}
		pub, _ := kp.PublicKey()
		kp.Wipe()
		opt, err := nats.NkeyOptionFromSeed(o.NKey)
		if err != nil {
			return nil, fmt.Errorf("runtime: nats nkey %s: %w", o.NKey, err)
		}
		opts = append(opts, opt, nats.CustomInboxPrefix(InboxPrefix(pub)))
	}
	if o.TLS != nil {
		opts = append(opts, nats.Secure(o.TLS))
	}
	return opts, nil
}

// IsAuthError reports whether a NATS error says the server refused the
// client's credentials (wrong user or password, an unknown or expired user
// JWT, a revoked account): permanent for those credentials.
func IsAuthError(err error) bool {
	for _, e := range []error{nats.ErrAuthorization, nats.ErrAuthExpired, nats.ErrAuthRevoked, nats.ErrAccountAuthExpired} {
		if errors.Is(err, e) {
			return true
		}
	}
	return err != nil && strings.Contains(strings.ToLower(err.Error()), "authorization violation")
}

// noClientPings is nats.go's ping interval: never within a connection's
// life (deadWatch pings instead).
const noClientPings = 24 * time.Hour

// deadWatch gives a server up when it stopped answering: DeadAfter with
// no pong to its pings and no message received. nats.go alone counts
// unanswered pings only, and a server answers a ping only after what the
// client sent before it: a server busy with the client's earlier requests
// (its direct reads wait for the store's disk syncs, in the connection's
// read loop) was given up while it still delivered the client's watch
// and acknowledged its writes — in a 10,000-pair takeover the survivor
// reconnected, failed every request in flight, and took its pairs over
// 7 s later. A server that delivers is alive; one cut off delivers
// nothing (over TCP, a client whose acknowledgements do not reach the
// server stops receiving within a retransmission timeout).
//
// Nor is a server given up that answers a new connection while this one
// hears nothing: its read loop for this connection waits on the disk
// syncs of the requests before (a store whose disk stalls for a second
// under a takeover's writes), and leaving it would fail them all — a
// 10,000-pair takeover lost its batches so. Once a ping has waited a ping
// interval for its pong, a side connection to the same server pings it
// too; at DeadAfter the server is kept while the side connection
// answered within DeadAfter, up to maxBusyFor DeadAfters of silence (a
// connection the network broke alone never recovers). A server cut off
// answers no new connection either, and is given up within DeadAfter as
// before; one whose old connection alone is cut (a firewall that lost
// its state, a close that never arrived) is given up only after
// maxBusyFor DeadAfters. An answer counts only for the server the
// connection is still on.
type deadWatch struct {
	deadAfter time.Duration
	log       *slog.Logger
	home      *homeward
	sideOpts  []nats.Option // a side connection's (see probeSide)

	answered atomic.Int64               // unix nanos of the latest pong
	pinging  atomic.Bool                // a ping waits for its pong
	side     atomic.Pointer[sideAnswer] // the side connection's latest answer
	probing  atomic.Bool                // a side connection is being tried
}

// sideAnswer is a side connection's answer: when, and from which server.
type sideAnswer struct {
	at  time.Time
	url string
}

// maxBusyFor bounds, in DeadAfters, how long a connection that hears
// nothing is kept because its server answers a side connection.
const maxBusyFor = 5

func (d *deadWatch) run(nc *nats.Conn) {
	every := max(pingInterval(d.deadAfter)/2, minPingInterval)
	t := time.NewTicker(every)
	defer t.Stop()
	heard := time.Now()
	var received uint64
	var busySince time.Time // when a silent connection was first kept for its busy server (zero: none)
	for range t.C {
		if nc.IsClosed() {
			return
		}
		now := time.Now()
		if !nc.IsConnected() {
			heard, busySince = now, time.Time{} // reconnecting: nats.go's business; judged again once connected
			continue
		}
		if in := nc.Stats().InMsgs; in != received {
			received, heard = in, now
		}
		if a := time.Unix(0, d.answered.Load()); a.After(heard) {
			heard = a
		}
		silent := now.Sub(heard)
		if !busySince.IsZero() && silent < d.deadAfter {
			from, server := d.home.last()
			d.log.Info("nats server answers this connection again", "url", from, "server", server,
				"busy_for", heard.Sub(busySince).Round(time.Millisecond))
			busySince = time.Time{}
		}
		if silent >= 2*pingInterval(d.deadAfter) && d.probing.CompareAndSwap(false, true) {
			// A ping unanswered for a ping interval: ask a side
			// connection, in time for the judgement at DeadAfter (and
			// again while the server is kept busy).
			go d.probeSide(nc.ConnectedUrl(), max(d.deadAfter-silent, pingInterval(d.deadAfter)))
		}
		sa := d.side.Load()
		busy := sa != nil && sa.url == nc.ConnectedUrl() && now.Sub(sa.at) <= d.deadAfter && silent <= maxBusyFor*d.deadAfter
		if silent > d.deadAfter && busy && busySince.IsZero() {
			busySince = heard
			from, server := d.home.last()
			d.log.Warn("nats server busy: it answers a new connection but nothing on this one yet; keeping it", "url", from, "server", server,
				"silent_for", silent.Round(time.Millisecond), "detect_within", d.deadAfter, "keep_up_to", maxBusyFor*d.deadAfter)
		}
		if silent > d.deadAfter && !busy {
			from, server := d.home.last()
			d.log.Warn("nats server not answering, moving to the next server", "url", from, "server", server,
				"detect_within", d.deadAfter, "ping_interval", pingInterval(d.deadAfter),
				"error", fmt.Sprintf("no pong and no message for %v", silent.Round(time.Millisecond)))
			_ = nc.ForceReconnect()
			heard, busySince = now, time.Time{}
			continue
		}
		if now.Sub(heard) >= pingInterval(d.deadAfter) && d.pinging.CompareAndSwap(false, true) {
			go func() {
				defer d.pinging.Store(false)
				if nc.FlushTimeout(d.deadAfter) == nil {
					d.answered.Store(time.Now().UnixNano())
				}
			}()
		}
	}
}

// probeSide pings url on a side connection within about wait (the dial
// is bounded by the dialer's timeout too); an answer is recorded in side.
func (d *deadWatch) probeSide(url string, wait time.Duration) {
	defer d.probing.Store(false)
	if url == "" {
		return
	}
	wait = max(wait, minPingInterval)
	if sidePing(url, append(d.sideOpts, nats.Timeout(wait)), wait) == nil {
		d.side.Store(&sideAnswer{at: time.Now(), url: url})
	}
}

// sidePing connects to url with opts on the side and round-trips a PING
// within wait: whether that server answers a new connection.
func sidePing(url string, opts []nats.Option, wait time.Duration) error {
	pc, err := nats.Connect(url, opts...)
	if err != nil {
		return err
	}
	defer pc.Close()
	return pc.FlushTimeout(wait)
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

// homeward brings the client back to the first server of its URL list,
// the node's own site's. nats.go moves on to the next server when one
// fails, but never back by itself: a client that left its own site's
// server would stay on a remote one until that one failed too. While away,
// homeward connects to the first server on the side every probe period;
// after homeProbesNeeded answers in a row it forces a reconnection and,
// through nats.ReconnectToServer, makes the first server the one dialled.
type homeward struct {
	log     *slog.Logger
	home    string // host:port of the first URL; "" when there is nothing to return to
	homeURL string // the first URL as given, to dial
	shown   string // the first URL, redacted
	probe   time.Duration
	wait    time.Duration // for a probe's dial and its PONG
	opts    []nats.Option // of a probe connection

	goHome atomic.Bool // the next reconnection dials home

	mu         sync.Mutex
	lastURL    string // the connected server's URL, redacted, as last seen
	lastServer string
	done       chan struct{}
	stopped    bool
}

func newHomeward(o ConnectOptions, deadAfter time.Duration, dialer nats.CustomDialer, log *slog.Logger) *homeward {
	h := &homeward{log: log, probe: o.HomeProbe, done: make(chan struct{})}
	if h.probe == 0 {
		h.probe = DefaultHomeProbe
	}
	urls := strings.Split(o.URL, ",")
	if len(urls) < 2 || h.probe < 0 {
		return h
	}
	h.homeURL = strings.TrimSpace(urls[0])
	u, err := url.Parse(h.homeURL)
	if err != nil {
		return h
	}
	h.home, h.shown = hostKey(u), u.Redacted()
	h.wait = dialTimeoutFor(deadAfter)
	auth, err := AuthOptions(o)
	if err != nil {
		return &homeward{log: log, probe: h.probe, done: h.done} // Connect reports err
	}
	h.opts = append(sideOptions(o.Name+" (probe of the first server)", dialer, auth), nats.Timeout(h.wait))
	return h
}

// sideOptions are the options of a side connection (see sidePing): the
// node's dialer and credentials, no reconnection, no discovered servers.
func sideOptions(name string, dialer nats.CustomDialer, auth []nats.Option) []nats.Option {
	return append([]nats.Option{nats.Name(name), nats.SetCustomDialer(dialer), nats.NoReconnect(), nats.IgnoreDiscoveredServers()}, auth...)
}

// hostKey is host:port with nats.go's default ports filled in, the way
// nats.go keys its server pool.
func hostKey(u *url.URL) string {
	port := u.Port()
	if port == "" {
		switch u.Scheme {
		case "ws":
			port = "80"
		case "wss":
			port = "443"
		default:
			port = "4222"
		}
	}
	return net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

func (h *homeward) isHome(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && hostKey(u) == h.home
}

// connected records the server nc is connected to, for the logs.
func (h *homeward) connected(nc *nats.Conn) {
	h.mu.Lock()
	h.lastURL, h.lastServer = nc.ConnectedUrlRedacted(), nc.ConnectedServerName()
	h.mu.Unlock()
}

func (h *homeward) last() (url, server string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lastURL, h.lastServer
}

// pick is the nats.ReconnectToServer callback: the first server when a
// return home was asked for, else nats.go's own choice (the next one).
func (h *homeward) pick(servers []nats.Server, _ nats.ServerInfo) (*nats.Server, time.Duration) {
	if !h.goHome.Swap(false) {
		return nil, 0
	}
	for i := range servers {
		if servers[i].URL != nil && hostKey(servers[i].URL) == h.home {
			return &servers[i], 0
		}
	}
	return nil, 0
}

// start runs the probes of the first server until nc is closed.
func (h *homeward) start(nc *nats.Conn) {
	if h.home == "" {
		return
	}
	go h.run(nc)
}

func (h *homeward) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.stopped {
		h.stopped = true
		close(h.done)
	}
}

func (h *homeward) run(nc *nats.Conn) {
	t := time.NewTicker(h.probe)
	defer t.Stop()
	answered := 0
	for {
		select {
		case <-h.done:
			return
		case <-t.C:
		}
		cur := nc.ConnectedUrl()
		if cur == "" || h.isHome(cur) {
			answered = 0 // reconnecting (nats.go tries the first server itself), or at home
			continue
		}
		if err := h.ping(); err != nil {
			if answered > 0 {
				h.log.Debug("nats first server stopped answering again", "url", h.shown, "error", err)
			}
			answered = 0
			continue
		}
		if answered++; answered < homeProbesNeeded {
			continue
		}
		answered = 0
		h.log.Info("nats first server answers again, moving back to it", "from", RedactURLs(cur), "to", h.shown)
		h.goHome.Store(true)
		if err := nc.ForceReconnect(); err != nil {
			h.goHome.Store(false)
		}
	}
}

// ping connects to the first server on the side and round-trips a PING.
func (h *homeward) ping() error { return sidePing(h.homeURL, h.opts, h.wait) }
