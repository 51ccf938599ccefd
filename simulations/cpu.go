package simulations

import (
	"time"

	"understudy/actors/procedure"
)

// A node's CPU (Config.CPU). Without it every input reaches its
// member the moment it arrives, whatever else the node does, and a
// procedure step runs from the moment it is asked for. A real node has a
// few cores: a 10,000-pair takeover on a 2-core machine spent them on
// starting one promote process per pair (fork and exec), and the node's
// own machinery — its members taking in answers, its liveness writer —
// waited behind those starts (docs/benchmarks.md, "Procedures on the
// survivor").
//
// The model (CPUModel): a machine has Cores cores. Every input a member
// or the liveness writer takes in (a timer, an answer or a watch
// delivery, a chain's result) costs StepCost of one core; starting a
// step's process costs StartCost. A core serves its work in arrival order:
// work that arrives while every core is busy waits for the core free
// first. A step runs from when its start was served. Starts are served
// at most StartLimit at once, in the order they were asked for (the
// runtime's procedure.StartLimit); unbounded (negative), each start is
// queued on the cores the moment it is asked for, as the runtime did
// before it bounded them, so a thousand starts asked at once stand before
// everything the node takes in after them.

// cpuCosts says whether the run models the nodes' CPU.
func (w *world) cpuCosts() bool { return w.cfg.CPU.StepCost > 0 }

func (w *world) cores() int {
	if w.cfg.CPU.Cores > 0 {
		return w.cfg.CPU.Cores
	}
	return 2
}

// startLimit is how many starts a machine serves at once (0: unbounded).
func (w *world) startLimit() int {
	switch l := w.cfg.CPU.StartLimit; {
	case l < 0:
		return 0
	case l > 0:
		return l
	}
	return 2 * w.cores() // procedure.DefaultStarts on HostCores cores
}

// cpuTake reserves cost of the machine's CPU for work arriving at t, on
// the core free first, and returns when the work starts.
func (m *machine) cpuTake(t, cost time.Duration, cores int) time.Duration {
	if len(m.cpu) != cores {
		m.cpu = make([]time.Duration, cores)
	}
	k := 0
	for i := range m.cpu {
		if m.cpu[i] < m.cpu[k] {
			k = i
		}
	}
	start := max(t, m.cpu[k])
	m.cpu[k] = start + cost
	return start
}

// cpuWait holds an input back until its machine has a core for it: it is
// queued again at that time, marked served, and cpuWait says so.
func (w *world) cpuWait(it item) bool {
	if !w.cpuCosts() || it.served {
		return false
	}
	switch it.kind {
	case evTick, evLiveTick, evDown, evProcDone:
	default:
		return false
	}
	m := w.machines[it.node]
	if !m.running || m.paused {
		return false // nothing takes it in now; dispatch drops or defers it
	}
	at := m.cpuTake(it.at, w.cfg.CPU.StepCost, w.cores())
	if at == it.at {
		return false
	}
	it.at, it.served = at, true
	w.push(it)
	return true
}

// startStep has the step of message ref (mStep, drawn by outcome) started
// on its machine: at once when a start slot is free, else when one frees.
func (w *world) startStep(m *machine, ref int32) {
	if l := w.startLimit(); l > 0 && m.starting >= l {
		m.startQ = append(m.startQ, ref)
		return
	}
	w.beginStart(m, ref)
}

// beginStart serves one start on the machine's CPU. A step whose chain
// moved on (cancelled) or whose deadline passed while it waited is not
// started, and takes no slot: the driver checks its context before it
// forks.
func (w *world) beginStart(m *machine, ref int32) {
	msg := &w.msgs[ref]
	n := w.pairs[msg.pair].nodes[m.idx]
	if msg.run != n.curRun || w.now >= msg.deadline {
		if msg.run == n.curRun {
			msg.outcome = procedure.Outcome{Result: procedure.ResultTimedOut, ExitCode: -1, Detail: "not started: its deadline passed while it waited to start"}
		}
		w.push(item{at: w.now, kind: evStepDone, node: int8(m.idx), ref: ref})
		return
	}
	m.starting++
	at := m.cpuTake(w.now, w.cfg.CPU.StartCost, w.cores()) + w.cfg.CPU.StartCost
	w.push(item{at: at, kind: evStarted, node: int8(m.idx), ref: ref, gen: uint64(m.inc)})
}

// started: a step's process has started; its start slot frees, and the
// step runs for the time outcome drew, to its deadline at most.
func (w *world) started(m *machine, it item) {
	if uint32(it.gen) != m.inc {
		w.release(it.ref) // the start of a process that died
		return
	}
	m.starting--
	msg := &w.msgs[it.ref]
	at := w.now + msg.took
	if at > msg.deadline && msg.outcome.Result != procedure.ResultTimedOut {
		at = max(msg.deadline, w.now)
		msg.outcome = procedure.Outcome{Result: procedure.ResultTimedOut, ExitCode: -1, Detail: "started late: killed at the step's deadline"}
	}
	w.push(item{at: at, kind: evStepDone, node: it.node, ref: it.ref})
	for len(m.startQ) > 0 && m.starting < w.startLimit() {
		ref := m.startQ[0]
		m.startQ = m.startQ[1:]
		w.beginStart(m, ref)
	}
}

// cpuRestart: a machine's process starts again with idle cores and no
// start waiting (the waiting ones died with the old process).
func (w *world) cpuRestart(m *machine) {
	for _, ref := range m.startQ {
		w.release(ref)
	}
	m.cpu, m.startQ, m.starting = nil, nil, 0
}
