// Package procedure is the resource side of a failover member: it runs the
// procedure chains (fence, promote, demote, check) that the member asks for
// and answers with one result per chain.
//
// What fencing or promoting means for a resource is configured, not coded: a
// chain is an ordered list of steps (Spec, loaded from the node's YAML file),
// each naming a driver ("exec" today) and a timeout. A step that fails or
// times out escalates to the next; the first step that succeeds completes the
// chain; when every step failed the chain failed.
//
// Runner is the pure part, in the style of the rest of actors/: it takes
// inputs with the local monotonic time and returns Out — events to append,
// steps for the host to execute, runs to cancel, and the chain result. It
// reads no clock and starts no goroutine, so the simulator hosts it as is.
// The drivers (Driver, ExecDriver) are the impure part the runtime calls for
// each StepRun, with a context carrying the step's deadline.
package procedure
