package runtime

import (
	"context"
	"testing"
	"time"

	"understudy/actors/failover"
	"understudy/events"
)

// A node with many members reads their subjects in one pass before
// starting them (no consumer per member): each member starts with the
// state its log holds — its term, as its start's routine fence records —
// a foreign record on one subject is reported once and skipped, and the
// members append after their logs' last records without a conflict.
func TestManyMembersReplayInOnePass(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	const n = bulkReplayMin + 4
	pairs := nodePairs(t, "one-pass", n)
	tr := newTransitions()
	a := hostNode(t, fn, "node-a", "site-a", pairs, tr, nil, nil)
	for _, r := range pairs {
		tr.waitPair(t, r.Pair, r.Primary, "failover.serving_started", 1, 20*time.Second)
	}
	a.stop()
	terms := map[string]uint64{}
	for _, r := range pairs {
		terms[r.Pair] = register(t, fn.kv, r.Pair).Value.Term
		if terms[r.Pair] == 0 {
			t.Fatalf("pair %s: register at term 0 after serving", r.Pair)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := fn.evlog.AppendRaw(ctx, failover.Subject(pairs[3].Pair, "site-a"), []byte("hello"), events.AppendOptions{MsgID: "not-an-appender"}); err != nil {
		t.Fatal(err)
	}

	log, rec := newLogRecorder(t)
	a2 := hostNode(t, fn, "node-a", "site-a", pairs, tr, log, nil)
	for _, r := range pairs {
		x := tr.waitPair(t, r.Pair, r.Primary, "failover.fence_requested", 2, 20*time.Second)
		if fr, ok := x.Event.(*failover.FenceRequested); !ok || fr.Reason != failover.FenceRestart || fr.Term != terms[r.Pair] {
			t.Errorf("pair %s: restart fence %+v; want reason restart at term %d (the term its log holds)", r.Pair, x.Event, terms[r.Pair])
		}
		tr.waitPair(t, r.Pair, r.Primary, "failover.serving_started", 2, 20*time.Second)
	}
	pass := rec.matching("members replayed their logs in one pass")
	if len(pass) != 1 || pass[0].Attrs["members"].Int64() != n || pass[0].Attrs["events"].Int64() == 0 || pass[0].Attrs["other_records"].Int64() != 0 {
		t.Errorf("one-pass replay logged %d times: %+v; want once, %d members", len(pass), pass, n)
	}
	if own := rec.matching("member replayed its log"); len(own) != 0 {
		t.Errorf("%d members read their own logs as well", len(own))
	}
	if f := rec.matching("foreign record in member log (no appender wrote it), skipped"); len(f) != 1 {
		t.Errorf("foreign record reported %d times, want once", len(f))
	}
	for _, m := range a2.host.Members() {
		if !m.Running || m.Stops != 0 {
			t.Errorf("member after the one-pass replay: %+v", m)
		}
	}
}
