package runtime

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// EmbeddedConfig is what an embedded nats-server needs.
type EmbeddedConfig struct {
	// DataDir holds the JetStream store (created 0700 if missing).
	DataDir string
	// Host and Port are the client listen address; Port -1 picks a free port.
	// (nats-server reads Port 0 as 4222.)
	Host string
	Port int
	// ServerName names the server in logs and JetStream; the server ID when empty.
	ServerName string
	// ReadyTimeout bounds the wait for the server to accept clients; 10s when zero.
	ReadyTimeout time.Duration

	// TLS, when not nil, is the client port's: the server presents its
	// certificate and requires every client to present one its ClientCAs
	// verify. Kept, not copied.
	TLS *tls.Config
	// Users, when not nil, are the only identities the server accepts
	// (nkey challenge), each with its permissions (see [Permissions]).
	// Kept, not copied.
	Users []*server.NkeyUser
	// Cluster, when not nil, makes the server a member of a NATS cluster:
	// JetStream is then clustered and needs ServerName, unique per server.
	Cluster *EmbeddedCluster
}

// EmbeddedCluster is the embedded server's side of a NATS cluster.
type EmbeddedCluster struct {
	Name string // the same on every server of the cluster
	// Host and Port are the route listener; Port -1 picks a free one.
	Host string
	Port int
	// Routes are the other servers' route URLs; listing this server's own
	// is harmless (nats-server ignores a route to itself).
	Routes []*url.URL
	// TLS of the routes, mutual: it presents its certificate, verifies the
	// peer's (RootCAs, ClientCAs) and requires one (ClientAuth). Nil for
	// plain routes (loopback only). Kept, not copied.
	TLS *tls.Config
	// PinnedCerts, when not empty, are the only certificates accepted as
	// routes, either way (CertSHA256 of each); the CA alone would let any
	// certificate it signed for a node, a removed node's too, be a route.
	// With TLS only. Copied.
	PinnedCerts []string
}

// A cluster member's shutdown: the clients still connected once the
// leaderships are handed over are closed within lameDuckDuration, after
// lameDuckGrace.
const (
	lameDuckDuration = 2 * time.Second
	lameDuckGrace    = 500 * time.Millisecond
)

// tlsTimeout bounds a TLS handshake, client or route: cross-site links
// need more than nats-server's default half second.
const tlsTimeout = 2 // seconds

// EmbeddedNATS is a nats-server with JetStream running in this process.
//
// Its JetStream store syncs every write to disk before acknowledging it
// (SyncAlways): the file store otherwise fsyncs only every two minutes, and
// the leadership register must not lose acknowledged writes on power loss.
type EmbeddedNATS struct {
	srv  *server.Server
	log  *slog.Logger
	once sync.Once
	sl   *serverLogger
	dir  string
	stop chan struct{}
	done chan struct{}
}

// Out-of-space recovery: nats-server's file store keeps a write error for
// good once a write failed for lack of space, and refuses every write of
// that stream until JetStream is restarted. The keeper checks every
// storeCheckEvery; once the data directory has storeFreeMin free again it
// restarts JetStream (the streams are read back from disk).
const (
	storeCheckEvery = 500 * time.Millisecond
	storeFreeMin    = 16 << 20
)

// StoreFull reports whether the store ran out of space and has not been
// recovered yet: JetStream refuses writes meanwhile.
func (e *EmbeddedNATS) StoreFull() bool { return e.sl.outOfSpace() }

// keepStore restarts JetStream once space is back after running out.
func (e *EmbeddedNATS) keepStore() {
	defer close(e.done)
	t := time.NewTicker(storeCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		if !e.sl.outOfSpace() {
			continue
		}
		free, err := freeBytes(e.dir)
		if err != nil || free < storeFreeMin {
			continue
		}
		cfg := e.srv.JetStreamConfig()
		if cfg == nil {
			cfg = &server.JetStreamConfig{SyncAlways: true}
		}
		// The running config's StoreDir already ends in "jetstream", which
		// EnableJetStream appends again: give it the directory it started on.
		cfg.StoreDir = e.dir
		e.log.Warn("jetstream store has free space again; restarting JetStream to clear its write errors", "store_dir", e.dir, "free_bytes", free)
		if err := e.srv.ShutdownJetStream(); err != nil {
			e.log.Error("jetstream restart: shutdown", "err", err)
			continue
		}
		e.sl.clearOutOfSpace()
		if err := e.srv.EnableJetStream(cfg); err != nil {
			e.sl.markOutOfSpace() // try again at the next check
			e.log.Error("jetstream restart: enable", "err", err)
			continue
		}
		e.log.Info("jetstream recovered after the data directory ran out of space", "store_dir", e.dir, "free_bytes", free)
	}
}

// freeBytes is the space left to unprivileged writers on dir's file system.
func freeBytes(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// StartEmbedded starts a nats-server with JetStream in cfg.DataDir and waits
// until it accepts clients. Its logs go to log: notices (the start-up
// banner and the like) at debug, warnings and errors at warn and error.
// The server installs no signal handlers: the caller owns shutdown and must
// call Shutdown.
func StartEmbedded(cfg EmbeddedConfig, log *slog.Logger) (*EmbeddedNATS, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("runtime: embedded nats: empty data directory")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("runtime: embedded nats: data directory: %w", err)
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 10 * time.Second
	}
	log = log.With("component", "nats-server")
	opts := &server.Options{
		ServerName: cfg.ServerName,
		Host:       cfg.Host,
		Port:       cfg.Port,
		JetStream:  true,
		StoreDir:   cfg.DataDir,
		SyncAlways: true,
		// The caller handles SIGINT/SIGTERM and shuts the server down in order.
		NoSigs: true,
		Nkeys:  cfg.Users,
	}
	if cfg.TLS != nil {
		opts.TLS, opts.TLSVerify, opts.TLSConfig, opts.TLSTimeout = true, true, cfg.TLS, tlsTimeout
	}
	if cl := cfg.Cluster; cl != nil {
		if cfg.ServerName == "" {
			return nil, errors.New("runtime: embedded nats: a cluster member needs a server name")
		}
		opts.Cluster = server.ClusterOpts{
			Name: cl.Name, Host: cl.Host, Port: cl.Port,
			TLSConfig: cl.TLS, TLSTimeout: tlsTimeout,
			// Clients are given the URLs they were configured with, never the
			// listen addresses of the other sites' servers (which their
			// certificates may not name, or which are not reachable).
			NoAdvertise: true,
		}
		opts.Routes = cl.Routes
		if len(cl.PinnedCerts) > 0 {
			if cl.TLS == nil {
				return nil, errors.New("runtime: embedded nats: pinned route certificates need route TLS")
			}
			opts.Cluster.TLSPinnedCerts = server.PinnedCertSet{}
			for _, p := range cl.PinnedCerts {
				opts.Cluster.TLSPinnedCerts[strings.ToLower(p)] = struct{}{}
			}
		}
		// Shutdown hands the raft leaderships over first (lame duck mode),
		// then closes the clients left within these bounds.
		opts.LameDuckDuration, opts.LameDuckGracePeriod = lameDuckDuration, lameDuckGrace
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("runtime: embedded nats: %w", err)
	}
	sl := &serverLogger{log: log}
	srv.SetLoggerV2(sl, log.Enabled(context.Background(), slog.LevelDebug), false, false)
	srv.Start()

	// Poll readiness in short slices so that a fatal start-up error (port in
	// use, store not writable) is returned at once, not after the timeout.
	deadline := time.Now().Add(cfg.ReadyTimeout)
	for !srv.ReadyForConnections(50 * time.Millisecond) {
		if msg := sl.fatal(); msg != "" || time.Now().After(deadline) {
			srv.Shutdown()
			srv.WaitForShutdown()
			if msg == "" {
				msg = "not ready for connections after " + cfg.ReadyTimeout.String()
			}
			return nil, fmt.Errorf("runtime: embedded nats on %s: %s", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)), msg)
		}
	}
	if !srv.JetStreamEnabled() {
		msg := sl.fatal()
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("runtime: embedded nats: JetStream not enabled: %s", msg)
	}
	e := &EmbeddedNATS{srv: srv, log: log, sl: sl, dir: cfg.DataDir, stop: make(chan struct{}), done: make(chan struct{})}
	go e.keepStore()
	attrs := []any{"client_url", e.ClientURL(), "store_dir", srv.StoreDir(), "sync_always", true, "server_name", srv.Name(),
		"tls", cfg.TLS != nil, "users", len(cfg.Users)}
	if cl := cfg.Cluster; cl != nil {
		attrs = append(attrs, "cluster", cl.Name, "cluster_addr", srv.ClusterAddr().String(), "routes", len(cl.Routes), "route_tls", cl.TLS != nil, "route_pins", len(cl.PinnedCerts))
	}
	log.Info("embedded nats started", attrs...)
	return e, nil
}

// WaitJetStream waits until a cluster member's JetStream has a meta leader
// and this server is current with it (until then its JetStream API calls
// go unanswered), or until ctx is done. A single server is ready at once.
func (e *EmbeddedNATS) WaitJetStream(ctx context.Context) error {
	if !e.srv.JetStreamIsClustered() {
		return nil
	}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for !e.srv.JetStreamIsCurrent() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// WaitStreamsCurrent waits, up to within, until this server's replicas of
// streams are current with their leaders: a server just restarted catches
// up first, and meanwhile the requests its own clients send it (direct
// gets, consumers) can go unanswered until they time out. It returns the
// streams still not current when within ran out (nil: all are), or ctx's
// error. A single server is current at once.
func (e *EmbeddedNATS) WaitStreamsCurrent(ctx context.Context, streams []string, within time.Duration) ([]string, error) {
	if !e.srv.JetStreamIsClustered() {
		return nil, nil
	}
	acc := e.srv.GlobalAccount().Name
	deadline := time.Now().Add(within)
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		var behind []string
		for _, st := range streams {
			if !e.srv.JetStreamIsStreamCurrent(acc, st) {
				behind = append(behind, st)
			}
		}
		if len(behind) == 0 || time.Now().After(deadline) {
			return behind, nil
		}
		select {
		case <-ctx.Done():
			return behind, ctx.Err()
		case <-t.C:
		}
	}
}

// ClientURL is the URL clients connect to (the real port when -1 was asked).
func (e *EmbeddedNATS) ClientURL() string {
	return e.srv.ClientURL()
}

// dialURL is ClientURL with an unspecified listen address (0.0.0.0, ::)
// replaced by loopback, so the node itself can connect to it.
func (e *EmbeddedNATS) dialURL() string {
	addr, ok := e.srv.Addr().(*net.TCPAddr)
	if !ok {
		return e.ClientURL()
	}
	ip := addr.IP
	if ip.IsUnspecified() {
		if ip.To4() != nil {
			ip = net.IPv4(127, 0, 0, 1)
		} else {
			ip = net.IPv6loopback
		}
	}
	return "nats://" + net.JoinHostPort(ip.String(), strconv.Itoa(addr.Port))
}

// Server is the running nats-server, for inspection.
func (e *EmbeddedNATS) Server() *server.Server {
	return e.srv
}

// Shutdown stops the server and waits until it has stopped. Safe to call
// more than once. A cluster member first hands over the leadership of the
// raft groups it leads (JetStream's meta group, the streams) and waits a
// second for the transfers: a server that just vanishes leaves its groups
// without a leader until an election, 4 to 9 seconds later, during which
// the register cannot be written.
func (e *EmbeddedNATS) Shutdown() {
	e.once.Do(func() {
		close(e.stop)
		<-e.done
		if e.srv.JetStreamIsClustered() {
			e.log.Info("handing over the JetStream leaderships before stopping (lame duck mode)")
			e.srv.LameDuckShutdown()
		}
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
		e.log.Info("embedded nats stopped")
	})
}

// serverLogger routes nats-server's logger to slog. It remembers the last
// fatal message: nats-server reports start-up failures (listen, JetStream)
// through Fatalf, which here does not exit the process.
type serverLogger struct {
	log *slog.Logger

	mu       sync.Mutex
	lastFail string
	noSpace  bool // a store write failed for lack of space (see keepStore)
}

func (l *serverLogger) outOfSpace() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.noSpace
}

func (l *serverLogger) markOutOfSpace() {
	l.mu.Lock()
	l.noSpace = true
	l.mu.Unlock()
}

func (l *serverLogger) clearOutOfSpace() {
	l.mu.Lock()
	l.noSpace = false
	l.mu.Unlock()
}

func (l *serverLogger) Noticef(format string, v ...any) {
	l.log.Debug(fmt.Sprintf(format, v...))
}

func (l *serverLogger) Warnf(format string, v ...any) {
	l.log.Warn(fmt.Sprintf(format, v...))
}

func (l *serverLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.mu.Lock()
	l.lastFail = msg
	l.mu.Unlock()
	l.log.Error(msg, "fatal", true)
}

func (l *serverLogger) Errorf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if strings.Contains(msg, "no space left on device") {
		// Reported on every refused write: once is enough until recovered.
		l.mu.Lock()
		first := !l.noSpace
		l.noSpace = true
		l.mu.Unlock()
		if !first {
			return
		}
		l.log.Error("jetstream store is out of space: writes are refused until space is freed (recovery is automatic)", "err", msg)
		return
	}
	l.log.Error(msg)
}

func (l *serverLogger) Debugf(format string, v ...any) {
	l.log.Debug(fmt.Sprintf(format, v...))
}

// Tracef is protocol tracing; enabled never (see SetLoggerV2 in StartEmbedded).
func (l *serverLogger) Tracef(format string, v ...any) {
	l.log.Log(context.Background(), slog.LevelDebug-4, fmt.Sprintf(format, v...))
}

func (l *serverLogger) fatal() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastFail
}
