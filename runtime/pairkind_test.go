package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"understudy/actors/agent"
	"understudy/actors/failover"
	"understudy/actors/resources"
	"understudy/events"
	"understudy/events/porttest"
)

// pairDoc is a valid pair manifest document; edit changes it.
func pairDoc(edit func(map[string]any)) map[string]any {
	doc := map[string]any{
		"kind":    PostgresPairKind,
		"pair":    "pg-main",
		"primary": "site-a",
		"replica": "site-b",
		"sites": map[string]any{
			"site-a": "10.0.1.10",
			"site-b": map[string]any{"address": "10.0.2.10", "agent": "n2"},
		},
		"storage":     "/var/lib/understudy/pg-main",
		"replication": map[string]any{"password_file": "/etc/understudy/replication.pass"},
	}
	if edit != nil {
		edit(doc)
	}
	return doc
}

func TestPostgresPairSpecDefaults(t *testing.T) {
	pm, err := ParsePairManifest(pairDoc(nil))
	if err != nil {
		t.Fatal(err)
	}
	p := pm.Pair
	want := failover.DefaultRules("pg-main", "site-a", "site-b")
	if p.Rules != want {
		t.Errorf("rules = %+v, want the pair file's defaults %+v", p.Rules, want)
	}
	if p.Version != 15 || p.Port != 5432 || p.Replication.User != "" {
		t.Errorf("version %d port %d user %q", p.Version, p.Port, p.Replication.User)
	}
	if got := p.Agents(); got[0] != "site-a" || got[1] != "n2" {
		t.Errorf("agents = %v, want [site-a n2]", got)
	}
	if site, ok := p.SiteOf("n2"); !ok || site != "site-b" {
		t.Errorf("SiteOf(n2) = %s %v", site, ok)
	}
	mc := p.Member("site-b")
	pg := mc.Postgres
	if pg.DataDir != "/var/lib/understudy/pg-main" || pg.Listen != "10.0.2.10" || pg.Peer != "10.0.1.10:5432" || pg.Port != 5432 {
		t.Errorf("site-b's postgres section = %+v", pg)
	}
	if !mc.Options.Rejoin || !mc.Options.Positions || !mc.Options.Synchronizer {
		t.Errorf("options = %+v: a replicating workload's", mc.Options)
	}
	if r := pm.Resource(); r.ID != "pg-main" || r.Kind != PostgresPairKind || r.Spec["kind"] != nil {
		t.Errorf("resource = %+v", r)
	}

	pm, err = ParsePairManifest(pairDoc(func(d map[string]any) {
		d["synchronous"] = "strict"
		d["maximum_lag_on_failover"] = "16MiB"
		d["port"] = 5433
		d["rules"] = map[string]any{"heartbeat_timeout": "250ms", "failure_threshold": 2, "failover_timeout": "2500ms", "fence_grace": "1500ms", "failback": "manual"}
		d["sites"].(map[string]any)["site-a"] = map[string]any{"address": "db-a.example", "listen": "*", "storage": "/srv/pg"}
		d["tls"] = map[string]any{"ca": "/etc/pki/ca.pem", "cert": "/etc/pki/c.pem", "key": "/etc/pki/c.key"}
	}))
	if err != nil {
		t.Fatal(err)
	}
	p = pm.Pair
	if p.Rules.Synchronous != failover.SyncStrict || p.Rules.MaxLagOnFailover != 16<<20 || p.Rules.HeartbeatTimeout != 250*time.Millisecond || p.Rules.Failback != failover.FailbackManual {
		t.Errorf("rules = %+v", p.Rules)
	}
	if a := p.Member("site-a").Postgres; a.Listen != "*" || a.DataDir != "/srv/pg" || a.Port != 5433 || a.Peer != "10.0.2.10:5433" {
		t.Errorf("site-a's postgres section = %+v", a)
	}
	if b := p.Member("site-b").Postgres; b.DataDir != "/var/lib/understudy/pg-main" || b.Peer != "db-a.example:5433" {
		t.Errorf("site-b's postgres section = %+v", b)
	}
}

// Every broken rule is refused at decode, naming the field and the rule.
func TestPostgresPairSpecErrorsNameFieldAndRule(t *testing.T) {
	sites := func(d map[string]any) map[string]any { return d["sites"].(map[string]any) }
	for _, tc := range []struct {
		name, field, rule string
		edit              func(map[string]any)
	}{
		{"no pair", "pair", "required", func(d map[string]any) { delete(d, "pair") }},
		{"pair not an id", "pair", "lower-case letters", func(d map[string]any) { d["pair"] = "PG" }},
		{"no primary", "primary", "required", func(d map[string]any) { delete(d, "primary") }},
		{"same sites", "replica", "must differ from primary", func(d map[string]any) { d["replica"] = "site-a" }},
		{"unknown field", "databse", "unknown field", func(d map[string]any) { d["databse"] = "x" }},
		{"inline password", "replication.password", "password_file", func(d map[string]any) {
			d["replication"] = map[string]any{"password": "hunter2"}
		}},
		{"no secret", "replication.password_file", "required unless tls", func(d map[string]any) { delete(d, "replication") }},
		{"relative password file", "replication.password_file", "absolute path", func(d map[string]any) {
			d["replication"] = map[string]any{"password_file": "pass"}
		}},
		{"half tls", "tls", "ca, cert and key together", func(d map[string]any) { d["tls"] = map[string]any{"ca": "/ca.pem"} }},
		{"synchronous", "synchronous", "", func(d map[string]any) { d["synchronous"] = "maybe" }},
		{"lag", "maximum_lag_on_failover", "size in bytes", func(d map[string]any) { d["maximum_lag_on_failover"] = "lots" }},
		{"heartbeat", "rules.heartbeat_timeout", "duration", func(d map[string]any) { d["rules"] = map[string]any{"heartbeat_timeout": "soon"} }},
		{"safety", "rules.failover_timeout", "safety inequality", func(d map[string]any) { d["rules"] = map[string]any{"failover_timeout": "1s"} }},
		{"fence grace", "rules.fence_grace", "PostgreSQL's fence", func(d map[string]any) {
			d["rules"] = map[string]any{"fence_grace": "100ms", "failover_timeout": "5s"}
		}},
		{"rules field", "rules.heartbeat", "unknown field", func(d map[string]any) { d["rules"] = map[string]any{"heartbeat": "1s"} }},
		{"threshold type", "rules.failure_threshold", "whole number", func(d map[string]any) { d["rules"] = map[string]any{"failure_threshold": "two"} }},
		{"no sites", "sites", "required", func(d map[string]any) { delete(d, "sites") }},
		{"missing site", "sites.site-b", "address of site site-b", func(d map[string]any) { delete(sites(d), "site-b") }},
		{"third site", "sites.site-c", "unknown field", func(d map[string]any) { sites(d)["site-c"] = "10.0.3.10" }},
		{"bad address", "sites.site-a.address", "host name or an IP address", func(d map[string]any) { sites(d)["site-a"] = "10.0.1.10:5432/x" }},
		{"no address", "sites.site-b.address", "required", func(d map[string]any) { sites(d)["site-b"] = map[string]any{"agent": "n2"} }},
		{"one agent", "sites.site-b.agent", "must differ from the primary's", func(d map[string]any) {
			sites(d)["site-b"] = map[string]any{"address": "10.0.2.10", "agent": "site-a"}
		}},
		{"site not an agent id", "sites.SiteA.agent", "set agent", func(d map[string]any) {
			d["primary"] = "SiteA"
			sites(d)["SiteA"] = sites(d)["site-a"]
			delete(sites(d), "site-a")
		}},
		{"no storage", "storage", "required", func(d map[string]any) { delete(d, "storage") }},
		{"relative storage", "storage", "absolute path", func(d map[string]any) { d["storage"] = "pg" }},
		{"root storage", "sites.site-a.storage", "not /", func(d map[string]any) { sites(d)["site-a"] = map[string]any{"address": "a", "storage": "/"} }},
		{"long storage", "storage", "107 bytes", func(d map[string]any) { d["storage"] = "/" + strings.Repeat("x", 100) }},
		{"port", "port", "1 to 65535", func(d map[string]any) { d["port"] = 70000 }},
		{"port type", "port", "whole number", func(d map[string]any) { d["port"] = "5432" }},
		{"version", "version", "major version", func(d map[string]any) { d["version"] = 9 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParsePairManifest(pairDoc(tc.edit))
			var se *resources.SpecError
			if !errors.As(err, &se) {
				t.Fatalf("err = %v, want a *resources.SpecError", err)
			}
			if se.Kind != PostgresPairKind || se.Field != tc.field || !strings.Contains(se.Rule, tc.rule) {
				t.Fatalf("err = %v: want field %s and a rule with %q", err, tc.field, tc.rule)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("the error repeats the password: %v", err)
			}
		})
	}
	if _, err := ParsePairManifest(map[string]any{"kind": "postgres"}); err == nil || !strings.Contains(err.Error(), "kind: must be postgres-pair") {
		t.Errorf("kind postgres: %v", err)
	}
}

// An agent's own manifest may not carry a postgres-pair: it is a manifest
// of its own, reaching both sites.
func TestApplyManifestRefusesPostgresPair(t *testing.T) {
	pm, err := ParsePairManifest(pairDoc(nil))
	if err != nil {
		t.Fatal(err)
	}
	m := agent.Manifest{Agent: "site-a", Resources: []agent.Resource{pm.Resource()}}
	_, _, err = ApplyManifest(context.Background(), nil, m, AgentRegistry(AgentConfig{ID: "site-a"}, resources.NewProcess()), ManifestWriter{})
	var me *agent.ManifestError
	if !errors.As(err, &me) || me.Field != "resources[0].kind" || !strings.Contains(me.Rule, "manifest of its own") {
		t.Fatalf("err = %v", err)
	}
}

// needRealPostgres fails the test without root and PostgreSQL 15, as the
// pair suite does: these tests never skip.
func needRealPostgres(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/usr/lib/postgresql/15/bin/initdb"); err != nil {
		t.Fatalf("PostgreSQL 15 is needed (apt-get install postgresql-15, or scripts/install-test-deps.sh): %v", err)
	}
	if os.Geteuid() != 0 {
		t.Fatal("the postgres-pair tests run as root (PostgreSQL runs as the postgres user)")
	}
}

// pgDir is a directory the postgres user can traverse, removed at the end
// unless the test failed (its servers' logs are in it).
func pgDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "understudy-pair-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kept %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	return dir
}

// freePairPort is a TCP port free on 127.0.0.1 and 127.0.0.2 (the two
// sites' addresses).
func freePairPort(t *testing.T) int {
	t.Helper()
	for range 20 {
		ports, err := porttest.Free(1) // below the ephemeral range: see porttest
		if err != nil {
			t.Fatal(err)
		}
		port := ports[0]
		if l2, err := net.Listen("tcp", fmt.Sprintf("127.0.0.2:%d", port)); err == nil {
			l2.Close()
			return port
		}
	}
	t.Fatal("no port free on both 127.0.0.1 and 127.0.0.2")
	return 0
}

// pairNode is one site's node: a Host and an agent on a NATS connection
// of their own, as `understudy serve` runs them.
type pairNode struct {
	site string
	host *Host
	ag   *Agent
}

func startPairNode(t *testing.T, fn *failoverNATS, site string, logger *slog.Logger) *pairNode {
	t.Helper()
	ctx := context.Background()
	nc := connectTo(t, "nats://"+fn.addr)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	logger = logger.With("node", site)
	host, err := StartHost(ctx, js, fn.names.EventsStream, fn.names.FailoverBucket, nil, HostOptions{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Stop(context.Background()) })
	ag, err := StartAgent(ctx, nc, fn.names.FleetBucket, fn.names.EventsStream, AgentConfig{
		ID: site, Host: host, StateDir: t.TempDir(), pgKeeper: []string{os.Args[0]},
		ObserveInterval: 300 * time.Millisecond, RetryBase: 200 * time.Millisecond, RetryMax: 2 * time.Second,
	}, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ag.Stop)
	return &pairNode{site: site, host: host, ag: ag}
}

// waitAgent polls actual-state.<id> until ok holds.
func waitAgent(t *testing.T, fleet events.KV, id, what string, within time.Duration, ok func(agent.Status) bool) agent.Status {
	t.Helper()
	deadline := time.Now().Add(within)
	var last agent.Status
	for time.Now().Before(deadline) {
		if e, err := fleet.Get(context.Background(), agent.ActualKey(id)); err == nil {
			if last, err = agent.DecodeStatus(e.Value); err != nil {
				t.Fatal(err)
			}
			if ok(last) {
				return last
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("agent %s: %s: not within %v; last status %+v", id, what, within, last)
	return last
}

// pgState is what one query over a site's private socket says: whether
// it is in recovery and its WAL receiver's status.
func pgState(ctx context.Context, dataDir string, port int) (inRecovery bool, receiver string, err error) {
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s.understudy port=%d user=postgres dbname=postgres connect_timeout=2", dataDir, port))
	if err != nil {
		return false, "", err
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return false, "", err
	}
	defer c.Close(context.Background())
	err = c.QueryRow(ctx, "SELECT pg_is_in_recovery(), coalesce((SELECT status FROM pg_stat_wal_receiver), '')").Scan(&inRecovery, &receiver)
	return inRecovery, receiver, err
}

func pgExec(ctx context.Context, dataDir string, port int, sql string) (int64, error) {
	c, err := pgx.Connect(ctx, fmt.Sprintf("host=%s.understudy port=%d user=postgres dbname=postgres connect_timeout=2", dataDir, port))
	if err != nil {
		return 0, err
	}
	defer c.Close(context.Background())
	if strings.HasPrefix(sql, "SELECT") {
		var n int64
		err := c.QueryRow(ctx, sql).Scan(&n)
		return n, err
	}
	_, err = c.Exec(ctx, sql)
	return 0, err
}

// eventually retries f until it succeeds or within passes.
func eventually(t *testing.T, what string, within time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	var err error
	for time.Now().Before(deadline) {
		if err = f(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v: %v", what, within, err)
}

// One applied postgres-pair manifest becomes a pair on two nodes — site-a
// initdb's, serves and takes writes, site-b clones and streams — with no
// node file pairs; a change of storage is refused while it runs; deleting
// it removes both members and stops both servers, and the data
// directories stay.
func TestPostgresPairManifestConverges(t *testing.T) {
	needRealPostgres(t)
	fn := startFailoverNATS(t)
	logger, _ := newLogRecorder(t)
	dir := pgDir(t)
	port := freePairPort(t)
	pass := filepath.Join(dir, "replication.pass")
	if err := os.WriteFile(pass, []byte("s3cr:et'\\pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dataDir := map[string]string{"site-a": filepath.Join(dir, "a", "data"), "site-b": filepath.Join(dir, "b", "data")}
	for _, d := range dataDir {
		if err := os.MkdirAll(filepath.Dir(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	doc := func(storageA string) map[string]any {
		return map[string]any{
			"kind": PostgresPairKind, "pair": "pg-main", "primary": "site-a", "replica": "site-b",
			"sites": map[string]any{
				"site-a": map[string]any{"address": "127.0.0.1", "storage": storageA},
				"site-b": map[string]any{"address": "127.0.0.2", "storage": dataDir["site-b"]},
			},
			"port": port, "synchronous": "off", "maximum_lag_on_failover": "1MiB",
			"rules":       map[string]any{"heartbeat_timeout": "250ms", "failover_timeout": "2500ms", "fence_grace": "1500ms"},
			"replication": map[string]any{"password_file": pass},
			"parameters":  map[string]any{"fsync": "off", "shared_buffers": "16MB", "max_connections": "20", "log_min_messages": "warning"},
		}
	}
	nodes := map[string]*pairNode{}
	for _, site := range []string{"site-a", "site-b"} {
		nodes[site] = startPairNode(t, fn, site, logger)
	}
	ctx := context.Background()
	fleet, err := events.NewJetStreamKV(ctx, fn.js, fn.names.FleetBucket)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := ParsePairManifest(doc(dataDir["site-a"]))
	if err != nil {
		t.Fatal(err)
	}
	applied, err := ApplyPair(ctx, fleet, pm, ManifestWriter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) != 2 || !applied[0].Changed || !applied[1].Changed {
		t.Fatalf("applied = %+v", applied)
	}
	if again, err := ApplyPair(ctx, fleet, pm, ManifestWriter{}); err != nil || again[0].Changed || again[1].Changed {
		t.Fatalf("applying the same pair again: %+v %v (want no write)", again, err)
	}

	// Both members run: each agent converged, the member's phase in its details.
	for site := range nodes {
		waitAgent(t, fleet, site, "pg-main Ready", 60*time.Second, func(s agent.Status) bool {
			r, ok := s.Resources["pg-main"]
			return ok && r.Phase == agent.Ready && s.Converged() && r.Details["site"] == site
		})
		if hm, ok := nodes[site].host.Member("pg-main", site); !ok || !hm.Dynamic || hm.Config.Postgres.DataDir != dataDir[site] {
			t.Fatalf("%s: hosted = %+v %v", site, hm, ok)
		}
	}
	// site-a serves and takes writes; site-b streams them.
	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	eventually(t, "site-a accepts a write", 90*time.Second, func() error {
		if rec, _, err := pgState(wctx, dataDir["site-a"], port); err != nil || rec {
			return fmt.Errorf("in recovery %v: %v", rec, err)
		}
		if _, err := pgExec(wctx, dataDir["site-a"], port, "CREATE TABLE IF NOT EXISTS pair_test (v int)"); err != nil {
			return err
		}
		_, err := pgExec(wctx, dataDir["site-a"], port, "INSERT INTO pair_test VALUES (42)")
		return err
	})
	eventually(t, "site-b streams the write", 90*time.Second, func() error {
		rec, recv, err := pgState(wctx, dataDir["site-b"], port)
		if err != nil || !rec || recv != "streaming" {
			return fmt.Errorf("in recovery %v, receiver %q: %v", rec, recv, err)
		}
		n, err := pgExec(wctx, dataDir["site-b"], port, "SELECT count(*) FROM pair_test WHERE v = 42")
		if err == nil && n == 0 {
			err = errors.New("the row is not there yet")
		}
		return err
	})
	waitAgent(t, fleet, "site-a", "site-a's phase leader in the status", 20*time.Second, func(s agent.Status) bool {
		return s.Resources["pg-main"].Details["phase"] == failover.PhaseLeader.String()
	})

	// Moving site-a's data directory is refused while it runs; site-b,
	// whose member does not change, stays Ready.
	moved, err := ParsePairManifest(doc(filepath.Join(dir, "a", "elsewhere")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ApplyPair(ctx, fleet, moved, ManifestWriter{}); err != nil {
		t.Fatal(err)
	}
	st := waitAgent(t, fleet, "site-a", "the storage change Refused", 20*time.Second, func(s agent.Status) bool {
		r := s.Resources["pg-main"]
		return r.Phase == agent.Refused && r.Generation == s.ManifestGeneration
	})
	if e := st.Resources["pg-main"].Error; !strings.Contains(e, "storage is "+dataDir["site-a"]) || !strings.Contains(e, "runs its previous spec") {
		t.Fatalf("refusal: %s", e)
	}
	waitAgent(t, fleet, "site-b", "site-b Ready for the new generation", 20*time.Second, func(s agent.Status) bool {
		return s.Converged()
	})
	if rec, _, err := pgState(wctx, dataDir["site-a"], port); err != nil || rec {
		t.Fatalf("site-a after the refused change: in recovery %v: %v", rec, err)
	}

	// Delete: both members go, both servers stop, the data stays.
	done, err := DeletePair(ctx, fleet, "pg-main", pm.Pair.Agents(), ManifestWriter{})
	if err != nil || len(done) != 2 || !done[0].Changed || !done[1].Changed {
		t.Fatalf("delete: %+v %v", done, err)
	}
	for site, n := range nodes {
		waitAgent(t, fleet, site, "pg-main gone from the status", 60*time.Second, func(s agent.Status) bool {
			_, ok := s.Resources["pg-main"]
			return !ok && s.Converged()
		})
		if hm, ok := n.host.Member("pg-main", site); ok {
			t.Fatalf("%s: still hosted after the delete: %+v", site, hm.State)
		}
		if _, err := os.Stat(filepath.Join(dataDir[site], "PG_VERSION")); err != nil {
			t.Fatalf("%s: the data directory did not stay: %v", site, err)
		}
		if _, err := os.Stat(filepath.Join(dataDir[site], "postmaster.pid")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: PostgreSQL still runs after the delete (postmaster.pid: %v)", site, err)
		}
	}
	if n, err := pgExec(wctx, dataDir["site-b"], port, "SELECT 1"); err == nil {
		t.Fatalf("site-b still answers after the delete (%d)", n)
	}
}
