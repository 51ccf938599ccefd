package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"understudy/actors"
	"understudy/actors/capability"
	"understudy/events/porttest"
)

// The tests run real PostgreSQL 15 servers (Debian's postgresql-15) as the
// postgres user, with the test binary itself as the keeper.

const pgBin = "/usr/lib/postgresql/15/bin"

func TestMain(m *testing.M) {
	if os.Getenv(keeperEnv) == "1" {
		os.Exit(KeeperMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func needPostgres(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(pgBin, "initdb")); err != nil {
		t.Skip("!!! SKIPPED: capabilities/postgres needs PostgreSQL 15 (apt-get install postgresql-15): " + pgBin + "/initdb is missing !!!")
	}
	if os.Geteuid() != 0 {
		t.Skip("!!! SKIPPED: capabilities/postgres tests run as root (they run PostgreSQL as the postgres user) !!!")
	}
}

// testDir is a directory the postgres user can traverse, removed at the end.
func testDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "understudy-pg-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// freePort returns a free TCP port on loopback, below the kernel's
// ephemeral range (porttest).
func freePort(t *testing.T) int {
	t.Helper()
	ports, err := porttest.Free(1)
	if err != nil {
		t.Fatal(err)
	}
	return ports[0]
}

type site struct {
	*Postgres
	name string
	port int
}

// newSite makes the member of site name whose peer (peerName) listens on
// peerPort.
func newSite(t *testing.T, dir, name, peerName string, port, peerPort int, grace time.Duration, edits ...func(*Config)) *site {
	t.Helper()
	cfg := Config{
		DataDir:     filepath.Join(dir, name, "data"),
		Port:        port,
		Peer:        fmt.Sprintf("127.0.0.1:%d", peerPort),
		Replication: ReplicationConfig{Password: `s3cr:et'\pw`},
		Parameters: map[string]string{
			"fsync": "off", "shared_buffers": "16MB", "max_connections": "20",
			"wal_keep_size": "64MB", "log_min_messages": "warning",
		},
		KeeperCommand: []string{os.Args[0]},
	}
	for _, edit := range edits {
		edit(&cfg)
	}
	if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate("pairs[0].postgres"); err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})).With("site", name)
	p, err := New(cfg, Member{Pair: "db", Site: name, PeerSite: peerName, FenceGrace: grace, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Logf("close %s: %v", name, err)
		}
	})
	return &site{Postgres: p, name: name, port: port}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// newPair makes sites a and b, each the other's peer.
func newPair(t *testing.T, edits ...func(*Config)) (a, b *site) {
	dir := testDir(t)
	pa, pb := freePort(t), freePort(t)
	return newSite(t, dir, "site-a", "site-b", pa, pb, 0, edits...), newSite(t, dir, "site-b", "site-a", pb, pa, 0, edits...)
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func req(s *site, leader string) capability.Request {
	return capability.Request{Pair: "db", Site: s.name, Leader: leader, Term: 1}
}

func mustExec(t *testing.T, s *site, sql string, args ...any) {
	t.Helper()
	ctx := ctxFor(t, 10*time.Second)
	c, err := s.connect(ctx, 2*time.Second)
	if err != nil {
		t.Fatalf("%s: connect: %v", s.name, err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %s: %v", s.name, sql, err)
	}
}

func count(t *testing.T, s *site, table string) int {
	t.Helper()
	ctx := ctxFor(t, 10*time.Second)
	c, err := s.connect(ctx, 2*time.Second)
	if err != nil {
		t.Fatalf("%s: connect: %v", s.name, err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatalf("%s: count %s: %v", s.name, table, err)
	}
	return n
}

// eventually polls f until it returns nil, failing after d.
func eventually(t *testing.T, d time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, d, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func check(t *testing.T, s *site, serving bool) (capability.Status, error) {
	t.Helper()
	r := req(s, "")
	r.Serving = serving
	return s.Check(ctxFor(t, 5*time.Second), r)
}

func postmasterPID(s *site) int {
	if k := s.keeper.Load(); k != nil {
		pid, _ := k.running()
		return pid
	}
	return 0
}

// bootstrap makes s a fresh primary.
func bootstrap(t *testing.T, s *site) {
	t.Helper()
	r := req(s, s.name)
	r.Reason = "restart"
	if err := s.Fence(ctxFor(t, 5*time.Second), r); err != nil {
		t.Fatalf("restart fence: %v", err)
	}
	r.Bootstrap = true
	r.Reason = "bootstrap"
	if err := s.Promote(ctxFor(t, 60*time.Second), r); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
}

// The life of a pair: bootstrap, clone, streaming, synchronous commit,
// fences of both roles, failover, and the old primary's return by
// pg_rewind.
func TestPairFailoverAndRewind(t *testing.T) {
	needPostgres(t)
	a, b := newPair(t)
	bootstrap(t, a)
	st, err := check(t, a, true)
	if err != nil || st.Role != capability.RolePrimary || st.Flush == 0 || st.Timeline != 1 {
		t.Fatalf("check of the new primary: %+v, %v", st, err)
	}
	mustExec(t, a, "CREATE TABLE t (id serial PRIMARY KEY, v text)")

	// The replica clones the primary (pg_basebackup) and streams.
	if err := b.Fence(ctxFor(t, 5*time.Second), req(b, "site-a")); err != nil {
		t.Fatalf("fence of the empty replica: %v", err)
	}
	start := time.Now()
	if err := b.Rejoin(ctxFor(t, 60*time.Second), req(b, "site-a")); err != nil {
		t.Fatalf("rejoin by clone: %v", err)
	}
	t.Logf("clone and stream took %s", time.Since(start).Round(time.Millisecond))
	sb, err := check(t, b, false)
	if err != nil || sb.Role != capability.RoleStandby || !sb.Streaming {
		t.Fatalf("check of the cloned replica: %+v, %v", sb, err)
	}
	eventually(t, 10*time.Second, "the primary sees its peer streaming", func() error {
		st, err := check(t, a, true)
		if err == nil && !st.PeerStreaming {
			err = errors.New(st.Detail)
		}
		return err
	})

	// Positions move as rows are written, and the standby catches up.
	before, _ := check(t, a, true)
	mustExec(t, a, "INSERT INTO t (v) SELECT repeat('x', 100) FROM generate_series(1, 2000)")
	after, _ := check(t, a, true)
	if after.Flush <= before.Flush {
		t.Fatalf("flush did not move: %s then %s", before.Flush, after.Flush)
	}
	eventually(t, 10*time.Second, "the standby replays what the primary flushed", func() error {
		sb, err := check(t, b, false)
		if err != nil {
			return err
		}
		if sb.Receive < after.Flush || sb.Replay < after.Flush {
			return fmt.Errorf("standby received %s replayed %s, primary flushed %s (lag %d bytes)", sb.Receive, sb.Replay, after.Flush, capability.Lag(after.Flush, sb.Replay))
		}
		return nil
	})
	if n := count(t, b, "t"); n != 2000 {
		t.Fatalf("standby has %d rows, want 2000", n)
	}

	// Synchronous on: seen in Check; a commit waits while the standby is down.
	sync := req(a, "site-a")
	sync.Synchronous = true
	if err := a.SetSynchronous(ctxFor(t, 10*time.Second), sync); err != nil {
		t.Fatalf("set synchronous: %v", err)
	}
	eventually(t, 10*time.Second, "the peer is synchronous", func() error {
		st, err := check(t, a, true)
		if err == nil && (!st.PeerSynchronous || !st.SynchronousSet) {
			err = errors.New(st.Detail)
		}
		return err
	})
	mustExec(t, a, "INSERT INTO t (v) VALUES ('sync')") // the standby acks
	if err := b.stopImmediate(ctxFor(t, 5*time.Second), b.keeper.Load()); err != nil {
		t.Fatal(err)
	}
	blocked := func() error {
		ctx := ctxFor(t, 10*time.Second)
		c, err := a.connect(ctx, 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "SET synchronous_commit = on"); err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
		defer cancel()
		_, err = c.Exec(wctx, "INSERT INTO t (v) VALUES ('waits')")
		return err
	}
	if err := blocked(); err == nil {
		t.Fatal("a commit returned while synchronous and the standby is down")
	}
	if err := b.Rejoin(ctxFor(t, 30*time.Second), req(b, "site-a")); err != nil {
		t.Fatalf("rejoin of the stopped standby: %v", err)
	}
	sync.Synchronous = false
	if err := a.SetSynchronous(ctxFor(t, 10*time.Second), sync); err != nil {
		t.Fatalf("set asynchronous: %v", err)
	}
	eventually(t, 10*time.Second, "the peer is asynchronous", func() error {
		st, err := check(t, a, true)
		if err == nil && (st.PeerSynchronous || st.SynchronousSet || !st.PeerStreaming) {
			err = errors.New(st.Detail)
		}
		return err
	})

	// Fence of the standby keeps it streaming.
	if err := b.Fence(ctxFor(t, 5*time.Second), req(b, "")); err != nil {
		t.Fatalf("fence of the standby: %v", err)
	}
	if sb, err := check(t, b, false); err != nil || !sb.Streaming {
		t.Fatalf("the fenced standby does not stream: %+v %v", sb, err)
	}

	// The standby stops (a power cut) and the primary takes writes it will
	// lose: its history diverges from the one the standby promotes.
	if err := b.stopImmediate(ctxFor(t, 5*time.Second), b.keeper.Load()); err != nil {
		t.Fatal(err)
	}
	mustExec(t, a, "CREATE TABLE lost AS SELECT generate_series(1, 1000) AS id")

	// Fence of the primary stops it within the budget.
	pid := postmasterPID(a)
	start = time.Now()
	if err := a.Fence(ctxFor(t, 5*time.Second), req(a, "")); err != nil {
		t.Fatalf("fence of the primary: %v", err)
	}
	took := time.Since(start)
	t.Logf("fence of the primary took %s (budget %s)", took, a.FenceBudget())
	if took > a.FenceBudget() {
		t.Fatalf("fence took %s, over its budget %s", took, a.FenceBudget())
	}
	if alive(pid) || postmasterPID(a) != 0 {
		t.Fatalf("postmaster %d still runs after the fence", pid)
	}
	if st, err := check(t, a, true); err == nil || st.Role != capability.RoleDown {
		t.Fatalf("check of the fenced primary: %+v, %v", st, err)
	}

	// Failover: the standby (stopped) is promoted and accepts writes.
	pr := req(b, "site-b")
	pr.Term = 2
	pr.Reason = "takeover"
	if err := b.Promote(ctxFor(t, 60*time.Second), pr); err != nil {
		t.Fatalf("promote of the standby: %v", err)
	}
	if err := b.Promote(ctxFor(t, 60*time.Second), pr); err != nil {
		t.Fatalf("promote of a primary (idempotent): %v", err)
	}
	sb, err = check(t, b, true)
	if err != nil || sb.Role != capability.RolePrimary || sb.Timeline != 2 {
		t.Fatalf("check of the promoted standby: %+v, %v", sb, err)
	}
	mustExec(t, b, "INSERT INTO t (v) SELECT 'after failover' FROM generate_series(1, 10)")
	want := count(t, b, "t")

	// The old primary comes back by pg_rewind and streams from the new one.
	if err := a.Rejoin(ctxFor(t, 5*time.Second), req(a, "site-a")); err == nil {
		t.Fatal("rejoin following this very site succeeded")
	}
	start = time.Now()
	if err := a.Rejoin(ctxFor(t, 60*time.Second), req(a, "site-b")); err != nil {
		t.Fatalf("rejoin of the old primary: %v", err)
	}
	t.Logf("rewind and stream took %s", time.Since(start).Round(time.Millisecond))
	if _, err := os.Stat(a.cfg.DataDir + ".old"); err == nil {
		t.Fatal("the old primary was cloned again, not rewound")
	}
	if n := count(t, a, "pg_class WHERE relname = 'lost'"); n != 0 {
		t.Fatal("the rewound standby still has the writes its old timeline took after the fork")
	}
	st, err = check(t, a, false)
	if err != nil || st.Role != capability.RoleStandby || !st.Streaming || st.Timeline != 2 {
		t.Fatalf("check of the rewound standby: %+v, %v", st, err)
	}
	mustExec(t, b, "INSERT INTO t (v) VALUES ('seen by the old primary')")
	eventually(t, 10*time.Second, "the rewound standby has the new primary's rows", func() error {
		if n := count(t, a, "t"); n != want+1 {
			return fmt.Errorf("%d rows, want %d", n, want+1)
		}
		return nil
	})
}

// Demote: a fast shutdown the standby receives everything of; then the
// old primary rejoins (nothing to rewind) and the other is promoted.
func TestDemoteAndSwitchover(t *testing.T) {
	needPostgres(t)
	a, b := newPair(t)
	bootstrap(t, a)
	if err := b.Rejoin(ctxFor(t, 60*time.Second), req(b, "site-a")); err != nil {
		t.Fatalf("rejoin by clone: %v", err)
	}
	mustExec(t, a, "CREATE TABLE t AS SELECT generate_series(1, 500) AS id")
	if err := a.Demote(ctxFor(t, 30*time.Second), req(a, "")); err != nil {
		t.Fatalf("demote: %v", err)
	}
	if postmasterPID(a) != 0 {
		t.Fatal("the demoted primary still runs")
	}
	pr := req(b, "site-b")
	pr.Term = 2
	if err := b.Promote(ctxFor(t, 60*time.Second), pr); err != nil {
		t.Fatalf("promote: %v", err)
	}
	if n := count(t, b, "t"); n != 500 {
		t.Fatalf("the new primary has %d rows, want 500", n)
	}
	if err := a.Rejoin(ctxFor(t, 60*time.Second), req(a, "site-b")); err != nil {
		t.Fatalf("rejoin of the demoted primary: %v", err)
	}
	if st, err := check(t, a, false); err != nil || !st.Streaming {
		t.Fatalf("check: %+v, %v", st, err)
	}
}

func TestPromoteWithoutBootstrapOnEmptyDataFails(t *testing.T) {
	needPostgres(t)
	dir := testDir(t)
	s := newSite(t, dir, "site-a", "site-b", freePort(t), freePort(t), 0)
	err := s.Promote(ctxFor(t, 10*time.Second), req(s, "site-a"))
	if err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("promote of an empty data directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.cfg.DataDir, "PG_VERSION")); err == nil {
		t.Fatal("promote without bootstrap ran initdb")
	}
}

// The node's death (its end of the pipe closes) stops PostgreSQL at once.
func TestKeeperStopsPostgresWhenTheNodeDies(t *testing.T) {
	needPostgres(t)
	dir := testDir(t)
	s := newSite(t, dir, "site-a", "site-b", freePort(t), freePort(t), 0)
	bootstrap(t, s)
	pid := postmasterPID(s)
	k := s.keeper.Load()
	start := time.Now()
	k.writeMu.Lock()
	_ = k.stdin.Close() // what the kernel does when the node dies
	k.writeMu.Unlock()
	eventually(t, 3*time.Second, "the postmaster is gone", func() error {
		if alive(pid) || len(procsIn(s.cfg.DataDir)) > 0 {
			return fmt.Errorf("postmaster %d or its backends still run", pid)
		}
		return nil
	})
	t.Logf("PostgreSQL stopped %s after the node's pipe closed", time.Since(start).Round(time.Millisecond))
	<-k.done
	// The next call starts a new keeper; the data is there to start again.
	r := req(s, "site-a")
	r.Reason = "restart"
	if err := s.Fence(ctxFor(t, 5*time.Second), r); err != nil {
		t.Fatalf("fence after the keeper's exit: %v", err)
	}
	if err := s.Promote(ctxFor(t, 30*time.Second), r); err != nil {
		t.Fatalf("promote after the keeper's exit: %v", err)
	}
}

// Armed and not petted for the grace (the node is paused): the keeper stops
// PostgreSQL; petted, it does not.
func TestKeeperStopsAnArmedPostgresWithoutPets(t *testing.T) {
	needPostgres(t)
	dir := testDir(t)
	const grace = 400 * time.Millisecond
	s := newSite(t, dir, "site-a", "site-b", freePort(t), freePort(t), grace)
	stopPets := make(chan struct{})
	petted := make(chan struct{})
	go func() {
		defer close(petted)
		for {
			select {
			case <-stopPets:
				return
			case <-time.After(grace / 4):
				s.Pet()
			}
		}
	}()
	bootstrap(t, s)
	time.Sleep(3 * grace) // petted: still running
	pid := postmasterPID(s)
	if pid == 0 || !alive(pid) {
		t.Fatal("PostgreSQL stopped although the node pets the keeper")
	}
	close(stopPets)
	<-petted
	start := time.Now()
	eventually(t, 3*time.Second, "the keeper stops the unpetted primary", func() error {
		if alive(pid) {
			return errors.New("still running")
		}
		return nil
	})
	t.Logf("stopped %s after the last pet (grace %s)", time.Since(start).Round(time.Millisecond), grace)
	eventually(t, 2*time.Second, "check reports the keeper's stop", func() error {
		st, err := check(t, s, true)
		if err == nil || st.Role != capability.RoleDown || !strings.Contains(err.Error(), "keeper stopped it") {
			return fmt.Errorf("%+v, %v", st, err)
		}
		return nil
	})
}

// A postmaster this node did not start, found in the data directory, is
// stopped by the restart fence.
func TestForeignPostmasterIsStoppedAtFence(t *testing.T) {
	needPostgres(t)
	dir := testDir(t)
	port := freePort(t)
	s := newSite(t, dir, "site-a", "site-b", port, freePort(t), 0)
	bootstrap(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Behind understudy's back: pg_ctl as postgres, as a primary.
	cmd := exec.Command("runuser", "-u", "postgres", "--", filepath.Join(pgBin, "pg_ctl"), "-D", s.cfg.DataDir, "-l", filepath.Join(s.run, "manual.log"), "-w", "-o",
		fmt.Sprintf("-c port=%d -c unix_socket_directories=%s -c hba_file=%s/pg_hba.conf", port, s.run, s.run), "start")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pg_ctl start: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(s.cfg.DataDir, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	if !isPostmasterOf(pid, s.cfg.DataDir) {
		t.Fatalf("pid %d from postmaster.pid is not a postmaster in the data directory", pid)
	}
	if _, err := s.keeperFor(); err != nil { // the node restarts: a new keeper
		t.Fatal(err)
	}
	r := req(s, "")
	r.Reason = "restart"
	if err := s.Fence(ctxFor(t, 5*time.Second), r); err != nil {
		t.Fatalf("restart fence: %v", err)
	}
	if alive(pid) || len(procsIn(s.cfg.DataDir)) > 0 {
		t.Fatalf("the foreign postmaster %d survived the restart fence", pid)
	}
}

// A follower found running as a primary it did not promote is stopped by
// Check.
func TestCheckStopsAFollowerThatIsAPrimary(t *testing.T) {
	needPostgres(t)
	dir := testDir(t)
	s := newSite(t, dir, "site-a", "site-b", freePort(t), freePort(t), 0)
	bootstrap(t, s)
	s.armed.Store(false) // as if started as a standby and promoted by hand
	st, err := check(t, s, false)
	if err == nil || !strings.Contains(err.Error(), "behind understudy's back") {
		t.Fatalf("check of a follower that is a primary: %+v, %v", st, err)
	}
	if postmasterPID(s) != 0 {
		t.Fatal("the follower's primary still runs")
	}
}

func TestValidate(t *testing.T) {
	var ce *actors.ConfigError
	base := func() Config {
		return Config{DataDir: "/var/lib/postgresql/15/main", Peer: "10.0.0.2:5432", RunAs: "postgres", Replication: ReplicationConfig{Password: "x"}}
	}
	if _, err := os.Stat(filepath.Join(pgBin, "initdb")); err == nil {
		c := base()
		if err := c.Validate("p"); err != nil {
			t.Fatalf("valid config: %v", err)
		}
		if c.Port != 5432 || c.Listen != "127.0.0.1" || c.Superuser != "postgres" || c.Replication.User != "replicator" || c.BinDir != pgBin {
			t.Fatalf("defaults: %+v", c)
		}
	}
	for _, tc := range []struct {
		name  string
		edit  func(*Config)
		field string
		want  string
	}{
		{"no data dir", func(c *Config) { c.DataDir = "" }, "p.data_dir", "required"},
		{"relative data dir", func(c *Config) { c.DataDir = "data" }, "p.data_dir", "absolute"},
		{"missing binaries", func(c *Config) { c.Version = 11 }, "p.version", "postgresql-11"},
		{"bad bin dir", func(c *Config) { c.BinDir = "/nonexistent" }, "p.bin_dir", "install the Debian package"},
		{"no peer", func(c *Config) { c.Peer = "" }, "p.peer", "required"},
		{"peer without port", func(c *Config) { c.Peer = "db2" }, "p.peer", "host:port"},
		{"managed parameter", func(c *Config) { c.Parameters = map[string]string{"port": "1"} }, "p.parameters.port", "understudy sets"},
		{"no password", func(c *Config) { c.Replication.Password = "" }, "p.replication.password", "required unless tls"},
		{"half tls", func(c *Config) { c.TLS.CA = "/x" }, "p.tls", "together"},
		{"unknown user", func(c *Config) { c.RunAs = "no-such-user-here" }, "p.run_as", "no such OS user"},
		{"root", func(c *Config) { c.RunAs = "root" }, "p.run_as", "refuses to run as root"},
		{"hba line break", func(c *Config) { c.HBA = []string{"host all all 0/0 trust\nlocal all all trust"} }, "p.hba[0]", "no line breaks"},
		{"hba not a rule", func(c *Config) { c.HBA = []string{"host all"} }, "p.hba[0]", "type, database, user"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.edit(&c)
			err := c.Validate("p")
			if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a ConfigError on %s saying %q", err, tc.field, tc.want)
			}
		})
	}
}

func TestSlotName(t *testing.T) {
	for in, want := range map[string]string{"site-b": "understudy_site_b", "Paris.1": "understudy_paris_1"} {
		if got := slotName(in); got != want {
			t.Errorf("slotName(%q) = %q, want %q", in, got, want)
		}
	}
}

// pg_rewind fails (its source refuses it the functions it reads with): the
// old primary's data is moved aside and cloned again.
func TestRejoinClonesAgainWhenRewindFails(t *testing.T) {
	needPostgres(t)
	a, b := newPair(t)
	bootstrap(t, a)
	if err := b.Rejoin(ctxFor(t, 60*time.Second), req(b, "site-a")); err != nil {
		t.Fatalf("rejoin by clone: %v", err)
	}
	if err := a.Fence(ctxFor(t, 5*time.Second), req(a, "")); err != nil {
		t.Fatal(err)
	}
	pr := req(b, "site-b")
	pr.Term = 2
	if err := b.Promote(ctxFor(t, 60*time.Second), pr); err != nil {
		t.Fatalf("promote: %v", err)
	}
	mustExec(t, b, "REVOKE EXECUTE ON FUNCTION pg_catalog.pg_read_binary_file(text) FROM replicator")
	mustExec(t, b, "CREATE TABLE after AS SELECT 1 AS id")
	if err := a.Rejoin(ctxFor(t, 60*time.Second), req(a, "site-b")); err != nil {
		t.Fatalf("rejoin: %v", err)
	}
	if _, err := os.Stat(filepath.Join(a.cfg.DataDir+".old", "PG_VERSION")); err != nil {
		t.Fatalf("the old data directory was not moved aside: %v", err)
	}
	if st, err := check(t, a, false); err != nil || !st.Streaming || st.Timeline != 2 {
		t.Fatalf("check of the cloned standby: %+v, %v", st, err)
	}
	if n := count(t, a, "after"); n != 1 {
		t.Fatalf("the clone has %d rows of the new primary's table, want 1", n)
	}
}

// The leader removed the WAL a stopped standby needs (its slot exceeded
// max_slot_wal_keep_size): Rejoin clones it again.
func TestRejoinClonesAgainWhenTheLeaderRemovedTheWAL(t *testing.T) {
	needPostgres(t)
	a, b := newPair(t, func(c *Config) {
		c.Parameters["max_slot_wal_keep_size"] = "1MB"
		c.Parameters["wal_keep_size"] = "0"
	})
	bootstrap(t, a)
	if err := b.Rejoin(ctxFor(t, 60*time.Second), req(b, "site-a")); err != nil {
		t.Fatalf("rejoin by clone: %v", err)
	}
	if err := b.stopImmediate(ctxFor(t, 5*time.Second), b.keeper.Load()); err != nil {
		t.Fatal(err)
	}
	mustExec(t, a, "CREATE TABLE t (v text)")
	for i := 0; i < 4; i++ {
		mustExec(t, a, "INSERT INTO t SELECT repeat('x', 1000) FROM generate_series(1, 1000)")
		mustExec(t, a, "SELECT pg_switch_wal()")
	}
	mustExec(t, a, "CHECKPOINT")
	if n := count(t, a, "pg_replication_slots WHERE slot_name = 'understudy_site_b' AND wal_status = 'lost'"); n != 1 {
		t.Fatal("the standby's slot was not invalidated: the test proves nothing")
	}
	if err := b.Rejoin(ctxFor(t, 60*time.Second), req(b, "site-a")); err != nil {
		t.Fatalf("rejoin: %v", err)
	}
	if _, err := os.Stat(filepath.Join(b.cfg.DataDir+".old", "PG_VERSION")); err != nil {
		t.Fatalf("the old data directory was not moved aside: %v", err)
	}
	if n := count(t, b, "t"); n != 4000 {
		t.Fatalf("the clone has %d rows, want 4000", n)
	}
}

// Creating the peer's replication slot races the peer's own clone, whose
// pg_basebackup -C creates the same slot on this server: the pair suite's
// TestFailbackAfterRewind once had the slot appear between the check and
// the create, and the handoff's promotion failed on it (duplicate_object)
// and handed the pair back to a site whose clone had just been cut off.
// A slot created twice is PostgreSQL's 42710, which duplicateObject takes
// for done; any other error is not.
func TestSlotCreatedTwiceIsDone(t *testing.T) {
	needPostgres(t)
	dir := testDir(t)
	s := newSite(t, dir, "site-a", "site-b", freePort(t), freePort(t), 0)
	bootstrap(t, s)
	ctx := ctxFor(t, 10*time.Second)
	c, err := s.connect(ctx, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	slot := slotName("site-b")
	// The bootstrap created the peer's slot; a second create meets it.
	_, err = c.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, true)", slot)
	if err == nil || !duplicateObject(err) {
		t.Fatalf("creating slot %s again: %v; want duplicate_object (42710)", slot, err)
	}
	if _, err := c.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, true)", "not a valid slot name"); err == nil || duplicateObject(err) {
		t.Fatalf("an invalid slot name: %v; want an error other than duplicate_object", err)
	}
}
