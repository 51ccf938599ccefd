//go:build understudy_mutation_staleepoch

package simulations

// staleEpochTag is the build tag of a deliberately broken member this
// binary hosts (actors/failover/mutation_epoch_on.go: a lease honoured
// after its node's epoch was raised): a normal binary cannot reproduce its
// failures, so Command says how to build one that does.
const staleEpochTag = "understudy_mutation_staleepoch"
