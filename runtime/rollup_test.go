package runtime

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"understudy/actors/failover"
)

// A client that may write one key of a bucket must not be able to purge
// the whole bucket with a Nats-Rollup header (NATS permissions cannot see
// headers): the buckets refuse rollups, and every key survives.
func TestBucketsRefuseRollups(t *testing.T) {
	fn := startFailoverNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	keep := map[string][]byte{
		failover.ConfigKey("pg"):         failover.EncodeRules(failover.DefaultRules("pg", "site-a", "site-b")),
		failover.LeaderKey("pg"):         failover.EncodeLeader(failover.Leader{Site: "site-a", Term: 1, Beat: 1}),
		failover.HeartbeatKey("pg", "b"): []byte("beat"),
	}
	for k, v := range keep {
		if _, err := fn.kv.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	for _, rollup := range []string{"all", "sub"} {
		msg := nats.NewMsg("$KV." + fn.names.FailoverBucket + "." + failover.HeartbeatKey("pg", "b"))
		msg.Header.Set("Nats-Rollup", rollup)
		msg.Data = []byte("wipe")
		_, err := fn.js.PublishMsg(ctx, msg)
		if err == nil {
			t.Errorf("a write with Nats-Rollup: %s was accepted", rollup)
		}
	}
	for k, v := range keep {
		e, err := fn.kv.Get(ctx, k)
		if err != nil || string(e.Value) != string(v) {
			t.Errorf("%s after the rollups: %q, %v; want it kept", k, e.Value, err)
		}
	}
}
