package runtime

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"understudy/actors/failover"
	"understudy/events"
)

// The first node to start records the deployment's leadership; a node
// whose file says the same starts, one that says otherwise is refused
// with both values, who recorded it and the way out.
func TestDeploymentLeadershipIsRecordedAndEnforced(t *testing.T) {
	ctx := context.Background()
	kv := events.NewMemoryKV("failover", nil)
	log := slog.New(slog.DiscardHandler)
	if err := checkDeploymentLeadership(ctx, kv, "node-a", LeadershipNode, true, log); err != nil {
		t.Fatalf("first node: %v", err)
	}
	e, err := kv.Get(ctx, failover.DeploymentLeadershipKey)
	if err != nil {
		t.Fatal(err)
	}
	d, l, err := DecodeDeploymentLeadership(e.Value)
	if err != nil || l != LeadershipNode || d.By != "node-a" || d.At.IsZero() {
		t.Fatalf("record %+v (%v), %v; want node, by node-a, dated", d, l, err)
	}
	if err := checkDeploymentLeadership(ctx, kv, "node-b", LeadershipNode, true, log); err != nil {
		t.Fatalf("a node of the same leadership: %v", err)
	}
	err = checkDeploymentLeadership(ctx, kv, "node-c", LeadershipPerPair, true, log)
	var mm *LeadershipMismatchError
	if !errors.As(err, &mm) || !refusesStart(err) {
		t.Fatalf("a per-pair node in a node deployment: %v; want a LeadershipMismatchError", err)
	}
	for _, want := range []string{"leadership:", "the node file says per-pair", "this deployment runs node", `node "node-a"`, failover.DeploymentLeadershipKey, "understudy leadership set per-pair"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	if e2, _ := kv.Get(ctx, failover.DeploymentLeadershipKey); e2.Revision != e.Revision {
		t.Fatal("a refused node changed the record")
	}
}

// Two nodes of different leadership starting at once: one records its
// own, the other is refused — never both started.
func TestDeploymentLeadershipRaceHasOneWinner(t *testing.T) {
	for range 20 {
		kv := events.NewMemoryKV("failover", nil)
		log := slog.New(slog.DiscardHandler)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, l := range []Leadership{LeadershipNode, LeadershipPerPair} {
			wg.Go(func() { errs[i] = checkDeploymentLeadership(context.Background(), kv, "n", l, true, log) })
		}
		wg.Wait()
		if (errs[0] == nil) == (errs[1] == nil) {
			t.Fatalf("node: %v; per-pair: %v; want exactly one refused", errs[0], errs[1])
		}
	}
}

// A record that is not one (too large, not JSON, an unknown leadership)
// refuses the start with a clear error and is left as it is.
func TestDeploymentLeadershipRecordIsUntrusted(t *testing.T) {
	for name, v := range map[string]string{
		"too large": `{"leadership":"node","by":"` + strings.Repeat("x", maxDeploymentRecord) + `"}`,
		"not json":  "node",
		"unknown":   `{"leadership":"both","by":"x"}`,
	} {
		kv := events.NewMemoryKV("failover", nil)
		if _, err := kv.Put(context.Background(), failover.DeploymentLeadershipKey, []byte(v)); err != nil {
			t.Fatal(err)
		}
		err := checkDeploymentLeadership(context.Background(), kv, "n", LeadershipNode, true, slog.New(slog.DiscardHandler))
		if !refusesStart(err) || !strings.Contains(err.Error(), "leadership record") || !strings.Contains(err.Error(), "understudy leadership set") {
			t.Errorf("%s: %v; want a refusal naming the record and the way out", name, err)
		}
	}
}

// A node without members (an agent's, before it adds any) records
// nothing, but is refused by a record that disagrees.
func TestDeploymentLeadershipOfANodeWithoutMembers(t *testing.T) {
	ctx := context.Background()
	kv := events.NewMemoryKV("failover", nil)
	log := slog.New(slog.DiscardHandler)
	if err := checkDeploymentLeadership(ctx, kv, "agent-only", LeadershipPerPair, false, log); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, failover.DeploymentLeadershipKey); !errors.Is(err, events.ErrNotFound) {
		t.Fatalf("a node without members recorded the leadership: %v", err)
	}
	if err := checkDeploymentLeadership(ctx, kv, "node-a", LeadershipNode, true, log); err != nil {
		t.Fatal(err)
	}
	if err := checkDeploymentLeadership(ctx, kv, "agent-only", LeadershipPerPair, false, log); !refusesStart(err) {
		t.Fatalf("a per-pair node without members in a node deployment: %v; want refused", err)
	}
}

// flakyKV fails its first fails reads as a store without a stream leader
// does.
type flakyKV struct {
	events.KV
	fails int
}

func (k *flakyKV) Get(ctx context.Context, key string) (events.Entry, error) {
	if k.fails > 0 {
		k.fails--
		return events.Entry{}, errors.New("nats: no responders available for request")
	}
	return k.KV.Get(ctx, key)
}

// A store that cannot answer yet (a stream leader being elected: a
// real partition-suite start failed so) is tried again; a record that
// disagrees refuses at once, and a store that never answers gives up
// when the context ends.
func TestDeploymentLeadershipRetriesTheStore(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	kv := &flakyKV{KV: events.NewMemoryKV("failover", nil), fails: 2}
	open := func() (events.KV, error) { return kv, nil }
	if err := checkLeadershipRetrying(context.Background(), open, "n", LeadershipNode, true, log); err != nil || kv.fails != 0 {
		t.Fatalf("after two failed reads: %v (%d failures left)", err, kv.fails)
	}
	start := time.Now()
	if err := checkLeadershipRetrying(context.Background(), open, "m", LeadershipPerPair, true, log); !refusesStart(err) || time.Since(start) > time.Second {
		t.Fatalf("a disagreeing record: %v after %s; want refused at once", err, time.Since(start))
	}
	kv.fails = 1 << 30
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := checkLeadershipRetrying(ctx, open, "n", LeadershipNode, true, log); err == nil || refusesStart(err) || !strings.Contains(err.Error(), "no responders") {
		t.Fatalf("a store that never answers: %v; want the store's error once ctx ends", err)
	}
}
