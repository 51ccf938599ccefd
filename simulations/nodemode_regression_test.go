package simulations

import (
	"testing"
	"time"
)

// nodeRegressions are the simulator's findings in node leadership, each a
// violation before its fix in actors/failover; with the fix none may.
var nodeRegressions = []struct {
	name     string
	scenario string
	seed     uint64
	duration time.Duration
	pairs    int
	faults   string
	// The store's service time and the node's write bound (Config), for
	// findings that need them.
	storeWriteTime time.Duration
	hostWriteBound int
}{
	// N3: a suspended holder whose fenced register value landed but whose
	// answer was lost judged the register by its last acknowledged value
	// (unfenced, from before it fenced) and unfenced on its node's
	// liveness successes without writing an unfenced value; the follower
	// took the fenced register over: split brain. A holder now unfences
	// only after its own unfenced value was acknowledged since its fence.
	{name: "n3-unfenced-without-announcement", scenario: "random", seed: 53, duration: 3 * time.Minute, pairs: 3,
		faults: "loss(site-a,20%)@30s+1m0s"},
	{name: "n3-swarm-seed-252", scenario: "random", seed: 252, duration: 10 * time.Minute, pairs: 5},
	// N2: a lone unfencing announcement (its answer lost) followed by the
	// node's beats restarted the follower's "holder stays fenced" clock:
	// unavailable-while-standby-healthy.
	{name: "n2-lone-announcement", scenario: "lossy-primary", seed: 2, duration: 5 * time.Minute, pairs: 5},
	// N7 (regression_test.go) with five pairs a node: before (every append
	// conflict halted), member-stopped-without-rival at 167.339s,
	// 167.364s and 177.337s (pg-main, pg-main-5, pg-main-2).
	{name: "n7-unrecognised-retries", scenario: "random", seed: 1, duration: 4 * time.Minute, pairs: 5,
		faults: "partition(site-a,down)@30s+2m10s;loss(site-a,20%)@2m30s+1m"},
	// N9: a suspended holder's unfencing announcement was acknowledged
	// after one more failed liveness write, so it stayed suspended and
	// wrote fenced again; those values landed, their answers lost or late.
	// On its node's next successes it unfenced by the announcement
	// acknowledged before them, while the register said fenced and the
	// follower took it over: split brain (pg-main-121 at 68.678s,
	// pg-main-167 at 68.689s, pg-main-110, pg-main-188). A fenced write
	// issued since ends what the announcement's acknowledgement proved.
	// With that fix alone, 17 pairs of this run were N10's.
	{name: "n9-fenced-write-after-announcement", scenario: "random", seed: 8, duration: 75 * time.Second, pairs: 200,
		faults: "loss(site-a,20%)@48.35s+21s", storeWriteTime: time.Millisecond, hostWriteBound: HostWriteBoundRuntime},
	// N10: 200 holders suspended on a lossy link (loss(site-a,20%) from
	// 16s) whose announcements landed with their answers late: each kept
	// writing it again, waiting for an answer in time, and behind the
	// node's bound those rewrites kept other holders' writes from being
	// issued, while the followers took an unfenced value that stood with
	// the node's beats for a recovery: unavailable-while-standby-healthy.
	// The holder now takes the watch's delivery or a late answer of its
	// announcement as its landing. Found on random's seed 30 (3m, the
	// node's timing of then); that seed's timing has moved twice since
	// (it shows N11 now, open) and the seed kept is the one below, chosen
	// once N4 was fixed: 21 pairs unavailable without N10's fix, none with
	// it (seeds 4, 5, 16, 20 and 27 also fail without it).
	{name: "n10-announcement-answered-late", scenario: "random", seed: 6, duration: 90 * time.Second, pairs: 200,
		faults: "loss(site-a,20%)@16s+1m", storeWriteTime: time.Millisecond, hostWriteBound: HostWriteBoundRuntime},
}

func TestNodeModeRegressionSeeds(t *testing.T) {
	for _, r := range nodeRegressions {
		t.Run(r.name, func(t *testing.T) {
			cfg := Config{Scenario: r.scenario, Seed: r.seed, Duration: r.duration, Leadership: LeadershipNode, Pairs: r.pairs,
				StoreWriteTime: r.storeWriteTime, HostWriteBound: r.hostWriteBound}
			if r.faults != "" {
				fs, err := ParseFaults(r.faults, "site-a", "site-b")
				if err != nil {
					t.Fatal(err)
				}
				cfg.Faults, cfg.FaultsSet = fs, true
			}
			res, err := Run(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range res.Violations {
				t.Errorf("%s: %+v", r.name, v)
			}
		})
	}
}
