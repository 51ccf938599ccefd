package main

import (
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"understudy/simulations"
)

// simReport is the part of `simulate --json` the agreement test reads.
type simReport struct {
	Failovers        int         `json:"failovers"`
	MaxUnavailableMS float64     `json:"max_unavailable_ms"`
	UnavailableMS    float64     `json:"unavailable_ms"`
	Outages          []simOutage `json:"outages"`
	Takeovers        []struct {
		At   float64 `json:"at"`
		From string  `json:"from"`
		To   string  `json:"to"`
		Term uint64  `json:"term"`
	} `json:"takeovers"`
	Rules      rulesJSON `json:"rules"`
	Violations []struct {
		Invariant string `json:"invariant"`
	} `json:"violations"`
}

// sawSplitBrain reports whether the simulator found two members serving
// at once.
func (s simReport) sawSplitBrain() bool {
	for _, v := range s.Violations {
		if v.Invariant == simulations.InvSplitBrain {
			return true
		}
	}
	return false
}

// simOutage is one of the simulator's outages, dated as the record dates
// it (seconds since simulations.Epoch on the server's clock).
type simOutage struct {
	From      float64 `json:"from"`
	To        float64 `json:"to"`
	MS        float64 `json:"ms"`
	Site      string  `json:"site"`
	By        string  `json:"by"`
	Open      bool    `json:"open"`
	FromBasis string  `json:"from_basis"`
	ToBasis   string  `json:"to_basis"`
}

// replayAvailability is the part of `replay --format json` it reads.
type replayAvailability struct {
	SplitBrain []struct {
		From time.Time `json:"from"`
		MS   float64   `json:"ms"`
	} `json:"split_brain"`
	Failovers []struct {
		Term       uint64    `json:"term"`
		From       string    `json:"from"`
		To         string    `json:"to"`
		PromotedAt time.Time `json:"promoted_at"`
	} `json:"failovers"`
	Window struct {
		To time.Time `json:"to"`
	} `json:"window"`
	Availability struct {
		LongestGapMS    float64        `json:"longest_gap_ms"`
		LongestGapMinMS float64        `json:"longest_gap_min_ms"`
		OutageMS        float64        `json:"outage_ms"`
		OutageMinMS     float64        `json:"outage_min_ms"`
		Bounded         int            `json:"bounded"`
		Outages         []replayOutage `json:"outages"`
	} `json:"availability"`
}

// replayOutage is one of the replay's availability outages.
type replayOutage struct {
	From       time.Time  `json:"from"`
	To         time.Time  `json:"to"`
	MS         float64    `json:"ms"`
	MinMS      float64    `json:"min_ms"`
	After      string     `json:"after"`
	AfterBasis string     `json:"after_basis"`
	By         string     `json:"by"`
	Open       bool       `json:"open"`
	Bounded    bool       `json:"bounded"`
	FromLatest *time.Time `json:"from_latest"`
	Certain    []struct {
		From time.Time `json:"from"`
		To   time.Time `json:"to"`
	} `json:"certain"`
}

// The replay of a simulated run agrees with the simulator's own report:
// the same failovers (same terms, sites and winning writes, to the
// nanosecond: both are the register write's server timestamp) and the same
// unavailability. The simulator dates each outage as the record does (when
// the event that marks an edge landed, less its wait on the node;
// simulations/record.go), so every edge the record dates must agree to the
// microsecond; where the record only bounds an edge (no stop recorded in
// time, a serving whose serving_started died with its process), the
// simulator's figure must lie within the bounds the replay reports, and
// the replay must flag the outage as bounded. No tolerance beyond that.
func TestReplayAgreesWithSimulator(t *testing.T) {
	// Every scenario on 25 seeds, random on 60 seeds of 20 minutes: 360
	// runs, 5s (25s with -race). The sweep of 3,250 runs in docs/replay.md
	// agrees the same way.
	type run struct {
		scenario   string
		seeds      uint64
		duration   string
		leadership string // "": per-pair
		// also: seeds beyond the first seeds kept for what they found
		also []uint64
	}
	var runs []run
	for _, sc := range simulations.Scenarios() {
		if sc.Name == "forged-random" {
			// Its forgers also write while every member is down: a value
			// forged unsigned that no member saw (and so recorded as
			// forged) is in the record as a register write, and the replay
			// cannot verify signatures. forged-handoff, -beats and -ready
			// agree.
			continue
		}
		r := run{scenario: sc.Name, seeds: 25}
		if sc.Name == "random" {
			// Seed 183: a jump of a node's clock while its events waited
			// in its append queue dated a serving_started before the
			// release it followed (docs/simulation.md, N12).
			r.seeds, r.duration, r.also = 60, "20m", []uint64{183}
		}
		runs = append(runs, r)
		if !sc.Database {
			n := r
			n.leadership, n.seeds = "node", 10
			runs = append(runs, n)
		}
	}
	for _, r := range runs {
		seeds := r.also
		if r.leadership != "" {
			seeds = nil
		}
		for seed := range r.seeds {
			seeds = append(seeds, seed+1)
		}
		for _, seed := range seeds {
			name := fmt.Sprintf("%s/%d", r.scenario, seed)
			if r.leadership != "" {
				name = fmt.Sprintf("%s-%s/%d", r.scenario, r.leadership, seed)
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				path := filepath.Join(t.TempDir(), "run.usx")
				args := []string{"simulate", "--scenario", r.scenario, "--seed", strconv.FormatUint(seed, 10), "--json", "--out", path}
				if r.duration != "" {
					args = append(args, "--duration", r.duration)
				}
				if r.leadership != "" {
					args = append(args, "--leadership", r.leadership)
				}
				code, out, errOut := runCLI(t, args...)
				var sim simReport
				err := json.Unmarshal([]byte(out), &sim)
				if err != nil || (code != exitOK && !(r.leadership == "node" && knownNodeFindings[name] != "")) {
					t.Fatalf("simulate: exit %d, %v\n%s\n%s", code, err, out, errOut)
				}
				code, out, errOut = runCLI(t, "replay", "--file", path, "--format", "json")
				var rep replayAvailability
				if err := json.Unmarshal([]byte(out), &rep); err != nil || code != exitOK {
					t.Fatalf("replay: exit %d, %v\n%s", code, err, errOut)
				}
				if len(rep.SplitBrain) > 0 && !sim.sawSplitBrain() {
					t.Errorf("the replay reports %d split brains (the first %.0f ms from %s), the simulator none", len(rep.SplitBrain), rep.SplitBrain[0].MS, rep.SplitBrain[0].From.Format(time.RFC3339Nano))
				}
				if r.leadership == "node" {
					// Node leadership: the replay's split-brain check reads the
					// nodes' liveness records (the holder's lease); its
					// availability dates a member's stop by its events, which
					// the simulator's node model dates otherwise (not compared
					// yet: docs/replay.md).
					if len(rep.Failovers) != sim.Failovers {
						t.Errorf("failovers: replay %d, simulator %d", len(rep.Failovers), sim.Failovers)
					}
					return
				}
				for _, p := range agree(sim, rep) {
					t.Error(p)
				}
			})
		}
	}
}

// knownNodeFindings are the node-leadership runs whose simulation breaks
// an invariant other than the split brain (docs/simulation.md, findings):
// their replay is compared all the same.
var knownNodeFindings = map[string]string{}

// agreeTolerance is the resolution of the comparison: float64 seconds
// since the epoch, in JSON.
const agreeTolerance = 1e-6

// agree compares a simulator report with the replay of its record and
// returns the disagreements.
//
// Failovers must be identical. The replay's outages are walked in order
// against the simulator's (those of zero length in record time, squeezed
// out by a clock jump, have no counterpart):
//
//   - an outage's start that the replay dates by a recorded stop must be
//     the simulator's to the microsecond; a start the replay bounds must
//     hold the simulator's between its earliest (from) and latest
//     (from_latest);
//   - its end, a recorded serving, must be the end of one of the
//     simulator's outages to the microsecond. The simulator's outages up to
//     that one are the replay's one outage: the servings between them are
//     ones the record cannot show for sure, and each must lie where the
//     replay allows that someone served (outside its `certain` stretches);
//   - the simulator's total over them must lie within [min_ms, ms], and an
//     outage the replay does not flag as bounded must be exactly one of the
//     simulator's;
//   - the totals and the longest must lie within the replay's bounds, and
//     equal its figures when nothing is bounded.
//
// The record's last two stop bounds ((failure_threshold + 1) ×
// heartbeat_timeout + fence_grace) are unsettled: an outage of the replay
// that runs past them is compared by its start only.
func agree(sim simReport, rep replayAvailability) []string {
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	sec := func(t time.Time) float64 { return t.Sub(simulations.Epoch).Seconds() }
	near := func(a, b float64) bool { return math.Abs(a-b) <= agreeTolerance }

	if sim.Failovers != len(rep.Failovers) || len(sim.Takeovers) != sim.Failovers {
		fail("failovers: simulator %d (%d takeovers listed), replay %d", sim.Failovers, len(sim.Takeovers), len(rep.Failovers))
	}
	for i := range min(len(sim.Takeovers), len(rep.Failovers)) {
		s, r := sim.Takeovers[i], rep.Failovers[i]
		if at := sec(r.PromotedAt); s.From != r.From || s.To != r.To || s.Term != r.Term || !near(s.At, at) {
			fail("failover %d: simulator %s→%s term %d at %.6fs, replay %s→%s term %d at %.6fs", i, s.From, s.To, s.Term, s.At, r.From, r.To, r.Term, at)
		}
	}

	rl := sim.Rules
	stopBound := float64(rl.FailureThreshold+1)*rl.HeartbeatTimeout + rl.FenceGrace
	horizon := sec(rep.Window.To) - 2*stopBound
	var so []simOutage
	for _, o := range sim.Outages {
		if o.MS > 0 || o.Open {
			so = append(so, o)
		}
	}
	ro := rep.Availability.Outages
	i := 0
	for j, r := range ro {
		rf, rt := sec(r.From), sec(r.To)
		if rf > horizon {
			break
		}
		if i == len(so) {
			fail("replay outage %d (%.6fs–%.6fs after %s) has no counterpart", j, rf, rt, r.After)
			break
		}
		s := so[i]
		what := fmt.Sprintf("outage %d (replay %.6fs–%.6fs after %s, %s; simulator %.6fs–%.6fs after %s, %s/%s)",
			j, rf, rt, r.After, r.AfterBasis, s.From, s.To, s.Site, s.FromBasis, s.ToBasis)
		if s.Site != r.After {
			fail("%s: sites differ", what)
		}
		if r.AfterBasis == "recorded" {
			if s.FromBasis != "recorded" || !near(s.From, rf) {
				fail("%s: a recorded start differs", what)
			}
		} else {
			latest := rf
			if r.FromLatest != nil {
				latest = sec(*r.FromLatest)
			}
			if s.FromBasis == "recorded" || s.From < rf-agreeTolerance || s.From > latest+agreeTolerance || !r.Bounded {
				fail("%s: the start is not within the replay's bounds [%.6fs, %.6fs] (bounded %v)", what, rf, latest, r.Bounded)
			}
		}
		// The simulator's outage that ends where this one does.
		k := i
		for ; k < len(so); k++ {
			if (r.Open && so[k].Open) || (so[k].ToBasis == "recorded" && near(so[k].To, rt)) {
				break
			}
			if so[k].To > rt+agreeTolerance {
				k = len(so)
				break
			}
		}
		if k == len(so) {
			if rt > horizon || r.Open {
				i = len(so) // unsettled: compared by its start
				break
			}
			fail("%s: no outage of the simulator ends at %.6fs", what, rt)
			break
		}
		var total float64
		for m := i; m <= k; m++ {
			total += so[m].MS
			if m == k {
				continue
			}
			a, b := so[m].To, so[m+1].From
			if b-a > agreeTolerance && !r.Bounded {
				fail("%s: the simulator's %s served %.6fs–%.6fs inside an outage the replay does not bound", what, so[m].By, a, b)
			}
			for _, c := range r.Certain {
				if math.Min(b, sec(c.To))-math.Max(a, sec(c.From)) > agreeTolerance {
					fail("%s: the simulator's %s served %.6fs–%.6fs where the replay says nobody can have (%.6fs–%.6fs)", what, so[m].By, a, b, sec(c.From), sec(c.To))
				}
			}
		}
		if rt <= horizon && (total < r.MinMS-1e-3 || total > r.MS+1e-3) {
			fail("%s: the simulator's %.3f ms is not within the replay's [%.3f, %.3f] ms", what, total, r.MinMS, r.MS)
		}
		i = k + 1
	}
	for ; i < len(so) && so[i].From <= horizon; i++ {
		fail("simulator outage %.6fs–%.6fs after %s has no counterpart in the replay", so[i].From, so[i].To, so[i].Site)
	}

	a := rep.Availability
	within := func(what string, v, lo, hi float64) {
		if v < lo-1e-3*float64(len(ro)+1) || v > hi+1e-3*float64(len(ro)+1) {
			fail("%s: simulator %.3f ms, replay [%.3f, %.3f] ms", what, v, lo, hi)
		}
	}
	within("total unavailability", sim.UnavailableMS, a.OutageMinMS, a.OutageMS)
	within("longest outage", sim.MaxUnavailableMS, a.LongestGapMinMS, a.LongestGapMS)
	if a.Bounded == 0 && (a.OutageMinMS != a.OutageMS || a.LongestGapMinMS != a.LongestGapMS) {
		fail("nothing bounded, yet min and max differ: %+v", a)
	}
	return bad
}
