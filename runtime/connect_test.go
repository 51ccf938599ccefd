package runtime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
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

// The first server of the list stops answering without closing the
// socket (a partition): the client notices within DeadAfter, logs it,
// moves to the second server, and moves back to the first once that one
// answers again.
func TestConnectDetectsDeadServerAndReturnsHome(t *testing.T) {
	const deadAfter = 600 * time.Millisecond
	nc, proxy, _, other, rec := connectThroughProxy(t, deadAfter, 100*time.Millisecond)
	if got := nc.ConnectedUrl(); got != proxy.URL() {
		t.Fatalf("connected to %s, want the first server of the list %s", got, proxy.URL())
	}

	blocked := time.Now()
	proxy.SetBlocked(true)
	l := rec.waitFor(t, "nats server not answering, moving to the next server", 1, 5*time.Second)[0]
	detected := time.Since(blocked)
	if got := l.Attrs["url"].String(); got != proxy.URL() {
		t.Errorf("detection logged url=%s, want %s", got, proxy.URL())
	}
	onOther := waitConnectedTo(t, nc, other.ClientURL(), 5*time.Second)
	moved := onOther.Sub(blocked)
	t.Logf("dead server detected after %s, on the other server after %s (DeadAfter %s, ping every %s)",
		detected.Round(time.Millisecond), moved.Round(time.Millisecond), deadAfter, pingInterval(deadAfter))
	if detected > deadAfter+300*time.Millisecond {
		t.Errorf("detected after %s, want within DeadAfter %s (+300ms scheduling slack)", detected, deadAfter)
	}
	if moved > deadAfter+time.Second {
		t.Errorf("on the other server after %s, want within DeadAfter %s + 1s", moved, deadAfter)
	}
	if err := nc.Publish("x", nil); err != nil {
		t.Fatal(err)
	}
	if err := nc.FlushTimeout(time.Second); err != nil {
		t.Fatalf("connection to the other server does not work: %v", err)
	}

	healed := time.Now()
	proxy.SetBlocked(false)
	rec.waitFor(t, "nats first server answers again, moving back to it", 1, 5*time.Second)
	back := waitConnectedTo(t, nc, proxy.URL(), 5*time.Second)
	t.Logf("back on the first server %s after it answered again", back.Sub(healed).Round(time.Millisecond))
	if err := nc.FlushTimeout(time.Second); err != nil {
		t.Fatalf("connection back home does not work: %v", err)
	}
}

// A server that reads the client's requests late — busy with the ones
// before them, as a server whose direct reads wait for its disk syncs
// is — answers pings late, but still delivers to the client: it is
// alive, and the client stays (leaving it would fail every request in
// flight). Once it delivers nothing either, it is given up within
// DeadAfter.
func TestConnectKeepsABusyServerThatDelivers(t *testing.T) {
	const deadAfter = 600 * time.Millisecond
	nc, proxy, home, other, rec := connectThroughProxy(t, deadAfter, -1)
	var got atomic.Int64
	if _, err := nc.Subscribe("tick", func(*nats.Msg) { got.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := nc.FlushTimeout(time.Second); err != nil {
		t.Fatal(err)
	}
	pub, err := nats.Connect(home.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	stopPub := make(chan struct{})
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for {
			select {
			case <-stopPub:
				return
			case <-time.After(50 * time.Millisecond):
				_ = pub.Publish("tick", []byte("x"))
			}
		}
	}()

	proxy.SetUpstreamHeld(true)
	before := got.Load()
	time.Sleep(4 * deadAfter)
	if n := rec.matching("nats server not answering, moving to the next server"); len(n) > 0 {
		t.Fatalf("a server that delivered all along was given up: %v", n[0].Attrs)
	}
	if nc.ConnectedUrl() != proxy.URL() {
		t.Fatalf("connected to %s, want %s still", nc.ConnectedUrl(), proxy.URL())
	}
	if got.Load()-before < 10 {
		t.Fatalf("%d messages delivered while the server read nothing of ours, want the publisher's", got.Load()-before)
	}

	close(stopPub)
	<-pubDone
	quiet := time.Now()
	rec.waitFor(t, "nats server not answering, moving to the next server", 1, 5*time.Second)
	if detected := time.Since(quiet); detected > deadAfter+300*time.Millisecond {
		t.Errorf("detected %s after the server stopped delivering, want within DeadAfter %s (+300ms scheduling slack)", detected, deadAfter)
	}
	waitConnectedTo(t, nc, other.ClientURL(), 5*time.Second)
	proxy.SetUpstreamHeld(false)
}

// A server that answers nothing on the client's connection — its read
// loop for it waits on the disk syncs of the requests before — but
// answers a new connection at once is busy, not dead: the client keeps
// its connection (leaving would fail every request in flight), says so
// once, and gives it up only after maxBusyFor DeadAfters of silence.
func TestConnectKeepsAServerThatAnswersASideConnection(t *testing.T) {
	const deadAfter = 600 * time.Millisecond
	nc, proxy, home, other, rec := connectThroughProxy(t, deadAfter, -1)
	if err := nc.FlushTimeout(time.Second); err != nil {
		t.Fatal(err)
	}
	// Idle, its pongs in time: no side connection is ever made.
	conns := func() uint64 {
		v, err := home.srv.Varz(nil)
		if err != nil {
			t.Fatal(err)
		}
		return v.TotalConnections
	}
	before := conns()
	time.Sleep(4 * deadAfter)
	if n := conns() - before; n > 1 { // one pong late under load may ask once; one a check would be 12
		t.Fatalf("%d side connections to an idle server in %s", n, 4*deadAfter)
	}

	held := time.Now()
	proxy.HoldOpen(true)
	rec.waitFor(t, "nats server busy: it answers a new connection but nothing on this one yet; keeping it", 1, 5*time.Second)
	time.Sleep(time.Until(held.Add(3 * deadAfter)))
	if n := rec.matching("nats server not answering, moving to the next server"); len(n) > 0 {
		t.Fatalf("a server that answered a side connection was given up after %s: %v", n[0].Time.Sub(held), n[0].Attrs)
	}
	if nc.ConnectedUrl() != proxy.URL() {
		t.Fatalf("connected to %s, want %s still", nc.ConnectedUrl(), proxy.URL())
	}

	// Released within the bound, the connection delivers what waited.
	proxy.HoldOpen(false)
	rec.waitFor(t, "nats server answers this connection again", 1, 5*time.Second)
	if err := nc.FlushTimeout(time.Second); err != nil {
		t.Fatalf("the kept connection does not work once released: %v", err)
	}

	// Silent for longer than the bound: given up, busy or not.
	before = conns()
	held = time.Now()
	proxy.HoldOpen(true)
	l := rec.waitFor(t, "nats server not answering, moving to the next server", 1, maxBusyFor*deadAfter+5*time.Second)[0]
	if gave := l.Time.Sub(held); gave < maxBusyFor*deadAfter-deadAfter || gave > maxBusyFor*deadAfter+time.Second {
		t.Errorf("given up %s after its connection went silent, want about maxBusyFor × DeadAfter = %s", gave.Round(time.Millisecond), maxBusyFor*deadAfter)
	}
	if conns() == before {
		t.Fatal("no side connection was made while the server kept silent")
	}
	waitConnectedTo(t, nc, other.ClientURL(), 5*time.Second)
	proxy.HoldOpen(false)
}

// connectThroughProxy connects with Connect to a server behind a fault
// proxy, then to a second one: the proxied server first in the list.
func connectThroughProxy(t *testing.T, deadAfter, homeProbe time.Duration) (nc *nats.Conn, proxy *FaultProxy, home, other *EmbeddedNATS, rec *logRecorder) {
	t.Helper()
	log, rec := newLogRecorder(t)
	home, other = startEmbedded(t, log), startEmbedded(t, log)
	proxy, err := NewFaultProxy(home.srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err = Connect(ctx, ConnectOptions{
		URL:       proxy.URL() + "," + other.ClientURL(),
		Retry:     RetryConfig{Initial: 50 * time.Millisecond, Max: time.Second},
		DeadAfter: deadAfter, HomeProbe: homeProbe, Name: "test",
	}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc, proxy, home, other, rec
}

// waitConnectedTo polls until nc is connected to url and returns when it was.
func waitConnectedTo(t *testing.T, nc *nats.Conn, url string, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if nc.ConnectedUrl() == url {
			return time.Now()
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("not connected to %s within %s (connected to %q)", url, timeout, nc.ConnectedUrl())
	return time.Time{}
}

func TestPingIntervalDetectsWithinDeadAfter(t *testing.T) {
	for _, d := range []time.Duration{200 * time.Millisecond, time.Second, DefaultDeadAfter} {
		if p := pingInterval(d); time.Duration(MaxPingsOutstanding+1)*p > d {
			t.Errorf("pingInterval(%s) = %s: %d unanswered pings take longer than %s", d, p, MaxPingsOutstanding+1, d)
		}
	}
	if got := jetStreamTimeout(time.Second); got != 2*time.Second {
		t.Errorf("jetStreamTimeout(1s) = %s, want 2s", got)
	}
	if got := jetStreamTimeout(time.Minute); got != 5*time.Second {
		t.Errorf("jetStreamTimeout(1m) = %s, want 5s (nats.go's default, never more)", got)
	}
}

// A server that refuses the credentials gets the same answer at every
// retry: Connect says so at once, as an authentication error, and does
// not retry it as an outage.
func TestConnectReportsRefusedCredentialsWithoutRetrying(t *testing.T) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, Username: "node", Password: "right", NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(5 * time.Second) {
		t.Fatal("server not ready")
	}
	log, rec := newLogRecorder(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	url := strings.Replace(srv.ClientURL(), "nats://", "nats://node:wrong@", 1)
	_, err = Connect(ctx, ConnectOptions{URL: url, Retry: RetryConfig{Initial: 50 * time.Millisecond}, Name: "test"}, log)
	if err == nil || !IsAuthError(err) || !strings.Contains(err.Error(), "refused the credentials (attempt 1)") {
		t.Fatalf("Connect with a wrong password: %v", err)
	}
	if strings.Contains(err.Error(), "wrong") {
		t.Errorf("the password is in the error: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %v: retried", took)
	}
	if n := len(rec.matching("nats not reachable, retrying")); n != 0 {
		t.Errorf("logged %d outages for an authentication refusal", n)
	}
	if _, err := Connect(ctx, ConnectOptions{URL: srv.ClientURL(), User: "node", Password: "right", Name: "test"}, log); err != nil {
		t.Errorf("right credentials: %v", err)
	}
}
