package failover

import (
	"fmt"
	"strings"
	"time"

	"understudy/actors/capability"
	"understudy/events"
)

// KV keys of a pair, in the bucket understudy_failover.

// LeaderKey is the leadership register, written by the holder's heartbeat.
func LeaderKey(pair string) string { return pair + ".leader" }

// HeartbeatKey is a member's own heartbeat, written while it does not hold
// the register.
func HeartbeatKey(pair, site string) string { return pair + ".hb." + site }

// ConfigKey holds the pair's rules; changing it tunes the pair at run time.
func ConfigKey(pair string) string { return pair + ".config" }

// RulesKey holds the rules a member runs from its node's pair file,
// published by its node at start in a secured deployment, where only
// operators may write ConfigKey: status and the CLI read it while the pair
// has no ConfigKey. Members never apply it; ConfigKey is the rules in force.
func RulesKey(pair, site string) string { return pair + ".rules." + site }

// SwitchoverKey holds the latest operator switchover request.
func SwitchoverKey(pair string) string { return pair + ".switchover" }

// PauseKey holds the pair's maintenance mode (understudy pause, resume).
func PauseKey(pair string) string { return pair + ".pause" }

// ManualFailoverKey holds the latest operator failover request
// (understudy failover --to).
func ManualFailoverKey(pair string) string { return pair + ".failover" }

// Leader is the value of the leadership register. Site "" means nobody
// holds it (after a clean demotion); Handoff then names who should take it.
type Leader struct {
	Site    string `msgpack:"s"`
	Term    uint64 `msgpack:"t"`
	Beat    uint64 `msgpack:"n"`           // heartbeat count within the term
	Handoff string `msgpack:"h,omitempty"` // with Site "": the intended next holder
	// Fenced: the holder is suspended (fenced, not serving) and heartbeats
	// only to recover. A follower may take over a holder that stays fenced
	// for failover_timeout even though its writes still land.
	Fenced bool `msgpack:"f,omitempty"`
	// Planned, with Site "": an operator moved leadership (switchover), so
	// the next holder keeps it even under failback: auto.
	Planned bool `msgpack:"p,omitempty"`
	// Flush is the holder's log position (its workload's latest Check) at
	// this write; 0 when the workload reports none. Sync: the holder's
	// workload makes every commit wait for the other member (rule
	// synchronous), written only once that is in force and cleared before
	// it stops being so.
	Flush    capability.LSN `msgpack:"fl,omitempty"`
	Timeline uint32         `msgpack:"tl,omitempty"`
	Sync     bool           `msgpack:"sy,omitempty"`
	// Paused and PauseRev: the holder's view of <pair>.pause (the
	// revision it saw last, 0 none), for status.
	Paused   bool   `msgpack:"pz,omitempty"`
	PauseRev uint64 `msgpack:"pr,omitempty"`
	// By is the site of the member that wrote the value: the holder for
	// its beats and its release, the acquirer for an acquire. Sig is the
	// writing node's signature (ed25519, its nkey) over EncodeLeader of the
	// value with Sig empty; the runtime signs and verifies (runtime.ValueTrust),
	// the member only reads LeaderEntry.Forged. Both empty in values
	// written before they existed, and Sig when the deployment has no
	// security section.
	By  string `msgpack:"by,omitempty"`
	Sig []byte `msgpack:"sg,omitempty"`
	// Prev is the register revision the write expected (its
	// compare-and-set): a member's write lands only on top of it, so a
	// value whose Prev is below a revision a member already took is an
	// older value written again (a replay: the signature covers the value,
	// not when it was written). 0 for a write that creates the key, and in
	// values written before it existed.
	Prev uint64 `msgpack:"pv,omitempty"`
	// Node and Epoch (leadership: node): the holder's node and the epoch
	// of its liveness record the lease lives in. Empty in per-pair
	// leadership, where every beat is a write of the register.
	Node  string `msgpack:"nd,omitempty"`
	Epoch uint64 `msgpack:"e,omitempty"`
	// Resumed (leadership: node): the holder serves again after it
	// unfenced in this term, written once when it starts serving again.
	// Its register is not written while it serves, so this is the only
	// sign a follower gets that a suspended holder recovered, not merely
	// announced that it would (docs/failover.md, "A fenced holder").
	Resumed bool `msgpack:"rs,omitempty"`
}

// HolderWrite reports whether l is a holder's own value: it names a
// holder, and says that holder wrote it (or does not say who wrote it).
func (l Leader) HolderWrite() bool { return l.Site != "" && (l.By == "" || l.By == l.Site) }

// ForAnother reports whether l names a holder and says another site wrote
// it: a holder's beats are its own, so no member writes that.
func (l Leader) ForAnother() bool { return l.Site != "" && l.By != "" && l.By != l.Site }

// WantsGenuine reports whether a host must attach LeaderEntry.Genuine to
// e: it is Forged, or not a holder's own value (a release, or a value
// written for another holder), which a member judges against the
// register as it knew it.
func WantsGenuine(e LeaderEntry) bool { return e.Forged || (!e.Corrupt && !e.Value.HolderWrite()) }

func (l Leader) String() string {
	if l.Site == "" {
		if l.Handoff != "" {
			return fmt.Sprintf("none(term %d, handoff to %s)", l.Term, l.Handoff)
		}
		return fmt.Sprintf("none(term %d)", l.Term)
	}
	if l.Fenced {
		return fmt.Sprintf("%s(term %d, beat %d, fenced)", l.Site, l.Term, l.Beat)
	}
	if l.Resumed {
		return fmt.Sprintf("%s(term %d, beat %d, resumed)", l.Site, l.Term, l.Beat)
	}
	return fmt.Sprintf("%s(term %d, beat %d)", l.Site, l.Term, l.Beat)
}

// Heartbeat is the value of a member's own heartbeat key.
type Heartbeat struct {
	Site  string `msgpack:"s"`
	Beat  uint64 `msgpack:"n"`
	Phase Phase  `msgpack:"p"`
	// Ready says the member could take leadership now: it follows, and its
	// own last success_threshold heartbeats were acknowledged in time. The
	// leader hands back only to a ready preferred primary, so a primary on a
	// still-degraded link is not handed leadership it would lose again.
	Ready bool `msgpack:"r"`
	// RulesRev is the revision of <pair>.config whose rules the member
	// applies (0: its pair file's, no config seen yet); RejectedRev the
	// latest revision it refused. Status shows both against the key.
	RulesRev    uint64 `msgpack:"c,omitempty"`
	RejectedRev uint64 `msgpack:"x,omitempty"`
	// The member's workload as its latest Check found it (zero when the
	// workload reports no positions): role, timeline, received and
	// replayed log positions, whether it streams from the leader.
	Role      capability.Role `msgpack:"ro,omitempty"`
	Timeline  uint32          `msgpack:"tl,omitempty"`
	Receive   capability.LSN  `msgpack:"rl,omitempty"`
	Replay    capability.LSN  `msgpack:"pl,omitempty"`
	Streaming bool            `msgpack:"sm,omitempty"`
	// Rejoined names the leader site the workload follows after a Rejoin
	// ("" when it follows nobody, or the workload does not rejoin).
	Rejoined string `msgpack:"rj,omitempty"`
	// Paused and PauseRev: the member's view of <pair>.pause (the revision
	// it saw last, 0 none), for status.
	Paused   bool   `msgpack:"pz,omitempty"`
	PauseRev uint64 `msgpack:"pr,omitempty"`
	// Node (leadership: node): the member's node, whose liveness writes
	// repeat this heartbeat until the member writes a new one.
	Node string `msgpack:"nd,omitempty"`
}

// Switchover is an operator's request to move leadership to To.
type Switchover struct {
	ID        string    `msgpack:"id"`
	To        string    `msgpack:"to"`
	Requested time.Time `msgpack:"at"`
}

// Pause is the value of PauseKey. While Paused, no member moves
// leadership on its own: no takeover of a stale leader, no failback, no
// hand-over for failed checks. Fencing, operators' switchovers and
// failovers go on. A missing key means not paused.
type Pause struct {
	ID     string    `msgpack:"id"`
	Paused bool      `msgpack:"paused"`
	Reason string    `msgpack:"reason,omitempty"`
	At     time.Time `msgpack:"at"`
}

// DefaultFailoverWithin is how long a failover request stays valid when
// it does not say (ManualFailover.Within).
const DefaultFailoverWithin = 30 * time.Second

// ManualFailover is an operator's request that To take the register of a
// leader that is gone. Without Force, To refuses when the lag rules would
// withhold the promotion.
type ManualFailover struct {
	ID        string    `msgpack:"id"`
	To        string    `msgpack:"to"`
	Force     bool      `msgpack:"force,omitempty"`
	Requested time.Time `msgpack:"at"`
	// Within: the request lapses when To has not acted on it within this
	// much server time after it was written (0: DefaultFailoverWithin), so
	// a member that starts hours later does not act on it.
	Within time.Duration `msgpack:"within,omitempty"`
}

func (f ManualFailover) within() time.Duration {
	if f.Within > 0 {
		return f.Within
	}
	return DefaultFailoverWithin
}

// EncodeLeader and the functions below are the wire form of the KV values.
func EncodeLeader(l Leader) []byte { return mustMarshal(l) }

// DecodeLeader reads a leadership register value.
func DecodeLeader(b []byte) (Leader, error) {
	var l Leader
	if err := decodeValue(b, &l); err != nil {
		return Leader{}, fmt.Errorf("decode leader register: %w", err)
	}
	return l, nil
}

// LeaderEntryOf reads one revision of the register. A value that does not
// decode gives a Corrupt entry — vacant, with term highestTerm (the
// highest term of the key's history, as far as the caller knows it; see
// HighestTerm) — and the decode error, for the caller to report.
func LeaderEntryOf(e events.Entry, highestTerm uint64) (LeaderEntry, error) {
	l, err := DecodeLeader(e.Value)
	if err != nil {
		return LeaderEntry{Rev: e.Revision, Time: e.Time, Value: Leader{Term: highestTerm}, Corrupt: true},
			fmt.Errorf("corrupt leader register value (revision %d, %s): %w", e.Revision, events.HexPrefix(e.Value), err)
	}
	return LeaderEntry{Rev: e.Revision, Time: e.Time, Value: l}, nil
}

// HighestTerm is the highest term among the register values of history
// that decode (0 if none does).
func HighestTerm(history []events.Entry) uint64 {
	var t uint64
	for _, e := range history {
		if e.Op != events.OpPut {
			continue
		}
		if l, err := DecodeLeader(e.Value); err == nil {
			t = max(t, l.Term)
		}
	}
	return t
}

// EncodeHeartbeat returns the wire form of a member heartbeat.
func EncodeHeartbeat(h Heartbeat) []byte { return mustMarshal(h) }

// DecodeHeartbeat reads a member heartbeat value.
func DecodeHeartbeat(b []byte) (Heartbeat, error) {
	var h Heartbeat
	if err := decodeValue(b, &h); err != nil {
		return Heartbeat{}, fmt.Errorf("decode heartbeat: %w", err)
	}
	return h, nil
}

// EncodeSwitchover returns the wire form of a switchover request.
func EncodeSwitchover(s Switchover) []byte { return mustMarshal(s) }

// DecodeSwitchover reads a switchover request.
func DecodeSwitchover(b []byte) (Switchover, error) {
	var s Switchover
	if err := decodeValue(b, &s); err != nil {
		return Switchover{}, fmt.Errorf("decode switchover: %w", err)
	}
	s.Requested = s.Requested.UTC()
	return s, nil
}

// EncodePause returns the wire form of a pause value.
func EncodePause(p Pause) []byte { return mustMarshal(p) }

// DecodePause reads a pause value.
func DecodePause(b []byte) (Pause, error) {
	var p Pause
	if err := decodeValue(b, &p); err != nil {
		return Pause{}, fmt.Errorf("decode pause: %w", err)
	}
	p.At = p.At.UTC()
	return p, nil
}

// EncodeManualFailover returns the wire form of a failover request.
func EncodeManualFailover(f ManualFailover) []byte { return mustMarshal(f) }

// DecodeManualFailover reads a failover request.
func DecodeManualFailover(b []byte) (ManualFailover, error) {
	var f ManualFailover
	if err := decodeValue(b, &f); err != nil {
		return ManualFailover{}, fmt.Errorf("decode failover request: %w", err)
	}
	f.Requested = f.Requested.UTC()
	return f, nil
}

// EncodeRules returns the wire form of the rules kept under ConfigKey.
func EncodeRules(r Rules) []byte { return mustMarshal(r) }

// DecodeRules reads rules from ConfigKey without validating them.
func DecodeRules(b []byte) (Rules, error) {
	var r Rules
	if err := decodeValue(b, &r); err != nil {
		return Rules{}, fmt.Errorf("decode rules: %w", err)
	}
	if r.Synchronous == 0 {
		r.Synchronous = SyncOff // written before the rule existed
	}
	return r, nil
}

// MaxValueSize bounds a pair's KV values as read: a register, heartbeat,
// switchover request or rules value is a few hundred bytes, so anything
// larger is not one (nesting is bounded by events.UnmarshalValue).
const MaxValueSize = 16 << 10

// decodeValue decodes a pair's KV value with bounded size and depth.
func decodeValue(b []byte, v any) error {
	if len(b) > MaxValueSize {
		return fmt.Errorf("%w: %d bytes, more than the %d a pair's value may have", events.ErrCorrupt, len(b), MaxValueSize)
	}
	return events.UnmarshalValue(b, v)
}

func mustMarshal(v any) []byte {
	b, err := events.MarshalValue(v)
	if err != nil {
		// Only plain structs of strings and numbers pass through here.
		panic(fmt.Sprintf("failover: marshal %T: %v", v, err))
	}
	return b
}

// HeartbeatSite is the site whose heartbeat key key is ("" when it is not
// a heartbeat key of pair). A heartbeat belongs to the site its key names,
// whatever its value says: NATS permissions let a node write only its own
// sites' keys, and nothing checks a value's claim.
func HeartbeatSite(pair, key string) string {
	site, ok := strings.CutPrefix(key, pair+".hb.")
	if !ok || site == "" || strings.Contains(site, ".") {
		return ""
	}
	return site
}

// InputOf is the member input a KV entry of the pair means: the register,
// a member heartbeat, the rules, a switchover request, the pause, a
// failover request. nil, nil for a delete (except of the pause: a pair
// whose pause is deleted is not paused) or a key that is not the pair's.
// A heartbeat, switchover, pause or failover value
// that does not decode is an error and no input (the caller reports it and
// the member never sees it); a register value that does not decode is both
// an error to report and an input, LeaderObserved with a Corrupt entry
// (see LeaderEntryOf); rules that do not decode are an input
// (ConfigObserved with DecodeErr), which the member records as refused.
func InputOf(pair string, e events.Entry) (Input, error) {
	if e.Op != events.OpPut {
		if e.Key == PauseKey(pair) && e.Revision != 0 {
			return PauseObserved{Rev: e.Revision}, nil
		}
		return nil, nil
	}
	switch {
	case e.Key == LeaderKey(pair):
		le, err := LeaderEntryOf(e, 0)
		return LeaderObserved{Entry: le}, err
	case HeartbeatSite(pair, e.Key) != "":
		h, err := DecodeHeartbeat(e.Value)
		if err != nil {
			return nil, fmt.Errorf("corrupt heartbeat value: %w", err)
		}
		return HeartbeatObserved{Rev: e.Revision, Time: e.Time, Site: HeartbeatSite(pair, e.Key), Value: h}, nil
	case e.Key == ConfigKey(pair):
		r, err := DecodeRules(e.Value)
		if err != nil {
			return ConfigObserved{Rev: e.Revision, DecodeErr: err.Error()}, nil
		}
		return ConfigObserved{Rev: e.Revision, Rules: r}, nil
	case e.Key == SwitchoverKey(pair):
		s, err := DecodeSwitchover(e.Value)
		if err != nil {
			return nil, fmt.Errorf("corrupt switchover request: %w", err)
		}
		return SwitchoverObserved{Rev: e.Revision, Request: s}, nil
	case e.Key == PauseKey(pair):
		p, err := DecodePause(e.Value)
		if err != nil {
			return nil, fmt.Errorf("corrupt pause value: %w", err)
		}
		return PauseObserved{Rev: e.Revision, Pause: p}, nil
	case e.Key == ManualFailoverKey(pair):
		f, err := DecodeManualFailover(e.Value)
		if err != nil {
			return nil, fmt.Errorf("corrupt failover request: %w", err)
		}
		return ManualFailoverObserved{Rev: e.Revision, Time: e.Time, Request: f}, nil
	}
	return nil, nil
}
