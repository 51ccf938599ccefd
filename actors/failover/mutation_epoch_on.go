//go:build understudy_mutation_staleepoch

package failover

// honourBumpedLease: see mutation_epoch_off.go. THIS BUILD IS DELIBERATELY BROKEN.
const honourBumpedLease = true
