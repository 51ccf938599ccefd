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

	"github.com/nats-io/nats.go/jetstream"

	"understudy/actors/failover"
)

// status --pair answers for one pair in under a second with 10,000 pairs
// in the bucket (it reads that pair's keys directly, never lists the
// bucket), and shows the holder's node and epoch and the node's liveness
// (leadership: node).
func TestStatusOfOnePairAmongTenThousand(t *testing.T) {
	t.Parallel()
	es, _, js, names := provisionedNATS(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// 10,000 pairs led by node-a in epoch 3, published asynchronously.
	const pairs = 10000
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

	for _, pair := range []string{"pg-00000", "pg-09999"} {
		var out bytes.Buffer
		cmd := newStatusCmd(&out)
		cmd.SetArgs([]string{"--nats-url", es.ClientURL(), "--pair", pair, "--json"})
		began := time.Now()
		if err := cmd.ExecuteContext(context.Background()); err != nil {
			t.Fatal(err)
		}
		took := time.Since(began)
		t.Logf("status --pair %s among %d pairs: %v", pair, pairs, took)
		if took > time.Second {
			t.Errorf("status --pair %s took %v with %d pairs in the bucket, want under 1s", pair, took, pairs)
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
