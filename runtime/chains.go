package runtime

import (
	"context"
	"errors"
	"time"

	"understudy/actors/capability"
	"understudy/actors/procedure"
	"understudy/events"
)

// ExecChains is the workload of a member configured by procedure chains
// (the node file's procedures): each capability runs its chain with the
// procedure.Runner, escalating step by step, and records every chain and
// step event. It has no rejoin (a chain-configured workload does not
// follow a leader) and reports no positions.
type ExecChains struct {
	resource string
	spec     procedure.Spec
	drivers  procedure.Drivers
	record   func(...events.Event)
}

var _ capability.Workload = (*ExecChains)(nil)

// NewExecChains returns the chains of spec (validated) for resource
// (<pair>.<site>), run with drivers.
func NewExecChains(resource string, spec procedure.Spec, drivers procedure.Drivers) *ExecChains {
	return &ExecChains{resource: resource, spec: spec, drivers: drivers}
}

// setRecorder is where the chains' events go (the member's procedure
// subject); the workload host sets it before any call.
func (c *ExecChains) setRecorder(f func(...events.Event)) bool { c.record = f; return true }

// FenceBudget is the fence chain's worst case.
func (c *ExecChains) FenceBudget() time.Duration { return c.spec.Fence.WorstCase() }

func (c *ExecChains) Fence(ctx context.Context, req capability.Request) error {
	return c.run(ctx, procedure.ChainFence, req.Seq)
}

func (c *ExecChains) Promote(ctx context.Context, req capability.Request) error {
	return c.run(ctx, procedure.ChainPromote, req.Seq)
}

func (c *ExecChains) Demote(ctx context.Context, req capability.Request) error {
	return c.run(ctx, procedure.ChainDemote, req.Seq)
}

// Rejoin has nothing to do: a chain-configured workload follows nobody.
func (c *ExecChains) Rejoin(context.Context, capability.Request) error { return nil }

func (c *ExecChains) Check(ctx context.Context, req capability.Request) (capability.Status, error) {
	return capability.Status{}, c.run(ctx, procedure.ChainCheck, req.Seq)
}

// run drives one chain to its end: the steps on goroutines under their
// deadlines, the runner's overrun backstop, and, when ctx ends first (a
// later request superseded it), the chain abandoned with its step cancelled.
func (c *ExecChains) run(ctx context.Context, kind procedure.ChainKind, seq uint64) error {
	start := time.Now()
	now := func() time.Duration { return time.Since(start) }
	r := procedure.NewRunner(c.resource, c.spec)
	// Each step of the chain runs at most once per call: room for all.
	results := make(chan procedure.StepResult, len(c.spec.Chain(kind).Steps)+1)
	cancels := map[uint64]context.CancelFunc{}
	defer func() {
		for _, cancel := range cancels {
			cancel()
		}
	}()
	out := r.Run(now(), kind, seq)
	for {
		if c.record != nil {
			c.record(out.Events...)
		}
		for _, id := range out.Cancel {
			if cancel, ok := cancels[id]; ok {
				cancel()
				delete(cancels, id)
			}
		}
		for _, run := range out.Start {
			sctx, cancel := context.WithTimeout(context.Background(), run.Deadline-now())
			cancels[run.RunID] = cancel
			go func() {
				o := c.drivers.Run(sctx, run.Step)
				results <- procedure.StepResult{RunID: run.RunID, Outcome: o}
			}()
		}
		if d := out.Done; d != nil {
			if d.OK {
				return nil
			}
			return errors.New(d.Detail)
		}
		var wake <-chan time.Time
		if at, ok := r.NextWake(); ok {
			t := time.NewTimer(max(at-now(), time.Millisecond))
			defer t.Stop()
			wake = t.C
		}
		select {
		case res := <-results:
			delete(cancels, res.RunID)
			out = r.StepDone(now(), res)
		case <-wake:
			out = r.Tick(now())
		case <-ctx.Done():
			out = r.Abandon(now(), "superseded")
			if c.record != nil {
				c.record(out.Events...)
			}
			return ctx.Err()
		}
	}
}
