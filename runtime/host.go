package runtime

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
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
}

// Host runs pair members as hollywood actors on one NATS connection, and
// restarts a member that stops for good while the node runs on (it comes
// up fenced, as every start does), after a backoff.
type Host struct {
	engine  *actor.Engine
	libvirt *libvirt.DriverProcess // the libvirt steps'; nil when HostOptions.Drivers were given
	Log     events.Log
	KV      events.KV
	logger  *slog.Logger
	metrics *MemberMetrics

	mu       sync.Mutex
	slots    []*memberSlot
	stopping bool
	// closers: the workloads the host made (PostgreSQL's keeper and
	// server), closed once every member has stopped.
	closers []io.Closer
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
	id := sl.cfg.Rules.Pair + "." + sl.cfg.Site
	if gen > 1 {
		id = fmt.Sprintf("%s.%d", id, gen)
	}
	sl.pid = h.engine.Spawn(NewMemberActor(sl.cfg, deps), "member", actor.WithID(id))
	sl.started, sl.stopped = time.Now(), false
}

// memberStopped records that generation gen of slot's member stopped for
// good: in the log, the metrics and the event stream (HostSubject), and
// restarts it after the backoff.
func (h *Host) memberStopped(sl *memberSlot, gen int, reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if sl.gen != gen || sl.stopped || h.stopping {
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
		if h.stopping || sl.gen != gen || !sl.stopped {
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
// bucket must exist (Provision creates them).
func StartHost(ctx context.Context, js jetstream.JetStream, stream, bucket string, members []MemberConfig, opts HostOptions) (*Host, error) {
	logger := opts.Logger
	if logger == nil {
		logger = slog.Default()
	}
	evlog, err := events.NewJetStreamLog(js, stream, Codec())
	if err != nil {
		return nil, err
	}
	kv, err := events.NewJetStreamKV(ctx, js, bucket)
	if err != nil {
		return nil, err
	}
	engine, err := actor.NewEngine(actor.NewEngineConfig())
	if err != nil {
		return nil, fmt.Errorf("runtime: actor engine: %w", err)
	}
	h := &Host{engine: engine, Log: evlog, KV: kv, logger: logger, metrics: opts.Metrics}
	drivers := opts.Drivers
	if drivers == nil {
		h.libvirt = libvirt.NewDriverProcess(opts.LibvirtDriver, logger)
		drivers = DefaultDrivers(h.libvirt)
	}
	workloads := make([]MemberConfig, 0, len(members))
	for _, mc := range members {
		mc, err := h.workload(mc, drivers, opts.LibvirtDriver)
		if err != nil {
			h.closeWorkloads()
			return nil, err
		}
		workloads = append(workloads, mc)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, mc := range workloads {
		sl := &memberSlot{cfg: mc, deps: MemberDeps{Log: evlog, KV: kv, Drivers: drivers, Logger: logger, Observe: opts.Observe, Metrics: opts.Metrics,
			Snapshot: &MemberSnapshotter{}}}
		h.slots = append(h.slots, sl)
		h.spawn(sl)
		logger.Info("member started", "pair", mc.Rules.Pair, "site", mc.Site)
	}
	return h, nil
}

// workload makes mc's workload from its postgres or vm section (exec
// chains otherwise, made by the member), with the fence steps of its
// procedures as the escalation of its own fence, and checks that
// fence_grace covers the fence's worst case.
func (h *Host) workload(mc MemberConfig, drivers procedure.Drivers, lv libvirt.DriverConfig) (MemberConfig, error) {
	resource := mc.Rules.Pair + "." + mc.Site
	var w capability.Workload
	switch {
	case mc.Postgres != nil:
		pg, err := postgres.New(*mc.Postgres, postgres.Member{Pair: mc.Rules.Pair, Site: mc.Site, PeerSite: mc.Rules.Other(mc.Site),
			FenceGrace: mc.Rules.FenceGrace, Logger: h.logger.With("pair", mc.Rules.Pair, "site", mc.Site, "workload", "postgres")})
		if err != nil {
			return mc, fmt.Errorf("pair %s member %s: postgres: %w", mc.Rules.Pair, mc.Site, err)
		}
		h.closers = append(h.closers, pg)
		w = pg
		if len(mc.Procedures.Fence.Steps) > 0 {
			w = escalated[*postgres.Postgres]{w: pg, then: NewExecChains(resource, mc.Procedures, drivers)}
		}
	case mc.VM != nil:
		if h.libvirt == nil {
			h.libvirt = libvirt.NewDriverProcess(lv, h.logger)
		}
		v, err := vm.New(*mc.VM, h.libvirt, h.logger.With("pair", mc.Rules.Pair, "site", mc.Site, "workload", "vm"))
		if err != nil {
			return mc, fmt.Errorf("pair %s member %s: vm: %w", mc.Rules.Pair, mc.Site, err)
		}
		w = v
		if len(mc.Procedures.Fence.Steps) > 0 {
			w = escalated[*vm.VM]{w: v, then: NewExecChains(resource, mc.Procedures, drivers)}
		}
	default:
		return mc, nil
	}
	if fb, ok := w.(fenceBudgeter); ok {
		if err := mc.Rules.CheckFenceBudget(fb.FenceBudget()); err != nil {
			return mc, fmt.Errorf("pair %s member %s: %w", mc.Rules.Pair, mc.Site, err)
		}
	}
	mc.Workload = w
	return mc, nil
}

func (h *Host) closeWorkloads() {
	for _, c := range h.closers {
		if err := c.Close(); err != nil {
			h.logger.Warn("workload did not close cleanly", "err", err)
		}
	}
	h.closers = nil
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
	if h.libvirt != nil {
		defer h.libvirt.Close()
	}
	defer h.closeWorkloads()
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
}
