package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"understudy/events"
)

// Timeouts of Serve's steps.
const (
	provisionTimeout   = 10 * time.Second // one provisioning attempt
	healthTimeout      = time.Second      // the JetStream probe of /healthz
	httpShutdownWindow = 5 * time.Second  // in-flight requests at shutdown
	// streamsCurrentWithin bounds the wait of a restarted cluster member
	// for its copies of the assets to catch up before its members start.
	streamsCurrentWithin = 30 * time.Second
	// clusterFormingWindow: how long "no suitable peers" (10005) is taken
	// for a cluster still forming before provisioning gives up.
	clusterFormingWindow = 2 * time.Minute
)

// Serve runs a node until ctx is done: it validates cfg, serves /healthz and
// /metrics on cfg.HTTP, starts the embedded NATS (or connects to cfg.NATS.URL,
// retrying while it is unreachable), provisions the JetStream assets and logs
// "ready" with the client URL. When ctx is done it closes, in order, the HTTP
// server, the NATS connection and the embedded server, and returns nil: a
// cancelled ctx is the normal way to stop, also while still starting.
//
// It returns early with an error for an invalid cfg (*ConfigError values),
// an HTTP address it cannot listen on, an embedded server that cannot start,
// or assets NATS refuses (*ProvisionError).
func Serve(ctx context.Context, cfg Config) error {
	s, err := cfg.resolve()
	if err != nil {
		return err
	}
	log := cfg.Logger
	if log == nil {
		out := cfg.LogOutput
		if out == nil {
			out = os.Stderr
		}
		log = NewLogger(out, s.logLevel, s.logFormat)
		// The process's own logger: libraries that log to slog's default
		// (the actor engine reports panics and restarts there) follow the
		// node's level and format.
		slog.SetDefault(log.With("component", "library"))
	}
	n := &node{log: log, s: s}
	n.metrics = newMetrics(ReadBuildInfo(), n.connected)

	ln, err := net.Listen("tcp", s.httpAddr)
	if err != nil {
		return fmt.Errorf("runtime: http: %w", err)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	httpSrv := &http.Server{
		Handler:           n.routes(),
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.With("component", "http").Handler(), slog.LevelWarn),
	}
	httpDone := make(chan struct{})
	go func() {
		defer close(httpDone)
		if err := httpSrv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			cancel(fmt.Errorf("runtime: http: %w", err))
		}
	}()
	n.httpAddr = ln.Addr().String()
	log.Info("http listening", "addr", n.httpAddr, "paths", "/healthz /metrics /primary /replica /health")

	if s.pprofAddr != "" {
		stop, err := servePprof(s.pprofAddr, log)
		if err != nil {
			n.shutdown(httpSrv, httpDone)
			return err
		}
		defer stop()
	}

	runErr := n.run(ctx)
	if cause := context.Cause(ctx); runErr == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		runErr = cause // the HTTP server failed
	}
	n.shutdown(httpSrv, httpDone)
	return runErr
}

// node is one running Serve.
type node struct {
	log      *slog.Logger
	s        settings
	metrics  *metrics
	httpAddr string

	embedded    atomic.Pointer[EmbeddedNATS] // nil with an external NATS; read by /healthz
	nc          atomic.Pointer[nats.Conn]
	provisioned atomic.Bool
	host        atomic.Pointer[Host]  // the failover members, once started
	agent       atomic.Pointer[Agent] // the node's agent, once started
}

func (n *node) connected() bool {
	nc := n.nc.Load()
	return nc != nil && nc.IsConnected()
}

// run starts NATS, provisions and waits for ctx. It returns nil when ctx is
// cancelled, even during start-up.
func (n *node) run(ctx context.Context) error {
	s := n.s
	connect := ConnectOptions{
		URL: s.urls, User: s.user, Password: s.password, Creds: s.creds, NKey: s.nkeyFile, TLS: s.tls,
		Retry: s.retry, Name: "understudy", DeadAfter: s.deadAfter,
	}
	if s.node != "" {
		connect.Name = "understudy " + s.node
	}
	names := AssetsConfig{FailoverBucket: s.failoverBucket, FleetBucket: s.fleetBucket, EventsStream: s.eventsStream}
	mode := "external"
	var embedded *EmbeddedNATS
	if s.embedded {
		mode = "embedded"
		ec := EmbeddedConfig{
			DataDir: s.dataDir, Host: s.listenHost, Port: s.listenPort, ServerName: s.server.name,
			TLS: s.server.tls, Users: Permissions(s.security, names),
		}
		if cl := s.server.cluster; cl != nil {
			mode = "embedded cluster " + cl.name
			ec.Cluster = &EmbeddedCluster{Name: cl.name, Host: cl.host, Port: cl.port, Routes: cl.routes, TLS: cl.tls, PinnedCerts: cl.pinned}
		}
		es, err := StartEmbedded(ec, n.log)
		if err != nil {
			return err
		}
		n.embedded.Store(es)
		embedded = es
		connect.URL = es.dialURL()
	} else if s.tlsInsecure {
		n.log.Warn("TLS certificate verification of the NATS server is disabled (nats.tls.insecure)")
	}

	nc, err := Connect(ctx, connect, n.log)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	n.nc.Store(nc)
	// Calls without a deadline of their own must not outwait the members.
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(jetStreamTimeout(s.deadAfter)))
	if err != nil {
		return fmt.Errorf("runtime: jetstream: %w", err)
	}

	if embedded != nil && s.server.cluster != nil {
		// Provisioning before the cluster has a meta leader only times out.
		n.log.Info("waiting for the NATS cluster: JetStream needs a meta leader, elected by a majority of the servers", "routes", len(s.server.cluster.routes))
		if err := embedded.WaitJetStream(ctx); err != nil {
			return nil // ctx is done
		}
		n.log.Info("jetstream cluster has a meta leader")
	}
	assets := DefaultAssets(names, s.replicas)
	if err := n.provision(ctx, js, assets); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}

	streams := []string{Asset{Kind: KVBucket, Name: s.failoverBucket}.StreamName(), s.eventsStream, Asset{Kind: KVBucket, Name: s.fleetBucket}.StreamName()}
	if embedded != nil && s.server.cluster != nil && len(s.members) > 0 {
		// A restarted server catches its replicas up first; members started
		// meanwhile saw their first reads and watch time out (5 s each).
		start := time.Now()
		behind, err := embedded.WaitStreamsCurrent(ctx, streams, streamsCurrentWithin)
		if err != nil {
			return nil // ctx is done
		}
		if len(behind) > 0 {
			n.log.Warn("this server's copies of the assets are not current yet; starting the members anyway", "behind", behind, "waited", time.Since(start).Round(time.Millisecond))
		} else {
			n.log.Info("this server's copies of the assets are current", "waited", time.Since(start).Round(time.Millisecond))
		}
	}

	if s.preferredLeader != "" {
		keeper := StartLeaderKeeper(ctx, nc, js, LeaderKeeperConfig{
			Preferred: s.preferredLeader,
			Streams:   streams,
		}, n.log)
		defer keeper.Stop()
	}

	clientURL := nc.ConnectedUrlRedacted()
	if embedded != nil {
		clientURL = embedded.ClientURL()
	}
	var host *Host
	if len(s.members) > 0 || s.agent != nil { // the agent's postgres-pair kind adds members to it
		// With a security section the members sign their register writes
		// with the node's nkey and verify everyone's (trust.go).
		trust, terr := NewValueTrust(s.security, s.node, s.nkeyFile)
		if terr != nil {
			return terr
		}
		if err := n.checkLeadership(ctx, js); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		host, err = StartHost(ctx, js, s.eventsStream, s.failoverBucket, s.members, HostOptions{Logger: n.log, Metrics: n.metrics.members, LibvirtDriver: s.libvirtDriver, Trust: trust,
			Node: s.node, Leadership: s.leadership})
		if err != nil {
			return fmt.Errorf("runtime: members: %w", err)
		}
		n.host.Store(host)
	}
	if s.agent != nil {
		acfg := *s.agent
		acfg.Host = host
		ag, err := StartAgent(ctx, nc, s.fleetBucket, s.eventsStream, acfg, n.log)
		if err != nil {
			return fmt.Errorf("runtime: agent: %w", err)
		}
		n.agent.Store(ag)
		defer ag.Stop()
	}
	role := "node"
	if host == nil && s.server.cluster != nil {
		// No pair and no agent: it holds a replica of the assets and
		// counts in the cluster's quorum, nothing more.
		role = "witness"
	}
	n.log.Info("ready", "client_url", clientURL, "http", n.httpAddr, "nats", mode, "replicas", s.replicas,
		"failover_bucket", s.failoverBucket, "fleet_bucket", s.fleetBucket, "events_stream", s.eventsStream,
		"members", len(s.members), "role", role, "secured", s.security != nil, "leadership", s.leadership.String())

	<-ctx.Done()
	n.log.Info("shutting down", "cause", context.Cause(ctx))
	if host != nil {
		// Leading members hand over before the node goes (clean demotion), so
		// the other site takes over at once instead of after failover_timeout.
		hctx, cancel := context.WithTimeout(context.Background(), memberHandoverWindow(s.members))
		host.Shutdown(hctx)
		cancel()
	}
	return nil
}

// memberHandoverWindow bounds the clean handover at shutdown: the demote
// chain plus a few heartbeats for the release to land.
func memberHandoverWindow(members []MemberConfig) time.Duration {
	w := 5 * time.Second
	for _, m := range members {
		need := m.Rules.FenceGrace + 3*m.Rules.HeartbeatTimeout
		for _, st := range m.Procedures.Demote.Steps {
			need += st.Timeout
		}
		w = max(w, need)
	}
	return w
}

// provision provisions the assets, retrying with backoff while JetStream
// does not answer (a cluster still electing its leader, say).
func (n *node) provision(ctx context.Context, js jetstream.JetStream, assets []Asset) error {
	delay := n.s.retry.Initial
	started := time.Now()
	for attempt := 1; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, provisionTimeout)
		provision := Provision
		if n.s.security != nil && n.s.embedded {
			// Its permissions let it create the assets, not change them.
			provision = ProvisionCreateOnly
		}
		p, err := provision(pctx, js, assets, n.log)
		cancel()
		var perr *ProvisionError
		errors.As(err, &perr)
		n.metrics.observeProvision(p, perr)
		if err == nil {
			n.provisioned.Store(true)
			n.log.Info("assets provisioned", "report", p.String(), "refused_changes", p.Refused())
			return nil
		}
		// A cluster still forming has no suitable peers for R3 yet; one that
		// never will (fewer servers than replicas) is refused after a while.
		forming := isAPIError(err, codeClusterNoPeers) && time.Since(started) < clusterFormingWindow
		if ctx.Err() != nil || !(retryableProvisionError(err) || forming) {
			return err
		}
		next := jitter(delay)
		n.log.Warn("jetstream not ready, retrying", "attempt", attempt, "next_delay", next, "error", err)
		t := time.NewTimer(next)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		delay = min(2*delay, n.s.retry.Max)
	}
}

// checkLeadership refuses to start members whose leadership is not the
// deployment's (see checkDeploymentLeadership). The store's failures
// (a stream leader being elected, a slow store) are tried again for up
// to a minute; a record that disagrees or does not decode refuses at once.
func (n *node) checkLeadership(ctx context.Context, js jetstream.JetStream) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	node := n.s.node
	if node == "" && len(n.s.members) > 0 {
		node = n.s.members[0].Site // the site name of members that name no node
	}
	open := func() (events.KV, error) { return events.NewJetStreamKV(ctx, js, n.s.failoverBucket) }
	return checkLeadershipRetrying(ctx, open, node, n.s.leadership, len(n.s.members) > 0, n.log)
}

// shutdown closes the HTTP server, the NATS connection and the embedded
// server, in that order.
func (n *node) shutdown(httpSrv *http.Server, httpDone <-chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), httpShutdownWindow)
	defer cancel()
	if err := httpSrv.Shutdown(ctx); err != nil {
		n.log.Warn("http shutdown", "error", err)
		_ = httpSrv.Close()
	}
	<-httpDone
	n.log.Debug("http server closed")
	if nc := n.nc.Load(); nc != nil {
		nc.Close()
		n.log.Debug("nats connection closed")
	}
	if es := n.embedded.Load(); es != nil {
		es.Shutdown()
	}
	n.log.Info("stopped")
}

func (n *node) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", n.healthz)
	mux.HandleFunc("GET /primary", n.endpoint(endpointPrimary))
	mux.HandleFunc("GET /replica", n.endpoint(endpointReplica))
	mux.HandleFunc("GET /health", n.endpoint(endpointHealth))
	mux.Handle("GET /metrics", promhttp.HandlerFor(n.metrics.reg, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(n.log.With("component", "metrics").Handler(), slog.LevelWarn),
	}))
	return mux
}

// Health is the body of /healthz.
type Health struct {
	// Status is "ok", "degraded" (the node works, but its store answers
	// heartbeat writes slowly: overload, not failure; still 200) or
	// "unavailable" (503).
	Status        string `json:"status"`
	NATSConnected bool   `json:"nats_connected"`
	JetStream     bool   `json:"jetstream"` // JetStream answered just now
	Provisioned   bool   `json:"provisioned"`
	// Members are the node's failover members; one that stopped makes the
	// node unavailable until it runs again.
	Members []MemberState `json:"members,omitempty"`
	// Reasons say why the status is unavailable, one line each.
	Reasons []string `json:"reasons,omitempty"`
	// Degraded says why the node is degraded, one line each.
	Degraded []string `json:"degraded,omitempty"`
	// StoreWriteLatency is the worst recent answer time of the node's
	// heartbeat writes, in seconds (0: no member writes yet).
	StoreWriteLatency float64 `json:"store_write_latency_seconds,omitempty"`
}

// healthz answers 200 when NATS is connected, JetStream answers, the
// assets are provisioned and every failover member runs, else 503 with the
// reasons; the body is a Health either way. A node whose store answers its
// heartbeat writes slowly is degraded, still 200: it works, and says so
// before any member fences.
func (n *node) healthz(w http.ResponseWriter, r *http.Request) {
	h := Health{Status: "unavailable", Provisioned: n.provisioned.Load()}
	if nc := n.nc.Load(); nc != nil && nc.IsConnected() {
		h.NATSConnected = true
		if js, err := jetstream.New(nc); err == nil {
			ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
			_, err = js.AccountInfo(ctx)
			cancel()
			h.JetStream = err == nil
		}
	}
	switch {
	case !h.NATSConnected:
		h.Reasons = append(h.Reasons, "nats: not connected")
	case !h.JetStream:
		h.Reasons = append(h.Reasons, "jetstream: no answer within "+healthTimeout.String())
	}
	if !h.Provisioned {
		h.Reasons = append(h.Reasons, "assets: not provisioned yet")
	}
	if es := n.embedded.Load(); es != nil && es.StoreFull() {
		h.Reasons = append(h.Reasons, "jetstream: the data directory ran out of space; writes are refused until space is freed (recovery is automatic)")
	}
	if ag := n.agent.Load(); ag != nil && !ag.Running() {
		h.Reasons = append(h.Reasons, "agent: stopped; the node no longer converges its manifest")
	}
	if host := n.host.Load(); host != nil {
		h.Members = host.Members()
		for _, m := range h.Members {
			if !m.Running {
				h.Reasons = append(h.Reasons, fmt.Sprintf("member %s/%s stopped at %s: %s (restarts at %s)",
					m.Pair, m.Site, m.Since.UTC().Format(time.RFC3339), m.Reason, m.RestartAt.UTC().Format(time.RFC3339)))
			}
		}
		sh := host.StoreHealth()
		h.StoreWriteLatency = sh.Worst.Seconds()
		if sh.Degraded {
			h.Degraded = append(h.Degraded, fmt.Sprintf("store: heartbeat writes take up to %v, more than half of heartbeat_timeout %v, since %s: overloaded, members fence if writes keep missing heartbeat_timeout",
				sh.Worst.Round(time.Millisecond), sh.HeartbeatTimeout, sh.Since.UTC().Format(time.RFC3339)))
		}
	}
	code := http.StatusServiceUnavailable
	switch {
	case len(h.Reasons) == 0 && len(h.Degraded) > 0:
		h.Status, code = "degraded", http.StatusOK
	case len(h.Reasons) == 0:
		h.Status, code = "ok", http.StatusOK
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(h)
}

// servePprof serves Go's profiler on addr until stop is called.
func servePprof(addr string, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("runtime: pprof: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		ErrorLog: slog.NewLogLogger(log.With("component", "pprof").Handler(), slog.LevelWarn)}
	go func() { _ = srv.Serve(ln) }()
	log.Info("pprof listening", "addr", ln.Addr().String(), "path", "/debug/pprof/")
	return func() { _ = srv.Close() }, nil
}
