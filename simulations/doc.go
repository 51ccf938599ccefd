// Package simulations is understudy's deterministic discrete-event
// simulator: virtual clocks, a simulated JetStream, a simulated network and
// fault schedules, hosting the unmodified state machines of package actors
// on a single goroutine so that a seed and a scenario give a byte-identical
// run, with invariants checked at every step. It imports events, actors and
// projections, never the runtime.
package simulations
