package procedure

import (
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"understudy/events"
)

// ChainKind names a procedure chain. The values of fence, promote and demote
// match failover.ProcKind, so a host converts one into the other directly.
type ChainKind int

const (
	ChainFence ChainKind = iota + 1
	ChainPromote
	ChainDemote
	ChainCheck // a read-only probe; never interrupts the others
	// A workload's own procedures (capability.Workload), recorded by the
	// host with the same events; exec chains have none of them.
	ChainRejoin
	ChainSync
)

func (k ChainKind) String() string {
	switch k {
	case ChainFence:
		return "fence"
	case ChainPromote:
		return "promote"
	case ChainDemote:
		return "demote"
	case ChainCheck:
		return "check"
	case ChainRejoin:
		return "rejoin"
	case ChainSync:
		return "sync"
	}
	return "unset"
}

// OutcomeResult is how a step ended.
type OutcomeResult int

const (
	ResultOK OutcomeResult = iota + 1
	ResultFailed
	ResultTimedOut
)

func (r OutcomeResult) String() string {
	switch r {
	case ResultOK:
		return "ok"
	case ResultFailed:
		return "failed"
	case ResultTimedOut:
		return "timed-out"
	}
	return "unset"
}

// Outcome is what a driver reports for one step. Any Result but ResultOK
// escalates to the next step.
type Outcome struct {
	Result   OutcomeResult
	ExitCode int    // the command's exit code; -1 when there was none
	Detail   string // what happened, for people; the runner bounds it
}

// StepRun asks the host to run Step with its driver, under a context whose
// deadline is Deadline (local monotonic time), and to answer with a
// StepResult carrying RunID.
type StepRun struct {
	RunID    uint64
	Kind     ChainKind
	Seq      uint64
	Index    int
	Step     StepSpec
	Deadline time.Duration
}

// StepResult answers a StepRun.
type StepResult struct {
	RunID   uint64
	Outcome Outcome
}

// ChainResult is the end of a chain: the answer to the Run with Kind and Seq.
type ChainResult struct {
	Kind   ChainKind
	Seq    uint64
	OK     bool
	Detail string
}

// Out is what the host does after an input: append Events, start the steps
// of Start, cancel the contexts of the runs in Cancel (their late results
// are ignored), and report Done when it is set.
type Out struct {
	Events []events.Event
	Start  []StepRun
	Cancel []uint64
	Done   *ChainResult
}

// StepOverrun is how long past its deadline a step may take to report
// before Tick abandons it as timed out: a backstop for a driver that does
// not honour its context, so a chain (and the member waiting on it) never
// hangs. A late result of an abandoned step is ignored.
const StepOverrun = 5 * time.Second

// Bounds of the texts that go into events.
const (
	maxDetail  = 4096
	maxSummary = 256
)

// Runner runs one resource's chains, one chain at a time. It is a pure
// state machine: not safe for concurrent use, no clock, no goroutines.
type Runner struct {
	resource string
	spec     Spec
	lastRun  uint64
	cur      *chain // nil when idle
}

// chain is the chain in flight and its current step.
type chain struct {
	kind    ChainKind
	seq     uint64
	steps   []StepSpec
	started time.Duration
	step    int
	run     uint64
	stepAt  time.Duration
	dueAt   time.Duration // the step's deadline
	lastErr string        // the latest step failure, for the chain's detail
}

// NewRunner returns an idle runner for resource. spec must have passed
// Validate; the runner keeps it (and its slices) without copying.
func NewRunner(resource string, spec Spec) *Runner {
	return &Runner{resource: resource, spec: spec}
}

// Busy reports the kind and seq of the chain in flight, if any.
func (r *Runner) Busy() (ChainKind, uint64, bool) {
	if r.cur == nil {
		return 0, 0, false
	}
	return r.cur.kind, r.cur.seq, true
}

// Run starts chain kind for request seq. It supersedes the chain in flight
// (which ends with a chain_finished event but no Done: its requester has
// moved on), except that a check never interrupts a fence, promote or
// demote: it is refused at once instead. Run with the kind and seq of the
// chain in flight is a redelivery and changes nothing. An invalid kind is a
// bug in the caller and panics.
func (r *Runner) Run(now time.Duration, kind ChainKind, seq uint64) Out {
	if kind < ChainFence || kind > ChainCheck {
		panic(fmt.Sprintf("procedure: Run with invalid chain kind %d", int(kind)))
	}
	var out Out
	steps := r.spec.Chain(kind).Steps
	if c := r.cur; c != nil {
		if c.kind == kind && c.seq == seq {
			return out
		}
		if kind == ChainCheck && c.kind != ChainCheck {
			detail := fmt.Sprintf("refused: %s seq %d is in flight", c.kind, c.seq)
			r.emit(&out, &ChainStarted{Resource: r.resource, Kind: kind, Seq: seq, Steps: len(steps)})
			r.emit(&out, &ChainFinished{Resource: r.resource, Kind: kind, Seq: seq, Detail: detail})
			out.Done = &ChainResult{Kind: kind, Seq: seq, Detail: detail}
			return out
		}
		out.Cancel = append(out.Cancel, c.run)
		r.emit(&out, &ChainFinished{
			Resource: r.resource, Kind: c.kind, Seq: c.seq, Superseded: true, Took: now - c.started,
			Detail: fmt.Sprintf("superseded by %s seq %d during step %d %q", kind, seq, c.step, c.steps[c.step].Name),
		})
		r.cur = nil
	}
	r.emit(&out, &ChainStarted{Resource: r.resource, Kind: kind, Seq: seq, Steps: len(steps)})
	if len(steps) == 0 {
		r.finish(&out, &chain{kind: kind, seq: seq, started: now}, now, true, "no "+kind.String()+" steps configured")
		return out
	}
	r.cur = &chain{kind: kind, seq: seq, steps: steps, started: now}
	r.startStep(&out, now, 0)
	return out
}

// StepDone feeds the outcome of a step. A result for a run that is not the
// current step (superseded, abandoned, or unknown) is ignored.
func (r *Runner) StepDone(now time.Duration, res StepResult) Out {
	var out Out
	c := r.cur
	if c == nil || res.RunID != c.run {
		return out
	}
	r.endStep(&out, now, res.Outcome)
	return out
}

// Abandon ends the chain in flight, if any, as superseded (its requester
// moved on and gets no answer), cancelling its step.
func (r *Runner) Abandon(now time.Duration, detail string) Out {
	var out Out
	c := r.cur
	if c == nil {
		return out
	}
	out.Cancel = append(out.Cancel, c.run)
	r.emit(&out, &ChainFinished{
		Resource: r.resource, Kind: c.kind, Seq: c.seq, Superseded: true, Took: now - c.started,
		Detail: truncate(fmt.Sprintf("%s during step %d %q", detail, c.step, c.steps[c.step].Name), maxDetail),
	})
	r.cur = nil
	return out
}

// NextWake is when Tick next has something to do: the current step's
// deadline plus StepOverrun. ok is false when no step is in flight.
func (r *Runner) NextWake() (at time.Duration, ok bool) {
	if r.cur == nil {
		return 0, false
	}
	return r.cur.dueAt + StepOverrun, true
}

// Tick abandons the current step as timed out when its driver has not
// reported within StepOverrun of its deadline, cancels it and escalates.
func (r *Runner) Tick(now time.Duration) Out {
	var out Out
	c := r.cur
	if c == nil || now < c.dueAt+StepOverrun {
		return out
	}
	out.Cancel = append(out.Cancel, c.run)
	r.endStep(&out, now, Outcome{
		Result:   ResultTimedOut,
		ExitCode: -1,
		Detail:   fmt.Sprintf("driver did not report within %v of the deadline; step abandoned", StepOverrun),
	})
	return out
}

func (r *Runner) startStep(out *Out, now time.Duration, i int) {
	c := r.cur
	r.lastRun++
	step := c.steps[i]
	c.step, c.run, c.stepAt, c.dueAt = i, r.lastRun, now, now+step.Timeout
	r.emit(out, &StepStarted{
		Resource: r.resource, Kind: c.kind, Seq: c.seq, Index: i, Name: step.Name,
		Driver: step.Driver, Command: step.Summary(), Timeout: step.Timeout,
	})
	out.Start = append(out.Start, StepRun{RunID: c.run, Kind: c.kind, Seq: c.seq, Index: i, Step: step, Deadline: c.dueAt})
}

// endStep records the current step's outcome, then escalates or finishes.
func (r *Runner) endStep(out *Out, now time.Duration, o Outcome) {
	c := r.cur
	step := c.steps[c.step]
	detail := truncate(o.Detail, maxDetail)
	r.emit(out, &StepFinished{
		Resource: r.resource, Kind: c.kind, Seq: c.seq, Index: c.step, Name: step.Name,
		Result: o.Result, ExitCode: o.ExitCode, Detail: detail, Took: now - c.stepAt,
	})
	if o.Result == ResultOK {
		msg := fmt.Sprintf("step %d %q ok", c.step, step.Name)
		if c.step > 0 {
			msg += " after " + plural(c.step, "failed step")
		}
		r.finish(out, c, now, true, msg)
		return
	}
	c.lastErr = fmt.Sprintf("step %d %q %s", c.step, step.Name, o.Result)
	if o.Result == ResultFailed && o.ExitCode >= 0 {
		c.lastErr += " (exit " + strconv.Itoa(o.ExitCode) + ")"
	}
	if detail != "" {
		c.lastErr += ": " + detail
	}
	if c.step+1 < len(c.steps) {
		r.startStep(out, now, c.step+1)
		return
	}
	r.finish(out, c, now, false, fmt.Sprintf("all %s failed; last: %s", plural(len(c.steps), "step"), c.lastErr))
}

func (r *Runner) finish(out *Out, c *chain, now time.Duration, ok bool, detail string) {
	detail = truncate(detail, maxDetail)
	r.emit(out, &ChainFinished{Resource: r.resource, Kind: c.kind, Seq: c.seq, OK: ok, Detail: detail, Took: now - c.started})
	out.Done = &ChainResult{Kind: c.kind, Seq: c.seq, OK: ok, Detail: detail}
	r.cur = nil
}

func (r *Runner) emit(out *Out, ev events.Event) { out.Events = append(out.Events, ev) }

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = " …"
	cut := n - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
