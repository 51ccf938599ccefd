//go:build understudy_mutation_skipfence

package failover

// skipSelfFence: see mutation_off.go. THIS BUILD IS DELIBERATELY BROKEN.
const skipSelfFence = true
