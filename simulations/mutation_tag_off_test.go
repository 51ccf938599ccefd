//go:build !understudy_mutation_skipfence

package simulations

// plantedSkipFence: this test binary hosts the production member.
const plantedSkipFence = false
