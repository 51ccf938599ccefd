package runtime

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// testCluster is a NATS cluster of in-process servers on loopback, one per
// "site", named n1, n2, ….
type testCluster struct {
	servers []*server.Server
}

func startTestCluster(t *testing.T, n int) *testCluster {
	t.Helper()
	ports := make([]int, n)
	routes := make([]string, n)
	for i := range ports {
		ports[i] = freePort(t)
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", ports[i])
	}
	c := &testCluster{}
	for i := range n {
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       -1,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			Cluster:    server.ClusterOpts{Name: "sites", Host: "127.0.0.1", Port: ports[i]},
			Routes:     server.RoutesFromStr(strings.Join(append(append([]string(nil), routes[:i]...), routes[i+1:]...), ",")),
			NoSigs:     true,
			NoLog:      true,
		}
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatalf("server %s not ready", opts.ServerName)
		}
		c.servers = append(c.servers, s)
	}
	return c
}

// urls lists the client URLs, server i first.
func (c *testCluster) urls(first int) string {
	urls := []string{c.servers[first].ClientURL()}
	for i, s := range c.servers {
		if i != first {
			urls = append(urls, s.ClientURL())
		}
	}
	return strings.Join(urls, ",")
}

// clusterJetStream connects to the cluster and waits until JetStream answers
// (a meta leader is elected).
func clusterJetStream(t *testing.T, c *testCluster) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(c.urls(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return nc, js
		}
		if time.Now().After(deadline) {
			t.Fatalf("jetstream cluster not ready: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func streamLeader(t *testing.T, js jetstream.JetStream, stream string) string {
	t.Helper()
	// Short: a request caught in a leader change gets no answer at all.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return ""
	}
	if ci := st.CachedInfo().Cluster; ci != nil {
		return ci.Leader
	}
	return ""
}

// moveLeaderAway steps the stream's leader down (no preference) until it
// is on another server than avoid, and returns the server it is on.
func moveLeaderAway(t *testing.T, nc *nats.Conn, js jetstream.JetStream, stream, avoid string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		switch l := streamLeader(t, js, stream); l {
		case "":
		case avoid:
			_ = stepDownStream(context.Background(), nc, stream, "", 2*time.Second)
		default:
			return l
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("leader of %s still on %s", stream, avoid)
	return ""
}

// Three servers (two pair sites and a witness), assets at R3 and the
// witness n3 preferred: after the leaders were moved elsewhere, the keeper
// brings each back to n3 within a few seconds, logging each move.
func TestLeaderKeeperBringsLeadersBackToPreferredServer(t *testing.T) {
	log, rec := newLogRecorder(t)
	c := startTestCluster(t, 3)
	nc, js := clusterJetStream(t, c)
	names := AssetsConfig{FailoverBucket: DefaultFailoverBucket, FleetBucket: DefaultFleetBucket, EventsStream: DefaultEventsStream}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := Provision(pctx, js, DefaultAssets(names, 3), log)
		pcancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil || !retryableProvisionError(err) {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	const preferred = "n3"
	streams := []string{"KV_" + DefaultFailoverBucket, DefaultEventsStream}
	for _, s := range streams {
		if from := moveLeaderAway(t, nc, js, s, preferred); from == preferred {
			t.Fatal("unreachable")
		}
	}
	// Wait until the followers are current again: the keeper moves a
	// leader only to a current replica.
	time.Sleep(time.Second)

	start := time.Now()
	const settle = 1500 * time.Millisecond
	k := StartLeaderKeeper(ctx, nc, js, LeaderKeeperConfig{Preferred: preferred, Streams: streams, Interval: 500 * time.Millisecond, RejoinSettle: settle}, log)
	defer k.Stop()
	for _, s := range streams {
		deadline := time.Now().Add(10 * time.Second)
		for streamLeader(t, js, s) != preferred {
			if time.Now().After(deadline) {
				t.Fatalf("leader of %s on %q 10s after the keeper started, want %s", s, streamLeader(t, js, s), preferred)
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("%s led by %s %s after the keeper started", s, preferred, time.Since(start).Round(time.Millisecond))
		if took := time.Since(start); took < settle {
			t.Errorf("%s moved %v after the keeper started, before the preferred server had been current for %v", s, took, settle)
		}
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("leaders back on %s after %s, want within a few seconds", preferred, took)
	}
	moves := rec.waitFor(t, "jetstream leader moved", len(streams), 5*time.Second)
	for _, m := range moves {
		if m.Attrs["to"].String() != preferred || m.Attrs["from"].String() == preferred || m.Attrs["from"].String() == "" {
			t.Errorf("move logged as %v", m)
		}
	}

	// Moved away again (an election after a partition, say): back again.
	// Meanwhile a writer measures what the move costs the bucket's writes.
	kv, err := js.KeyValue(ctx, DefaultFailoverBucket)
	if err != nil {
		t.Fatal(err)
	}
	from := moveLeaderAway(t, nc, js, streams[0], preferred)
	moved := time.Now()
	type writes struct {
		worst time.Duration // slowest acknowledged write
		lost  int           // writes not acknowledged within a heartbeat_timeout of 1s
	}
	stall := make(chan writes, 1)
	stopWriter := make(chan struct{})
	go func() {
		var w writes
		defer func() { stall <- w }()
		for {
			select {
			case <-stopWriter:
				return
			case <-time.After(20 * time.Millisecond):
			}
			wctx, wcancel := context.WithTimeout(ctx, time.Second)
			t0 := time.Now()
			_, err := kv.Put(wctx, "probe", []byte("x"))
			wcancel()
			if err != nil {
				w.lost++
			} else {
				w.worst = max(w.worst, time.Since(t0))
			}
		}
	}()
	deadline := moved.Add(15 * time.Second)
	for streamLeader(t, js, streams[0]) != preferred {
		if time.Now().After(deadline) {
			t.Fatalf("leader of %s not back on %s 15s after it moved to %s", streams[0], preferred, from)
		}
		time.Sleep(20 * time.Millisecond)
	}
	back := time.Since(moved)
	time.Sleep(500 * time.Millisecond)
	close(stopWriter)
	w := <-stall
	t.Logf("%s back on %s %s after an election put it on %s; meanwhile the slowest write took %s, %d not acknowledged within 1s",
		streams[0], preferred, back.Round(time.Millisecond), from, w.worst.Round(time.Millisecond), w.lost)
	// A move costs at most the write in flight at the step-down (the old
	// leader drops its pending proposals): never a leaderless stream.
	if w.lost > 1 || w.worst > time.Second {
		t.Errorf("the move cost %d writes and delayed one by %s: a move must not leave the stream leaderless", w.lost, w.worst)
	}

	// Stop ends the keeper; no moves after it.
	k.Stop()
	n := len(rec.matching("jetstream leader moved"))
	moveLeaderAway(t, nc, js, streams[1], preferred)
	time.Sleep(1500 * time.Millisecond)
	if got := len(rec.matching("jetstream leader moved")); got != n {
		t.Errorf("%d moves after Stop", got-n)
	}
}

// A preferred server that is not a replica is reported once and no
// step-down is asked for.
func TestLeaderKeeperLeavesLeaderWhenPreferredIsNoReplica(t *testing.T) {
	log, rec := newLogRecorder(t)
	c := startTestCluster(t, 3)
	nc, js := clusterJetStream(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var err error
	for range 50 {
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3})
		if err == nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	var before string
	for before == "" {
		before = streamLeader(t, js, "S")
	}
	k := StartLeaderKeeper(ctx, nc, js, LeaderKeeperConfig{Preferred: "elsewhere", Streams: []string{"S"}, Interval: 100 * time.Millisecond}, log)
	time.Sleep(time.Second)
	k.Stop()
	if got := len(rec.matching("preferred server is not a replica of the stream; the leader stays where it is")); got != 1 {
		t.Errorf("logged %d times, want once", got)
	}
	if got := len(rec.matching("jetstream leader moved")); got != 0 {
		t.Errorf("%d moves", got)
	}
	if after := streamLeader(t, js, "S"); after != before {
		t.Errorf("leader moved from %s to %s", before, after)
	}
}
