//go:build !understudy_mutation_staleepoch

package failover

// honourBumpedLease is the planted bug of node mode: a build with the tag
// understudy_mutation_staleepoch honours a lease after its node's epoch
// was raised past it (a holder counts its node's liveness writes in the
// new epoch as its beats; a follower counts them as the holder's).
// Production builds never set the tag.
const honourBumpedLease = false
