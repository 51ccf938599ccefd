package procedure

import (
	"context"
	"strconv"
)

// Driver executes one step. The runtime calls Run for each StepRun, from
// its own goroutine, with a ctx whose deadline is the step's.
//
// Contract: Run must return once ctx is done, having stopped what it
// started, and report ResultTimedOut then. Run may be called again for the
// same step — a superseded chain is retried while the cancelled run may
// still be returning — so fence steps in particular must be idempotent:
// fencing an already fenced resource succeeds. Run may be called
// concurrently for different steps.
type Driver interface {
	Run(ctx context.Context, step StepSpec) Outcome
}

// Drivers maps a StepSpec.Driver name to its driver.
type Drivers map[string]Driver

// DefaultDrivers returns the drivers of this build; one node's procedures
// share them, so their commands' starts share one StartLimit.
func DefaultDrivers() Drivers {
	return Drivers{"exec": ExecDriver{Starts: NewStartLimit(DefaultStarts())}}
}

// Run runs step with the driver it names; a name without a driver fails
// the step (Spec.Validate refuses such names at load).
func (d Drivers) Run(ctx context.Context, step StepSpec) Outcome {
	drv, ok := d[step.Driver]
	if !ok {
		return Outcome{Result: ResultFailed, ExitCode: -1, Detail: "no driver " + strconv.Quote(step.Driver) + " in this build"}
	}
	return drv.Run(ctx, step)
}
