//go:build !understudy_mutation_skipfence

package simulations

// buildTag is empty: this binary hosts the unmodified member (see
// mutation_on.go).
const buildTag = ""
