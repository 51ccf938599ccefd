// Command pairs measures many failover pairs on two member nodes: the
// steady state of N pairs with no fault at all (do they all keep serving
// on their preferred primary, what does leadership cost the store and each
// node), and, with -kill, the death of the node that leads them all (how
// long until the last pair serves on the other node, and did any pair have
// two serving members).
//
// It drives the real binary: it writes the node files, starts `understudy
// serve` processes, and reads only what an operator could read — the
// failover bucket, the events stream, each node's /metrics, and /proc.
// The default topology separates the store from the members, so that each
// figure belongs to one process:
//
//	store   understudy serve with no pairs: only the embedded NATS
//	        (synchronous writes, the default), the node a witness is
//	site-a  N members, the preferred primary of every pair, nats.url → store
//	site-b  N members, the replica of every pair, nats.url → store
//
// -topology embedded runs the deployment issue 16 first measured instead:
// site-a embeds the NATS server and site-b connects to it (no -kill then:
// killing site-a kills the store).
//
// With -mode node the harness follows the registers with one watch (one
// consumer, as a node's): polling them with direct gets (multi_last,
// 1,000 subjects a request) holds the bucket's stream against its writes
// while each request is answered, and at 10,000 pairs the polls slowed
// the start and the takeover they timed. Otherwise it reads them with
// direct gets, never through a consumer: nats-server allows 1,000
// consumers per stream by default, and with per-pair leadership the
// members' own watches (one per member) take all of them from 500 pairs
// on. The replay at the end reads through consumers, after the members
// are stopped. -mode writes
// `leadership: <mode>` into the member node files; without it no key is
// written, which is what binaries before node leadership accept.
//
// Every member fences with one exec step running `true` (a member that
// cannot fence must never serve). -promote exec (the default) gives each
// a promote step running `true` too, so a takeover of N pairs starts N
// processes on the survivor; -promote none gives it none, so the figure
// is the failover's own: the two measure the node's process starts apart
// from its leadership.
//
// It lives in a module of its own (go.mod here, understudy replaced by the
// repository) so that the layering test of the main module, which knows
// only DESIGN.md's folders, does not see it. scripts/bench-pairs.sh builds
// both binaries (with a go.mod generated from the measured revision's) and
// loops over pair counts and modes; the figures belong in
// docs/benchmarks.md. `make lint` vets it here, with the go.mod here (and
// its staticcheck): when the root's requirements move, `go mod tidy` here.
package main
