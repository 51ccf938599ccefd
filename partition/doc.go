// Package partition is the real partition suite: every scenario builds three
// sites as Linux network namespaces joined by a bridge, runs a clustered
// nats-server in each and `understudy serve` on the two that hold the pair,
// injects a fault with iptables (or delay and loss through netem or an
// NFQUEUE user-space queue), heals it, and judges the run by oracle files
// the members' procedure scripts write: never two sites serving at once,
// service back within failover_timeout + 2 × heartbeat_timeout when the
// primary's site is lost, exactly one site serving after the heal, no member
// stopped, and no split brain in the replayed record.
//
// It runs binaries and needs root; nothing in the module imports it. The
// deterministic counterpart is simulations/; docs/partitions.md says how the
// two relate and how to run this one.
package partition
