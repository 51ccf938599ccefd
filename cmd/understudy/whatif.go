package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"gopkg.in/yaml.v3"

	"understudy/actors/failover"
	"understudy/events"
	"understudy/projections"
	"understudy/runtime"
	"understudy/simulations"
)

// whatIfReport is `replay --what-if`: the record's heartbeat pattern run
// through the simulator under the recorded rules and the proposed ones,
// beside what the record itself shows.
type whatIfReport struct {
	Pair     string       `json:"pair"`
	File     string       `json:"file"`
	Window   whatIfWindow `json:"window"`
	Schedule string       `json:"schedule"` // the fault schedule derived from the record (--faults syntax)
	// SimulatedMS is how long each simulated run lasts: the record's
	// window and a tail, so that a failover the record's end cut short
	// completes under either set of rules (see whatIfTail).
	SimulatedMS float64      `json:"simulated_ms"`
	Faults      int          `json:"faults"`
	Seed        uint64       `json:"seed"`
	Actual      whatIfActual `json:"actual"`
	Recorded    whatIfRun    `json:"recorded"`
	Proposed    whatIfRun    `json:"proposed"`
	Notes       []string     `json:"notes"`
}

type whatIfWindow struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	MS   float64   `json:"ms"`
}

// whatIfActual is what the record itself shows (the replay's answer). The
// unavailability is the most it can have been; the Min figures the least,
// where the record only bounds an outage (see projections.Availability).
type whatIfActual struct {
	Failovers           int     `json:"failovers"`
	FalseFailovers      int     `json:"false_failovers"`
	UnavailableMS       float64 `json:"unavailable_ms"`
	UnavailableMinMS    float64 `json:"unavailable_min_ms"`
	MaxUnavailableMS    float64 `json:"max_unavailable_ms"`
	MaxUnavailableMinMS float64 `json:"max_unavailable_min_ms"`
	SplitBrain          int     `json:"split_brain"`
}

// whatIfRun is one simulated run of the pattern under a set of rules.
type whatIfRun struct {
	Rules            rulesJSON               `json:"rules"`
	Failovers        int                     `json:"failovers"`
	FalseFailovers   int                     `json:"false_failovers"`
	UnavailableMS    float64                 `json:"unavailable_ms"`
	MaxUnavailableMS float64                 `json:"max_unavailable_ms"`
	Violations       []simulations.Violation `json:"violations"`
	Takeovers        []simulations.Takeover  `json:"takeovers"`
	Digest           string                  `json:"digest"`
	Reproduce        string                  `json:"reproduce"`
	// PairFile is the rules as a pair file (YAML): the recorded run's
	// reproduce command reads it as recorded-rules.yaml.
	PairFile string `json:"pair_file"`
}

// patternTap collects, while replay reads an export file, what a what-if
// run needs: the rules the record was written with (its first
// <pair>.config), each site's landed writes and restarts, and the
// switchover requests. Times are absolute until pattern cuts the window.
type patternTap struct {
	pair, bucket string
	codec        *events.Registry
	rules        *failover.Rules
	published    bool // rules came from a member's <pair>.rules.<site>, not <pair>.config
	configs      int
	holder       string
	writes       map[string][]time.Time
	restarts     map[string][]time.Time
	switches     []switchAt
}

type switchAt struct {
	at time.Time
	to string
}

func newPatternTap(pair, bucket string) *patternTap {
	if bucket == "" {
		bucket = runtime.DefaultFailoverBucket
	}
	return &patternTap{pair: pair, bucket: bucket, codec: runtime.Codec(), writes: map[string][]time.Time{}, restarts: map[string][]time.Time{}}
}

func (p *patternTap) add(rec events.Record) {
	if b, e, ok := events.EntryFromRecord(rec); ok {
		key, ok := strings.CutPrefix(e.Key, p.pair+".")
		if b != p.bucket || !ok || e.Op != events.OpPut {
			return
		}
		switch {
		case key == "config":
			p.configs++
			if rl, err := failover.DecodeRules(e.Value); err == nil && (p.rules == nil || p.published) {
				p.rules, p.published = &rl, false
			}
		case strings.HasPrefix(key, "rules."):
			// A secured member's pair file rules: used while no
			// <pair>.config was written.
			if rl, err := failover.DecodeRules(e.Value); err == nil && p.rules == nil {
				p.rules, p.published = &rl, true
			}
		case key == "leader":
			l, err := failover.DecodeLeader(e.Value)
			if err != nil {
				return
			}
			site := l.Site
			if site == "" {
				site = p.holder // a release is its holder's last write
			} else {
				p.holder = l.Site
			}
			if site != "" {
				p.writes[site] = append(p.writes[site], e.Time)
			}
		case strings.HasPrefix(key, "hb."):
			p.writes[key[3:]] = append(p.writes[key[3:]], e.Time)
		case key == "switchover":
			if sw, err := failover.DecodeSwitchover(e.Value); err == nil {
				p.switches = append(p.switches, switchAt{e.Time, sw.To})
			}
		}
		return
	}
	site, ok := failover.NamesOf(p.pair).MemberSite(rec.Subject)
	// A restart is a start that is not its subject's first event (the
	// process's very first start is not a crash).
	if !ok || rec.Headers[events.HeaderExpectedLastSubjectSeq] == "0" {
		return
	}
	if ev, err := p.codec.DecodeRecord(rec); err == nil {
		if _, ok := ev.(*failover.Started); ok {
			p.restarts[site] = append(p.restarts[site], rec.Time)
		}
	}
}

// pattern is what was collected within the replay's window, with the
// recorded rules (the report's latest when the record has no config
// write) and notes on what was assumed.
func (p *patternTap) pattern(rep *projections.Report) (simulations.Pattern, failover.Rules, []string, error) {
	var notes []string
	var rules failover.Rules
	switch {
	case p.rules != nil:
		rules = *p.rules
	case rep.Rules != nil:
		rules = rulesFromReport(p.pair, rep.Rules)
		notes = append(notes, "the record has no config write: the recorded rules are the latest the replay found")
	default:
		return simulations.Pattern{}, rules, nil, fmt.Errorf("the record holds no rules of pair %s (no %s.config or .rules.<site> write): nothing to compare the proposed rules with", p.pair, p.pair)
	}
	if p.configs > 1 {
		notes = append(notes, fmt.Sprintf("the rules changed %d times in the record: the recorded run uses the first", p.configs-1))
	}
	from, to := rep.Window.From, rep.Window.To
	within := func(ts []time.Time) []time.Duration {
		var out []time.Duration
		for _, t := range ts {
			if !t.Before(from) && !t.After(to) {
				out = append(out, t.Sub(from))
			}
		}
		return out
	}
	pt := simulations.Pattern{Duration: to.Sub(from), Interval: rules.HeartbeatTimeout}
	for _, sw := range p.switches {
		if !sw.at.Before(from) && !sw.at.After(to) {
			pt.Switchovers = append(pt.Switchovers, simulations.Switch{At: sw.at.Sub(from), To: sw.to})
		}
	}
	for _, site := range []string{rules.Primary, rules.Replica} {
		pt.Sites = append(pt.Sites, simulations.SitePattern{Site: site, Writes: within(p.writes[site]), Restarts: within(p.restarts[site])})
	}
	for site := range p.writes {
		if site != rules.Primary && site != rules.Replica {
			notes = append(notes, fmt.Sprintf("site %s wrote to the pair's keys but is not one of its rules' sites: left out", site))
		}
	}
	slices.Sort(notes)
	return pt, rules, notes, nil
}

func rulesFromReport(pair string, r *projections.Rules) failover.Rules {
	fb, _ := failover.ParseFailback(r.Failback)
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	return failover.Rules{
		Pair: pair, Primary: r.Primary, Replica: r.Replica,
		HeartbeatTimeout: ms(r.HeartbeatTimeoutMS), FailureThreshold: r.FailureThreshold, SuccessThreshold: r.SuccessThreshold,
		FailoverTimeout: ms(r.FailoverTimeoutMS), FenceGrace: ms(r.FenceGraceMS), Failback: fb,
		MaxLagOnFailover: failover.DefaultMaxLag, Synchronous: failover.SyncOff,
	}
}

// whatIf runs the pattern tap collected under the recorded rules and the
// proposed ones (read from proposedPath). An error in the command's
// arguments goes through usage.
func whatIf(file string, proposed failover.Rules, proposedPath string, seed uint64, tap *patternTap, rep *projections.Report, usage func(error) error) (*whatIfReport, error) {
	pattern, recorded, notes, err := tap.pattern(rep)
	if err != nil {
		return nil, fmt.Errorf("what-if %s: %w", file, err)
	}
	sites := []string{recorded.Primary, recorded.Replica}
	for _, f := range []struct{ name, site string }{{"primary", proposed.Primary}, {"replica", proposed.Replica}} {
		if !slices.Contains(sites, f.site) {
			return nil, usage(fmt.Errorf("--what-if %s: %s: %s is not a site of the record (its sites are %s and %s)", proposedPath, f.name, f.site, sites[0], sites[1]))
		}
	}
	if proposed.Pair != recorded.Pair {
		notes = append(notes, fmt.Sprintf("the proposed pair file names pair %s; it runs as %s", proposed.Pair, recorded.Pair))
		proposed.Pair = recorded.Pair
	}
	if pattern.Interval <= 0 {
		return nil, fmt.Errorf("what-if %s: the recorded rules have no heartbeat_timeout", file)
	}
	faults := pattern.Faults()
	simulated := pattern.Duration + max(whatIfTail(recorded), whatIfTail(proposed))
	out := &whatIfReport{
		Pair: tap.pair, File: file, Seed: seed,
		Window:   whatIfWindow{From: rep.Window.From, To: rep.Window.To, MS: float64(pattern.Duration) / float64(time.Millisecond)},
		Schedule: simulations.FormatFaults(faults), Faults: len(faults), Notes: notes,
		SimulatedMS: float64(simulated) / float64(time.Millisecond),
	}
	if out.Notes == nil {
		out.Notes = []string{}
	}
	out.Actual = actualOf(rep, faults)
	for i, rl := range []failover.Rules{recorded, proposed} {
		cfg := simulations.Config{Scenario: "random", Seed: seed, Duration: simulated, Rules: rl,
			AllowUnsafe: rl.Validate() != nil, Faults: faults, FaultsSet: true}
		res, err := simulations.Run(cfg)
		if err != nil {
			return nil, fmt.Errorf("what-if: simulate the %s rules: %w", []string{"recorded", "proposed"}[i], err)
		}
		pc := proposedPath
		if i == 0 {
			pc = "recorded-rules.yaml"
		}
		pf, err := yaml.Marshal(runtime.PairFileOf(rl))
		if err != nil {
			return nil, err
		}
		run := whatIfRun{
			Rules: rulesOf(rl), Failovers: res.Failovers, UnavailableMS: res.UnavailableMS, MaxUnavailableMS: res.MaxUnavailableMS,
			Violations: res.Violations, Takeovers: res.Takeovers, Digest: res.Digest, Reproduce: simulations.Command(cfg, pc),
			PairFile: string(pf),
		}
		for _, t := range res.Takeovers {
			if t.OldAlive {
				run.FalseFailovers++
			}
		}
		if i == 0 {
			out.Recorded = run
			if rl.Validate() != nil {
				out.Notes = append(out.Notes, "the recorded rules break the safety inequality")
			}
		} else {
			out.Proposed = run
		}
	}
	return out, nil
}

// whatIfTail is how long a run goes on past the end of the record: long
// enough for a holder that went silent at the very end to be detected,
// replaced and its replacement to serve — twice the larger of
// failover_timeout and the stop bound, plus ten heartbeats.
func whatIfTail(r failover.Rules) time.Duration {
	stop := r.StopBound()
	return (2*max(r.FailoverTimeout, stop) + 10*r.HeartbeatTimeout).Round(time.Second)
}

// actualOf is what the record shows. A failover is false when its old
// holder was not down by the derived schedule (no crash or power cut of
// it in force when it was taken over).
func actualOf(rep *projections.Report, faults []simulations.Fault) whatIfActual {
	av := rep.Availability
	a := whatIfActual{Failovers: len(rep.Failovers), UnavailableMS: av.OutageMS, UnavailableMinMS: av.OutageMinMS,
		MaxUnavailableMS: av.LongestGapMS, MaxUnavailableMinMS: av.LongestGapMinMS, SplitBrain: len(rep.SplitBrain)}
	for _, fo := range rep.Failovers {
		if fo.PromotedAt == nil {
			continue
		}
		t := fo.PromotedAt.Sub(rep.Window.From)
		down := false
		for _, f := range faults {
			if f.Site == fo.From && (f.Kind == simulations.FaultCrash || f.Kind == simulations.FaultPowerCut) &&
				f.At <= t && (f.For == 0 || t < f.At+f.For) {
				down = true
			}
		}
		if !down {
			a.FalseFailovers++
		}
	}
	return a
}

func writeWhatIf(w io.Writer, r *whatIfReport, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	fmt.Fprintf(w, "WHAT-IF  pair %s, record %s (%s – %s)\n", r.Pair, time.Duration(r.Window.MS*float64(time.Millisecond)).Round(time.Millisecond),
		r.Window.From.Format(time.RFC3339), r.Window.To.Format(time.RFC3339))
	fmt.Fprintf(w, "the record's heartbeat pattern, as %d faults, run through the simulator (seed %d, %s: the record and a tail) under each set of rules\n\n",
		r.Faults, r.Seed, time.Duration(r.SimulatedMS*float64(time.Millisecond)).Round(time.Millisecond))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t") }
	rl := func(f func(rulesJSON) string) []string {
		return []string{f(r.Recorded.Rules), f(r.Recorded.Rules), f(r.Proposed.Rules)}
	}
	dur := func(s float64) string { return time.Duration(s * float64(time.Second)).String() }
	row("", "as recorded", "recorded rules", "proposed rules")
	row("", "(the record)", "(simulated)", "(simulated)")
	row(append([]string{"heartbeat_timeout"}, rl(func(x rulesJSON) string { return dur(x.HeartbeatTimeout) })...)...)
	row(append([]string{"failure_threshold"}, rl(func(x rulesJSON) string { return fmt.Sprint(x.FailureThreshold) })...)...)
	row(append([]string{"success_threshold"}, rl(func(x rulesJSON) string { return fmt.Sprint(x.SuccessThreshold) })...)...)
	row(append([]string{"failover_timeout"}, rl(func(x rulesJSON) string { return dur(x.FailoverTimeout) })...)...)
	row(append([]string{"fence_grace"}, rl(func(x rulesJSON) string { return dur(x.FenceGrace) })...)...)
	row(append([]string{"failback"}, rl(func(x rulesJSON) string { return x.Failback })...)...)
	row(append([]string{"safe"}, rl(func(x rulesJSON) string { return yesNo(x.Safe) })...)...)
	row("", "", "", "")
	row("failovers", fmt.Sprint(r.Actual.Failovers), fmt.Sprint(r.Recorded.Failovers), fmt.Sprint(r.Proposed.Failovers))
	row("of a live primary", fmt.Sprint(r.Actual.FalseFailovers), fmt.Sprint(r.Recorded.FalseFailovers), fmt.Sprint(r.Proposed.FalseFailovers))
	msd := func(v float64) string {
		return time.Duration(v * float64(time.Millisecond)).Round(time.Millisecond).String()
	}
	// The record may only bound it: "at most (at least)".
	bounded := func(most, least float64) string {
		if least < most {
			return msd(most) + " (≥ " + msd(least) + ")"
		}
		return msd(most)
	}
	row("unavailable, total", bounded(r.Actual.UnavailableMS, r.Actual.UnavailableMinMS), msd(r.Recorded.UnavailableMS), msd(r.Proposed.UnavailableMS))
	row("unavailable, longest", bounded(r.Actual.MaxUnavailableMS, r.Actual.MaxUnavailableMinMS), msd(r.Recorded.MaxUnavailableMS), msd(r.Proposed.MaxUnavailableMS))
	row("violations", fmt.Sprintf("%d split brain", r.Actual.SplitBrain), fmt.Sprint(len(r.Recorded.Violations)), fmt.Sprint(len(r.Proposed.Violations)))
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, run := range []struct {
		name string
		r    whatIfRun
	}{{"recorded", r.Recorded}, {"proposed", r.Proposed}} {
		for _, v := range run.r.Violations {
			fmt.Fprintf(w, "\n%s rules: VIOLATION %s at %.3fs: %s", run.name, v.Invariant, v.At, v.Detail)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "of a live primary (false failovers): takeovers while the old holder's process ran (cut off, slow or paused, not dead).")
	fmt.Fprintln(w, "unavailable: no database serving, after one first did (a stop's start counts), dated as the record dates it;")
	fmt.Fprintln(w, "  where the record only bounds an outage (a stop it does not hold in time), the most it can have been (≥ the least).")
	for _, n := range r.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	if r.Faults > 8 {
		fmt.Fprintf(w, "\nreproduce: --format json has each run's command (recorded.reproduce, proposed.reproduce; %d faults)\n", r.Faults)
		return nil
	}
	fmt.Fprintf(w, "\nreproduce recorded: %s\n  (recorded-rules.yaml: the recorded rules, --format json's recorded.pair_file)\nreproduce proposed: %s\n", r.Recorded.Reproduce, r.Proposed.Reproduce)
	return nil
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

var errWhatIfFormat = errors.New("--what-if prints text or json (--format html is for the history)")
