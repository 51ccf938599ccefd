package projections

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
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
	// unfenced: the times of the unfenced register writes per site and term.
	unfenced map[siteTerm][]int64
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
	c.reg = f.reg // read only; sorted in a copy when it came out of order
	if !slices.IsSortedFunc(c.reg, func(a, b regWrite) int { return cmp.Compare(a.rev, b.rev) }) {
		c.reg = slices.Clone(c.reg)
		slices.SortFunc(c.reg, func(a, b regWrite) int { return cmp.Compare(a.rev, b.rev) })
	}
	c.hbs = c.f.hbs
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
		c.r.Window.Asked = true
		if last.IsZero() || f.opts.To.Before(last) {
			c.w1 = f.opts.To.UTC()
		}
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
	return last.Add(time.Duration(rl.FailureThreshold+1)*rl.HeartbeatTimeout + rl.FenceGrace), true
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
		for _, e := range c.evs {
			if !e.proc && c.siteName(e.site) == s.name {
				evs = append(evs, e)
			}
		}
		if w, ok := inferred[s.name]; ok {
			t := time.Unix(0, w.t).UTC()
			// Only when nothing the member recorded comes before it.
			if len(evs) == 0 || !evs[0].t.Before(t) {
				s.startServing(t, w.v.term, "register", &EventRef{Subject: "$KV." + c.f.opts.Bucket + "." + c.f.opts.Pair + ".leader", Sequence: w.rev, Type: "register write", Time: t})
				s.set("serving", t, w.v.term, "inferred from the register")
			}
		}
		for _, e := range evs {
			s.apply(e)
		}
		end := c.w1
		if s.since.After(end) {
			end = s.since
		}
		s.set("", end, 0, "") // close the last segment
		for _, t := range s.tenures {
			c.finishTenure(s, t)
		}
		s.cutSilent()
		c.r.Lanes = append(c.r.Lanes, s.segs...)
		for _, t := range s.tenures {
			c.r.Leadership = append(c.r.Leadership, t.Tenure)
		}
	}
	slices.SortStableFunc(c.r.Leadership, func(a, b Tenure) int { return a.From.Compare(b.From) })
}

func (s *siteRun) apply(e eventRec) {
	t := e.t
	switch ev := e.ev.(type) {
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
		s.startServing(t, ev.Term, "serving_started", ref(e))
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
	// The last unfenced register write of the term, up to the stop.
	var last time.Time
	for _, wt := range c.unfencedWrites(s.name, t.Term) {
		if !cut.IsZero() && wt > cut.UnixNano() {
			break
		}
		last = time.Unix(0, wt).UTC()
	}
	recordEnd := time.Unix(0, c.f.lastT).UTC()
	var bound time.Time
	known := false
	if !last.IsZero() {
		t.LastRegisterWrite = ptr(last)
		bound, known = c.stopBound(last)
	}
	lastSeen := last
	if lastSeen.Before(t.From) {
		lastSeen = t.From
	}
	switch {
	case !t.rawEnd.IsZero() && (!known || !t.rawEnd.After(bound)):
		t.To, t.EndBasis = ptr(t.rawEnd), "recorded"
	case !t.rawEnd.IsZero():
		t.To, t.EndBasis = ptr(lastSeen), "last-heartbeat"
		t.End += fmt.Sprintf(" (recorded late, at %s)", t.rawEnd.Format(timeFormat))
	case !t.restartAt.IsZero():
		t.EndBasis = "last-heartbeat"
		if known {
			t.To = ptr(lastSeen)
		} else {
			t.To = ptr(t.restartAt)
		}
	case known && bound.Before(recordEnd):
		t.To, t.End, t.EndBasis = ptr(lastSeen), "silent", "last-heartbeat"
	default:
		t.End, t.EndBasis = "open", "open"
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
		if !t.upEnd.IsZero() {
			t.UpBasis += fmt.Sprintf("; completion recorded late, at %s", t.upEnd.Format(timeFormat))
		}
	case !t.restartAt.IsZero():
		t.UpUntil, t.UpBasis = ptr(t.restartAt), "restart"
	default:
		t.UpBasis = "open"
	}
	if t.To != nil && t.UpUntil != nil && t.UpUntil.Before(*t.To) {
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
	for _, t := range s.tenures {
		if t.EndBasis != "last-heartbeat" || t.To == nil {
			continue
		}
		for i := range s.segs {
			g := &s.segs[i]
			if g.State != "serving" || g.From.Before(t.From) || !g.To.After(*t.To) || g.From.After(*t.To) {
				continue
			}
			rest := Segment{Site: s.name, State: "no-record", From: *t.To, To: g.To,
				Note: "last register write; no record of what followed until the next event"}
			g.To = *t.To
			s.segs = slices.Insert(s.segs, i+1, rest)
			break
		}
	}
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
			for _, r := range c.evs {
				if rel, ok := r.ev.(*failover.Released); ok && rel.Rev == prev.rev {
					from = c.siteName(r.site)
				}
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
			for _, r := range c.evs {
				if r.t.After(promotedAt) {
					break
				}
				if d, ok := r.ev.(*failover.DemotionRequested); ok && c.siteName(r.site) == from {
					h.RequestedAt = ptr(r.t)
					if p.Reason == failover.AcquireHandoff && h.Kind != "switchover" {
						h.Kind = d.Reason.String()
					}
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
	for k := range c.evs {
		a, ok := c.evs[k].ev.(*failover.AcquireAttempted)
		if !ok || c.siteName(c.evs[k].site) != to || a.Term != term {
			continue
		}
		if last != nil && c.evs[k].t.Before(time.Unix(0, last.t)) {
			continue
		}
		attempt = &c.evs[k]
		fo.StaleMS = ms(a.Stale)
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
	ls := c.r.Leadership
	for i := range ls {
		for j := i + 1; j < len(ls); j++ {
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
func (c *computation) isGap(at, d int64) bool {
	rl, ok := c.rulesAt(time.Unix(0, at))
	if !ok || rl.HeartbeatTimeout <= 0 {
		return false
	}
	return d > int64(rl.HeartbeatTimeout)*3/2
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
	var spans []span
	for _, t := range c.r.Leadership {
		b := c.w1
		if t.To != nil {
			b = *t.To
		}
		a := maxTime(t.From, c.w0)
		b = minTime(b, c.w1)
		if a.Before(b) {
			spans = append(spans, span{a, b, t.Site, t.EndBasis})
		}
	}
	slices.SortFunc(spans, func(x, y span) int { return x.a.Compare(y.a) })
	var served, out time.Duration
	var cur *span
	var longest time.Duration
	var longestAt time.Time
	outages := []Outage{}
	gap := func(from *span, to time.Time, by string) {
		d := to.Sub(from.b)
		if d > longest {
			longest, longestAt = d, from.b
		}
		out += d
		outages = append(outages, Outage{From: from.b, To: to, MS: ms(d), After: from.site, AfterBasis: from.basis, By: by, Open: by == ""})
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
	a := Availability{ServedMS: ms(served), ReadOnlyMS: ms(c.w1.Sub(c.w0) - served), LongestGapMS: ms(longest), OutageMS: ms(out), Outages: outages}
	if w := c.w1.Sub(c.w0); w > 0 {
		a.Fraction = float64(served) / float64(w)
	}
	if longest > 0 {
		a.LongestGapAt = ptr(longestAt)
	}
	c.r.Availability = a
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
		te := kvEvent(w, "kv.switchover_requested")
		if s, err := failover.DecodeSwitchover(w.value); err == nil {
			te.Detail = fmt.Sprintf("id=%s to=%s", s.ID, s.To)
			te.Site = s.To
		}
		c.r.Timeline = append(c.r.Timeline, te)
	}
	for _, w := range c.markers {
		c.r.Timeline = append(c.r.Timeline, kvEvent(w, "kv."+w.op.String()))
	}
	slices.SortStableFunc(c.r.Timeline, func(a, b TimelineEvent) int { return a.Time.Compare(b.Time) })
}

func (c *computation) records() {
	f := c.f
	c.r.Records = RecordsReport{
		RecordCounts:  f.counts,
		UnknownTypes:  maps.Clone(f.unknown),
		UnknownList:   slices.Clone(f.unknownEx),
		CorruptList:   slices.Clone(f.corrupt),
		GapList:       slices.Clone(f.gaps),
		TruncatedList: slices.Clone(f.truncated),
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
