package runtime

import (
	"context"
	"log/slog"
	"time"

	"github.com/anthdm/hollywood/actor"

	"understudy/actors/procedure"
	"understudy/events"
)

// Messages of the resource actor.
type (
	runChain struct {
		kind procedure.ChainKind
		seq  uint64
	}
	stepDone     struct{ res procedure.StepResult }
	resourceTick struct{ gen uint64 }
	procDone     struct{ res procedure.ChainResult }
)

// resourceActor runs a member's procedure chains (fence, promote, demote,
// check) with a procedure.Runner: steps run on goroutines under their
// deadlines, escalate on failure, and every start and result is an event
// on ev.procedure.<pair>.<site>. It answers its parent with procDone.
type resourceActor struct {
	cfg    MemberConfig
	deps   MemberDeps
	log    *slog.Logger
	r      *procedure.Runner
	base   time.Time
	pid    *actor.PID
	parent *actor.PID
	engine *actor.Engine
	app    *appender
	cancel map[uint64]context.CancelFunc
	timer  *time.Timer
	gen    uint64
}

func newResourceActor(cfg MemberConfig, deps MemberDeps) actor.Producer {
	return func() actor.Receiver {
		logger := deps.Logger
		if logger == nil {
			logger = slog.Default()
		}
		return &resourceActor{cfg: cfg, deps: deps, log: logger.With("pair", cfg.Rules.Pair, "site", cfg.Site, "actor", "resource")}
	}
}

func (a *resourceActor) now() time.Duration { return time.Since(a.base) }

func (a *resourceActor) Receive(c *actor.Context) {
	switch msg := c.Message().(type) {
	case actor.Started:
		a.base, a.pid, a.parent, a.engine = time.Now(), c.PID(), c.Parent(), c.Engine()
		resource := a.cfg.Rules.Pair + "." + a.cfg.Site
		a.r = procedure.NewRunner(resource, a.cfg.Procedures)
		a.cancel = map[uint64]context.CancelFunc{}
		a.app = newAppender(a.deps.Log, procedure.Subject(resource), a.log)
		a.app.onAppended = func(ev events.Event, _ events.Ack) {
			if a.deps.Observe != nil {
				a.deps.Observe(Transition{Pair: a.cfg.Rules.Pair, Site: a.cfg.Site, Event: ev, At: time.Now()})
			}
		}
		a.app.onConflict = func(err error) { a.log.Error("resource events written by another process", "err", err) }
		a.app.start()
	case actor.Stopped:
		for _, cancel := range a.cancel {
			cancel()
		}
		if a.timer != nil {
			a.timer.Stop()
		}
		if a.app != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = a.app.flush(ctx)
			cancel()
			a.app.stop()
		}
	case runChain:
		a.handle(a.r.Run(a.now(), msg.kind, msg.seq))
	case stepDone:
		delete(a.cancel, msg.res.RunID)
		a.handle(a.r.StepDone(a.now(), msg.res))
	case resourceTick:
		if msg.gen == a.gen {
			a.handle(a.r.Tick(a.now()))
		}
	}
}

func (a *resourceActor) handle(out procedure.Out) {
	a.app.add(out.Events...)
	for _, id := range out.Cancel {
		if cancel, ok := a.cancel[id]; ok {
			cancel()
			delete(a.cancel, id)
		}
	}
	for _, run := range out.Start {
		ctx, cancel := context.WithTimeout(context.Background(), run.Deadline-a.now())
		a.cancel[run.RunID] = cancel
		go func(run procedure.StepRun) {
			defer cancel()
			o := a.deps.Drivers.Run(ctx, run.Step)
			a.engine.Send(a.pid, stepDone{procedure.StepResult{RunID: run.RunID, Outcome: o}})
		}(run)
	}
	if out.Done != nil {
		a.engine.Send(a.parent, procDone{*out.Done})
	}
	a.gen++
	if a.timer != nil {
		a.timer.Stop()
	}
	if at, ok := a.r.NextWake(); ok {
		gen := a.gen
		a.timer = time.AfterFunc(max(at-a.now(), time.Millisecond), func() { a.engine.Send(a.pid, resourceTick{gen}) })
	}
}
