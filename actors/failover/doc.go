// Package failover is the failover member: the pure state machine that
// keeps one member of a pair (a preferred primary and a replica on two sites)
// serving only while it holds the pair's leadership register, and promotes
// the other member only when the register has gone stale.
//
// The machine follows DESIGN.md's algorithm. A holder of the register
// heartbeats by compare-and-set on the revision of its own last write; a
// write not acknowledged within heartbeat_timeout is a failure, and
// failure_threshold consecutive failures fence it. A CAS lost to another
// writer fences it at once. A follower promotes by CAS on the revision of
// the last leader write it saw, and only when that write is stale both by
// server timestamps and by its own monotonic observation.
//
// Member.Step takes an input (with the local monotonic time) and returns a
// Ready: the durable events (already folded in with Apply), the KV writes to
// issue and the procedures (fence, promote, demote) to run. It performs no
// I/O and reads no clock; the runtime and the simulator host it unchanged.
package failover
