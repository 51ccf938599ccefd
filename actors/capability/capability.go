package capability

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// Workload is what a failover pair needs from the thing it protects. The
// pair (the member machine in actors/failover and its host in runtime) is
// written once over it; a workload that lacks one of these methods does not
// compile as a pair's workload (see runtime.NewWorkloadActor's type
// parameter).
//
// Contract for every method: the host calls at most one of Fence, Promote,
// Demote, Rejoin and SetSynchronous at a time for a member, and cancels ctx
// when a later request supersedes the one in flight (a fence supersedes a
// promote); the method must then return promptly, having stopped what it
// started. Any method may be called again after a timeout or a restart of
// the node, so each must be idempotent: fencing a fenced workload succeeds,
// promoting a primary succeeds. Check may run concurrently with the others
// and must only read (it may stop a workload that runs where it must not,
// see Check).
type Workload interface {
	Fencer
	Promoter
	Demoter
	Rejoiner
	Checker
}

// Fencer makes the workload unable to accept writes. It is role aware: a
// workload that is already unable to (a standby that never promoted in this
// term, a stopped one) is fenced as it is and keeps doing what it does (a
// standby keeps streaming). It must complete within the pair's fence_grace.
type Fencer interface {
	Fence(ctx context.Context, req Request) error
}

// Promoter makes the workload accept writes and returns only once it does:
// the member says it serves only after Promote returned nil.
type Promoter interface {
	Promote(ctx context.Context, req Request) error
}

// Demoter stops the workload accepting writes cleanly, for a planned hand
// over (switchover, failback): unlike Fence it may take its time to let a
// standby receive everything written.
type Demoter interface {
	Demote(ctx context.Context, req Request) error
}

// Rejoiner makes a fenced workload follow the leader named in req (a
// standby streaming from it, rewound or re-cloned when its history
// diverged). It returns nil once the workload follows; the member says it
// is ready only after that and after a passing Check.
type Rejoiner interface {
	Rejoin(ctx context.Context, req Request) error
}

// Checker probes the workload and reports its replication position. A
// non-nil error means the workload is not healthy in its role (a leader
// whose database is down, a follower whose standby does not stream).
// Status is meaningful even with an error (Role says what was found).
type Checker interface {
	Check(ctx context.Context, req Request) (Status, error)
}

// Synchronizer is the optional capability of a workload that replicates
// synchronously on request: SetSynchronous makes every commit wait for the
// peer (req.Synchronous) or stop waiting. Only a workload with it accepts
// the pair rule synchronous: on or strict.
type Synchronizer interface {
	SetSynchronous(ctx context.Context, req Request) error
}

// Request is the context of one call: why the member asks, and what it
// knows of the pair at that moment.
type Request struct {
	Pair string
	Site string
	Seq  uint64 // the member's procedure sequence number
	Term uint64 // the term the member holds, takes or last held
	// Leader is the site that holds the register as the member last saw it
	// ("" when nobody does or it is not known). Rejoin follows it.
	Leader string
	// Reason says why, in the member's words (the fence or demote reason,
	// the acquire reason of a promotion).
	Reason string
	// Serving: Check of a member that serves (a leader); false for a follower.
	Serving bool
	// Synchronous: Promote and SetSynchronous: whether the new or current
	// leader must make every commit wait for its peer.
	Synchronous bool
	// Bootstrap: Promote of a member that takes a register nobody ever held
	// and is the preferred primary: creating the workload from nothing
	// (initdb) is allowed. Never set for a takeover: a replica with nothing
	// to promote must fail rather than serve an empty database.
	Bootstrap bool
}

// Role is what a Check found the workload doing.
type Role int

const (
	RoleDown    Role = iota + 1 // not running
	RolePrimary                 // accepts writes
	RoleStandby                 // running, read only (following, or waiting to)
)

func (r Role) String() string {
	switch r {
	case RoleDown:
		return "down"
	case RolePrimary:
		return "primary"
	case RoleStandby:
		return "standby"
	}
	return "unset"
}

// Status is what a Check reports. Positions are byte offsets in the
// workload's log (for PostgreSQL, WAL LSNs); zero when not reported.
type Status struct {
	Role     Role
	Timeline uint32
	// Positions says the workload reports positions at all: when false
	// (exec chains, a VM) the lag rules do not apply to the pair.
	Positions bool
	Flush     LSN // primary: WAL flushed locally
	Receive   LSN // standby: WAL received and flushed
	Replay    LSN // standby: WAL replayed
	// Streaming: a standby streams from the leader now.
	Streaming bool
	// PeerStreaming: a primary's peer streams from it now; PeerSynchronous:
	// and commits wait for it (synchronous standby).
	PeerStreaming   bool
	PeerSynchronous bool
	// PeerFlush: a primary's view of how far its peer has flushed the log
	// it sent (0: not connected).
	PeerFlush LSN
	// SynchronousSet: a primary is configured to wait for its peer (it may
	// not be connected).
	SynchronousSet bool
	Detail         string // what was found, for people
}

// LSN is a position in a write-ahead log, in bytes.
type LSN uint64

// String writes an LSN as PostgreSQL does: "16/B374D848".
func (l LSN) String() string {
	return strconv.FormatUint(uint64(l)>>32, 16) + "/" + strings.ToUpper(strconv.FormatUint(uint64(l)&0xffffffff, 16))
}

// ParseLSN reads PostgreSQL's text form of an LSN ("16/B374D848").
func ParseLSN(s string) (LSN, error) {
	hi, lo, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return 0, fmt.Errorf("lsn %q: want two hexadecimal numbers separated by '/'", s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("lsn %q: high part: %w", s, err)
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("lsn %q: low part: %w", s, err)
	}
	return LSN(h<<32 | l), nil
}

// Lag is how far behind position pos is of leader, in bytes (0 when ahead).
func Lag(leader, pos LSN) uint64 {
	if pos >= leader {
		return 0
	}
	return uint64(leader - pos)
}

// Watched is the optional capability of a workload guarded by a watchdog
// that fences it when its member's host stops (dies or is paused): the host
// calls Pet from the member's own loop at least every quarter of the
// pair's fence_grace while the member runs. Pet must not block.
type Watched interface {
	Pet()
}
