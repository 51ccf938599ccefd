package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"understudy/actors/failover"
	"understudy/runtime"
)

// status --pair reads one pair among 10,000 in the bucket by that pair's
// keys alone, never a listing or a watch of the bucket, and shows the
// holder's node and epoch and the node's liveness (leadership: node).
func TestStatusOfOnePairAmongTenThousand(t *testing.T) {
	t.Parallel()
	es, nc, js, names := seedPairs(t, statusPairs)
	const pairs = statusPairs
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	subject := func(key string) string { return "$KV." + names.FailoverBucket + "." + key }

	// Reading one pair must not depend on the number of pairs: no
	// consumer (a listing or a watch of the bucket would need one), only
	// direct reads of the pair's keys. How long it takes is a benchmark's
	// business (BenchmarkStatusOnePairAmongTenThousand).
	creates, err := nc.SubscribeSync("$JS.API.CONSUMER.>")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = creates.Unsubscribe() }()
	for _, pair := range []string{"pg-00000", "pg-09999"} {
		var out bytes.Buffer
		cmd := newStatusCmd(&out)
		cmd.SetArgs([]string{"--nats-url", es.ClientURL(), "--pair", pair, "--json"})
		if err := cmd.ExecuteContext(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if m, err := creates.NextMsg(100 * time.Millisecond); err == nil {
			t.Errorf("status --pair %s among %d pairs made a consumer request (%s): it must read the pair's keys directly", pair, pairs, m.Subject)
		}
		var st []PairStatus
		if err := json.Unmarshal(out.Bytes(), &st); err != nil {
			t.Fatalf("%v\n%s", err, out.String())
		}
		if len(st) != 1 || st[0].Pair != pair || st[0].Lease == nil {
			t.Fatalf("status: %s", out.String())
		}
		ls := st[0].Lease
		if ls.Node != "node-a" || ls.Epoch != 3 || !ls.Current || ls.Live == nil || ls.Live.Beat != 41 {
			t.Errorf("lease %+v (liveness %+v)", ls, ls.Live)
		}
		if hb := st[0].Heartbeats["site-b"]; hb.Node != "node-b" || hb.NodeAge == nil {
			t.Errorf("site-b: %+v", hb)
		}
		if hb := st[0].Heartbeats["site-a"]; hb.Source != "liveness" || hb.Node != "node-a" {
			t.Errorf("site-a: %+v", hb)
		}
	}

	// Printed: the lease, and once node-a's epoch is raised, that it is over.
	if _, err := js.Publish(ctx, subject(failover.LivenessKey("node-a")), failover.EncodeLiveness(failover.Liveness{Node: "node-a", Epoch: 4, By: "node-b"})); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cmd := newStatusCmd(&out)
	cmd.SetArgs([]string{"--nats-url", es.ClientURL(), "--pair", "pg-00042"})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"lease    node node-a, epoch 3: OVER: node node-a's epoch was raised to 4 by node-b", "beats through node node-a's liveness", "node node-b beat"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
}

// A node file with leadership: node serves its pairs: status shows the
// lease on the node's liveness, and a switchover moves leadership.
func TestServeNodeLeadershipStatusSwitchover(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const pair = "cli-node-pair"
	node := writeTestFile(t, dir, "node.yaml", `node: site-a
leadership: node
data_dir: `+filepath.Join(dir, "data")+`
nats: {listen: "127.0.0.1:0"}
http: 127.0.0.1:0
log: {format: json}
pairs:
`+pairMemberYAML(pair, "site-a")+pairMemberYAML(pair, "site-b"))
	n, ready := startServeBinary(t, "serve", "--config", node)
	url, _ := ready["client_url"].(string)
	if ready["leadership"] != "node" {
		t.Fatalf("ready line: %v", ready)
	}
	st := waitLeader(t, url, pair, "site-a", 5*time.Second)
	if l := st.Lease; l == nil || l.Node != "site-a" || !l.Current || l.Live == nil || l.Live.Age > 1 {
		t.Errorf("status: lease %+v", st.Lease)
	}
	// The follower's heartbeat (written when it changes) says ready.
	deadline := time.Now().Add(5 * time.Second)
	for hb := st.Heartbeats["site-b"]; !hb.Ready; hb = statusOf(t, url, pair)[0].Heartbeats["site-b"] {
		if time.Now().After(deadline) {
			t.Fatalf("site-b not ready within 5s: %+v", hb)
		}
		time.Sleep(100 * time.Millisecond)
	}
	code, stdout, stderr := runBinary(t, 20*time.Second, "switchover", "--nats-url", url, "--pair", pair, "--to", "site-b", "--wait", "10s")
	if code != exitOK {
		t.Fatalf("switchover: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	st = waitLeader(t, url, pair, "site-b", 5*time.Second)
	if st.Term != 2 || st.Lease == nil || !st.Lease.Current {
		t.Errorf("status after switchover: %+v (lease %+v)", st, st.Lease)
	}
	if !strings.Contains(n.stderr(), `"msg":"node liveness started"`) || !strings.Contains(n.stderr(), `"msg":"store write rate measured"`) {
		t.Errorf("serve did not log its node liveness and the store's rate:\n%s", n.stderr())
	}
}

// statusPairs is how many pairs the status test and benchmark put in the bucket.
const statusPairs = 10000

// seedPairs starts a provisioned embedded NATS holding pairs pairs led by
// node-a in epoch 3 (published asynchronously) and both nodes' liveness.
func seedPairs(t testing.TB, pairs int) (*runtime.EmbeddedNATS, *nats.Conn, jetstream.JetStream, runtime.AssetsConfig) {
	t.Helper()
	es, nc, js, names := provisionedNATS(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	subject := func(key string) string { return "$KV." + names.FailoverBucket + "." + key }
	var acks []jetstream.PubAckFuture
	publish := func(key string, value []byte) {
		if len(acks)%1000 == 999 { // at most a thousand outstanding
			select {
			case <-js.PublishAsyncComplete():
			case <-ctx.Done():
				t.Fatal("publishing the pairs did not finish")
			}
		}
		f, err := js.PublishAsync(subject(key), value)
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, f)
	}
	for i := range pairs {
		pair := fmt.Sprintf("pg-%05d", i)
		r := failover.DefaultRules(pair, "site-a", "site-b")
		publish(failover.ConfigKey(pair), failover.EncodeRules(r))
		publish(failover.LeaderKey(pair), failover.EncodeLeader(failover.Leader{Site: "site-a", Term: 1, By: "site-a", Node: "node-a", Epoch: 3}))
		publish(failover.HeartbeatKey(pair, "site-b"), failover.EncodeHeartbeat(failover.Heartbeat{Site: "site-b", Phase: failover.PhaseFollower, Ready: true, Node: "node-b"}))
	}
	publish(failover.LivenessKey("node-a"), failover.EncodeLiveness(failover.Liveness{Node: "node-a", Epoch: 3, Beat: 41, By: "node-a"}))
	publish(failover.LivenessKey("node-b"), failover.EncodeLiveness(failover.Liveness{Node: "node-b", Epoch: 1, Beat: 40, By: "node-b"}))
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		t.Fatal("publishing the pairs did not finish")
	}
	for _, f := range acks {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatal(err)
		}
	}
	return es, nc, js, names
}

// BenchmarkStatusOnePairAmongTenThousand: understudy status --pair, one
// pair among 10,000 in the bucket (issue 16: under a second).
func BenchmarkStatusOnePairAmongTenThousand(b *testing.B) {
	es, _, _, _ := seedPairs(b, statusPairs)
	b.ResetTimer()
	for i := range b.N {
		var out bytes.Buffer
		cmd := newStatusCmd(&out)
		cmd.SetArgs([]string{"--nats-url", es.ClientURL(), "--pair", fmt.Sprintf("pg-%05d", i%statusPairs), "--json"})
		if err := cmd.ExecuteContext(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}
