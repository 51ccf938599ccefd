package projections

import (
	"time"
)

// Report is the audit view of one pair over a window: every read model the
// fold builds, ready for the text, JSON and HTML renderers. Times are
// JetStream server timestamps (UTC); durations are in milliseconds.
type Report struct {
	Pair   string `json:"pair"`
	Source string `json:"source,omitempty"`
	// Partial is set when the record was cut short (an export file that
	// ended in an error): everything below covers only what was read.
	Partial *Partial `json:"partial,omitempty"`
	Window  Window   `json:"window"`
	Rules   *Rules   `json:"rules,omitempty"`
	Sites   []string `json:"sites"`

	// Leadership: who served when, by term, oldest first.
	Leadership []Tenure `json:"leadership"`
	// Failovers: takeovers of a stale (dead, cut off or stuck fenced) holder.
	Failovers []Failover `json:"failovers"`
	// Handovers: clean moves of leadership (switchover, failback, a
	// stopping host's handover) and first acquisitions (bootstrap).
	Handovers     []Handover     `json:"handovers"`
	ConfigChanges []ConfigChange `json:"config_changes"`
	// Procedures: every fence, promote, demote and check chain with its
	// steps; Escalations counts the chains where a step failed and the
	// next one ran.
	Procedures  []Chain `json:"procedures"`
	Escalations int     `json:"escalations"`
	// SplitBrain lists every overlap of two sites' serving (database up)
	// intervals. Empty is the expected answer.
	SplitBrain   []Overlap                 `json:"split_brain"`
	Heartbeats   map[string]SiteHeartbeats `json:"heartbeats"`
	Availability Availability              `json:"availability"`
	// Lanes: each site's state over time, for timelines.
	Lanes []Segment `json:"lanes"`
	// Timeline: the notable events (member and procedure events, config and
	// switchover writes), in server-time order.
	Timeline []TimelineEvent `json:"timeline"`
	Records  RecordsReport   `json:"records"`

	marks []heartbeatMarks // for the HTML lanes
}

// Partial describes a record that was cut short.
type Partial struct {
	Error     string `json:"error"`
	Offset    int64  `json:"offset"`    // byte offset where reading stopped
	Recovered int    `json:"recovered"` // records read intact before it
}

// Window is the span the report covers.
type Window struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	MS   float64   `json:"ms"`
	// Asked is true when the window was given (--from/--to or the export's
	// header) rather than taken from the extent of the record.
	Asked bool `json:"asked"`
}

// Rules are the failover rules in force (the latest the record shows).
type Rules struct {
	Primary            string  `json:"primary"`
	Replica            string  `json:"replica"`
	HeartbeatTimeoutMS float64 `json:"heartbeat_timeout_ms"`
	FailureThreshold   int     `json:"failure_threshold"`
	SuccessThreshold   int     `json:"success_threshold"`
	FailoverTimeoutMS  float64 `json:"failover_timeout_ms"`
	FenceGraceMS       float64 `json:"fence_grace_ms"`
	Failback           string  `json:"failback"`
}

// EventRef points at one record.
type EventRef struct {
	Subject  string    `json:"subject"`
	Sequence uint64    `json:"sequence"`
	Type     string    `json:"type"`
	Time     time.Time `json:"time"`
}

// Tenure is one serving interval of one site: from the end of its promote
// procedure (serving_started) to when it stopped serving.
type Tenure struct {
	Site string    `json:"site"`
	Term uint64    `json:"term"`
	From time.Time `json:"from"`
	// FromBasis: "serving_started", or "register" when the window opened
	// with the site already holding the register unfenced (inferred),
	// "promote_step" when the member's own record died with it, "acquire"
	// when its events date it before its acquire of the term landed.
	FromBasis string `json:"from_basis"`
	// To is when it stopped serving; nil: still serving at the end of the
	// record. EndBasis says how To is known:
	//   "recorded": the stop event (fence, demotion, lost register) as it landed;
	//   "last-heartbeat": no stop was recorded in time (power cut, crash, a
	//     member cut off from NATS whose events landed late): To is its last
	//     register write, the last evidence that it served;
	//   "open": still serving.
	To       *time.Time `json:"to"`
	End      string     `json:"end"` // why: "fence:heartbeat-failures", "demote:failback", "lost-register", "restart", "silent", "open"
	EndBasis string     `json:"end_basis"`
	// UpUntil is the latest its database may have served — the interval the
	// split-brain check uses: the fence or demote procedure's completion as
	// recorded, or, when that is missing or landed late, the rules' bound
	// (last unfenced register write + (failure_threshold + 1) ×
	// heartbeat_timeout + fence_grace: by then a live holder has fenced
	// itself, and a dead one's database died with it). nil: open.
	// ToLatest is the latest it may have stopped serving, when To is not
	// recorded (end_basis "last-heartbeat"): the rules' bound after its
	// last unfenced register write, or sooner its restart, its stop event
	// as dated (a slow append dates it late, never early), or a fenced
	// register write of its term.
	ToLatest          *time.Time `json:"to_latest,omitempty"`
	UpUntil           *time.Time `json:"up_until"`
	UpBasis           string     `json:"up_basis"`
	LastRegisterWrite *time.Time `json:"last_register_write,omitempty"`
	// LastLiveness (node leadership): the last liveness write of the
	// holder's node in the epoch its register named, when later than its
	// last register write — the lease went on with it, and the rules'
	// bound runs from it.
	LastLiveness *time.Time `json:"last_liveness,omitempty"`
	DurationMS   float64    `json:"duration_ms"`
	FromEvent    *EventRef  `json:"from_event,omitempty"`
	ToEvent      *EventRef  `json:"to_event,omitempty"`
	UpEvent      *EventRef  `json:"up_event,omitempty"`
}

// Failover is a takeover: a follower won the register from a stale holder.
type Failover struct {
	Term     uint64 `json:"term"` // the new term
	From     string `json:"from"` // the old holder
	To       string `json:"to"`   // the site that took over
	Reason   string `json:"reason"`
	FromTerm uint64 `json:"from_term,omitempty"`
	// LastPrimaryHeartbeat: the old holder's last register write before the
	// takeover. Estimated (from the promotion attempt's staleness) when
	// the register's history no longer holds it; see Estimated.
	LastPrimaryHeartbeat *time.Time `json:"last_primary_heartbeat"`
	FenceRequestedAt     *time.Time `json:"fence_requested_at"`
	FencedAt             *time.Time `json:"fenced_at"`
	PromotionAttemptAt   *time.Time `json:"promotion_attempt_at"`
	PromotedAt           *time.Time `json:"promoted_at"` // the winning register write
	ServingAt            *time.Time `json:"serving_at"`
	DetectionMS          *float64   `json:"detection_ms"`     // last heartbeat → promotion attempt
	FailoverMS           *float64   `json:"failover_ms"`      // last heartbeat → register won
	ServingMS            *float64   `json:"serving_ms"`       // last heartbeat → new holder serving
	ReadOnlyGapMS        *float64   `json:"read_only_gap_ms"` // old holder stopped serving → new one serving
	StaleMS              float64    `json:"stale_ms,omitempty"`
	Estimated            bool       `json:"estimated,omitempty"`
	// Resumed: the new holder recorded no promoted event — its write won
	// but the answer was lost, and it resumed the register it found naming
	// it. The register's history shows the takeover all the same.
	Resumed bool `json:"resumed,omitempty"`
}

// Handover is a clean move of leadership, or a first acquisition.
type Handover struct {
	Kind        string     `json:"kind"` // switchover, failback, shutdown, promote-failed, handoff, bootstrap, vacant
	Term        uint64     `json:"term"`
	From        string     `json:"from,omitempty"`
	To          string     `json:"to"`
	RequestedAt *time.Time `json:"requested_at,omitempty"`
	ReleasedAt  *time.Time `json:"released_at,omitempty"`
	PromotedAt  *time.Time `json:"promoted_at"`
	ServingAt   *time.Time `json:"serving_at"`
	// ReadOnlyGapMS: the old holder stopped serving → the new one serving.
	ReadOnlyGapMS *float64 `json:"read_only_gap_ms"`
}

// ConfigChange is one write of <pair>.config and what the members made of it.
type ConfigChange struct {
	Rev       uint64         `json:"rev"`
	WrittenAt *time.Time     `json:"written_at,omitempty"`
	Rules     string         `json:"rules,omitempty"`
	Applied   []SiteAt       `json:"applied"`
	Rejected  []ConfigRefuse `json:"rejected"`
}

// SiteAt is a site and a time.
type SiteAt struct {
	Site string    `json:"site"`
	At   time.Time `json:"at"`
}

// ConfigRefuse is one member's refusal of a config write.
type ConfigRefuse struct {
	Site  string    `json:"site"`
	At    time.Time `json:"at"`
	Field string    `json:"field"`
	Rule  string    `json:"rule"`
	Value string    `json:"value"`
}

// Chain is one procedure chain run.
type Chain struct {
	Site       string     `json:"site"`
	Kind       string     `json:"kind"`
	Seq        uint64     `json:"seq"`
	StartedAt  *time.Time `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
	OK         *bool      `json:"ok"` // nil: no end recorded
	Superseded bool       `json:"superseded,omitempty"`
	TookMS     float64    `json:"took_ms"`
	Detail     string     `json:"detail,omitempty"`
	Escalated  bool       `json:"escalated"`
	Steps      []Step     `json:"steps"`
}

// Step is one step of a chain.
type Step struct {
	Index   int     `json:"index"`
	Name    string  `json:"name"`
	Driver  string  `json:"driver,omitempty"`
	Command string  `json:"command,omitempty"`
	Result  string  `json:"result"` // ok, failed, timed-out; "" while running
	Exit    int     `json:"exit"`
	TookMS  float64 `json:"took_ms"`
	Detail  string  `json:"detail,omitempty"`
}

// Overlap is a split-brain: two sites' serving intervals overlap.
type Overlap struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	MS   float64   `json:"ms"`
	// Intervals: both serving intervals, with the events that bound them.
	Intervals [2]Tenure `json:"intervals"`
}

// SiteHeartbeats are a site's heartbeat statistics: its register writes
// while it held the register, and its member heartbeats otherwise.
type SiteHeartbeats struct {
	Register HeartbeatStats `json:"register"`
	Member   HeartbeatStats `json:"member"`
}

// HeartbeatStats describe one series of writes by server timestamp.
// Intervals are between consecutive writes of one run (a term of the
// register; a stretch of member heartbeats not interrupted by holding the
// register).
type HeartbeatStats struct {
	Count     int        `json:"count"`
	First     *time.Time `json:"first,omitempty"`
	Last      *time.Time `json:"last,omitempty"`
	Intervals int        `json:"intervals"`
	// Gaps counts intervals longer than 1.5 × heartbeat_timeout.
	Gaps int `json:"gaps"`
	// Missed counts beats the counter skipped (writes that never landed);
	// member heartbeats only.
	Missed  uint64  `json:"missed"`
	MaxGap  float64 `json:"max_gap_ms"`
	MeanMS  float64 `json:"mean_ms"`
	P50MS   float64 `json:"p50_ms"`
	P90MS   float64 `json:"p90_ms"`
	P99MS   float64 `json:"p99_ms"`
	Longest []Gap   `json:"longest,omitempty"` // the longest intervals, longest first
	// Fenced counts register writes marked fenced (a suspended holder).
	Fenced int `json:"fenced,omitempty"`
}

// Availability is how much of the window some member served.
//
// The record dates a member's fact when it reached NATS, less the time it
// waited on its node. Where it holds no fact for a change — a stop that
// was not recorded in time (a power cut, a crash, events that died with
// the process or landed later than the rules allow), a serving whose
// serving_started is missing — it only bounds it. The figures are then
// the most the outages can have lasted (OutageMS, LongestGapMS: never
// less than the truth) with the least beside them (OutageMinMS,
// LongestGapMinMS); Bounded counts the outages where the two differ.
type Availability struct {
	Fraction   float64 `json:"fraction"` // served / window
	ServedMS   float64 `json:"served_ms"`
	ReadOnlyMS float64 `json:"read_only_ms"`
	// LongestGapMS: the longest stretch with nobody serving, after someone
	// first served in the window. LongestGapMinMS: the least the longest
	// can have been (the longest stretch where nobody can have served).
	LongestGapMS    float64    `json:"longest_gap_ms"`
	LongestGapMinMS float64    `json:"longest_gap_min_ms"`
	LongestGapAt    *time.Time `json:"longest_gap_at,omitempty"`
	// OutageMS is the total of Outages: the time nobody served after
	// someone first did (ReadOnlyMS also counts the start of the window).
	// OutageMinMS: the least it can have been.
	OutageMS    float64  `json:"outage_ms"`
	OutageMinMS float64  `json:"outage_min_ms"`
	Bounded     int      `json:"bounded"`
	Outages     []Outage `json:"outages"`
}

// Outage is a stretch with nobody serving, after someone first served in
// the window: from the end of a serving interval to the start of the next.
type Outage struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	MS   float64   `json:"ms"`
	// After is the site whose serving interval ended it, and AfterBasis
	// how that end is known (the interval's end_basis: "recorded", or
	// "last-heartbeat" when no stop was recorded in time — the outage may
	// then have begun as late as FromLatest).
	After      string `json:"after"`
	AfterBasis string `json:"after_basis"`
	// By is the site whose serving ended it; "" while it lasts (Open).
	By   string `json:"by,omitempty"`
	Open bool   `json:"open,omitempty"`
	// MinMS is the least it can have lasted: MS less the stretches where
	// the record allows that someone served (the previous interval up to
	// the latest it may have stopped; MayHaveServed). Bounded: MinMS < MS.
	MinMS   float64 `json:"min_ms"`
	Bounded bool    `json:"bounded,omitempty"`
	// FromLatest: the latest it may have begun (with Bounded).
	FromLatest *time.Time `json:"from_latest,omitempty"`
	// Certain: the stretches inside it where nobody can have served (with
	// Bounded; their total is MinMS).
	Certain []Span `json:"certain,omitempty"`
	// MayHaveServed: the stretches inside it where the register shows a
	// site that may have served without a recorded serving_started.
	MayHaveServed []MaySpan `json:"may_have_served,omitempty"`
	// Why says, for a bounded outage, what the record cannot show.
	Why string `json:"why,omitempty"`
}

// Span is a stretch of time.
type Span struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	MS   float64   `json:"ms"`
}

// MaySpan is a stretch where a site may have served: its register writes
// show it holding the register unfenced after its last recorded event,
// whose serving_started (and what followed) died with its process.
type MaySpan struct {
	Site string    `json:"site"`
	Term uint64    `json:"term"`
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	MS   float64   `json:"ms"`
	Why  string    `json:"why"`
}

// Segment is one stretch of one site's lane.
type Segment struct {
	Site  string    `json:"site"`
	State string    `json:"state"` // serving, promoting, stopping, fenced, standby, starting, no-record
	From  time.Time `json:"from"`
	To    time.Time `json:"to"`
	Term  uint64    `json:"term,omitempty"`
	Note  string    `json:"note,omitempty"`
}

// TimelineEvent is one notable event.
type TimelineEvent struct {
	Time     time.Time `json:"time"`
	Site     string    `json:"site,omitempty"`
	Type     string    `json:"type"`
	Detail   string    `json:"detail,omitempty"`
	Subject  string    `json:"subject"`
	Sequence uint64    `json:"sequence"`
	// Mark: failover, handover, split-brain, escalation, config, or "".
	Mark string `json:"mark,omitempty"`
}

// RecordsReport says what the fold read, and everything it could not use.
type RecordsReport struct {
	RecordCounts
	// ForgedRegister: register writes a member recorded as no member's
	// (failover.forged_value_ignored), left out of the leadership history.
	ForgedRegister int            `json:"forged_register_writes"`
	UnknownTypes   map[string]int `json:"unknown_types"`
	UnknownList    []RecordRef    `json:"unknown_examples,omitempty"`
	CorruptList    []Corrupt      `json:"corrupt_examples,omitempty"`
	GapList        []Gap          `json:"gap_examples,omitempty"`
	// TruncatedList: subjects whose first record links to one before it:
	// their history starts inside the record (a window, or retention: the
	// KV bucket keeps 64 revisions per key).
	TruncatedList []Gap `json:"truncated_examples,omitempty"`
}

// RecordCounts are exact counts.
type RecordCounts struct {
	Read              int `json:"read"`
	Duplicates        int `json:"duplicates"`
	Foreign           int `json:"foreign"` // other pairs, other streams
	Register          int `json:"register_writes"`
	Heartbeats        int `json:"member_heartbeats"`
	Liveness          int `json:"liveness_writes"` // node leadership: the nodes' liveness records
	KV                int `json:"other_kv"`        // config, switchover, markers
	Events            int `json:"events"`
	Unknown           int `json:"unknown"` // unknown event types and KV keys: counted, shown, not folded
	UnknownKeys       int `json:"unknown_keys"`
	Corrupt           int `json:"corrupt"`
	Gaps              int `json:"gaps"` // broken links: at least one record missing each
	TruncatedSubjects int `json:"truncated_subjects"`
}

// RecordRef names one record.
type RecordRef struct {
	Subject  string    `json:"subject"`
	Sequence uint64    `json:"sequence"`
	Time     time.Time `json:"time"`
	Type     string    `json:"type"`
}

// Corrupt is a record whose bytes could not be decoded.
type Corrupt struct {
	Subject  string    `json:"subject"`
	Sequence uint64    `json:"sequence"`
	Time     time.Time `json:"time"`
	Error    string    `json:"error"`
}

// Gap is a missing stretch: of a subject's records (After, Before and the
// sequence the later one links to), or of heartbeats (From, To, MS).
type Gap struct {
	Stream     string     `json:"stream,omitempty"`
	Subject    string     `json:"subject,omitempty"`
	After      uint64     `json:"after,omitempty"`
	Before     uint64     `json:"before,omitempty"`
	MissingSeq uint64     `json:"missing_seq,omitempty"`
	From       *time.Time `json:"from,omitempty"`
	To         *time.Time `json:"to,omitempty"`
	MS         float64    `json:"ms,omitempty"`
}
