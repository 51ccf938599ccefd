package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/anthdm/hollywood/actor"

	"understudy/actors/capability"
	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/events"
)

// Messages of the workload actor.
type (
	runProc  struct{ p failover.Procedure }
	procDone struct {
		res failover.ProcedureResult
		gen uint64 // the exclusive call it ends (0: a check)
	}
)

// Timeouts of the workload's calls, beyond which the member hears a
// failure (the call's context is cancelled). Fence has the workload's
// fence budget; rejoin has none: a base backup takes as long as the
// database is large, and a later request cancels it.
const (
	promoteTimeout = 2 * time.Minute
	demoteTimeout  = 2 * time.Minute
	syncTimeout    = 30 * time.Second
	fenceFallback  = 30 * time.Second // a workload that states no fence budget
	checkTimeout   = 2 * time.Second
)

// recorder is a workload that records procedure events of its own (exec
// chains: every chain and step). setRecorder says whether it records its
// calls itself; the host records the calls of the others.
type recorder interface {
	setRecorder(func(...events.Event)) (recordsCalls bool)
}

// fenceBudgeter is a workload that states the worst case of its fence.
type fenceBudgeter interface{ FenceBudget() time.Duration }

// workloadActor calls a member's workload for each procedure the member
// asks for: fence, promote, demote, rejoin and sync one at a time (a later
// one cancels the one in flight, whose late result the member ignores),
// checks beside them. Every call but a check is recorded on the member's
// procedure subject. It answers its parent with procDone.
//
// It is written once for any capability.Workload: the type parameter is
// the compile-time proof that a workload has every capability the pair
// needs.
type workloadActor[W capability.Workload] struct {
	cfg      MemberConfig
	deps     MemberDeps
	w        W
	log      *slog.Logger
	resource string
	pid      *actor.PID
	parent   *actor.PID
	engine   *actor.Engine
	app      *appender
	gen      uint64             // the latest exclusive call
	cancel   context.CancelFunc // of the exclusive call in flight
	ctx      context.Context
	stop     context.CancelFunc
	// selfRecording: the workload records its calls' events itself.
	selfRecording bool
}

// newWorkloadActor returns the producer of a member's workload actor.
func newWorkloadActor[W capability.Workload](cfg MemberConfig, deps MemberDeps, w W) actor.Producer {
	return func() actor.Receiver {
		logger := deps.Logger
		if logger == nil {
			logger = slog.Default()
		}
		return &workloadActor[W]{cfg: cfg, deps: deps, w: w, log: logger.With("pair", cfg.Rules.Pair, "site", cfg.Site, "actor", "workload")}
	}
}

func (a *workloadActor[W]) Receive(c *actor.Context) {
	switch msg := c.Message().(type) {
	case actor.Started:
		a.pid, a.parent, a.engine = c.PID(), c.Parent(), c.Engine()
		a.ctx, a.stop = context.WithCancel(context.Background())
		a.resource = a.cfg.Rules.Pair + "." + a.cfg.Site
		a.app = newAppender(a.deps.Log, procedure.Subject(a.resource), a.log)
		a.app.onAppended = func(ev events.Event, _ events.Ack) {
			if a.deps.Observe != nil {
				a.deps.Observe(Transition{Pair: a.cfg.Rules.Pair, Site: a.cfg.Site, Event: ev, At: time.Now()})
			}
		}
		a.app.onConflict = func(err error) { a.log.Error("workload events written by another process", "err", err) }
		a.app.start()
		if r, ok := any(a.w).(recorder); ok {
			app := a.app
			a.selfRecording = r.setRecorder(func(evs ...events.Event) { app.add(evs...) })
		}
	case actor.Stopped:
		a.stop()
		if a.app != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = a.app.flush(ctx)
			cancel()
			a.app.stop()
		}
	case runProc:
		a.run(msg.p)
	case procDone:
		if msg.gen != 0 && msg.gen == a.gen {
			a.cancel = nil
		}
		a.engine.Send(a.parent, msg)
	}
}

// run starts one call on its own goroutine.
func (a *workloadActor[W]) run(p failover.Procedure) {
	req := capability.Request{Pair: a.cfg.Rules.Pair, Site: a.cfg.Site, Seq: p.Seq, Term: p.Term, Leader: p.Leader,
		Reason: p.Reason, Serving: p.Serving, Synchronous: p.Synchronous, Bootstrap: p.Bootstrap}
	if p.Kind == failover.ProcCheck {
		// A check that takes longer than a heartbeat delays the next one;
		// it fails only past 2 s (a loaded server answers late, and three
		// failed checks of a leader hand it over).
		timeout := max(a.cfg.Rules.HeartbeatTimeout, checkTimeout)
		selfBounded := a.selfRecording // exec chains bound their steps themselves
		go func() {
			ctx, cancel := context.WithTimeout(a.ctx, timeout)
			if selfBounded {
				ctx, cancel = context.WithCancel(a.ctx)
			}
			defer cancel()
			st, err := a.w.Check(ctx, req)
			res := failover.ProcedureResult{Kind: p.Kind, Seq: p.Seq, OK: err == nil}
			if err != nil {
				res.Detail = err.Error()
			}
			if st.Positions || st.Role != 0 {
				res.Status = &st
			}
			a.engine.Send(a.pid, procDone{res: res})
		}()
		return
	}
	if p.Kind == failover.ProcSync && a.cancel != nil {
		a.engine.Send(a.pid, procDone{res: failover.ProcedureResult{Kind: p.Kind, Seq: p.Seq, Detail: "refused: another procedure is in flight"}})
		return
	}
	if a.cancel != nil {
		a.cancel() // superseded: its late result is ignored by the member
	}
	a.gen++
	gen := a.gen
	var ctx context.Context
	var cancel context.CancelFunc
	if t := a.timeout(p.Kind); t > 0 {
		ctx, cancel = context.WithTimeout(a.ctx, t)
	} else {
		ctx, cancel = context.WithCancel(a.ctx)
	}
	a.cancel = cancel
	records := a.selfRecording
	kind := procedure.ChainKind(p.Kind)
	if !records {
		a.app.add(&procedure.ChainStarted{Resource: a.resource, Kind: kind, Seq: p.Seq, Steps: 1})
	}
	go func() {
		defer cancel()
		start := time.Now()
		err := a.call(ctx, p.Kind, req)
		res := failover.ProcedureResult{Kind: p.Kind, Seq: p.Seq, OK: err == nil}
		if err != nil {
			res.Detail = err.Error()
		}
		if !records {
			ev := &procedure.ChainFinished{Resource: a.resource, Kind: kind, Seq: p.Seq, OK: err == nil, Detail: res.Detail, Took: time.Since(start)}
			if err != nil && errors.Is(ctx.Err(), context.Canceled) && a.ctx.Err() == nil {
				ev.Superseded = true
			}
			a.app.add(ev)
		}
		a.engine.Send(a.pid, procDone{res: res, gen: gen})
	}()
}

func (a *workloadActor[W]) timeout(k failover.ProcKind) time.Duration {
	switch k {
	case failover.ProcFence:
		if fb, ok := any(a.w).(fenceBudgeter); ok && fb.FenceBudget() > 0 {
			return fb.FenceBudget() + procedure.StepOverrun
		}
		return fenceFallback
	case failover.ProcPromote:
		return promoteTimeout
	case failover.ProcDemote:
		return demoteTimeout
	case failover.ProcSync:
		return syncTimeout
	}
	return 0
}

func (a *workloadActor[W]) call(ctx context.Context, k failover.ProcKind, req capability.Request) error {
	switch k {
	case failover.ProcFence:
		return a.w.Fence(ctx, req)
	case failover.ProcPromote:
		return a.w.Promote(ctx, req)
	case failover.ProcDemote:
		return a.w.Demote(ctx, req)
	case failover.ProcRejoin:
		return a.w.Rejoin(ctx, req)
	case failover.ProcSync:
		s, ok := any(a.w).(capability.Synchronizer)
		if !ok {
			return errors.New("this workload cannot replicate synchronously")
		}
		return s.SetSynchronous(ctx, req)
	}
	return fmt.Errorf("unknown procedure kind %v", k)
}

// escalated is a workload whose fence escalates to exec chains when its
// own fails: the database's stop first, then the operator's steps (a
// STONITH, a network cut), as a fence chain escalates step by step.
type escalated[W capability.Workload] struct {
	w    W
	then *ExecChains
}

func (e escalated[W]) Fence(ctx context.Context, req capability.Request) error {
	err := e.w.Fence(ctx, req)
	if err == nil {
		return nil
	}
	if err2 := e.then.Fence(ctx, req); err2 != nil {
		return fmt.Errorf("%w; then the fence steps: %v", err, err2)
	}
	return nil
}

func (e escalated[W]) Promote(ctx context.Context, req capability.Request) error {
	return e.w.Promote(ctx, req)
}

func (e escalated[W]) Demote(ctx context.Context, req capability.Request) error {
	return e.w.Demote(ctx, req)
}

func (e escalated[W]) Rejoin(ctx context.Context, req capability.Request) error {
	return e.w.Rejoin(ctx, req)
}

func (e escalated[W]) Check(ctx context.Context, req capability.Request) (capability.Status, error) {
	return e.w.Check(ctx, req)
}

func (e escalated[W]) SetSynchronous(ctx context.Context, req capability.Request) error {
	s, ok := any(e.w).(capability.Synchronizer)
	if !ok {
		return errors.New("this workload cannot replicate synchronously")
	}
	return s.SetSynchronous(ctx, req)
}

func (e escalated[W]) Pet() {
	if p, ok := any(e.w).(capability.Watched); ok {
		p.Pet()
	}
}

// FenceBudget is the workload's fence and then the whole fence chain.
func (e escalated[W]) FenceBudget() time.Duration {
	var b time.Duration
	if fb, ok := any(e.w).(fenceBudgeter); ok {
		b = fb.FenceBudget()
	}
	return b + e.then.FenceBudget()
}

// setRecorder gives the fence steps their events; the workload's own
// calls are the host's to record.
func (e escalated[W]) setRecorder(f func(...events.Event)) bool {
	e.then.setRecorder(f)
	return false
}
