package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"understudy/actors/failover"
	"understudy/capabilities/postgres"
	"understudy/runtime"
)

// postgresDemoSummary is the outcome of `understudy demo --postgres`.
type postgresDemoSummary struct {
	Pair     string    `json:"pair"`
	Primary  string    `json:"primary"`
	Replica  string    `json:"replica"`
	FaultAt  time.Time `json:"fault_at"`
	Promoted string    `json:"promoted"` // the site serving after the power cut ("" none)
	// FirstWriteMS: from the power cut to the first commit acknowledged by
	// the new primary (-1: none within the window).
	FirstWriteMS float64 `json:"first_write_ms"`
	// AckedWrites: commits the writer saw acknowledged in the whole run;
	// LostWrites: those missing from the new primary afterwards.
	AckedWrites int     `json:"acked_writes"`
	LostWrites  int     `json:"lost_writes"`
	LostSample  []int64 `json:"lost_sample,omitempty"` // the first few lost counter values
	Synchronous string  `json:"synchronous"`
	MaxLagBytes uint64  `json:"maximum_lag_on_failover"`
}

// demoSite is one site of the PostgreSQL demo.
type demoSite struct {
	name string
	cfg  postgres.Config
	nc   *nats.Conn
	host *runtime.Host
}

// freePort asks the kernel for a free TCP port on loopback.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// runDemoPostgres runs the demo on two real PostgreSQL servers: each site's
// member drives its own (the preferred primary creates the database, the
// replica clones it and streams), a writer commits a counter through a
// read-write multi-host connection, and after killAfter the primary's
// site loses power: its NATS link is cut, its postmaster and backends are
// SIGKILLed, its node stops. The replica takes over; the summary says how
// long until the first commit was accepted again and how many
// acknowledged commits are missing.
func runDemoPostgres(ctx context.Context, rules failover.Rules, killAfter time.Duration, dataDir string, asJSON bool, stdout, live io.Writer, logger *slog.Logger) error {
	probe := postgres.Config{DataDir: "/nonexistent", Peer: "127.0.0.1:1", Replication: postgres.ReplicationConfig{Password: "x"}}
	if err := probe.Validate("postgres"); err != nil {
		var ce *runtime.ConfigError
		if errors.As(err, &ce) && (ce.Field == "postgres.bin_dir" || ce.Field == "postgres.version") {
			return fmt.Errorf("demo --postgres needs PostgreSQL 15's server binaries: %s", ce.Rule)
		}
	}
	if dataDir == "" {
		dir, err := os.MkdirTemp("", "understudy-demo-pg-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		dataDir = dir
	}
	// PostgreSQL runs as its own user: it must reach its directory.
	if err := os.Chmod(dataDir, 0o755); err != nil {
		return err
	}
	es, err := runtime.StartEmbedded(runtime.EmbeddedConfig{DataDir: filepath.Join(dataDir, "nats"), Host: "127.0.0.1", Port: -1}, logger)
	if err != nil {
		return err
	}
	defer es.Shutdown()
	names := runtime.DefaultConfig().Assets
	{
		nc, err := nats.Connect(es.ClientURL())
		if err != nil {
			return err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return err
		}
		_, err = runtime.Provision(ctx, js, runtime.DefaultAssets(names, 1), logger)
		nc.Close()
		if err != nil {
			return err
		}
	}
	pw := make([]byte, 12)
	_, _ = rand.Read(pw)
	password := hex.EncodeToString(pw)
	ports := map[string]int{}
	for _, s := range []string{rules.Primary, rules.Replica} {
		p, err := freePort()
		if err != nil {
			return err
		}
		ports[s] = p
	}
	start := time.Now()
	var outMu sync.Mutex
	say := func(site, format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(live, "%8.3fs  %-7s %s\n", time.Since(start).Seconds(), site, fmt.Sprintf(format, args...))
	}
	fmt.Fprintf(live, "embedded NATS at %s; pair %s: %s (preferred primary, PostgreSQL on port %d) and %s (port %d); synchronous=%v maximum_lag_on_failover=%d bytes\n",
		es.ClientURL(), rules.Pair, rules.Primary, ports[rules.Primary], rules.Replica, ports[rules.Replica], rules.Synchronous, rules.MaxLagOnFailover)
	observe := func(t runtime.Transition) { say(t.Site, "%s", runtime.DescribeEvent(t.Event)) }
	sites := map[string]*demoSite{}
	defer func() {
		for _, s := range sites {
			if s.host != nil {
				s.host.Stop(context.Background())
			}
			if s.nc != nil {
				s.nc.Close()
			}
		}
	}()
	for _, name := range []string{rules.Primary, rules.Replica} {
		other := rules.Other(name)
		cfg := postgres.Config{
			DataDir: filepath.Join(dataDir, name, "data"), Port: ports[name], Listen: "127.0.0.1",
			Peer:        "127.0.0.1:" + strconv.Itoa(ports[other]),
			Replication: postgres.ReplicationConfig{Password: password},
		}
		if err := os.MkdirAll(filepath.Join(dataDir, name), 0o755); err != nil {
			return err
		}
		if err := cfg.Validate("postgres"); err != nil {
			return fmt.Errorf("site %s: %w", name, err)
		}
		nc, err := nats.Connect(es.ClientURL(), nats.Name("understudy-demo-"+name))
		if err != nil {
			return err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return err
		}
		site := &demoSite{name: name, cfg: cfg, nc: nc}
		sites[name] = site
		mc := runtime.MemberConfig{Rules: rules, Site: name, Postgres: &site.cfg,
			Options: failover.Options{Rejoin: true, Positions: true, Synchronizer: true}}
		site.host, err = runtime.StartHost(ctx, js, names.EventsStream, names.FailoverBucket, []runtime.MemberConfig{mc},
			runtime.HostOptions{Logger: logger.With("node", name), Observe: observe})
		if err != nil {
			return err
		}
	}
	w := newDemoWriter(sites[rules.Primary].cfg, sites[rules.Replica].cfg, rules)
	wctx, stopWriter := context.WithCancel(ctx)
	defer stopWriter()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); w.run(wctx, say) }()

	// A power cut comes at any moment of the heartbeat cycle: a random
	// phase, or every run would measure the same point of it.
	jitter := time.Duration(mrand.Int64N(int64(rules.HeartbeatTimeout)))
	select {
	case <-time.After(killAfter + jitter):
	case <-ctx.Done():
		return ctx.Err()
	}
	// Wait (bounded) until the pair is whole: a primary taking writes and a
	// streaming replica, or the power cut would only show a bootstrap.
	if err := w.waitWrites(ctx, rules.Primary, 30*time.Second); err != nil {
		return fmt.Errorf("before the power cut: %w", err)
	}
	faultAt := time.Now()
	say(rules.Primary, "POWER CUT: NATS link cut, postmaster and backends SIGKILLed, node stopped")
	powerCut(sites[rules.Primary])
	window := 4*rules.FailoverTimeout + 10*rules.HeartbeatTimeout
	first, site := w.firstAckAfter(ctx, faultAt, rules.Primary, window)
	if first != nil {
		// Let the writer run on the new primary a moment, then stop it.
		time.Sleep(2 * time.Second)
	}
	stopWriter()
	wg.Wait()
	sum := postgresDemoSummary{Pair: rules.Pair, Primary: rules.Primary, Replica: rules.Replica, FaultAt: faultAt, FirstWriteMS: -1,
		Synchronous: rules.Synchronous.String(), MaxLagBytes: rules.MaxLagOnFailover}
	if first != nil {
		sum.FirstWriteMS = float64(first.Sub(faultAt).Microseconds()) / 1000
		sum.Promoted = site
		lost, err := w.lost(ctx, sites[site].cfg)
		if err != nil {
			return fmt.Errorf("reading the new primary's table: %w", err)
		}
		sum.LostWrites = len(lost)
		sum.LostSample = lost[:min(len(lost), 10)]
	}
	sum.AckedWrites = w.ackedCount()
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(sum)
	}
	fmt.Fprintf(stdout, "\nsummary\n")
	fmt.Fprintf(stdout, "  %s lost power at %s (%.3fs into the run)\n", sum.Primary, faultAt.Format("15:04:05.000"), faultAt.Sub(start).Seconds())
	if first == nil {
		fmt.Fprintf(stdout, "  NO COMMIT was accepted within %v of the power cut\n", window)
	} else {
		fmt.Fprintf(stdout, "  first commit accepted by %s    %.0f ms after the power cut\n", site, sum.FirstWriteMS)
	}
	fmt.Fprintf(stdout, "  commits acknowledged           %d\n", sum.AckedWrites)
	fmt.Fprintf(stdout, "  acknowledged commits lost      %d (synchronous: %s, maximum_lag_on_failover %d bytes)\n", sum.LostWrites, sum.Synchronous, sum.MaxLagBytes)
	return nil
}

// powerCut makes site's machine lose power as far as one process can: its
// NATS connection closes at once (no goodbye), its PostgreSQL's whole
// process group is SIGKILLed (no shutdown, no last WAL sent), and its
// node's members stop.
func powerCut(s *demoSite) {
	s.nc.Close()
	if pid := postmasterPID(s.cfg.DataDir); pid > 0 {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	h := s.host
	s.host = nil
	go h.Stop(context.Background())
}

// postmasterPID reads the postmaster's pid from its data directory (0:
// none).
func postmasterPID(dataDir string) int {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

// demoWriter commits an increasing counter through a connection to
// whichever site accepts writes, and remembers every acknowledged value.
type demoWriter struct {
	conninfo string
	sites    map[int]string // site by server port
	mu       sync.Mutex
	acked    []int64
	ackAt    []time.Time
	ackSite  []string
}

func newDemoWriter(a, b postgres.Config, rules failover.Rules) *demoWriter {
	// Both servers' private sockets, read-write only: libpq's way of
	// finding the primary (docs/postgres.md shows the TCP form).
	conninfo := fmt.Sprintf("host=%s,%s port=%d,%d user=postgres dbname=postgres target_session_attrs=read-write connect_timeout=1",
		a.DataDir+".understudy", b.DataDir+".understudy", a.Port, b.Port)
	return &demoWriter{conninfo: conninfo, sites: map[int]string{a.Port: rules.Primary, b.Port: rules.Replica}}
}

func (w *demoWriter) run(ctx context.Context, say func(site, format string, args ...any)) {
	var conn *pgx.Conn
	var connSite string
	next := int64(1)
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		if conn == nil {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			c, err := pgx.Connect(cctx, w.conninfo)
			cancel()
			if err != nil {
				sleepCtx(ctx, 50*time.Millisecond)
				continue
			}
			conn = c
			connSite = w.siteOf(c)
			if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS demo_counter (n bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())"); err != nil {
				_ = conn.Close(context.Background())
				conn = nil
				continue
			}
			say("writer", "writing to %s", connSite)
		}
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := conn.Exec(cctx, "INSERT INTO demo_counter (n) VALUES ($1) ON CONFLICT DO NOTHING", next)
		cancel()
		if err != nil {
			_ = conn.Close(context.Background())
			conn = nil
			continue
		}
		w.mu.Lock()
		w.acked, w.ackAt, w.ackSite = append(w.acked, next), append(w.ackAt, time.Now()), append(w.ackSite, connSite)
		w.mu.Unlock()
		next++
		sleepCtx(ctx, 10*time.Millisecond)
	}
}

// siteOf names the site the connection reached, by the server's port.
func (w *demoWriter) siteOf(c *pgx.Conn) string {
	var port int
	if err := c.QueryRow(context.Background(), "SELECT current_setting('port')::int").Scan(&port); err != nil {
		return "?"
	}
	if s, ok := w.sites[port]; ok {
		return s
	}
	return "?"
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}

// waitWrites waits until site has acknowledged a commit in the last second.
func (w *demoWriter) waitWrites(ctx context.Context, site string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		w.mu.Lock()
		n := len(w.ackAt)
		ok := n > 0 && w.ackSite[n-1] == site && time.Since(w.ackAt[n-1]) < time.Second
		w.mu.Unlock()
		if ok {
			return nil
		}
		sleepCtx(ctx, 50*time.Millisecond)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return fmt.Errorf("no commit acknowledged by %s within %v", site, limit)
}

// firstAckAfter waits for the first commit acknowledged after t by a site
// other than old, within window.
func (w *demoWriter) firstAckAfter(ctx context.Context, t time.Time, old string, window time.Duration) (*time.Time, string) {
	deadline := t.Add(window)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		w.mu.Lock()
		for i := len(w.ackAt) - 1; i >= 0 && w.ackAt[i].After(t); i-- {
			if w.ackSite[i] != old && (i == 0 || !w.ackAt[i-1].After(t) || w.ackSite[i-1] == old) {
				at, site := w.ackAt[i], w.ackSite[i]
				w.mu.Unlock()
				return &at, site
			}
		}
		w.mu.Unlock()
		sleepCtx(ctx, 20*time.Millisecond)
	}
	return nil, ""
}

func (w *demoWriter) ackedCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

// lost returns the acknowledged counter values missing on cfg's server.
func (w *demoWriter) lost(ctx context.Context, cfg postgres.Config) ([]int64, error) {
	conninfo := fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres connect_timeout=2", cfg.DataDir+".understudy", cfg.Port)
	c, err := pgx.Connect(ctx, conninfo)
	if err != nil {
		return nil, err
	}
	defer c.Close(context.Background())
	rows, err := c.Query(ctx, "SELECT n FROM demo_counter")
	if err != nil {
		return nil, err
	}
	have := map[int64]bool{}
	for rows.Next() {
		var n int64
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		have[n] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var lost []int64
	for _, n := range w.acked {
		if !have[n] {
			lost = append(lost, n)
		}
	}
	slices.Sort(lost)
	return lost, nil
}
