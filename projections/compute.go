package projections

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/events"
)

// Report computes every read model from what was added so far. It does not
// change the fold: more records may be added and Report called again.
func (f *Fold) Report() *Report {
	c := &computation{f: f}
	return c.run()
}

// computation holds the intermediate state of one Report.
type computation struct {
	f      *Fold
	r      *Report
	w0, w1 time.Time // the window
	evs    []eventRec
	reg    []regWrite // by revision
	hbs    []hbWrite  // by revision
	// configs, switchovers, markers: by revision
	configs, switchovers, markers []kvWrite
	rules                         []ruleChange
	sites                         []*siteRun
	bySite                        map[string]*siteRun
	// unfenced, fenced: the times of the unfenced and of the fenced
	// register writes per site and term.
	unfenced, fenced map[siteTerm][]int64
	// releases: the times of the register writes naming no holder, per
	// term, in revision order (releaseWrite).
	releases map[uint64][]int64
	// termWrites: the register writes naming each site and term as holder,
	// in revision order (writesOf).
	termWrites map[siteTerm][]regWrite
	// mayHaveServed: stretches where the record's register writes show a
	// site may have served though no serving_started of it was recorded.
	mayHaveServed []MaySpan
	idx           *eventIndex
	// gapFrom, gapOver: isGap's view of rules (when each takes effect, Unix
	// ns; the interval over which is a gap, ns, or -1 for none); gapRule:
	// the one used last.
	gapFrom, gapOver []int64
	gapRule          int
	// forgedWrites: register writes left out as no member's (dropForged).
	forgedWrites int
}

type ruleChange struct {
	t     time.Time
	rules failover.Rules
}

func (c *computation) run() *Report {
	f := c.f
	r := &Report{Pair: f.opts.Pair, Source: f.opts.Source, Partial: f.partial, Heartbeats: map[string]SiteHeartbeats{}}
	c.r = r
	c.window()

	c.evs = slices.Clone(f.evs)
	if f.backdated {
		keepSubjectOrder(c.evs)
	}
	slices.SortStableFunc(c.evs, func(a, b eventRec) int {
		if n := a.t.Compare(b.t); n != 0 {
			return n
		}
		if n := cmp.Compare(a.stream, b.stream); n != 0 {
			return n
		}
		return cmp.Compare(a.seq, b.seq)
	})
	c.reg = f.reg.all() // read only; sorted in a copy when it came out of order
	if !slices.IsSortedFunc(c.reg, func(a, b regWrite) int { return cmp.Compare(a.rev, b.rev) }) {
		c.reg = slices.Clone(c.reg)
		slices.SortFunc(c.reg, func(a, b regWrite) int { return cmp.Compare(a.rev, b.rev) })
	}
	c.dropForged()
	c.hbs = c.f.hbs.all()
	if !slices.IsSortedFunc(c.hbs, func(a, b hbWrite) int { return cmp.Compare(a.rev, b.rev) }) {
		c.hbs = slices.Clone(c.hbs)
		slices.SortFunc(c.hbs, func(a, b hbWrite) int { return cmp.Compare(a.rev, b.rev) })
	}
	byRev := func(a, b kvWrite) int { return cmp.Compare(a.rev, b.rev) }
	c.configs = slices.SortedFunc(slices.Values(c.f.configs), byRev)
	c.switchovers = slices.SortedFunc(slices.Values(c.f.switchovers), byRev)
	c.markers = slices.SortedFunc(slices.Values(c.f.markers), byRev)
	c.collectRules()
	c.orderSites()
	c.runSites()
	c.transitions()
	c.configChanges()
	c.procedures()
	c.splitBrain()
	c.heartbeats()
	c.availability()
	c.timeline()
	c.records()
	return r
}

// keepSubjectOrder makes the times of each subject's events non-decreasing
// in sequence order. A member produces its events in that order; dating
// them by when they landed less their wait on the node can invert two close
// ones, as the one-way latency of their appends differs.
func keepSubjectOrder(evs []eventRec) {
	slices.SortFunc(evs, func(a, b eventRec) int {
		if n := cmp.Compare(a.subject, b.subject); n != 0 {
			return n
		}
		if n := cmp.Compare(a.stream, b.stream); n != 0 {
			return n
		}
		return cmp.Compare(a.seq, b.seq)
	})
	for i := 1; i < len(evs); i++ {
		if evs[i].subject == evs[i-1].subject && evs[i].stream == evs[i-1].stream && evs[i].t.Before(evs[i-1].t) {
			evs[i].t = evs[i-1].t
		}
	}
}

func (c *computation) window() {
	f := c.f
	first, last := time.Unix(0, f.first).UTC(), time.Unix(0, f.lastT).UTC()
	if f.first == 0 {
		first, last = time.Time{}, time.Time{}
	}
	c.w0, c.w1 = first, last
	if !f.opts.From.IsZero() {
		c.r.Window.Asked = true
		if first.IsZero() || f.opts.From.After(first) {
			c.w0 = f.opts.From.UTC()
		}
	}
	if !f.opts.To.IsZero() {
		// Kept even after the last record: the record was read up to it
		// (an export's header says so), and what was still so then — an
		// outage still open — lasted to it.
		c.r.Window.Asked = true
		c.w1 = f.opts.To.UTC()
	}
	if c.w1.Before(c.w0) {
		c.w1 = c.w0
	}
	c.r.Window.From, c.r.Window.To = c.w0, c.w1
	c.r.Window.MS = ms(c.w1.Sub(c.w0))
}

// collectRules gathers the rules in force over time: the members' started
// and config_applied events, and the config key's writes that validate.
func (c *computation) collectRules() {
	for _, e := range c.evs {
		switch ev := e.ev.(type) {
		case *failover.Started:
			c.rules = append(c.rules, ruleChange{e.t, ev.Rules})
		case *failover.ConfigApplied:
			c.rules = append(c.rules, ruleChange{e.t, ev.Rules})
		}
	}
	if len(c.rules) == 0 {
		for _, w := range c.configs {
			if rl, err := failover.DecodeRules(w.value); err == nil && rl.Validate() == nil {
				c.rules = append(c.rules, ruleChange{time.Unix(0, w.t).UTC(), rl})
			}
		}
	}
	slices.SortStableFunc(c.rules, func(a, b ruleChange) int { return a.t.Compare(b.t) })
	if len(c.rules) > 0 {
		rl := c.rules[len(c.rules)-1].rules
		c.r.Rules = &Rules{
			Primary: rl.Primary, Replica: rl.Replica,
			HeartbeatTimeoutMS: ms(rl.HeartbeatTimeout), FailureThreshold: rl.FailureThreshold, SuccessThreshold: rl.SuccessThreshold,
			FailoverTimeoutMS: ms(rl.FailoverTimeout), FenceGraceMS: ms(rl.FenceGrace), Failback: rl.Failback.String(),
		}
	}
}

// rulesAt returns the rules in force at t (the earliest known before any
// change); ok is false when the record holds none.
func (c *computation) rulesAt(t time.Time) (failover.Rules, bool) {
	if len(c.rules) == 0 {
		return failover.Rules{}, false
	}
	i, _ := slices.BinarySearchFunc(c.rules, t, func(rc ruleChange, t time.Time) int {
		if rc.t.After(t) {
			return 1
		}
		return -1
	})
	if i == 0 {
		return c.rules[0].rules, true
	}
	return c.rules[i-1].rules, true
}

// stopBound is the latest a holder whose last unfenced register write
// landed at last can have served: (failure_threshold + 1) × heartbeat_timeout
// + fence_grace later.
func (c *computation) stopBound(last time.Time) (time.Time, bool) {
	rl, ok := c.rulesAt(last)
	if !ok || rl.HeartbeatTimeout <= 0 {
		return time.Time{}, false
	}
	return last.Add(rl.StopBound()), true
}

// orderSites lists the sites: the rules' primary and replica first.
func (c *computation) orderSites() {
	var names []string
	if c.r.Rules != nil {
		names = append(names, c.r.Rules.Primary, c.r.Rules.Replica)
	}
	for _, s := range c.f.sites {
		if !slices.Contains(names, s) {
			names = append(names, s)
		}
	}
	c.r.Sites = names
	c.bySite = map[string]*siteRun{}
	for _, n := range names {
		sr := &siteRun{name: n, c: c}
		c.sites = append(c.sites, sr)
		c.bySite[n] = sr
	}
}

func (c *computation) siteName(i int32) string {
	if i < 0 || int(i) >= len(c.f.sites) {
		return ""
	}
	return c.f.sites[i]
}

func ref(e eventRec) *EventRef {
	return &EventRef{Subject: e.subject, Sequence: e.seq, Type: e.ev.EventType(), Time: e.t}
}

// landedRef is ref with the record's server timestamp.
func landedRef(e eventRec) *EventRef {
	r := ref(e)
	r.Time = e.landed
	return r
}

// --- per-site state -----------------------------------------------------------

// siteRun folds one site's member events into its lane and tenures.
type siteRun struct {
	c        *computation
	name     string
	state    string
	since    time.Time
	term     uint64
	note     string
	segs     []Segment
	open     *tenure // serving now
	stopping *tenure // stopped serving; its fence or demotion has not completed
	tenures  []*tenure
	then     failover.AfterFence
}

type tenure struct {
	Tenure
	rawEnd      time.Time // the recorded stop (fence_requested, demotion, lost register)
	upEnd       time.Time // the recorded completion (fenced, demoted)
	restartAt   time.Time // a restart ended it without a recorded stop
	fenceFailed bool
	// toLatest is the latest it may have stopped serving: To when the stop
	// was recorded in time, else the first thing in the record that shows
	// it had stopped (see finishTenure). Zero while open.
	toLatest time.Time
}

func (s *siteRun) set(state string, t time.Time, term uint64, note string) {
	if s.state == state && s.term == term && s.note == note {
		return
	}
	if s.state != "" && t.After(s.since) {
		s.segs = append(s.segs, Segment{Site: s.name, State: s.state, From: s.since, To: t, Term: s.term, Note: s.note})
	}
	s.state, s.since, s.term, s.note = state, t, term, note
}

func (s *siteRun) stop(t time.Time, why string, e eventRec) {
	if s.open == nil {
		return
	}
	s.open.rawEnd, s.open.End, s.open.ToEvent = t, why, ref(e)
	s.stopping, s.open = s.open, nil
}

func (s *siteRun) startServing(t time.Time, term uint64, basis string, from *EventRef) {
	if s.open != nil {
		return
	}
	s.open = &tenure{Tenure: Tenure{Site: s.name, Term: term, From: t, FromBasis: basis, FromEvent: from}}
	s.tenures = append(s.tenures, s.open)
	s.stopping = nil
}

func (c *computation) runSites() {
	// A window may open with a site already serving: its unfenced register
	// writes of a term whose serving_started is not in the record.
	served := map[string]map[uint64]bool{}
	for _, e := range c.evs {
		switch ev := e.ev.(type) {
		case *failover.ServingStarted:
			site := c.siteName(e.site)
			if served[site] == nil {
				served[site] = map[uint64]bool{}
			}
			served[site][ev.Term] = true
		case *failover.Promoted:
			site := c.siteName(e.site)
			if served[site] == nil {
				served[site] = map[uint64]bool{}
			}
			served[site][ev.Term] = true
		}
	}
	// Only the register's first write in the record can show a holder
	// serving since before the record began.
	inferred := map[string]regWrite{}
	if len(c.reg) > 0 {
		w := c.reg[0]
		if site := c.siteName(w.v.site); site != "" && !w.v.fenced && !served[site][w.v.term] {
			inferred[site] = w
		}
	}

	for _, s := range c.sites {
		var evs []eventRec
		// Its member events, and its resource's procedure events.
		for _, e := range c.evs {
			if c.siteName(e.site) == s.name {
				evs = append(evs, e)
			}
		}
		if w, ok := inferred[s.name]; ok {
			t := time.Unix(0, w.t).UTC()
			// Only when nothing the member recorded comes before it.
			if i := slices.IndexFunc(evs, func(e eventRec) bool { return !e.proc }); i < 0 || !evs[i].t.Before(t) {
				s.startServing(t, w.v.term, "register", &EventRef{Subject: "$KV." + c.f.opts.Bucket + "." + c.f.opts.Pair + ".leader", Sequence: w.rev, Type: "register write", Time: t})
				s.set("serving", t, w.v.term, "inferred from the register")
			}
		}
		// A member appends its events one at a time, in order, from a queue
		// that dies with its process: what it did after its last recorded
		// event of a run (up to its next start) may be missing — a silence.
		// Its resource's procedure events (a subject and a queue of their
		// own) then date what they show, when the member's record does not
		// name their chain: a promote step that succeeded made the database
		// serve, a fence or demote chain starting stopped it. Its register
		// writes in a silence show where it may have served (silentServing).
		var quiet []silence
		lastAt := -1
		for i, e := range evs {
			if e.proc {
				continue
			}
			if _, ok := e.ev.(*failover.Started); ok && lastAt >= 0 {
				quiet = append(quiet, silence{last: lastAt, from: evs[lastAt].t, to: e.t})
			}
			lastAt = i
		}
		if lastAt >= 0 {
			quiet = append(quiet, silence{last: lastAt, from: evs[lastAt].t, to: maxTime(time.Unix(0, c.f.lastT).UTC(), c.w1)})
		}
		// The chains the member's record names, by kind and sequence.
		named := map[procKey]bool{}
		for _, e := range evs {
			switch ev := e.ev.(type) {
			case *failover.ServingStarted:
				named[procKey{procedure.ChainPromote, ev.Seq}] = true
			case *failover.FenceRequested:
				named[procKey{procedure.ChainFence, ev.Seq}] = true
			case *failover.DemotionRequested:
				named[procKey{procedure.ChainDemote, ev.Seq}] = true
			}
		}
		k := 0
		for i, e := range evs {
			if e.proc && named[procKeyOf(e.ev)] {
				continue // the member's own record dates it
			}
			s.apply(e)
			for k < len(quiet) && i >= quiet[k].last {
				if i == quiet[k].last {
					quiet[k].state, quiet[k].term, quiet[k].open = s.state, s.term, s.open
				}
				k++
			}
		}
		end := c.w1
		if s.since.After(end) {
			end = s.since
		}
		s.set("", end, 0, "") // close the last segment
		for _, t := range s.tenures {
			c.finishTenure(s, t)
		}
		c.mayHaveServed = append(c.mayHaveServed, c.silentServing(s, quiet)...)
		s.cutSilent()
		c.r.Lanes = append(c.r.Lanes, s.segs...)
		for _, t := range s.tenures {
			c.r.Leadership = append(c.r.Leadership, t.Tenure)
		}
	}
	slices.SortStableFunc(c.r.Leadership, func(a, b Tenure) int { return a.From.Compare(b.From) })
}

// termAt is the term of site's latest register write landed by t: the
// one a promote completing then was for (def when there is none).
func (c *computation) termAt(site string, t time.Time, def uint64) uint64 {
	si := int32(slices.Index(c.f.sites, site))
	term, at := def, int64(0)
	for i := range c.reg {
		if w := &c.reg[i]; w.v.site == si && w.t <= t.UnixNano() && w.t >= at {
			term, at = w.v.term, w.t
		}
	}
	return term
}

// procKey names a procedure chain of a site.
type procKey struct {
	kind procedure.ChainKind
	seq  uint64
}

func procKeyOf(ev events.Event) procKey {
	switch e := ev.(type) {
	case *procedure.ChainStarted:
		return procKey{e.Kind, e.Seq}
	case *procedure.StepFinished:
		return procKey{e.Kind, e.Seq}
	}
	return procKey{}
}

// silence is the end of a member's run of recorded events: from its last
// recorded event (evs[last]) to its next start (or the end of the record).
type silence struct {
	last     int
	from, to time.Time
	state    string  // its lane's state after that event
	term     uint64  // ... and term
	open     *tenure // a serving interval that had not ended by then
}

// silentServing finds where a site may have served in its silences
// although the record shows no serving of it there: a run of its unfenced
// register writes outside its serving intervals (a won acquire, an
// unfencing), or from the silence's start when it was promoting then. A
// run lasts until a fenced write of the site, the start of one of its
// serving intervals, its next start, or the rules' bound after the run's
// last write, whichever comes first.
func (c *computation) silentServing(s *siteRun, quiet []silence) []MaySpan {
	if len(quiet) == 0 {
		return nil
	}
	si := int32(slices.Index(c.f.sites, s.name))
	// served: where its serving intervals may have lasted.
	// (Its intervals are in time order; reach[i] is the latest any of the
	// first i+1 may have lasted, so a look-up walks back only over those
	// that can still hold t.)
	ends := make([]time.Time, len(s.tenures))
	reach := make([]time.Time, len(s.tenures))
	for i, x := range s.tenures {
		ends[i] = c.w1
		if x.To != nil {
			ends[i] = maxTime(*x.To, x.toLatest)
		}
		reach[i] = ends[i]
		if i > 0 {
			reach[i] = maxTime(reach[i], reach[i-1])
		}
	}
	served := func(t time.Time) (bool, time.Time) {
		i := sort.Search(len(s.tenures), func(i int) bool { return s.tenures[i].From.After(t) }) - 1
		for ; i >= 0 && !reach[i].Before(t); i-- {
			if !t.After(ends[i]) {
				return true, s.tenures[i].From
			}
		}
		return false, time.Time{}
	}
	type walk struct {
		cur  *MaySpan
		last time.Time
	}
	ws := make([]walk, len(quiet))
	var out []MaySpan
	closeAt := func(w *walk, t time.Time) {
		if t.After(w.cur.From) {
			w.cur.To = t
			w.cur.MS = ms(t.Sub(w.cur.From))
			out = append(out, *w.cur)
		}
		w.cur = nil
	}
	for k, q := range quiet {
		if q.open != nil || q.state != "promoting" {
			continue
		}
		w := &ws[k]
		w.cur = &MaySpan{Site: s.name, Term: q.term, From: q.from, Why: "promoting at its last recorded event; no record of it serving"}
		for _, t := range c.unfencedWrites(s.name, q.term) {
			if t <= q.from.UnixNano() {
				w.last = time.Unix(0, t).UTC()
			}
		}
	}
	// Silences are in time order and do not overlap; the register is in
	// revision order, which server-clock steps may keep from being time
	// order: each write finds its silence by its time.
	for i := range c.reg {
		r := &c.reg[i]
		if r.v.site != si {
			continue
		}
		k := sort.Search(len(quiet), func(k int) bool { return quiet[k].to.UnixNano() > r.t })
		if k == len(quiet) || r.t <= quiet[k].from.UnixNano() {
			continue
		}
		w := &ws[k]
		t := time.Unix(0, r.t).UTC()
		if in, from := served(t); in {
			if w.cur != nil {
				closeAt(w, from)
			}
			continue
		}
		switch {
		case r.v.fenced:
			if w.cur != nil {
				closeAt(w, t)
			}
		case w.cur == nil || r.v.term != w.cur.Term:
			if w.cur != nil {
				closeAt(w, t)
			}
			w.cur, w.last = &MaySpan{Site: s.name, Term: r.v.term, From: t, Why: "unfenced register writes after its last recorded event; no record of it serving"}, t
		default:
			w.last = t
		}
	}
	for k, q := range quiet {
		w := &ws[k]
		if w.cur == nil {
			continue
		}
		if w.last.IsZero() {
			continue // no write of the term: it never held the register
		}
		end := q.to
		if b, ok := c.stopBound(w.last); ok && b.Before(end) {
			end = b
		}
		closeAt(w, end)
	}
	slices.SortFunc(out, func(a, b MaySpan) int { return a.From.Compare(b.From) })
	return out
}

func (s *siteRun) apply(e eventRec) {
	t := e.t
	switch ev := e.ev.(type) {
	case *procedure.ChainStarted:
		// A fence or demote chain starting stops the database serving.
		if (ev.Kind == procedure.ChainFence || ev.Kind == procedure.ChainDemote) && s.open != nil {
			s.stop(t, ev.Kind.String()+" chain", e)
			s.set("stopping", t, s.term, ev.Kind.String()+" chain started")
		}
	case *procedure.StepFinished:
		// A promote step that succeeded makes it serve (serving_started
		// follows, when the member's record of it survived).
		if ev.Kind == procedure.ChainPromote && ev.Result == procedure.ResultOK {
			if x := s.open; x != nil {
				// It was not serving before a promote: the stop that ended
				// the interval is not in the record.
				x.restartAt, x.End = t, "promoted again"
				s.stopping, s.open = x, nil
			}
			term := s.c.termAt(s.name, t, s.term)
			from, basis := s.c.servedFrom(s.name, term, t, "promote_step")
			s.startServing(from, term, basis, ref(e))
			s.set("serving", t, term, "")
		}
	case *failover.Started:
		if s.open != nil {
			s.open.restartAt, s.open.End = t, "restart"
			s.stopping, s.open = s.open, nil
		} else if s.stopping != nil && s.stopping.upEnd.IsZero() {
			s.stopping.restartAt = t
		}
		s.stopping = nil
		s.set("starting", t, 0, "restarted: comes up fenced")
	case *failover.FenceRequested:
		s.then = ev.Then
		s.stop(t, "fence:"+ev.Reason.String(), e)
		s.set("stopping", t, ev.Term, "fencing ("+ev.Reason.String()+")")
	case *failover.Fenced:
		if s.stopping != nil && s.stopping.upEnd.IsZero() {
			s.stopping.upEnd, s.stopping.UpEvent = e.landed, landedRef(e) // landed: the split-brain check stays conservative
			s.stopping = nil
		}
		switch s.then {
		case failover.AfterFollow, failover.AfterResume:
			// After a restart's fence a member resumes holding only when the
			// register names it, and then records resumed.
			s.set("standby", t, 0, "")
		case failover.AfterRelease:
			s.set("stopping", t, s.term, "releasing")
		default:
			s.set("fenced", t, s.term, "")
		}
	case *failover.FenceFailed:
		if s.stopping != nil {
			s.stopping.fenceFailed = true
		}
	case *failover.AcquireAttempted:
		if s.open == nil {
			s.set("promoting", t, ev.Term, "acquiring ("+ev.Reason.String()+")")
		}
	case *failover.Promoted:
		s.set("promoting", t, ev.Term, "promoting ("+ev.Reason.String()+")")
	case *failover.PromotionRejected, *failover.AcquireFailed:
		s.set("standby", t, 0, "")
	case *failover.Resumed:
		s.set("fenced", t, ev.Term, "holds the register, fenced")
	case *failover.Unfenced:
		s.set("promoting", t, ev.Term, "unfenced")
	case *failover.ServingStarted:
		from, basis := s.c.servedFrom(s.name, ev.Term, t, "serving_started")
		s.startServing(from, ev.Term, basis, ref(e))
		s.set("serving", t, ev.Term, "")
	case *failover.PromoteFailed:
		s.set("stopping", t, s.term, "promote failed")
	case *failover.LeadershipLost:
		s.stop(t, "lost-register", e)
		s.set("stopping", t, ev.Term, "lost the register to "+ev.Holder.Site)
	case *failover.DemotionRequested:
		s.stop(t, "demote:"+ev.Reason.String(), e)
		s.set("stopping", t, s.term, "demoting ("+ev.Reason.String()+")")
	case *failover.Demoted:
		if s.stopping != nil && s.stopping.upEnd.IsZero() {
			s.stopping.upEnd, s.stopping.UpEvent = e.landed, landedRef(e) // landed: the split-brain check stays conservative
			s.stopping = nil
		}
		s.set("stopping", t, s.term, "releasing")
	case *failover.Released:
		s.set("standby", t, 0, "")
	}
}

// finishTenure sets how a serving interval ended, from its recorded stop
// and the register's evidence (see Tenure).
func (c *computation) finishTenure(s *siteRun, t *tenure) {
	cut := t.rawEnd
	if cut.IsZero() {
		cut = t.restartAt
	}
	// When its stop is not in the record (its events died with its
	// process), a fenced register write of the term after it served was
	// written by a suspended holder: it had stopped by then. (A stop in the
	// record, even late, shows that nothing of its member before it is
	// missing: its appends are in order.)
	var fencedAt time.Time
	if t.rawEnd.IsZero() {
		fencedAt = c.firstFencedWrite(s.name, t.Term, t.From)
	}
	limit := cut
	if !fencedAt.IsZero() && (limit.IsZero() || fencedAt.Before(limit)) {
		limit = fencedAt
	}
	// The last unfenced register write of the term, up to the stop.
	var last time.Time
	ws := c.unfencedWrites(s.name, t.Term)
	i := len(ws)
	if !limit.IsZero() {
		i, _ = slices.BinarySearch(ws, limit.UnixNano()+1)
	}
	if i > 0 {
		last = time.Unix(0, ws[i-1]).UTC()
	}
	// Node leadership: the lease goes on with every beat of the holder's
	// node in the epoch its register named, with no write of the register.
	lease := c.lastLease(s.name, t.Term, t.From, limit)
	// The record was read up to the later of its last record and the
	// window's end: silence until then is silence.
	recordEnd := maxTime(time.Unix(0, c.f.lastT).UTC(), c.w1)
	var bound time.Time
	known := false
	if !last.IsZero() {
		t.LastRegisterWrite = ptr(last)
	}
	if lease.After(last) {
		t.LastLiveness = ptr(lease)
		last = lease
	}
	if !last.IsZero() {
		bound, known = c.stopBound(last)
	}
	lastSeen := last
	if lastSeen.Before(t.From) {
		lastSeen = t.From
	}
	// latest is the latest the record allows it to have served: the rules'
	// bound, or sooner what shows it had stopped.
	latest := func(alsoBy ...time.Time) time.Time {
		l := bound
		for _, x := range append(alsoBy, fencedAt) {
			if !x.IsZero() && (l.IsZero() || x.Before(l)) {
				l = x
			}
		}
		if l.Before(lastSeen) {
			l = lastSeen
		}
		return l
	}
	switch {
	case !t.rawEnd.IsZero() && (!known || !t.rawEnd.After(bound)):
		t.To, t.EndBasis = ptr(t.rawEnd), "recorded"
		t.toLatest = t.rawEnd
	case !t.rawEnd.IsZero():
		// Dated later than the rules allow: its append was slow on the
		// wire (the record cannot see how slow), so the date only bounds it.
		t.To, t.EndBasis = ptr(lastSeen), "last-heartbeat"
		t.End += fmt.Sprintf(" (recorded late, at %s)", t.rawEnd.Format(timeFormat))
		t.toLatest = latest(t.rawEnd)
	case !t.restartAt.IsZero():
		t.EndBasis = "last-heartbeat"
		if known {
			t.To = ptr(lastSeen)
		} else {
			t.To = ptr(t.restartAt)
		}
		t.toLatest = latest(t.restartAt)
	case known && (bound.Before(recordEnd) || !fencedAt.IsZero()):
		t.To, t.End, t.EndBasis = ptr(lastSeen), "silent", "last-heartbeat"
		t.toLatest = latest()
	default:
		t.End, t.EndBasis = "open", "open"
	}
	if t.EndBasis == "last-heartbeat" && t.toLatest.After(*t.To) {
		t.ToLatest = ptr(t.toLatest)
	}
	switch {
	case !t.upEnd.IsZero() && (!known || !t.upEnd.After(bound) || t.fenceFailed):
		t.UpUntil = ptr(t.upEnd)
		t.UpBasis = "recorded: " + t.UpEvent.Type
	case known && (bound.Before(recordEnd) || !t.upEnd.IsZero() || !t.restartAt.IsZero()):
		u := bound
		if !t.restartAt.IsZero() && t.restartAt.Before(u) {
			u = t.restartAt
		}
		t.UpUntil = ptr(u)
		t.UpBasis = "bound: last unfenced register write + (failure_threshold+1) × heartbeat_timeout + fence_grace"
		if t.LastLiveness != nil {
			t.UpBasis = "bound: its node's last liveness write in the register's epoch + (failure_threshold+1) × heartbeat_timeout + fence_grace"
		}
		if !t.upEnd.IsZero() {
			t.UpBasis += fmt.Sprintf("; completion recorded late, at %s", t.upEnd.Format(timeFormat))
		}
	case !t.restartAt.IsZero():
		t.UpUntil, t.UpBasis = ptr(t.restartAt), "restart"
	default:
		t.UpBasis = "open"
	}
	// A release of the term in the register (leader = none, written after
	// the demote chain completed) shows it had stopped by then, however
	// late its stop events landed.
	if rel := c.releaseWrite(t.Term, t.From); !rel.IsZero() {
		if t.To != nil && t.To.After(rel) {
			t.To = ptr(rel)
			t.EndBasis += "; by the release register write"
		}
		if t.UpUntil != nil && t.UpUntil.After(rel) {
			t.UpUntil = ptr(rel)
			t.UpBasis += "; by the release register write"
		}
	}
	// A fenced register write of the term issued after it served
	// (fencedWrite) shows its fence had completed: only a suspended
	// member writes one. Its fenced event may land minutes later behind a
	// slow append queue, and a failed fence attempt before leaves the
	// rules' bound unproven.
	fencedBy := false
	{
		if fw := c.fencedWrite(s.name, t.Term, t.rawEnd); !fw.IsZero() {
			// A recorded stop stays when the member stopped, as
			// availability reads it; the last evidence that it served
			// (its node's beats, in node leadership) ends at the write.
			if t.To != nil && t.EndBasis == "last-heartbeat" && t.To.After(fw) {
				t.To = ptr(fw)
				t.EndBasis += "; by the fenced register write"
			}
			if t.UpUntil != nil && t.UpUntil.After(fw) {
				t.UpUntil = ptr(fw)
				t.UpBasis += "; by the fenced register write"
				fencedBy = true
			}
		}
	}
	// up_until is not before to, but for a fenced register write: that
	// proves the database had stopped, though the member's stop event, its
	// wire time not in the record, is dated later.
	if t.To != nil && t.UpUntil != nil && t.UpUntil.Before(*t.To) && !fencedBy {
		t.UpUntil = ptr(*t.To)
	}
	end := c.w1
	if t.To != nil {
		end = *t.To
	}
	t.DurationMS = ms(end.Sub(t.From))
}

// cutSilent ends the serving segment of a tenure whose end is its last
// heartbeat at that heartbeat, and marks what follows as without record.
func (s *siteRun) cutSilent() {
	var cuts []*tenure // in time order, as the segments
	for _, t := range s.tenures {
		if t.EndBasis == "last-heartbeat" && t.To != nil {
			cuts = append(cuts, t)
		}
	}
	if len(cuts) == 0 {
		return
	}
	out := make([]Segment, 0, len(s.segs)+len(cuts))
	k := 0
	for _, g := range s.segs {
		for k < len(cuts) && g.From.After(*cuts[k].To) {
			k++
		}
		if k < len(cuts) {
			if t := cuts[k]; g.State == "serving" && !g.From.Before(t.From) && g.To.After(*t.To) {
				rest := Segment{Site: s.name, State: "no-record", From: *t.To, To: g.To,
					Note: "last register write; no record of what followed until the next event"}
				g.To = *t.To
				out = append(out, g, rest)
				k++
				continue
			}
		}
		out = append(out, g)
	}
	s.segs = out
}

// --- failovers and handovers --------------------------------------------------

// unfencedWrites returns the times of a site's unfenced register writes
// of a term, in time order.
func (c *computation) unfencedWrites(site string, term uint64) []int64 {
	if c.unfenced == nil {
		c.unfenced = map[siteTerm][]int64{}
		for _, w := range c.reg {
			if w.v.site >= 0 && !w.v.fenced {
				k := siteTerm{c.siteName(int32(w.v.site)), w.v.term}
				c.unfenced[k] = append(c.unfenced[k], w.t)
			}
		}
		for _, ts := range c.unfenced {
			slices.Sort(ts)
		}
	}
	return c.unfenced[siteTerm{site, term}]
}

type siteTerm struct {
	site string
	term uint64
}

// firstFencedWrite is the first fenced register write of a site's term
// after an unfenced one that landed after from (zero: none): a suspended
// holder wrote it after the interval that began at from had served. (A
// fenced write that only lands after from may be older: an interval's
// start is dated by an event whose wait the node measured, and a jump of
// its clock makes that wait look longer.)
// releaseWrite is the server time of the first release of term (a
// register write naming no holder, in that term) after from, or zero.
// It is asked once per serving interval: the releases are indexed once
// (a scan of every register write per interval made an events-heavy
// history of 1M records fold 4–5 times slower).
func (c *computation) releaseWrite(term uint64, from time.Time) time.Time {
	if c.releases == nil {
		c.releases = map[uint64][]int64{}
		for _, w := range c.reg {
			if w.v.site < 0 {
				c.releases[w.v.term] = append(c.releases[w.v.term], w.t)
			}
		}
	}
	f := from.UnixNano()
	for _, t := range c.releases[term] { // a term's few releases, in revision order
		if t > f {
			return time.Unix(0, t).UTC()
		}
	}
	return time.Time{}
}

func (c *computation) firstFencedWrite(site string, term uint64, from time.Time) time.Time {
	c.indexFenced()
	k := siteTerm{site, term}
	uf := c.unfencedWrites(site, term)
	i, _ := slices.BinarySearch(uf, from.UnixNano()+1)
	if i == len(uf) {
		return time.Time{}
	}
	fs := c.fenced[k]
	j, _ := slices.BinarySearch(fs, uf[i]+1)
	if j == len(fs) {
		return time.Time{}
	}
	return time.Unix(0, fs[j]).UTC()
}

// fencedWrite is the server time of the fenced register write of a
// site's term that shows the interval ending at stop (zero: not recorded)
// had stopped: the first fenced write after the last unfenced one, with no
// unfenced write after it before stop (zero: none at all; an unfenced
// write after it before the stop means the site served again, and what it
// recorded of that was lost). A member numbers its writes of a term (the
// value's beat) and writes one at a time, so a fenced value with a higher
// beat than the unfenced one before it was issued after that one — after
// the acquire or the unfencing announcement the interval served on; an
// older fenced value landing late (its answer lost) carries a lower beat.
// Only a suspended member, its fence completed, writes a fenced value.
// The interval's start is not compared: a member's events may be dated
// late (their wire time is not in the record).
func (c *computation) fencedWrite(site string, term uint64, stop time.Time) time.Time {
	var unfenced uint64
	seen := false
	var fw regWrite
	for _, w := range c.writesOf(site, term) { // in revision order
		switch {
		case !w.v.fenced:
			if fw.rev != 0 && w.v.beat > fw.v.beat && (stop.IsZero() || w.t <= stop.UnixNano()) {
				fw = regWrite{}
			}
			unfenced, seen = w.v.beat, true
		case fw.rev == 0 && seen && w.v.beat > unfenced:
			fw = w
		}
	}
	if fw.rev == 0 {
		return time.Time{}
	}
	return time.Unix(0, fw.t).UTC()
}

// lastLease is, in node leadership, the server time of the last beat of
// the holder's node in an epoch named by the site's unfenced register
// writes of the term, landed after from and, when limit is set, not after
// it (zero: none, or per-pair leadership). Until failure_threshold of its
// node's liveness writes miss, a holder keeps serving with no write of
// its own (docs/failover.md).
func (c *computation) lastLease(site string, term uint64, from, limit time.Time) time.Time {
	if len(c.f.lives) == 0 {
		return time.Time{}
	}
	type lease struct {
		node  int32
		epoch uint64
	}
	var leases []lease
	for _, w := range c.writesOf(site, term) {
		if w.v.node >= 0 && !w.v.fenced {
			if l := (lease{w.v.node, w.v.epoch}); !slices.Contains(leases, l) {
				leases = append(leases, l)
			}
		}
	}
	if len(leases) == 0 {
		return time.Time{}
	}
	lives := c.f.lives
	if !slices.IsSortedFunc(lives, func(a, b liveWrite) int { return cmp.Compare(a.t, b.t) }) {
		// Folded out of order (the sources of a live read are merged in
		// order; a file is written in order): sorted once, in place.
		slices.SortStableFunc(lives, func(a, b liveWrite) int { return cmp.Compare(a.t, b.t) })
	}
	end := len(lives)
	if !limit.IsZero() {
		l := limit.UnixNano()
		end, _ = slices.BinarySearchFunc(lives, l+1, func(w liveWrite, t int64) int { return cmp.Compare(w.t, t) })
	}
	f := from.UnixNano()
	for i := end - 1; i >= 0 && lives[i].t > f; i-- {
		if w := lives[i]; w.own && slices.Contains(leases, lease{w.node, w.epoch}) {
			return time.Unix(0, w.t).UTC()
		}
	}
	return time.Time{}
}

// writesOf returns the register writes that name site as the holder in
// term, in revision order.
// servedFrom dates the start of a site's serving of term that its events
// date t (basis: which event): no earlier than the landing of the register
// write that made the site the holder of term (basis "acquire"), when the
// record holds it and the write before it. A member serves a term only
// once it has learnt that its acquire landed; its events are dated by the
// wait its node measured in its append queue, and a jump of the node's
// clock in that wait dates them early (3 s in the simulator's per-pair
// random seed 183, 20m: a serving_started before the release it followed,
// a split brain that never happened).
func (c *computation) servedFrom(site string, term uint64, t time.Time, basis string) (time.Time, string) {
	ws := c.writesOf(site, term)
	if len(ws) == 0 {
		return t, basis
	}
	if i := c.regIndex(ws[0].rev); i <= 0 {
		return t, basis // the acquire, or the write before it, is outside the record
	}
	if a := time.Unix(0, ws[0].t).UTC(); a.After(t) {
		return a, "acquire"
	}
	return t, basis
}

func (c *computation) writesOf(site string, term uint64) []regWrite {
	if c.termWrites == nil {
		c.termWrites = map[siteTerm][]regWrite{}
		for _, w := range c.reg {
			if w.v.site >= 0 {
				k := siteTerm{c.siteName(int32(w.v.site)), w.v.term}
				c.termWrites[k] = append(c.termWrites[k], w)
			}
		}
	}
	return c.termWrites[siteTerm{site, term}]
}

// indexFenced indexes the times of the fenced register writes by site and
// term, in time order.
func (c *computation) indexFenced() {
	if c.fenced != nil {
		return
	}
	c.fenced = map[siteTerm][]int64{}
	for _, w := range c.reg {
		if w.v.site >= 0 && w.v.fenced {
			k := siteTerm{c.siteName(int32(w.v.site)), w.v.term}
			c.fenced[k] = append(c.fenced[k], w.t)
		}
	}
	for _, ts := range c.fenced {
		slices.Sort(ts)
	}
}

func (c *computation) regIndex(rev uint64) int {
	i, ok := slices.BinarySearchFunc(c.reg, rev, func(w regWrite, rev uint64) int { return cmp.Compare(w.rev, rev) })
	if !ok {
		return -1
	}
	return i
}

func (c *computation) tenureOf(site string, term uint64, before time.Time) *tenure {
	s := c.bySite[site]
	if s == nil {
		return nil
	}
	var found *tenure
	for _, t := range s.tenures {
		if t.Term == term && (before.IsZero() || !t.From.After(before)) {
			found = t
		}
	}
	return found
}

func (c *computation) firstTenureFrom(site string, term uint64, from time.Time) *tenure {
	s := c.bySite[site]
	if s == nil {
		return nil
	}
	for _, t := range s.tenures {
		if t.Term == term && !t.From.Before(from) {
			return t
		}
	}
	return nil
}

func (c *computation) otherSite(site string) string {
	if c.r.Rules != nil {
		switch site {
		case c.r.Rules.Primary:
			return c.r.Rules.Replica
		case c.r.Rules.Replica:
			return c.r.Rules.Primary
		}
	}
	for _, s := range c.r.Sites {
		if s != site {
			return s
		}
	}
	return ""
}

// transitions finds the failovers and handovers. A failover is a takeover
// in the register's history: a write naming a site right after a write
// naming another. Every register write is a compare-and-set on the
// previous revision, so only an acquire that won can follow another
// holder's write. That finds the takeovers whose winner recorded
// `promoted` and those whose winner never got the answer and resumed the
// register it had won (no `promoted`: Resumed). A `promoted` whose winning
// write is not in the record (retention) is classified by its reason.
func (c *computation) transitions() {
	c.r.Failovers, c.r.Handovers = []Failover{}, []Handover{}
	promoted := map[uint64]bool{} // winning revisions with a promoted event
	for _, e := range c.evs {
		if p, ok := e.ev.(*failover.Promoted); ok && !e.proc {
			promoted[p.Rev] = true
		}
	}
	for i := 1; i < len(c.reg); i++ {
		w, prev := &c.reg[i], &c.reg[i-1]
		if w.v.site < 0 || prev.v.site < 0 || w.v.site == prev.v.site {
			continue
		}
		to := c.siteName(w.v.site)
		promotedAt := time.Unix(0, w.t).UTC()
		fo := c.failover(to, w.v.term, w.rev, promotedAt, prev, c.servingAt(to, w.v.term, promotedAt))
		fo.Resumed = !promoted[w.rev]
		c.r.Failovers = append(c.r.Failovers, fo)
	}
	for _, e := range c.evs {
		p, ok := e.ev.(*failover.Promoted)
		if !ok || e.proc {
			continue
		}
		to := c.siteName(e.site)
		promotedAt := e.t
		i := c.regIndex(p.Rev)
		var prev *regWrite
		switch {
		case i > 0:
			promotedAt = time.Unix(0, c.reg[i].t).UTC()
			prev = &c.reg[i-1]
			if prev.v.site >= 0 && prev.v.site != c.reg[i].v.site {
				continue // a takeover: found in the register above
			}
		case i == 0:
			promotedAt = time.Unix(0, c.reg[i].t).UTC()
		default:
			// The winning write is not in the record: the one before it is
			// the last write with a lower revision.
			j, _ := slices.BinarySearchFunc(c.reg, p.Rev, func(w regWrite, rev uint64) int { return cmp.Compare(w.rev, rev) })
			if j > 0 {
				prev = &c.reg[j-1]
			}
		}
		servingAt := c.servingAt(to, p.Term, promotedAt)
		if p.Reason == failover.AcquireStale && (prev == nil || (i < 0 && prev.v.site >= 0)) {
			// The holder it took over from is not in the record.
			c.r.Failovers = append(c.r.Failovers, c.failover(to, p.Term, p.Rev, promotedAt, prev, servingAt))
			continue
		}
		kind := p.Reason.String()
		if p.Reason == failover.AcquireStale {
			kind = "vacant" // leader = none went stale: its handoff was never taken
		}
		h := Handover{Kind: kind, Term: p.Term, To: to, PromotedAt: ptr(promotedAt), ServingAt: servingAt}
		var from string
		if prev != nil && prev.v.site < 0 {
			h.ReleasedAt = ptr(time.Unix(0, prev.t).UTC())
			if site, ok := c.index().released[prev.rev]; ok {
				from = c.siteName(site)
			}
			if from == "" && c.regIndex(prev.rev) > 0 {
				for j := c.regIndex(prev.rev) - 1; j >= 0; j-- {
					if c.reg[j].v.site >= 0 {
						from = c.siteName(int32(c.reg[j].v.site))
						break
					}
				}
			}
			if prev.v.planned {
				h.Kind = "switchover"
			}
		}
		if p.Reason == failover.AcquireHandoff || from != "" {
			// Why the previous holder stepped down: its last demotion request.
			ds := c.index().demotions[from]
			if i := sort.Search(len(ds), func(i int) bool { return ds[i].t.After(promotedAt) }); i > 0 {
				r := ds[i-1]
				h.RequestedAt = ptr(r.t)
				if p.Reason == failover.AcquireHandoff && h.Kind != "switchover" {
					h.Kind = r.ev.(*failover.DemotionRequested).Reason.String()
				}
			}
		}
		h.From = from
		if from != "" {
			if old := c.lastTenureBefore(from, promotedAt); old != nil && old.To != nil && servingAt != nil {
				h.ReadOnlyGapMS = ptr(ms(servingAt.Sub(*old.To)))
			}
		}
		c.r.Handovers = append(c.r.Handovers, h)
	}
	slices.SortStableFunc(c.r.Failovers, func(a, b Failover) int { return a.PromotedAt.Compare(*b.PromotedAt) })
}

// eventIndex finds the events transitions looks up, once.
type eventIndex struct {
	released  map[uint64]int32      // a released event's revision → its site
	demotions map[string][]eventRec // each site's demotion requests, in time order
	attempts  map[siteTerm][]int    // each site's acquire attempts of a term: indexes into evs
}

func (c *computation) index() *eventIndex {
	if c.idx != nil {
		return c.idx
	}
	x := &eventIndex{released: map[uint64]int32{}, demotions: map[string][]eventRec{}, attempts: map[siteTerm][]int{}}
	for k, e := range c.evs {
		switch ev := e.ev.(type) {
		case *failover.Released:
			x.released[ev.Rev] = e.site
		case *failover.DemotionRequested:
			site := c.siteName(e.site)
			x.demotions[site] = append(x.demotions[site], e)
		case *failover.AcquireAttempted:
			key := siteTerm{c.siteName(e.site), ev.Term}
			x.attempts[key] = append(x.attempts[key], k)
		}
	}
	c.idx = x
	return x
}

// servingAt is when to started serving the term it won at promotedAt.
func (c *computation) servingAt(to string, term uint64, promotedAt time.Time) *time.Time {
	if t := c.firstTenureFrom(to, term, promotedAt.Add(-time.Second)); t != nil {
		return ptr(t.From)
	}
	return nil
}

func (c *computation) lastTenureBefore(site string, t time.Time) *tenure {
	s := c.bySite[site]
	if s == nil {
		return nil
	}
	var found *tenure
	for _, x := range s.tenures {
		if x.From.Before(t) {
			found = x
		}
	}
	return found
}

func (c *computation) failover(to string, term, rev uint64, promotedAt time.Time, prev *regWrite, servingAt *time.Time) Failover {
	fo := Failover{Term: term, To: to, PromotedAt: ptr(promotedAt), ServingAt: servingAt, Reason: "stale register"}
	from := ""
	if prev != nil && prev.v.site >= 0 && c.siteName(int32(prev.v.site)) != to {
		from = c.siteName(int32(prev.v.site))
	}
	if from == "" {
		from = c.otherSite(to)
	}
	fo.From = from
	// The old holder's last register write before the winning one.
	fromIdx := int32(slices.Index(c.f.sites, from))
	var last *regWrite
	j, _ := slices.BinarySearchFunc(c.reg, rev, func(w regWrite, rev uint64) int { return cmp.Compare(w.rev, rev) })
	for j--; j >= 0; j-- {
		if w := &c.reg[j]; int32(w.v.site) == fromIdx {
			last = w
			break
		}
	}
	// The promotion attempt: the new holder's first attempt at this term
	// after that write.
	var attempt *eventRec
	for _, k := range c.index().attempts[siteTerm{to, term}] {
		if last != nil && c.evs[k].t.Before(time.Unix(0, last.t)) {
			continue
		}
		attempt = &c.evs[k]
		fo.StaleMS = ms(c.evs[k].ev.(*failover.AcquireAttempted).Stale)
		break
	}
	var attemptAt time.Time
	if attempt != nil {
		// The attempt issued the winning write, so it happened before that
		// write landed, whenever its own event was appended.
		attemptAt = minTime(attempt.t, promotedAt)
	}
	var lastAt time.Time
	switch {
	case last != nil:
		lastAt = time.Unix(0, last.t).UTC()
		fo.FromTerm = last.v.term
		if last.v.fenced {
			fo.Reason = "holder stayed fenced"
		}
	case attempt != nil && fo.StaleMS > 0:
		// The register's history no longer holds it: estimate from the
		// staleness the new holder saw when it decided.
		lastAt = attemptAt.Add(-time.Duration(fo.StaleMS * float64(time.Millisecond)))
		fo.Estimated = true
	}
	if attempt != nil {
		fo.PromotionAttemptAt = ptr(attemptAt)
	}
	if !lastAt.IsZero() {
		fo.LastPrimaryHeartbeat = ptr(lastAt)
		fo.FailoverMS = ptr(ms(promotedAt.Sub(lastAt)))
		if attempt != nil {
			fo.DetectionMS = ptr(ms(attemptAt.Sub(lastAt)))
		}
		if servingAt != nil {
			fo.ServingMS = ptr(ms(servingAt.Sub(lastAt)))
		}
	}
	old := c.lastTenureBefore(from, promotedAt)
	if fo.FromTerm != 0 {
		if t := c.tenureOf(from, fo.FromTerm, promotedAt); t != nil {
			old = t
		}
	}
	if old != nil {
		if fo.FromTerm == 0 {
			fo.FromTerm = old.Term
		}
		if !old.rawEnd.IsZero() && old.ToEvent != nil && old.ToEvent.Type == "failover.fence_requested" {
			fo.FenceRequestedAt = ptr(old.rawEnd)
		}
		if !old.upEnd.IsZero() && old.UpEvent != nil && old.UpEvent.Type == "failover.fenced" {
			fo.FencedAt = ptr(old.upEnd)
		}
		if old.To != nil && servingAt != nil {
			fo.ReadOnlyGapMS = ptr(ms(servingAt.Sub(*old.To)))
		}
	}
	return fo
}

// --- config, procedures -----------------------------------------------------

func (c *computation) configChanges() {
	byRev := map[uint64]*ConfigChange{}
	get := func(rev uint64) *ConfigChange {
		cc := byRev[rev]
		if cc == nil {
			cc = &ConfigChange{Rev: rev, Applied: []SiteAt{}, Rejected: []ConfigRefuse{}}
			byRev[rev] = cc
		}
		return cc
	}
	for _, w := range c.configs {
		cc := get(w.rev)
		cc.WrittenAt = ptr(time.Unix(0, w.t).UTC())
		if w.op != events.OpPut {
			cc.Rules = w.op.String()
		} else if rl, err := failover.DecodeRules(w.value); err == nil {
			cc.Rules = describeRules(rl)
		} else {
			cc.Rules = "undecodable: " + err.Error()
		}
	}
	for _, e := range c.evs {
		switch ev := e.ev.(type) {
		case *failover.ConfigApplied:
			cc := get(ev.Rev)
			cc.Applied = append(cc.Applied, SiteAt{Site: c.siteName(e.site), At: e.t})
			if cc.Rules == "" {
				cc.Rules = describeRules(ev.Rules)
			}
		case *failover.ConfigRejected:
			cc := get(ev.Rev)
			cc.Rejected = append(cc.Rejected, ConfigRefuse{Site: c.siteName(e.site), At: e.t, Field: ev.Field, Rule: ev.Rule, Value: ev.Value})
		}
	}
	c.r.ConfigChanges = []ConfigChange{}
	for _, rev := range slices.Sorted(maps.Keys(byRev)) {
		c.r.ConfigChanges = append(c.r.ConfigChanges, *byRev[rev])
	}
}

func describeRules(r failover.Rules) string {
	return fmt.Sprintf("heartbeat_timeout=%v failure_threshold=%d success_threshold=%d failover_timeout=%v fence_grace=%v failback=%v",
		r.HeartbeatTimeout, r.FailureThreshold, r.SuccessThreshold, r.FailoverTimeout, r.FenceGrace, r.Failback)
}

func (c *computation) procedures() {
	type key struct {
		site string
		kind procedure.ChainKind
		seq  uint64
	}
	// open: the latest chain of each key (a restarted member may number
	// its chains again).
	open := map[key]*Chain{}
	var order []*Chain
	start := func(k key) *Chain {
		ch := &Chain{Site: k.site, Kind: k.kind.String(), Seq: k.seq, Steps: []Step{}}
		open[k] = ch
		order = append(order, ch)
		return ch
	}
	get := func(k key) *Chain {
		if ch := open[k]; ch != nil {
			return ch
		}
		return start(k) // its start is not in the record
	}
	for _, e := range c.evs {
		if !e.proc {
			continue
		}
		site := c.siteName(e.site)
		switch ev := e.ev.(type) {
		case *procedure.ChainStarted:
			start(key{site, ev.Kind, ev.Seq}).StartedAt = ptr(e.t)
		case *procedure.StepStarted:
			ch := get(key{site, ev.Kind, ev.Seq})
			ch.Steps = append(ch.Steps, Step{Index: ev.Index, Name: ev.Name, Driver: ev.Driver, Command: ev.Command})
			if ev.Index > 0 {
				ch.Escalated = true
			}
		case *procedure.StepFinished:
			ch := get(key{site, ev.Kind, ev.Seq})
			i := slices.IndexFunc(ch.Steps, func(s Step) bool { return s.Index == ev.Index })
			if i < 0 {
				ch.Steps = append(ch.Steps, Step{Index: ev.Index, Name: ev.Name})
				i = len(ch.Steps) - 1
			}
			st := &ch.Steps[i]
			st.Result, st.Exit, st.TookMS, st.Detail = ev.Result.String(), ev.ExitCode, ms(ev.Took), ev.Detail
		case *procedure.ChainFinished:
			ch := get(key{site, ev.Kind, ev.Seq})
			ch.FinishedAt, ch.OK, ch.Superseded, ch.TookMS, ch.Detail = ptr(e.t), ptr(ev.OK), ev.Superseded, ms(ev.Took), ev.Detail
		}
	}
	c.r.Procedures = []Chain{}
	for _, ch := range order {
		if ch.Escalated {
			c.r.Escalations++
		}
		c.r.Procedures = append(c.r.Procedures, *ch)
	}
}

// --- split brain --------------------------------------------------------------

func (c *computation) splitBrain() {
	c.r.SplitBrain = []Overlap{}
	end := time.Unix(0, c.f.lastT).UTC()
	upTo := func(t Tenure) time.Time {
		if t.UpUntil != nil {
			return *t.UpUntil
		}
		return end
	}
	ls := c.r.Leadership // by From
	for i := range ls {
		for j := i + 1; j < len(ls) && ls[j].From.Before(upTo(ls[i])); j++ {
			a, b := ls[i], ls[j]
			if a.Site == b.Site {
				continue
			}
			from := maxTime(a.From, b.From)
			to := minTime(upTo(a), upTo(b))
			if !from.Before(to) {
				continue
			}
			c.r.SplitBrain = append(c.r.SplitBrain, Overlap{From: from, To: to, MS: ms(to.Sub(from)), Intervals: [2]Tenure{a, b}})
		}
	}
}

// --- heartbeats ---------------------------------------------------------------

func (c *computation) heartbeats() {
	for _, site := range c.r.Sites {
		si := int32(slices.Index(c.f.sites, site))
		if si < 0 {
			continue // named by the rules only
		}
		// Sized for the most a site can have: one allocation each.
		reg, mem := make([]int64, 0, len(c.reg)), make([]int64, 0, len(c.hbs)) // intervals, ns
		hs := SiteHeartbeats{}
		regTimes := make([]int64, 0, len(c.reg))
		var regLong, memLong []Gap
		regMarks := heartbeatMarks{Site: site, Series: "register", Bins: make([]uint32, markBins)}
		memMarks := heartbeatMarks{Site: site, Series: "member", Bins: make([]uint32, markBins)}
		var prev *regWrite
		for k := range c.reg {
			w := &c.reg[k]
			if w.v.site != si || !c.inWindow(w.t) {
				continue
			}
			regTimes = append(regTimes, w.t)
			regMarks.Bins[c.bin(w.t)]++
			hs.Register.Count++
			if w.v.fenced {
				hs.Register.Fenced++
			}
			if prev != nil && prev.v.term == w.v.term {
				d := w.t - prev.t
				reg = append(reg, d)
				regLong = c.keepLongest(regLong, prev.t, w.t)
				if c.isGap(prev.t, d) {
					hs.Register.Gaps++
				}
			}
			prev = w
		}
		setSpan(&hs.Register, regTimes)

		memTimes := make([]int64, 0, len(c.hbs))
		var last *hbWrite
		ri := 0
		for k := range c.hbs {
			h := &c.hbs[k]
			if h.site != si || !c.inWindow(h.t) {
				continue
			}
			memTimes = append(memTimes, h.t)
			memMarks.Bins[c.bin(h.t)]++
			hs.Member.Count++
			if last != nil {
				// Not across a stretch where the site held the register.
				for ri < len(regTimes) && regTimes[ri] <= last.t {
					ri++
				}
				held := ri < len(regTimes) && regTimes[ri] < h.t
				if !held && h.t >= last.t {
					d := h.t - last.t
					mem = append(mem, d)
					memLong = c.keepLongest(memLong, last.t, h.t)
					if c.isGap(last.t, d) {
						hs.Member.Gaps++
					}
					if h.beat > last.beat+1 {
						hs.Member.Missed += h.beat - last.beat - 1
					}
				}
			}
			last = h
		}
		setSpan(&hs.Member, memTimes)
		fillStats(&hs.Register, reg, regLong)
		fillStats(&hs.Member, mem, memLong)
		c.r.Heartbeats[site] = hs
		c.r.marks = append(c.r.marks, regMarks, memMarks)
	}
}

// bin is the heartbeat-mark bin of t (in the window).
func (c *computation) bin(t int64) int {
	span := c.w1.UnixNano() - c.w0.UnixNano()
	if span <= 0 {
		return 0
	}
	b := int(float64(t-c.w0.UnixNano()) / float64(span) * markBins)
	return min(max(b, 0), markBins-1)
}

func (c *computation) inWindow(t int64) bool {
	return t >= c.w0.UnixNano() && t <= c.w1.UnixNano()
}

// isGap: an interval longer than 1.5 × heartbeat_timeout of the rules then.
// It is rulesAt's answer, looked up by Unix ns from the rule last used
// (heartbeats come in time order).
func (c *computation) isGap(at, d int64) bool {
	if len(c.rules) == 0 {
		return false
	}
	if len(c.gapFrom) != len(c.rules) {
		c.gapFrom, c.gapOver, c.gapRule = make([]int64, len(c.rules)), make([]int64, len(c.rules)), 0
		for i, rc := range c.rules {
			c.gapFrom[i], c.gapOver[i] = rc.t.UnixNano(), -1
			if rc.rules.HeartbeatTimeout > 0 {
				c.gapOver[i] = int64(rc.rules.HeartbeatTimeout) * 3 / 2
			}
		}
	}
	// The rule in force: the last to take effect at or before at (the
	// first when none did).
	i := c.gapRule
	if (i > 0 && at < c.gapFrom[i]) || (i+1 < len(c.gapFrom) && at >= c.gapFrom[i+1]) {
		i = max(sort.Search(len(c.gapFrom), func(k int) bool { return c.gapFrom[k] > at })-1, 0)
		c.gapRule = i
	}
	return c.gapOver[i] >= 0 && d > c.gapOver[i]
}

// longestKept is how many of the longest intervals each series keeps.
const longestKept = 5

func (c *computation) keepLongest(g []Gap, from, to int64) []Gap {
	d := ms(time.Duration(to - from))
	if len(g) == longestKept && d <= g[len(g)-1].MS {
		return g
	}
	x := Gap{From: ptr(time.Unix(0, from).UTC()), To: ptr(time.Unix(0, to).UTC()), MS: d}
	i, _ := slices.BinarySearchFunc(g, d, func(a Gap, d float64) int { return cmp.Compare(d, a.MS) })
	g = slices.Insert(g, i, x)
	if len(g) > longestKept {
		g = g[:longestKept]
	}
	return g
}

func setSpan(s *HeartbeatStats, times []int64) {
	if len(times) == 0 {
		return
	}
	s.First = ptr(time.Unix(0, slices.Min(times)).UTC())
	s.Last = ptr(time.Unix(0, slices.Max(times)).UTC())
}

func fillStats(s *HeartbeatStats, d []int64, longest []Gap) {
	s.Intervals = len(d)
	s.Longest = longest
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	var sum int64
	for _, x := range d {
		sum += x
	}
	pct := func(p float64) float64 {
		i := int(float64(len(d)-1)*p/100 + 0.5)
		return ms(time.Duration(d[min(max(i, 0), len(d)-1)]))
	}
	s.MeanMS = ms(time.Duration(sum / int64(len(d))))
	s.P50MS, s.P90MS, s.P99MS = pct(50), pct(90), pct(99)
	s.MaxGap = ms(time.Duration(d[len(d)-1]))
}

// --- availability -------------------------------------------------------------

func (c *computation) availability() {
	type span struct {
		a, b  time.Time
		site  string
		basis string
	}
	clip := func(a, b time.Time) (time.Time, time.Time, bool) {
		a, b = maxTime(a, c.w0), minTime(b, c.w1)
		return a, b, a.Before(b)
	}
	// spans: where someone certainly served; maybe: where someone may have
	// (those and each interval up to the latest it may have stopped, and
	// the silent stretches of register writes).
	var spans, maybe []span
	for _, t := range c.r.Leadership {
		b, latest := c.w1, c.w1
		if t.To != nil {
			b, latest = *t.To, *t.To
		}
		if t.ToLatest != nil {
			latest = *t.ToLatest
		}
		if x, y, ok := clip(t.From, b); ok {
			spans = append(spans, span{x, y, t.Site, t.EndBasis})
		}
		if x, y, ok := clip(t.From, latest); ok {
			maybe = append(maybe, span{x, y, t.Site, ""})
		}
	}
	for _, m := range c.mayHaveServed {
		if x, y, ok := clip(m.From, m.To); ok {
			maybe = append(maybe, span{x, y, m.Site, ""})
		}
	}
	slices.SortFunc(spans, func(x, y span) int { return x.a.Compare(y.a) })
	slices.SortFunc(maybe, func(x, y span) int { return x.a.Compare(y.a) })
	// maybe as a union of disjoint stretches, in order.
	var union []span
	for _, m := range maybe {
		if n := len(union); n > 0 && !m.a.After(union[n-1].b) {
			union[n-1].b = maxTime(union[n-1].b, m.b)
			continue
		}
		union = append(union, m)
	}
	// The register's may-have-served stretches, by start, with the latest
	// end so far (to find those that reach into an outage).
	mays := c.mayHaveServed
	slices.SortFunc(mays, func(x, y MaySpan) int { return x.From.Compare(y.From) })
	mayReach := make([]time.Time, len(mays))
	for i, m := range mays {
		mayReach[i] = m.To
		if i > 0 {
			mayReach[i] = maxTime(m.To, mayReach[i-1])
		}
	}
	var served, out, outMin, longestMin time.Duration
	var cur *span
	var longest time.Duration
	var longestAt time.Time
	bounded := 0
	outages := []Outage{}
	gap := func(from *span, to time.Time, by string) {
		d := to.Sub(from.b)
		if d > longest {
			longest, longestAt = d, from.b
		}
		out += d
		o := Outage{From: from.b, To: to, MS: ms(d), After: from.site, AfterBasis: from.basis, By: by, Open: by == ""}
		// What is left of it once every stretch where someone may have
		// served is taken out.
		var certain []Span
		var least time.Duration
		at := from.b
		for i := sort.Search(len(union), func(i int) bool { return union[i].b.After(at) }); i < len(union) && union[i].a.Before(to); i++ {
			m := union[i]
			if m.a.After(at) {
				certain = append(certain, Span{From: at, To: m.a, MS: ms(m.a.Sub(at))})
			}
			at = m.b
		}
		if at.Before(to) {
			certain = append(certain, Span{From: at, To: to, MS: ms(to.Sub(at))})
		}
		for _, p := range certain {
			least += p.To.Sub(p.From)
			longestMin = max(longestMin, p.To.Sub(p.From))
		}
		outMin += least
		o.MinMS = ms(least)
		if least < d {
			bounded++
			o.Bounded, o.Certain = true, certain
			if len(certain) == 0 || certain[0].From.After(from.b) {
				latest := to
				if len(certain) > 0 {
					latest = certain[0].From
				}
				o.FromLatest = ptr(latest)
			}
			i := sort.Search(len(mays), func(i int) bool { return !mays[i].From.Before(to) }) - 1
			for ; i >= 0 && mayReach[i].After(from.b); i-- {
				if m := mays[i]; m.To.After(from.b) {
					o.MayHaveServed = append(o.MayHaveServed, m)
				}
			}
			slices.Reverse(o.MayHaveServed)
			o.Why = c.outageWhy(o)
		}
		outages = append(outages, o)
	}
	for i := range spans {
		s := spans[i]
		switch {
		case cur == nil:
			cur = &s
		case !s.a.After(cur.b):
			if s.b.After(cur.b) {
				cur.b, cur.site, cur.basis = s.b, s.site, s.basis
			}
		default:
			served += cur.b.Sub(cur.a)
			gap(cur, s.a, s.site)
			cur = &s
		}
	}
	if cur != nil {
		served += cur.b.Sub(cur.a)
		if cur.b.Before(c.w1) {
			gap(cur, c.w1, "")
		}
	}
	a := Availability{ServedMS: ms(served), ReadOnlyMS: ms(c.w1.Sub(c.w0) - served), LongestGapMS: ms(longest), OutageMS: ms(out), Outages: outages,
		OutageMinMS: ms(outMin), LongestGapMinMS: ms(longestMin), Bounded: bounded}
	if w := c.w1.Sub(c.w0); w > 0 {
		a.Fraction = float64(served) / float64(w)
	}
	if longest > 0 {
		a.LongestGapAt = ptr(longestAt)
	}
	c.r.Availability = a
}

// outageWhy says what the record cannot show about a bounded outage.
func (c *computation) outageWhy(o Outage) string {
	var parts []string
	if o.FromLatest != nil {
		parts = append(parts, fmt.Sprintf("%s's stop is not in the record in time: it served at least until its last register write at %s and by the rules stopped by %s",
			o.After, o.From.Format(timeFormat), o.FromLatest.Format(timeFormat)))
	}
	for _, m := range o.MayHaveServed {
		parts = append(parts, fmt.Sprintf("%s may have served from %s to %s (%s)", m.Site, m.From.Format(timeFormat), m.To.Format(timeFormat), m.Why))
	}
	if len(parts) == 0 {
		parts = append(parts, "a serving interval's end is not in the record")
	}
	return strings.Join(parts, "; ")
}

// --- timeline, records --------------------------------------------------------

func (c *computation) timeline() {
	c.r.Timeline = []TimelineEvent{}
	for _, e := range c.evs {
		te := TimelineEvent{Time: e.t, Site: c.siteName(e.site), Type: e.ev.EventType(), Detail: describe(e.ev), Subject: e.subject, Sequence: e.seq}
		switch ev := e.ev.(type) {
		case *procedure.StepStarted:
			continue // its result says all
		case *failover.HeartbeatFailed:
		case *failover.Promoted:
			if ev.Reason == failover.AcquireStale {
				te.Mark = "failover"
			} else {
				te.Mark = "handover"
			}
		case *procedure.StepFinished:
			if ev.Result != procedure.ResultOK {
				te.Mark = "escalation"
			}
		case *failover.ConfigApplied, *failover.ConfigRejected:
			te.Mark = "config"
		}
		c.r.Timeline = append(c.r.Timeline, te)
	}
	kvEvent := func(w kvWrite, what string) TimelineEvent {
		return TimelineEvent{Time: time.Unix(0, w.t).UTC(), Type: what, Subject: "$KV." + c.f.opts.Bucket + "." + w.key, Sequence: w.rev}
	}
	for _, w := range c.configs {
		te := kvEvent(w, "kv.config_written")
		te.Mark = "config"
		if rl, err := failover.DecodeRules(w.value); err == nil {
			te.Detail = describeRules(rl)
		}
		c.r.Timeline = append(c.r.Timeline, te)
	}
	for _, w := range c.switchovers {
		var te TimelineEvent
		switch {
		case strings.HasSuffix(w.key, ".pause"):
			te = kvEvent(w, "kv.pause_written")
			if p, err := failover.DecodePause(w.value); err == nil {
				te.Detail = fmt.Sprintf("id=%s paused=%v reason=%q", p.ID, p.Paused, p.Reason)
			}
		case strings.HasSuffix(w.key, ".failover"):
			te = kvEvent(w, "kv.failover_requested")
			if f, err := failover.DecodeManualFailover(w.value); err == nil {
				te.Detail = fmt.Sprintf("id=%s to=%s force=%v", f.ID, f.To, f.Force)
				te.Site = f.To
			}
		default:
			te = kvEvent(w, "kv.switchover_requested")
			if s, err := failover.DecodeSwitchover(w.value); err == nil {
				te.Detail = fmt.Sprintf("id=%s to=%s", s.ID, s.To)
				te.Site = s.To
			}
		}
		c.r.Timeline = append(c.r.Timeline, te)
	}
	for _, w := range c.markers {
		c.r.Timeline = append(c.r.Timeline, kvEvent(w, "kv."+w.op.String()))
	}
	slices.SortStableFunc(c.r.Timeline, func(a, b TimelineEvent) int { return a.Time.Compare(b.Time) })
}

// dropForged leaves out of the register's history the values no member
// wrote, as far as the record tells: those that name a holder and say
// another site wrote them, and the revisions a member recorded as no
// member's (failover.forged_value_ignored: its signature did not verify,
// or its writer is not the holder). The members verified signatures; the
// record cannot (it holds no keys), so a value forged unsigned that no
// member saw stays in. Leadership never moved on any of them.
func (c *computation) dropForged() {
	forged := map[uint64]bool{}
	for _, e := range c.evs {
		if fv, ok := e.ev.(*failover.ForgedValueIgnored); ok && !e.proc {
			forged[fv.Rev] = true
		}
	}
	if len(forged) == 0 && !slices.ContainsFunc(c.reg, func(w regWrite) bool { return w.v.forAnother }) {
		return
	}
	kept := make([]regWrite, 0, len(c.reg))
	for _, w := range c.reg {
		if forged[w.rev] || w.v.forAnother {
			c.forgedWrites++
			continue
		}
		kept = append(kept, w)
	}
	c.reg = kept
}

func (c *computation) records() {
	f := c.f
	c.r.Records = RecordsReport{
		ForgedRegister: c.forgedWrites,
		RecordCounts:   f.counts,
		UnknownTypes:   maps.Clone(f.unknown),
		UnknownList:    slices.Clone(f.unknownEx),
		CorruptList:    slices.Clone(f.corrupt),
		GapList:        slices.Clone(f.gaps),
		TruncatedList:  slices.Clone(f.truncated),
	}
}

// --- helpers ------------------------------------------------------------------

const timeFormat = "2006-01-02T15:04:05.000Z07:00"

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func ptr[T any](v T) *T { return &v }

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
