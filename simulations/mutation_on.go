//go:build understudy_mutation_skipfence

package simulations

// skipFenceTag is the build tag of a deliberately broken member this
// binary hosts (actors/failover/mutation_on.go): a normal binary cannot
// reproduce its failures, so Command says how to build one that does.
const skipFenceTag = "understudy_mutation_skipfence"
