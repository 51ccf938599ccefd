//go:build understudy_mutation_skipfence

package simulations

// buildTag is the build tag of a deliberately broken member this binary
// hosts (actors/failover/mutation_on.go): a normal binary cannot
// reproduce its failures, so Command says how to build one that does.
const buildTag = "understudy_mutation_skipfence"
