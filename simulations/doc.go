// Package simulations is understudy's deterministic discrete-event
// simulator: virtual clocks, a simulated JetStream, a simulated network and
// fault schedules, hosting the unmodified state machines of package actors
// on a single goroutine so that a seed and a scenario give a byte-identical
// run, with invariants checked at every step. It imports events, actors and
// projections, never the runtime.
//
// A run (Run) is one loop over a priority queue ordered by (virtual time,
// sequence). Each of the two nodes (machine.go) hosts, exactly as the
// runtime does, the failover.Member and the procedure.Runner of every
// pair it serves (one by default; Config.Pairs) and, with node leadership,
// the node's failover.NodeLiveness, behind one link to the simulated
// server (Server: events.MemoryKV and events.MemoryLog stamped by the
// server's virtual clock, so the conformance suite applies). Faults come
// from a schedule (Fault, in a textual syntax ParseFaults reads) that a
// Scenario generates from the seed; randomness comes from PCG streams of
// that one seed. The invariants (invariants.go) run after every queue
// item; "sometimes" counters (counters.go) show what a run exercised.
// Swarm runs many seeds on every core and Shrink minimises the schedule of
// a failing one by delta debugging. docs/simulation.md is the guide.
package simulations
