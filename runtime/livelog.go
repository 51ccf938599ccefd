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
// routine beats alone were most of an idle node's CPU. An input a member
// must act on at once (a raised epoch, a failed liveness write, a value
// not genuine: see urgentLive) is still logged, and every member is woken
// to take in the log. Safe for concurrent use; the zero value is ready.
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

// add logs in, seen at, and returns its seq.
func (l *liveLog) add(in failover.Input, at time.Time) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	seq := l.latest.Load() + 1
	l.ring[seq%liveLogSize] = liveItem{seq: seq, in: in, at: at}
	l.latest.Store(seq)
	return seq
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

// urgentLive reports whether every member of node self must take in the
// liveness input at once rather than at its next step: anything of its
// own node's but a routine beat. Another node's records wait for each
// member's next step whatever they say: a member acts on another node's
// raise or new epoch only once it finds that node's holder stale by its
// own clock, and then it is woken for every record anyway
// (failover.Member.Prompt). prev is the node's previous record handed
// over (ok: there was one).
func urgentLive(self string, in failover.Input, prev failover.LivenessEntry, ok bool) bool {
	switch in := in.(type) {
	case failover.LivenessObserved:
		v := in.Entry.Value
		return in.Node == self && (!ok || in.Entry.Forged || prev.Forged || !v.Own() || v.Epoch != prev.Value.Epoch)
	case failover.LivenessResult:
		return in.Err != failover.WriteOK
	}
	return false
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
