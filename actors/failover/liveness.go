package failover

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"understudy/actors"
)

// Node liveness (leadership: node). A node heartbeats one record,
// LivenessKey(node), by compare-and-set on the revision of its own last
// write, carrying its epoch. A pair's register names its holder's node and
// that node's epoch (Leader.Node, Leader.Epoch) and is written only when
// something a reader needs changes: leadership, the holder's fenced flag,
// synchronous replication, the pause, the published log position. The
// holder's lease on the register is good while its node's liveness writes
// land in that epoch:
//
//   - the holder counts its node's liveness writes as its heartbeats (the
//     same failure_threshold, the same fence);
//   - a follower counts the holder node's liveness writes in the register's
//     epoch as the holder's heartbeats (the same staleness rule by server
//     time and by its own clock);
//   - a follower takes over a stale holder by first raising the holder
//     node's epoch by compare-and-set on the record it judged stale, then
//     taking the register by compare-and-set: the old node's next liveness
//     write fails, and every lease it held in the old epoch is over, even
//     if the node comes back before its members noticed.
//
// One write per node per heartbeat, whatever the number of pairs.

// Leadership is how a node's pairs keep leadership: the node file's
// leadership, the simulator's --leadership.
type Leadership int

const (
	// LeadershipPerPair: every holder writes its pair's register every
	// heartbeat_timeout, every follower its heartbeat key (Options without
	// Node): the store's write rate grows with the pairs.
	LeadershipPerPair Leadership = iota + 1
	// LeadershipNode: each node heartbeats one liveness record with its
	// epoch (NodeLiveness); a pair's register names its holder's node and
	// epoch and is written only when it changes (Options.Node).
	LeadershipNode
)

func (l Leadership) String() string {
	switch l {
	case LeadershipPerPair:
		return "per-pair"
	case LeadershipNode:
		return "node"
	}
	return "Leadership(" + strconv.Itoa(int(l)) + ")"
}

// ParseLeadership reads "node" or "per-pair" (case and surrounding space
// do not matter).
func ParseLeadership(s string) (Leadership, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "node":
		return LeadershipNode, nil
	case "per-pair":
		return LeadershipPerPair, nil
	}
	return 0, &actors.ConfigError{Field: "leadership", Value: strconv.Quote(s),
		Rule: "must be node (one liveness write per node and heartbeat, whatever the number of pairs) or per-pair (every member writes its pair's keys every heartbeat)"}
}

// LivenessPrefix starts every liveness key; no pair may be named so
// (Rules.ValidateShape).
const LivenessPrefix = "_live"

// DeploymentPrefix starts the keys of the deployment's own records in the
// failover bucket; no pair may be named so (Rules.ValidateShape).
const DeploymentPrefix = "_deployment"

// DeploymentLeadershipKey holds the leadership every node of the
// deployment runs, recorded by the first node that started with members
// (runtime: checkDeploymentLeadership).
const DeploymentLeadershipKey = DeploymentPrefix + ".leadership"

// LivenessKey is node's liveness record, in the failover bucket (so that
// its revisions compare with the registers').
func LivenessKey(node string) string { return LivenessPrefix + "." + node }

// LivenessNode is the node whose liveness key key is ("" when it is none).
func LivenessNode(key string) string {
	node, ok := strings.CutPrefix(key, LivenessPrefix+".")
	if !ok || node == "" || strings.Contains(node, ".") {
		return ""
	}
	return node
}

// Liveness is the value of a node's liveness record.
type Liveness struct {
	Node  string `msgpack:"nd"`
	Epoch uint64 `msgpack:"e"`
	// Beat counts the node's writes in the epoch; it only grows, so a
	// value written again (a replay) is no beat.
	Beat uint64 `msgpack:"n"`
	// By is the node that wrote the value: Node for its own beats,
	// another node for a raise of the epoch (see Member's takeover).
	By   string `msgpack:"by,omitempty"`
	Sig  []byte `msgpack:"sg,omitempty"`
	Prev uint64 `msgpack:"pv,omitempty"` // the revision the write expected
}

// Own reports whether l is a beat of its node (written by it).
func (l Liveness) Own() bool { return l.By == "" || l.By == l.Node }

func (l Liveness) String() string {
	if l.Own() {
		return fmt.Sprintf("%s(epoch %d, beat %d)", l.Node, l.Epoch, l.Beat)
	}
	return fmt.Sprintf("%s(epoch %d, raised by %s)", l.Node, l.Epoch, l.By)
}

// EncodeLiveness returns the wire form of a liveness record.
func EncodeLiveness(l Liveness) []byte { return mustMarshal(l) }

// DecodeLiveness reads a liveness record.
func DecodeLiveness(b []byte) (Liveness, error) {
	var l Liveness
	if err := decodeValue(b, &l); err != nil {
		return Liveness{}, fmt.Errorf("decode liveness record: %w", err)
	}
	return l, nil
}

// LivenessEntry is one observed revision of a node's liveness record.
type LivenessEntry struct {
	Rev   uint64
	Time  time.Time // server timestamp
	Value Liveness
	// Forged: the host verifies values and this one's signature does not
	// verify against the key of the node named in By (or By is not a node
	// of the deployment). Never a beat, never a raise.
	Forged bool
}

// LivenessObserved is a new revision of a node's liveness record seen on
// the watch (any node's: a member reads its own node's, the register
// holder's and the other member's node's). The node is the key's.
type LivenessObserved struct {
	Node  string
	Entry LivenessEntry
	// At is the local monotonic time at which the host saw the record (0:
	// when it is stepped). A host that hands a routine beat over later
	// than it saw it — the runtime hands them over at the member's next
	// step, not one step per member per beat — dates it here, so the
	// member's clock of the holder's beat runs from when its node saw the
	// beat (which is after the beat landed), never from when the member got
	// round to it.
	At time.Duration
}

// LivenessResult tells every member of a node how the node's latest
// liveness write ended (NodeLiveness.Step's Results): the holder's
// heartbeat and the follower's own beat, in one write.
type LivenessResult struct {
	// Err: WriteOK (landed in Epoch), WriteConflict (the record had moved:
	// another node raised the epoch, now Epoch), WriteUnavailable.
	Err      WriteErr
	Epoch    uint64
	Revision uint64
	Cause    string
	// At is the local monotonic time at which the host had the answer (0:
	// when it is stepped): the holder's lease runs from it, so a result
	// handed over late never lengthens the lease.
	At time.Duration
}

// LivenessUrgent reports whether every member of node self must take in a
// liveness input at once, rather than at its next step (a host that hands
// routine beats over late, dated: LivenessObserved.At). Urgent is
// anything about self's own record but a routine beat — a new epoch, a
// raise by another node, a value not genuine, its first record — and a
// result of self's liveness writes that failed or landed in a new epoch:
// a holder must fence on them. Another node's records are never urgent:
// a member acts on them only once it finds that node's holder stale by
// its own clock, and then its host hands it every input at once
// (Member.Prompt). prev is the record of the input's node handed over
// before (known: there was one); prevEpoch the epoch of self's previous
// liveness result (0: none yet).
func LivenessUrgent(self string, in Input, prev LivenessEntry, known bool, prevEpoch uint64) bool {
	switch in := in.(type) {
	case LivenessObserved:
		v := in.Entry.Value
		return in.Node == self && (!known || in.Entry.Forged || prev.Forged || !v.Own() || v.Epoch != prev.Value.Epoch)
	case LivenessResult:
		return in.Err != WriteOK || (in.Epoch != 0 && in.Epoch != prevEpoch)
	}
	return false
}

// LivenessProbe asks a node's liveness writer for a write now rather than
// at its next interval: a member of the node finds another node's holder
// stale by its own clock and needs its own node's beat with a fresh
// server time (Ready.ProbeLiveness). The writer writes once no write is
// in flight, once for all the probes that came before it, at most once a
// quarter interval; its cadence is unchanged.
type LivenessProbe struct{}

func (LivenessProbe) isInput()    {}
func (LivenessObserved) isInput() {}
func (LivenessResult) isInput()   {}

// NodeInput is an input of NodeLiveness: Tick, Synced, LivenessObserved
// (its own record), WriteResult (of its writes), LivenessProbe.
type NodeInput = Input

// NodeReady is what one NodeLiveness step hands back: the liveness write
// to issue, and the results to hand to every member of the node, in order.
type NodeReady struct {
	Writes  []Write
	Results []LivenessResult
}

// NodeLiveness writes one node's liveness record: every interval, by
// compare-and-set on its own last write. It is a pure machine like Member:
// Step takes an input with the local monotonic time, performs no I/O.
//
// Its first write carries on the epoch of the record as observed before
// Synced. When the record's latest value is not genuine (Forged: a value
// no node signed, or one that does not decode), the host must first hand
// it the latest genuine value of the key's history, then the latest
// value (whose revision the compare-and-set expects): from the forged
// value alone it could not know the epoch, and would write a lower one.
type NodeLiveness struct {
	node     string
	interval time.Duration

	now      time.Duration
	synced   bool
	rec      *LivenessEntry // the record as last seen (watch or read-back)
	epoch    uint64
	rev      uint64 // revision of the own last landed write (0: none yet)
	beat     uint64
	inflight *pendingWrite
	issuedAt time.Duration
	nextAt   time.Duration
	opSeq    uint64
	failures int
	// probe: a member asked for a write now (LivenessProbe), not yet made;
	// probes counts the writes made early for one.
	probe  bool
	probes uint64
	probed bool // the latest write was a probe's
	// Latency of the latest answered write, and the highest over the
	// last window of writes (see Latency).
	latency    time.Duration
	recent     [16]time.Duration
	recentNext int
	writes     uint64
	out        NodeReady
}

// NewNodeLiveness returns the liveness writer of node, writing every
// interval (the heartbeat_timeout of the node's pairs).
func NewNodeLiveness(node string, interval time.Duration) *NodeLiveness {
	return &NodeLiveness{node: node, interval: interval}
}

// Node is the node whose record this writes.
func (n *NodeLiveness) Node() string { return n.node }

// Interval is the time between two writes, and each write's deadline.
func (n *NodeLiveness) Interval() time.Duration { return n.interval }

// Epoch is the node's epoch as its latest write or read-back found it (0:
// none yet).
func (n *NodeLiveness) Epoch() uint64 { return n.epoch }

// Failures is the number of consecutive writes that did not land.
func (n *NodeLiveness) Failures() int { return n.failures }

// Writes is the number of writes issued.
func (n *NodeLiveness) Writes() uint64 { return n.writes }

// Latency reports the answer time of the latest write and the highest
// answer time (a write that timed out counts as interval) over the latest
// writes: the store's write latency as this node sees it.
func (n *NodeLiveness) Latency() (last, worst time.Duration) {
	for _, d := range n.recent {
		worst = max(worst, d)
	}
	return n.latency, worst
}

// Degraded reports whether the store answers this node's writes slowly
// enough that heartbeats are at risk: the worst recent answer took more
// than half the interval. Members fence at failure_threshold missed
// answers; this says so before.
func (n *NodeLiveness) Degraded() bool {
	_, worst := n.Latency()
	return worst > n.interval/2
}

// Start begins writing once the watch has shown the record (Synced).
func (n *NodeLiveness) Start(now time.Duration) NodeReady {
	n.now = now
	n.tick()
	return n.flush()
}

// Step feeds one input that arrived at local monotonic time now.
func (n *NodeLiveness) Step(now time.Duration, in NodeInput) NodeReady {
	if now > n.now {
		n.now = now
	}
	switch in := in.(type) {
	case Synced, Resynced:
		n.synced = true
	case LivenessObserved:
		if in.Node == n.node {
			n.observe(in.Entry)
		}
	case WriteResult:
		n.onResult(in)
	case LivenessProbe:
		// A write issued since (at this very time) answers it.
		n.probe = n.probe || n.writes == 0 || n.now > n.issuedAt
	}
	n.tick()
	return n.flush()
}

// NextWake is when the writer next needs a Tick.
func (n *NodeLiveness) NextWake() time.Duration {
	next := n.now + n.interval
	if n.inflight != nil && n.inflight.deadline < next {
		next = n.inflight.deadline
	}
	if n.nextAt > n.now && n.nextAt < next {
		next = n.nextAt
	}
	if n.probe && n.inflight == nil {
		if at := n.issuedAt + n.interval/4; at > n.now && at < next {
			next = at
		}
	}
	return next
}

// Probes is how many writes the writer made early, asked by a probe.
func (n *NodeLiveness) Probes() uint64 { return n.probes }

func (n *NodeLiveness) flush() NodeReady {
	r := n.out
	n.out = NodeReady{}
	return r
}

func (n *NodeLiveness) observe(e LivenessEntry) {
	if n.rec != nil && e.Rev <= n.rec.Rev {
		return
	}
	n.rec = &e
	if e.Forged {
		return
	}
	if e.Value.Epoch > n.epoch && n.rev != 0 {
		// Raised by another node while this one beat: the next write finds
		// the revision moved and takes the new epoch; its members learn it
		// from that write's result.
		return
	}
	if n.rev == 0 && e.Value.Node == n.node {
		// Before the first write: carry on the record as it stands (a
		// restarted node keeps its epoch; its members come up fenced).
		n.epoch, n.beat = e.Value.Epoch, e.Value.Beat
	}
}

func (n *NodeLiveness) tick() {
	if n.inflight != nil && n.now >= n.inflight.deadline {
		n.inflight = nil
		n.answered(n.interval)
		n.fail("timeout: no answer within heartbeat_timeout")
	}
	if !n.synced || n.inflight != nil {
		return
	}
	switch {
	case n.now >= n.nextAt:
		n.write()
	case n.probe && n.now-n.issuedAt >= n.interval/4: // (before the first write, nextAt is 0)
		next := n.nextAt
		n.write()
		n.nextAt = next // a write more, not a new cadence
		n.probes++
		n.probed = true
	}
}

func (n *NodeLiveness) write() {
	expect := n.rev
	if expect == 0 && n.rec != nil {
		expect = n.rec.Rev
	}
	if n.epoch == 0 {
		n.epoch = 1
	}
	n.beat++
	l := Liveness{Node: n.node, Epoch: n.epoch, Beat: n.beat, By: n.node, Prev: expect}
	n.opSeq++
	w := Write{Op: n.opSeq, Kind: WriteLiveness, Key: LivenessKey(n.node), Live: l, Value: EncodeLiveness(l),
		ExpectRev: expect, Deadline: n.now + n.interval}
	n.inflight = &pendingWrite{op: w.Op, kind: w.Kind, expect: expect, deadline: w.Deadline}
	n.issuedAt = n.now
	n.writes++
	n.probe, n.probed = false, false
	next := n.nextAt + n.interval
	if next <= n.now {
		next = n.now + n.interval
	}
	n.nextAt = next
	n.out.Writes = append(n.out.Writes, w)
}

func (n *NodeLiveness) answered(d time.Duration) {
	n.latency = d
	n.recent[n.recentNext] = d
	n.recentNext = (n.recentNext + 1) % len(n.recent)
}

func (n *NodeLiveness) fail(cause string) {
	if n.probed {
		// A probe's write is one more than the cadence: its failure is
		// not one of the node's heartbeats missed, or holders would count
		// up to four a heartbeat_timeout while the store fails fast.
		return
	}
	n.failures++
	n.out.Results = append(n.out.Results, LivenessResult{Err: WriteUnavailable, Epoch: n.epoch, Cause: cause})
}

func (n *NodeLiveness) onResult(r WriteResult) {
	if n.inflight == nil || r.Op != n.inflight.op {
		if r.Err == WriteOK && r.Revision > n.rev {
			n.rev = r.Revision // a write given up on landed late: the next CAS expects it
		}
		return
	}
	n.inflight = nil
	n.answered(n.now - n.issuedAt)
	switch r.Err {
	case WriteOK:
		n.rev = max(n.rev, r.Revision)
		n.failures = 0
		n.out.Results = append(n.out.Results, LivenessResult{Err: WriteOK, Epoch: n.epoch, Revision: r.Revision})
	case WriteConflict:
		cur := r.CurrentLive
		switch {
		case cur == nil:
			n.fail("conflict, and the record could not be read back")
		case cur.Rev <= n.rev:
			n.fail(fmt.Sprintf("conflict, but the record read back (rev %d) is not newer than the node's last write (rev %d): stale read", cur.Rev, n.rev))
		case !cur.Forged && !cur.Value.Own() && cur.Value.Node == n.node && (cur.Value.Epoch > n.epoch || cur.Value.Epoch == n.epoch && n.rev == 0):
			// (Equal, before its first write landed: a raise the watch
			// showed it at start, and it carries on in it already.)
			// Another node raised the epoch: every lease of the old epoch
			// is over. The node beats on in the new one.
			n.epoch, n.rev, n.beat = cur.Value.Epoch, cur.Rev, 0
			n.failures = 0
			n.out.Results = append(n.out.Results, LivenessResult{Err: WriteConflict, Epoch: n.epoch, Revision: cur.Rev,
				Cause: fmt.Sprintf("epoch raised to %d by %s", cur.Value.Epoch, cur.Value.By)})
			n.nextAt = n.now
		case !cur.Forged && cur.Value.Own() && cur.Value.Node == n.node && cur.Value.Epoch >= n.epoch:
			// Its own write moved the revision: a late one, or one of its
			// previous process the watch had not shown before the first
			// write. Adopt it (and its epoch), write again at once.
			if cur.Value.Epoch > n.epoch {
				n.epoch, n.beat = cur.Value.Epoch, 0
			}
			n.rev, n.beat = cur.Rev, max(n.beat, cur.Value.Beat)
			n.nextAt = n.now
		default:
			// A value the node did not write, and no raise: write over it
			// at once; this write did not land all the same.
			n.rev = cur.Rev
			n.nextAt = n.now
			n.fail(fmt.Sprintf("conflict: a value the node did not write (rev %d, %v) landed first", cur.Rev, cur.Value))
		}
	default:
		cause := r.Err.String()
		if r.Cause != "" {
			cause += ": " + r.Cause
		}
		n.fail(cause)
	}
}
