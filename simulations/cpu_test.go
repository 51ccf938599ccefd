package simulations

import (
	"testing"
	"time"
)

// TestProcedureStartsStarveTheNode keeps the world's finding of a
// 10,000-pair node death on real NATS (run 31, d6c464f: the last register
// 13.2s after the kill, the last pair serving 19.8s after it; the same
// takeover with no promote process on the survivor: 6.3s and 6.5s). Each
// promotion started a process (`true`), all of them at once, and the
// survivor's own members waited behind those starts for its two cores.
//
// In the simulator: node leadership, 3,000 pairs a node, the store and
// the node's gate of TestTakeoverInWaves, and a CPU model — two cores a
// node, 20µs an input a member takes in, 1ms a process start. Unbounded
// (the runtime before d9f1761), every promote's start is queued on the
// cores the moment its member wins, and the acquires' answers and the
// members' timers behind them wait: pairs are taken over past
// failover_timeout + 2 × heartbeat_timeout. With the runtime's bound
// (procedure.StartLimit: two starts per core at once) the node's own work
// goes between the starts, and every pair is taken over within it.
func TestProcedureStartsStarveTheNode(t *testing.T) {
	const cut = takeoverCut
	cfg := takeoverSetting(t, 3000)
	cfg.CPU = CPUModel{StepCost: 20 * time.Microsecond, Cores: 2, StartCost: time.Millisecond}
	rules := DefaultPair()
	bound := rules.FailoverTimeout + 2*rules.HeartbeatTimeout

	old := cfg
	old.CPU.StartLimit = -1
	before, after := runBoth(t, old, cfg)
	beforeWon, beforeServing := takeoverSpan(before, cut)
	won, serving := takeoverSpan(after, cut)
	t.Logf("starts unbounded: the last register %v after the cut (serving %v), %d failed acquires; bounded: %v (serving %v), %d failed acquires",
		beforeWon, beforeServing, countOf(before, "acquire-failed"), won, serving, countOf(after, "acquire-failed"))
	if beforeWon <= bound {
		t.Errorf("starts unbounded: the last register %v after the cut; want past %v: the model no longer reproduces the starved node", beforeWon, bound)
	}
	if after.Failovers != cfg.Pairs || won > bound || serving < 0 {
		t.Errorf("starts bounded: %d failovers, the last register %v after the cut, serving %v; want %d within %v", after.Failovers, won, serving, cfg.Pairs, bound)
	}
	for _, v := range after.Violations {
		t.Errorf("starts bounded: %+v", v)
	}
}
