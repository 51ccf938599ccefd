package simulations

import (
	"testing"
	"time"
)

// takeoverSpan is how long after at the last takeover won its register,
// and the last new holder started serving (-1: a takeover did not serve).
func takeoverSpan(r *Result, at time.Duration) (won, serving time.Duration) {
	sec := func(s float64) time.Duration { return time.Duration(s*float64(time.Second)) - at }
	for _, t := range r.Takeovers {
		won = max(won, sec(t.At))
		if t.ServingAt < 0 {
			serving = -1
		} else if serving >= 0 {
			serving = max(serving, sec(t.ServingAt))
		}
	}
	return won, serving
}

// TestBatchedTakeover keeps what batches of member writes (HostBatch)
// change in finding N8's setting: node leadership, 1,000 pairs a node, a
// store serving one write (or one batch) per 1.2ms, the runtime's bound of
// 64; the replicas' node starts 20s late, the primaries' node is cut at
// 40s. One write at a time, the survivor's 1,000 takeovers end 9.6s after
// the cut (past failover_timeout + 2×heartbeat_timeout = 7s: 5,558 failed
// acquires, 14,851 writes not issued). In batches of 256 (31 batches):
// every pair is taken over within 7s of the cut (6.3s, the last new holder
// serving at 6.8s; 737 failed acquires, 800 writes not issued, most of
// them epoch raises, which go one at a time), and no invariant fails.
// Without the batches' effect the second half fails.
func TestBatchedTakeover(t *testing.T) {
	faults, err := ParseFaults("crash(site-b)@1ms+20s;powercut(site-a)@40s", "site-a", "site-b")
	if err != nil {
		t.Fatal(err)
	}
	const cut = 40 * time.Second
	cfg := Config{Scenario: "power-cut", Seed: 1, Duration: 60 * time.Second, Leadership: LeadershipNode, Pairs: 1000,
		StoreWriteTime: 1200 * time.Microsecond, HostWriteBound: HostWriteBoundRuntime,
		Faults: faults, FaultsSet: true}
	rules := DefaultPair()
	bound := rules.FailoverTimeout + 2*rules.HeartbeatTimeout

	alone, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if won, _ := takeoverSpan(alone, cut); alone.Failovers == cfg.Pairs && won <= bound {
		t.Errorf("one write at a time: every pair taken over %v after the cut, within %v; the store no longer bounds the takeover in this setting", won, bound)
	}

	cfg.HostBatch = HostBatchRuntime
	batched, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if batched.Failovers != cfg.Pairs {
		t.Errorf("in batches: %d failovers, want %d", batched.Failovers, cfg.Pairs)
	}
	won, serving := takeoverSpan(batched, cut)
	if won > bound {
		t.Errorf("in batches: the last takeover %v after the cut, want within %v", won, bound)
	}
	if serving < 0 || serving > bound {
		t.Errorf("in batches: the last new holder serving %v after the cut, want within %v", serving, bound)
	}
	if n := countOf(batched, "host-batch-sent"); n == 0 {
		t.Errorf("in batches: no batch sent")
	}
	for _, v := range batched.Violations {
		t.Errorf("in batches: %+v", v)
	}

	// With the raises made once as well (the runtime's host: one write
	// raises the dead node's epoch for all 1,000 members), the takeovers
	// end 5.2s after the cut, the last new holder serving at 5.6s.
	cfg.HostRaiseOnce = true
	both, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n := countOf(both, "epoch-raise-joined"); n != cfg.Pairs-1 {
		t.Errorf("raises made once: %d joined, want %d", n, cfg.Pairs-1)
	}
	if w, _ := takeoverSpan(both, cut); both.Failovers != cfg.Pairs || w >= won {
		t.Errorf("raises made once: %d failovers, the last %v after the cut; want %d, before %v", both.Failovers, w, cfg.Pairs, won)
	}
	for _, v := range both.Violations {
		t.Errorf("raises made once: %+v", v)
	}
}

func countOf(r *Result, name string) int {
	for _, c := range r.Sometimes {
		if c.Name == name {
			return c.Count
		}
	}
	return 0
}

// Batches under faults: a random schedule over 200 pairs a node (two
// isolations of the primaries' site, a power cut of the replicas', a
// crash, a slow link, a partition) sends batches, splits some on a
// conflict, breaks no invariant, and gives the same digest twice. The
// appends go alone, as before their batches (TestAppendBatchesUnderFaults
// has both). (Seed 5 split none once the node's acquires waited two
// heartbeat_timeouts: its acquires no longer missed their window; seed 2
// none once members took routine beats in at their next step; seed 3
// showed N11, docs/simulation.md, once nodes wrote liveness when probed.)
func TestBatchesUnderFaults(t *testing.T) {
	cfg := Config{Scenario: "random", Seed: 12, Duration: 3 * time.Minute, Leadership: LeadershipNode, Pairs: 200,
		StoreWriteTime: time.Millisecond, HostWriteBound: HostWriteBoundRuntime, HostBatch: HostBatchRuntime, HostBatchNoAppends: true}
	r, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"host-batch-sent", "host-batch-split-on-conflict"} {
		if countOf(r, name) == 0 {
			t.Errorf("%s = 0: the run no longer exercises it", name)
		}
	}
	for _, v := range r.Violations {
		t.Errorf("%+v", v)
	}
	if d := digestOf(t, cfg); d != r.Digest {
		t.Errorf("digest %s, then %s", r.Digest, d)
	}
}

// A batch needs the node's bound (writes batch while they wait at it) and
// holds at most events.MaxKVBatch writes.
func TestHostBatchConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Scenario: "power-cut", HostBatch: HostBatchRuntime},
		{Scenario: "power-cut", HostWriteBound: HostWriteBoundRuntime, HostBatch: HostBatchRuntime + 1},
		{Scenario: "power-cut", HostWriteBound: HostWriteBoundRuntime, HostBatch: -1},
	} {
		if _, err := Run(cfg); err == nil {
			t.Errorf("bound %d, batch %d: accepted", cfg.HostWriteBound, cfg.HostBatch)
		}
	}
}

// TestBatchedTakeoverLateCommits keeps the runtime's rules for writes it
// knows stale or uncertain (batch.go, rules 1–3; fd9708f, abba055) in
// TestBatchedTakeover's setting, the raises made once, with the
// survivor's requests held for 2.2s as its takeover starts
// (stall(site-b,up)@44.13s+2.2s; 1s at 44.2s while an acquire waited one
// heartbeat_timeout, which the node's acquires, waiting two, now ride
// out; 44.1s until the members stopped writing their heartbeat key while
// they acquire, when no batch at 44.1s was answered late any more, and
// 44.12–44.15s do it again): its first batches of acquires are committed after their
// deadline, unanswered in time. Their members retry on the revision
// before their own landed acquire. Without the rules those retries fail
// whole batches, which are halved down to them (76 splits, 1,908 failed
// acquires); with them no batch is split (968 retries answered stale from
// the node's watch, 831 sent alone as uncertain; 1,000 failed acquires),
// and every pair is taken over.
func TestBatchedTakeoverLateCommits(t *testing.T) {
	faults, err := ParseFaults("crash(site-b)@1ms+20s;powercut(site-a)@40s;stall(site-b,up)@44.13s+2.2s", "site-a", "site-b")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Scenario: "power-cut", Seed: 1, Duration: 60 * time.Second, Leadership: LeadershipNode, Pairs: 1000,
		StoreWriteTime: 1200 * time.Microsecond, HostWriteBound: HostWriteBoundRuntime, HostBatch: HostBatchRuntime, HostRaiseOnce: true,
		Faults: faults, FaultsSet: true}

	cfg.HostBatchNoStaleRules = true
	before, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n := countOf(before, "host-batch-unanswered-by-deadline"); n == 0 {
		t.Errorf("without the rules: no batch unanswered by its deadline; the stall no longer makes late commits")
	}
	if n := countOf(before, "host-batch-split-on-conflict"); n == 0 {
		t.Errorf("without the rules: no batch split; the late commits no longer split batches in this setting")
	}

	cfg.HostBatchNoStaleRules = false
	r, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r.Failovers != cfg.Pairs {
		t.Errorf("%d failovers, want %d", r.Failovers, cfg.Pairs)
	}
	if n := countOf(r, "host-batch-split-on-conflict"); n != 0 {
		t.Errorf("%d batches split on a conflict, want none: every retry on a revision its own late write replaced is known stale or uncertain", n)
	}
	for _, name := range []string{"host-batch-unanswered-by-deadline", "host-write-stale-answered", "host-write-uncertain-alone"} {
		if countOf(r, name) == 0 {
			t.Errorf("%s = 0: the run no longer exercises it", name)
		}
	}
	if a, b := countOf(r, "acquire-failed"), countOf(before, "acquire-failed"); a >= b {
		t.Errorf("%d failed acquires with the rules, %d without; want fewer", a, b)
	}
	for _, v := range r.Violations {
		t.Errorf("%+v", v)
	}
	for _, x := range []*Result{before, r} {
		won, serving := takeoverSpan(x, 40*time.Second)
		t.Logf("last taken %v, serving %v after the cut; %d splits, %d stale, %d alone as uncertain, %d batches late, %d failed acquires", won, serving,
			countOf(x, "host-batch-split-on-conflict"), countOf(x, "host-write-stale-answered"), countOf(x, "host-write-uncertain-alone"),
			countOf(x, "host-batch-unanswered-by-deadline"), countOf(x, "acquire-failed"))
	}
}
