package procedure

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestRunnerProperties feeds random Runs, step results (current, late and
// unknown) and Ticks, and checks after every input: at most one chain and
// one step are live (a refused check starts and ends within one input); every started step ends exactly once, by an event or
// a cancel; Done answers exactly the chain that ended unsuperseded; texts
// in events are bounded.
func TestRunnerProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var spec Spec
		for kind := ChainFence; kind <= ChainCheck; kind++ {
			lo := 0
			if kind == ChainFence {
				lo = 1
			}
			n := rapid.IntRange(lo, 3).Draw(t, kind.String()+"-steps")
			var steps []StepSpec
			for i := range n {
				steps = append(steps, StepSpec{Name: fmt.Sprint(kind, i), Driver: "exec", Timeout: time.Duration(i+1) * time.Second, Exec: &ExecSpec{Command: "x"}})
			}
			*spec.chainPtr(kind) = ChainSpec{Steps: steps}
		}
		if err := spec.Validate(); err != nil {
			t.Fatal(err)
		}
		r := NewRunner("res", spec)

		var now time.Duration
		var seq, lastRun uint64
		live := map[uint64]bool{} // started runs not yet finished or cancelled
		var started []uint64
		type key struct {
			kind ChainKind
			seq  uint64
		}
		open := map[key]bool{} // chains started and not finished

		for range rapid.IntRange(1, 60).Draw(t, "inputs") {
			now += rapid.SampledFrom([]time.Duration{0, 100 * time.Millisecond, time.Second, 7 * time.Second}).Draw(t, "dt")
			var out Out
			switch rapid.IntRange(0, 3).Draw(t, "op") {
			case 0:
				if rapid.Bool().Draw(t, "new-seq") || seq == 0 {
					seq++
				}
				out = r.Run(now, rapid.SampledFrom([]ChainKind{ChainFence, ChainPromote, ChainDemote, ChainCheck}).Draw(t, "kind"), seq)
			case 1, 2:
				id := lastRun + 1 // unknown
				if len(started) > 0 && rapid.IntRange(0, 4).Draw(t, "pick") > 0 {
					id = started[len(started)-1]
					if rapid.Bool().Draw(t, "late") {
						id = rapid.SampledFrom(started).Draw(t, "old")
					}
				}
				o := Outcome{
					Result: rapid.SampledFrom([]OutcomeResult{ResultOK, ResultFailed, ResultTimedOut}).Draw(t, "result"),
					Detail: strings.Repeat("é", rapid.IntRange(0, 5000).Draw(t, "detail")),
				}
				out = r.StepDone(now, StepResult{RunID: id, Outcome: o})
				if !live[id] && (len(out.Events) > 0 || len(out.Start) > 0 || out.Done != nil) {
					t.Fatalf("result for run %d that is not live changed something: %+v", id, out)
				}
			case 3:
				out = r.Tick(now)
			}

			// A step result ends the one live run; a cancel names a run that
			// was live before this input (Tick does both to the same run).
			finished := 0
			for _, ev := range out.Events {
				if _, ok := ev.(*StepFinished); ok {
					finished++
				}
			}
			if finished > 1 || (finished == 1 && len(live) != 1) {
				t.Fatalf("%d step results with %d live runs", finished, len(live))
			}
			for _, id := range out.Cancel {
				if !live[id] {
					t.Fatalf("cancel of run %d that is not live", id)
				}
			}
			if finished == 1 || len(out.Cancel) > 0 {
				clear(live)
			}
			var ended []ChainFinished
			for _, ev := range out.Events {
				switch e := ev.(type) {
				case *ChainStarted:
					if open[key{e.Kind, e.Seq}] {
						t.Fatalf("chain %s/%d started twice", e.Kind, e.Seq)
					}
					open[key{e.Kind, e.Seq}] = true
				case *ChainFinished:
					if !open[key{e.Kind, e.Seq}] {
						t.Fatalf("chain %s/%d finished but was not open: %v", e.Kind, e.Seq, open)
					}
					delete(open, key{e.Kind, e.Seq})
					ended = append(ended, *e)
					if len(e.Detail) > maxDetail {
						t.Fatalf("chain detail of %d bytes", len(e.Detail))
					}
				case *StepFinished:
					if len(e.Detail) > maxDetail {
						t.Fatalf("step detail of %d bytes", len(e.Detail))
					}
				}
			}
			for _, s := range out.Start {
				if s.RunID <= lastRun {
					t.Fatalf("run id %d not above %d", s.RunID, lastRun)
				}
				lastRun = s.RunID
				started = append(started, s.RunID)
				live[s.RunID] = true
			}
			if len(live) > 1 {
				t.Fatalf("%d steps live at once", len(live))
			}
			kind, bseq, busy := r.Busy()
			if len(open) > 1 || busy != (len(open) == 1) || (busy && !open[key{kind, bseq}]) || busy != (len(live) == 1) {
				t.Fatalf("Busy() = %s/%d %v, open chain %v, live runs %v", kind, bseq, busy, open, live)
			}
			var answered *ChainFinished
			for i := range ended {
				if !ended[i].Superseded {
					answered = &ended[i]
				}
			}
			switch {
			case answered == nil && out.Done != nil:
				t.Fatalf("Done %+v without a chain that ended", out.Done)
			case answered != nil && (out.Done == nil || out.Done.Kind != answered.Kind || out.Done.Seq != answered.Seq || out.Done.OK != answered.OK):
				t.Fatalf("chain %+v ended but Done is %+v", answered, out.Done)
			}
		}
	})
}

func (s *Spec) chainPtr(kind ChainKind) *ChainSpec {
	switch kind {
	case ChainFence:
		return &s.Fence
	case ChainPromote:
		return &s.Promote
	case ChainDemote:
		return &s.Demote
	}
	return &s.Check
}
