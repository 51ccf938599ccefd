package runtime

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anthdm/hollywood/actor"

	"understudy/actors/capability"
	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/capabilities/postgres"
	"understudy/capabilities/vm"
	"understudy/events"
)

// MemberConfig is one member of one pair hosted on this node.
type MemberConfig struct {
	Rules      failover.Rules
	Site       string
	Procedures procedure.Spec
	Options    failover.Options
	// Postgres or VM: the workload's section of the node file (validated);
	// StartHost turns it into Workload.
	Postgres *postgres.Config
	VM       *vm.Config
	// Workload is what the member protects; nil: the exec chains of
	// Procedures (NewExecChains). Its host owns it: it outlives restarts
	// of the member.
	Workload capability.Workload
}

// workload returns cfg's workload, the exec chains of its procedures when
// none is set.
func (cfg MemberConfig) workload(drivers procedure.Drivers) capability.Workload {
	if cfg.Workload != nil {
		return cfg.Workload
	}
	return NewExecChains(cfg.Rules.Pair+"."+cfg.Site, cfg.Procedures, drivers)
}

// Transition is an event one of a member's actors recorded, for live
// displays (understudy demo). At is the local wall time it was produced.
type Transition struct {
	Pair  string
	Site  string
	Event events.Event
	At    time.Time
}

// MemberDeps are what a member's actors use. Log and KV must outlive them.
type MemberDeps struct {
	Log     events.Log // the event stream (UNDERSTUDY_EVENTS)
	KV      events.KV  // the failover bucket
	Drivers procedure.Drivers
	Logger  *slog.Logger
	// Observe, when set, is called for every event the member or its
	// resource records, from the actor's goroutine: it must not block.
	Observe func(Transition)
	// Metrics, when set, get the member's phase, term, failures and events.
	Metrics *MemberMetrics
	// OnStop, when set, is told once why the member stops for good while
	// the node runs on (its host restarts it). It must not block.
	OnStop func(reason string)
	// Snapshot, when set, receives the member's state after every step
	// (for the node's HTTP endpoints: /primary, /replica).
	Snapshot *MemberSnapshotter
	// Trust signs the member's register writes and verifies every register
	// value it reads; nil: neither (no security section).
	Trust *ValueTrust

	// With leadership: node (Options.Node set), the host's: the node's
	// one watch, which feeds the member instead of a watch of its own;
	// the raises of other nodes' epochs, deduplicated; the rules
	// publications, a few at a time. Nil otherwise.
	watch   *nodeWatch
	raises  *raiseDeduper
	publish chan struct{}
	// health, when set, gets the answer time of every write (per-pair
	// leadership: the members' writes are the node's heartbeats).
	health *storeHealth
	// replayed, when set, is the member's state machine already folded
	// from its subject by the host's start-up replay (replayMembers); the
	// first actor of the slot takes it.
	replayed *replayed
	// gate, when set, bounds the KV writes the host's members have in
	// flight (see maxMemberWrites) and lets them pass the host's appends.
	gate *storeGate
	// steps, when set, is the host's bound on members stepping at once
	// (see stepSlots).
	steps chan struct{}
}

// stepSlots is how many of a host's members step at once: a few per CPU.
// When thousands of members have an input at the same moment (the raise
// of a dead node's epoch answered to all of them), each one's actor
// goroutine is runnable at once, and Go's scheduler runs what the network
// readies (the answers of the store, the NATS client's reads) only after
// the runnable goroutines queued before it: the survivor of a 10,000-pair
// takeover sent and read nothing for half a second while its members
// stepped. Members waiting for a slot are parked, not runnable.
func stepSlots() chan struct{} { return make(chan struct{}, 2*goruntime.GOMAXPROCS(0)) }

// MemberSnapshot is a member's state as its node's HTTP endpoints report
// it: its phase and term, and what the latest check of its workload found.
type MemberSnapshot struct {
	Pair, Site string
	Phase      failover.Phase
	Term       uint64
	// Checked: a check has reported since the member started; CheckOK and
	// Status are the latest one's, CheckedAt when it reported.
	Checked   bool
	CheckOK   bool
	CheckErr  string
	Status    capability.Status
	CheckedAt time.Time
	Updated   time.Time
	// LeaderFlush: the latest flush position a holder published (a
	// follower's lag is measured against it); HeartbeatTimeout: the pair's.
	LeaderFlush      capability.LSN
	HeartbeatTimeout time.Duration
}

// MemberSnapshotter holds the latest MemberSnapshot of one member; safe
// for concurrent use.
type MemberSnapshotter struct {
	p atomic.Pointer[MemberSnapshot]
}

// Load returns the latest snapshot (nil before the member's first step).
func (s *MemberSnapshotter) Load() *MemberSnapshot {
	if s == nil {
		return nil
	}
	return s.p.Load()
}

func (s *MemberSnapshotter) store(v MemberSnapshot) {
	if s != nil {
		s.p.Store(&v)
	}
}

// Messages of the member actor.
type (
	memberTick     struct{ gen uint64 }
	memberInput    struct{ in failover.Input }
	memberConflict struct{ err error }
	// conflictFenceDone ends the wait for the conflict fence.
	conflictFenceDone struct{}
	memberShutdown    struct{ done chan struct{} }
	memberPet         struct{}
	// memberTakeLive: take in the node's liveness log now (nodeWatch.wakeMembers).
	memberTakeLive struct{}
	watchFailed    struct{ err error }
)

// memberActor hosts one failover.Member: it feeds it the pair's KV watch,
// real timers, write results and procedure results, and carries out what
// the member asks (writes, procedures); events go to the member's subject.
type memberActor struct {
	cfg  MemberConfig
	deps MemberDeps
	log  *slog.Logger

	m        *failover.Member
	base     time.Time // monotonic origin of the member's clock
	pid      *actor.PID
	engine   *actor.Engine
	resource *actor.PID
	workload capability.Workload
	// lastCheck: the latest check result, for the snapshot.
	gauges      *memberGauges // nil without metrics
	lastCheck   *failover.ProcedureResult
	lastCheckAt time.Time
	app         *appender
	ctx         context.Context
	cancel      context.CancelFunc
	timer       *time.Timer
	tickGen     uint64
	// conflicted: another process appends to this member's subject; the
	// member takes no more inputs and stops once its resource is fenced.
	conflicted bool
	// acquireFails counts the member's acquire_failed in a row, and
	// acquireCause is the latest one's cause (see logLevel).
	acquireFails int
	acquireCause string // the kind of the latest one's cause (see logLevel)
	acquireTerm  uint64 // the term it tried for
	// handedOver is closed once the member no longer holds the register
	// after a shutdown request.
	handedOver chan struct{}
	stopReason string
	stopOnce   bool
	// corruptRev is the latest register revision reported as corrupt
	// (written from the watch and write goroutines).
	mu         sync.Mutex
	corruptRev uint64
	// lag: the member's writes NATS acknowledged against what its own
	// watch delivered (per-pair leadership).
	lag      watchLag
	feedMu   sync.Mutex        // one entry at a time to the member (watch and direct reads)
	fed      map[string]uint64 // the pair's keys: the latest revision of each handed over (under feedMu)
	watched  bool              // a watch delivered its initial values (under feedMu)
	bridging atomic.Bool       // the watch lags: read the pair's keys directly (bridge)
	inbox    memberInbox       // leadership: node: what the node's watch hands over
	// liveSeen: the seq of the latest item of the node's liveness log this
	// member took in (leadership: node; set when it subscribes, then by its
	// steps); liveItems and liveBuf are reused by takeLive and step;
	// liveMissed: items it fell behind on, as last logged.
	liveSeen   uint64
	liveItems  []liveItem
	liveBuf    []failover.Input
	liveMissed uint64
	// prompt: the member acts on its node's next routine liveness input
	// (failover.Member.Prompt): it takes in every liveness input at once.
	prompt atomic.Bool
	// liveWoken: a wake to take in the liveness log is on its way and the
	// member has not stepped since (wakeLive).
	liveWoken atomic.Bool
	// Under feedMu: session numbers the watches (one per Watch); regSession
	// is the session that handed over the latest register entry (0: a
	// direct read did), and genuine the latest genuine entry handed over
	// then (failover.LeaderEntry.Genuine): within one session the watch
	// skips no revision, so it is exact without reading the history.
	session    uint64
	regSession uint64
	genuine    *failover.LeaderEntry
	// forgedRev: the latest register revision logged as not genuine (mu).
	forgedRev uint64
	// historyFailRev: the latest revision whose genuine predecessor could
	// not be read from the history, as logged (mu): once per revision.
	historyFailRev uint64
}

// stop ends the member for good (its host may start a new one) and tells
// the host why, once.
func (a *memberActor) stop(c *actor.Context, reason string) {
	if !a.stopOnce {
		a.stopOnce = true
		if a.deps.OnStop != nil {
			a.deps.OnStop(reason)
		}
	}
	c.Engine().Poison(c.PID())
}

// NewMemberActor returns the producer of a member actor for cfg.
func NewMemberActor(cfg MemberConfig, deps MemberDeps) actor.Producer {
	return func() actor.Receiver {
		logger := deps.Logger
		if logger == nil {
			logger = slog.Default()
		}
		return &memberActor{cfg: cfg, deps: deps, log: logger.With("pair", cfg.Rules.Pair, "site", cfg.Site)}
	}
}

func (a *memberActor) now() time.Duration { return time.Since(a.base) }

func (a *memberActor) Receive(c *actor.Context) {
	switch msg := c.Message().(type) {
	case actor.Started:
		a.started(c)
	case actor.Stopped:
		a.stopped()
	case memberTick:
		if msg.gen == a.tickGen {
			a.step(failover.Tick{})
		}
	case memberInput:
		a.step(msg.in)
	case memberTakeLive:
		a.step(nil)
	case procDone:
		if msg.res.Seq == conflictFenceSeq && msg.res.Kind == failover.ProcFence {
			a.log.Warn("conflict fence finished; member stops", "ok", msg.res.OK, "detail", msg.res.Detail)
			a.stop(c, a.stopReason)
			return
		}
		if msg.res.Kind == failover.ProcCheck {
			a.lastCheck = &msg.res
			a.lastCheckAt = time.Now()
		}
		a.step(msg.res)
	case memberPet:
		if p, ok := a.workload.(capability.Watched); ok && !a.conflicted {
			p.Pet()
		}
	case memberConflict:
		a.onConflict(c, msg.err)
	case conflictFenceDone:
		a.log.Error("conflict fence did not finish within the fence chain's worst case; member stops")
		a.stop(c, a.stopReason+" (its fence did not finish in time)")
	case memberShutdown:
		a.handedOver = msg.done
		a.step(failover.Shutdown{})
	case watchFailed:
		a.log.Warn("kv watch failed; re-watching", "err", msg.err)
	}
}

func (a *memberActor) started(c *actor.Context) {
	a.pid, a.engine, a.base = c.PID(), c.Engine(), time.Now()
	a.ctx, a.cancel = context.WithCancel(context.Background())
	subject := failover.Subject(a.cfg.Rules.Pair, a.cfg.Site)
	a.gauges = a.deps.Metrics.member(a.cfg.Rules.Pair, a.cfg.Site)
	pre := a.deps.replayed.take() // once: a restarted actor reads its log afresh
	if pre != nil {
		a.m = pre.m
	} else {
		m, err := memberMachine(a.cfg)
		if err != nil {
			a.log.Error("member refused its rules", "err", err)
			a.stop(c, "refused its rules: "+err.Error())
			return
		}
		a.m = m
	}
	a.lag.limit, a.lag.keep = a.cfg.Rules.HeartbeatTimeout, 64 // 64 heartbeats: far past the lag limit
	a.app = newAppender(a.deps.Log, subject, a.log)
	a.app.onConflict = func(err error) { a.engine.Send(a.pid, memberConflict{err}) }
	a.app.onAppended = a.observed
	if pre != nil {
		a.app.setLast(pre.last) // the host's one-pass replay logged it
	} else if last, n, ok := a.replay(subject); ok {
		a.app.setLast(last)
		a.log.Info("member replayed its log", "subject", subject, "events", n, "last_seq", last, "term", a.m.Term())
	}
	a.app.start()
	a.workload = a.cfg.workload(a.deps.Drivers)
	a.resource = c.SpawnChild(newWorkloadActor(a.cfg, a.deps, a.workload), "resource")
	if _, ok := a.workload.(capability.Watched); ok {
		go a.petter()
	}
	if a.deps.watch != nil {
		a.deps.watch.subscribe(a)
		go a.publishRulesOnce()
	} else {
		go a.watch()
		go a.bridge()
	}
	a.handle(a.m.Start(a.now()))
	a.snapshot()
	a.schedule()
}

// petter asks the member's loop to pet its workload's watchdog four times
// per fence_grace (at most per heartbeat_timeout): a pet proves the loop
// runs, so a node paused or wedged past fence_grace is fenced by it.
func (a *memberActor) petter() {
	every := min(a.cfg.Rules.FenceGrace, a.cfg.Rules.HeartbeatTimeout) / 4
	every = max(every, 10*time.Millisecond)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-t.C:
			a.engine.Send(a.pid, memberPet{})
		}
	}
}

// memberMachine builds cfg's state machine, its fence budget covering its
// procedures' and its workload's worst case.
func memberMachine(cfg MemberConfig) (*failover.Member, error) {
	opts := cfg.Options
	opts.FenceBudget = max(opts.FenceBudget, cfg.Procedures.Fence.WorstCase())
	if fb, ok := cfg.Workload.(fenceBudgeter); ok {
		opts.FenceBudget = max(opts.FenceBudget, fb.FenceBudget())
	}
	return failover.NewMember(cfg.Site, cfg.Rules, opts)
}

// replay folds the member's own subject into the fresh member. It is best
// effort: a member always starts fenced, so a log it cannot read (NATS
// down) costs history, not safety; the appender then reads the last
// sequence itself before its first append.
func (a *memberActor) replay(subject string) (last uint64, n int, ok bool) {
	ctx, cancel := context.WithTimeout(a.ctx, 5*time.Second)
	defer cancel()
	codec := a.deps.Log.Codec()
	for rec, err := range a.deps.Log.Read(ctx, events.ReadOptions{Subject: subject}) {
		if err != nil {
			a.log.Warn("member log not readable at start; starting fenced without history", "subject", subject, "err", err)
			return 0, 0, false
		}
		last = rec.Sequence
		if foldRecord(a.m, codec, rec, a.log) {
			n++
		}
	}
	return last, n, true
}

// foldRecord applies one record of a member's own subject to m, unless it
// is foreign (no appender wrote it), corrupt or of an unknown type: each
// of those is logged and skipped. It reports whether m took it.
func foldRecord(m *failover.Member, codec *events.Registry, rec events.Record, log *slog.Logger) bool {
	if _, ok := events.AppendedBy(rec); !ok {
		log.Warn("foreign record in member log (no appender wrote it), skipped", "subject", rec.Subject, "seq", rec.Sequence,
			"msg_id", rec.Headers["Nats-Msg-Id"], "data", events.HexPrefix(rec.Data))
		return false
	}
	ev, err := codec.DecodeRecord(rec)
	if err != nil {
		log.Error("corrupt event in member log, skipped", "subject", rec.Subject, "seq", rec.Sequence, "err", err)
		return false
	}
	if u, unknown := ev.(*events.Unknown); unknown {
		log.Warn("unknown event in member log, kept and skipped", "subject", rec.Subject, "seq", rec.Sequence, "type", u.Type, "version", u.Version)
		return false
	}
	m.Apply(ev)
	return true
}

// conflictFenceSeq marks the fence chain a member runs when it finds a
// twin: above any sequence the member itself hands out.
const conflictFenceSeq = ^uint64(0)

// onConflict stops a member whose event subject another process writes: it
// is a zombie or has a twin. It takes no more inputs; if it was serving or
// holding the register it fences its resource first (fence chains are
// idempotent), so that a stopped member never leaves a database serving.
func (a *memberActor) onConflict(c *actor.Context, err error) {
	if a.conflicted {
		return
	}
	a.conflicted = true
	a.stopReason = "another process appends to its event subject: " + err.Error()
	if a.deps.watch != nil {
		a.deps.watch.unsubscribe(a) // no more inputs
	}
	if a.cancel != nil {
		a.cancel() // ends the KV watch: no more inputs
	}
	if a.timer != nil {
		a.timer.Stop()
	}
	if a.m == nil || !(a.m.Serving() || a.m.Holding()) {
		a.log.Error("member stops: its event subject is written by another process", "err", err)
		a.stop(c, a.stopReason)
		return
	}
	wait := a.cfg.Procedures.Fence.WorstCase() + time.Second
	a.log.Error("member fences its resource and stops: its event subject is written by another process",
		"err", err, "serving", a.m.Serving(), "fence_wait", wait)
	a.engine.Send(a.resource, runProc{failover.Procedure{Kind: failover.ProcFence, Seq: conflictFenceSeq, Term: a.m.Term(), Reason: "conflict"}})
	pid, engine := a.pid, a.engine
	time.AfterFunc(wait, func() { engine.Send(pid, conflictFenceDone{}) })
}

func (a *memberActor) stopped() {
	if a.deps.watch != nil && a.pid != nil {
		a.deps.watch.unsubscribe(a)
	}
	if a.cancel != nil {
		a.cancel()
	}
	if a.timer != nil {
		a.timer.Stop()
	}
	if a.app != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := a.app.flush(ctx); err != nil {
			a.log.Warn("member stopped with events unwritten", "err", err)
		}
		cancel()
		a.app.stop()
	}
}

// step feeds the member in (nil: nothing), after what the node's
// liveness log gained since its last step (takeLive).
func (a *memberActor) step(in failover.Input) {
	a.liveWoken.Store(false) // before the log is read: a wake after this is for what the read may miss
	if a.m == nil || a.conflicted {
		return
	}
	if a.deps.steps != nil {
		a.deps.steps <- struct{}{}
		defer func() { <-a.deps.steps }()
	}
	a.gauges.stepped()
	ins := a.takeLive()
	now := a.now() // after the log was read: no item dated after it
	if in != nil {
		ins = append(ins, in)
	}
	var r failover.Ready
	if len(ins) > 0 {
		r = a.m.StepAll(now, ins...)
	}
	// Before handle, which may ask for a probe: its beat must find the
	// member prompt. What was logged since the log was read, while the
	// member was not, it takes in at once.
	a.setPrompt()
	a.handle(r) // also with nothing to do: the gauges follow every step
	clear(ins)
	a.liveBuf = ins[:0]
	a.schedule()
	a.snapshot()
	if a.handedOver != nil && !a.m.Holding() {
		close(a.handedOver)
		a.handedOver = nil
	}
}

// setPrompt records whether the member acts on its node's next routine
// liveness input (failover.Member.Prompt), and when it just became so,
// has it take in at once what the log gained since it was read.
func (a *memberActor) setPrompt() {
	p := a.m.Prompt()
	if a.prompt.Swap(p) == p || !p || a.deps.watch == nil {
		return
	}
	if a.deps.watch.lives.latest.Load() != a.liveSeen {
		a.engine.Send(a.pid, memberTakeLive{})
	}
}

// wakeLive has the member take in its node's liveness log at its next
// step: one wake on its way is enough, as the step reads all the log
// gained. In a takeover the node woke each of its 10,000 members three
// times in half a second (its own beat, the raise, its beat's answer)
// while most had not stepped yet. Safe for concurrent use.
func (a *memberActor) wakeLive() {
	if a.ctx.Err() != nil || a.liveWoken.Swap(true) {
		return
	}
	a.inbox.input(a, nil) // nil: take in the log (memberActor.deliver)
}

// takeLive returns what the node's liveness log gained since the
// member's last step, each dated by when the node saw it (see liveLog),
// in a.liveBuf: the step hands them to the member with its input, in one
// StepAll.
func (a *memberActor) takeLive() []failover.Input {
	ins := a.liveBuf[:0]
	if a.deps.watch == nil {
		return ins
	}
	items, latest, missed := a.deps.watch.lives.since(a.liveSeen, a.liveItems[:0])
	a.liveSeen = latest
	if missed > 0 {
		a.liveMissed += missed
		a.log.Warn("member fell behind its node's liveness log: records and results it never took in",
			"missed", missed, "missed_total", a.liveMissed, "kept", liveLogSize)
	}
	for i, it := range items {
		if _, ok := it.in.(failover.Resynced); ok && !a.isWatched() {
			// The bridge's: beats skipped while the watch lagged. A member
			// whose initial keys the watch has not handed over yet is not
			// synced by it.
			items[i] = liveItem{}
			continue
		}
		ins = append(ins, dated(it.in, it.at, a.base))
		items[i] = liveItem{}
	}
	a.liveItems = items[:0]
	return ins
}

// snapshot publishes the member's state for the node's endpoints.
func (a *memberActor) snapshot() {
	if a.deps.Snapshot == nil {
		return
	}
	v := MemberSnapshot{Pair: a.cfg.Rules.Pair, Site: a.cfg.Site, Phase: a.m.Phase(), Term: a.m.Term(), Updated: time.Now(),
		LeaderFlush: a.m.LeaderFlush(), HeartbeatTimeout: a.m.Rules().HeartbeatTimeout}
	if c := a.lastCheck; c != nil {
		v.Checked, v.CheckOK, v.CheckErr, v.CheckedAt = true, c.OK, c.Detail, a.lastCheckAt
		if c.Status != nil {
			v.Status = *c.Status
		}
	}
	a.deps.Snapshot.store(v)
}

func (a *memberActor) schedule() {
	a.tickGen++
	gen := a.tickGen
	d := a.m.NextWake() - a.now()
	if d < time.Millisecond {
		d = time.Millisecond
	}
	if a.timer != nil {
		a.timer.Stop()
	}
	a.timer = time.AfterFunc(d, func() { a.engine.Send(a.pid, memberTick{gen}) })
}

func (a *memberActor) observed(ev events.Event, _ events.Ack) {
	if a.deps.Observe != nil {
		a.deps.Observe(Transition{Pair: a.cfg.Rules.Pair, Site: a.cfg.Site, Event: ev, At: time.Now()})
	}
}

// transitionLevel is the log level of a member event: what an operator must
// see (fencing, lost leadership, refusals) at warn, the life of the pair
// (promotion, serving, hand-over, config) at info, the rest at debug.
func transitionLevel(ev events.Event) slog.Level {
	if f, ok := ev.(*failover.FenceRequested); ok && f.Reason == failover.FenceRestart {
		return slog.LevelInfo // every start comes up fenced
	}
	if f, ok := ev.(*failover.ManualFailoverAccepted); ok {
		if f.Forced {
			return slog.LevelWarn // it may lose commits: say what it overrode
		}
		return slog.LevelInfo
	}
	switch ev.(type) {
	case *failover.HeartbeatFailed, *failover.FenceRequested, *failover.FenceFailed, *failover.PromoteFailed,
		*failover.DemoteFailed, *failover.LeadershipLost, *failover.ConfigRejected, *failover.PromotionRejected,
		*failover.AcquireFailed, *failover.SwitchoverRejected, *failover.ManualFailoverRejected, *failover.AutomationPaused,
		*failover.ForgedValueIgnored:
		return slog.LevelWarn
	case *failover.Started, *failover.Fenced, *failover.Promoted, *failover.Resumed, *failover.Unfenced,
		*failover.ServingStarted, *failover.HeartbeatRecovered, *failover.DemotionRequested, *failover.Demoted,
		*failover.Released, *failover.ConfigApplied, *failover.SwitchoverAccepted, *failover.AutomationResumed:
		return slog.LevelInfo
	}
	// AcquireAttempted among them: its outcome (promoted, acquire_failed,
	// promotion_rejected) is logged, and a node taking thousands of pairs
	// over attempts each every heartbeat until it lands.
	return slog.LevelDebug
}

// logLevel is transitionLevel, except for an acquire that fails again
// for the same reason: a node taking thousands of pairs over while its
// store is slow tries each every heartbeat until it lands, and logged
// each time at warn it wrote 55,000 lines in the 20 s of a 10,000-pair
// takeover (every one recorded in the member's events all the same).
// The first failure of a run, and one of a new kind (the cause's first
// word: timeout, unavailable, …; its details name batch sizes and
// revisions that change every time) or for a new term, are warned of;
// the repeats are at debug; the outcome that ends the run (promoted,
// promotion_rejected, resumed) is logged with the count of failed
// attempts before it, returned with the level (0: none counted).
func (a *memberActor) logLevel(ev events.Event) (slog.Level, int) {
	lvl := transitionLevel(ev)
	switch e := ev.(type) {
	case *failover.AcquireFailed:
		kind, _, _ := strings.Cut(e.Cause, ":")
		if a.acquireFails > 0 && e.Term != a.acquireTerm {
			a.acquireFails = 0 // another takeover: a new run
		}
		if a.acquireFails > 0 && kind == a.acquireCause {
			lvl = slog.LevelDebug
		}
		a.acquireFails++
		a.acquireCause, a.acquireTerm = kind, e.Term
		return lvl, 0
	case *failover.Promoted, *failover.PromotionRejected, *failover.Resumed, *failover.Started:
		n := a.acquireFails
		a.acquireFails, a.acquireCause, a.acquireTerm = 0, "", 0
		return lvl, n
	}
	return lvl, 0
}

func (a *memberActor) handle(r failover.Ready) {
	for _, ev := range r.Events {
		// Formatted only when logged: a node with thousands of members
		// steps them thousands of times a second.
		lvl, failed := a.logLevel(ev)
		if !a.log.Enabled(context.Background(), lvl) {
			continue
		}
		attrs := []any{"event", ev.EventType(), "detail", fmt.Sprintf("%+v", ev), "phase", a.m.Phase().String(), "term", a.m.Term()}
		if failed > 0 {
			attrs = append(attrs, "failed_attempts", failed)
		}
		a.log.Log(context.Background(), lvl, "transition", attrs...)
	}
	a.gauges.observe(a.m, r.Events)
	a.app.add(r.Events...)
	for _, w := range r.Writes {
		if w.Kind == failover.WriteBump || w.Kind == failover.WriteLiveness {
			v, err := a.deps.Trust.SignLiveness(w.Live)
			if err != nil {
				a.log.Error("epoch raise not signed, not written", "key", w.Key, "err", err)
				continue
			}
			go a.raise(w, v)
			continue
		}
		if a.deps.Trust != nil && w.Key == failover.LeaderKey(a.cfg.Rules.Pair) {
			v, err := a.deps.Trust.Sign(a.cfg.Rules.Pair, a.cfg.Site, w.Leader)
			if err != nil {
				// Unsigned, it would count for nobody: the member counts the
				// write as failed at its deadline, as any write lost.
				a.log.Error("register write not signed, not written", "kind", w.Kind.String(), "err", err)
				continue
			}
			w.Value = v
		}
		kw := a.kvWrite(w)
		if a.deps.gate != nil {
			// A write that waited for its turn past half its window is not
			// issued: it would land after its deadline, counted failed by
			// the member and written again — store work for nothing, and
			// under a takeover of thousands of pairs every write landed
			// late, none counted, and the rewrites never stopped.
			a.deps.gate.submitWrite(kw)
		} else {
			go performWrite(kw)
		}
	}
	if r.ProbeLiveness && a.deps.watch != nil {
		a.deps.watch.probeLiveness()
	}
	for _, p := range r.Procedures {
		a.engine.Send(a.resource, runProc{p})
	}
}

// kvWrite is w as the host's gate performs it (alone, or in a batch
// with other members' writes): within the member's deadline, answered to
// the member. A write whose turn comes later than failover.IssueMargin
// before its deadline is never issued, and the member counts it failed at
// its deadline.
func (a *memberActor) kvWrite(w failover.Write) *kvWrite {
	window := w.Deadline - a.now()
	now := time.Now()
	return &kvWrite{
		ctx: a.ctx, kv: a.deps.KV,
		w:        events.KVWrite{Key: w.Key, Value: w.Value, Put: w.Put, Revision: w.ExpectRev},
		issueBy:  now.Add(window - failover.IssueMargin(window, a.cfg.Rules.HeartbeatTimeout)),
		deadline: now.Add(window),
		beat:     w.Kind == failover.WriteMemberBeat,
		done:     func(rev uint64, err error, took time.Duration) { a.answer(w, rev, err, took) },
	}
}

// answer hands the member the outcome of its KV write w.
func (a *memberActor) answer(w failover.Write, rev uint64, err error, took time.Duration) {
	if a.ctx.Err() != nil {
		return
	}
	a.deps.health.observeWrite(took, a.cfg.Rules.HeartbeatTimeout)
	res := failover.WriteResult{Op: w.Op, Err: failover.WriteErrOf(err), Revision: rev}
	switch res.Err {
	case failover.WriteOK:
		a.ackedWrite(rev)
	case failover.WriteConflict:
		if w.Key == failover.LeaderKey(a.cfg.Rules.Pair) {
			// Tell the member who holds the register, so it can tell its own
			// late write from a rival's.
			gctx, gcancel := context.WithTimeout(a.ctx, time.Second)
			if e, gerr := a.deps.KV.Get(gctx, w.Key); gerr == nil {
				le, derr := failover.LeaderEntryOf(e, 0)
				if derr != nil {
					le = a.corruptLeader(gctx, e, derr)
				}
				le = a.judgedRead(gctx, le, e.Value)
				res.Current = &le
			}
			gcancel()
		}
	default:
		res.Cause = err.Error()
	}
	a.engine.Send(a.pid, memberInput{res})
}

// ackedWrite records a write NATS acknowledged, which the watch must
// deliver within a heartbeat (lag detection): the node's watch's, or the
// member's own.
func (a *memberActor) ackedWrite(rev uint64) {
	if a.deps.watch != nil {
		a.deps.watch.acked(rev)
		return
	}
	a.lag.ack(rev)
}

// raise performs a raise of another node's epoch (failover.WriteBump)
// through the node's raiseDeduper, within the member's deadline, and
// answers it.
func (a *memberActor) raise(w failover.Write, value []byte) {
	timeout := w.Deadline - a.now()
	if timeout <= 0 || a.deps.raises == nil {
		return // counted as failed at its deadline
	}
	ctx, cancel := context.WithTimeout(a.ctx, timeout)
	defer cancel()
	res, ok := a.deps.raises.raise(ctx, w, value, time.Now().Add(timeout))
	if !ok || a.ctx.Err() != nil {
		return
	}
	if res.Err == failover.WriteOK {
		a.ackedWrite(res.Revision)
	}
	a.engine.Send(a.pid, memberInput{res})
}

// deliver hands the member what the node's watch handed over (through
// its memberInbox).
func (a *memberActor) deliver(d delivery) {
	switch {
	case d.e.Key != "":
		a.feed(d.e, d.session)
	case d.synced:
		a.markSynced()
	case d.in == nil:
		a.engine.Send(a.pid, memberTakeLive{})
	default:
		a.engine.Send(a.pid, memberInput{d.in})
	}
}

// isWatched reports whether the member was told its keys' initial values
// were delivered (markSynced).
func (a *memberActor) isWatched() bool {
	a.feedMu.Lock()
	defer a.feedMu.Unlock()
	return a.watched
}

// markSynced tells the member its keys' initial values were delivered:
// Synced the first time, Resynced after.
func (a *memberActor) markSynced() {
	a.feedMu.Lock()
	defer a.feedMu.Unlock()
	if a.watched {
		a.engine.Send(a.pid, memberInput{failover.Resynced{}})
	} else {
		a.engine.Send(a.pid, memberInput{failover.Synced{}})
	}
	a.watched = true
}

// watch feeds the pair's keys to the member, re-watching after failures.
func (a *memberActor) watch() {
	pattern := a.cfg.Rules.Pair + ".>"
	backoff := 100 * time.Millisecond
	a.publishRules()
	for a.ctx.Err() == nil {
		w, err := a.deps.KV.Watch(a.ctx, pattern, events.WatchOptions{})
		a.feedMu.Lock()
		a.session++
		session := a.session
		a.feedMu.Unlock()
		if err != nil {
			if a.ctx.Err() != nil {
				return
			}
			a.engine.Send(a.pid, watchFailed{err})
			select {
			case <-time.After(backoff):
			case <-a.ctx.Done():
				return
			}
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		a.follow(w, session)
		_ = w.Stop()
	}
}

// follow feeds one watch to the member until it ends or lags (watchLag:
// the member would see neither its own heartbeats nor the register). Then
// it returns, and the caller watches afresh. A fresh watch delivers the current value of
// every key first: what was delivered already is skipped, so the member
// sees every revision once, in order.
func (a *memberActor) follow(w events.Watcher, session uint64) {
	check := time.NewTicker(a.lag.limit / 2)
	defer check.Stop()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e.Revision == 0 {
				a.markSynced()
				if a.bridging.CompareAndSwap(true, false) {
					a.log.Info("kv watch delivers again; direct reads of the pair's keys stop")
				}
				continue
			}
			a.feed(e, session)
		case <-check.C:
			if w, lagging := a.lag.oldestUndelivered(); lagging {
				a.log.Warn("kv watch lags behind acknowledged writes; watching afresh, and reading the pair's keys directly meanwhile",
					"acked_revision", w.rev, "delivered_revision", a.lag.delivered.Load(), "acked_ago", time.Since(w.at))
				a.bridging.Store(true)
				return
			}
		case <-a.ctx.Done():
			return
		}
	}
}

// feed hands a KV entry to the member once: an entry at or below the
// latest revision of its key handed over (by the watch or a direct read)
// is skipped, so the member sees each key's revisions in order, each once.
// Per key: direct reads of several keys do not come in revision order.
// session is the watch's that delivered it (0: a direct read).
func (a *memberActor) feed(e events.Entry, session uint64) {
	a.feedMu.Lock()
	defer a.feedMu.Unlock()
	if a.fed == nil {
		// The pair's keys, and no other: a key under the pair's prefix
		// that no member writes is nothing a member reads.
		p, r := a.cfg.Rules.Pair, a.cfg.Rules
		a.fed = map[string]uint64{failover.LeaderKey(p): 0, failover.ConfigKey(p): 0, failover.SwitchoverKey(p): 0,
			failover.PauseKey(p): 0, failover.ManualFailoverKey(p): 0,
			failover.HeartbeatKey(p, r.Primary): 0, failover.HeartbeatKey(p, r.Replica): 0}
	}
	last, ours := a.fed[e.Key]
	if !ours || e.Revision <= last {
		return
	}
	a.fed[e.Key] = e.Revision
	a.lag.sawDelivered(e.Revision)
	if in := a.input(e, session); in != nil {
		a.engine.Send(a.pid, memberInput{in})
	}
}

// bridge reads the register and both members' heartbeats directly every
// quarter heartbeat while the watch lags and until a fresh watch delivers.
// A new watch needs a consumer, which JetStream creates through its meta
// leader: when that leader's site is the one cut off, creation waits for
// an election, and a follower that saw neither its own heartbeats nor the
// register meanwhile would detect a dead leader that much later. A direct
// read needs only the stream. The member is told (Resynced, every round)
// that the heartbeats it skips meanwhile were skipped by the reading, not
// by a stall of the store.
func (a *memberActor) bridge() {
	every := a.cfg.Rules.HeartbeatTimeout / 4
	t := time.NewTicker(every)
	defer t.Stop()
	pair := a.cfg.Rules.Pair
	keys := []string{failover.LeaderKey(pair), failover.HeartbeatKey(pair, a.cfg.Site), failover.HeartbeatKey(pair, a.cfg.Rules.Other(a.cfg.Site))}
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-t.C:
		}
		if !a.bridging.Load() {
			continue
		}
		// Every round: a read that failed leaves a gap in the heartbeats
		// the member sees, and that gap is the reading's, not the store's.
		a.feedMu.Lock()
		if a.watched {
			a.engine.Send(a.pid, memberInput{failover.Resynced{}})
		}
		a.feedMu.Unlock()
		// The three reads at once, each bounded by the round.
		got := make([]events.Entry, len(keys))
		var wg sync.WaitGroup
		for i, k := range keys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(a.ctx, every)
				defer cancel()
				if e, err := a.deps.KV.Get(ctx, k); err == nil {
					got[i] = e
				}
			}()
		}
		wg.Wait()
		slices.SortFunc(got, func(x, y events.Entry) int { return cmp.Compare(x.Revision, y.Revision) })
		for _, e := range got {
			if e.Revision != 0 {
				a.feed(e, 0)
			}
		}
	}
}

// watchLag tells a KV watch that lags behind acknowledged writes: a write
// NATS acknowledged more than limit ago (one heartbeat: a watch delivers
// in milliseconds, and a follower blind for longer detects a dead leader
// that much later) that the watch has not delivered means the watch is
// stuck — an ordered consumer notices a lost stream leader only at its
// idle heartbeat, seconds later. A member's own watch (per-pair
// leadership) and the node's watch each have one. Safe for concurrent
// use; set limit and keep before.
type watchLag struct {
	limit time.Duration
	keep  int // the acknowledged writes remembered: the oldest matter for lag, the newest too

	delivered atomic.Uint64 // the latest revision the watch delivered
	mu        sync.Mutex
	acked     []ackedWrite // acknowledged, not yet seen delivered at the last check (at most keep)
}

// ackedWrite is a write that NATS acknowledged.
type ackedWrite struct {
	rev uint64
	at  time.Time
}

// ack records a write NATS acknowledged: the watch must deliver it within
// limit.
func (l *watchLag) ack(rev uint64) {
	if rev <= l.delivered.Load() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.acked) >= l.keep && len(l.acked) > 0 {
		l.acked = append(l.acked[:0], l.acked[1:]...) // full: the newest matter too
	}
	l.acked = append(l.acked, ackedWrite{rev, time.Now()})
}

// sawDelivered records that the watch delivered revision rev.
func (l *watchLag) sawDelivered(rev uint64) {
	if rev > l.delivered.Load() {
		l.delivered.Store(rev)
	}
}

// oldestUndelivered is peekOldest, and forgets every acknowledged write
// when it reports one lagging: one fresh watch per lagging write.
func (l *watchLag) oldestUndelivered() (ackedWrite, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w, lagging := l.oldestLocked()
	if lagging {
		l.acked = l.acked[:0]
	}
	return w, lagging
}

// peekOldest drops the acknowledged writes the watch has delivered and
// reports the oldest of the others, and whether it has waited longer than
// limit. It forgets nothing else: a slow watch stays behind until it
// delivers what it owes.
func (l *watchLag) peekOldest() (ackedWrite, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.oldestLocked()
}

// oldestLocked is peekOldest with l.mu held.
func (l *watchLag) oldestLocked() (ackedWrite, bool) {
	delivered := l.delivered.Load()
	l.acked = slices.DeleteFunc(l.acked, func(a ackedWrite) bool { return a.rev <= delivered })
	if len(l.acked) == 0 || time.Since(l.acked[0].at) <= l.limit {
		return ackedWrite{}, false
	}
	return l.acked[0], true
}

// behind reports whether any acknowledged write is still undelivered.
func (l *watchLag) behind() bool {
	delivered := l.delivered.Load()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, a := range l.acked {
		if a.rev > delivered {
			return true
		}
	}
	return false
}

// input turns a KV entry of the pair into a member input (nil: not one,
// or a heartbeat or switchover value that does not decode, which is logged
// with its key and revision and never reaches the member). A register
// value that does not decode reaches the member as a register nobody
// holds (failover.LeaderEntry.Corrupt); every register value is judged
// (judged). feedMu is held; session as for feed.
func (a *memberActor) input(e events.Entry, session uint64) failover.Input {
	in, err := failover.InputOf(a.cfg.Rules.Pair, e)
	lo, leader := in.(failover.LeaderObserved)
	if err != nil && !leader {
		a.log.Error("KV value of the pair does not decode, ignored", "key", e.Key, "revision", e.Revision, "err", err)
		return in
	}
	if !leader {
		return in
	}
	ctx, cancel := context.WithTimeout(a.ctx, 2*time.Second)
	defer cancel()
	if err != nil {
		lo.Entry = a.corruptLeader(ctx, e, err)
	}
	lo.Entry = a.judged(ctx, lo.Entry, e.Value, session)
	return lo
}

// judged returns register entry le, stored as raw and handed over by
// feed, as the member must see it: Forged when its signature does not
// verify (with a Trust), and, when failover.WantsGenuine, with the latest
// genuine entry before it — from what the same watch session handed over
// (session != 0), else from the key's history. feedMu is held.
func (a *memberActor) judged(ctx context.Context, le failover.LeaderEntry, raw []byte, session uint64) failover.LeaderEntry {
	a.judge(&le, raw)
	contiguous := session != 0 && a.regSession == session
	if failover.WantsGenuine(le) {
		if contiguous {
			le.Genuine = a.genuine
		} else {
			le.Genuine = a.genuineBefore(ctx, le.Rev)
		}
	}
	switch {
	case session == 0:
		a.regSession = 0 // a direct read may have skipped revisions
		return le
	case genuineCandidate(le):
		g := le
		g.Genuine = nil
		a.genuine = &g
	case !contiguous:
		a.genuine = le.Genuine
	}
	a.regSession = session
	return le
}

// judgedRead is judged for a register read directly (after a conflict),
// which no watch session vouches for: the genuine entry before it comes
// from the history.
func (a *memberActor) judgedRead(ctx context.Context, le failover.LeaderEntry, raw []byte) failover.LeaderEntry {
	a.judge(&le, raw)
	if failover.WantsGenuine(le) {
		le.Genuine = a.genuineBefore(ctx, le.Rev)
	}
	return le
}

// judge sets le.Forged (ValueTrust.Judge) and logs a value that is not
// genuine once per revision, with why.
func (a *memberActor) judge(le *failover.LeaderEntry, raw []byte) {
	why := a.deps.Trust.Judge(a.cfg.Rules.Pair, le, raw)
	if why == nil {
		return
	}
	a.mu.Lock()
	first := le.Rev > a.forgedRev
	a.forgedRev = max(a.forgedRev, le.Rev)
	a.mu.Unlock()
	if first {
		a.log.Warn("register value not genuine: no member takes it for a member's write", "revision", le.Rev,
			"value", le.Value.String(), "by", le.Value.By, "why", why)
	}
}

// genuineCandidate: a register entry that can stand as LeaderEntry.Genuine.
func genuineCandidate(le failover.LeaderEntry) bool {
	return !le.Forged && !le.Corrupt && !le.Value.ForAnother()
}

// genuineBefore reads the latest genuine entry of the register's history
// below rev (nil: none, or the history cannot be read).
func (a *memberActor) genuineBefore(ctx context.Context, rev uint64) *failover.LeaderEntry {
	hist, err := a.deps.KV.History(ctx, failover.LeaderKey(a.cfg.Rules.Pair))
	if err != nil {
		a.mu.Lock()
		first := rev > a.historyFailRev
		a.historyFailRev = max(a.historyFailRev, rev)
		a.mu.Unlock()
		if first {
			a.log.Warn("register history not readable: a value no member wrote comes without the genuine one before it", "revision", rev, "err", err)
		}
		return nil
	}
	for i := len(hist) - 1; i >= 0; i-- {
		e := hist[i]
		if e.Revision >= rev || e.Op != events.OpPut {
			continue
		}
		le, err := failover.LeaderEntryOf(e, 0)
		if err != nil {
			continue
		}
		if a.deps.Trust.Judge(a.cfg.Rules.Pair, &le, e.Value) == nil && genuineCandidate(le) {
			return &le
		}
	}
	return nil
}

// corruptLeader reports a register value that does not decode, once per
// revision seen here, and returns it as a register nobody holds, with the
// highest term of the key's history (so the next holder's term is above
// every earlier one; history that cannot be read counts as term 0, and
// the member adds what it knows itself).
func (a *memberActor) corruptLeader(ctx context.Context, e events.Entry, derr error) failover.LeaderEntry {
	var highest uint64
	hist, herr := a.deps.KV.History(ctx, e.Key)
	if herr == nil {
		highest = failover.HighestTerm(hist)
	}
	a.mu.Lock()
	first := e.Revision > a.corruptRev
	a.corruptRev = max(a.corruptRev, e.Revision)
	a.mu.Unlock()
	if first {
		a.log.Error("leader register value does not decode: it counts as held by nobody, and is replaced by CAS with a term above the highest of its history",
			"key", e.Key, "revision", e.Revision, "highest_term", highest, "history_err", herr, "err", derr)
	}
	le, _ := failover.LeaderEntryOf(e, highest)
	return le
}

// publishRulesOnce is publishRules on a node's watch (leadership: node):
// once the watch has synced, only when the value in the bucket is not the
// one it would write, and a few members at a time (publishRules), so that
// a node restarting with thousands of pairs does not write thousands of
// keys at once.
func (a *memberActor) publishRulesOnce() {
	w := a.deps.watch
	if !w.waitSynced(a.ctx) {
		return
	}
	want := failover.EncodeRules(a.cfg.Rules)
	if a.deps.Trust == nil {
		if _, ok := w.cached(failover.ConfigKey(a.cfg.Rules.Pair)); ok {
			return // kept: an operator's or an earlier member's
		}
	} else if e, ok := w.cached(failover.RulesKey(a.cfg.Rules.Pair, a.cfg.Site)); ok && e.Op == events.OpPut && bytes.Equal(e.Value, want) {
		return
	}
	select {
	case a.deps.publish <- struct{}{}:
	case <-a.ctx.Done():
		return
	}
	defer func() { <-a.deps.publish }()
	a.publishRules()
}

// publishRules makes the pair file's rules visible to operators (status,
// switchover). Unsecured, it writes them to <pair>.config when the key does
// not exist yet; an existing value — an operator's run-time tuning — is
// kept, and reaches the member through the watch like any change. In a
// secured deployment (a Trust) only operators may write <pair>.config, so
// the member publishes them under its own <pair>.rules.<site> instead,
// which no member applies.
func (a *memberActor) publishRules() {
	key := failover.ConfigKey(a.cfg.Rules.Pair)
	write := func(ctx context.Context) error {
		_, err := a.deps.KV.Create(ctx, key, failover.EncodeRules(a.cfg.Rules))
		return err
	}
	if a.deps.Trust != nil {
		key = failover.RulesKey(a.cfg.Rules.Pair, a.cfg.Site)
		write = func(ctx context.Context) error {
			_, err := a.deps.KV.Put(ctx, key, failover.EncodeRules(a.cfg.Rules))
			return err
		}
	}
	for attempt := 0; attempt < 20 && a.ctx.Err() == nil; attempt++ {
		ctx, cancel := context.WithTimeout(a.ctx, 2*time.Second)
		err := write(ctx)
		cancel()
		if err == nil || errors.Is(err, events.ErrConflict) {
			return
		}
		select {
		case <-time.After(250 * time.Millisecond):
		case <-a.ctx.Done():
		}
	}
}
