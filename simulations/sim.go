package simulations

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"

	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/events"
)

// Config is one simulation run.
type Config struct {
	// Scenario names the environment and the fault schedule (see Scenarios).
	Scenario string
	// Seed drives every random choice: latencies, procedure timings, the
	// generated schedule. Same Config, same bytes.
	Seed uint64
	// Duration is the simulated time to run; 0: the scenario's default.
	Duration time.Duration
	// Rules are the pair's rules; the zero value means DefaultRules for
	// pair pg-main with sites site-a (preferred primary) and site-b.
	Rules failover.Rules
	// AllowUnsafe accepts rules that break the safety inequality.
	AllowUnsafe bool
	// Faults, when FaultsSet, replaces the scenario's generated schedule.
	Faults    []Fault
	FaultsSet bool
	// Fsync is the simulated server's durability; 0: the scenario's
	// (always, except where a scenario says otherwise).
	Fsync FsyncMode
	// Export, when set, receives the run's history as an export file (see
	// events.ExportWriter): every KV write of the failover bucket the
	// server kept, then every event of the stream, with server timestamps.
	Export io.Writer
	// Source names the run in the export header (default: its command).
	Source string
	// Trace, when set, receives a human-readable timeline.
	Trace io.Writer
	// StopAtFirstViolation ends the run at the first violation (swarm
	// shrinking does not need the rest).
	StopAtFirstViolation bool
	// Logger receives the run's own log lines (nil: discarded).
	Logger *slog.Logger
	// Leadership is how leadership is kept: per pair (0: the default) or
	// per node, with one liveness record per node (LeadershipNode).
	Leadership Leadership
	// Pairs is how many pairs each node hosts (0: one). Every pair has the
	// same rules and sites; pair 1 is named as the rules say, pair k
	// <name>-k. The faults of a site hit its node: every member on it.
	Pairs int
	// StoreWriteTime is the store's service time per write (0: none, every
	// request answered after link latency only): the stream leader serves
	// KV writes and appends one after another in arrival order, so a
	// burst queues (throughput.go).
	StoreWriteTime time.Duration
	// StoreBatchWritePart is what each write of a batch beyond the first
	// adds to the batch's service time (0: batchWritePart, 10µs): the
	// store checks and writes every message of a batch and syncs once.
	StoreBatchWritePart time.Duration
	// HostWriteBound bounds, per node, its members' KV writes and, apart,
	// their appends in flight (0: unbounded; the runtime's host:
	// HostWriteBoundRuntime); the liveness writer's writes are not bounded.
	HostWriteBound int
	// HostIssueLate gives the node's bound the runtime's rule before
	// 5b6e2d2: a member KV write waiting at the bound is issued until its
	// deadline, not only within the first half of its window (finding N8,
	// kept by TestTakeoverRegisterStorm; not a flag: no runtime does it).
	HostIssueLate bool
	// HostBatch: a node whose members' KV writes wait at its bound sends
	// them in atomic batches of up to this many, each served by the store
	// in one service time (0: one write per request, as before;
	// the runtime's host: HostBatchRuntime; needs HostWriteBound; batch.go).
	HostBatch int
	// HostBatchNoStaleRules gives the batches the runtime's rules before
	// fd9708f and abba055: no write answered as known stale, no key kept
	// out of batches as uncertain (batch.go, rules 1–3; not a flag: no
	// runtime does it; kept by TestBatchedTakeoverLateCommits).
	HostBatchNoStaleRules bool
	// HostBatchNoAppends keeps a node's event appends one per request
	// with HostBatch (appendbatch.go): the runtime's host before it sent
	// waiting appends as one atomic batch too (--host-batch-no-appends,
	// for comparison).
	HostBatchNoAppends bool
	// HostRaiseOnce (node leadership): a node's members' raises of another
	// node's epoch go outside its bound, identical ones as one write, as
	// the runtime's host performs them (raise.go); false: each member's
	// raise is a member write like any other.
	HostRaiseOnce bool
	// HostConnWatch models the node's judgement of its connection to NATS
	// (conn.go), the runtime's deadWatch since 30869e0: a connection that
	// hears nothing for heartbeat_timeout is given up and reconnected,
	// unless its server answers a side connection (a busy store: kept up
	// to 5 heartbeat_timeouts of silence); a batch that could not be sent
	// is not committed and its writes go alone, batches staying on. Off
	// (the default), a connection is never given up, as before.
	HostConnWatch bool
	// HostConnNaive gives the connection the runtime's judgement before
	// 30869e0 (implies HostConnWatch): no side connection, and a batch
	// that could not be sent is taken for a refusal of batches, which the
	// node then stops sending for a minute (kept by
	// TestConnGivenUpUnderDiskStall; not a runtime's any more).
	HostConnNaive bool
	// AcquireOneHeartbeat gives node leadership's acquires the members'
	// window before 2 × heartbeat_timeout (failover.Options.AcquireWindow):
	// each waits heartbeat_timeout for its answer, so a takeover of
	// thousands of pairs came in waves a second apart (kept by
	// TestTakeoverInWaves and the tests of the findings before it; not a
	// flag: no runtime does it any more).
	AcquireOneHeartbeat bool
	// CPU models the nodes' CPU (cpu.go); the zero value models none:
	// every input is taken in when it arrives, as before.
	CPU CPUModel
	// HostBeatsInOrder gives the node's gate its order before register
	// writes went first: member heartbeats and register writes issued in
	// arrival order (throughput.go, issue; not a flag: no runtime does
	// it any more; kept for the seeds found with it). The members of
	// such a node also write their heartbeat key while they acquire
	// (failover.Options.BeatWhileAcquiring), as they did then.
	HostBeatsInOrder bool
	// NoLivenessProbe: a node's liveness writer ignores its members'
	// probes (failover.Ready.ProbeLiveness), as before they were made: a
	// takeover waits for the survivor's next regular liveness write to
	// show the holder's node stale by server time (not a flag; kept for
	// the seeds and figures of its time).
	NoLivenessProbe bool
}

// CPUModel is a node's CPU (cpu.go), the same on every node.
type CPUModel struct {
	// StepCost: every input a member or the liveness writer takes in
	// costs this much of one of the node's cores, each core serving its
	// work in arrival order (0: no CPU model).
	StepCost time.Duration
	// Cores: each node's cores (0: 2).
	Cores int
	// StartCost: what starting one procedure step's process (fork and
	// exec) costs the node's CPU; the step runs from when its start was
	// served (0: nothing).
	StartCost time.Duration
	// StartLimit: starts a node serves at once, the others waiting in
	// order (0: the runtime's procedure.StartLimit, 2 × Cores); negative:
	// unbounded, as the runtime before d9f1761 — every start queued on the
	// CPU the moment it is asked for.
	StartLimit int
}

// DefaultPair is the pair the simulator runs when Config.Rules is zero.
func DefaultPair() failover.Rules { return failover.DefaultRules("pg-main", "site-a", "site-b") }

// Violation is an invariant that failed, at a simulated time.
type Violation struct {
	Invariant string  `json:"invariant"`
	At        float64 `json:"at"` // simulated seconds since the start
	Detail    string  `json:"detail"`
	// Pair is the pair it concerns, in a run of several pairs ("" with
	// one, or for a violation of the whole run).
	Pair string `json:"pair,omitempty"`
}

// Counter is one "sometimes" counter: how often something happened.
type Counter struct {
	Name     string `json:"name"`
	Count    int    `json:"count"`
	Required bool   `json:"required,omitempty"`
}

// Result is what a run measured.
type Result struct {
	Scenario          string      `json:"scenario"`
	Seed              uint64      `json:"seed"`
	Leadership        string      `json:"leadership,omitempty"` // with node leadership or several pairs
	Pairs             int         `json:"pairs,omitempty"`      // pairs per node, when more than one
	SimulatedSeconds  float64     `json:"simulated_seconds"`
	WallSeconds       float64     `json:"wall_seconds"`
	Speedup           float64     `json:"speedup"`
	Steps             uint64      `json:"steps"`
	Digest            string      `json:"digest"`
	Violations        []Violation `json:"violations"`
	Failovers         int         `json:"failovers"`
	LeadershipChanges int         `json:"leadership_changes"`
	// MaxUnavailableMS and UnavailableMS are the longest and the total
	// time nobody was available, from the first moment something was, with
	// each outage dated as the record dates it (see Outage): what `replay`
	// of this run's --out reports, or, where the record only bounds an
	// outage, a figure within the bounds it reports. The True figures are
	// by the simulator's own clock.
	MaxUnavailableMS     float64    `json:"max_unavailable_ms"`
	UnavailableMS        float64    `json:"unavailable_ms"`
	TrueMaxUnavailableMS float64    `json:"true_max_unavailable_ms"`
	TrueUnavailableMS    float64    `json:"true_unavailable_ms"`
	Outages              []Outage   `json:"outages"`
	Takeovers            []Takeover `json:"takeovers"`
	Fsync                string     `json:"fsync"`
	Faults               string     `json:"faults"`
	Sometimes            []Counter  `json:"sometimes"`
	// Unexercised lists required counters that stayed 0: the run did not
	// exercise what its scenario claims to.
	Unexercised []string `json:"unexercised"`
	// RegisterWritesTail (node leadership): the register writes (a
	// holder publishing its value) members asked for in the run's last
	// 10 simulated seconds. A settled run writes a register only when its
	// value changes; hundreds a second mean holders rewriting values whose
	// writes did not count, a storm that did not decay (finding N8).
	RegisterWritesTail int `json:"register_writes_tail,omitempty"`
	// RegisterWrites (node leadership): every register write (a holder
	// publishing its value, an acquire, a release) members asked for in
	// the run, issued or not.
	RegisterWrites int `json:"register_writes,omitempty"`
	// StoreWrites (with a store service time): the writes the store
	// served, one service time each — a KV write, an append, a batch of
	// either. StoreAppendWrites: of those, the appends and the batches of
	// appends; StoreAppends: the appends they carried.
	StoreWrites       int `json:"store_writes,omitempty"`
	StoreAppendWrites int `json:"store_append_writes,omitempty"`
	StoreAppends      int `json:"store_appends,omitempty"`
}

// Outage is a stretch with no database available: from a stop's start (a
// fence or demote chain starting on the last available database) or its
// process going down, to a promote step completing. From, To and MS date
// it as the record does (record.go): seconds since Epoch on the server's
// clock; TrueFrom and TrueTo are when it happened (virtual time).
type Outage struct {
	From  float64 `json:"from"`
	To    float64 `json:"to"`
	MS    float64 `json:"ms"`
	Site  string  `json:"site"`         // the site that stopped being available
	Cause string  `json:"cause"`        // "stop: fence", "stop: demote", "down: process gone"
	By    string  `json:"by,omitempty"` // the site that became available ("" if open)
	Open  bool    `json:"open,omitempty"`
	// FromBasis: "recorded" (the stop event, as dated), "late" (it landed
	// later than the rules allow), "lost" (it died with its process),
	// "down" (the process went: no stop event). ToBasis: "recorded" (the
	// serving_started, as dated), "lost" (it died with its process: the
	// record cannot show that the site served), "open".
	FromBasis string  `json:"from_basis"`
	ToBasis   string  `json:"to_basis"`
	TrueFrom  float64 `json:"true_from"`
	TrueTo    float64 `json:"true_to"`
	TrueMS    float64 `json:"true_ms"`
	Pair      string  `json:"pair,omitempty"` // in a run of several pairs
}

// Takeover is a failover: an acquire that won the register from another
// site's holder (the failover counter). ServingAt is when the winner's
// database started serving that term (-1: it did not).
type Takeover struct {
	At        float64 `json:"at"`
	From      string  `json:"from"`
	To        string  `json:"to"`
	Term      uint64  `json:"term"`
	ServingAt float64 `json:"serving_at"`
	// OldAlive: the old holder's process was running when it was taken
	// over (cut off, slow or paused, not dead): a false failover in the
	// staleness decision's sense — the primary was not down.
	OldAlive bool   `json:"old_alive"`
	Pair     string `json:"pair,omitempty"` // in a run of several pairs
}

// Duration is the simulated time the run covered.
func (r *Result) Duration() time.Duration {
	return time.Duration(r.SimulatedSeconds * float64(time.Second))
}

// Failed reports whether the run found a violation.
func (r *Result) Failed() bool { return len(r.Violations) > 0 }

// Tuning of the model that is not configuration.
const (
	appendTimeout = 5 * time.Second        // the runtime appender's per-attempt timeout (and its longest backoff)
	appendBackoff = 100 * time.Millisecond // the runtime appender's first backoff after a failed attempt
	restartDelay  = time.Second            // systemd RestartSec after a watchdog kill
	minLatency    = 500 * time.Microsecond
)

// msgKind is what a message on a link carries.
type msgKind uint8

const (
	mWrite msgKind = iota + 1
	mWriteResult
	mEntry
	mSynced
	mAppend
	mAppendAck
	mStep
	mProcResult
	mBatch       // a node's batch of member KV writes (batch.go) or of appends (appendbatch.go)
	mBatchResult // its answer
)

// msg is a message on a link (or a result inside a node). Messages live in
// a slab and are reused, so the loop does not allocate per message.
type msg struct {
	kind    msgKind
	inc     uint32 // incarnation of the node process that sent it or must receive it
	stream  int8   // appender: 0 member events, 1 procedure events
	effect  bool   // mStep: the physical effect was applied; mWrite: sent while its node's database was available
	rev     uint64 // mEntry: revision
	write   failover.Write
	res     failover.WriteResult
	in      failover.Input // mEntry: the observation to feed
	data    []byte         // mAppend
	last    uint64         // mAppend: expected last subject sequence
	known   bool           // mAppend: last was read from the log
	attempt uint64         // mAppend, mAppendAck
	queued  time.Duration  // mAppend: how long the event waited on its node
	mark    int32          // mAppend: 1 + the index of its record mark (0: none; see record.go)
	alone   bool           // mAppend: its subject was uncertain when it was queued: it goes alone (appendbatch.go)
	id      string         // mAppend, mAppendAck: the message id (mAppend with known false: the appender's nonce; the server completes it)
	event   string         // mAppend with known false: the random part of the message id
	code    int32          // mAppendAck: the JetStream error code of a refusal (0: stored)
	dup     bool           // mAppendAck: the server acked a duplicate
	retried bool           // mAppendAck: ... past the dedup window: the client's read of its first attempt must succeed (recognised)
	sent    time.Duration  // mWrite: when it was sent
	seq     uint64         // mAppendAck
	slot    uint64         // mWrite, mAppend, mBatch and their answers: the token of its node's gate slot (0: none)
	conn    uint32         // HostConnWatch: the connection it went on (connStamp: its node's, never 0; 0: it went on no link; conn.go)
	batch   int32          // mWrite, mAppend and their answers in a batch, mBatch, mBatchResult: 1 + the index of the batch (0: none)
	run     uint64         // mStep
	chain   procedure.ChainKind
	final   bool // mStep: the last step of its chain
	outcome procedure.Outcome
	done    procedure.ChainResult // mProcResult
	// mStep with a CPU model's start cost (cpu.go): how long the step
	// runs once its process started, and its deadline.
	took, deadline time.Duration
	// pair is the index of the pair whose member sent the message or must
	// receive it; all (-1): the machine's own (its liveness writer's
	// writes and their answers, liveness records and Synced on its watch).
	pair int32
}

// sim is one pair of a run: its two members (one on each machine), the
// register as they wrote it, its databases and its checkers. What the
// pairs share — the loop, the server, the machines — is the world it
// embeds. Everything happens on the goroutine that calls Run.
type sim struct {
	*world
	pi    int32 // index in world.pairs
	rules failover.Rules
	opts  failover.Options
	nodes [2]*node
	sw    int // switchover ids
	// What the record shows (record.go).
	recMarks  []recMark
	anyQueued bool

	// The register as the members last wrote it (decoded once per write):
	// the checkers judge what members do against it. top is the register
	// as the server holds it, the forger's values included; forged holds
	// the revisions the forger wrote unsigned, replayed those it replayed;
	// heldBy each site's latest term and beat in the register.
	reg      failover.Leader
	regRev   uint64
	regTime  time.Time
	regKnown bool
	top      regView
	forged   map[uint64]bool
	replayed map[uint64]bool
	heldBy   [2]struct{ term, beat uint64 }
	views    [3]regView // the register as each site's server last applied it

	inv  invariants
	db   *dbWorld // the replicating databases (nil: database mode off)
	spec procedure.Spec
	// Derived bounds (see invariants.go).
	fenceMax     time.Duration
	promoteMax   time.Duration
	bound        time.Duration
	settle       time.Duration
	hoBound      time.Duration
	standbyBound time.Duration
	calmLimit    int
	foCheck      time.Duration // failover_timeout as the checkers read it
}

// Run runs one simulation.
func Run(cfg Config) (*Result, error) {
	w, err := newWorld(cfg)
	if err != nil {
		return nil, err
	}
	wall := time.Now()
	w.run()
	r := w.result(time.Since(wall))
	if cfg.Export != nil {
		if err := w.pairs[0].export(cfg.Export, r); err != nil {
			return r, err
		}
	}
	return r, nil
}

// newSim builds a run and returns its first pair (tests reach the run
// through it).
func newSim(cfg Config) (*sim, error) {
	w, err := newWorld(cfg)
	if err != nil {
		return nil, err
	}
	return w.pairs[0], nil
}

func newWorld(cfg Config) (*world, error) {
	sc := ScenarioByName(cfg.Scenario)
	if sc == nil {
		return nil, fmt.Errorf("unknown scenario %q (see --list)", cfg.Scenario)
	}
	rules := cfg.Rules
	if rules == (failover.Rules{}) {
		rules = DefaultPair()
	}
	var err error
	if cfg.AllowUnsafe {
		err = rules.ValidateShape()
	} else {
		err = rules.Validate()
	}
	if err != nil {
		return nil, err
	}
	if cfg.Duration <= 0 {
		cfg.Duration = sc.Duration
	}
	if cfg.Fsync == 0 {
		cfg.Fsync = sc.Fsync
	}
	if cfg.Fsync == 0 {
		cfg.Fsync = FsyncAlways
	}
	if cfg.Leadership == 0 {
		cfg.Leadership = LeadershipPerPair
	}
	if cfg.Leadership != LeadershipPerPair && cfg.Leadership != LeadershipNode {
		return nil, fmt.Errorf("leadership must be node or per-pair")
	}
	if cfg.Pairs <= 0 {
		cfg.Pairs = 1
	}
	if cfg.StoreBatchWritePart < 0 {
		return nil, fmt.Errorf("store batch write time: must not be negative, got %v", cfg.StoreBatchWritePart)
	}
	if cfg.StoreWriteTime < 0 || cfg.HostWriteBound < 0 {
		return nil, fmt.Errorf("store write time and host write bound must not be negative")
	}
	if cfg.HostBatch < 0 || cfg.HostBatch > events.MaxKVBatch {
		return nil, fmt.Errorf("host batch: 0 (no batches) to %d writes, got %d", events.MaxKVBatch, cfg.HostBatch)
	}
	if cfg.HostBatch > 0 && cfg.HostWriteBound == 0 {
		return nil, fmt.Errorf("host batch %d needs a host write bound: writes are batched only while they wait at it (the runtime's: %d)", cfg.HostBatch, HostWriteBoundRuntime)
	}
	if cfg.Pairs > MaxPairs {
		return nil, fmt.Errorf("pairs per node: at most %d, got %d", MaxPairs, cfg.Pairs)
	}
	if cfg.Export != nil && cfg.Pairs > 1 {
		return nil, fmt.Errorf("the export of a run holds one pair: run without --out, or with --pairs 1")
	}
	opts := failover.Options{AllowUnsafe: cfg.AllowUnsafe}
	if cfg.AcquireOneHeartbeat {
		opts.AcquireWindow = rules.HeartbeatTimeout
	}
	opts.BeatWhileAcquiring = cfg.HostBeatsInOrder // the runtime of then wrote that heartbeat too
	if sc.Database {
		// The member drives a replicating database: it rejoins, checks and
		// publishes positions, and can make commits wait (database.go).
		opts.Rejoin, opts.Positions, opts.Synchronizer = true, true, true
		if sc.Synchronous != 0 && rules.Synchronous <= failover.SyncOff {
			rules.Synchronous = sc.Synchronous
		}
	} else if rules.Synchronous == failover.SyncOn || rules.Synchronous == failover.SyncStrict {
		return nil, fmt.Errorf("synchronous: %s needs a replicating database: run a db-* scenario (see --list)", rules.Synchronous)
	}
	w := &world{
		cfg: cfg, sc: sc, base: rules, nodeMode: cfg.Leadership == LeadershipNode,
		end: cfg.Duration, codec: NewCodec(), tw: cfg.Trace, log: cfg.Logger,
	}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	w.server = NewServer(ServerOptions{Codec: w.codec, Fsync: cfg.Fsync})
	if cfg.Export != nil {
		w.server.keepJournal()
	}
	w.tr.init()
	w.maxLat = min(60*time.Millisecond, max(rules.HeartbeatTimeout/4, 2*minLatency))
	for i, site := range []string{rules.Primary, rules.Replica} {
		w.machines[i] = w.newMachine(i, site)
	}
	w.pattern = rules.Pair + ".>"
	if cfg.Pairs > 1 || w.nodeMode {
		w.pattern = ">" // every pair's keys and the liveness records
	}
	if cfg.Pairs > 1 {
		w.pairIdx = make(map[string]int32, cfg.Pairs)
	}
	for p := range cfg.Pairs {
		r := rules
		if p > 0 {
			r.Pair = rules.Pair + "-" + strconv.Itoa(p+1)
		}
		if w.pairIdx != nil {
			w.pairIdx[r.Pair] = int32(p) // P, P-2, P-3, …: never twice
		}
		w.pairs = append(w.pairs, w.newPair(int32(p), r, opts))
	}
	w.initCluster()
	if cfg.FaultsSet {
		w.faults = append([]Fault(nil), cfg.Faults...)
	} else {
		gen := rand.New(rand.NewPCG(cfg.Seed, streamSchedule))
		w.faults = sc.Schedule(gen, rules, cfg.Duration)
	}
	for i, f := range w.faults {
		switch {
		case f.Kind == FaultServerClock:
		case f.Site == Witness && (f.Kind == FaultIsolate || f.Kind == FaultLeader):
		case f.Site == NATS && f.Kind != FaultCrash && f.Kind != FaultPowerCut && f.Kind != FaultDiskStall:
			return nil, fmt.Errorf("fault %s: only crash, powercut and diskstall apply to nats", f)
		case f.Kind == FaultDiskStall && (f.Site != NATS || f.For <= 0):
			return nil, fmt.Errorf("fault %s: want diskstall(nats)@AT+FOR", f)
		case f.Site != NATS && !rules.Has(f.Site):
			return nil, fmt.Errorf("fault %s: site %q is not a member of pair %s", f, f.Site, rules.Pair)
		case f.Kind == FaultProc && (f.Chain < procedure.ChainFence || (f.Chain > procedure.ChainDemote && f.Chain != procedure.ChainRejoin) || f.Mode < ProcFail || f.Mode > ProcFailAll):
			return nil, fmt.Errorf("fault %s: want a fence, promote, demote or rejoin chain and a mode", f)
		case f.dbOnly() && !sc.Database:
			return nil, fmt.Errorf("fault %s: needs the database mode: run a db-* scenario (see --list)", f)
		case f.Kind == FaultForge && (f.Forge < ForgeHandoff || f.Forge > ForgeMsgID || ((f.Forge == ForgeReplay || f.Forge == ForgeMsgID) && f.By != "") || (f.Forge != ForgeHandoff && f.For <= 0) || (f.By != "" && !rules.Has(f.By))):
			return nil, fmt.Errorf("fault %s: want a forged handoff, beats, ready heartbeats, or replays or message ids (without by=) for a duration", f)
		case f.Kind == FaultForge && f.Forge == ForgeReady && (f.Key == "" || f.Key == f.Site):
			return nil, fmt.Errorf("fault %s: a forged heartbeat needs a key other than the site it claims", f)
		case f.Kind < FaultPartition || f.Kind > FaultDiskStall || f.At < 0 || f.For < 0:
			return nil, fmt.Errorf("fault %s: invalid", f)
		case (f.Kind == FaultPause || f.Kind == FaultIsolate || f.Kind == FaultWatchLag || f.Kind == FaultReplCut || f.Kind == FaultReplLag) && f.For <= 0:
			return nil, fmt.Errorf("fault %s: needs a duration", f)
		}
		w.push(item{at: f.At, kind: evFaultStart, ref: int32(i)})
	}
	w.aux = make([]faultAux, len(w.faults))
	for _, s := range w.pairs {
		s.inv.init(s)
		if sc.Database {
			s.initDB()
		}
	}
	for _, m := range w.machines {
		w.push(item{at: time.Duration(m.rng.Int64N(int64(50 * time.Millisecond))), kind: evRestart, node: int8(m.idx)})
	}
	if w.connWatch() {
		for _, m := range w.machines {
			w.push(item{at: w.connEvery() + time.Duration(m.idx), kind: evConnCheck, node: int8(m.idx)})
		}
	}
	return w, nil
}

// newPair builds pair p of the world with its rules: its bounds and its
// two members, one on each machine.
func (w *world) newPair(p int32, rules failover.Rules, opts failover.Options) *sim {
	s := &sim{world: w, pi: p, rules: rules, opts: opts, forged: map[uint64]bool{}, replayed: map[uint64]bool{}}
	s.spec = procedureSpec(rules)
	s.fenceMax = chainMax(s.spec.Fence)
	s.promoteMax = chainMax(s.spec.Promote)
	s.bound = rules.FailoverTimeout + 2*rules.HeartbeatTimeout + s.fenceMax + s.promoteMax + 6*w.maxLat
	if w.nodeMode {
		// A takeover is two compare-and-sets in a row: the raise of the
		// holder node's epoch, then the register.
		s.bound += 2 * w.maxLat
	}
	s.calmLimit, s.foCheck = calmChanges(rules), rules.FailoverTimeout
	s.settle = s.bound + time.Duration(rules.SuccessThreshold+2)*rules.HeartbeatTimeout + s.fenceMax + chainMax(s.spec.Demote)
	s.hoBound = s.promoteMax + 4*rules.HeartbeatTimeout + 6*w.maxLat
	s.standbyBound = s.bound + s.fenceMax + rules.HeartbeatTimeout
	for i, m := range w.machines {
		s.nodes[i] = s.newNode(m)
	}
	return s
}

// PRNG stream constants: one seed, independent streams, so that removing
// a fault from a schedule changes as few other random choices as possible.
const (
	streamSchedule = 0x7573_696d_0002
	streamNode     = 0x7573_696d_0100
	streamEventID  = 0x7573_696d_0200
)

// step feeds one input to a node's member and carries out what it asks.
// step feeds member n in (nil: nothing) after what its machine's
// liveness log gained since its last step, in one StepAll.
func (s *sim) step(n *node, in failover.Input) {
	ins := s.takeLive(n)
	if in != nil {
		ins = append(ins, in)
	}
	if len(ins) > 0 {
		r := n.m.StepAll(n.clk.local(s.now), ins...)
		s.handle(n, r)
	}
	clear(ins)
	n.liveBuf = ins[:0]
	s.armTick(n)
}

func (s *sim) armTick(n *node) {
	if !n.alive || n.m == nil {
		return
	}
	v := n.clk.virtual(n.m.NextWake())
	if v <= s.now {
		v = s.now + 1
	}
	if n.tickSet && n.tickAt <= v {
		return
	}
	n.tickGen++
	n.tickAt, n.tickSet = v, true
	s.push(item{at: v, kind: evTick, node: int8(n.idx), ref: s.pi, gen: n.tickGen})
}

// handle carries out a member's Ready: events to its appender, writes onto
// its link, procedures to its resource.
func (s *sim) handle(n *node, r failover.Ready) {
	for _, ev := range r.Events {
		s.onMemberEvent(n, ev)
		s.appendEvent(n, 0, ev)
	}
	for i := range r.Writes {
		s.sendWrite(n, &r.Writes[i])
	}
	if r.ProbeLiveness && n.live != nil && !n.probeQueued && !s.cfg.NoLivenessProbe {
		// After this step, as the runtime's liveness actor takes it in.
		n.probeQueued = true
		s.push(item{at: s.now, kind: evLiveProbe, node: int8(n.idx)})
	}
	for _, p := range r.Procedures {
		if s.db != nil && s.dbProcedure(n, p) {
			continue
		}
		s.handleOut(n, n.runner.Run(n.clk.local(s.now), procedure.ChainKind(p.Kind), p.Seq))
	}
}

// tailWindow is the end of a run over which Result.RegisterWritesTail
// counts.
const tailWindow = 10 * time.Second

func (s *sim) sendWrite(n *node, w *failover.Write) {
	s.inv.writeIssued(s, n)
	if s.nodeMode && w.Kind == failover.WriteBeat && s.now >= s.end-tailWindow {
		s.regTail++
	}
	if s.nodeMode && (w.Kind == failover.WriteBeat || w.Kind == failover.WriteAcquire || w.Kind == failover.WriteRelease) {
		s.regWrites++
	}
	remember(n.pending[:], &n.pendingNext, w)
	if s.raiseOnce(n, w) {
		return
	}
	ref := s.alloc(msg{kind: mWrite, inc: n.inc, write: *w, sent: s.now, effect: n.available(), pair: s.pi})
	s.issue(n.machine, gateWrites, ref, n.clk.virtual(w.Deadline))
}

// JetStream error codes the simulated server answers with.
const (
	codeWrongLast = 10071 // JSStreamWrongLastSequenceErr: the expectation does not hold
	codeInFlight  = 10164 // JSStreamWrongLastSequenceConstantErr: a write to the subject is still being proposed
	descWrongLast = "wrong last sequence"
	descInFlight  = "last sequence by subject mismatch" // nats-server 2.15's message for an in-flight proposal
)

// serverWrite applies a member's KV write, fans it out to the watches and
// answers the writer.
func (s *sim) serverWrite(n *node, ref int32) {
	s.writeServed(n, ref, s.server.write(s.now, &s.msgs[ref].write))
}

// writeServed carries out what the server did with a member's KV write
// (res: alone, or as part of a batch that landed): the checkers, the
// watches, the writer's answer (in a batch, the batch's answer carries it).
func (s *sim) writeServed(n *node, ref int32, res writeResult) {
	m := &s.msgs[ref]
	w := &m.write
	batched := m.batch != 0
	out := failover.WriteResult{Op: w.Op}
	leaderKey := w.Key == failover.LeaderKey(s.rules.Pair)
	if res.ok {
		out.Err, out.Revision, out.Time = failover.WriteOK, res.rev, res.ts
		if !n.alive || m.inc != n.inc {
			s.count(cZombieWrite)
			s.tracef(n.site, "zombie write landed: %s rev %d (its process is gone)", w.Kind, res.rev)
		}
		var in failover.Input
		if leaderKey {
			if s.nodeMode && w.Kind == failover.WriteBeat && s.now > n.clk.virtual(w.Deadline) {
				s.count(cRegisterLandedLate)
			}
			if m.effect && w.Leader.Site == n.site && !w.Leader.Fenced {
				n.lastAvailUnfenced = s.now // sent while it served
			}
			s.registerLanded(n, w, res.rev, m.sent)
			if s.db != nil {
				s.inv.dbRegisterWritten(s, n, w)
				s.dbRegisterLanded(n, w)
			}
			s.inv.registerWritten(s, n, w, res)
			s.reg, s.regRev, s.regTime, s.regKnown = w.Leader, res.rev, res.ts, true
			s.top = regView{l: w.Leader, rev: res.rev, ts: res.ts, known: true}
			if w.Leader.Site == n.site {
				s.heldBy[n.idx].term, s.heldBy[n.idx].beat = w.Leader.Term, w.Leader.Beat
			}
			s.refreshViews()
			s.inv.checkArm(s)
			in = failover.LeaderObserved{Entry: s.leaderEntry(res.rev, res.ts, w.Leader, false)}
		} else {
			n.lastBeatLanded = s.now
			in = failover.HeartbeatObserved{Rev: res.rev, Time: res.ts, Site: failover.HeartbeatSite(s.rules.Pair, w.Key), Value: w.Beat}
		}
		s.tr.u64(res.rev)
		if s.nodeMode && s.tw != nil {
			// Written only when they change: each write is worth a line.
			if leaderKey {
				s.tracef(n.site, "register rev %d = %v", res.rev, w.Leader)
			} else {
				s.tracef(n.site, "heartbeat rev %d: %s ready=%v", res.rev, w.Beat.Phase, w.Beat.Ready)
			}
		}
		if batched {
			s.batchFan = append(s.batchFan, fanned{pair: s.pi, rev: res.rev, in: in})
			s.reply(n.machine, ref, out)
			return
		}
		// The writer's answer and the watch delivery of the same entry race
		// on the writer's connection; either may come first.
		replyFirst := n.rng.IntN(2) == 0
		if !replyFirst {
			s.fanOut(res.rev, in)
		}
		s.reply(n.machine, ref, out)
		if replyFirst {
			s.fanOut(res.rev, in)
		}
		return
	}
	s.refuseWrite(n.machine, ref, events.KVAPIError(!w.Put && w.ExpectRev == 0, codeWrongLast, descWrongLast))
}

// fanOut queues a new entry of the pair's keys on every established watch.
func (s *sim) fanOut(rev uint64, in failover.Input) { s.broadcast(s.pi, rev, in) }

// atMember handles an answer that reached a member: its write's result or
// its append's ack (its machine has checked that the member runs and is
// not paused, and delivers the watch's entries itself: atNode).
func (s *sim) atMember(n *node, it item) {
	m := &s.msgs[it.ref]
	switch m.kind {
	case mWriteResult:
		res := m.res
		s.release(it.ref)
		s.onWriteResult(n, &res)
		s.step(n, res)
	case mAppendAck:
		s.appendAcked(n, it.ref)
	default:
		s.release(it.ref)
	}
}

// violate reports a violation of the pair's invariants.
func (s *sim) violate(name, format string, args ...any) {
	v := Violation{Invariant: name, Detail: fmt.Sprintf(format, args...)}
	if s.multi() {
		v.Pair, v.Detail = s.rules.Pair, "pair "+s.rules.Pair+": "+v.Detail
	}
	s.world.violate(v)
}

// tracef writes a line of the timeline; with several pairs, who is
// prefixed with the pair's name.
func (s *sim) tracef(who, format string, args ...any) {
	if s.tw == nil {
		return
	}
	if s.multi() {
		who = s.rules.Pair + "/" + who
	}
	s.world.tracef(who, format, args...)
}

func (s *sim) other(n *node) *node { return s.nodes[1-n.idx] }

func (s *sim) nodeBySite(site string) *node {
	for _, n := range s.nodes {
		if n.site == site {
			return n
		}
	}
	return nil
}
