package simulations

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"understudy/actors/failover"
)

// nodeModeCap caps the scenarios' durations in the node-mode tests (the
// random ones run an hour by default).
const nodeModeCap = 4 * time.Minute

// knownNodeModeFindings are violations the node-mode runs below find in
// the member (docs/simulation.md, "Node leadership", findings), by
// scenario/seed: reported, not failed, until the member is fixed. Only the
// violation named (its invariant, and a part of its detail) is allowed;
// any other fails the run, and so does a run on this list that no longer
// finds it: take it off then.
var knownNodeModeFindings = map[string]knownFinding{}

// knownFinding is one violation a known finding shows as.
type knownFinding struct {
	finding   string
	invariant string
	detail    string // a part of the violation's detail
}

func (k knownFinding) is(v Violation) bool {
	return v.Invariant == k.invariant && strings.Contains(v.Detail, k.detail)
}

// Every scenario holds its invariants, checked per pair, in node mode with
// five pairs per node: split brain, failback to an absent member, a dead
// primary not replaced, flapping, the liveness bounds, and each scenario's
// expectations. A failure prints the command that reproduces it.
func TestNodeModeScenarios(t *testing.T) {
	for _, sc := range Scenarios() {
		for seed := uint64(1); seed <= 2; seed++ {
			cfg := Config{Scenario: sc.Name, Seed: seed, Leadership: LeadershipNode, Pairs: 5, Duration: min(sc.Duration, nodeModeCap)}
			r, err := Run(cfg)
			if err != nil {
				t.Fatal(err)
			}
			known, isKnown := knownNodeModeFindings[sc.Name+"/"+strconv.FormatUint(seed, 10)]
			found := false
			for _, v := range r.Violations {
				if isKnown && known.is(v) {
					found = true
					t.Logf("known finding (%s): %s: %s at %.3fs: %s", known.finding, Command(cfg, ""), v.Invariant, v.At, v.Detail)
					continue
				}
				t.Errorf("%s: %s at %.3fs: %s", Command(cfg, ""), v.Invariant, v.At, v.Detail)
			}
			if isKnown && !found {
				t.Errorf("%s: known finding %q (%s: %s) no longer reproduces: take it off knownNodeModeFindings and docs/simulation.md's findings", Command(cfg, ""), known.finding, known.invariant, known.detail)
			}
		}
	}
}

// One pair per node in per-pair leadership is the single-pair simulation,
// byte for byte; node mode is as deterministic: same seed, same digest,
// whatever the number of pairs.
func TestNodeModeSameSeedSameDigest(t *testing.T) {
	base := Config{Scenario: "failed-fence", Seed: 7}
	explicit := base
	explicit.Leadership, explicit.Pairs = LeadershipPerPair, 1
	if a, b := digestOf(t, base), digestOf(t, explicit); a != b {
		t.Errorf("--leadership per-pair --pairs 1 gave digest %s, the default %s", b, a)
	}
	for _, pairs := range []int{1, 7} {
		cfg := Config{Scenario: "random", Seed: 3, Duration: 5 * time.Minute, Leadership: LeadershipNode, Pairs: pairs}
		a, b := digestOf(t, cfg), digestOf(t, cfg)
		if a != b {
			t.Errorf("node mode, %d pairs: two runs of seed 3 gave digests %s and %s", pairs, a, b)
		}
		other := cfg
		other.Seed++
		if digestOf(t, other) == a {
			t.Errorf("node mode, %d pairs: seeds 3 and 4 gave the same digest", pairs)
		}
		perPair := cfg
		perPair.Leadership = LeadershipPerPair
		if digestOf(t, perPair) == a {
			t.Errorf("%d pairs: node and per-pair leadership gave the same digest", pairs)
		}
	}
}

// The liveness records live in the failover bucket beside the registers
// (their revisions interleave), one per node; the registers name the
// holder's node and epoch. After a power cut of the primary's node, the
// survivor has raised the dead node's epoch, and holds every register in
// its own.
func TestNodeModeLivenessRecords(t *testing.T) {
	s, err := newSim(Config{Scenario: "power-cut", Seed: 2, Leadership: LeadershipNode, Pairs: 3, Duration: time.Minute,
		Faults: []Fault{{Kind: FaultPowerCut, Site: "site-a", At: 30 * time.Second}}, FaultsSet: true})
	if err != nil {
		t.Fatal(err)
	}
	s.run()
	kv := s.server.kv
	rec := func(m *machine) (failover.Liveness, uint64) {
		e, err := kv.Get(bg, failover.LivenessKey(m.name))
		if err != nil {
			t.Fatalf("no liveness record for %s: %v", m.name, err)
		}
		l, err := failover.DecodeLiveness(e.Value)
		if err != nil || l.Node != m.name {
			t.Fatalf("%s's liveness record: %v, %v", m.name, l, err)
		}
		if !s.live[m.idx].known || s.live[m.idx].e.Rev != e.Revision {
			t.Errorf("%s: the simulator's view of its record (rev %d) is not the bucket's (rev %d)", m.name, s.live[m.idx].e.Rev, e.Revision)
		}
		return l, e.Revision
	}
	dead, _ := rec(s.machines[0])
	alive, aliveRev := rec(s.machines[1])
	if dead.Own() || dead.By != alive.Node || dead.Epoch != 2 {
		t.Errorf("the dead node's record %v: want its epoch raised to 2 by %s", dead, alive.Node)
	}
	if !alive.Own() || alive.Epoch != 1 {
		t.Errorf("the survivor's record %v: want its own beats in epoch 1", alive)
	}
	for _, p := range s.pairs {
		e, err := kv.Get(bg, failover.LeaderKey(p.rules.Pair))
		if err != nil {
			t.Fatalf("pair %s: no register: %v", p.rules.Pair, err)
		}
		l, err := failover.DecodeLeader(e.Value)
		if err != nil || l.Site != "site-b" || l.Node != alive.Node || l.Epoch != alive.Epoch {
			t.Errorf("pair %s: register %v (%v): want site-b's lease on %s in epoch %d", p.rules.Pair, l, err, alive.Node, alive.Epoch)
		}
		if e.Revision > aliveRev {
			t.Errorf("pair %s: register rev %d above the survivor's latest beat (rev %d): it stopped beating", p.rules.Pair, e.Revision, aliveRev)
		}
	}
}

// With no fault at all, the store's write rate does not grow with the
// number of pairs: after start, each node writes its liveness record once
// per heartbeat_timeout and members write nothing.
func TestNodeModeWritesPerNode(t *testing.T) {
	revAt := func(pairs int, d time.Duration) uint64 {
		s, err := newSim(Config{Scenario: "power-cut", Seed: 1, Leadership: LeadershipNode, Pairs: pairs, Duration: d, FaultsSet: true})
		if err != nil {
			t.Fatal(err)
		}
		s.run()
		return s.server.kv.Revision()
	}
	window := 50 * time.Second
	for _, pairs := range []int{1, 20} {
		writes := revAt(pairs, 10*time.Second+window) - revAt(pairs, 10*time.Second)
		// One liveness write per node per second, and one to spare.
		if limit := uint64(2 * (window/DefaultPair().HeartbeatTimeout + 1)); writes > limit {
			t.Errorf("%d pairs per node: %d KV writes in %v of steady state, want at most %d (2 nodes × 1 per heartbeat_timeout)", pairs, writes, window, limit)
		}
	}
}

// A node that loses power for good: every pair it led fails over. The
// last pair serves on the other node within the dead-primary bound
// (failover_timeout + 2 × heartbeat_timeout + the fence and promote
// chains and the links' latency, with one round trip more for the raise
// of the dead node's epoch), counted from the cut, and within issue 16's
// goal: failover_timeout + 2 × heartbeat_timeout.
func TestNodeModeWholeNodeFailover(t *testing.T) {
	const pairs = 50
	cut := 30 * time.Second
	s, err := newSim(Config{Scenario: "power-cut", Seed: 5, Leadership: LeadershipNode, Pairs: pairs, Duration: 90 * time.Second,
		Faults: []Fault{{Kind: FaultPowerCut, Site: "site-a", At: cut}}, FaultsSet: true})
	if err != nil {
		t.Fatal(err)
	}
	s.run()
	r := s.result(0)
	if len(r.Violations) > 0 {
		t.Fatalf("violations: %+v", r.Violations)
	}
	served := map[string]float64{}
	for _, tk := range r.Takeovers {
		if tk.From == "site-a" && tk.To == "site-b" && tk.ServingAt >= 0 {
			served[tk.Pair] = tk.ServingAt
		}
	}
	if len(served) != pairs {
		t.Fatalf("%d of %d pairs failed over to site-b: %+v", len(served), pairs, r.Takeovers)
	}
	last := 0.0
	for _, at := range served {
		last = max(last, at)
	}
	took := time.Duration((last - cut.Seconds()) * float64(time.Second))
	if took > s.bound {
		t.Errorf("the last of %d pairs served %v after the cut, beyond the bound %v", pairs, took, s.bound)
	}
	// Issue 16's goal for a whole node, tighter than the checkers' bound.
	if goal := s.rules.FailoverTimeout + 2*s.rules.HeartbeatTimeout; took > goal {
		t.Errorf("the last of %d pairs served %v after the cut, beyond the goal failover_timeout + 2 × heartbeat_timeout = %v", pairs, took, goal)
	}
	t.Logf("%d pairs: the last served on the other node %v after its primary's node lost power (bound %v)", pairs, took.Round(time.Millisecond), s.bound)
}

// The flags that rebuild a node-mode run are in the reproduce command.
func TestNodeModeCommand(t *testing.T) {
	cmd := Command(Config{Scenario: "random", Seed: 9, Duration: 10 * time.Minute, Leadership: LeadershipNode, Pairs: 5}, "")
	if !strings.HasSuffix(cmd, "--scenario random --seed 9 --duration 10m --leadership node --pairs 5") {
		t.Errorf("command %q", cmd)
	}
	if cmd := Command(Config{Scenario: "random", Seed: 9}, ""); strings.Contains(cmd, "--leadership") || strings.Contains(cmd, "--pairs") {
		t.Errorf("a per-pair run's command names node-mode flags: %q", cmd)
	}
	if _, err := ParseLeadership("node"); err != nil {
		t.Error(err)
	}
	if _, err := ParseLeadership("per-node"); err == nil {
		t.Error("per-node accepted")
	}
	if _, err := Run(Config{Scenario: "power-cut", Seed: 1, Pairs: MaxPairs + 1}); err == nil {
		t.Errorf("%d pairs per node accepted", MaxPairs+1)
	}
}
