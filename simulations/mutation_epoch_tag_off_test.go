//go:build !understudy_mutation_staleepoch

package simulations

// plantedStaleEpoch: this test binary hosts the production member.
const plantedStaleEpoch = false
