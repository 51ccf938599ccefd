package main

import (
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"understudy/simulations"
)

// simReport is the part of `simulate --json` the agreement test reads.
type simReport struct {
	Failovers        int     `json:"failovers"`
	MaxUnavailableMS float64 `json:"max_unavailable_ms"`
	UnavailableMS    float64 `json:"unavailable_ms"`
	Violations       []any   `json:"violations"`
	Faults           string  `json:"faults"`
	Outages          []struct {
		From        float64 `json:"from"`
		To          float64 `json:"to"`
		MS          float64 `json:"ms"`
		Site        string  `json:"site"`
		Cause       string  `json:"cause"`
		By          string  `json:"by"`
		Open        bool    `json:"open"`
		EndInRecord bool    `json:"end_in_record"`
	} `json:"outages"`
	Takeovers []struct {
		At   float64 `json:"at"`
		From string  `json:"from"`
		To   string  `json:"to"`
		Term uint64  `json:"term"`
	} `json:"takeovers"`
	Rules rulesJSON `json:"rules"`
}

// replayAvailability is the part of `replay --format json` it reads.
type replayAvailability struct {
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
		LongestGapMS float64        `json:"longest_gap_ms"`
		OutageMS     float64        `json:"outage_ms"`
		Outages      []replayOutage `json:"outages"`
	} `json:"availability"`
}

// replayOutage is one of the replay's availability outages.
type replayOutage struct {
	From       time.Time `json:"from"`
	To         time.Time `json:"to"`
	MS         float64   `json:"ms"`
	After      string    `json:"after"`
	AfterBasis string    `json:"after_basis"`
	By         string    `json:"by"`
	Open       bool      `json:"open"`
}

// The replay of a simulated run agrees with the simulator's own report:
// the same failovers (same terms, sites and winning writes, to the
// nanosecond: both are the register write's server timestamp) and the same
// outages — each stretch with nobody serving — within what the record can
// resolve (see agree). The simulator knows when things happened; the
// record knows when they landed on the server, less the time each event
// waited on its node (the Understudy-Queued-Ns header).
func TestReplayAgreesWithSimulator(t *testing.T) {
	// Every scenario, 20 seeds each (random on 20 minutes). A sweep of
	// seeds 1–250 is in docs/replay.md with what disagrees there and why.
	type run struct {
		scenario string
		seeds    []uint64
		duration string
	}
	var runs []run
	for _, sc := range simulations.Scenarios() {
		r := run{scenario: sc.Name}
		if sc.Name == "random" {
			r.duration = "20m"
		}
		for seed := uint64(1); seed <= 20; seed++ {
			r.seeds = append(r.seeds, seed)
		}
		runs = append(runs, r)
	}
	for _, r := range runs {
		for _, seed := range r.seeds {
			t.Run(fmt.Sprintf("%s/%d", r.scenario, seed), func(t *testing.T) {
				t.Parallel()
				path := filepath.Join(t.TempDir(), "run.usx")
				args := []string{"simulate", "--scenario", r.scenario, "--seed", strconv.FormatUint(seed, 10), "--json", "--out", path}
				if r.duration != "" {
					args = append(args, "--duration", r.duration)
				}
				code, out, errOut := runCLI(t, args...)
				var sim simReport
				if err := json.Unmarshal([]byte(out), &sim); err != nil || code != exitOK {
					t.Fatalf("simulate: exit %d, %v\n%s\n%s", code, err, out, errOut)
				}
				code, out, errOut = runCLI(t, "replay", "--file", path, "--format", "json")
				var rep replayAvailability
				if err := json.Unmarshal([]byte(out), &rep); err != nil || code != exitOK {
					t.Fatalf("replay: exit %d, %v\n%s", code, err, errOut)
				}
				for _, p := range agree(t, sim, rep) {
					t.Error(p)
				}
			})
		}
	}
}

// agree compares a simulator report with the replay of its record and
// returns the disagreements.
//
// Failovers must be identical. Outages are matched in order and each end
// compared with a tolerance that comes from the record's resolution:
//
//   - a boundary the record dates by an event (the new holder's
//     serving_started; a recorded stop) is dated when the event landed less
//     the time it waited on its node: late by the one-way uplink latency of
//     the append that stored it, which the record cannot see. The tolerance
//     is that latency's bound at the time: the link's cap (min(60ms,
//     heartbeat_timeout/4)) plus any latency fault then in force on the
//     uplink (+10% jitter), or until a stall of the uplink heals; plus 1ms
//     for the node clock's drift over the wait, and any forward jump of
//     that clock shortly before (it inflates the measured wait).
//   - an outage that began without a recorded stop (a power cut, a crash, a
//     member whose stop landed after the rules' bound) starts, in the
//     record, at the last register write of the old holder: the truth lies
//     between that write and the rules' stop bound, (failure_threshold + 1)
//     × heartbeat_timeout + fence_grace after it (by then a live holder has
//     fenced itself and a dead one's database died with it).
//   - the record cannot show a stop that had not landed when it ended: a
//     last, open outage of the simulator that began within the stop bound
//     of the end of the record may be missing from the replay.
//   - a member's events still queued on its node die with its process: a
//     member that served and crashed before its serving_started was
//     appended never served, for the record, and the replay shows one
//     outage where the simulator shows two around it.
func agree(t *testing.T, sim simReport, rep replayAvailability) []string {
	t.Helper()
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	rl := sim.Rules
	faults, err := simulations.ParseFaults(sim.Faults, rl.Primary, rl.Replica)
	if err != nil {
		t.Fatalf("schedule %q: %v", sim.Faults, err)
	}
	hb := time.Duration(rl.HeartbeatTimeout * float64(time.Second))
	stopBound := (time.Duration(rl.FailureThreshold+1)*hb + time.Duration(rl.FenceGrace*float64(time.Second))).Seconds()
	maxLat := min(60*time.Millisecond, max(hb/4, time.Millisecond))
	// latency bounds the one-way uplink latency of the append that stored
	// an event site produced at t, in seconds. That append may have been
	// sent well after t (queued behind others, retried while NATS or the
	// link was down), so every latency fault on the uplink within the
	// following minute counts, and a stall of the uplink then holds it
	// until the stall heals. A forward jump of the node's clock while the
	// event waited inflates its measured wait by the jump.
	const window = 60.0
	latency := func(site string, t float64) float64 {
		worst := 0.0
		for _, f := range faults {
			from, to := f.At.Seconds(), (f.At + f.For).Seconds()
			if f.Site != site || (f.Dir != simulations.DirUp && f.Dir != simulations.DirBoth && f.Kind != simulations.FaultJump) {
				continue
			}
			switch {
			case f.Kind == simulations.FaultLatency && from < t+window && t < to:
				worst = max(worst, f.Value.Seconds()*1.1)
			case f.Kind == simulations.FaultStall && from < t+window && t < to:
				worst = max(worst, to-t)
			case f.Kind == simulations.FaultJump && math.Abs(t-from) < window:
				worst = max(worst, f.Value.Seconds())
			}
		}
		return maxLat.Seconds() + 0.001 + worst
	}

	if sim.Failovers != len(rep.Failovers) || len(sim.Takeovers) != sim.Failovers {
		fail("failovers: simulator %d (%d takeovers listed), replay %d", sim.Failovers, len(sim.Takeovers), len(rep.Failovers))
	}
	for i := range min(len(sim.Takeovers), len(rep.Failovers)) {
		s, r := sim.Takeovers[i], rep.Failovers[i]
		at := r.PromotedAt.Sub(simulations.Epoch).Seconds()
		if s.From != r.From || s.To != r.To || s.Term != r.Term || math.Abs(s.At-at) > 1e-6 {
			fail("failover %d: simulator %s→%s term %d at %.6fs, replay %s→%s term %d at %.6fs", i, s.From, s.To, s.Term, s.At, r.From, r.To, r.Term, at)
		}
	}

	type outage struct {
		from, to, ms float64
		site, cause  string
		by           string
		open         bool
		inRecord     bool
	}
	var so []outage
	for _, o := range sim.Outages {
		so = append(so, outage{o.From, o.To, o.MS, o.Site, o.Cause, o.By, o.Open, o.EndInRecord})
	}
	ro := rep.Availability.Outages
	// The record's last minute is unsettled: what happened then may not
	// have landed when the run ended (an append waits out partitions, a
	// NATS outage, retries). Outages that began after the horizon are not
	// compared and may be missing on either side; one that runs past it is
	// compared by its start.
	horizon := rep.Window.To.Sub(simulations.Epoch).Seconds() - window
	var simTotal, repTotal, slack float64
	i, j := 0, 0
	for ; i < len(so) && j < len(ro); i, j = i+1, j+1 {
		s, r := so[i], ro[j]
		rf, rt := r.From.Sub(simulations.Epoch).Seconds(), r.To.Sub(simulations.Epoch).Seconds()
		if s.from > horizon || rf > horizon {
			continue
		}
		for i+1 < len(so) && !s.open {
			// The site that ended it served in between, but the record may
			// not show it: it died with its serving_started still queued on
			// its node; or the serving was shorter than the record resolves:
			// its start is dated within the uplink latency, and its end too
			// when the stop's events landed, but at the site's last register
			// write — up to the stop bound before — when the process died
			// before they did. The outage then runs on to the end of the
			// next one.
			next := so[i+1]
			resolution := latency(s.by, s.to) + latency(next.site, next.from) + stopBound
			shown := math.Abs(rt-s.to) <= latency(s.by, s.to)
			if s.inRecord && (shown || next.from-s.to > resolution) {
				break
			}
			s = outage{s.from, next.to, s.ms + next.ms + (next.from-s.to)*1000, s.site, s.cause, next.by, next.open, next.inRecord}
			i++
		}
		what := fmt.Sprintf("outage %d (simulator %.3fs–%.3fs %s after %s, by %s; replay %.3fs–%.3fs after %s, %s)", j, s.from, s.to, s.cause, s.site, s.by, rf, rt, r.After, r.AfterBasis)
		// One that runs past the horizon is compared by its start: its end
		// may not be in the record.
		past := s.open || r.Open || s.to > horizon || rt > horizon
		tolEnd := 0.0
		switch {
		case s.site != r.After:
			fail("%s: sites differ", what)
		case past:
			if s.to <= horizon-latency(s.by, s.to) || rt <= horizon-latency(s.by, s.to) {
				fail("%s: only one runs past the horizon %.3fs", what, horizon)
			}
		case s.by != r.By:
			fail("%s: sites differ", what)
		default:
			tolEnd = latency(s.by, s.to)
			if d := rt - s.to; math.Abs(d) > tolEnd {
				fail("%s: end differs by %.3fs, more than the %.3fs the record allows", what, d, tolEnd)
			}
		}
		var tolStart float64
		if r.AfterBasis == "recorded" {
			tolStart = latency(s.site, s.from)
			if d := rf - s.from; math.Abs(d) > tolStart {
				fail("%s: start differs by %.3fs, more than the %.3fs the record allows", what, d, tolStart)
			}
		} else {
			tolStart = stopBound + latency(s.site, s.from)
			if d := s.from - rf; d < -latency(s.site, s.from) || d > tolStart {
				fail("%s: began %.3fs after the old holder's last register write, outside [0, %.3fs]", what, d, stopBound)
			}
		}
		if !past {
			simTotal += s.ms / 1000
			repTotal += r.MS / 1000
			slack += tolStart + tolEnd
		}
	}
	for ; i < len(so) && so[i].from > horizon-latency(so[i].site, so[i].from); i++ {
	}
	for ; j < len(ro) && ro[j].From.Sub(simulations.Epoch).Seconds() > horizon-latency(ro[j].After, ro[j].From.Sub(simulations.Epoch).Seconds()); j++ {
	}
	if i != len(so) || j != len(ro) {
		fail("outages: simulator %d, replay %d; %d and %d left unmatched", len(so), len(ro), len(so)-i, len(ro)-j)
	}
	if math.Abs(simTotal-repTotal) > slack+1e-6 {
		fail("total unavailability: simulator %.3fs, replay %.3fs, tolerance %.3fs", simTotal, repTotal, slack)
	}
	recorded := len(sim.Outages) == len(ro)
	for _, r := range ro {
		recorded = recorded && r.AfterBasis == "recorded"
	}
	if recorded && !strings.Contains(sim.Faults, "latency") && !strings.Contains(sim.Faults, "stall") && !strings.Contains(sim.Faults, "jump") {
		// Without silent stops or slow links the two agree to a few
		// milliseconds on the aggregates the simulator reports.
		if d := math.Abs(sim.MaxUnavailableMS - rep.Availability.LongestGapMS); d > 2*(maxLat.Seconds()+0.001)*1000 {
			fail("longest outage: simulator %.1f ms, replay %.1f ms", sim.MaxUnavailableMS, rep.Availability.LongestGapMS)
		}
	}
	return bad
}
