// Command understudy is the single CLI binary: it serves the actor runtime
// on a node and carries the operator and engineer commands. It may import
// every other package of the module.
package main
