package procedure

import (
	"time"

	"understudy/events"
)

// The runner's events, appended to ev.procedure.<resource>. Every chain
// start, step start, step result and chain end is one of them.

// ChainStarted: a chain begins; Steps is how many steps it has (0: nothing
// configured, it completes at once).
type ChainStarted struct {
	Resource string    `msgpack:"res"`
	Kind     ChainKind `msgpack:"kind"`
	Seq      uint64    `msgpack:"seq"`
	Steps    int       `msgpack:"steps"`
}

// StepStarted: a step was handed to its driver.
type StepStarted struct {
	Resource string        `msgpack:"res"`
	Kind     ChainKind     `msgpack:"kind"`
	Seq      uint64        `msgpack:"seq"`
	Index    int           `msgpack:"i"`
	Name     string        `msgpack:"name"`
	Driver   string        `msgpack:"driver"`
	Command  string        `msgpack:"cmd"` // StepSpec.Summary
	Timeout  time.Duration `msgpack:"timeout"`
}

// StepFinished: a step's outcome; Took is measured on the local monotonic
// clock from StepStarted.
type StepFinished struct {
	Resource string        `msgpack:"res"`
	Kind     ChainKind     `msgpack:"kind"`
	Seq      uint64        `msgpack:"seq"`
	Index    int           `msgpack:"i"`
	Name     string        `msgpack:"name"`
	Result   OutcomeResult `msgpack:"result"`
	ExitCode int           `msgpack:"exit"`
	Detail   string        `msgpack:"detail,omitempty"` // at most 4 KiB
	Took     time.Duration `msgpack:"took"`
}

// ChainFinished: a chain ended, successfully or not. Superseded: a later
// Run interrupted it, and its requester gets no answer for it.
type ChainFinished struct {
	Resource   string        `msgpack:"res"`
	Kind       ChainKind     `msgpack:"kind"`
	Seq        uint64        `msgpack:"seq"`
	OK         bool          `msgpack:"ok"`
	Superseded bool          `msgpack:"superseded,omitempty"`
	Detail     string        `msgpack:"detail,omitempty"`
	Took       time.Duration `msgpack:"took"`
}

func (*ChainStarted) EventType() string  { return "procedure.chain_started" }
func (*StepStarted) EventType() string   { return "procedure.step_started" }
func (*StepFinished) EventType() string  { return "procedure.step_finished" }
func (*ChainFinished) EventType() string { return "procedure.chain_finished" }

// RegisterEvents adds the runner's event types (schema version 1) to reg.
func RegisterEvents(reg *events.Registry) error {
	for _, ev := range []events.Event{&ChainStarted{}, &StepStarted{}, &StepFinished{}, &ChainFinished{}} {
		if err := reg.Register(ev, 1); err != nil {
			return err
		}
	}
	return nil
}

// Subject is the event subject of one resource's procedures.
func Subject(resource string) string { return "ev.procedure." + resource }
