package runtime

import (
	"context"
	"fmt"
	"log/slog"
	"maps"

	"github.com/anthdm/hollywood/actor"
	"github.com/nats-io/nats.go/jetstream"

	"understudy/actors/agent"
	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/actors/resources/libvirt"
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

// Host runs pair members as hollywood actors on one NATS connection.
type Host struct {
	engine  *actor.Engine
	pids    []*actor.PID
	libvirt *libvirt.DriverProcess // the libvirt steps'; nil when HostOptions.Drivers were given
	Log     events.Log
	KV      events.KV
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
	h := &Host{engine: engine, Log: evlog, KV: kv}
	drivers := opts.Drivers
	if drivers == nil {
		h.libvirt = libvirt.NewDriverProcess(opts.LibvirtDriver, logger)
		drivers = DefaultDrivers(h.libvirt)
	}
	for _, mc := range members {
		deps := MemberDeps{Log: evlog, KV: kv, Drivers: drivers, Logger: logger, Observe: opts.Observe, Metrics: opts.Metrics}
		pid := engine.Spawn(NewMemberActor(mc, deps), "member", actor.WithID(mc.Rules.Pair+"."+mc.Site))
		h.pids = append(h.pids, pid)
		logger.Info("member started", "pair", mc.Rules.Pair, "site", mc.Site)
	}
	return h, nil
}

// Shutdown asks every leading member to hand over cleanly (demote, then
// leader = none naming the other site), waits until none holds the register
// or ctx ends, then stops them all.
func (h *Host) Shutdown(ctx context.Context) {
	var waits []<-chan struct{}
	for _, pid := range h.pids {
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
// running. It does not fence: a member stopping leaves its resource as it
// is, and the next start comes up fenced.
func (h *Host) Stop(ctx context.Context) {
	if h.libvirt != nil {
		defer h.libvirt.Close()
	}
	var waits []context.Context
	for _, pid := range h.pids {
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
