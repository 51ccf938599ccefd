//go:build understudy_mutation_skipfence

package simulations

// plantedSkipFence: this test binary hosts the deliberately broken member.
const plantedSkipFence = true
