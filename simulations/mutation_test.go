//go:build understudy_mutation_skipfence

package simulations

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// With the planted bug (a primary that never fences itself after
// failure_threshold failures: go test -tags understudy_mutation_skipfence
// -run Mutation ./simulations/), the swarm finds the split brain with the
// default, safe rules. Under this tag every other safety test fails too:
// that is the point of the build.
func TestMutationSkipFenceIsFound(t *testing.T) {
	res := Swarm(context.Background(), SwarmConfig{Seeds: 20, FirstSeed: 1, Duration: 10 * time.Minute, ShrinkBudget: 100})
	if !slices.ContainsFunc(res.Failed, func(f SwarmFailure) bool { return f.Invariant == InvSplitBrain }) {
		t.Fatalf("20 seeds of a primary that never self-fences found no split brain: %+v", res.Failed)
	}
	for _, f := range res.Failed[:1] {
		t.Logf("seed %d: %s: %s\n\tminimal: %s", f.Seed, f.Invariant, f.Detail, f.MinimalReproduce)
	}
	// A normal binary cannot reproduce what only this build does: the
	// printed commands build it.
	const want = "go run -tags libvirt_dlopen,understudy_mutation_skipfence ./cmd/understudy simulate --scenario random --seed "
	for _, f := range res.Failed {
		if !strings.HasPrefix(f.Reproduce, want) || (f.MinimalReproduce != "" && !strings.HasPrefix(f.MinimalReproduce, want)) {
			t.Errorf("seed %d: reproduce %q / %q does not build the planted bug (want the prefix %q)", f.Seed, f.Reproduce, f.MinimalReproduce, want)
		}
	}
}
