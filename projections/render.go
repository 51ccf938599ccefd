package projections

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Format is an output format of a report.
type Format int

const (
	FormatText Format = iota + 1
	FormatJSON
	FormatHTML
)

func (f Format) String() string {
	switch f {
	case FormatText:
		return "text"
	case FormatJSON:
		return "json"
	case FormatHTML:
		return "html"
	}
	return "unset"
}

// ParseFormat reads "text", "json" or "html".
func ParseFormat(s string) (Format, error) {
	for _, f := range []Format{FormatText, FormatJSON, FormatHTML} {
		if s == f.String() {
			return f, nil
		}
	}
	return 0, fmt.Errorf("unknown format %q: use text, json or html", s)
}

// Render writes r in format f.
func Render(w io.Writer, r *Report, f Format) error {
	switch f {
	case FormatText:
		return WriteText(w, r)
	case FormatJSON:
		return WriteJSON(w, r)
	case FormatHTML:
		return WriteHTML(w, r)
	}
	return fmt.Errorf("projections: render: format %v", f)
}

// WriteJSON writes r as one indented JSON object.
func WriteJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes r as a readable report: a leadership timeline, the
// failover table, the split-brain verdict, heartbeats, and the event
// timeline, framed by a PARTIAL banner when the record was cut short.
func WriteText(out io.Writer, r *Report) error {
	w := bufio.NewWriter(out)
	tf := clockFormat(r.Window)
	at := func(t *time.Time) string { return clockOrDash(t, tf) }
	partial := func() {
		if r.Partial != nil {
			fmt.Fprintf(w, "*** PARTIAL: the record ended in an error; only the %d records read before byte %d are shown ***\n*** %s ***\n",
				r.Partial.Recovered, r.Partial.Offset, r.Partial.Error)
		}
	}
	partial()
	fmt.Fprintf(w, "pair %s   window %s → %s (%s)", r.Pair, r.Window.From.Format(time.RFC3339Nano), r.Window.To.Format(time.RFC3339Nano), dur(r.Window.MS))
	if r.Source != "" {
		fmt.Fprintf(w, "   source %s", r.Source)
	}
	fmt.Fprintln(w)
	if tf != time.RFC3339Nano {
		fmt.Fprintf(w, "times below: %s UTC, JetStream server time\n", r.Window.From.Format("2006-01-02"))
	}
	if rl := r.Rules; rl != nil {
		fmt.Fprintf(w, "rules: primary %s, replica %s, heartbeat_timeout %s, failure_threshold %d, success_threshold %d, failover_timeout %s, fence_grace %s, failback %s\n",
			rl.Primary, rl.Replica, dur(rl.HeartbeatTimeoutMS), rl.FailureThreshold, rl.SuccessThreshold, dur(rl.FailoverTimeoutMS), dur(rl.FenceGraceMS), rl.Failback)
	}

	fmt.Fprintf(w, "\nLEADERSHIP (who served when)\n")
	if len(r.Leadership) == 0 {
		fmt.Fprintf(w, "  nobody served in the record\n")
	}
	tw := newTable(w, "  ", "SITE", "TERM", "FROM", "TO", "FOR", "END")
	for _, t := range r.Leadership {
		from := t.From.Format(tf)
		if t.FromBasis == "register" {
			from += " (register)"
		}
		to := at(t.To)
		switch t.EndBasis {
		case "last-heartbeat":
			to += " (last heartbeat)"
			if t.ToLatest != nil {
				to += ", stopped by " + at(t.ToLatest)
			}
		case "open":
			to = "still serving"
		}
		end := t.End
		if t.UpUntil != nil && t.UpBasis != "" && !strings.HasPrefix(t.UpBasis, "recorded") {
			end += "; database up until at most " + at(t.UpUntil)
		}
		tw.row(t.Site, fmt.Sprint(t.Term), from, to, dur(t.DurationMS), end)
	}
	tw.flush()

	fmt.Fprintf(w, "\nFAILOVERS (%d)\n", len(r.Failovers))
	if len(r.Failovers) > 0 {
		tw = newTable(w, "  ", "TERM", "FROM→TO", "LAST PRIMARY HB", "FENCED", "ATTEMPT", "PROMOTED", "SERVING", "DETECTION ms", "FAILOVER ms", "READ-ONLY ms", "REASON")
		for _, f := range r.Failovers {
			last := at(f.LastPrimaryHeartbeat)
			if f.Estimated {
				last += " (est.)"
			}
			tw.row(fmt.Sprint(f.Term), f.From+"→"+f.To, last, at(f.FencedAt), at(f.PromotionAttemptAt), at(f.PromotedAt), at(f.ServingAt),
				msOf(f.DetectionMS), msOf(f.FailoverMS), msOf(f.ReadOnlyGapMS), f.Reason)
		}
		tw.flush()
	}
	fmt.Fprintf(w, "\nHANDOVERS (%d: switchovers, failbacks, first acquisitions)\n", len(r.Handovers))
	if len(r.Handovers) > 0 {
		tw = newTable(w, "  ", "KIND", "TERM", "FROM→TO", "REQUESTED", "RELEASED", "PROMOTED", "SERVING", "READ-ONLY ms")
		for _, h := range r.Handovers {
			from := h.From
			if from == "" {
				from = "—"
			}
			tw.row(h.Kind, fmt.Sprint(h.Term), from+"→"+h.To, at(h.RequestedAt), at(h.ReleasedAt), at(h.PromotedAt), at(h.ServingAt), msOf(h.ReadOnlyGapMS))
		}
		tw.flush()
	}

	fmt.Fprintln(w)
	if len(r.SplitBrain) == 0 {
		fmt.Fprintf(w, "SPLIT-BRAIN CHECK: none — no two serving intervals overlap (%d intervals checked)\n", len(r.Leadership))
	} else {
		fmt.Fprintf(w, "SPLIT-BRAIN: %d OVERLAP(S) OF TWO SERVING MEMBERS\n", len(r.SplitBrain))
		for _, o := range r.SplitBrain {
			fmt.Fprintf(w, "  %s → %s (%s)\n", o.From.Format(tf), o.To.Format(tf), dur(o.MS))
			for _, t := range o.Intervals {
				fmt.Fprintf(w, "    %s term %d: from %s (%s) up until %s (%s)\n", t.Site, t.Term, t.From.Format(tf), refString(t.FromEvent), at(t.UpUntil), upString(t))
			}
		}
	}

	a := r.Availability
	fmt.Fprintf(w, "\nAVAILABILITY %.4f%% of %s served; read-only %s", 100*a.Fraction, dur(r.Window.MS), dur(a.ReadOnlyMS))
	if a.LongestGapAt != nil {
		fmt.Fprintf(w, "; longest stretch with nobody serving %s from %s", dur(a.LongestGapMS), at(a.LongestGapAt))
	}
	fmt.Fprintln(w)
	if len(a.Outages) > 0 {
		fmt.Fprintf(w, "  nobody serving %s in %d outage(s)", dur(a.OutageMS), len(a.Outages))
		if a.Bounded > 0 {
			fmt.Fprintf(w, " — AT MOST: the record bounds %d of them; at least %s in total, the longest at least %s",
				a.Bounded, dur(a.OutageMinMS), dur(a.LongestGapMinMS))
		}
		fmt.Fprintln(w)
		for _, o := range a.Outages {
			if !o.Bounded {
				continue
			}
			fmt.Fprintf(w, "  bounded outage from %s to %s: at most %s, at least %s — %s\n", o.From.Format(tf), o.To.Format(tf), dur(o.MS), dur(o.MinMS), o.Why)
		}
	}

	fmt.Fprintf(w, "\nHEARTBEATS (server time; intervals in ms; gap: > 1.5 × heartbeat_timeout)\n")
	tw = newTable(w, "  ", "SITE", "SERIES", "COUNT", "INTERVALS", "P50", "P90", "P99", "MAX", "GAPS", "MISSED", "FENCED")
	for _, s := range r.Sites {
		hb := r.Heartbeats[s]
		for _, x := range []struct {
			name string
			st   HeartbeatStats
		}{{"register", hb.Register}, {"member", hb.Member}} {
			tw.row(s, x.name, fmt.Sprint(x.st.Count), fmt.Sprint(x.st.Intervals), f0(x.st.P50MS), f0(x.st.P90MS), f0(x.st.P99MS), f0(x.st.MaxGap),
				fmt.Sprint(x.st.Gaps), fmt.Sprint(x.st.Missed), fmt.Sprint(x.st.Fenced))
		}
	}
	tw.flush()
	for _, s := range r.Sites {
		hb := r.Heartbeats[s]
		for _, x := range []struct {
			name string
			st   HeartbeatStats
		}{{"register", hb.Register}, {"member", hb.Member}} {
			if x.st.Gaps == 0 || len(x.st.Longest) == 0 {
				continue
			}
			var parts []string
			for _, g := range x.st.Longest {
				parts = append(parts, fmt.Sprintf("%s at %s", dur(g.MS), at(g.From)))
			}
			fmt.Fprintf(w, "  longest %s intervals of %s: %s\n", x.name, s, strings.Join(parts, ", "))
		}
	}

	if len(r.ConfigChanges) > 0 {
		fmt.Fprintf(w, "\nCONFIG CHANGES (%d)\n", len(r.ConfigChanges))
		for _, cc := range r.ConfigChanges {
			fmt.Fprintf(w, "  rev %d written %s: %s\n", cc.Rev, at(cc.WrittenAt), cc.Rules)
			for _, a := range cc.Applied {
				fmt.Fprintf(w, "    applied by %s at %s\n", a.Site, a.At.Format(tf))
			}
			for _, x := range cc.Rejected {
				fmt.Fprintf(w, "    REJECTED by %s at %s: %s %s (%s)\n", x.Site, x.At.Format(tf), x.Field, x.Rule, x.Value)
			}
		}
	}

	fmt.Fprintf(w, "\nPROCEDURES (%d chains, %d escalated)\n", len(r.Procedures), r.Escalations)
	for _, ch := range r.Procedures {
		ok := "running"
		if ch.OK != nil {
			ok = map[bool]string{true: "ok", false: "FAILED"}[*ch.OK]
		}
		if ch.Superseded {
			ok = "superseded"
		}
		var steps []string
		for _, s := range ch.Steps {
			res := s.Result
			if res == "" {
				res = "running"
			}
			steps = append(steps, fmt.Sprintf("%s %s %s", s.Name, res, dur(s.TookMS)))
		}
		esc := ""
		if ch.Escalated {
			esc = " ESCALATED"
		}
		fmt.Fprintf(w, "  %s  %-8s %-7s #%d %s in %s%s: %s\n", at(ch.StartedAt), ch.Site, ch.Kind, ch.Seq, ok, dur(ch.TookMS), esc, strings.Join(steps, "; "))
	}

	fmt.Fprintf(w, "\nTIMELINE (%d events)\n", len(r.Timeline))
	for _, e := range r.Timeline {
		mark := ""
		if e.Mark != "" {
			mark = "  <" + strings.ToUpper(e.Mark) + ">"
		}
		site := e.Site
		if site == "" {
			site = "-"
		}
		fmt.Fprintf(w, "  %s  %-8s %s %s%s\n", e.Time.Format(tf), site, e.Type, e.Detail, mark)
	}

	rc := r.Records
	fmt.Fprintf(w, "\nRECORDS read %d: register writes %d, member heartbeats %d, events %d, other KV %d; duplicates %d; other pairs/streams %d; unknown %d; corrupt %d; gaps %d\n",
		rc.Read, rc.Register, rc.Heartbeats, rc.Events, rc.KV, rc.Duplicates, rc.Foreign, rc.Unknown, rc.Corrupt, rc.Gaps)
	for _, k := range sortedKeys(rc.UnknownTypes) {
		fmt.Fprintf(w, "  unknown %s: %d (kept out of the projections)\n", k, rc.UnknownTypes[k])
	}
	for _, c := range rc.CorruptList {
		fmt.Fprintf(w, "  corrupt: %s sequence %d: %s\n", c.Subject, c.Sequence, c.Error)
	}
	for _, g := range rc.GapList {
		fmt.Fprintf(w, "  gap: %s: records missing between sequences %d and %d (it links to %d)\n", g.Subject, g.After, g.Before, g.MissingSeq)
	}
	if rc.TruncatedSubjects > 0 {
		fmt.Fprintf(w, "  %d subjects start inside the record (window or retention; the KV bucket keeps 64 revisions per key)\n", rc.TruncatedSubjects)
	}
	partial()
	return w.Flush()
}

func refString(e *EventRef) string {
	if e == nil {
		return "no event"
	}
	return fmt.Sprintf("%s %s #%d", e.Type, e.Subject, e.Sequence)
}

func upString(t Tenure) string {
	if t.UpEvent != nil && strings.HasPrefix(t.UpBasis, "recorded") {
		return refString(t.UpEvent)
	}
	return t.UpBasis
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// clockFormat: times of day when the window is within one day, else full.
func clockFormat(w Window) string {
	if w.From.Format("2006-01-02") == w.To.Format("2006-01-02") {
		return "15:04:05.000"
	}
	return time.RFC3339Nano
}

func dur(ms float64) string {
	d := time.Duration(ms * float64(time.Millisecond))
	switch {
	case d < time.Second:
		return fmt.Sprintf("%.0fms", ms)
	case d < time.Minute:
		return fmt.Sprintf("%.3fs", d.Seconds())
	}
	return d.Round(time.Millisecond).String()
}

func f0(x float64) string { return fmt.Sprintf("%.0f", x) }

// table aligns columns (a small text/tabwriter that keeps runes in mind).
type table struct {
	w      io.Writer
	indent string
	rows   [][]string
}

func newTable(w io.Writer, indent string, head ...string) *table {
	return &table{w: w, indent: indent, rows: [][]string{head}}
}

func (t *table) row(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) flush() {
	var widths []int
	for _, r := range t.rows {
		for i, c := range r {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	for _, r := range t.rows {
		var b strings.Builder
		b.WriteString(t.indent)
		for i, c := range r {
			b.WriteString(c)
			if i < len(r)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-len([]rune(c))+2))
			}
		}
		fmt.Fprintln(t.w, strings.TrimRight(b.String(), " "))
	}
}

// clockOrDash writes t in format tf, "—" when there is none.
func clockOrDash(t *time.Time, tf string) string {
	if t == nil {
		return "—"
	}
	return t.UTC().Format(tf)
}

// msOf writes a duration in whole milliseconds, "—" when there is none.
func msOf(p *float64) string {
	if p == nil {
		return "—"
	}
	return fmt.Sprintf("%.0f", *p)
}
