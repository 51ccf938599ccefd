//go:build understudy_mutation_staleepoch

package simulations

// plantedStaleEpoch: this test binary hosts the deliberately broken member.
const plantedStaleEpoch = true
