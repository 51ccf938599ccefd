package simulations

import (
	"os/exec"
	"strings"
	"testing"
)

// The planted bugs are found, from the normal test suite: each one's own
// test runs in a build with its tag (only the go tool can build the broken
// member; this binary hosts the production one).
func TestPlantedBugsAreFound(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the package again with each mutation tag")
	}
	if plantedSkipFence || plantedStaleEpoch {
		t.Skip("this binary is a mutation build itself: its own Mutation test runs")
	}
	for _, tc := range []struct{ tag, test string }{
		{"understudy_mutation_skipfence", "TestMutationSkipFenceIsFound"},
		{"understudy_mutation_staleepoch", "TestMutationStaleEpochIsFound"},
	} {
		t.Run(tc.tag, func(t *testing.T) {
			cmd := exec.Command("go", "test", "-count=1", "-v", "-tags", "libvirt_dlopen,"+tc.tag, "-run", "^"+tc.test+"$", ".")
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "--- PASS: "+tc.test) {
				t.Fatalf("%s with -tags %s: %v\n%s", tc.test, tc.tag, err, out)
			}
			for _, line := range strings.Split(string(out), "\n") {
				if strings.Contains(line, "found on seed") || strings.Contains(line, "minimal:") {
					t.Log(strings.TrimSpace(line))
				}
			}
		})
	}
}
