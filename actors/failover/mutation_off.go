//go:build !understudy_mutation_skipfence

package failover

// skipSelfFence is the planted bug of the simulator's checks: a build with
// the tag understudy_mutation_skipfence keeps serving past failure_threshold.
// Production builds never set the tag.
const skipSelfFence = false
