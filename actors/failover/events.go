package failover

import (
	"time"

	"understudy/actors/capability"
	"understudy/events"
)

// Phase is where a member stands. Only PhaseLeader serves.
type Phase int

const (
	// PhaseStarting: just (re)started; a fence runs before anything else.
	PhaseStarting Phase = iota + 1
	// PhaseFollower: does not hold the register; heartbeats its own key,
	// watches the leader, promotes when the leader is stale.
	PhaseFollower
	// PhaseAcquiring: a CAS to take the register is in flight.
	PhaseAcquiring
	// PhasePromoting: holds the register; the promote procedure runs.
	PhasePromoting
	// PhaseLeader: holds the register and serves.
	PhaseLeader
	// PhaseFencing: the fence procedure runs; the member does not serve.
	PhaseFencing
	// PhaseSuspended: holds the register but is fenced; it heartbeats and
	// unfences after success_threshold consecutive successes.
	PhaseSuspended
	// PhaseDemoting: clean demotion; the demote procedure runs.
	PhaseDemoting
	// PhaseReleasing: demoted; writing leader = none by CAS.
	PhaseReleasing
)

var phaseNames = [...]string{"unset", "starting", "follower", "acquiring", "promoting", "leader", "fencing", "suspended", "demoting", "releasing"}

func (p Phase) String() string {
	if p < 0 || int(p) >= len(phaseNames) {
		return "unset"
	}
	return phaseNames[p]
}

// Phases lists every phase, in order.
func Phases() []Phase {
	out := make([]Phase, 0, len(phaseNames))
	for p := PhaseStarting; int(p) < len(phaseNames); p++ {
		out = append(out, p)
	}
	return out
}

// holds reports whether a member in this phase heartbeats the register.
func (p Phase) holds() bool {
	switch p {
	case PhasePromoting, PhaseLeader, PhaseSuspended, PhaseDemoting, PhaseReleasing:
		return true
	}
	return false
}

// FenceReason says why a member fences.
type FenceReason int

const (
	FenceRestart           FenceReason = iota + 1 // every start comes up fenced
	FenceHeartbeatFailures                        // failure_threshold consecutive failures
	FenceLostRegister                             // someone else wrote the register
	FenceDemoteFailed                             // the clean demotion's procedure failed
)

func (r FenceReason) String() string {
	switch r {
	case FenceRestart:
		return "restart"
	case FenceHeartbeatFailures:
		return "heartbeat-failures"
	case FenceLostRegister:
		return "lost-register"
	case FenceDemoteFailed:
		return "demote-failed"
	}
	return "unset"
}

// AfterFence says what a member does once its fence procedure completed.
type AfterFence int

const (
	AfterSuspend AfterFence = iota + 1 // keep holding the register, fenced
	AfterFollow                        // follow the new leader
	AfterResume                        // look at the register: hold if it names us, else follow
	AfterRelease                       // write leader = none
)

func (a AfterFence) String() string {
	switch a {
	case AfterSuspend:
		return "suspend"
	case AfterFollow:
		return "follow"
	case AfterResume:
		return "resume"
	case AfterRelease:
		return "release"
	}
	return "unset"
}

// AcquireReason says why a follower tries to take the register.
type AcquireReason int

const (
	AcquireStale     AcquireReason = iota + 1 // the leader's writes are older than failover_timeout
	AcquireHandoff                            // leader = none names us (demotion handshake)
	AcquireBootstrap                          // the register was never written
	AcquireVacant                             // leader = none and we are the preferred primary
	AcquireOperator                           // an operator's failover request (understudy failover --to)
)

func (r AcquireReason) String() string {
	switch r {
	case AcquireStale:
		return "stale"
	case AcquireHandoff:
		return "handoff"
	case AcquireBootstrap:
		return "bootstrap"
	case AcquireVacant:
		return "vacant"
	case AcquireOperator:
		return "operator"
	}
	return "unset"
}

// DemoteReason says why a leader steps down cleanly.
type DemoteReason int

const (
	DemoteFailback      DemoteReason = iota + 1 // the preferred primary is back (failback: auto)
	DemoteSwitchover                            // an operator asked for it
	DemotePromoteFailed                         // the promote procedure failed
	DemoteShutdown                              // the host is stopping
	DemoteCheckFailed                           // the serving resource failed its health checks
)

func (r DemoteReason) String() string {
	switch r {
	case DemoteFailback:
		return "failback"
	case DemoteSwitchover:
		return "switchover"
	case DemotePromoteFailed:
		return "promote-failed"
	case DemoteShutdown:
		return "shutdown"
	case DemoteCheckFailed:
		return "check-failed"
	}
	return "unset"
}

// The member's durable events, appended to ev.failover.<pair>.<site>.
// Each records a transition; Apply folds them into the member's state.

// Started: the member (re)started and comes up fenced.
type Started struct {
	Pair  string `msgpack:"pair"`
	Site  string `msgpack:"site"`
	Rules Rules  `msgpack:"rules"`
}

// FenceRequested: the member stops serving and runs its fence procedure.
type FenceRequested struct {
	Seq    uint64      `msgpack:"seq"` // procedure sequence; results carry it back
	Reason FenceReason `msgpack:"why"`
	Term   uint64      `msgpack:"term"`
	Then   AfterFence  `msgpack:"then"`
}

// Fenced: the fence procedure completed.
type Fenced struct {
	Seq uint64 `msgpack:"seq"`
}

// FenceFailed: every step of the fence procedure failed; it is retried.
type FenceFailed struct {
	Seq    uint64 `msgpack:"seq"`
	Detail string `msgpack:"detail"`
}

// HeartbeatFailed: a register write failed (timeout, error or own-write conflict).
type HeartbeatFailed struct {
	Term     uint64 `msgpack:"term"`
	Failures int    `msgpack:"n"` // consecutive, including this one
	Cause    string `msgpack:"cause"`
}

// HeartbeatRecovered: a register write succeeded after failures.
type HeartbeatRecovered struct {
	Term          uint64 `msgpack:"term"`
	AfterFailures int    `msgpack:"after"`
}

// AcquireAttempted: a follower tries to take the register by CAS.
type AcquireAttempted struct {
	Reason    AcquireReason `msgpack:"why"`
	Term      uint64        `msgpack:"term"` // the term it would hold
	ExpectRev uint64        `msgpack:"expect"`
	Stale     time.Duration `msgpack:"stale,omitempty"` // server-time staleness it saw
}

// Promoted: the CAS won; the member holds the register and promotes.
type Promoted struct {
	Seq    uint64        `msgpack:"seq"`
	Term   uint64        `msgpack:"term"`
	Rev    uint64        `msgpack:"rev"`
	Reason AcquireReason `msgpack:"why"`
	// Planned: an operator handed leadership here; failback: auto leaves it.
	Planned bool `msgpack:"planned,omitempty"`
}

// PromotionRejected: the CAS lost: the register moved since the member saw it.
type PromotionRejected struct {
	Term       uint64 `msgpack:"term"`
	ExpectRev  uint64 `msgpack:"expect"`
	CurrentRev uint64 `msgpack:"cur_rev,omitempty"`
	Current    Leader `msgpack:"cur"`
}

// AcquireFailed: the acquire write failed or timed out without an answer.
type AcquireFailed struct {
	Term  uint64 `msgpack:"term"`
	Cause string `msgpack:"cause"`
}

// Resumed: the register names this member though it did not know it held
// it (restart, or an acquire whose answer was lost); it holds it fenced.
type Resumed struct {
	Term uint64 `msgpack:"term"`
	Rev  uint64 `msgpack:"rev"`
}

// Unfenced: success_threshold consecutive heartbeats while suspended; the
// member promotes again in the same term.
type Unfenced struct {
	Seq  uint64 `msgpack:"seq"`
	Term uint64 `msgpack:"term"`
}

// ServingStarted: the promote procedure completed; the member serves.
type ServingStarted struct {
	Seq  uint64 `msgpack:"seq"`
	Term uint64 `msgpack:"term"`
}

// PromoteFailed: the promote procedure failed.
type PromoteFailed struct {
	Seq    uint64 `msgpack:"seq"`
	Detail string `msgpack:"detail"`
}

// LeadershipLost: another writer holds the register; the member fences and
// never heartbeats this term again.
type LeadershipLost struct {
	Term   uint64 `msgpack:"term"`
	Rev    uint64 `msgpack:"rev"`
	Holder Leader `msgpack:"holder"`
	// Epoch (leadership: node), when set: the lease was lost because the
	// node's epoch moved past the lease's (another node raised it): the
	// node's epoch now. Rev and Holder are then empty.
	Epoch uint64 `msgpack:"epoch,omitempty"`
}

// EpochRaised (leadership: node): this follower raised the epoch of the
// holder's node, whose liveness it judged stale (Stale: for how long, by
// server time), before taking the register: every lease of the old epoch
// is over. Rev is the liveness record's revision the raise wrote.
type EpochRaised struct {
	Node  string        `msgpack:"node"`
	Epoch uint64        `msgpack:"epoch"`
	Rev   uint64        `msgpack:"rev"`
	Stale time.Duration `msgpack:"stale"`
}

// DemotionRequested: clean demotion starts (stop serving, then leader = none).
type DemotionRequested struct {
	Seq     uint64       `msgpack:"seq"`
	Reason  DemoteReason `msgpack:"why"`
	Handoff string       `msgpack:"to,omitempty"`
}

// Demoted: the demote procedure completed; the member no longer serves.
type Demoted struct {
	Seq uint64 `msgpack:"seq"`
}

// DemoteFailed: the demote procedure failed; the member escalates to fencing.
type DemoteFailed struct {
	Seq    uint64 `msgpack:"seq"`
	Detail string `msgpack:"detail"`
}

// Released: leader = none written; the member follows.
type Released struct {
	Term    uint64 `msgpack:"term"`
	Rev     uint64 `msgpack:"rev"`
	Handoff string `msgpack:"to,omitempty"`
}

// ConfigApplied: new rules from <pair>.config are in force.
type ConfigApplied struct {
	Rev   uint64 `msgpack:"rev"`
	Rules Rules  `msgpack:"rules"`
}

// ConfigRejected: rules from <pair>.config broke a rule; the old ones stay.
type ConfigRejected struct {
	Rev   uint64 `msgpack:"rev"`
	Field string `msgpack:"field"`
	Rule  string `msgpack:"rule"`
	Value string `msgpack:"value"`
}

// SwitchoverAccepted: the leader starts a clean demotion towards To.
type SwitchoverAccepted struct {
	ID string `msgpack:"id"`
	To string `msgpack:"to"`
}

// CheckFailed: the serving resource failed a health check (the check
// chain) Failures times in a row. HandOver says the leader steps down for
// it; when the other member is not ready it keeps leading (Detail says so).
type CheckFailed struct {
	Seq      uint64 `msgpack:"seq"`
	Failures int    `msgpack:"n"`
	Detail   string `msgpack:"detail"`
	HandOver bool   `msgpack:"handover"`
}

// CheckRecovered: a health check passed after failures.
type CheckRecovered struct {
	Seq           uint64 `msgpack:"seq"`
	AfterFailures int    `msgpack:"after"`
}

// SwitchoverRejected: the leader refused a switchover request and keeps
// leading. Reason says why (the target is not heartbeating ready).
type SwitchoverRejected struct {
	ID     string `msgpack:"id"`
	To     string `msgpack:"to"`
	Reason string `msgpack:"reason"`
}

// MemberStopped: the node's host recorded that a member stopped while its
// node runs on (another process appends to its event subject, or it
// refused its rules), and when it restarts it. The host writes it on
// HostSubject, never on the member's own subject.
type MemberStopped struct {
	Reason    string        `msgpack:"reason"`
	Stops     int           `msgpack:"stops"` // stops of this member since the node started
	RestartIn time.Duration `msgpack:"restart_in"`
}

func (*MemberStopped) EventType() string { return "failover.member_stopped" }

// RejoinRequested: a follower asks its workload to follow Leader (the
// holder of term Term): a standby streaming from it, rewound or re-cloned
// when its history diverged.
type RejoinRequested struct {
	Seq    uint64 `msgpack:"seq"`
	Leader string `msgpack:"leader"`
	Term   uint64 `msgpack:"term"`
}

// Rejoined: the workload follows Leader.
type Rejoined struct {
	Seq    uint64 `msgpack:"seq"`
	Leader string `msgpack:"leader"`
	Term   uint64 `msgpack:"term"`
}

// RejoinFailed: the rejoin did not complete; it is retried after RetryIn.
type RejoinFailed struct {
	Seq     uint64        `msgpack:"seq"`
	Detail  string        `msgpack:"detail"`
	RetryIn time.Duration `msgpack:"retry_in"`
}

// PromotionWithheld: the leader is stale, but this member does not take
// over, and says why with the numbers: its lag at the last contact is over
// maximum_lag_on_failover, its position is unknown, or (synchronous: on or
// strict) the register says the leader ran asynchronously. Recorded once
// per register revision; the member takes over as soon as the reason goes.
type PromotionWithheld struct {
	LeaderRev   uint64         `msgpack:"rev"`
	Reason      string         `msgpack:"reason"`
	LeaderFlush capability.LSN `msgpack:"leader_flush,omitempty"`
	Receive     capability.LSN `msgpack:"receive,omitempty"`
	Lag         uint64         `msgpack:"lag,omitempty"`
	Limit       uint64         `msgpack:"limit"`
	Synchronous Synchronous    `msgpack:"sync"`
}

// ReplicationModeChanged: a register write saying whether the leader's
// commits wait for the other member (Synchronous) landed at Rev. It is
// written once the workload enforces it, and before it stops doing so.
type ReplicationModeChanged struct {
	Term        uint64 `msgpack:"term"`
	Rev         uint64 `msgpack:"rev"`
	Synchronous bool   `msgpack:"sync"`
}

// AutomationPaused: the member saw the pair paused (<pair>.pause): it
// takes over no stale leader, and as a leader hands over neither for
// failback nor for failed checks. Fencing on its own heartbeat failures
// stays, and so do operators' switchovers and failovers.
type AutomationPaused struct {
	ID     string `msgpack:"id"`
	Rev    uint64 `msgpack:"rev"`
	Reason string `msgpack:"reason,omitempty"`
}

// AutomationResumed: the member saw the pause lifted (understudy resume,
// or the key deleted; Rev 0: the key was gone when the member started):
// automatic failover, failback and hand-overs apply again.
type AutomationResumed struct {
	ID  string `msgpack:"id,omitempty"`
	Rev uint64 `msgpack:"rev"`
}

// ManualFailoverAccepted: this member takes the register of a holder that
// is gone, as an operator asked (request ID). Forced: the lag rules would
// have refused it (Overrode says why), and LeaderFlush, Receive and Lag
// say what it may lose (unknown when zero).
type ManualFailoverAccepted struct {
	ID          string         `msgpack:"id"`
	To          string         `msgpack:"to"`
	Forced      bool           `msgpack:"forced,omitempty"`
	Overrode    string         `msgpack:"overrode,omitempty"`
	Holder      string         `msgpack:"holder,omitempty"` // the register's holder it replaces ("" none)
	LeaderRev   uint64         `msgpack:"rev"`
	Stale       time.Duration  `msgpack:"stale,omitempty"`
	LeaderFlush capability.LSN `msgpack:"leader_flush,omitempty"`
	Receive     capability.LSN `msgpack:"receive,omitempty"`
	Lag         uint64         `msgpack:"lag,omitempty"`
}

// ManualFailoverRejected: this member refused an operator's failover
// request and does not take the register: the holder is alive (use a
// switchover), the lag rules forbid it (the numbers; --force overrides),
// or the request lapsed.
type ManualFailoverRejected struct {
	ID          string         `msgpack:"id"`
	To          string         `msgpack:"to"`
	Reason      string         `msgpack:"reason"`
	LeaderFlush capability.LSN `msgpack:"leader_flush,omitempty"`
	Receive     capability.LSN `msgpack:"receive,omitempty"`
	Lag         uint64         `msgpack:"lag,omitempty"`
	Limit       uint64         `msgpack:"limit,omitempty"`
	Synchronous Synchronous    `msgpack:"sync,omitempty"`
}

// ForgedValueIgnored: a revision of the register is not a value a member
// wrote (Reason says how this member can tell: its signature does not
// verify, its writer is not the holder it names, or leader = none was not
// written by the holder in its term). The member does not take it for a
// member's write: a follower neither promotes on it nor counts it as the
// holder's beat; a holder (Holder) keeps the register and replaces the
// value by CAS at its next write. Recorded once per revision; Value is the
// value as written, without its signature.
type ForgedValueIgnored struct {
	Rev    uint64 `msgpack:"rev"`
	Reason string `msgpack:"reason"`
	Value  Leader `msgpack:"value"`
	Holder bool   `msgpack:"holder,omitempty"`
}

func (*ForgedValueIgnored) EventType() string { return "failover.forged_value_ignored" }

func (*AutomationPaused) EventType() string       { return "failover.automation_paused" }
func (*AutomationResumed) EventType() string      { return "failover.automation_resumed" }
func (*ManualFailoverAccepted) EventType() string { return "failover.manual_failover_accepted" }
func (*ManualFailoverRejected) EventType() string { return "failover.manual_failover_rejected" }

func (*RejoinRequested) EventType() string        { return "failover.rejoin_requested" }
func (*Rejoined) EventType() string               { return "failover.rejoined" }
func (*RejoinFailed) EventType() string           { return "failover.rejoin_failed" }
func (*PromotionWithheld) EventType() string      { return "failover.promotion_withheld" }
func (*ReplicationModeChanged) EventType() string { return "failover.replication_mode_changed" }

func (*Started) EventType() string            { return "failover.started" }
func (*FenceRequested) EventType() string     { return "failover.fence_requested" }
func (*Fenced) EventType() string             { return "failover.fenced" }
func (*FenceFailed) EventType() string        { return "failover.fence_failed" }
func (*HeartbeatFailed) EventType() string    { return "failover.heartbeat_failed" }
func (*HeartbeatRecovered) EventType() string { return "failover.heartbeat_recovered" }
func (*AcquireAttempted) EventType() string   { return "failover.acquire_attempted" }
func (*Promoted) EventType() string           { return "failover.promoted" }
func (*PromotionRejected) EventType() string  { return "failover.promotion_rejected" }
func (*AcquireFailed) EventType() string      { return "failover.acquire_failed" }
func (*Resumed) EventType() string            { return "failover.resumed" }
func (*Unfenced) EventType() string           { return "failover.unfenced" }
func (*ServingStarted) EventType() string     { return "failover.serving_started" }
func (*PromoteFailed) EventType() string      { return "failover.promote_failed" }
func (*LeadershipLost) EventType() string     { return "failover.leadership_lost" }
func (*EpochRaised) EventType() string        { return "failover.epoch_raised" }
func (*DemotionRequested) EventType() string  { return "failover.demotion_requested" }
func (*Demoted) EventType() string            { return "failover.demoted" }
func (*DemoteFailed) EventType() string       { return "failover.demote_failed" }
func (*Released) EventType() string           { return "failover.released" }
func (*ConfigApplied) EventType() string      { return "failover.config_applied" }
func (*ConfigRejected) EventType() string     { return "failover.config_rejected" }
func (*SwitchoverAccepted) EventType() string { return "failover.switchover_accepted" }
func (*SwitchoverRejected) EventType() string { return "failover.switchover_rejected" }
func (*CheckFailed) EventType() string        { return "failover.check_failed" }
func (*CheckRecovered) EventType() string     { return "failover.check_recovered" }

// RegisterEvents adds the member's event types (schema version 1) to reg.
func RegisterEvents(reg *events.Registry) error {
	for _, ev := range []events.Event{
		&Started{}, &FenceRequested{}, &Fenced{}, &FenceFailed{}, &HeartbeatFailed{},
		&HeartbeatRecovered{}, &AcquireAttempted{}, &Promoted{}, &PromotionRejected{},
		&AcquireFailed{}, &Resumed{}, &Unfenced{}, &ServingStarted{}, &PromoteFailed{},
		&LeadershipLost{}, &DemotionRequested{}, &Demoted{}, &DemoteFailed{}, &Released{},
		&ConfigApplied{}, &ConfigRejected{}, &SwitchoverAccepted{}, &SwitchoverRejected{},
		&CheckFailed{}, &CheckRecovered{}, &MemberStopped{},
		&RejoinRequested{}, &Rejoined{}, &RejoinFailed{}, &PromotionWithheld{}, &ReplicationModeChanged{},
		&AutomationPaused{}, &AutomationResumed{}, &ManualFailoverAccepted{}, &ManualFailoverRejected{},
		&ForgedValueIgnored{}, &EpochRaised{},
	} {
		if err := reg.Register(ev, 1); err != nil {
			return err
		}
	}
	return nil
}

// HostSubject is where a node records what happened to one of its members
// from outside the member (MemberStopped): not the member's own subject,
// which only the member appends to.
func HostSubject(pair, site string) string { return "ev.host." + pair + "." + site }

// Subject is the event subject of one member.
func Subject(pair, site string) string { return "ev.failover." + pair + "." + site }
