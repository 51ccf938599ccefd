package resources

import (
	"context"
	"errors"
)

// Runs receives the commands a reconciler runs (shell jobs, init steps):
// the audit record. The caller measures time: Started returns the function
// to call with the outcome.
type Runs interface {
	Started(id, step string, command []string) (done func(exitCode int, timedOut bool, detail string))
}

type runsKey struct{}

// WithRuns returns ctx carrying r.
func WithRuns(ctx context.Context, r Runs) context.Context {
	return context.WithValue(ctx, runsKey{}, r)
}

func runsOf(ctx context.Context) Runs {
	if r, ok := ctx.Value(runsKey{}).(Runs); ok {
		return r
	}
	return noRuns{}
}

type noRuns struct{}

func (noRuns) Started(string, string, []string) func(int, bool, string) {
	return func(int, bool, string) {}
}

// ErrRefused wraps a reconcile the node's configuration does not allow
// (the agent reports the resource as Refused, and does not retry).
var ErrRefused = errors.New("refused by the node's configuration")
