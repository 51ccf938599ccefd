package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"understudy/actors/failover"
)

// serving is one Serve running in the background.
type serving struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when Serve returned err
	err    error
	rec    *logRecorder
}

func startServe(t *testing.T, cfg Config) *serving {
	t.Helper()
	log, rec := newLogRecorder(t)
	cfg.Logger = log
	ctx, cancel := context.WithCancel(context.Background())
	s := &serving{cancel: cancel, done: make(chan struct{}), rec: rec}
	go func() {
		defer close(s.done)
		s.err = Serve(ctx, cfg)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			t.Error("Serve still running 10s after cancel")
		}
	})
	return s
}

// stop cancels Serve and returns its result, failing after a few seconds.
func (s *serving) stop(t *testing.T) error {
	t.Helper()
	s.cancel()
	select {
	case <-s.done:
		return s.err
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return within 5s of cancellation")
		return nil
	}
}

func getHealth(t *testing.T, url string) (int, Health) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h Health
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatalf("GET %s: body: %v", url, err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("content type %q", ct)
	}
	return resp.StatusCode, h
}

func embeddedTestConfig(t *testing.T) Config {
	c := DefaultConfig()
	c.DataDir = t.TempDir()
	c.NATS.Listen = "127.0.0.1:-1"
	c.HTTP = "127.0.0.1:0"
	c.Log.Level = "debug"
	return c
}

func TestServeEmbeddedEndToEnd(t *testing.T) {
	cfg := embeddedTestConfig(t)
	for run, wantOutcome := range []string{"created", "unchanged"} { // the second run restarts on the same data
		s := startServe(t, cfg)
		ready := s.rec.waitFor(t, "ready", 1, 10*time.Second)[0]
		httpAddr := ready.Attrs["http"].String()
		clientURL := ready.Attrs["client_url"].String()
		if !strings.HasPrefix(clientURL, "nats://127.0.0.1:") {
			t.Fatalf("ready: client_url %q", clientURL)
		}

		code, h := getHealth(t, "http://"+httpAddr+"/healthz")
		if code != http.StatusOK || !reflect.DeepEqual(h, Health{Status: "ok", NATSConnected: true, JetStream: true, Provisioned: true}) {
			t.Errorf("run %d: /healthz %d %+v", run, code, h)
		}

		m := scrape(t, "http://"+httpAddr+"/metrics")
		b := ReadBuildInfo()
		for _, name := range []string{
			fmt.Sprintf(`understudy_build_info{goversion=%q,revision=%q,version=%q}`, b.GoVersion, b.Revision, b.Version),
			`understudy_nats_connected`,
			`understudy_provision_total{kind="kv",name="understudy_failover",outcome="` + wantOutcome + `"}`,
			`understudy_provision_total{kind="kv",name="understudy_fleet",outcome="` + wantOutcome + `"}`,
			`understudy_provision_total{kind="stream",name="UNDERSTUDY_EVENTS",outcome="` + wantOutcome + `"}`,
		} {
			if m[name] != 1 {
				t.Errorf("run %d: metric %s = %v, want 1", run, name, m[name])
			}
		}
		if v := m[`understudy_provision_refused_changes{kind="stream",name="UNDERSTUDY_EVENTS"}`]; v != 0 {
			t.Errorf("refused changes %v, want 0", v)
		}
		if _, ok := m["go_goroutines"]; !ok {
			t.Error("no Go runtime metrics")
		}

		// Clients reach the advertised URL and find the assets.
		nc, err := nats.Connect(clientURL)
		if err != nil {
			t.Fatal(err)
		}
		js, _ := jetstream.New(nc)
		if _, err := js.KeyValue(context.Background(), DefaultFailoverBucket); err != nil {
			t.Errorf("failover bucket: %v", err)
		}
		nc.Close()

		if err := s.stop(t); err != nil {
			t.Fatalf("Serve after cancel: %v, want nil", err)
		}
		for _, addr := range []string{httpAddr, strings.TrimPrefix(clientURL, "nats://")} {
			if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				c.Close()
				t.Errorf("%s still accepts connections after Serve returned", addr)
			}
		}
		// Shut down in order: HTTP, NATS connection, embedded server.
		order := []string{"shutting down", "http server closed", "nats connection closed", "embedded nats stopped", "stopped"}
		var seen []string
		for _, l := range s.rec.all() {
			for _, o := range order {
				if l.Msg == o {
					seen = append(seen, o)
				}
			}
		}
		if strings.Join(seen, ",") != strings.Join(order, ",") {
			t.Errorf("shutdown log order %v, want %v", seen, order)
		}
	}
}

// With an external NATS that is down at start: /healthz says 503 and the
// node retries; once NATS is up the node provisions and turns healthy; on
// cancel it leaves the external server running.
func TestServeExternalNATSLateStart(t *testing.T) {
	port := freePort(t)
	cfg := DefaultConfig()
	cfg.DataDir = ""
	cfg.NATS.URL = fmt.Sprintf("nats://127.0.0.1:%d", port)
	cfg.NATS.Retry = RetryConfig{Initial: 20 * time.Millisecond, Max: 100 * time.Millisecond}
	cfg.Assets.Replicas = 1
	cfg.HTTP = "127.0.0.1:0"
	s := startServe(t, cfg)

	httpAddr := s.rec.waitFor(t, "http listening", 1, 5*time.Second)[0].Attrs["addr"].String()
	s.rec.waitFor(t, "nats not reachable, retrying", 2, 5*time.Second)
	code, h := getHealth(t, "http://"+httpAddr+"/healthz")
	if code != http.StatusServiceUnavailable || !reflect.DeepEqual(h, Health{Status: "unavailable", Reasons: []string{"nats: not connected", "assets: not provisioned yet"}}) {
		t.Errorf("/healthz while NATS is down: %d %+v", code, h)
	}
	if m := scrape(t, "http://"+httpAddr+"/metrics"); m["understudy_nats_connected"] != 0 {
		t.Errorf("understudy_nats_connected = %v while NATS is down", m["understudy_nats_connected"])
	}

	log, _ := newLogRecorder(t)
	ext, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir(), Host: "127.0.0.1", Port: port}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer ext.Shutdown()

	ready := s.rec.waitFor(t, "ready", 1, 10*time.Second)[0]
	if got := ready.Attrs["nats"].String(); got != "external" {
		t.Errorf("ready: nats=%q, want external", got)
	}
	if code, h := getHealth(t, "http://"+httpAddr+"/healthz"); code != http.StatusOK || h.Status != "ok" {
		t.Errorf("/healthz once ready: %d %+v", code, h)
	}
	if m := scrape(t, "http://"+httpAddr+"/metrics"); m["understudy_nats_connected"] != 1 {
		t.Errorf("understudy_nats_connected = %v once connected", m["understudy_nats_connected"])
	}

	// JetStream going away turns the node unhealthy.
	ext.Shutdown()
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, h := getHealth(t, "http://"+httpAddr+"/healthz")
		if code == http.StatusServiceUnavailable && !h.NATSConnected {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz still %d %+v 5s after NATS went down", code, h)
		}
		time.Sleep(20 * time.Millisecond)
	}

	if err := s.stop(t); err != nil {
		t.Fatalf("Serve after cancel: %v", err)
	}
}

func TestServeCancelWhileWaitingForNATS(t *testing.T) {
	cfg := DefaultConfig()
	cfg.NATS.URL = fmt.Sprintf("nats://127.0.0.1:%d", freePort(t))
	cfg.HTTP = "127.0.0.1:0"
	s := startServe(t, cfg)
	s.rec.waitFor(t, "nats not reachable, retrying", 1, 5*time.Second)
	if err := s.stop(t); err != nil {
		t.Fatalf("Serve cancelled while connecting: %v, want nil", err)
	}
}

func TestServeRejectsInvalidConfig(t *testing.T) {
	cfg := embeddedTestConfig(t)
	cfg.Assets.Replicas = 9
	err := Serve(context.Background(), cfg)
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "assets.replicas" {
		t.Fatalf("Serve: %v, want a *ConfigError for assets.replicas", err)
	}
}

func TestServeReportsRefusedReplicas(t *testing.T) {
	// A single external server asked for 3 replicas: Serve fails with a
	// hint instead of retrying forever.
	log, _ := newLogRecorder(t)
	ext := startEmbedded(t, log)
	cfg := DefaultConfig()
	cfg.NATS.URL = ext.ClientURL()
	cfg.HTTP = "127.0.0.1:0"
	cfg.Logger = slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := Serve(ctx, cfg)
	if !errors.Is(err, ErrReplicasUnsupported) {
		t.Fatalf("Serve: %v, want ErrReplicasUnsupported", err)
	}
}

func TestServeHTTPAddressInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := embeddedTestConfig(t)
	cfg.HTTP = ln.Addr().String()
	cfg.Logger = slog.New(slog.DiscardHandler)
	if err := Serve(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("Serve: %v, want address already in use", err)
	}
}

// An external NATS without JetStream: connected, but not healthy; the node
// keeps retrying the provisioning and stops cleanly.
func TestServeExternalNATSWithoutJetStream(t *testing.T) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	defer func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	}()
	if !srv.ReadyForConnections(5 * time.Second) {
		t.Fatal("plain nats-server not ready")
	}
	cfg := DefaultConfig()
	cfg.NATS.URL = srv.ClientURL()
	cfg.NATS.Retry = RetryConfig{Initial: 20 * time.Millisecond, Max: 50 * time.Millisecond}
	cfg.Assets.Replicas = 1
	cfg.HTTP = "127.0.0.1:0"
	s := startServe(t, cfg)
	httpAddr := s.rec.waitFor(t, "http listening", 1, 5*time.Second)[0].Attrs["addr"].String()
	retries := s.rec.waitFor(t, "jetstream not ready, retrying", 2, 10*time.Second)
	if retries[1].Attrs["attempt"].Int64() != 2 || retries[1].Attrs["error"].Any() == nil {
		t.Errorf("retry log: %v", retries[1])
	}
	code, h := getHealth(t, "http://"+httpAddr+"/healthz")
	if code != http.StatusServiceUnavailable || !reflect.DeepEqual(h, Health{Status: "unavailable", NATSConnected: true, Reasons: []string{"jetstream: no answer within 1s", "assets: not provisioned yet"}}) {
		t.Errorf("/healthz without JetStream: %d %+v", code, h)
	}
	m := scrape(t, "http://"+httpAddr+"/metrics")
	if m[`understudy_provision_total{kind="kv",name="understudy_failover",outcome="failed"}`] < 2 {
		t.Errorf("failed provisionings not counted: %v", m)
	}
	if err := s.stop(t); err != nil {
		t.Fatalf("Serve after cancel: %v", err)
	}
}

// A node hosting a pair logs the pair's life at info/warn (not only at
// debug) and exports each member's phase, term and events.
func TestServeMembersLogAndExportMetrics(t *testing.T) {
	cfg := embeddedTestConfig(t)
	cfg.Log.Level = "info"
	cfg.Node = "site-a"
	r := fastRules(t, "metrics-pair")
	ft, st := r.FailureThreshold, r.SuccessThreshold
	pf := PairFile{Pair: r.Pair, Primary: r.Primary, Replica: r.Replica, HeartbeatTimeout: r.HeartbeatTimeout.String(),
		FailureThreshold: &ft, SuccessThreshold: &st, FailoverTimeout: r.FailoverTimeout.String(), FenceGrace: r.FenceGrace.String()}
	cfg.Pairs = []PairMember{
		{PairFile: pf, Member: "site-a", Procedures: recordedProcedures()},
		{PairFile: pf, Member: "site-b", Procedures: recordedProcedures()},
	}
	s := startServe(t, cfg)
	ready := s.rec.waitFor(t, "ready", 1, 10*time.Second)[0]
	httpAddr := ready.Attrs["http"].String()

	deadline := time.Now().Add(10 * time.Second)
	for {
		var serving *logged
		for _, l := range s.rec.matching("transition") {
			if l.Attrs["event"].String() == "failover.serving_started" {
				serving = &l
			}
		}
		if serving != nil {
			if serving.Level != slog.LevelInfo {
				t.Errorf("serving_started logged at %v, want INFO", serving.Level)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no serving_started transition logged")
		}
		time.Sleep(20 * time.Millisecond)
	}
	want := map[string]float64{
		`understudy_member_serving{pair="metrics-pair",site="site-a"}`:                               1,
		`understudy_member_serving{pair="metrics-pair",site="site-b"}`:                               0,
		`understudy_member_term{pair="metrics-pair",site="site-a"}`:                                  1,
		`understudy_member_phase{pair="metrics-pair",phase="leader",site="site-a"}`:                  1,
		`understudy_member_phase{pair="metrics-pair",phase="follower",site="site-b"}`:                1,
		`understudy_member_events_total{pair="metrics-pair",site="site-a",type="failover.promoted"}`: 1,
	}
	// The replica may still be finishing its start-up fence: poll.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		m := scrape(t, "http://"+httpAddr+"/metrics")
		var off []string
		for name, v := range want {
			if m[name] != v {
				off = append(off, fmt.Sprintf("%s = %v, want %v", name, m[name], v))
			}
		}
		if len(off) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics after 5s: %v", off)
		}
	}
}

// A stopped member makes /healthz answer 503 with a reason naming it, and
// the member list shows it; once it runs again the member is not a reason.
func TestHealthzReportsStoppedMember(t *testing.T) {
	since := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	h := &Host{slots: []*memberSlot{
		{cfg: MemberConfig{Rules: failover.DefaultRules("pg-a", "site-a", "site-b"), Site: "site-a"}},
		{cfg: MemberConfig{Rules: failover.DefaultRules("pg-b", "site-a", "site-b"), Site: "site-b"},
			stopped: true, stops: 2, reason: "another process appends to its event subject", since: since, restartAt: since.Add(2 * time.Second)},
	}}
	n := &node{log: slog.New(slog.DiscardHandler)}
	n.provisioned.Store(true)
	n.host.Store(h)
	srv := httptest.NewServer(http.HandlerFunc(n.healthz))
	defer srv.Close()

	code, body := getHealth(t, srv.URL)
	if code != http.StatusServiceUnavailable || body.Status != "unavailable" {
		t.Fatalf("healthz %d %q, want 503 unavailable", code, body.Status)
	}
	want := "member pg-b/site-b stopped at 2026-03-01T12:00:00Z: another process appends to its event subject (restarts at 2026-03-01T12:00:02Z)"
	found := false
	for _, r := range body.Reasons {
		found = found || r == want
		if strings.Contains(r, "pg-a") {
			t.Errorf("a running member is given as a reason: %q", r)
		}
	}
	if !found {
		t.Errorf("reasons %q lack %q", body.Reasons, want)
	}
	if len(body.Members) != 2 || !body.Members[0].Running || body.Members[1].Running || body.Members[1].Stops != 2 {
		t.Errorf("members %+v", body.Members)
	}

	// A stopped agent is a reason.
	aa := &agentActor{}
	aa.halted.Store(true)
	n.agent.Store(&Agent{actor: aa})
	_, body = getHealth(t, srv.URL)
	if !slices.Contains(body.Reasons, "agent: stopped; the node no longer converges its manifest") {
		t.Errorf("reasons with a stopped agent: %q", body.Reasons)
	}

	// An embedded store that ran out of space is a reason too.
	n.embedded.Store(&EmbeddedNATS{sl: &serverLogger{noSpace: true}})
	_, body = getHealth(t, srv.URL)
	if !slices.Contains(body.Reasons, "jetstream: the data directory ran out of space; writes are refused until space is freed (recovery is automatic)") {
		t.Errorf("reasons with a full store: %q", body.Reasons)
	}
}
