//go:build understudy_mutation_staleepoch

package simulations

import (
	"strings"
	"testing"
	"time"
)

// With the planted bug of node leadership (a lease honoured after its
// node's epoch was raised past it: go test -tags
// libvirt_dlopen,understudy_mutation_staleepoch -run Mutation
// ./simulations/), the swarm of db-random in node mode finds it within 100
// seeds. It shows as a pair nobody serves: a follower counts the old
// holder node's beats in the raised epoch as the holder's, so it never
// takes over a lease that ended, while the holder, told that its epoch
// moved, gave it up. (The register's compare-and-set keeps it from
// becoming a split brain.) db-random, because its members differ by pair
// — a lagging database withholds one pair's takeover while another pair's
// raises the epoch.
func TestMutationStaleEpochIsFound(t *testing.T) {
	c := SwarmConfig{Scenario: "db-random", Duration: 10 * time.Minute, Leadership: LeadershipNode, Pairs: 5}
	for seed := uint64(1); seed <= 100; seed++ {
		cfg := c.SeedConfig(seed)
		cfg.StopAtFirstViolation = true
		r, err := Run(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Failed() {
			continue
		}
		v := r.Violations[0]
		t.Logf("found on seed %d (%d seeds run): %s at %.3fs: %s", seed, seed, v.Invariant, v.At, v.Detail)
		// A normal binary cannot reproduce what only this build does: the
		// printed command builds it.
		const want = "go run -tags libvirt_dlopen,understudy_mutation_staleepoch ./cmd/understudy simulate --scenario db-random --seed "
		if cmd := Command(cfg, ""); !strings.HasPrefix(cmd, want) || !strings.Contains(cmd, "--leadership node --pairs 5") {
			t.Errorf("reproduce %q does not build the planted bug in node mode (want the prefix %q and --leadership node --pairs 5)", cmd, want)
		}
		return
	}
	t.Fatal("100 seeds of db-random in node mode (5 pairs per node) with a lease honoured after its epoch was raised found no violation")
}
