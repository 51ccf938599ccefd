package failover

import (
	"fmt"
	"strconv"
	"time"

	"understudy/actors"
)

// Failback says what happens when the preferred primary recovers while the
// replica leads.
type Failback int

const (
	// FailbackAuto: the replica hands leadership back by clean demotion once
	// the preferred primary heartbeats again for success_threshold intervals.
	FailbackAuto Failback = iota + 1
	// FailbackManual: the replica keeps leading until an operator switches over.
	FailbackManual
)

func (f Failback) String() string {
	switch f {
	case FailbackAuto:
		return "auto"
	case FailbackManual:
		return "manual"
	}
	return "unset"
}

// ParseFailback reads "auto" or "manual".
func ParseFailback(s string) (Failback, error) {
	switch s {
	case "auto":
		return FailbackAuto, nil
	case "manual":
		return FailbackManual, nil
	}
	return 0, &actors.ConfigError{Field: "failback", Rule: `must be "auto" or "manual"`, Value: strconv.Quote(s)}
}

// Synchronous says whether the leader makes every commit wait for the
// other member (a workload with capability.Synchronizer: PostgreSQL).
type Synchronous int

const (
	// SyncOff: commits never wait; a replica promotes only when its lag at
	// the last contact is within maximum_lag_on_failover.
	SyncOff Synchronous = iota + 1
	// SyncOn: commits wait for the replica while it streams. When it does
	// not, the leader first records in the register (by CAS) that it runs
	// asynchronously, then stops waiting. A replica promotes only when the
	// register says the leader ran synchronously: no acknowledged commit is
	// lost, and while the leader runs asynchronously nobody takes over.
	SyncOn
	// SyncStrict: commits always wait for the replica; writes stop while it
	// is away. A replica may always promote (it has every acknowledged commit).
	SyncStrict
)

func (s Synchronous) String() string {
	switch s {
	case SyncOff:
		return "off"
	case SyncOn:
		return "on"
	case SyncStrict:
		return "strict"
	}
	return "unset"
}

// ParseSynchronous reads "off", "on" or "strict".
func ParseSynchronous(s string) (Synchronous, error) {
	switch s {
	case "off":
		return SyncOff, nil
	case "on":
		return SyncOn, nil
	case "strict":
		return SyncStrict, nil
	}
	return 0, &actors.ConfigError{Field: "synchronous", Rule: `must be "off", "on" or "strict"`, Value: strconv.Quote(s)}
}

// DefaultMaxLag is maximum_lag_on_failover's default: 1 MiB of log.
const DefaultMaxLag = 1 << 20

// Rules are a pair's failover rules, validated. The zero value is not valid:
// use DefaultRules or Validate what you build.
type Rules struct {
	Pair             string        `msgpack:"pair"`
	Primary          string        `msgpack:"primary"` // preferred primary site
	Replica          string        `msgpack:"replica"`
	HeartbeatTimeout time.Duration `msgpack:"hb"` // also the heartbeat interval
	FailureThreshold int           `msgpack:"ft"`
	SuccessThreshold int           `msgpack:"st"`
	FailoverTimeout  time.Duration `msgpack:"fo"`
	FenceGrace       time.Duration `msgpack:"fg"`
	Failback         Failback      `msgpack:"fb"`
	// MaxLagOnFailover (bytes of log) and Synchronous apply only to a
	// workload that reports replication positions (capability.Status).
	MaxLagOnFailover uint64      `msgpack:"lag"`
	Synchronous      Synchronous `msgpack:"sync,omitempty"`
}

// DefaultRules returns DESIGN.md's defaults for a pair.
func DefaultRules(pair, primary, replica string) Rules {
	return Rules{
		Pair: pair, Primary: primary, Replica: replica,
		HeartbeatTimeout: time.Second, FailureThreshold: 2, SuccessThreshold: 2,
		FailoverTimeout: 5 * time.Second, FenceGrace: 2 * time.Second, Failback: FailbackAuto,
		MaxLagOnFailover: DefaultMaxLag, Synchronous: SyncOff,
	}
}

// Bounds of the rules: with them (MaxThreshold+1)*MaxDuration+MaxDuration
// is about 1.2 million hours, far inside time.Duration's range.
const (
	MaxThreshold = 10000
	MaxDuration  = 24 * time.Hour
	MaxLag       = 1 << 40
)

// StopBound is how long after its last acknowledged heartbeat a holder
// has stopped serving at the latest: it counts failure_threshold writes
// failed, one heartbeat_timeout each plus the one in flight, then fences
// within fence_grace — (failure_threshold + 1) × heartbeat_timeout +
// fence_grace. Every reader that dates a stop from the record (replay,
// the simulator's record view, what-if) uses this one rule.
func (r Rules) StopBound() time.Duration {
	return time.Duration(r.FailureThreshold+1)*r.HeartbeatTimeout + r.FenceGrace
}

// MinFailoverTimeout is the smallest failover_timeout the safety inequality
// allows for these rules: the stop bound. A holder's replacement may take
// over only once the old holder has stopped.
func (r Rules) MinFailoverTimeout() time.Duration { return r.StopBound() }

// Validate checks every field, then the safety inequality. It returns a
// *actors.ConfigError naming the first field that breaks a rule.
func (r Rules) Validate() error {
	if err := r.ValidateShape(); err != nil {
		return err
	}
	if min := r.MinFailoverTimeout(); r.FailoverTimeout < min {
		return &actors.ConfigError{
			Field: "failover_timeout",
			Rule: fmt.Sprintf("safety inequality: failover_timeout >= (failure_threshold + 1) * heartbeat_timeout + fence_grace = (%d + 1) * %v + %v = %v; raise failover_timeout to at least %v or lower the others",
				r.FailureThreshold, r.HeartbeatTimeout, r.FenceGrace, min, min),
			Value: r.FailoverTimeout.String(),
		}
	}
	return nil
}

// CheckFenceBudget refuses rules whose fence_grace does not cover budget,
// the worst case of a member's fence chain (see Options.FenceBudget).
func (r Rules) CheckFenceBudget(budget time.Duration) error {
	if budget <= r.FenceGrace {
		return nil
	}
	return &actors.ConfigError{
		Field: "fence_grace",
		Rule:  fmt.Sprintf("must cover the fence chain's worst case, the sum of its step timeouts (%v): the replica may promote fence_grace after the primary starts fencing; raise fence_grace (and failover_timeout) or shorten the fence steps' timeouts", budget),
		Value: r.FenceGrace.String(),
	}
}

// MinHeartbeat is the shortest heartbeat_timeout accepted: below it the
// member would count ordinary write latency (a synchronous fsync and a
// network round trip) as failures, fence and fail over with no fault.
const MinHeartbeat = 50 * time.Millisecond

// MaxNameLen bounds pair and site names: they are tokens of KV keys and
// event subjects, and a NATS control line is bounded.
const MaxNameLen = 64

// CheckName says why a pair or site name is not allowed (nil when it is):
// 1 to MaxNameLen characters among ASCII letters, digits, '-' and '_'.
func CheckName(v string) error {
	if v == "" {
		return fmt.Errorf("must not be empty")
	}
	if len(v) > MaxNameLen {
		return fmt.Errorf("must be at most %d characters (it has %d)", MaxNameLen, len(v))
	}
	for _, c := range v {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return fmt.Errorf("must be one NATS subject token of ASCII letters, digits, '-' and '_': %q is not allowed", c)
		}
	}
	return nil
}

// ValidateShape checks every field but not the safety inequality. Only the
// simulator's --allow-unsafe-config uses it alone.
func (r Rules) ValidateShape() error {
	name := func(field, v string) error {
		if err := CheckName(v); err != nil {
			ce := &actors.ConfigError{Field: field, Rule: err.Error()}
			if v != "" {
				ce.Value = strconv.Quote(v)
			}
			return ce
		}
		return nil
	}
	if err := name("pair", r.Pair); err != nil {
		return err
	}
	if r.Pair == LivenessPrefix {
		return &actors.ConfigError{Field: "pair", Rule: "must not be " + strconv.Quote(LivenessPrefix) + ": its keys hold the nodes' liveness records", Value: strconv.Quote(r.Pair)}
	}
	if r.Pair == DeploymentPrefix {
		return &actors.ConfigError{Field: "pair", Rule: "must not be " + strconv.Quote(DeploymentPrefix) + ": its keys hold the deployment's own records", Value: strconv.Quote(r.Pair)}
	}
	if err := name("primary", r.Primary); err != nil {
		return err
	}
	if err := name("replica", r.Replica); err != nil {
		return err
	}
	if r.Primary == r.Replica {
		return &actors.ConfigError{Field: "replica", Rule: "must differ from primary", Value: strconv.Quote(r.Replica)}
	}
	positive := func(field string, d time.Duration) error {
		if d <= 0 {
			return &actors.ConfigError{Field: field, Rule: "must be a positive duration", Value: d.String()}
		}
		return nil
	}
	if err := positive("heartbeat_timeout", r.HeartbeatTimeout); err != nil {
		return err
	}
	if r.HeartbeatTimeout < MinHeartbeat {
		return &actors.ConfigError{Field: "heartbeat_timeout", Rule: "must be at least " + MinHeartbeat.String() +
			" (a register write with a synchronous fsync, answered over the network, needs that much; see docs/failover.md)", Value: r.HeartbeatTimeout.String()}
	}
	if err := positive("failover_timeout", r.FailoverTimeout); err != nil {
		return err
	}
	if r.FenceGrace < 0 {
		return &actors.ConfigError{Field: "fence_grace", Rule: "must not be negative", Value: r.FenceGrace.String()}
	}
	// Upper bounds keep the safety inequality's arithmetic far from
	// overflow and catch unit slips ("1000h" for "1000ms").
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"heartbeat_timeout", r.HeartbeatTimeout}, {"failover_timeout", r.FailoverTimeout}, {"fence_grace", r.FenceGrace}} {
		if d.v > MaxDuration {
			return &actors.ConfigError{Field: d.field, Rule: "must be at most " + MaxDuration.String(), Value: d.v.String()}
		}
	}
	if r.FailureThreshold < 1 || r.FailureThreshold > MaxThreshold {
		return &actors.ConfigError{Field: "failure_threshold", Rule: "must be between 1 and " + strconv.Itoa(MaxThreshold), Value: strconv.Itoa(r.FailureThreshold)}
	}
	if r.SuccessThreshold < 1 || r.SuccessThreshold > MaxThreshold {
		return &actors.ConfigError{Field: "success_threshold", Rule: "must be between 1 and " + strconv.Itoa(MaxThreshold), Value: strconv.Itoa(r.SuccessThreshold)}
	}
	if r.Failback != FailbackAuto && r.Failback != FailbackManual {
		return &actors.ConfigError{Field: "failback", Rule: `must be "auto" or "manual"`, Value: r.Failback.String()}
	}
	// Zero is off: rules written before the rule existed.
	if r.Synchronous < 0 || r.Synchronous > SyncStrict {
		return &actors.ConfigError{Field: "synchronous", Rule: `must be "off", "on" or "strict"`, Value: r.Synchronous.String()}
	}
	if r.MaxLagOnFailover > MaxLag {
		return &actors.ConfigError{Field: "maximum_lag_on_failover", Rule: "must be at most " + strconv.FormatUint(MaxLag, 10) + " bytes (1 TiB)", Value: strconv.FormatUint(r.MaxLagOnFailover, 10)}
	}
	return nil
}

// Other returns the site of the pair that is not site.
func (r Rules) Other(site string) string {
	if site == r.Primary {
		return r.Replica
	}
	return r.Primary
}

// Has reports whether site is a member of the pair.
func (r Rules) Has(site string) bool { return site == r.Primary || site == r.Replica }
