//go:build !understudy_mutation_staleepoch

package simulations

// staleEpochTag is empty: this binary hosts a member that gives up a
// lease once its node's epoch moved past it (see mutation_epoch_on.go).
const staleEpochTag = ""
