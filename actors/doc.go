// Package actors holds understudy's behaviour: pure, deterministic state
// machines in the decide/evolve style (the failover member in
// actors/failover, the procedure chain runner in actors/procedure, the
// agent's manifest diff, backoff and status in actors/agent), and the
// drivers they command (procedure's exec driver, the resource reconcilers
// in actors/resources).
//
// The state machines read no clock, start no goroutine and do no I/O:
// inputs carry time and the results of I/O, outputs are events. The same
// machines run unmodified in the hollywood runtime (package runtime) and in
// the deterministic simulator (package simulations). Drivers do I/O by
// contract (each states its idempotency and concurrency rules) and are
// called by the hosts, never by a state machine; they too take time from
// their caller. actors imports only events; dependency tests enforce the
// import direction, the absence of clock reads, and the purity of the
// state machines (cmd/understudy deps_test.go, purity_test.go).
package actors
