package failover

import (
	"fmt"
	"time"

	"understudy/actors"
	"understudy/actors/capability"
	"understudy/events"
)

// WriteKind says what a Write is for.
type WriteKind int

const (
	WriteBeat       WriteKind = iota + 1 // holder's heartbeat: CAS on its own last revision
	WriteAcquire                         // follower's promotion (CAS, or Create when ExpectRev is 0)
	WriteRelease                         // clean demotion: leader = none, CAS on own last revision
	WriteMemberBeat                      // a member's own heartbeat key, plain put
	WriteLiveness                        // a node's liveness record (NodeLiveness): CAS on its own last revision
	WriteBump                            // a follower raises a stale holder node's epoch: CAS on the record it judged stale
)

func (k WriteKind) String() string {
	switch k {
	case WriteBeat:
		return "beat"
	case WriteAcquire:
		return "acquire"
	case WriteRelease:
		return "release"
	case WriteMemberBeat:
		return "member-beat"
	case WriteLiveness:
		return "liveness"
	case WriteBump:
		return "raise-epoch"
	}
	return "unset"
}

// Write is a KV write the host must issue and answer with a WriteResult
// carrying Op. A write with Put set is unconditional; otherwise it is a
// compare-and-set on ExpectRev, where 0 means "create: the key must not exist".
type Write struct {
	Op        uint64
	Kind      WriteKind
	Key       string
	Value     []byte
	Put       bool
	ExpectRev uint64
	// Deadline is the local monotonic time after which the member counts the
	// write as failed; the host should cancel it then.
	Deadline time.Duration
	Leader   Leader    // decoded Value of leader writes
	Beat     Heartbeat // decoded Value of member heartbeats
	Live     Liveness  // decoded Value of liveness writes and raises
}

// Procedure asks the host to run one of the workload's procedures (see
// capability.Workload) and answer with a ProcedureResult carrying Kind and
// Seq. The other fields are its context: why, and what the member knows
// of the pair at that moment.
type Procedure struct {
	Kind   ProcKind
	Seq    uint64
	Term   uint64
	Leader string // the register's holder as last seen ("" none); a rejoin follows it
	Reason string
	// Synchronous: promote and sync: the leader's commits must wait for
	// the other member.
	Synchronous bool
	// Bootstrap: promote of the preferred primary taking a register nobody
	// ever held: the workload may be created from nothing.
	Bootstrap bool
	// Serving: a check of a member that serves (else it follows).
	Serving bool
}

// Ready is what one Step hands back: durable events to append (in order;
// already applied to the member), writes to issue, procedures to run.
type Ready struct {
	Events     []events.Event
	Writes     []Write
	Procedures []Procedure
	// ProbeLiveness (node mode): the member finds the holder's node stale
	// by its own clock and asks its node for a liveness write now
	// (NodeLiveness's LivenessProbe), for a server time that shows it stale
	// by the store's clock too, rather than at the node's next write, up to
	// a heartbeat_timeout later. Once per holder beat.
	ProbeLiveness bool
}

// Empty reports whether there is nothing to do.
func (r Ready) Empty() bool {
	return len(r.Events) == 0 && len(r.Writes) == 0 && len(r.Procedures) == 0 && !r.ProbeLiveness
}

// Options change how a member checks its rules.
type Options struct {
	// AllowUnsafe accepts rules that break the safety inequality (the
	// simulator uses it to prove that its checker finds the split brain).
	AllowUnsafe bool
	// FenceBudget is the worst case of this member's fence chain: the sum
	// of its step timeouts, when every step but the last hangs. fence_grace
	// must cover it, since the safety inequality counts on the primary
	// being fenced within fence_grace; rules (at start or changed in KV)
	// that do not are refused. Zero skips the check.
	FenceBudget time.Duration
	// CheckInterval, when positive, makes a serving leader run its
	// resource's check chain that often; CheckFailures consecutive failed
	// checks (default 3) make it hand over to the other member if that one
	// is ready. Zero disables checks.
	CheckInterval time.Duration
	CheckFailures int
	// Rejoin: the workload follows the leader (capability.Rejoiner, as a
	// database standby does). A follower then asks it to rejoin every new
	// leader, checks it every heartbeat_timeout (so does a leader, when
	// CheckInterval is zero), and says it is ready only once it follows
	// the leader and its latest check passed.
	Rejoin bool
	// Positions: the workload reports replication positions: a follower's
	// promotion obeys maximum_lag_on_failover and synchronous, and it is
	// ready only within the lag limit.
	Positions bool
	// Synchronizer: the workload can make commits wait for the other
	// member (capability.Synchronizer); rules with synchronous on or
	// strict are refused without it.
	Synchronizer bool
	// Node, when set, is the node this member runs on, and leadership is
	// node liveness (see liveness.go): the host feeds the member its
	// node's LivenessResults and the liveness records it observes; the
	// member writes the register and its heartbeat key only when their
	// content changes. Empty: per-pair leadership, every beat a write.
	Node string
	// AcquireWindow, when positive, replaces how long an acquire waits
	// for its answer (acquireWindow). The simulator sets it to
	// heartbeat_timeout in node mode to reproduce the takeovers of the
	// runtime before the longer window; hosts leave it zero.
	AcquireWindow time.Duration
	// BeatWhileAcquiring has a node-mode member write its heartbeat key
	// while it acquires, as before it stopped doing so (memberBeatDue);
	// the simulator sets it with the runtime's other settings of then.
	// Hosts leave it false.
	BeatWhileAcquiring bool
}

type pendingWrite struct {
	op       uint64
	kind     WriteKind
	expect   uint64
	deadline time.Duration
	leader   Leader
}

// lateKeep bounds how many timed-out writes a member remembers, to adopt the
// revision of one that lands late.
const lateKeep = 8

// forgedKeep bounds how many revisions recorded as no member's write a
// member remembers, so that it records each once even when a read after
// a conflict came ahead of the watch that delivers them: the key's history
// (64 revisions) is all a watch can deliver late.
const forgedKeep = 64

// Member is one member of a failover pair. It is not safe for concurrent
// use: its host feeds it one input at a time.
type Member struct {
	site string
	opts Options

	// Durable state, folded from events by Apply.
	rules          Rules
	rulesRev       uint64 // latest <pair>.config revision decided on
	appliedRev     uint64 // latest revision applied (or found already in force)
	rejectedRev    uint64 // latest revision refused
	phase          Phase
	term           uint64
	then           AfterFence
	fenceReason    FenceReason
	procSeq        uint64
	procKind       ProcKind
	handoff        string
	lostTerm       uint64
	lastSwitchover string
	plannedLead    bool // leadership came from an operator's switchover
	// bootstrapping: this member took a register nobody ever held, as the
	// preferred primary, and has not served since: its workload may still
	// have to be created (a bootstrap cut short by a fence is redone).
	bootstrapping bool
	demoteReason  DemoteReason
	// paused: the pair is in maintenance (<pair>.pause, pause pauseID):
	// no takeover, failback or hand-over for failed checks.
	paused       bool
	pauseID      string
	pauseReason  string
	lastFailover string // the latest operator failover request settled

	// Volatile state, rebuilt from observations after a restart.
	now      time.Duration
	synced   bool
	syncedAt time.Duration
	// leader is the latest register entry a member wrote, as far as this
	// member can tell (see distrust): who holds the register, and since
	// when it is stale. regRev is the register's latest revision, whoever
	// wrote it: what a compare-and-set must expect.
	leader       LeaderEntry
	leaderKnown  bool
	leaderSeenAt time.Duration
	regRev       uint64
	// The register's high-water mark among the values this member took
	// (see takeLeader): the highest term, the latest holder's write in it
	// (hwSite, hwBeat; hwHeld: one was taken) and whether it was left
	// without a holder in that term (a release, a vacant value): a
	// holder's value at or below it may be an older one replayed (see
	// replayed).
	hwTerm      uint64
	hwSite      string
	hwBeat      uint64
	hwHeld      bool
	hwVacant    bool
	forgedSeen  [forgedKeep]uint64 // the latest revisions recorded as no member's write (a ring)
	forgedNext  int
	ownBeatTime time.Time
	ownBeatRev  uint64
	// storeResumed is the server time of this member's first heartbeat
	// after a stretch of more than 2 heartbeat_timeout in which none of
	// its own landed: the store (or the way to it) stalled for everyone,
	// a JetStream leader election for instance, and the leader's silence
	// over that stretch proves nothing about the leader.
	storeResumed time.Time
	// rewatched: the watch was established afresh (Resynced); its first
	// delivery of this member's heartbeat skips the ones written while it
	// was re-established, and that gap is the watch's, not the store's.
	rewatched    bool
	lastRev      uint64 // revision of this member's own last landed register write
	beat         uint64
	memberBeat   uint64
	inflight     *pendingWrite
	late         []pendingWrite
	memberOp     uint64
	memberDue    time.Duration
	nextBeatAt   time.Duration
	nextMemberAt time.Duration
	failures     int
	// failRecorded: a HeartbeatFailed was recorded since the last
	// success (node mode records only a serving holder's).
	failRecorded  bool
	successes     int
	prefCount     int
	prefLast      time.Time
	memberOK      int           // consecutive own heartbeats acknowledged in time
	memberAckRev  uint64        // revision of the latest own heartbeat acknowledged in time
	memberAckPrev uint64        // node mode: the one before
	checkSeq      uint64        // last check requested (its own sequence: checks are not durable)
	checkWait     bool          // a check is running
	checkDue      time.Duration // local time of the next check
	checkFails    int           // consecutive failed checks
	checkHold     bool          // handed over for failed checks: not ready until a check passes
	peerReady     int           // consecutive ready heartbeats of the other site, gaps <= 2 heartbeat_timeout
	peerLast      time.Time     // server time of the other site's last heartbeat
	peerSeenAt    time.Duration // local time it was observed
	fencedSince   time.Time     // server time of the first write of the current fenced run of the holder
	fencedSeenAt  time.Duration
	unfencedRun   int // consecutive unfenced writes of the holder in its term since fencedSince
	// unfenceAcked (node mode): since this holder was last fenced, an
	// unfenced register value of its own was acknowledged (its
	// announcement), and it has issued no fenced value since: only then
	// may its node's beats unfence it.
	unfenceAcked bool
	// unfencing (node mode): the holder unfenced and has not started
	// serving since; resumed: it then started serving, and has not been
	// fenced since: its register says so (Leader.Resumed).
	unfencing, resumed bool
	// fencedBeat (node mode): the beat of this holder's latest register
	// value issued fenced, or of the latest issued before its fence: an
	// unfenced value of its own above it is an announcement made since.
	fencedBeat uint64
	probedFor  uint64 // leader revision a staleness probe was written for
	// acquireAt: no acquire before this local time. An acquire that NATS
	// refused without showing a newer register, or that failed, waits a
	// heartbeat_timeout: retrying at once could only loop.
	acquireAt    time.Duration
	fenceFailed  bool
	fenceRetryAt time.Duration
	opSeq        uint64
	acq          struct {
		reason  AcquireReason
		planned bool // taking over a switchover's handoff
	}

	// The workload, with Options.Rejoin and Positions.
	rejoinTo    string        // the leader the workload follows (Rejoined), "" none
	rejoinTerm  uint64        // and its term
	rejoinFor   string        // the leader of the rejoin in flight ("" none)
	rejoinAt    time.Duration // no rejoin before this local time (after a failure)
	rejoinBack  time.Duration // the current wait after a failed rejoin
	status      capability.Status
	statusKnown bool // a check reported status since the start
	statusOK    bool // and the latest check passed
	statusFails int  // consecutive failed checks of a follower
	withheldRev uint64
	// Synchronous replication, for a leader: syncReg is what its register
	// writes say; syncLanded what the latest landed one said; syncWait: a
	// sync procedure runs.
	syncReg    bool
	syncLanded bool
	syncSeq    uint64
	syncWait   bool
	// syncFrom: the leader's flush position at its first check after its
	// workload started waiting for the other member: commits acknowledged
	// before may not be there. The register says sync only once the
	// other member has flushed up to it.
	syncFrom capability.LSN
	// pubFlush: the latest flush position a holder published in the
	// register (a holder that does not know its position publishes none,
	// and the earlier one stands), pubBy who published it ("site/term");
	// pubSite, pubTerm, pubSync: the latest holder, and what its latest
	// write said of synchronous replication.
	pubFlush capability.LSN
	pubBy    string
	pubSite  string
	pubTerm  uint64
	pubSync  bool

	// pauseRev: the latest <pair>.pause revision seen; failoverReq: an
	// operator's failover request to this member, not settled yet.
	pauseRev    uint64
	failoverReq *pendingFailover

	// Node mode (Options.Node; see liveness.go). beatRev and beatTime:
	// the register holder's latest beat, its latest register write or its
	// node's latest liveness write in the register's epoch, whichever is
	// later (per-pair: the register's latest write).
	beatRev  uint64
	beatTime time.Time
	// nodeEpoch: this member's node's epoch as its latest liveness result
	// said (0: none yet); leaseEpoch: the epoch this holder's register
	// value names (0: not bound yet); lastLiveAt: local time of the
	// latest liveness result.
	nodeEpoch  uint64
	leaseEpoch uint64
	lastLiveAt time.Duration
	// seen: when the host saw the input being stepped (now, unless the
	// input is dated: LivenessObserved.At, LivenessResult.At).
	seen time.Duration
	// written: the holder's latest landed register value (what a change
	// is compared with) and its revision; flushAt: when it last published
	// its log position.
	written    Leader
	writtenOK  bool
	writtenRev uint64
	flushAt    time.Duration
	// hbWritten: this member's latest landed heartbeat value; peerHB the
	// other member's latest, repeated by its node's liveness writes.
	hbWritten   Heartbeat
	hbOK        bool
	hbPending   Heartbeat
	peerHB      Heartbeat
	peerHBKnown bool
	// lives: per node, the liveness record as seen; raise: the epoch
	// raise in flight, and the takeover it precedes.
	lives map[string]*liveSeen
	raise *pendingRaise

	out Ready
}

// liveSeen is a node's liveness record as a member saw it: the latest
// revision (any value: a raise's compare-and-set expects it), the highest
// epoch of a genuine value, and the highest beat of the node in it.
type liveSeen struct {
	rev     uint64
	epoch   uint64
	beat    uint64
	beatSet bool
}

// pendingRaise is an epoch raise in flight and the takeover after it.
type pendingRaise struct {
	node   string
	epoch  uint64 // the epoch written
	from   uint64 // the lease's epoch
	reason AcquireReason
	stale  time.Duration
}

// pendingFailover is an operator's failover request waiting for this
// member to decide: rev and at are its entry's revision and server time,
// seenAt the local time it arrived.
type pendingFailover struct {
	rev    uint64
	at     time.Time
	seenAt time.Duration
	req    ManualFailover
}

// NewMember returns the member of rules' pair on site. The rules are
// validated (with the safety inequality unless opts.AllowUnsafe).
func NewMember(site string, rules Rules, opts Options) (*Member, error) {
	if err := checkRules(rules, opts); err != nil {
		return nil, err
	}
	if !rules.Has(site) {
		return nil, &actors.ConfigError{Field: "site", Rule: fmt.Sprintf("must be a member of pair %s (%s or %s)", rules.Pair, rules.Primary, rules.Replica), Value: site}
	}
	return &Member{site: site, opts: opts, rules: rules}, nil
}

func checkRules(r Rules, opts Options) error {
	if opts.AllowUnsafe {
		return r.ValidateShape()
	}
	if err := r.Validate(); err != nil {
		return err
	}
	if (r.Synchronous == SyncOn || r.Synchronous == SyncStrict) && (!opts.Synchronizer || !opts.Positions) {
		return &actors.ConfigError{Field: "synchronous", Rule: "must be off: this member's workload cannot make commits wait for the other member (only a workload that replicates, such as postgres, can)", Value: r.Synchronous.String()}
	}
	return r.CheckFenceBudget(opts.FenceBudget)
}

// Site is the member's site.
func (m *Member) Site() string { return m.site }

// Rules are the rules in force.
func (m *Member) Rules() Rules { return m.rules }

// Phase is the member's phase.
func (m *Member) Phase() Phase { return m.phase }

// Term is the term the member holds or last held.
func (m *Member) Term() uint64 { return m.term }

// Serving reports whether the member serves (phase leader).
func (m *Member) Serving() bool { return m.phase == PhaseLeader }

// mayServe reports whether the member's resource may be serving: the
// phases its failed heartbeats fence.
func (m *Member) mayServe() bool {
	return m.phase == PhaseLeader || m.phase == PhasePromoting || m.phase == PhaseDemoting
}

// Holding reports whether the member holds (or still writes) the register.
func (m *Member) Holding() bool { return m.holding() }

// LostTerm is the last term in which the member saw its CAS lost (0: never).
func (m *Member) LostTerm() uint64 { return m.lostTerm }

// Paused reports whether the member sees the pair paused (maintenance).
func (m *Member) Paused() bool { return m.paused }

// Failures is the count of consecutive failed register writes.
func (m *Member) Failures() int { return m.failures }

// Start begins a (re)started member's life: it comes up fenced. Call it
// once, after folding the member's logged events with Apply.
func (m *Member) Start(now time.Duration) Ready {
	*m = Member{
		site: m.site, opts: m.opts, rules: m.rules, rulesRev: m.rulesRev, bootstrapping: m.bootstrapping,
		appliedRev: m.appliedRev, rejectedRev: m.rejectedRev, checkHold: m.checkHold,
		term: m.term, procSeq: m.procSeq, lostTerm: m.lostTerm, lastSwitchover: m.lastSwitchover,
		paused: m.paused, pauseID: m.pauseID, pauseReason: m.pauseReason, lastFailover: m.lastFailover,
		now: now, lastLiveAt: now,
	}
	m.emit(&Started{Pair: m.rules.Pair, Site: m.site, Rules: m.rules})
	m.fence(FenceRestart, AfterResume)
	m.tick()
	return m.flush()
}

// Step feeds one input that arrived at local monotonic time now.
func (m *Member) Step(now time.Duration, in Input) Ready {
	return m.StepAll(now, in)
}

// StepAll feeds inputs that had all arrived by local monotonic time now,
// in order, then runs the member's timed checks once: a host that hands
// several over at once (the runtime's liveness log, dated) must not have
// a check judge an early one at now while a later one, which answers it,
// waits behind it.
func (m *Member) StepAll(now time.Duration, ins ...Input) Ready {
	if now > m.now {
		m.now = now
	}
	for _, in := range ins {
		m.apply(in)
	}
	m.tick()
	return m.flush()
}

// apply takes in one input (Step without the timed checks).
func (m *Member) apply(in Input) {
	m.seen = m.now
	switch in := in.(type) {
	case Tick:
	case Resynced:
		if m.synced {
			m.rewatched = true
		}
		m.onSynced()
	case Synced:
		m.onSynced()
	case WriteResult:
		m.onWriteResult(in)
	case LeaderObserved:
		m.onLeader(in.Entry)
	case HeartbeatObserved:
		m.onMemberBeat(in)
	case ConfigObserved:
		m.onConfig(in)
	case SwitchoverObserved:
		m.onSwitchover(in)
	case PauseObserved:
		m.onPause(in)
	case ManualFailoverObserved:
		m.onManualFailover(in)
	case LivenessResult:
		m.seen = m.dated(in.At)
		m.onLivenessResult(in)
	case LivenessObserved:
		m.seen = m.dated(in.At)
		m.onLiveness(in)
	case ProcedureResult:
		m.onProcedure(in)
	case Shutdown:
		switch m.phase {
		case PhaseLeader, PhasePromoting, PhaseSuspended:
			m.demote(DemoteShutdown, m.rules.Other(m.site))
		}
	}
}

// Prompt reports whether the member acts on its node's next routine
// liveness input (a beat of a node in the same epoch, a liveness write
// that landed) as soon as it comes, so its host should hand it over at
// once rather than at the member's next step (dated: LivenessObserved.At,
// LivenessResult.At). A serving holder's lease and a follower's clock of
// the holder's beats run from the inputs' dates, and the member wakes by
// its own deadlines, so neither needs them at once; but a member taking
// over, suspended, fencing or handing over acts on the next success, and
// a follower that finds the holder stale by its own clock waits for its
// own node's next beat to show it stale by server time too.
func (m *Member) Prompt() bool {
	switch m.phase {
	case PhaseLeader:
		return false
	case PhaseFollower:
		// Whatever the register says (a holder, vacant, corrupt), the
		// staleness rule waits on this member's own clock first.
		fo := m.rules.FailoverTimeout
		return m.now-m.leaderSeenAt > fo || (m.leader.Value.Fenced && !m.fencedSince.IsZero() && m.now-m.fencedSeenAt > fo)
	}
	return true
}

// dated is when the host saw an input it dated at (see
// LivenessObserved.At): at itself when set and not ahead of the member's
// clock, else now.
func (m *Member) dated(at time.Duration) time.Duration {
	if at <= 0 || at > m.now {
		return m.now
	}
	return at
}

func (m *Member) onSynced() {
	if !m.synced {
		m.synced, m.syncedAt = true, m.now
		if !m.leaderKnown {
			m.leaderSeenAt = m.now
		}
		if m.paused && m.pauseRev == 0 {
			// Paused by its log, but the watch showed no pause: the key
			// was deleted while this member was down.
			m.emit(&AutomationResumed{})
		}
	}
}

// NextWake is the local monotonic time at which the member next needs a
// Tick (the host may tick sooner).
func (m *Member) NextWake() time.Duration {
	next := m.now + m.rules.HeartbeatTimeout
	consider := func(t time.Duration) {
		if t > m.now && t < next {
			next = t
		}
	}
	if m.inflight != nil {
		consider(m.inflight.deadline)
	}
	if m.memberOp != 0 {
		consider(m.memberDue)
	}
	if m.holding() {
		consider(m.nextBeatAt)
		if m.opts.Node != "" {
			consider(m.lastLiveAt + 2*m.rules.HeartbeatTimeout + 1)
		}
	} else {
		consider(m.nextMemberAt)
	}
	if m.fenceFailed {
		consider(m.fenceRetryAt)
	}
	if m.checkDue > 0 && !m.checkWait {
		consider(m.checkDue)
	}
	if m.phase == PhaseFollower && m.synced {
		consider(m.leaderSeenAt + m.rules.FailoverTimeout + 1)
	}
	return next
}

func (m *Member) flush() Ready {
	r := m.out
	m.out = Ready{}
	return r
}

func (m *Member) emit(ev events.Event) {
	m.Apply(ev)
	m.out.Events = append(m.out.Events, ev)
}

// Apply folds one durable event into the member's state. Step calls it for
// the events it emits; a host calls it to replay the member's log before Start.
func (m *Member) Apply(ev events.Event) {
	switch e := ev.(type) {
	case *Started:
		m.phase = PhaseStarting
		m.rules = e.Rules
	case *FenceRequested:
		m.phase, m.procSeq, m.procKind = PhaseFencing, e.Seq, ProcFence
		m.then, m.fenceReason = e.Then, e.Reason
	case *Fenced:
		m.resumed = false
		switch m.then {
		case AfterSuspend:
			m.phase = PhaseSuspended
		case AfterRelease:
			m.phase = PhaseReleasing
		default:
			m.phase = PhaseFollower
		}
	case *AcquireAttempted:
		m.phase = PhaseAcquiring
	case *Promoted:
		m.unfencing, m.resumed = false, false
		m.phase, m.term, m.procSeq, m.procKind = PhasePromoting, e.Term, e.Seq, ProcPromote
		m.plannedLead = e.Planned
		m.bootstrapping = e.Reason == AcquireBootstrap && m.site == m.rules.Primary
	case *PromotionRejected, *AcquireFailed:
		m.phase = PhaseFollower
	case *Resumed:
		m.phase, m.term = PhaseSuspended, e.Term
	case *Unfenced:
		m.phase, m.procSeq, m.procKind = PhasePromoting, e.Seq, ProcPromote
		m.unfencing = true
	case *ServingStarted:
		m.phase, m.bootstrapping = PhaseLeader, false
		m.resumed, m.unfencing = m.unfencing, false
	case *LeadershipLost:
		m.lostTerm = e.Term
		if m.phase == PhaseSuspended || m.phase == PhaseReleasing {
			m.phase = PhaseFollower // already not serving: nothing to fence
		}
	case *DemotionRequested:
		m.phase, m.procSeq, m.procKind, m.handoff = PhaseDemoting, e.Seq, ProcDemote, e.Handoff
		m.demoteReason = e.Reason
	case *Demoted:
		m.phase = PhaseReleasing
	case *Released:
		m.phase, m.handoff = PhaseFollower, ""
	case *ConfigApplied:
		m.rules, m.rulesRev, m.appliedRev = e.Rules, e.Rev, e.Rev
	case *ConfigRejected:
		m.rulesRev, m.rejectedRev = e.Rev, e.Rev
	case *SwitchoverAccepted:
		m.lastSwitchover = e.ID
	case *SwitchoverRejected:
		m.lastSwitchover = e.ID
	case *CheckFailed:
		m.checkHold = m.checkHold || e.HandOver
	case *CheckRecovered:
		m.checkHold = false
	case *RejoinRequested:
		m.procSeq, m.procKind = e.Seq, ProcRejoin
	case *AutomationPaused:
		m.paused, m.pauseID, m.pauseReason = true, e.ID, e.Reason
	case *AutomationResumed:
		m.paused, m.pauseID, m.pauseReason = false, e.ID, ""
	case *ManualFailoverAccepted:
		m.lastFailover = e.ID
	case *ManualFailoverRejected:
		m.lastFailover = e.ID
	}
}

// holding reports whether the member writes the register: it holds it, or
// it fences while still holding it.
func (m *Member) holding() bool {
	return m.phase.holds() || (m.phase == PhaseFencing && (m.then == AfterSuspend || m.then == AfterRelease))
}

func (m *Member) mine(l Leader) bool { return l.Site == m.site && l.Term == m.term }

func (m *Member) nextOp() uint64 { m.opSeq++; return m.opSeq }

func (m *Member) fence(reason FenceReason, then AfterFence) {
	m.syncFrom = 0
	m.unfenceAcked, m.fencedBeat = false, m.beat
	m.procSeq++
	m.fenceFailed = false
	m.emit(&FenceRequested{Seq: m.procSeq, Reason: reason, Term: m.term, Then: then})
	m.out.Procedures = append(m.out.Procedures, m.procedure(ProcFence, m.procSeq, reason.String()))
}

func (m *Member) tick() {
	if m.inflight != nil && m.now >= m.inflight.deadline {
		w := *m.inflight
		m.inflight = nil
		m.late = append(m.late, w)
		if len(m.late) > lateKeep {
			m.late = m.late[1:]
		}
		why := "timeout: no answer within heartbeat_timeout"
		if w.kind == WriteAcquire && m.acquireWindow() == 2*m.rules.HeartbeatTimeout {
			why = "timeout: no answer within 2 × heartbeat_timeout"
		}
		m.onLeaderWriteFailed(w, why)
	}
	if m.memberOp != 0 && m.now >= m.memberDue {
		m.memberOp = 0
		if m.opts.Node == "" {
			m.memberOK = 0
		}
	}
	if m.fenceFailed && m.phase == PhaseFencing && m.now >= m.fenceRetryAt {
		m.fence(m.fenceReason, m.then)
	}
	if m.holding() {
		if m.inflight == nil && m.now >= m.nextBeatAt && m.registerDue() {
			m.writeRegister()
		}
		if m.opts.Node != "" && m.now-m.lastLiveAt > 2*m.rules.HeartbeatTimeout {
			// The node's liveness writer answers every write by its
			// deadline: silence this long means it does not run. One more
			// failure every heartbeat_timeout from now on, as if its
			// writes went on failing.
			m.lastLiveAt = m.now - m.rules.HeartbeatTimeout
			m.onLeaderWriteFailed(pendingWrite{kind: WriteBeat}, "no liveness write of this node answered within 2 × heartbeat_timeout")
		}
	} else if m.memberOp == 0 && m.now >= m.nextMemberAt && m.memberBeatDue() {
		m.writeMemberBeat()
	}
	m.maybeManualFailover()
	switch m.phase {
	case PhaseFollower:
		m.maybeResume()
		if m.phase == PhaseFollower {
			m.maybeAcquire()
		}
		if m.phase == PhaseFollower && m.inflight == nil {
			m.maybeRejoin()
		}
	case PhaseLeader:
		m.maybeFailback()
	}
	m.maybeCheck()
}

// advance keeps a fixed cadence: the next write is one interval after the
// previous one was due, or one interval from now if we fell behind.
func (m *Member) advance(due time.Duration) time.Duration {
	next := due + m.rules.HeartbeatTimeout
	if next <= m.now {
		next = m.now + m.rules.HeartbeatTimeout
	}
	return next
}

func (m *Member) writeRegister() {
	var w Write
	if m.phase == PhaseReleasing {
		l := Leader{Term: m.term, Handoff: m.handoff, Planned: m.demoteReason == DemoteSwitchover, By: m.site, Prev: m.lastRev}
		w = Write{Kind: WriteRelease, Key: LeaderKey(m.rules.Pair), Leader: l, ExpectRev: m.lastRev}
	} else {
		w = Write{Kind: WriteBeat, Key: LeaderKey(m.rules.Pair), Leader: m.registerValue(), ExpectRev: m.lastRev}
		m.beat++
		if w.Leader.Fenced {
			// A fenced value on its way may land on top of an unfencing
			// announcement acknowledged before it, its answer lost, and
			// stand in the register (finding N9): that acknowledgement no
			// longer lets its node's beats unfence this holder.
			m.unfenceAcked, m.fencedBeat = false, w.Leader.Beat
		}
	}
	w.Op, w.Value, w.Deadline = m.nextOp(), EncodeLeader(w.Leader), m.now+m.rules.HeartbeatTimeout
	m.inflight = &pendingWrite{op: w.Op, kind: w.Kind, deadline: w.Deadline, leader: w.Leader, expect: w.ExpectRev}
	m.nextBeatAt = m.advance(m.nextBeatAt)
	m.out.Writes = append(m.out.Writes, w)
}

// registerValue is the holder's register value as it stands now (its
// beat, when the register is written every beat).
func (m *Member) registerValue() Leader {
	// A suspended holder that has had success_threshold good writes
	// announces that it is about to serve: this write is unfenced, and
	// it serves only once this write has landed (see onBeatSuccess).
	fenced := m.phase == PhaseSuspended && m.successes < m.rules.SuccessThreshold
	l := Leader{Site: m.site, Term: m.term, Beat: m.beat + 1, Fenced: fenced, Sync: m.syncReg, Paused: m.paused, PauseRev: m.pauseRev, By: m.site, Prev: m.lastRev}
	if m.opts.Positions && m.statusKnown && m.status.Role == capability.RolePrimary {
		l.Flush, l.Timeline = m.status.Flush, m.status.Timeline
	}
	if m.opts.Node != "" {
		l.Node, l.Epoch = m.opts.Node, m.leaseEpoch
		l.Resumed = m.resumed && !fenced
		if l.Epoch == 0 {
			l.Epoch = m.nodeEpoch
		}
	}
	return l
}

// registerDue reports whether the holder must write the register now.
// Per-pair: every beat. Node mode: when its value changed (a release,
// fenced or not, synchronous replication, the pause, the lease's node or
// epoch; the log position at most once per heartbeat_timeout), or a value
// no member wrote sits on top of its own.
func (m *Member) registerDue() bool {
	if m.opts.Node == "" || m.phase == PhaseReleasing {
		return true
	}
	if m.leaseEpoch == 0 && m.nodeEpoch == 0 {
		return false // no epoch to name yet: its node has not written
	}
	if !m.writtenOK || m.leaseEpoch == 0 || m.lastRev != m.writtenRev {
		return true
	}
	d, w := m.registerValue(), m.written
	if d.Flush != w.Flush && m.now-m.flushAt < m.rules.HeartbeatTimeout {
		d.Flush, d.Timeline = w.Flush, w.Timeline
	}
	return !sameRegister(d, w)
}

// sameRegister reports whether two register values say the same to a
// reader (all but the writer's bookkeeping: beat, writer, signature, the
// revision expected).
func sameRegister(a, b Leader) bool {
	return a.Site == b.Site && a.Term == b.Term && a.Handoff == b.Handoff && a.Fenced == b.Fenced && a.Planned == b.Planned &&
		a.Flush == b.Flush && a.Timeline == b.Timeline && a.Sync == b.Sync && a.Paused == b.Paused && a.PauseRev == b.PauseRev &&
		a.Node == b.Node && a.Epoch == b.Epoch && a.Resumed == b.Resumed
}

// noteWritten records a register value of this holder that landed at rev.
func (m *Member) noteWritten(l Leader, rev uint64) {
	if m.writtenOK && l.Flush != m.written.Flush {
		m.flushAt = m.now
	}
	m.written, m.writtenOK, m.writtenRev = l, true, rev
	if l.Epoch != 0 {
		m.leaseEpoch = l.Epoch
	}
}

// heartbeatValue is this member's heartbeat as it stands now (Beat unset).
func (m *Member) heartbeatValue() Heartbeat {
	ready := m.phase == PhaseFollower && m.memberOK >= m.rules.SuccessThreshold && !m.checkHold && m.watchCaughtUp() && m.workloadReady()
	hb := Heartbeat{Site: m.site, Phase: m.phase, Ready: ready, RulesRev: m.appliedRev, RejectedRev: m.rejectedRev,
		Paused: m.paused, PauseRev: m.pauseRev, Node: m.opts.Node}
	if m.statusKnown && (m.opts.Positions || m.opts.Rejoin) {
		st := m.status
		hb.Role, hb.Timeline, hb.Receive, hb.Replay, hb.Streaming = st.Role, st.Timeline, st.Receive, st.Replay, st.Streaming
	}
	if m.follows() {
		hb.Rejoined = m.rejoinTo
	}
	return hb
}

// memberBeatDue reports whether this member must write its heartbeat now:
// per-pair, every beat; node mode, when it changed (its node's liveness
// writes repeat it).
func (m *Member) memberBeatDue() bool {
	if m.opts.Node == "" {
		return true
	}
	if m.phase == PhaseAcquiring && !m.opts.BeatWhileAcquiring {
		// Its register's answer is due within two heartbeats, and then
		// it holds (and writes no heartbeat key) or follows again as it
		// did. A node taking over 10,000 pairs wrote one "acquiring"
		// heartbeat per pair among its registers: 4,059 of them while
		// registers were still to be written (run 52).
		return false
	}
	d, w := m.heartbeatValue(), m.hbWritten
	w.Beat = 0
	return !m.hbOK || d != w
}

func (m *Member) writeMemberBeat() {
	m.memberBeat++
	hb := m.heartbeatValue()
	hb.Beat = m.memberBeat
	m.hbPending = hb
	w := Write{Op: m.nextOp(), Kind: WriteMemberBeat, Key: HeartbeatKey(m.rules.Pair, m.site), Put: true,
		Beat: hb, Value: EncodeHeartbeat(hb), Deadline: m.now + m.rules.HeartbeatTimeout}
	m.memberOp, m.memberDue = w.Op, w.Deadline
	m.nextMemberAt = m.advance(m.nextMemberAt)
	m.out.Writes = append(m.out.Writes, w)
}

func (m *Member) acquire(reason AcquireReason, expect uint64, stale time.Duration) {
	if node, from, ok := m.raiseNeeded(); ok {
		m.raiseEpoch(node, from, reason, stale)
		return
	}
	term := max(m.term, m.lostTerm)
	if m.leaderKnown {
		term = max(term, m.leader.Value.Term)
	}
	term++
	m.acq.reason = reason
	// Leadership an operator chose (a switchover's handoff, a failover
	// request) is not handed back by failback: auto.
	m.acq.planned = (reason == AcquireHandoff && m.leader.Value.Planned) || reason == AcquireOperator
	m.emit(&AcquireAttempted{Reason: reason, Term: term, ExpectRev: expect, Stale: stale})
	l := Leader{Site: m.site, Term: term, By: m.site, Prev: expect}
	if m.opts.Node != "" {
		l.Node, l.Epoch = m.opts.Node, m.nodeEpoch
	}
	w := Write{Op: m.nextOp(), Kind: WriteAcquire, Key: LeaderKey(m.rules.Pair), Leader: l,
		Value: EncodeLeader(l), ExpectRev: expect, Deadline: m.now + m.acquireWindow()}
	m.inflight = &pendingWrite{op: w.Op, kind: w.Kind, deadline: w.Deadline, leader: l, expect: expect}
	m.out.Writes = append(m.out.Writes, w)
}

// acquireWindow is how long an acquire waits for its answer before it
// counts as failed and is tried again: heartbeat_timeout, and with node
// leadership twice that. A node taking over the pairs of a dead node
// sends all its acquires at once, thousands of them; its host issues a
// write only within the first half of its window (one issued later would
// land after the member stopped waiting), so with one heartbeat_timeout
// most of them were never issued, their members tried again a second
// later, and the store stood idle between the waves (a 10,000-pair
// takeover came in waves for 13 s). Twice heartbeat_timeout is the
// takeover's own budget (failover_timeout + 2 × heartbeat_timeout).
// A late answer is safe either way: the register is written by
// compare-and-set, and a member that finds its own late write there
// takes it as its own (resumed).
func (m *Member) acquireWindow() time.Duration {
	if m.opts.AcquireWindow > 0 {
		return m.opts.AcquireWindow
	}
	if m.opts.Node != "" {
		return 2 * m.rules.HeartbeatTimeout
	}
	return m.rules.HeartbeatTimeout
}

// IssueMargin is how long before its deadline a host stops issuing a
// member's KV write that waited for its turn (the runtime's gate and the
// simulator's model of it): one issued later would land after the member
// stopped waiting under load, count as failed all the same, and be written
// again. Half its window, and at most half a heartbeat_timeout: an acquire
// of node leadership waits two heartbeat_timeouts (acquireWindow), and in
// a takeover of thousands of pairs the acquires still waiting after the
// first second were dropped while the store had turns for them, and tried
// again two seconds later.
func IssueMargin(window, heartbeat time.Duration) time.Duration {
	return min(window/2, heartbeat/2)
}

// watchCaughtUp reports whether the watch has delivered this member's
// latest acknowledged heartbeat. Acknowledged puts say the way to NATS
// works; a handoff reaches the member only through its watch, which can
// lag seconds behind after a partition. A member whose watch lags would
// not see a handoff in time, and the register would stand vacant.
func (m *Member) watchCaughtUp() bool {
	if m.opts.Node != "" {
		// Node mode: the node's latest liveness write may be on its way
		// to the watch as its result comes in; the one before must have
		// been delivered (else a heartbeat would flip ready at every write).
		return m.synced && m.memberAckPrev != 0 && m.ownBeatRev >= m.memberAckPrev
	}
	return m.synced && m.memberAckRev != 0 && m.ownBeatRev >= m.memberAckRev
}

// maybeAcquire is the watchdog: promotion only when the leader's last write
// is stale by server timestamps AND by this member's own observation.
func (m *Member) maybeAcquire() {
	if !m.synced || m.inflight != nil || m.now < m.acquireAt {
		return
	}
	if m.opts.Node != "" && m.nodeEpoch == 0 {
		return // its node has not written its liveness yet: no epoch to name
	}
	fo := m.rules.FailoverTimeout
	localStale := m.now - m.leaderSeenAt
	if !m.leaderKnown {
		switch {
		case m.regRev != 0:
			// The register holds only values no member wrote, and the host
			// found none before them: held by nobody this member knows of.
			// Like a corrupt register, it is taken over by the staleness
			// rule, on this member's clock, never at once.
			if m.ownBeatRev != 0 && localStale > fo && !m.paused {
				m.acquire(AcquireStale, m.regRev, localStale)
			}
		case m.site == m.rules.Primary:
			m.acquire(AcquireBootstrap, 0, 0)
		case m.ownBeatRev != 0 && localStale > fo && !m.paused:
			m.acquire(AcquireBootstrap, 0, 0)
		}
		return
	}
	v := m.leader.Value
	if v.Site == m.site && v.Term > m.lostTerm {
		return // maybeResume handles it
	}
	// A register naming this member in a term it lost (its own last write,
	// and only forged values after it) is a holder gone like any other:
	// the staleness rule below takes it over.
	if v.Site == "" && !m.leader.Corrupt {
		// A corrupt register is vacant too, but its last valid holder may
		// still serve until its next CAS fails and its fence completes: it
		// is taken over only by the staleness rule below, never at once.
		switch {
		case v.Handoff == m.site:
			m.acquireChecked(AcquireHandoff, 0)
			return
		case v.Handoff == "" && m.site == m.rules.Primary:
			m.acquire(AcquireVacant, m.regRev, 0)
			return
		}
	}
	// Staleness runs from the leader's last write, or from when this
	// member's own writes landed again after a stall, whichever is later:
	// a holder cannot write while nobody can, and a stall as long as
	// failover_timeout (a JetStream election) must not pass for its death.
	// Like the local clock's check, this can only delay a promotion.
	serverStale := m.serverStale()
	if m.ownBeatRev > m.beatRev && serverStale > fo && localStale > fo {
		m.acquireStale(serverStale)
		return
	}
	if m.opts.Node == "" && localStale > fo && m.probedFor != m.beatRev && m.memberOp == 0 {
		// Stale by our own clock: get a fresh server timestamp now rather
		// than at the next interval, so detection is not late by up to one
		// heartbeat_timeout. Once per leader write.
		m.probedFor = m.beatRev
		m.writeMemberBeat()
	}
	if m.opts.Node != "" && localStale > fo && m.probedFor != m.beatRev {
		// The same in node mode: this member's heartbeat is its node's
		// liveness write, which the node makes now when asked (one write
		// for all its members). Once per holder beat.
		m.probedFor = m.beatRev
		m.out.ProbeLiveness = true
	}
	// A holder that keeps writing but stays fenced is as good as gone. Its
	// latest write must say fenced: the CAS then expects a revision written
	// while the holder did not serve, and the holder can serve again only
	// by a later, unfenced write, which would make the CAS fail.
	if v.Fenced && !m.fencedSince.IsZero() {
		fencedFor := m.ownBeatTime.Sub(m.fencedSince)
		if fencedFor > fo && m.now-m.fencedSeenAt > fo {
			m.acquireStale(fencedFor)
		}
	}
}

// serverStale is how long the register has not been written by server
// time: from the leader's last write to this member's latest heartbeat, or
// from this member's first heartbeat after a stall of the store when that
// is later (see maybeAcquire).
func (m *Member) serverStale() time.Duration {
	s := m.ownBeatTime.Sub(m.beatTime)
	if resumed := m.ownBeatTime.Sub(m.storeResumed); m.storeResumed.After(m.beatTime) && resumed < s {
		s = resumed
	}
	return s
}

// holderGone reports whether the register's holder counts as gone by the
// rules of maybeAcquire — stale by server time and by this member's own
// clock, or fenced for failover_timeout — and for how long.
func (m *Member) holderGone() (time.Duration, bool) {
	fo := m.rules.FailoverTimeout
	stale := m.serverStale()
	if m.ownBeatRev > m.beatRev && stale > fo && m.now-m.leaderSeenAt > fo {
		return stale, true
	}
	if m.leader.Value.Fenced && !m.fencedSince.IsZero() {
		fencedFor := m.ownBeatTime.Sub(m.fencedSince)
		if fencedFor > fo && m.now-m.fencedSeenAt > fo {
			return fencedFor, true
		}
	}
	return stale, false
}

func (m *Member) maybeResume() {
	if m.leaderKnown && m.leader.Value.Site == m.site && m.leader.Value.Term > m.lostTerm {
		m.emit(&Resumed{Term: m.leader.Value.Term, Rev: m.leader.Rev})
		// Revisions above its own latest write are values no member wrote
		// (see observeLeader): its first write replaces them.
		m.lastRev, m.beat = m.regRev, max(m.beat, m.leader.Value.Beat)
		m.written, m.writtenOK, m.writtenRev, m.leaseEpoch = m.leader.Value, true, m.leader.Rev, m.leader.Value.Epoch
		m.lastLiveAt = m.now
		m.syncReg, m.syncLanded = m.leader.Value.Sync, m.leader.Value.Sync
		m.failures, m.successes = 0, 0
		m.nextBeatAt = m.now
		if m.inflight == nil {
			m.writeRegister()
		}
	}
}

// adoptBeat makes this holder's next beat count on from l, its own
// write that landed (a write of its previous process, after a restart),
// when l's beat is above the latest it issued: the other member takes a
// holder's beat at or below one it took for a replay (see replayed).
func (m *Member) adoptBeat(l Leader) {
	if m.mine(l) && l.Beat > m.beat {
		m.beat = l.Beat
	}
}

// maybeFailback hands leadership back to the recovered preferred primary,
// but only after a takeover: leadership an operator moved here stays.
func (m *Member) maybeFailback() {
	if m.rules.Failback != FailbackAuto || m.site == m.rules.Primary || m.paused {
		return
	}
	if m.plannedLead {
		return
	}
	if m.syncHandoffBlocked() != "" {
		return // it waits until the register says sync: the primary then has every commit
	}
	if m.prefCount >= m.rules.SuccessThreshold {
		m.prefCount = 0
		m.demote(DemoteFailback, m.rules.Primary)
	}
}

func (m *Member) demote(reason DemoteReason, to string) {
	m.procSeq++
	m.emit(&DemotionRequested{Seq: m.procSeq, Reason: reason, Handoff: to})
	m.out.Procedures = append(m.out.Procedures, m.procedure(ProcDemote, m.procSeq, reason.String()))
}

func (m *Member) onWriteResult(r WriteResult) {
	if r.Op == m.memberOp {
		m.memberOp = 0
		if m.opts.Node != "" {
			// Its node's liveness writes count its beats; this one only
			// published what changed.
			if r.Err == WriteOK {
				m.hbWritten, m.hbOK = m.hbPending, true
			}
			return
		}
		if r.Err == WriteOK {
			m.memberOK++
			m.memberAckRev = max(m.memberAckRev, r.Revision)
		} else {
			m.memberOK = 0
		}
		return
	}
	if m.inflight != nil && r.Op == m.inflight.op {
		w := *m.inflight
		m.inflight = nil
		m.onLeaderWriteAnswered(w, r)
		return
	}
	for i, w := range m.late {
		if w.op != r.Op {
			continue
		}
		m.late = append(m.late[:i:i], m.late[i+1:]...)
		switch {
		case r.Err == WriteOK && w.kind == WriteBeat && m.holding() && m.mine(w.leader) && r.Revision > m.lastRev:
			// A write we gave up on landed after all: remember its revision so
			// our next CAS does not mistake our own write for a rival's.
			m.lastRev = r.Revision
			if m.opts.Node != "" && m.announcementLanded(w.leader) {
				m.noteWritten(w.leader, r.Revision)
			}
		case r.Err == WriteConflict && w.kind == WriteAcquire:
			// Too late to matter, but the record should say NATS refused it.
			ev := &PromotionRejected{Term: w.leader.Term, ExpectRev: w.expect}
			if r.Current != nil {
				ev.CurrentRev, ev.Current = r.Current.Rev, r.Current.Value
			}
			m.emit(ev)
		}
		return
	}
}

func (m *Member) onLeaderWriteAnswered(w pendingWrite, r WriteResult) {
	why := "" // why the register read back is not a member's write
	if r.Current != nil {
		m.observeLeader(*r.Current)
		why = m.verdict(*r.Current)
	}
	switch w.kind {
	case WriteBeat:
		switch r.Err {
		case WriteOK:
			m.lastRev = max(m.lastRev, r.Revision)
			m.noteWritten(w.leader, r.Revision)
			m.announcementLanded(w.leader)
			if m.opts.Node == "" || (m.phase == PhaseSuspended && !w.leader.Fenced && m.successes >= m.rules.SuccessThreshold) {
				// Node mode: only the node's liveness writes are heartbeats,
				// but for the announcement of an unfencing, which lands by CAS
				// once success_threshold of them did: it unfences, as it does
				// per pair.
				m.onBeatSuccess(w.leader.Fenced)
			}
			m.onSyncLanded(w.leader, r.Revision)
		case WriteConflict:
			if r.Current != nil && why != "" {
				// A value no member wrote moved the revision: this holder
				// still holds the register, unless a rival's write came
				// before it. Its write did not land all the same, and counts
				// as failed — the other member's clock runs on its landed
				// writes only, so a holder whose writes a forger keeps from
				// landing must fence itself in time. It writes again at
				// once, by CAS on that value.
				switch {
				case r.Current.Rev <= w.expect:
					m.onLeaderWriteFailed(w, fmt.Sprintf("conflict, but the register read back (rev %d) is not newer than the revision the write expected (rev %d): stale read", r.Current.Rev, w.expect))
				case m.rivalSince(w.expect):
					m.lose(&m.leader)
				default:
					m.lastRev = max(m.lastRev, r.Current.Rev)
					m.onLeaderWriteFailed(w, fmt.Sprintf("conflict: a value no member wrote (rev %d) landed first: %s", r.Current.Rev, why))
					m.nextBeatAt = m.now
				}
				return
			}
			if r.Current != nil && m.mine(r.Current.Value) {
				if r.Current.Rev <= w.expect {
					// The register read back is not newer than the revision
					// this write expected, yet the CAS failed: a stale read
					// (a cut-off stream leader answers with what it had). It
					// proves nothing; writing again at once could loop, so it
					// counts as a failed write.
					m.onLeaderWriteFailed(w, fmt.Sprintf("conflict, but the register read back (rev %d) is not newer than the revision the write expected (rev %d): stale read", r.Current.Rev, w.expect))
					return
				}
				// Our own earlier write landed late and moved the revision.
				// NATS answered in time, so this is neither failure nor
				// success: adopt the revision and write again at once (at
				// most once per landed write of ours: the revision only
				// grows).
				m.lastRev = max(m.lastRev, r.Current.Rev)
				m.adoptBeat(r.Current.Value)
				m.nextBeatAt = m.now
				return
			}
			m.lose(r.Current)
		default:
			m.onLeaderWriteFailed(w, cause(r))
		}
	case WriteAcquire:
		switch r.Err {
		case WriteOK:
			m.lastRev, m.beat = r.Revision, 0
			m.failures, m.successes = 0, 0
			m.noteWritten(w.leader, r.Revision)
			m.lastLiveAt = m.now
			m.procSeq++
			m.emit(&Promoted{Seq: m.procSeq, Term: w.leader.Term, Rev: r.Revision, Reason: m.acq.reason, Planned: m.acq.planned})
			m.rejoinTo, m.rejoinFor = "", ""
			m.syncReg, m.syncLanded, m.syncFrom = false, false, 0 // the acquire write says asynchronous
			m.out.Procedures = append(m.out.Procedures, m.procedure(ProcPromote, m.procSeq, m.acq.reason.String()))
			m.nextBeatAt = m.now + m.rules.HeartbeatTimeout
		case WriteConflict:
			ev := &PromotionRejected{Term: w.leader.Term, ExpectRev: w.expect}
			if r.Current != nil {
				ev.CurrentRev, ev.Current = r.Current.Rev, r.Current.Value
			}
			if r.Current == nil || r.Current.Rev <= w.expect {
				m.acquireAt = m.now + m.rules.HeartbeatTimeout
			}
			m.emit(ev)
		default:
			m.acquireAt = m.now + m.rules.HeartbeatTimeout
			m.emit(&AcquireFailed{Term: w.leader.Term, Cause: cause(r)})
		}
	case WriteBump:
		m.onRaiseAnswered(r)
	case WriteRelease:
		switch r.Err {
		case WriteOK:
			m.lastRev = r.Revision
			m.writtenOK, m.leaseEpoch = false, 0
			m.emit(&Released{Term: m.term, Rev: r.Revision, Handoff: w.leader.Handoff})
		case WriteConflict:
			if r.Current != nil && why != "" && !m.rivalSince(w.expect) {
				// A value no member wrote: release again at once, by CAS on
				// it (waiting for the next beat would let a forger writing
				// in step with the beats keep the release from landing).
				m.lastRev = max(m.lastRev, r.Current.Rev)
				if r.Current.Rev > w.expect {
					m.nextBeatAt = m.now
				}
				return
			}
			if r.Current != nil && m.mine(r.Current.Value) {
				m.lastRev = max(m.lastRev, r.Current.Rev)
				return // our own late heartbeat landed (or a stale read); retry the release next beat
			}
			if why != "" {
				m.lose(&m.leader)
				return
			}
			m.lose(r.Current)
		}
	}
}

// rivalSince reports whether the register as members wrote it shows
// another writer's value above revision rev (the holder lost it).
func (m *Member) rivalSince(rev uint64) bool {
	return m.leaderKnown && m.leader.Rev > rev && !m.mine(m.leader.Value)
}

func cause(r WriteResult) string {
	if r.Cause != "" {
		return r.Err.String() + ": " + r.Cause
	}
	return r.Err.String()
}

func (m *Member) onLeaderWriteFailed(w pendingWrite, why string) {
	switch w.kind {
	case WriteBeat:
		if m.opts.Node != "" && w.op != 0 {
			// Node mode: a register write publishes a change; only the
			// node's liveness writes (op 0 here) are heartbeats. It may
			// have landed all the same: the holder writes its value again
			// at the next interval, by CAS (an own late write found there
			// is adopted), so the register ends up saying what it should.
			m.writtenOK = false
			return
		}
		m.successes = 0
		m.failures++
		if m.opts.Node == "" || m.failures <= m.rules.FailureThreshold && m.mayServe() {
			// Node mode: a failed liveness write is its node's, and every
			// holder of the node sees it. Only a holder that serves
			// records it, up to its fence: a fenced holder's failures
			// decide nothing (HeartbeatRecovered says how many there
			// were), and a slow store's flapping answers would otherwise
			// bring an append per holder per heartbeat upon it —
			// 150,000 in a minute of a 10,000-pair takeover.
			m.emit(&HeartbeatFailed{Term: m.term, Failures: m.failures, Cause: why})
			m.failRecorded = true
		}
		if m.failures < m.rules.FailureThreshold {
			return
		}
		switch m.phase {
		case PhaseLeader, PhasePromoting:
			if !skipSelfFence {
				m.fence(FenceHeartbeatFailures, AfterSuspend)
			}
		case PhaseDemoting:
			m.fence(FenceHeartbeatFailures, AfterRelease)
		}
	case WriteAcquire:
		// It waited heartbeat_timeout for an answer already: no hot loop.
		m.emit(&AcquireFailed{Term: w.leader.Term, Cause: why})
	case WriteRelease:
		// not serving any more; the release is retried at the next beat
	case WriteBump:
		m.raise = nil
		m.acquireAt = m.now + m.rules.HeartbeatTimeout
		m.emit(&AcquireFailed{Cause: "raising the epoch of the holder's node: " + why})
	}
}

// onSyncLanded records what a landed register write said about
// synchronous replication, and lets the workload stop waiting once the
// register says it no longer does.
func (m *Member) onSyncLanded(l Leader, rev uint64) {
	if !m.opts.Synchronizer || l.Sync == m.syncLanded {
		return
	}
	m.syncLanded = l.Sync
	m.emit(&ReplicationModeChanged{Term: m.term, Rev: rev, Synchronous: l.Sync})
	if !l.Sync && m.statusKnown && m.status.SynchronousSet && !m.syncWait && m.phase == PhaseLeader {
		m.requestSync(false)
	}
}

func (m *Member) onBeatSuccess(fencedWrite bool) {
	if m.failures > 0 && (m.opts.Node == "" || m.failRecorded) {
		m.emit(&HeartbeatRecovered{Term: m.term, AfterFailures: m.failures})
	}
	m.failRecorded = false
	m.failures = 0
	m.successes++
	if m.phase == PhaseSuspended && m.successes >= m.rules.SuccessThreshold && fencedWrite {
		m.nextBeatAt = m.now // announce the unfencing at once
	}
	if m.phase == PhaseSuspended && m.successes > m.rules.SuccessThreshold && !fencedWrite {
		m.successes = 0
		m.procSeq++
		m.emit(&Unfenced{Seq: m.procSeq, Term: m.term})
		m.out.Procedures = append(m.out.Procedures, m.procedure(ProcPromote, m.procSeq, "unfenced"))
		m.rejoinTo, m.rejoinFor = "", ""
	}
}

// announcementLanded records that l, an unfencing announcement of this
// suspended holder, landed — answered in time or late, or seen on the
// watch first — when it was issued since the holder's fence and its latest
// fenced value (see fencedBeat): the register says it is unfenced, and
// its node's beats may unfence it. Learning it only from an answer in
// time left a holder whose answers came late suspended while the
// follower, seeing the unfenced value stand with its node's beats, took
// it for recovered (finding N10).
func (m *Member) announcementLanded(l Leader) bool {
	if m.phase != PhaseSuspended || !m.mine(l) || l.Fenced || l.Beat <= m.fencedBeat {
		return false
	}
	m.unfenceAcked = true
	return true
}

// lose handles a register written by someone else while we held it.
func (m *Member) lose(cur *LeaderEntry) {
	ev := &LeadershipLost{Term: m.term}
	if cur != nil {
		ev.Rev, ev.Holder = cur.Rev, cur.Value
	}
	m.inflight = nil
	m.failures, m.successes = 0, 0
	m.emit(ev)
	switch m.phase {
	case PhaseLeader, PhasePromoting, PhaseDemoting, PhaseFencing:
		m.fence(FenceLostRegister, AfterFollow)
	}
}

// observeLeader takes in a revision of the register. It reports whether
// the revision is new to this member, why it is not a member's write (""
// when it is one: see distrust), and the entry it now takes for the
// register as members wrote it (nil: none new) — e itself, or, for a value
// no member wrote, the genuine entry before it (LeaderEntry.Genuine) when
// that one is newer than what it knew. A value no member wrote is recorded
// (ForgedValueIgnored) and changes nothing else: not the holder, not the
// staleness of its writes; only the revision a compare-and-set expects.
func (m *Member) observeLeader(e LeaderEntry) (fresh bool, why string, took *LeaderEntry) {
	if m.leaderKnown && e.Rev <= m.leader.Rev {
		// Older than the register as this member knows it (a watch behind
		// a read): it changes nothing, but one that is plainly no member's
		// is recorded all the same, for the record's readers.
		if why := m.plainlyForged(e); why != "" {
			m.ignore(e, why)
		}
		return false, "", nil
	}
	why = m.distrust(e)
	if e.Rev <= m.regRev {
		// Below a revision already seen: a register read after a conflict
		// came ahead of the watch, which now delivers what it skipped. A
		// member's write is taken; anything else was seen already.
		if why != "" {
			m.ignore(e, why)
			return false, "", nil
		}
		m.takeLeader(e)
		return true, "", &m.leader
	}
	m.regRev = e.Rev
	if g := e.Genuine; why != "" && g != nil && !g.Forged && (!m.leaderKnown || g.Rev > m.leader.Rev) && g.Rev < e.Rev && m.distrust(*g) == "" {
		// A holder's write this member did not see: the register as
		// members wrote it, and what e is judged against.
		m.takeLeader(*g)
		took = &m.leader
		why = m.distrust(e)
	}
	if why == "" {
		m.takeLeader(e)
		return true, "", &m.leader
	}
	m.ignore(e, why)
	return true, why, took
}

// ignore records, once, that register entry e is not a member's write.
func (m *Member) ignore(e LeaderEntry, why string) {
	for _, r := range m.forgedSeen {
		if r == e.Rev {
			return
		}
	}
	m.forgedSeen[m.forgedNext] = e.Rev
	m.forgedNext = (m.forgedNext + 1) % forgedKeep
	v := e.Value
	v.Sig = nil
	m.emit(&ForgedValueIgnored{Rev: e.Rev, Reason: why, Value: v, Holder: m.holding()})
}

// distrust says why register entry e is not a value a member wrote, or ""
// when it is one as far as this member can tell: its signature verifies
// (the host says Forged otherwise), a holder's value is written by the
// holder (By) and is newer than every value of the register this member
// took (see replayed), and leader = none is written by the holder of the
// register as this member last knew it, in its term — only a holder
// releases, after it demoted. Values without By (written before it
// existed, or with verification off) are taken as they are, but for the
// replay rule: no member writes an older holder's value.
func (m *Member) distrust(e LeaderEntry) string {
	v := e.Value
	if why := m.plainlyForged(e); why != "" {
		return why
	}
	switch {
	case v.Site == "" && v.By != "" && m.leaderKnown && !m.leader.Corrupt:
		if p := m.leader.Value; p.Site != v.By || p.Term != v.Term {
			return fmt.Sprintf("leader = none written by %s in term %d, but the register's holder was %v: only the holder releases it, in its own term", v.By, v.Term, p)
		}
	case v.Site != "" && !e.Corrupt:
		return m.replayed(v)
	}
	return ""
}

// replayed says why holder's value v is an older value written again, or
// "" when it is the holder's fresh write as far as this member can tell.
// A signature covers a value, not when it was written: anyone who may
// publish on the register's subject can write a genuine value again, and
// taken for the holder's it would keep a dead holder looking alive or
// give the register back to a term it left. A holder's writes go up: its
// term is above every term the register had (acquire), its beats grow
// within the term (across a restart too: maybeResume, adoptBeat), it never
// writes its term again once it released it, and each lands by CAS on the
// register's latest revision (Prev). A value is fresh when its term and
// beat are above the register's high-water mark as this member took it,
// or when it was written on top of the latest member's write it took (a
// holder that restarted while a replay was the register's latest value
// counts its beats on from that one; only Prev shows that its beats are
// new). A replay is neither, once the member took the value it copies or
// a later one.
func (m *Member) replayed(v Leader) string {
	if v.Prev != 0 && m.leaderKnown && v.Prev >= m.leader.Rev {
		return ""
	}
	why := ""
	switch {
	case v.Term < m.hwTerm:
		why = fmt.Sprintf("term %d, below term %d, which the register already had", v.Term, m.hwTerm)
	case v.Term > m.hwTerm:
		return ""
	case m.hwVacant:
		why = fmt.Sprintf("the register was left without a holder in term %d", v.Term)
	case m.hwHeld && m.hwSite == v.Site && v.Beat <= m.hwBeat:
		why = fmt.Sprintf("beat %d of %s in term %d, not above beat %d, which it already wrote", v.Beat, v.Site, v.Term, m.hwBeat)
	default:
		return ""
	}
	if v.Prev != 0 {
		why += fmt.Sprintf(", and its compare-and-set expected revision %d, older than revision %d, the latest member's write taken", v.Prev, m.leader.Rev)
	}
	return "a replay of an older value: " + why
}

// plainlyForged is the part of distrust that needs nothing but e: its
// signature, and a holder's value written by another.
func (m *Member) plainlyForged(e LeaderEntry) string {
	v := e.Value
	switch {
	case e.Forged:
		return "its signature does not verify against the key of a node that runs the site it names as its writer"
	case !e.Corrupt && v.Site != "" && v.By != "" && v.By != v.Site:
		return fmt.Sprintf("written by %s, yet it names %s as the holder: a holder's beats are its own", v.By, v.Site)
	}
	return ""
}

// verdict is distrust for an entry this member may have seen before (a
// register read back after a conflict): one at or below the register as
// members wrote it is taken as such.
func (m *Member) verdict(e LeaderEntry) string {
	if m.leaderKnown && e.Rev <= m.leader.Rev {
		return ""
	}
	return m.distrust(e)
}

// takeLeader makes e, a member's write, the register as this member knows it.
func (m *Member) takeLeader(e LeaderEntry) {
	prev := m.leader.Value
	sameHolder := m.leaderKnown && prev.Site == e.Value.Site && prev.Term == e.Value.Term && e.Value.Site != ""
	switch {
	case !sameHolder:
		// A new holder (or term) starts a new run.
		m.fencedSince, m.fencedSeenAt, m.unfencedRun = time.Time{}, 0, 0
		if e.Value.Fenced {
			m.fencedSince, m.fencedSeenAt = e.Time, m.now
		}
	case e.Value.Fenced:
		m.unfencedRun = 0
		if m.fencedSince.IsZero() {
			m.fencedSince, m.fencedSeenAt = e.Time, m.now
		}
	default:
		// An unfenced write ends the run only once the holder has written
		// unfenced success_threshold times in a row: a suspended holder
		// announces its unfencing with one unfenced write, and when the
		// answer to that write comes late it stays fenced and writes fenced
		// again. Counting such announcements as recoveries would restart
		// the clock at every one, and a holder on a bad link would keep the
		// pair without a primary for as long as the link stays bad.
		if m.opts.Node != "" {
			// Node mode: a serving holder does not write its register, so
			// its announcement is followed by nothing, whether it then
			// served or not. Once it serves again it says so (Resumed),
			// once; only that ends the run. Before, an unfenced value that
			// stood for failover_timeout with its node's beats ended it:
			// a holder that had served 4 s between two false fences of a
			// jumping clock was taken over at once at the second (finding
			// N4), and one whose promotion hung after it unfenced, or that
			// had not learnt its announcement landed, restarted the clock
			// without having served (random seeds 79 and 91, 10m, node
			// mode, five pairs, once N4's first fix was tried).
			if e.Value.Resumed {
				m.fencedSince, m.fencedSeenAt = time.Time{}, 0
			}
			break
		}
		m.unfencedRun++
		if m.unfencedRun >= m.rules.SuccessThreshold {
			m.fencedSince, m.fencedSeenAt = time.Time{}, 0
		}
	}
	m.leader, m.leaderKnown, m.leaderSeenAt = e, true, m.now
	if !sameHolder || e.Rev > m.beatRev {
		m.beatRev, m.beatTime = e.Rev, e.Time
	}
	m.raiseMark(e)
	if e.Value.Site != "" {
		m.pubSite, m.pubTerm, m.pubSync = e.Value.Site, e.Value.Term, e.Value.Sync
		if e.Value.Flush != 0 {
			m.pubFlush, m.pubBy = e.Value.Flush, holderID(e.Value.Site, e.Value.Term)
		}
	}
}

// raiseMark raises the register's high-water mark (see replayed) to e, a
// value this member took.
func (m *Member) raiseMark(e LeaderEntry) {
	v := e.Value
	switch {
	case v.Term < m.hwTerm:
		return // taken by its Prev (see replayed), or Corrupt with a term its host could not tell
	case v.Term > m.hwTerm:
		m.hwTerm, m.hwSite, m.hwBeat, m.hwHeld, m.hwVacant = v.Term, "", 0, false, false
	}
	switch {
	case v.Site == "":
		m.hwVacant = true
	case !m.hwHeld || v.Site != m.hwSite || v.Beat > m.hwBeat:
		m.hwSite, m.hwBeat, m.hwHeld = v.Site, v.Beat, true
	}
}

func holderID(site string, term uint64) string { return fmt.Sprintf("%s/%d", site, term) }

func (m *Member) onLeader(e LeaderEntry) {
	fresh, why, took := m.observeLeader(e)
	if !fresh || !m.holding() {
		return
	}
	if took != nil && took.Rev > m.lastRev {
		t := *took
		switch {
		case m.mine(t.Value):
			m.lastRev = t.Rev // our own write, seen before its answer
			m.adoptBeat(t.Value)
			if m.opts.Node != "" && m.announcementLanded(t.Value) {
				m.noteWritten(t.Value, t.Rev)
			}
		case m.phase == PhaseReleasing && t.Value.Site == "" && t.Value.Term == m.term && t.Value.Handoff == m.handoff && !t.Value.Fenced:
			// Our release landed; its answer is still on the way.
			m.inflight = nil
			m.lastRev = t.Rev
			m.emit(&Released{Term: m.term, Rev: t.Rev, Handoff: t.Value.Handoff})
			return
		default:
			m.lose(&t)
			return
		}
	}
	if why != "" && e.Rev > m.lastRev {
		// A value no member wrote, on top of this holder's: it still holds
		// the register, and its next write replaces the value by CAS.
		m.lastRev = e.Rev
	}
}

// onMemberBeat takes in a member heartbeat: the site is its key's, never
// what the value claims, and a key of neither member is nobody's.
func (m *Member) onMemberBeat(h HeartbeatObserved) {
	if h.Site != m.site && h.Site != m.rules.Other(m.site) {
		return
	}
	if h.Site == m.site {
		if h.Rev > m.ownBeatRev {
			if !m.rewatched && !m.ownBeatTime.IsZero() && h.Time.Sub(m.ownBeatTime) > 2*m.rules.HeartbeatTimeout {
				m.storeResumed = h.Time
			}
			m.rewatched = false
			m.ownBeatRev, m.ownBeatTime = h.Rev, h.Time
		}
		return
	}
	m.peerHB, m.peerHBKnown = h.Value, true
	switch {
	case !h.Value.Ready:
		m.peerReady = 0
	case m.peerLast.IsZero() || h.Time.Sub(m.peerLast) <= 2*m.rules.HeartbeatTimeout:
		m.peerReady++
	default:
		m.peerReady = 1
	}
	m.peerLast, m.peerSeenAt = h.Time, max(m.peerSeenAt, m.seen)
	if m.phase != PhaseLeader || h.Site != m.rules.Primary {
		m.prefCount, m.prefLast = 0, time.Time{}
		return
	}
	switch {
	case !h.Value.Ready:
		m.prefCount = 0
	case m.prefLast.IsZero() || h.Time.Sub(m.prefLast) <= 2*m.rules.HeartbeatTimeout:
		m.prefCount++
	default:
		m.prefCount = 1
	}
	m.prefLast = h.Time
}

func (m *Member) onConfig(c ConfigObserved) {
	if c.Rev <= m.rulesRev {
		return
	}
	reject := func(err error) {
		ev := &ConfigRejected{Rev: c.Rev, Field: "config", Rule: err.Error()}
		if ce, ok := err.(*actors.ConfigError); ok {
			ev.Field, ev.Rule, ev.Value = ce.Field, ce.Rule, ce.Value
		}
		m.emit(ev)
	}
	if c.DecodeErr != "" {
		reject(&actors.ConfigError{Field: "config", Rule: "must decode as pair rules", Value: c.DecodeErr})
		return
	}
	r := c.Rules
	switch {
	case r.Pair != m.rules.Pair:
		reject(&actors.ConfigError{Field: "pair", Rule: "cannot change at run time", Value: r.Pair})
	case r.Primary != m.rules.Primary:
		reject(&actors.ConfigError{Field: "primary", Rule: "cannot change at run time; restart the members with a new pair file", Value: r.Primary})
	case r.Replica != m.rules.Replica:
		reject(&actors.ConfigError{Field: "replica", Rule: "cannot change at run time; restart the members with a new pair file", Value: r.Replica})
	case m.opts.Node != "" && r.HeartbeatTimeout != m.rules.HeartbeatTimeout:
		reject(&actors.ConfigError{Field: "heartbeat_timeout", Value: r.HeartbeatTimeout.String(),
			Rule: "cannot change at run time with leadership: node: it is the interval of the node's liveness writes, shared by every pair of the node (" + m.rules.HeartbeatTimeout.String() + "); change it in the pair files and restart the node"})
	default:
		if err := checkRules(r, m.opts); err != nil {
			reject(err)
			return
		}
		if r == m.rules {
			m.rulesRev, m.appliedRev = c.Rev, c.Rev // already in force (the pair file's own rules)
			return
		}
		m.emit(&ConfigApplied{Rev: c.Rev, Rules: r})
	}
}

func (m *Member) onSwitchover(s SwitchoverObserved) {
	req := s.Request
	if req.ID == "" || req.ID == m.lastSwitchover || m.phase != PhaseLeader {
		return
	}
	if req.To == m.site || !m.rules.Has(req.To) {
		return
	}
	reason := m.peerNotReady()
	if reason == "" {
		reason = m.syncHandoffBlocked()
	}
	if reason != "" {
		// Handing over to a member that will not take the register would
		// leave the pair without a primary: refuse and keep leading.
		m.emit(&SwitchoverRejected{ID: req.ID, To: req.To, Reason: reason})
		return
	}
	m.emit(&SwitchoverAccepted{ID: req.ID, To: req.To})
	m.demote(DemoteSwitchover, req.To)
}

func (m *Member) onPause(p PauseObserved) {
	if p.Rev <= m.pauseRev {
		return
	}
	m.pauseRev = p.Rev
	v := p.Pause
	switch {
	case v.Paused && (!m.paused || v.ID != m.pauseID || v.Reason != m.pauseReason):
		m.emit(&AutomationPaused{ID: v.ID, Rev: p.Rev, Reason: v.Reason})
	case !v.Paused && m.paused:
		m.emit(&AutomationResumed{ID: v.ID, Rev: p.Rev})
	}
}

// onManualFailover keeps an operator's failover request to this member
// until the member can decide on it (maybeManualFailover). A newer
// request replaces one not yet settled, which is refused.
func (m *Member) onManualFailover(f ManualFailoverObserved) {
	req := f.Request
	if req.ID == "" || req.ID == m.lastFailover || req.To != m.site {
		return
	}
	if p := m.failoverReq; p != nil {
		if p.req.ID == req.ID || f.Rev <= p.rev {
			return
		}
		m.emit(&ManualFailoverRejected{ID: p.req.ID, To: m.site, Reason: "superseded by failover request " + req.ID})
	}
	m.failoverReq = &pendingFailover{rev: f.Rev, at: f.Time, seenAt: m.now, req: req}
}

// maybeManualFailover settles an operator's failover request to this
// member once it can: as a follower whose watch has caught up (so it
// knows the register and the server time), when the holder is gone by the
// usual staleness rules (or nobody holds the register) — refused when
// the holder writes unfenced after the request (it lives: a switchover
// moves leadership then) or when the lag rules forbid it without Force;
// refused too when it lapses (Within) before any of that.
func (m *Member) maybeManualFailover() {
	p := m.failoverReq
	if p == nil {
		return
	}
	req := p.req
	reject := func(ev *ManualFailoverRejected) {
		ev.ID, ev.To = req.ID, m.site
		m.failoverReq = nil
		m.emit(ev)
	}
	lapsed := fmt.Sprintf("no decision within %v of the request (this member was not a follower that knows the register and the server's time)", req.within())
	switch {
	case m.holding():
		reject(&ManualFailoverRejected{Reason: fmt.Sprintf("this member already holds the register (term %d, phase %v)", m.term, m.phase)})
		return
	case m.now-p.seenAt > req.within():
		reject(&ManualFailoverRejected{Reason: lapsed})
		return
	case m.phase != PhaseFollower || !m.watchCaughtUp() || m.inflight != nil || m.now < m.acquireAt:
		return // decide later
	case m.ownBeatTime.Sub(p.at) > req.within():
		reject(&ManualFailoverRejected{Reason: fmt.Sprintf("lapsed: written %v before this member's latest heartbeat (server time), more than its %v",
			m.ownBeatTime.Sub(p.at).Round(time.Millisecond), req.within())})
		return
	}
	expect := m.regRev
	var stale time.Duration
	holder := ""
	if m.leaderKnown {
		v := m.leader.Value
		holder = v.Site
		if v.Site != "" || m.leader.Corrupt {
			if v.Site != "" && m.beatRev > p.rev && !v.Fenced {
				reject(&ManualFailoverRejected{Reason: fmt.Sprintf("%s holds the register and writes it (term %d, revision %d written after the request): it is alive; use understudy switchover --to %s",
					v.Site, v.Term, m.beatRev, m.site)})
				return
			}
			var gone bool
			if stale, gone = m.holderGone(); !gone {
				return // the holder may still be dying: decide once it is gone, or writes again
			}
		}
	}
	why, lag := m.manualFailoverBlocked()
	own := max(m.status.Receive, m.status.Flush)
	if why != "" && !req.Force {
		reject(&ManualFailoverRejected{Reason: why + "; --force promotes regardless", LeaderFlush: m.pubFlush, Receive: own, Lag: lag,
			Limit: m.rules.MaxLagOnFailover, Synchronous: m.rules.Synchronous})
		return
	}
	m.failoverReq = nil
	m.emit(&ManualFailoverAccepted{ID: req.ID, To: m.site, Forced: why != "", Overrode: why, Holder: holder, LeaderRev: expect, Stale: stale,
		LeaderFlush: m.pubFlush, Receive: own, Lag: lag})
	m.acquire(AcquireOperator, expect, stale)
}

// manualFailoverBlocked says why the lag rules forbid an operator's
// failover to this member ("" when they allow it), with the lag when
// known. They are those of a takeover, but with synchronous on or strict
// a register that does not say sync forbids it only when this member
// lacks some of what the holder published: the operator saw the leader
// go and chose, and commits acknowledged after its last register write
// are what any takeover risks.
func (m *Member) manualFailoverBlocked() (string, uint64) {
	if !m.opts.Positions {
		return "", 0
	}
	own := max(m.status.Receive, m.status.Flush)
	switch {
	case !m.statusKnown || !m.status.Positions:
		return "this member's replication position is unknown (no check has reported it since the start)", 0
	case m.pubFlush == 0:
		return "no holder published its log position in the register: what this member lacks is unknown", 0
	case own == 0:
		return "this member's workload has received no log from the leader", 0
	}
	lag := capability.Lag(m.pubFlush, own)
	switch m.rules.Synchronous {
	case SyncOn, SyncStrict:
		if m.pubSync || lag == 0 {
			return "", lag
		}
		return fmt.Sprintf("the register says the leader's commits did not wait for this member (synchronous: %s) and this member lacks %d bytes of what it published (leader flushed %s, this member has %s): acknowledged commits would be lost",
			m.rules.Synchronous, lag, m.pubFlush, own), lag
	}
	if lag > m.rules.MaxLagOnFailover {
		return fmt.Sprintf("lag at the last contact is %d bytes (leader flushed %s, this member has %s), over maximum_lag_on_failover, %d",
			lag, m.pubFlush, own, m.rules.MaxLagOnFailover), lag
	}
	return "", lag
}

// syncHandoffBlocked says why, with synchronous on or strict, a planned
// hand-over must wait ("" when it need not): the other member takes the
// register only while it says sync, since only then does it have every
// acknowledged commit.
func (m *Member) syncHandoffBlocked() string {
	if !m.opts.Synchronizer || (m.rules.Synchronous != SyncOn && m.rules.Synchronous != SyncStrict) || m.syncLanded {
		return ""
	}
	return "the register does not say synchronous (synchronous: " + m.rules.Synchronous.String() + "): " +
		m.rules.Other(m.site) + " would not take it; wait until its database has caught up and commits wait for it"
}

// peerNotReady says why the other site cannot take over now, or "" when it
// can: its last heartbeat, seen within 2 heartbeat_timeout, says ready (a
// member says so after success_threshold own heartbeats acknowledged in
// time, as a follower).
func (m *Member) peerNotReady() string {
	switch {
	case m.peerLast.IsZero():
		return "no heartbeat of " + m.rules.Other(m.site) + " seen"
	case m.now-m.peerSeenAt > 2*m.rules.HeartbeatTimeout:
		return fmt.Sprintf("%s's last heartbeat was seen %v ago (more than 2 × heartbeat_timeout)", m.rules.Other(m.site), m.now-m.peerSeenAt)
	case m.peerReady == 0:
		return m.rules.Other(m.site) + " does not heartbeat ready (it is not a follower with success_threshold acknowledged heartbeats)"
	}
	return ""
}

// checkInterval is how often the workload is checked: CheckInterval, or
// every heartbeat_timeout for a workload that rejoins.
func (m *Member) checkInterval() time.Duration {
	if m.opts.CheckInterval > 0 || !m.opts.Rejoin {
		return m.opts.CheckInterval
	}
	return m.rules.HeartbeatTimeout
}

// procedure builds a request with the member's context.
func (m *Member) procedure(kind ProcKind, seq uint64, reason string) Procedure {
	p := Procedure{Kind: kind, Seq: seq, Term: m.term, Reason: reason}
	if m.leaderKnown && !m.leader.Corrupt {
		p.Leader = m.leader.Value.Site
	}
	if kind == ProcPromote {
		// A holder whose register says its commits wait keeps them waiting
		// (it resumes after a suspension or a restart).
		p.Leader = m.site
		p.Synchronous = m.rules.Synchronous == SyncStrict || (m.rules.Synchronous == SyncOn && m.syncReg)
		p.Bootstrap = m.bootstrapping
	}
	return p
}

// maybeRejoin asks the workload of a follower to follow the leader it
// sees, once per leader and term, again after a failure (with a doubling
// wait) and when its checks keep failing.
func (m *Member) maybeRejoin() {
	if !m.opts.Rejoin || m.phase != PhaseFollower || !m.synced || !m.leaderKnown || m.leader.Corrupt {
		return
	}
	v := m.leader.Value
	if v.Site == "" || v.Site == m.site {
		return
	}
	if m.rejoinTo == v.Site && m.rejoinTerm == v.Term {
		return
	}
	if m.now-m.leaderSeenAt > 2*m.rules.HeartbeatTimeout && m.rejoinFor == "" {
		// The leader has gone quiet: following it cannot work, and a
		// rejoin in flight (a restart of the standby) would only slow the
		// promotion that may come.
		return
	}
	if m.rejoinFor != "" && m.procKind == ProcRejoin {
		if m.rejoinFor == v.Site {
			return // in flight
		}
	} else if m.now < m.rejoinAt {
		return
	}
	m.procSeq++
	m.rejoinFor = v.Site
	m.emit(&RejoinRequested{Seq: m.procSeq, Leader: v.Site, Term: v.Term})
	p := m.procedure(ProcRejoin, m.procSeq, "follow "+v.Site)
	m.out.Procedures = append(m.out.Procedures, p)
}

func (m *Member) onRejoin(r ProcedureResult) {
	leader := m.rejoinFor
	m.rejoinFor = ""
	if m.phase != PhaseFollower {
		return
	}
	if !r.OK {
		m.rejoinBack = min(max(2*m.rules.HeartbeatTimeout, 2*m.rejoinBack), max(m.rules.FailoverTimeout, 10*m.rules.HeartbeatTimeout))
		m.rejoinAt = m.now + m.rejoinBack
		m.emit(&RejoinFailed{Seq: r.Seq, Detail: r.Detail, RetryIn: m.rejoinBack})
		return
	}
	m.rejoinBack, m.statusFails = 0, 0
	term := uint64(0)
	if m.leaderKnown && m.leader.Value.Site == leader {
		term = m.leader.Value.Term
	}
	m.rejoinTo, m.rejoinTerm = leader, term
	m.emit(&Rejoined{Seq: r.Seq, Leader: leader, Term: term})
}

// follows reports whether the workload follows the leader as this
// follower sees it (always true without Options.Rejoin, or when the
// register names nobody else).
func (m *Member) follows() bool {
	if !m.opts.Rejoin || !m.leaderKnown || m.leader.Corrupt {
		return true
	}
	v := m.leader.Value
	if v.Site == "" || v.Site == m.site {
		return true
	}
	return m.rejoinTo == v.Site && m.rejoinTerm == v.Term
}

// workloadReady: the workload's side of a follower's readiness: it follows
// the leader, its latest check passed, and its lag is within the limit.
func (m *Member) workloadReady() bool {
	if !m.opts.Rejoin && !m.opts.Positions {
		return true
	}
	if !m.follows() || !m.statusKnown || !m.statusOK {
		return false
	}
	if m.opts.Positions && m.leaderKnown && m.leader.Value.Site != "" && m.leader.Value.Site != m.site {
		if lag := capability.Lag(m.pubFlush, m.status.Receive); lag > m.rules.MaxLagOnFailover {
			return false
		}
	}
	return true
}

// withheld says why this follower must not take over the stale leader
// (the register as it saw it), or "" when it may. It applies only to a
// workload that reports positions.
//
// It applies to a takeover of a stale leader and to a handoff alike: a
// clean shutdown sends a standby everything only if it is connected, and
// a holder whose promotion or checks failed hands over without one.
// Positions are measured against the latest one a holder published.
func (m *Member) withheld() (string, uint64) {
	if !m.opts.Positions {
		return "", 0
	}
	limit, limitName := m.rules.MaxLagOnFailover, "maximum_lag_on_failover"
	switch m.rules.Synchronous {
	case SyncOn, SyncStrict:
		if m.pubSync {
			return "", 0
		}
		if m.pubSite != m.site || m.pubTerm != m.term || m.pubBy != holderID(m.site, m.term) {
			return "the register says the leader's commits did not wait for this member (synchronous: " + m.rules.Synchronous.String() +
				"): a promotion could lose acknowledged commits, so it waits for the leader", 0
		}
		// This member retaking a register it held last: its own database
		// has what it acknowledged, if it has what it published.
		limit, limitName = 0, "the limit of synchronous: "+m.rules.Synchronous.String()+" when the register does not say sync"
	}
	// Its own position: what it received as a standby, or flushed as a
	// primary (the holder that published the position itself has it all).
	own := max(m.status.Receive, m.status.Flush)
	switch {
	case !m.statusKnown || !m.status.Positions:
		return "this member's replication position is unknown (no check has reported it since the start)", 0
	case m.pubFlush == 0:
		return "the leader never published its log position in the register", 0
	case own == 0:
		return "this member's workload has received no log from the leader", 0
	}
	lag := capability.Lag(m.pubFlush, own)
	if lag > limit {
		return fmt.Sprintf("lag at the last contact is %d bytes (leader flushed %s, this member has %s), over %s, %d", lag, m.pubFlush, own, limitName, limit), lag
	}
	return "", lag
}

// acquireStale takes over a stale leader unless the lag rules withhold
// it; a withheld promotion is recorded once per register revision.
func (m *Member) acquireStale(stale time.Duration) {
	if m.paused {
		if m.withheldRev != m.leader.Rev {
			m.withheldRev = m.leader.Rev
			m.emit(&PromotionWithheld{LeaderRev: m.leader.Rev, Reason: m.pausedBecause(), Limit: m.rules.MaxLagOnFailover, Synchronous: m.rules.Synchronous})
		}
		return
	}
	m.acquireChecked(AcquireStale, stale)
}

// pausedBecause says that the pair is paused, and the operator's reason.
func (m *Member) pausedBecause() string {
	why := "automatic failover is paused (pause " + m.pauseID
	if m.pauseReason != "" {
		why += ": " + m.pauseReason
	}
	return why + "); an operator can run understudy failover --to " + m.site
}

// acquireChecked takes the register for reason unless the lag rules
// withhold it; a withheld promotion is recorded once per register revision.
func (m *Member) acquireChecked(reason AcquireReason, stale time.Duration) {
	if why, lag := m.withheld(); why != "" {
		if m.withheldRev != m.leader.Rev {
			m.withheldRev = m.leader.Rev
			m.emit(&PromotionWithheld{LeaderRev: m.leader.Rev, Reason: why, LeaderFlush: m.pubFlush, Receive: max(m.status.Receive, m.status.Flush),
				Lag: lag, Limit: m.rules.MaxLagOnFailover, Synchronous: m.rules.Synchronous})
		}
		return
	}
	m.acquire(reason, m.regRev, stale)
}

// manageSync keeps a leader's synchronous replication as the rule wants
// it, after each of its checks. Waiting starts in the workload before the
// register says so; the register says it stopped before the workload stops.
func (m *Member) manageSync() {
	if !m.opts.Synchronizer || m.phase != PhaseLeader || !m.statusKnown || m.syncWait {
		return
	}
	want := m.rules.Synchronous == SyncStrict || (m.rules.Synchronous == SyncOn && m.status.PeerStreaming)
	set := m.status.SynchronousSet
	switch {
	case want && !set:
		m.requestSync(true)
	case want && set:
		if m.syncFrom == 0 {
			m.syncFrom = max(m.status.Flush, 1)
		}
		// Commits acknowledged before the workload started waiting may
		// not be on the other member yet: say sync once it has them.
		if m.status.PeerStreaming && m.status.PeerFlush >= m.syncFrom {
			m.syncReg = true
		}
	case m.syncReg:
		m.syncReg, m.syncFrom = false, 0 // the next register write says so; the workload stops waiting once it landed
	case set && !m.syncLanded:
		m.syncFrom = 0
		m.requestSync(false)
	default:
		m.syncFrom = 0
	}
}

func (m *Member) requestSync(on bool) {
	m.syncSeq++
	m.syncWait = true
	p := m.procedure(ProcSync, m.syncSeq, map[bool]string{true: "commits wait for the other member", false: "commits stop waiting"}[on])
	p.Synchronous = on
	m.out.Procedures = append(m.out.Procedures, p)
}

// maybeCheck runs the check chain of a serving leader every CheckInterval.
//
// A member that handed over for failed checks keeps checking as a
// follower and says it is not ready (so no failback or switchover comes
// back to it) until a check passes.
func (m *Member) maybeCheck() {
	active := m.phase == PhaseLeader || (m.phase == PhaseFollower && (m.checkHold || m.opts.Rejoin))
	if m.checkInterval() <= 0 || !active {
		m.checkWait, m.checkFails, m.checkDue = false, 0, 0
		return
	}
	if m.checkDue == 0 {
		if !m.opts.Rejoin {
			m.checkDue = m.now + m.checkInterval() // first check one interval after serving
			return
		}
		// A workload that reports positions is checked at once: a new
		// leader publishes its position, and its node's /primary says so,
		// a heartbeat sooner.
		m.checkDue = m.now
	}
	if m.checkWait || m.now < m.checkDue {
		return
	}
	m.checkSeq++
	m.checkWait = true
	p := m.procedure(ProcCheck, m.checkSeq, "check")
	p.Synchronous, p.Serving = m.syncReg, m.phase == PhaseLeader
	m.out.Procedures = append(m.out.Procedures, p)
}

func (m *Member) onCheck(r ProcedureResult) {
	if r.Seq != m.checkSeq || !m.checkWait {
		return
	}
	m.checkWait = false
	m.checkDue = m.now + m.checkInterval()
	if r.Status != nil {
		m.status, m.statusKnown = *r.Status, true
	}
	m.statusOK = r.OK
	if m.phase == PhaseFollower && m.opts.Rejoin {
		m.statusFails = map[bool]int{true: 0, false: m.statusFails + 1}[r.OK]
		if m.statusFails >= m.rules.FailureThreshold && m.rejoinTo != "" && m.rejoinFor == "" {
			m.rejoinTo = "" // it no longer follows: rejoin again
		}
	}
	if m.phase == PhaseLeader {
		defer m.manageSync()
	}
	if m.phase == PhaseFollower && m.checkHold {
		if r.OK {
			m.emit(&CheckRecovered{Seq: r.Seq})
		}
		return
	}
	if m.phase != PhaseLeader {
		return
	}
	if r.OK {
		if m.checkFails > 0 {
			m.emit(&CheckRecovered{Seq: r.Seq, AfterFailures: m.checkFails})
		}
		m.checkFails = 0
		return
	}
	m.checkFails++
	limit := m.opts.CheckFailures
	if limit <= 0 {
		limit = 3
	}
	if m.checkFails < limit {
		m.emit(&CheckFailed{Seq: r.Seq, Failures: m.checkFails, Detail: r.Detail})
		return
	}
	reason := m.peerNotReady()
	if m.paused {
		reason = "automatic failover is paused (pause " + m.pauseID + ")"
	}
	if reason != "" {
		m.emit(&CheckFailed{Seq: r.Seq, Failures: m.checkFails, Detail: r.Detail + "; keeps leading: " + reason})
		return
	}
	m.emit(&CheckFailed{Seq: r.Seq, Failures: m.checkFails, Detail: r.Detail, HandOver: true})
	m.checkFails = 0
	m.demote(DemoteCheckFailed, m.rules.Other(m.site))
}

func (m *Member) onProcedure(r ProcedureResult) {
	switch r.Kind {
	case ProcCheck:
		m.onCheck(r)
		return
	case ProcSync:
		if r.Seq == m.syncSeq {
			m.syncWait = false
		}
		return
	}
	if r.Seq != m.procSeq || r.Kind != m.procKind {
		return // superseded by a later procedure
	}
	switch r.Kind {
	case ProcFence:
		if m.phase != PhaseFencing {
			return
		}
		if !r.OK {
			m.emit(&FenceFailed{Seq: r.Seq, Detail: r.Detail})
			m.fenceFailed, m.fenceRetryAt = true, m.now+m.rules.HeartbeatTimeout
			return
		}
		m.fenceFailed = false
		m.emit(&Fenced{Seq: r.Seq})
		m.successes = 0
		if m.phase == PhaseReleasing || m.phase == PhaseSuspended {
			m.nextBeatAt = min(m.nextBeatAt, m.now)
		}
	case ProcPromote:
		if m.phase != PhasePromoting {
			return
		}
		if !r.OK {
			m.emit(&PromoteFailed{Seq: r.Seq, Detail: r.Detail})
			m.demote(DemotePromoteFailed, m.rules.Other(m.site))
			return
		}
		m.syncFrom = 0 // measured afresh in this serving period
		m.emit(&ServingStarted{Seq: r.Seq, Term: m.term})
		m.prefCount, m.prefLast = 0, time.Time{}
	case ProcRejoin:
		m.onRejoin(r)
	case ProcDemote:
		if m.phase != PhaseDemoting {
			return
		}
		if !r.OK {
			m.emit(&DemoteFailed{Seq: r.Seq, Detail: r.Detail})
			m.fence(FenceDemoteFailed, AfterRelease)
			return
		}
		m.emit(&Demoted{Seq: r.Seq})
		m.nextBeatAt = min(m.nextBeatAt, m.now)
	}
}

// Node mode (Options.Node): see liveness.go.

// onLivenessResult takes in how its node's latest liveness write ended:
// the holder's heartbeat (its lease lives while the writes land in the
// lease's epoch) and this member's own beat (for ready).
func (m *Member) onLivenessResult(r LivenessResult) {
	if m.opts.Node == "" {
		return
	}
	m.lastLiveAt = max(m.lastLiveAt, m.seen)
	if r.Err == WriteOK || r.Err == WriteConflict {
		m.nodeEpoch = r.Epoch
	}
	if r.Err == WriteOK {
		m.memberOK++
		if r.Revision > m.memberAckRev {
			m.memberAckPrev, m.memberAckRev = m.memberAckRev, r.Revision
		}
	} else {
		m.memberOK = 0
	}
	if !m.holding() || m.leaseEpoch == 0 {
		return
	}
	switch {
	case r.Err == WriteOK && (r.Epoch == m.leaseEpoch || honourBumpedLease):
		// A suspended holder unfences only after its own unfenced value
		// was acknowledged: its last acknowledged value may say unfenced
		// from before it fenced while a fenced one (answer lost) stands.
		m.onBeatSuccess(m.written.Fenced || (m.phase == PhaseSuspended && !m.unfenceAcked))
	case r.Err == WriteConflict && r.Epoch == m.leaseEpoch:
		// The record moved, but not past the lease (a raise this node had
		// carried on already): neither beat nor failure.
	case r.Err == WriteOK || r.Err == WriteConflict:
		// Another node raised this node's epoch past the lease: whoever
		// did judged this node's liveness stale, and may take the register.
		ev := &LeadershipLost{Term: m.term, Epoch: r.Epoch}
		m.inflight = nil
		m.failures, m.successes = 0, 0
		m.writtenOK, m.leaseEpoch = false, 0
		m.emit(ev)
		switch m.phase {
		case PhaseLeader, PhasePromoting, PhaseDemoting, PhaseFencing:
			m.fence(FenceLostRegister, AfterFollow)
		}
	default:
		m.onLeaderWriteFailed(pendingWrite{kind: WriteBeat}, "node liveness write: "+r.Cause)
	}
}

// live returns what this member saw of node's liveness record.
func (m *Member) live(node string) *liveSeen {
	if m.lives == nil {
		m.lives = map[string]*liveSeen{}
	}
	ls := m.lives[node]
	if ls == nil {
		ls = &liveSeen{}
		m.lives[node] = ls
	}
	return ls
}

// onLiveness takes in a revision of a node's liveness record. A beat —
// written by the node itself, in its latest epoch, with a beat above every
// one seen — is this member's own heartbeat when the node is its own, the
// register holder's heartbeat when the node and epoch are the lease's, and
// the other member's latest heartbeat repeated when the node is its.
func (m *Member) onLiveness(in LivenessObserved) {
	if m.opts.Node == "" {
		return
	}
	e, v := in.Entry, in.Entry.Value
	ls := m.live(in.Node)
	if e.Rev <= ls.rev {
		return
	}
	ls.rev = e.Rev
	if e.Forged || v.Node != in.Node {
		return
	}
	if v.Epoch > ls.epoch {
		ls.epoch, ls.beat, ls.beatSet = v.Epoch, 0, false
	}
	if !v.Own() || v.Epoch < ls.epoch || (ls.beatSet && v.Beat <= ls.beat) {
		return // a raise, an older epoch's value, or a beat written again
	}
	ls.beat, ls.beatSet = v.Beat, true
	if in.Node == m.opts.Node {
		m.onMemberBeat(HeartbeatObserved{Rev: e.Rev, Time: e.Time, Site: m.site})
	}
	if l := m.leader.Value; m.leaderKnown && l.Site != "" && l.Node == in.Node && (l.Epoch == v.Epoch || honourBumpedLease) && e.Rev > m.beatRev {
		m.beatRev, m.beatTime, m.leaderSeenAt = e.Rev, e.Time, max(m.leaderSeenAt, m.seen)
	}
	if m.peerHBKnown && m.peerHB.Node == in.Node {
		m.onMemberBeat(HeartbeatObserved{Rev: e.Rev, Time: e.Time, Site: m.rules.Other(m.site), Value: m.peerHB})
	}
}

// raiseNeeded reports whether taking the register over needs the holder
// node's epoch raised first, and the node and the lease's epoch: the
// register names a lease on another node whose epoch nobody raised yet,
// and that node's liveness is stale. A holder that is only fenced, on a
// node that lives, is taken by the register's compare-and-set alone: it
// can serve again only by writing the register.
func (m *Member) raiseNeeded() (string, uint64, bool) {
	v := m.leader.Value
	if m.opts.Node == "" || !m.leaderKnown || v.Site == "" || v.Node == "" || v.Node == m.opts.Node {
		return "", 0, false
	}
	if ls := m.lives[v.Node]; ls != nil && ls.epoch > v.Epoch {
		return "", 0, false // raised already
	}
	fo := m.rules.FailoverTimeout
	if !(m.ownBeatRev > m.beatRev && m.serverStale() > fo && m.now-m.leaderSeenAt > fo) {
		return "", 0, false
	}
	return v.Node, v.Epoch, true
}

// raiseEpoch writes node's liveness record with its epoch raised, by
// compare-and-set on the revision this member judged stale: it lands only
// if the node has not written since.
func (m *Member) raiseEpoch(node string, from uint64, reason AcquireReason, stale time.Duration) {
	ls := m.live(node)
	l := Liveness{Node: node, Epoch: max(from, ls.epoch) + 1, By: m.opts.Node, Prev: ls.rev}
	w := Write{Op: m.nextOp(), Kind: WriteBump, Key: LivenessKey(node), Live: l, Value: EncodeLiveness(l),
		ExpectRev: ls.rev, Deadline: m.now + m.rules.HeartbeatTimeout}
	m.inflight = &pendingWrite{op: w.Op, kind: w.Kind, deadline: w.Deadline, expect: w.ExpectRev}
	m.raise = &pendingRaise{node: node, epoch: l.Epoch, from: from, reason: reason, stale: stale}
	m.out.Writes = append(m.out.Writes, w)
}

// onRaiseAnswered goes on with the takeover once the holder's node's
// epoch is above the lease's (this raise, or another's), and gives up when
// the node wrote again.
func (m *Member) onRaiseAnswered(r WriteResult) {
	rz := m.raise
	m.raise = nil
	if rz == nil {
		return
	}
	switch r.Err {
	case WriteOK:
		ls := m.live(rz.node)
		ls.rev = max(ls.rev, r.Revision)
		if rz.epoch > ls.epoch {
			ls.epoch, ls.beat, ls.beatSet = rz.epoch, 0, false
		}
		m.emit(&EpochRaised{Node: rz.node, Epoch: rz.epoch, Rev: r.Revision, Stale: rz.stale})
		m.acquire(rz.reason, m.regRev, rz.stale)
	case WriteConflict:
		if r.CurrentLive != nil {
			m.onLiveness(LivenessObserved{Node: rz.node, Entry: *r.CurrentLive})
		}
		if ls := m.lives[rz.node]; ls != nil && ls.epoch > rz.from {
			m.acquire(rz.reason, m.regRev, rz.stale) // raised by another
			return
		}
		// The node wrote again (its beat now counts), or the read was stale.
		m.acquireAt = m.now + m.rules.HeartbeatTimeout
	default:
		m.acquireAt = m.now + m.rules.HeartbeatTimeout
		m.emit(&AcquireFailed{Cause: fmt.Sprintf("raising the epoch of node %s: %s", rz.node, cause(r))})
	}
}
