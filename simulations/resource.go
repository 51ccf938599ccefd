package simulations

import (
	"time"

	"understudy/actors/failover"
	"understudy/actors/procedure"
)

// The simulated resource is a database whose procedure chains are run by
// the unmodified procedure.Runner. Each step has a nominal duration (a
// fraction of its timeout) and, under a FaultProc, fails, hangs (the driver
// reports a timeout at the deadline, as its contract says) or runs slow.
// A step that succeeds has its physical effect at that moment: a fence or
// demote step stops the database, a promote step makes it serve.

// stepModel is a step's nominal duration, as fractions of its timeout.
type stepModel struct{ lo, hi float64 }

var stepModels = map[procedure.ChainKind][]stepModel{
	procedure.ChainFence:   {{0.05, 0.4}, {0.05, 0.3}, {0.2, 0.8}},
	procedure.ChainPromote: {{0.025, 0.2}, {0.025, 0.2}},
	procedure.ChainDemote:  {{0.05, 0.25}, {0.02, 0.2}},
}

// procedureSpec is the resource's chains for rules. The fence chain fits
// in fence_grace with every escalation (0.35 + 0.2 + 0.25 of it) and ends
// with a power-off that cannot fail, as docs/failover.md requires.
func procedureSpec(r failover.Rules) procedure.Spec {
	fg := max(r.FenceGrace, time.Millisecond)
	step := func(name string, timeout time.Duration) procedure.StepSpec {
		return procedure.StepSpec{Name: name, Driver: "sim", Timeout: max(timeout, 100*time.Microsecond)}
	}
	return procedure.Spec{
		Fence: procedure.ChainSpec{Steps: []procedure.StepSpec{
			step("pg-stop-fast", fg*35/100), step("kill-postgres", fg*20/100), step("power-off", fg*25/100),
		}},
		Promote: procedure.ChainSpec{Steps: []procedure.StepSpec{
			step("pg-promote", 2*time.Second), step("pg-promote-retry", 2*time.Second),
		}},
		Demote: procedure.ChainSpec{Steps: []procedure.StepSpec{
			step("pg-stop", 2*time.Second), step("pg-stop-immediate", time.Second),
		}},
	}
}

// chainMax is the longest a chain can take: every step to its timeout.
func chainMax(c procedure.ChainSpec) time.Duration {
	var d time.Duration
	for _, st := range c.Steps {
		d += st.Timeout
	}
	return d
}

// procMode is the strongest procedure fault in force for a chain kind.
func (n *node) procMode(k procedure.ChainKind) ProcMode {
	for _, m := range []ProcMode{ProcFailAll, ProcFail, ProcHang, ProcSlow} {
		if n.proc[k][m] > 0 {
			return m
		}
	}
	return 0
}

// outcome decides how a step will end and after how long.
func (s *sim) outcome(n *node, run procedure.StepRun, final bool) (time.Duration, procedure.Outcome) {
	to := run.Step.Timeout
	models := stepModels[run.Kind]
	sm := models[min(run.Index, len(models)-1)]
	frac := func(lo, hi float64) time.Duration {
		return time.Duration((lo + (hi-lo)*n.rng.Float64()) * float64(to))
	}
	ok := procedure.Outcome{Result: procedure.ResultOK}
	failed := procedure.Outcome{Result: procedure.ResultFailed, ExitCode: 1, Detail: "simulated failure"}
	hung := procedure.Outcome{Result: procedure.ResultTimedOut, ExitCode: -1, Detail: "simulated hang: killed at the step's deadline"}
	protected := run.Kind == procedure.ChainFence && final
	switch n.procMode(run.Kind) {
	case ProcFailAll:
		return frac(0.01, 0.1), failed
	case ProcFail:
		if !protected {
			return frac(0.01, 0.2), failed
		}
	case ProcHang:
		if !protected {
			return to, hung
		}
	case ProcSlow:
		return frac(0.7, 0.95), ok
	}
	return frac(sm.lo, sm.hi), ok
}

// handleOut carries out what the procedure runner asks.
func (s *sim) handleOut(n *node, out procedure.Out) {
	for _, ev := range out.Events {
		s.onProcedureEvent(n, ev)
		s.appendEvent(n, 1, ev)
	}
	for _, id := range out.Cancel {
		if id == n.curRun {
			n.curRun = 0 // cancelled: its completion changes nothing
		}
	}
	for _, run := range out.Start {
		if run.Index == 0 && (run.Kind == procedure.ChainFence || run.Kind == procedure.ChainDemote) {
			s.stopStarted(n, run.Kind)
		}
		n.curRun = run.RunID
		final := run.Index == len(s.spec.Chain(run.Kind).Steps)-1
		d, o := s.outcome(n, run, final)
		ref := s.alloc(msg{kind: mStep, inc: n.inc, run: run.RunID, chain: run.Kind, final: final, outcome: o, pair: s.pi})
		if s.cpuCosts() && s.cfg.CPU.StartCost > 0 {
			m := &s.msgs[ref]
			m.took, m.deadline = d, s.now+run.Step.Timeout
			s.startStep(n.machine, ref)
			continue
		}
		s.push(item{at: s.now + d, kind: evStepDone, node: int8(n.idx), ref: ref})
	}
	if out.Done != nil {
		ref := s.alloc(msg{kind: mProcResult, inc: n.inc, done: *out.Done, pair: s.pi})
		s.push(item{at: s.now, kind: evProcDone, node: int8(n.idx), ref: ref})
	}
}

// stepDone: a step's driver reports. Its physical effect happens now, even
// while the member process is paused (the command runs on its own).
func (s *sim) stepDone(n *node, it item) {
	m := &s.msgs[it.ref]
	if !n.alive || m.inc != n.inc {
		s.release(it.ref)
		return
	}
	if !m.effect {
		m.effect = true
		if m.run == n.curRun && m.outcome.Result == procedure.ResultOK && s.db != nil {
			if ok, detail := s.dbStepEffect(n, m.chain); !ok {
				m.outcome = procedure.Outcome{Result: procedure.ResultFailed, ExitCode: 1, Detail: detail}
			}
		}
		if m.run == n.curRun && m.outcome.Result == procedure.ResultOK {
			switch m.chain {
			case procedure.ChainFence, procedure.ChainDemote:
				s.setServing(n, false, m.chain.String()+" step done")
			case procedure.ChainPromote:
				s.setServing(n, true, "promote step done")
			}
		}
	}
	if n.paused {
		n.deferred = append(n.deferred, it)
		return
	}
	res := procedure.StepResult{RunID: m.run, Outcome: m.outcome}
	s.release(it.ref)
	s.handleOut(n, n.runner.StepDone(n.clk.local(s.now), res))
}

func (s *sim) onProcedureEvent(n *node, ev any) {
	switch e := ev.(type) {
	case *procedure.StepFinished:
		if e.Result == procedure.ResultTimedOut {
			s.count(cStepHung)
		}
		if e.Kind == procedure.ChainFence && e.Result != procedure.ResultOK && e.Index+1 < len(s.spec.Fence.Steps) {
			s.count(cFenceEscalated)
		}
	case *procedure.ChainFinished:
		switch {
		case e.Superseded:
		case e.Kind == procedure.ChainFence && e.OK && e.Took > s.rules.HeartbeatTimeout:
			s.count(cFenceSlow)
		case e.Kind == procedure.ChainPromote && !e.OK:
			s.count(cPromoteFailed)
		case e.Kind == procedure.ChainDemote && !e.OK:
			s.count(cDemoteFailed)
		}
	}
}

// setServing changes whether a node's database serves, and checks that
// two never do at once.
func (s *sim) setServing(n *node, on bool, why string) {
	if n.serving == on {
		if on && n.stopping {
			// A promote completed on a database a stop had started on (the
			// stop was superseded): it is available again.
			n.stopping, n.stopMark = false, [2]int32{}
			s.inv.availabilityChanged(s, n, "")
		}
		return
	}
	wasAvailable := n.available()
	n.serving, n.stopping = on, false
	s.tr.u64(uint64(n.idx)<<1 | b2u(on))
	if on {
		n.servingSince, n.stopMark = s.now, [2]int32{}
		s.tracef(n.site, "resource SERVING (%s)", why)
	} else {
		s.tracef(n.site, "resource stopped (%s)", why)
	}
	s.inv.servingChanged(s, n)
	switch {
	case on:
		s.inv.availabilityChanged(s, n, "")
	case wasAvailable:
		s.inv.availabilityChanged(s, n, "down: "+why)
	}
}

// stopStarted: a fence or demote chain starts on a serving database; it
// stops being available now (see availabilityChanged).
func (s *sim) stopStarted(n *node, k procedure.ChainKind) {
	if !n.serving || n.stopping {
		return
	}
	n.stopping = true
	s.inv.availabilityChanged(s, n, "stop: "+k.String())
}

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}
