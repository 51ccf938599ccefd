package agent

import (
	"time"

	"understudy/events"
)

// PhaseChanged: a resource moved to another phase.
type PhaseChanged struct {
	Agent      string            `msgpack:"agent"`
	ID         string            `msgpack:"id"`
	Kind       string            `msgpack:"kind"`
	Generation uint64            `msgpack:"gen"`
	Phase      Phase             `msgpack:"phase"`
	Error      string            `msgpack:"error,omitempty"`
	Drift      string            `msgpack:"drift,omitempty"` // what a re-observation found different
	Details    map[string]string `msgpack:"details,omitempty"`
	RetryIn    time.Duration     `msgpack:"retry_in,omitempty"`
}

// Deleted: a resource left the manifest and was removed.
type Deleted struct {
	Agent string `msgpack:"agent"`
	ID    string `msgpack:"id"`
	Kind  string `msgpack:"kind"`
	Error string `msgpack:"error,omitempty"`
}

// Ran: a command ran for a resource (a shell job, an init step): the audit
// record, with the command and its outcome.
type Ran struct {
	Agent    string        `msgpack:"agent"`
	ID       string        `msgpack:"id"`
	Step     string        `msgpack:"step"` // "job", or the init step's name
	Command  []string      `msgpack:"cmd"`
	ExitCode int           `msgpack:"exit"`
	TimedOut bool          `msgpack:"timed_out,omitempty"`
	Took     time.Duration `msgpack:"took"`
	Detail   string        `msgpack:"detail,omitempty"`
}

func (*PhaseChanged) EventType() string { return "agent.phase_changed" }
func (*Deleted) EventType() string      { return "agent.deleted" }
func (*Ran) EventType() string          { return "agent.ran" }

// RegisterEvents adds the agent's event types to reg.
func RegisterEvents(reg *events.Registry) error {
	for _, ev := range []events.Event{&PhaseChanged{}, &Deleted{}, &Ran{}} {
		if err := reg.Register(ev, 1); err != nil {
			return err
		}
	}
	return nil
}

// Subject is the event subject of one resource of an agent.
func Subject(agent, id string) string { return "ev.agent." + agent + "." + id }

// Keys of the fleet bucket.
func DesiredKey(agent string) string  { return "desired-state." + agent }
func ActualKey(agent string) string   { return "actual-state." + agent }
func PresenceKey(agent string) string { return "presence." + agent }

// CommandSubject is the request subject of a device command.
func CommandSubject(agent, verb string) string { return "device-commands." + agent + "." + verb }
