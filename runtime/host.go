package runtime

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/anthdm/hollywood/actor"
	"github.com/nats-io/nats.go/jetstream"

	"understudy/actors/agent"
	"understudy/actors/capability"
	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/actors/resources/libvirt"
	"understudy/capabilities/postgres"
	"understudy/capabilities/vm"
	"understudy/events"
)

// Codec returns a registry with every event type understudy records.
func Codec() *events.Registry {
	reg := events.NewRegistry()
	for _, register := range []func(*events.Registry) error{failover.RegisterEvents, procedure.RegisterEvents, agent.RegisterEvents} {
		if err := register(reg); err != nil {
			panic(fmt.Sprintf("runtime: event registration: %v", err)) // a programming error
		}
	}
	return reg
}

// DefaultDrivers are the procedure drivers of every node: exec, and the
// libvirt fence drivers (libvirt-destroy, libvirt-link-down) on lv — a
// libvirt.DriverProcess, which runs each of their steps in an
// understudy-libvirt process of its own (killed at the step's deadline
// without touching the steps of other pairs).
func DefaultDrivers(lv libvirt.Connector) procedure.Drivers {
	d := procedure.DefaultDrivers()
	maps.Copy(d, libvirt.FenceDrivers(lv))
	return d
}

// HostOptions tune a Host.
type HostOptions struct {
	Logger *slog.Logger
	// Drivers run the members' steps; nil: DefaultDrivers on a
	// libvirt.DriverProcess of the Host's own, which starts an
	// understudy-libvirt for each libvirt step; Stop kills those of steps
	// still running.
	Drivers procedure.Drivers
	// LibvirtDriver is where understudy-libvirt is (see
	// libvirt.DriverConfig; the node file's libvirt.driver).
	LibvirtDriver libvirt.DriverConfig
	Observe       func(Transition) // see MemberDeps.Observe
	Metrics       *MemberMetrics   // see MemberDeps.Metrics
	// Trust signs and verifies register values (NewValueTrust); nil: the
	// deployment has no security section. Members added later (AddMember,
	// the agent's postgres-pair kind) use it too.
	Trust *ValueTrust
	// Node is the node's name: with LeadershipNode, its liveness record's
	// (failover.LivenessKey), and every member's failover.Options.Node.
	Node string
	// Leadership of the members; zero: LeadershipPerPair. With
	// LeadershipNode every pair of the host must have one
	// heartbeat_timeout, and Node must be set.
	Leadership Leadership

	// wrapKV, when set, wraps the failover bucket (tests: a slow store).
	wrapKV func(events.KV) events.KV
}

// Host runs pair members as hollywood actors on one NATS connection, and
// restarts a member that stops for good while the node runs on (it comes
// up fenced, as every start does), after a backoff.
type Host struct {
	engine  *actor.Engine
	libvirt *libvirt.DriverProcess // the libvirt steps'; nil when HostOptions.Drivers were given
	Log     events.Log
	KV      events.KV
	gate    *storeGate    // Log's appends and the members' writes go through it
	steps   chan struct{} // members stepping at once (stepSlots)
	logger  *slog.Logger
	metrics *MemberMetrics

	// What AddMember needs to build and run a member as StartHost does.
	drivers procedure.Drivers
	lvcfg   libvirt.DriverConfig
	observe func(Transition)
	trust   *ValueTrust

	// node and leadership as HostOptions gave them; health is the store's
	// write latency as the node sees it; probe what the store sustained at
	// start (nil: not measured).
	node       string
	leadership Leadership
	health     *storeHealth
	probe      *StoreProbe
	// With LeadershipNode, once the first member is known: the node's
	// heartbeat_timeout, its watch, its liveness actor, the raises of
	// other nodes' epochs and the rules publications (a few at a time).
	interval time.Duration
	watch    *nodeWatch
	liveness *actor.PID
	raises   *raiseDeduper
	publish  chan struct{}

	mu       sync.Mutex
	slots    []*memberSlot
	stopping bool
	// adding: the members AddMember is building (pair/site), so that two
	// calls never build one member twice.
	adding map[string]bool
}

// Restart backoff of a stopped member: doubles from memberRestartMin to
// memberRestartMax, and starts over once a member has run for
// memberStableAfter.
const (
	memberRestartMin  = time.Second
	memberRestartMax  = time.Minute
	memberStableAfter = 5 * time.Minute
)

// memberSlot is one hosted member: its current actor and what stopped it.
type memberSlot struct {
	cfg     MemberConfig
	deps    MemberDeps
	pid     *actor.PID
	gen     int
	started time.Time
	// While stopped: why, since when, and when it restarts.
	stopped   bool
	reason    string
	since     time.Time
	restartAt time.Time
	stops     int
	backoff   time.Duration
	timer     *time.Timer
	// closer: the workload the host made for it (PostgreSQL's keeper and
	// server), closed once its member has stopped; nil for exec chains.
	closer io.Closer
	// dynamic: added by AddMember (the agent), not by the node file; only
	// those may be removed. removing: RemoveMember runs; removed is
	// closed when it is done.
	dynamic  bool
	removing bool
	removed  chan struct{}
}

// onceCloser closes its workload once: Stop and RemoveMember may both
// reach a member's.
type onceCloser struct {
	once sync.Once
	c    io.Closer
	err  error
}

func (o *onceCloser) Close() error {
	o.once.Do(func() { o.err = o.c.Close() })
	return o.err
}

// MemberState is what the node's health check reports of one member.
type MemberState struct {
	Pair    string `json:"pair"`
	Site    string `json:"site"`
	Running bool   `json:"running"`
	Stops   int    `json:"stops"` // since the node started
	// With Running false: why it stopped, since when, and when it restarts.
	Reason    string    `json:"reason,omitempty"`
	Since     time.Time `json:"since,omitzero"`
	RestartAt time.Time `json:"restart_at,omitzero"`
}

// Snapshots returns the latest snapshot of every hosted member that has
// one, in configuration order: a stopped member's last one stays, with
// Running false in Members.
func (h *Host) Snapshots() []MemberSnapshot {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []MemberSnapshot
	for _, sl := range h.slots {
		if v := sl.deps.Snapshot.Load(); v != nil {
			if sl.stopped {
				v2 := *v
				v2.Phase = failover.PhaseStarting // not running: nothing it says holds
				v = &v2
			}
			out = append(out, *v)
		}
	}
	return out
}

// Members reports every hosted member's state, in configuration order.
func (h *Host) Members() []MemberState {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]MemberState, 0, len(h.slots))
	for _, sl := range h.slots {
		st := MemberState{Pair: sl.cfg.Rules.Pair, Site: sl.cfg.Site, Running: !sl.stopped, Stops: sl.stops}
		if sl.stopped {
			st.Reason, st.Since, st.RestartAt = sl.reason, sl.since, sl.restartAt
		}
		out = append(out, st)
	}
	return out
}

// spawn starts slot's member actor. h.mu is held.
func (h *Host) spawn(sl *memberSlot) {
	sl.gen++
	gen := sl.gen
	deps := sl.deps
	deps.OnStop = func(reason string) { h.memberStopped(sl, gen, reason) }
	if h.leadership == LeadershipNode {
		deps.watch, deps.raises, deps.publish = h.watch, h.raises, h.publish
	}
	deps.gate, deps.steps = h.gate, h.steps
	id := sl.cfg.Rules.Pair + "." + sl.cfg.Site
	if gen > 1 {
		id = fmt.Sprintf("%s.%d", id, gen)
	}
	sl.pid = h.engine.Spawn(NewMemberActor(sl.cfg, deps), "member", actor.WithID(id))
	sl.started, sl.stopped = time.Now(), false
	sl.deps.replayed = nil // taken by the first actor
}

// memberStopped records that generation gen of slot's member stopped for
// good: in the log, the metrics and the event stream (HostSubject), and
// restarts it after the backoff.
func (h *Host) memberStopped(sl *memberSlot, gen int, reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if sl.gen != gen || sl.stopped || h.stopping || sl.removing {
		return
	}
	now := time.Now()
	switch {
	case sl.backoff == 0 || now.Sub(sl.started) >= memberStableAfter:
		sl.backoff = memberRestartMin
	default:
		sl.backoff = min(2*sl.backoff, memberRestartMax)
	}
	sl.stopped, sl.reason, sl.since, sl.restartAt = true, reason, now, now.Add(sl.backoff)
	sl.stops++
	pair, site := sl.cfg.Rules.Pair, sl.cfg.Site
	h.logger.Error("member stopped; the node restarts it, fenced", "pair", pair, "site", site,
		"reason", reason, "stops", sl.stops, "restart_in", sl.backoff)
	h.metrics.stopped(pair, site)
	ev := &failover.MemberStopped{Reason: reason, Stops: sl.stops, RestartIn: sl.backoff}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := h.Log.Append(ctx, failover.HostSubject(pair, site), ev, events.AppendOptions{}); err != nil {
			h.logger.Warn("member stop not recorded in the event stream", "pair", pair, "site", site, "err", err)
		}
	}()
	sl.timer = time.AfterFunc(sl.backoff, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.stopping || sl.gen != gen || !sl.stopped || sl.removing {
			return
		}
		h.logger.Info("member restarts", "pair", pair, "site", site, "after", sl.backoff)
		h.spawn(sl)
	})
}

// pids returns the running members' actors.
func (h *Host) pids() []*actor.PID {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*actor.PID
	for _, sl := range h.slots {
		if !sl.stopped {
			out = append(out, sl.pid)
		}
	}
	return out
}

// StartHost spawns one member actor per entry of members. The stream and
// bucket must exist (Provision creates them). More members may be added
// and removed while it runs (AddMember, RemoveMember).
func StartHost(ctx context.Context, js jetstream.JetStream, stream, bucket string, members []MemberConfig, opts HostOptions) (*Host, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	var evlog *events.JetStreamLog
	var jkv *events.JetStreamKV
	err := retryOpen(ctx, logger, func() (err error) {
		if evlog == nil {
			if evlog, err = events.NewJetStreamLog(js, stream, Codec()); err != nil {
				return err
			}
		}
		jkv, err = events.NewJetStreamKV(ctx, js, bucket)
		return err
	})
	if err != nil {
		return nil, err
	}
	var kv events.KV = jkv
	if opts.wrapKV != nil {
		kv = opts.wrapKV(kv)
	}
	if opts.Node == "" && opts.Trust != nil {
		opts.Node = opts.Trust.node // its key signs as that node
	}
	leadership := opts.Leadership
	if leadership == 0 {
		leadership = LeadershipPerPair
	}
	if leadership == LeadershipNode {
		if err := failover.CheckName(opts.Node); err != nil {
			return nil, &ConfigError{Field: "node", Rule: "must be set with leadership: node, and " + err.Error(), Value: opts.Node}
		}
		if err := checkOneHeartbeat(members, func(int) string { return "heartbeat_timeout" }); err != nil {
			return nil, err
		}
	}
	gate := newStoreGate()
	gate.metrics = opts.Metrics
	gate.onRefused = func(err error) {
		logger.Warn("the store did not take a batch of writes: members' writes go one at a time for a while (if the bucket or the events stream lacks allow_atomic, provisioning sets it)",
			"err", err, "retry_after", batchRetry)
	}
	h := &Host{Log: boundedLog{Log: evlog, gate: gate}, gate: gate, steps: stepSlots(), KV: kv, logger: logger, metrics: opts.Metrics,
		lvcfg: opts.LibvirtDriver, observe: opts.Observe, trust: opts.Trust, adding: map[string]bool{},
		node: opts.Node, leadership: leadership, health: newStoreHealth(logger.With("component", "store-health"), opts.Metrics),
	}
	if err := h.checkStore(ctx, members); err != nil {
		return nil, err
	}
	engine, err := actor.NewEngine(actor.NewEngineConfig())
	if err != nil {
		return nil, fmt.Errorf("runtime: actor engine: %w", err)
	}
	h.engine = engine
	h.drivers = opts.Drivers
	if h.drivers == nil {
		h.libvirt = libvirt.NewDriverProcess(opts.LibvirtDriver, logger)
		h.drivers = DefaultDrivers(h.libvirt)
	}
	slots := make([]*memberSlot, 0, len(members))
	for _, mc := range members {
		mc, closer, err := h.workload(mc)
		if err != nil {
			for _, sl := range slots {
				h.closeWorkload(sl)
			}
			return nil, err
		}
		slots = append(slots, h.newSlot(mc, closer))
	}
	replayMembers(ctx, h.Log, slots, logger)
	h.mu.Lock()
	if h.leadership == LeadershipNode && len(members) > 0 {
		h.startNode(members[0].Rules.HeartbeatTimeout)
	}
	h.mu.Unlock()
	h.startMembers(slots)
	if len(slots) <= 100 {
		for _, sl := range slots {
			logger.Info("member started", "pair", sl.cfg.Rules.Pair, "site", sl.cfg.Site)
		}
	} else {
		logger.Info("members started", "members", len(slots))
	}
	return h, nil
}

// Members start in waves of startWave. Before the next wave, the host
// waits — at most startWaveWait — until the store has taken what the last
// one asked of it (appends and register writes in flight back under
// their bounds): every member's start costs a fence chain, a register
// decision and about a dozen appends, and a node that starts thousands at
// once queues them all ahead of its members' first register writes and
// its own liveness write, so that starting looks like a failing store.
const (
	startWave     = 64
	startWaveWait = time.Second
)

// startMembers spawns the slots' members, wave by wave, without holding
// h.mu between waves (the node's endpoints read the slots meanwhile).
func (h *Host) startMembers(slots []*memberSlot) {
	for i := 0; i < len(slots); i += startWave {
		if i > 0 {
			h.settle(startWaveWait)
		}
		h.mu.Lock()
		if h.stopping {
			h.mu.Unlock()
			return
		}
		for _, sl := range slots[i:min(i+startWave, len(slots))] {
			h.slots = append(h.slots, sl)
			h.spawn(sl)
		}
		h.mu.Unlock()
	}
}

// settle waits until the host's appends and member writes in flight are
// back within their bounds, or for at most wait.
func (h *Host) settle(wait time.Duration) {
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		if h.gate.settled() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// checkStore probes the store's write rate (StoreProbe) and refuses, with
// per-pair leadership, members it cannot heartbeat (CapacityError). A
// probe that fails (the store does not answer now) refuses nothing: the
// members start and ride it out, as they would a store lost later.
func (h *Host) checkStore(ctx context.Context, members []MemberConfig) error {
	p, err := probeStore(ctx, h.KV, probeKey(h.node))
	if err != nil {
		h.logger.Warn("store write rate not measured at start; members start without the capacity check", "err", err)
		return nil
	}
	h.probe = &p
	need := heartbeatWrites(members)
	if h.leadership == LeadershipNode {
		if len(members) > 0 {
			need = float64(time.Second) / float64(members[0].Rules.HeartbeatTimeout)
		}
		h.logger.Info("store write rate measured", "leadership", h.leadership.String(), "members", len(members),
			"heartbeat_writes_per_second", round1(need), "store_writes_per_second", round1(p.PerSecond), "burst_writes_per_second", round1(p.Burst), "write_latency", p.Latency)
		return nil
	}
	if err := checkCapacity(h.probe, members); err != nil {
		h.logger.Error("refusing to start: the store cannot heartbeat this node's members", "err", err)
		return err
	}
	h.logger.Info("store write rate measured", "leadership", h.leadership.String(), "members", len(members),
		"heartbeat_writes_per_second", round1(need), "store_writes_per_second", round1(p.PerSecond), "burst_writes_per_second", round1(p.Burst), "write_latency", p.Latency,
		"share_used", fmt.Sprintf("%.0f%%", 100*need/p.Burst))
	return nil
}

func round1(f float64) float64 { return float64(int64(f*10+0.5)) / 10 }

// startNode starts what leadership: node needs once the node's
// heartbeat_timeout is known: its watch, the raises' deduplication and its
// liveness actor. h.mu is held (or the host is not shared yet).
func (h *Host) startNode(interval time.Duration) {
	if h.watch != nil {
		return
	}
	h.interval = interval
	h.watch = newNodeWatch(h.KV, h.trust, h.node, interval, h.logger)
	watch := h.watch
	seen := func(key string) uint64 {
		e, _ := watch.cached(key)
		return e.Revision
	}
	h.gate.seen.Store(&seen)
	h.watch.start()
	h.raises = newRaiseDeduper(h.KV, h.trust, interval)
	h.publish = make(chan struct{}, 4) // a few rules publications at a time
	h.liveness = h.engine.Spawn(newLivenessActor(h.node, interval, h.KV, h.trust, h.watch, h.health, h.gate, h.logger), "liveness", actor.WithID(h.node))
	h.logger.Info("node liveness started", "node", h.node, "key", failover.LivenessKey(h.node), "heartbeat_timeout", interval)
}

// StoreHealth reports the store's write latency as the node sees it.
func (h *Host) StoreHealth() StoreHealth { return h.health.snapshot() }

// Probe reports what the store sustained at start (false: not measured).
func (h *Host) Probe() (StoreProbe, bool) {
	if h.probe == nil {
		return StoreProbe{}, false
	}
	return *h.probe, true
}

// Raises reports the raises of other nodes' epochs the node's members
// made (leadership: node): written, and answered by an identical raise's
// write instead.
func (h *Host) Raises() (written, joined uint64) {
	h.mu.Lock()
	r := h.raises
	h.mu.Unlock()
	if r == nil {
		return 0, 0
	}
	return r.written.Load(), r.joined.Load()
}

func (h *Host) newSlot(mc MemberConfig, closer io.Closer) *memberSlot {
	sl := &memberSlot{cfg: mc, deps: MemberDeps{Log: h.Log, KV: h.KV, Drivers: h.drivers, Logger: h.logger, Observe: h.observe, Metrics: h.metrics,
		Snapshot: &MemberSnapshotter{}, Trust: h.trust}}
	if h.leadership == LeadershipNode {
		sl.cfg.Options.Node = h.node
	} else {
		sl.deps.health = h.health
	}
	if closer != nil {
		sl.closer = &onceCloser{c: closer}
	}
	return sl
}

// ErrHostStopped: the host is stopping; it starts no member any more.
var ErrHostStopped = errors.New("runtime: the node's failover host is stopping")

// slot returns the slot of pair's member site, nil if none. h.mu is held.
func (h *Host) slot(pair, site string) *memberSlot {
	for _, sl := range h.slots {
		if sl.cfg.Rules.Pair == pair && sl.cfg.Site == site {
			return sl
		}
	}
	return nil
}

// AddMember starts one more member while the host runs (the agent's
// postgres-pair kind does): its workload is made as StartHost makes it
// (a PostgreSQL's keeper is started, a foreign server stopped), fence_grace
// is checked against the workload's fence, and the member is restarted
// after a backoff if it stops, like the others. mc is copied. It fails if
// pair/site is hosted already (by the node file or an earlier AddMember),
// or the host is stopping (ErrHostStopped). Safe for concurrent use; it
// blocks while the workload starts (seconds), never while another member
// is added or removed.
func (h *Host) AddMember(mc MemberConfig) error {
	key := mc.Rules.Pair + "/" + mc.Site
	h.mu.Lock()
	switch {
	case h.stopping:
		h.mu.Unlock()
		return ErrHostStopped
	case h.slot(mc.Rules.Pair, mc.Site) != nil || h.adding[key]:
		h.mu.Unlock()
		return fmt.Errorf("runtime: member %s is hosted already on this node (its node file's pairs, or another resource): remove it first", key)
	}
	if err := h.admits(mc); err != nil {
		h.mu.Unlock()
		return err
	}
	h.adding[key] = true
	h.mu.Unlock()
	mc, closer, err := h.workload(mc)
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.adding, key)
	if err != nil {
		return err
	}
	sl := h.newSlot(mc, closer)
	sl.dynamic = true
	if h.stopping {
		h.closeWorkload(sl)
		return ErrHostStopped
	}
	if err := h.admits(mc); err != nil { // another AddMember may have come first
		h.closeWorkload(sl)
		return err
	}
	if h.leadership == LeadershipNode {
		h.startNode(mc.Rules.HeartbeatTimeout)
	}
	h.slots = append(h.slots, sl)
	h.spawn(sl)
	h.logger.Info("member added", "pair", mc.Rules.Pair, "site", mc.Site)
	return nil
}

// admits says why the host cannot take one more member mc (nil when it
// can): with leadership: node, a heartbeat_timeout other than the node's;
// with per-pair leadership, more heartbeat writes than the store sustains
// (CapacityError). h.mu is held.
func (h *Host) admits(mc MemberConfig) error {
	if h.leadership == LeadershipNode {
		if h.interval != 0 && mc.Rules.HeartbeatTimeout != h.interval {
			other := failover.Rules{Pair: "(the node's first pair)", HeartbeatTimeout: h.interval}
			if len(h.slots) > 0 {
				other = h.slots[0].cfg.Rules
			}
			return heartbeatMismatch("heartbeat_timeout", other, mc.Rules)
		}
		return nil
	}
	all := make([]MemberConfig, 0, len(h.slots)+1)
	for _, sl := range h.slots {
		all = append(all, sl.cfg)
	}
	return checkCapacity(h.probe, append(all, mc))
}

// RemoveMember stops a member AddMember added, for good: a leading member
// first hands over cleanly (as at a node's shutdown, waiting at most its
// fence_grace and three heartbeats, 5 s at least, or until ctx ends), then
// its actor stops and its workload is closed (a PostgreSQL
// is shut down; its data directory stays). Removing a member that is not
// hosted succeeds; one of the node file is refused. Safe for concurrent
// use: a second call for the same member waits for the first.
func (h *Host) RemoveMember(ctx context.Context, pair, site string) error {
	h.mu.Lock()
	sl := h.slot(pair, site)
	switch {
	case sl == nil:
		h.mu.Unlock()
		return nil
	case !sl.dynamic:
		h.mu.Unlock()
		return fmt.Errorf("runtime: member %s/%s comes from the node file's pairs: change the node file to remove it", pair, site)
	case sl.removing:
		h.mu.Unlock()
		select {
		case <-sl.removed:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	sl.removing, sl.removed = true, make(chan struct{})
	if sl.timer != nil {
		sl.timer.Stop()
	}
	pid, running := sl.pid, !sl.stopped && !h.stopping
	h.mu.Unlock()
	if running {
		// The hand-over is bounded as at a node's shutdown: a replica that
		// never gets ready must not keep the member forever.
		hctx, cancel := context.WithTimeout(ctx, memberHandoverWindow([]MemberConfig{sl.cfg}))
		done := make(chan struct{})
		h.engine.Send(pid, memberShutdown{done: done})
		select {
		case <-done:
		case <-hctx.Done():
			h.logger.Warn("member removed before its hand-over finished", "pair", pair, "site", site)
		}
		cancel()
		<-h.engine.Poison(pid).Done()
	}
	h.closeWorkload(sl)
	h.mu.Lock()
	h.slots = slices.DeleteFunc(h.slots, func(x *memberSlot) bool { return x == sl })
	close(sl.removed)
	h.mu.Unlock()
	h.logger.Info("member removed", "pair", pair, "site", site)
	return nil
}

// Hosted is what the host knows of one member: its configuration (with
// its workload), whether AddMember added it, its state and its latest
// snapshot (nil before its first step).
type Hosted struct {
	Config   MemberConfig
	Dynamic  bool
	State    MemberState
	Snapshot *MemberSnapshot
}

// Member reports pair's member site; false when it is not hosted (or
// being removed).
func (h *Host) Member(pair, site string) (Hosted, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sl := h.slot(pair, site)
	if sl == nil || sl.removing {
		return Hosted{}, false
	}
	st := MemberState{Pair: pair, Site: site, Running: !sl.stopped, Stops: sl.stops}
	if sl.stopped {
		st.Reason, st.Since, st.RestartAt = sl.reason, sl.since, sl.restartAt
	}
	return Hosted{Config: sl.cfg, Dynamic: sl.dynamic, State: st, Snapshot: sl.deps.Snapshot.Load()}, true
}

// workload makes mc's workload from its postgres or vm section (exec
// chains otherwise, made by the member), with the fence steps of its
// procedures as the escalation of its own fence, and checks that
// fence_grace covers the fence's worst case. The closer, when not nil,
// ends the workload (its host closes it once the member has stopped).
func (h *Host) workload(mc MemberConfig) (MemberConfig, io.Closer, error) {
	resource := mc.Rules.Pair + "." + mc.Site
	drivers := h.drivers
	var w capability.Workload
	var closer io.Closer
	switch {
	case mc.Postgres != nil:
		pg, err := postgres.New(*mc.Postgres, postgres.Member{Pair: mc.Rules.Pair, Site: mc.Site, PeerSite: mc.Rules.Other(mc.Site),
			FenceGrace: mc.Rules.FenceGrace, Logger: h.logger.With("pair", mc.Rules.Pair, "site", mc.Site, "workload", "postgres")})
		if err != nil {
			return mc, nil, fmt.Errorf("pair %s member %s: postgres: %w", mc.Rules.Pair, mc.Site, err)
		}
		closer = pg
		w = pg
		if len(mc.Procedures.Fence.Steps) > 0 {
			w = escalated[*postgres.Postgres]{w: pg, then: NewExecChains(resource, mc.Procedures, drivers)}
		}
	case mc.VM != nil:
		v, err := vm.New(*mc.VM, h.libvirtProcess(), h.logger.With("pair", mc.Rules.Pair, "site", mc.Site, "workload", "vm"))
		if err != nil {
			return mc, nil, fmt.Errorf("pair %s member %s: vm: %w", mc.Rules.Pair, mc.Site, err)
		}
		w = v
		if len(mc.Procedures.Fence.Steps) > 0 {
			w = escalated[*vm.VM]{w: v, then: NewExecChains(resource, mc.Procedures, drivers)}
		}
	default:
		return mc, nil, nil
	}
	if fb, ok := w.(fenceBudgeter); ok {
		if err := mc.Rules.CheckFenceBudget(fb.FenceBudget()); err != nil {
			if closer != nil {
				_ = closer.Close()
			}
			return mc, nil, fmt.Errorf("pair %s member %s: %w", mc.Rules.Pair, mc.Site, err)
		}
	}
	mc.Workload = w
	return mc, closer, nil
}

// libvirtProcess returns the host's understudy-libvirt process for VM
// workloads, made on first use.
func (h *Host) libvirtProcess() *libvirt.DriverProcess {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.libvirt == nil {
		h.libvirt = libvirt.NewDriverProcess(h.lvcfg, h.logger)
	}
	return h.libvirt
}

// closeWorkload closes sl's workload, if it has one.
func (h *Host) closeWorkload(sl *memberSlot) {
	if sl.closer == nil {
		return
	}
	if err := sl.closer.Close(); err != nil {
		h.logger.Warn("workload did not close cleanly", "pair", sl.cfg.Rules.Pair, "site", sl.cfg.Site, "err", err)
	}
}

func (h *Host) closeWorkloads() {
	h.mu.Lock()
	slots := slices.Clone(h.slots)
	h.mu.Unlock()
	for _, sl := range slots {
		h.closeWorkload(sl)
	}
}

// Shutdown asks every leading member to hand over cleanly (demote, then
// leader = none naming the other site), waits until none holds the register
// or ctx ends, then stops them all.
func (h *Host) Shutdown(ctx context.Context) {
	var waits []<-chan struct{}
	for _, pid := range h.pids() {
		done := make(chan struct{})
		h.engine.Send(pid, memberShutdown{done: done})
		waits = append(waits, done)
	}
	for _, w := range waits {
		select {
		case <-w:
		case <-ctx.Done():
		}
	}
	h.Stop(context.Background())
}

// Stop stops every member (their resources with them) and waits for them,
// then kills the understudy-libvirt processes of libvirt steps still
// running. It does not fence exec chains or VMs: a member stopping leaves
// them as they are, and the next start comes up fenced. A PostgreSQL,
// which must not outlive its node, is stopped.
func (h *Host) Stop(ctx context.Context) {
	h.mu.Lock()
	lv := h.libvirt
	h.mu.Unlock()
	if lv != nil {
		defer lv.Close()
	}
	defer h.closeWorkloads()
	defer h.gate.stop() // after the members: a hand-over writes the register
	h.mu.Lock()
	h.stopping = true
	for _, sl := range h.slots {
		if sl.timer != nil {
			sl.timer.Stop()
		}
	}
	h.mu.Unlock()
	var waits []context.Context
	for _, pid := range h.pids() {
		waits = append(waits, h.engine.Poison(pid))
	}
	for _, w := range waits {
		select {
		case <-w.Done():
		case <-ctx.Done():
			return
		}
	}
	// The node's liveness beats until its members are gone: their leases
	// (a leader's hand-over included) live on it.
	h.mu.Lock()
	liveness, watch := h.liveness, h.watch
	h.mu.Unlock()
	if liveness != nil {
		select {
		case <-h.engine.Poison(liveness).Done():
		case <-ctx.Done():
			return
		}
	}
	if watch != nil {
		watch.stop()
	}
}

// openRetryFor bounds how long StartHost waits for the assets to answer.
const openRetryFor = 30 * time.Second

// retryOpen runs open until it succeeds, fails for good, or openRetryFor
// passes: looking up a stream needs its leader (and, in a cluster, the
// meta leader), which a restarted node's server may still be electing.
// An asset that does not exist, or a refusal, is final.
func retryOpen(ctx context.Context, logger *slog.Logger, open func() error) error {
	deadline := time.Now().Add(openRetryFor)
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		err := open()
		if err == nil || errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) ||
			!retryableProvisionError(err) || time.Now().After(deadline) {
			return err
		}
		logger.Warn("the assets do not answer yet; retrying", "err", err, "retry_in", wait)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}
