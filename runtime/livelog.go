package runtime

import (
	"sync"
	"sync/atomic"
	"time"

	"understudy/actors/failover"
)

// liveLogSize is how many of a node's liveness inputs its log keeps for
// members to take in. A member takes them in at least once per
// heartbeat_timeout (its next wake is never further), and a node sees one
// liveness record per node of the deployment and one liveness result per
// heartbeat: a member falls behind it only when its node has thousands of
// nodes' records or the member has not stepped for minutes.
const liveLogSize = 4096

// liveLog is the node's liveness inputs — every node's liveness records
// from the node's watch, the node's own liveness results, the bridge's
// Resynced — in the order the node saw them, each with when it saw them.
// Members take them in at their next step (memberActor.takeLive), dated
// (failover.LivenessObserved.At, failover.LivenessResult.At), instead of
// one step per member per record: at thousands of members per node, the
// routine beats alone were most of an idle node's CPU. An input every
// member must act on at once (failover.LivenessUrgent: about the node's
// own record or writes) is logged too, and every member is woken to take
// in the log. Safe for concurrent use; the zero value is ready.
type liveLog struct {
	latest atomic.Uint64 // seq of the latest item (0: none yet)
	mu     sync.Mutex
	ring   [liveLogSize]liveItem
}

type liveItem struct {
	seq uint64
	in  failover.Input
	at  time.Time
}

// add logs in, seen at.
func (l *liveLog) add(in failover.Input, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	seq := l.latest.Load() + 1
	l.ring[seq%liveLogSize] = liveItem{seq: seq, in: in, at: at}
	l.latest.Store(seq)
}

// since appends to buf the items after seq still kept, in order, and
// returns them, the seq of the latest, and how many after seq were no
// longer kept.
func (l *liveLog) since(seq uint64, buf []liveItem) ([]liveItem, uint64, uint64) {
	if l.latest.Load() <= seq {
		return buf, seq, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	latest := l.latest.Load()
	var missed uint64
	if latest-seq > liveLogSize {
		missed = latest - seq - liveLogSize
		seq = latest - liveLogSize
	}
	for s := seq + 1; s <= latest; s++ {
		buf = append(buf, l.ring[s%liveLogSize])
	}
	return buf, latest, missed
}

// dated is in with the time the node saw it on the member's clock (base:
// the member's zero).
func dated(in failover.Input, at time.Time, base time.Time) failover.Input {
	d := at.Sub(base)
	switch in := in.(type) {
	case failover.LivenessObserved:
		in.At = d
		return in
	case failover.LivenessResult:
		in.At = d
		return in
	}
	return in
}
