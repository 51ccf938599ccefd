//go:build !understudy_mutation_skipfence

package simulations

// skipFenceTag is empty: this binary hosts a member that fences itself
// (see mutation_on.go).
const skipFenceTag = ""
