package failover

import (
	"errors"
	"time"

	"understudy/actors/capability"
	"understudy/events"
)

// Input is something the host tells a member. Every input is handed to
// Member.Step together with the local monotonic time at which it arrived.
type Input interface{ isInput() }

// Tick lets time pass; the host sends one at Member.NextWake or sooner.
type Tick struct{}

// Shutdown asks a member that leads to hand over cleanly before its host
// stops: clean demotion, then leader = none naming the other member. A
// member that does not lead ignores it.
type Shutdown struct{}

// Synced says the watch has delivered every existing entry of the pair's
// keys; what follows is live.
type Synced struct{}

// Resynced is Synced for a watch established afresh after an earlier one
// (it lagged or failed): it delivered the latest entry of each key, so the
// revisions written meanwhile were skipped.
type Resynced struct{}

// WriteErr classifies a failed KV write.
type WriteErr int

const (
	WriteOK          WriteErr = iota + 1
	WriteConflict             // CAS lost: the revision had moved (NATS 10071), or Create on an existing key
	WriteUnavailable          // NATS unreachable, or any other error: the write did not land as far as we know
)

func (e WriteErr) String() string {
	switch e {
	case WriteOK:
		return "ok"
	case WriteConflict:
		return "conflict"
	case WriteUnavailable:
		return "unavailable"
	}
	return "unset"
}

// WriteErrOf classifies the error of a KV write as the member must see it:
// nil is WriteOK, a lost compare-and-set (events.ErrConflict) is
// WriteConflict, anything else WriteUnavailable. The runtime and the
// simulator both classify through it.
func WriteErrOf(err error) WriteErr {
	switch {
	case err == nil:
		return WriteOK
	case errors.Is(err, events.ErrConflict):
		return WriteConflict
	}
	return WriteUnavailable
}

// WriteResult answers a Write of a Ready.
type WriteResult struct {
	Op       uint64
	Err      WriteErr
	Revision uint64 // with WriteOK
	Time     time.Time
	// Current is the register as read after a WriteConflict on the leader
	// key (nil if it could not be read), so the member can tell its own late
	// write from another writer.
	Current *LeaderEntry
	// CurrentLive is the liveness record as read after a WriteConflict of
	// a liveness write or an epoch raise (nil if it could not be read).
	CurrentLive *LivenessEntry
	Cause       string // human detail of a failure
}

// LeaderEntry is one observed revision of the leadership register.
type LeaderEntry struct {
	Rev   uint64
	Time  time.Time // server timestamp
	Value Leader
	// Corrupt: the stored bytes do not decode as a register value. Such a
	// register is held by nobody: Value is then vacant (no site, no
	// handoff), with Term the highest term the key's history shows, so
	// whoever replaces it by CAS takes a term above every earlier one.
	Corrupt bool
	// Forged: the host verifies register values (the deployment has a
	// security section) and this one's signature does not verify against
	// the key of a node that runs the site it names in By (a value that
	// does not decode cannot verify either). The member never takes a
	// forged value for a member's write.
	Forged bool
	// Genuine, when WantsGenuine(entry): the latest entry of the key's
	// history before this one whose value decodes, verifies and is not
	// written for another holder (Leader.ForAnother), as the host read it
	// (nil: none, or the host could not read the history). A member that does not take this
	// entry for a member's write, and did not see that one (its watch
	// started after it, or a read came ahead of the watch), learns from it
	// who holds the register and since when: the compare-and-set it then
	// issues, on this entry's revision, cannot pass over a live holder's
	// beats it never saw.
	Genuine *LeaderEntry
}

// LeaderObserved is a new revision of <pair>.leader seen on the watch.
type LeaderObserved struct{ Entry LeaderEntry }

// HeartbeatObserved is a new revision of <pair>.hb.<site> seen on the
// watch. Site is the key's (HeartbeatSite), never Value.Site.
type HeartbeatObserved struct {
	Rev   uint64
	Time  time.Time
	Site  string
	Value Heartbeat
}

// ConfigObserved is a new revision of <pair>.config. DecodeErr is set when
// the stored bytes could not be decoded (the change is then rejected).
type ConfigObserved struct {
	Rev       uint64
	Rules     Rules
	DecodeErr string
}

// SwitchoverObserved is an operator's switchover request seen on the watch.
type SwitchoverObserved struct {
	Rev     uint64
	Request Switchover
}

// PauseObserved is a new revision of <pair>.pause (a delete of the key is
// one with the zero Pause: not paused).
type PauseObserved struct {
	Rev   uint64
	Pause Pause
}

// ManualFailoverObserved is an operator's failover request seen on the
// watch; Time is the entry's server timestamp.
type ManualFailoverObserved struct {
	Rev     uint64
	Time    time.Time
	Request ManualFailover
}

// ProcKind is a procedure chain run by the member's resource.
type ProcKind int

const (
	ProcFence ProcKind = iota + 1
	ProcPromote
	ProcDemote
	ProcCheck  // a read-only health probe of the workload
	ProcRejoin // make a follower's workload follow the leader
	ProcSync   // make the leader's commits wait for the other member, or stop waiting
)

func (k ProcKind) String() string {
	switch k {
	case ProcFence:
		return "fence"
	case ProcPromote:
		return "promote"
	case ProcDemote:
		return "demote"
	case ProcCheck:
		return "check"
	case ProcRejoin:
		return "rejoin"
	case ProcSync:
		return "sync"
	}
	return "unset"
}

// ProcedureResult answers a Procedure of a Ready.
type ProcedureResult struct {
	Kind   ProcKind
	Seq    uint64
	OK     bool
	Detail string
	// Status is what a check found (nil when the workload reports nothing,
	// or for other kinds).
	Status *capability.Status
}

func (Tick) isInput()                   {}
func (Synced) isInput()                 {}
func (Resynced) isInput()               {}
func (Shutdown) isInput()               {}
func (WriteResult) isInput()            {}
func (LeaderObserved) isInput()         {}
func (HeartbeatObserved) isInput()      {}
func (ConfigObserved) isInput()         {}
func (SwitchoverObserved) isInput()     {}
func (PauseObserved) isInput()          {}
func (ManualFailoverObserved) isInput() {}
func (ProcedureResult) isInput()        {}
