// Package actors holds understudy's behaviour: pure, deterministic state
// machines (the failover member, the node agent, managed resources) in the
// decide/evolve style, and the drivers they command.
//
// Nothing here reads a clock, starts a goroutine or touches the network:
// inputs carry time and the results of I/O, outputs are events. The same
// machines run unmodified in the hollywood runtime (package runtime) and in
// the deterministic simulator (package simulations). actors imports only
// events; a dependency test enforces it.
package actors
