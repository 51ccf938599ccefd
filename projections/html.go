package projections

import (
	"bufio"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"strings"
	"time"
)

// markBins is the number of time bins heartbeat marks are counted in: one
// mark per bin that saw a write, so a history of millions of heartbeats
// draws as fast as a short one and a gap still shows as a blank stretch.
const markBins = 1400

// htmlTimelineMax bounds the events drawn on the lanes (notable ones first).
const htmlTimelineMax = 5000

// heartbeatMarks counts one series' writes per time bin of the window.
type heartbeatMarks struct {
	Site   string
	Series string // register or member
	Bins   []uint32
}

// htmlData is what the page's script draws.
type htmlData struct {
	Pair       string          `json:"pair"`
	From       time.Time       `json:"from"`
	To         time.Time       `json:"to"`
	Sites      []string        `json:"sites"`
	Lanes      []Segment       `json:"lanes"`
	Failovers  []Failover      `json:"failovers"`
	Handovers  []Handover      `json:"handovers"`
	SplitBrain []Overlap       `json:"split_brain"`
	Events     []TimelineEvent `json:"events"`
	Omitted    int             `json:"omitted"`
	Marks      []htmlMarks     `json:"marks"`
	Bins       int             `json:"bins"`
}

type htmlMarks struct {
	Site   string      `json:"site"`
	Series string      `json:"series"`
	Bins   [][2]uint32 `json:"bins"` // [bin, count] of the bins with writes
}

// WriteHTML writes r as one self-contained HTML page (inline CSS, script
// and SVG; nothing fetched): a lane per site with its states, heartbeat
// marks, failover markers and a tooltip on every event, then the tables.
func WriteHTML(out io.Writer, r *Report) error {
	d := htmlData{Pair: r.Pair, From: r.Window.From, To: r.Window.To, Sites: r.Sites, Lanes: r.Lanes,
		Failovers: r.Failovers, Handovers: r.Handovers, SplitBrain: r.SplitBrain, Bins: markBins, Marks: []htmlMarks{}}
	if d.Lanes == nil {
		d.Lanes = []Segment{}
	}
	// Notable events first when there are too many to draw.
	d.Events = r.Timeline
	if len(d.Events) > htmlTimelineMax {
		var keep []TimelineEvent
		for _, e := range r.Timeline {
			if e.Mark != "" || !strings.HasSuffix(e.Type, "heartbeat_failed") {
				keep = append(keep, e)
			}
		}
		if len(keep) > htmlTimelineMax {
			keep = keep[:htmlTimelineMax]
		}
		d.Omitted = len(r.Timeline) - len(keep)
		d.Events = keep
	}
	for _, m := range r.marks {
		hm := htmlMarks{Site: m.Site, Series: m.Series, Bins: [][2]uint32{}}
		for i, n := range m.Bins {
			if n > 0 {
				hm.Bins = append(hm.Bins, [2]uint32{uint32(i), n})
			}
		}
		d.Marks = append(d.Marks, hm)
	}
	data, err := json.Marshal(d) // escapes <, > and &: safe inside <script>
	if err != nil {
		return err
	}

	w := bufio.NewWriter(out)
	e := html.EscapeString
	tf := clockFormat(r.Window)
	at := func(t *time.Time) string { return clockOrDash(t, tf) }
	fmt.Fprintf(w, htmlHead, e(r.Pair))
	fmt.Fprintf(w, "<header><h1>understudy replay — pair <b>%s</b></h1><div class=\"sub\">%s → %s (%s, server time UTC)",
		e(r.Pair), e(r.Window.From.Format(time.RFC3339Nano)), e(r.Window.To.Format(time.RFC3339Nano)), e(dur(r.Window.MS)))
	if r.Source != "" {
		fmt.Fprintf(w, " · source %s", e(r.Source))
	}
	fmt.Fprintf(w, "</div></header>\n")
	if r.Partial != nil {
		fmt.Fprintf(w, "<div class=\"partial\" id=\"partial\">PARTIAL: the record ended in an error; only the %d records read before byte %d are shown.<br>%s</div>\n",
			r.Partial.Recovered, r.Partial.Offset, e(r.Partial.Error))
	}
	verdict, vclass := "split-brain check: none — no two serving intervals overlap", "ok"
	if len(r.SplitBrain) > 0 {
		verdict, vclass = fmt.Sprintf("SPLIT-BRAIN: %d overlap(s) of two serving members", len(r.SplitBrain)), "bad"
	}
	bounded := ""
	if r.Availability.Bounded > 0 {
		bounded = fmt.Sprintf(" (at most; %d outage(s) bounded)", r.Availability.Bounded)
	}
	fmt.Fprintf(w, "<div class=\"verdict %s\" id=\"verdict\">%s · failovers %d · handovers %d · availability %.4f%% · read-only %s%s</div>\n",
		vclass, e(verdict), len(r.Failovers), len(r.Handovers), 100*r.Availability.Fraction, e(dur(r.Availability.ReadOnlyMS)), e(bounded))
	fmt.Fprintf(w, "%s\n", htmlLegend)
	fmt.Fprintf(w, "<div id=\"chart\"></div><div id=\"tip\" role=\"tooltip\"></div><p class=\"note\" id=\"chart-note\"></p>\n")

	section := func(title string) { fmt.Fprintf(w, "<h2>%s</h2>\n", e(title)) }
	tableHead := func(cols ...string) {
		fmt.Fprintf(w, "<table><thead><tr>")
		for _, c := range cols {
			fmt.Fprintf(w, "<th>%s</th>", e(c))
		}
		fmt.Fprintf(w, "</tr></thead><tbody>\n")
	}
	row := func(cells ...string) {
		fmt.Fprintf(w, "<tr>")
		for _, c := range cells {
			fmt.Fprintf(w, "<td>%s</td>", e(c))
		}
		fmt.Fprintf(w, "</tr>\n")
	}
	tableEnd := func() { fmt.Fprintf(w, "</tbody></table>\n") }

	section(fmt.Sprintf("Failovers (%d)", len(r.Failovers)))
	if len(r.Failovers) > 0 {
		tableHead("term", "from → to", "last primary heartbeat", "fenced", "attempt", "promoted", "serving", "detection ms", "failover ms", "read-only ms", "reason")
		for _, f := range r.Failovers {
			last := at(f.LastPrimaryHeartbeat)
			if f.Estimated {
				last += " (est.)"
			}
			row(fmt.Sprint(f.Term), f.From+" → "+f.To, last, at(f.FencedAt), at(f.PromotionAttemptAt), at(f.PromotedAt), at(f.ServingAt),
				msOf(f.DetectionMS), msOf(f.FailoverMS), msOf(f.ReadOnlyGapMS), f.Reason)
		}
		tableEnd()
	}
	section(fmt.Sprintf("Handovers (%d)", len(r.Handovers)))
	if len(r.Handovers) > 0 {
		tableHead("kind", "term", "from → to", "requested", "released", "promoted", "serving", "read-only ms")
		for _, h := range r.Handovers {
			row(h.Kind, fmt.Sprint(h.Term), h.From+" → "+h.To, at(h.RequestedAt), at(h.ReleasedAt), at(h.PromotedAt), at(h.ServingAt), msOf(h.ReadOnlyGapMS))
		}
		tableEnd()
	}
	section("Leadership")
	tableHead("site", "term", "from", "to", "for", "end", "database up until (split-brain check)")
	for _, t := range r.Leadership {
		to := at(t.To) + " (" + t.EndBasis + ")"
		if t.ToLatest != nil {
			to += ", stopped by " + at(t.ToLatest)
		}
		row(t.Site, fmt.Sprint(t.Term), t.From.Format(tf)+" ("+t.FromBasis+")", to, dur(t.DurationMS), t.End, at(t.UpUntil)+" ("+t.UpBasis+")")
	}
	tableEnd()
	if len(r.SplitBrain) > 0 {
		section("Split-brain")
		tableHead("overlap", "ms", "interval A", "interval B")
		for _, o := range r.SplitBrain {
			iv := func(t Tenure) string {
				return fmt.Sprintf("%s term %d: %s (%s) → %s (%s)", t.Site, t.Term, t.From.Format(tf), refString(t.FromEvent), at(t.UpUntil), upString(t))
			}
			row(o.From.Format(tf)+" → "+o.To.Format(tf), fmt.Sprintf("%.0f", o.MS), iv(o.Intervals[0]), iv(o.Intervals[1]))
		}
		tableEnd()
	}
	a := r.Availability
	section(fmt.Sprintf("Outages (%d)", len(a.Outages)))
	if a.Bounded > 0 {
		fmt.Fprintf(w, "<p class=\"note\" id=\"bounded\">The record bounds %d outage(s): nobody served for at most %s in total (at least %s); the longest at most %s (at least %s).</p>\n",
			a.Bounded, e(dur(a.OutageMS)), e(dur(a.OutageMinMS)), e(dur(a.LongestGapMS)), e(dur(a.LongestGapMinMS)))
	}
	if len(a.Outages) > 0 {
		tableHead("from", "to", "ms (at most)", "at least", "after", "by", "what the record cannot show")
		for _, o := range a.Outages {
			by := o.By
			if o.Open {
				by = "(still)"
			}
			row(o.From.Format(tf), o.To.Format(tf), fmt.Sprintf("%.0f", o.MS), fmt.Sprintf("%.0f", o.MinMS), o.After+" ("+o.AfterBasis+")", by, o.Why)
		}
		tableEnd()
	}
	section("Heartbeats (intervals in ms, server time)")
	tableHead("site", "series", "count", "intervals", "p50", "p90", "p99", "max", "gaps", "missed", "fenced")
	for _, s := range r.Sites {
		hb := r.Heartbeats[s]
		for _, x := range []struct {
			n  string
			st HeartbeatStats
		}{{"register", hb.Register}, {"member", hb.Member}} {
			row(s, x.n, fmt.Sprint(x.st.Count), fmt.Sprint(x.st.Intervals), f0(x.st.P50MS), f0(x.st.P90MS), f0(x.st.P99MS), f0(x.st.MaxGap),
				fmt.Sprint(x.st.Gaps), fmt.Sprint(x.st.Missed), fmt.Sprint(x.st.Fenced))
		}
	}
	tableEnd()
	rc := r.Records
	section("Records")
	fmt.Fprintf(w, "<p>read %d: register writes %d, member heartbeats %d, events %d, other KV %d; duplicates %d; other pairs %d; unknown %d; corrupt %d; gaps %d</p>\n",
		rc.Read, rc.Register, rc.Heartbeats, rc.Events, rc.KV, rc.Duplicates, rc.Foreign, rc.Unknown, rc.Corrupt, rc.Gaps)
	if len(rc.UnknownTypes)+len(rc.CorruptList)+len(rc.GapList) > 0 {
		fmt.Fprintf(w, "<ul>")
		for _, k := range sortedKeys(rc.UnknownTypes) {
			fmt.Fprintf(w, "<li>unknown %s: %d</li>", e(k), rc.UnknownTypes[k])
		}
		for _, c := range rc.CorruptList {
			fmt.Fprintf(w, "<li>corrupt: %s #%d: %s</li>", e(c.Subject), c.Sequence, e(c.Error))
		}
		for _, g := range rc.GapList {
			fmt.Fprintf(w, "<li>gap: %s: missing between #%d and #%d</li>", e(g.Subject), g.After, g.Before)
		}
		fmt.Fprintf(w, "</ul>\n")
	}
	fmt.Fprintf(w, "<script type=\"application/json\" id=\"report-data\">%s</script>\n", data)
	fmt.Fprintf(w, "<script>%s</script>\n</body>\n</html>\n", htmlScript)
	return w.Flush()
}

const htmlHead = `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>understudy replay — %s</title>
<style>
:root { --serving:#2e9d4f; --promoting:#9fd8a8; --stopping:#f0a23a; --fenced:#d64545; --standby:#b9c2cc; --starting:#7f8c99; --norecord:#eeeeee; }
body { font: 13px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px 20px; color: #1d2329; background: #fff; }
h1 { font-size: 18px; margin: 0 0 2px; font-weight: 600; }
h2 { font-size: 14px; margin: 18px 0 6px; }
.sub, .note { color: #5b6670; }
.verdict { margin: 10px 0; padding: 6px 10px; border-radius: 4px; font-weight: 600; }
.verdict.ok { background: #e7f5ea; color: #1d6b33; }
.verdict.bad { background: #fde8e8; color: #9b1c1c; border: 2px solid #d64545; }
.partial { margin: 10px 0; padding: 8px 10px; background: #fff4d6; border: 2px solid #e0a400; font-weight: 600; }
.legend span { display: inline-block; margin-right: 14px; }
.legend i { display: inline-block; width: 14px; height: 10px; margin-right: 4px; vertical-align: -1px; border-radius: 2px; }
#chart svg { display: block; width: 100%%; }
.seg { stroke: #fff; stroke-width: 0.5; }
.st-serving { fill: var(--serving); } .st-promoting { fill: var(--promoting); } .st-stopping { fill: var(--stopping); }
.st-fenced { fill: var(--fenced); } .st-standby { fill: var(--standby); } .st-starting { fill: var(--starting); }
.st-no-record { fill: url(#hatch); }
.lane-label { font-weight: 600; font-size: 12px; }
.axis text { font-size: 10px; fill: #5b6670; } .axis line { stroke: #d5dbe0; }
.hb-register { fill: #1d2329; } .hb-member { fill: #7f8c99; }
.ev { stroke: #1d2329; stroke-width: 0.7; fill: #fff; cursor: pointer; }
.ev.m-failover { fill: #d64545; } .ev.m-handover { fill: #3a6fd6; } .ev.m-escalation { fill: #f0a23a; } .ev.m-config { fill: #8a5cd6; }
.fo-line { stroke: #d64545; stroke-width: 1.5; stroke-dasharray: 5 3; }
.ho-line { stroke: #3a6fd6; stroke-width: 1.2; stroke-dasharray: 2 3; }
.lhb-line { stroke: #d64545; stroke-width: 1; stroke-dasharray: 1 2; }
.fo-label { font-size: 10px; fill: #9b1c1c; } .ho-label { font-size: 10px; fill: #2b55a8; }
.sb-band { fill: #d64545; fill-opacity: 0.25; stroke: #d64545; }
#tip { position: fixed; pointer-events: none; background: #1d2329; color: #fff; padding: 5px 8px; border-radius: 4px; font-size: 12px; white-space: pre; display: none; z-index: 10; max-width: 640px; }
table { border-collapse: collapse; margin: 4px 0 8px; font-size: 12px; }
th, td { border: 1px solid #dde2e6; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f3f5f7; font-weight: 600; }
</style>
</head>
<body>
`

const htmlLegend = `<div class="legend"><span><i style="background:var(--serving)"></i>serving</span><span><i style="background:var(--promoting)"></i>acquiring / promoting</span><span><i style="background:var(--stopping)"></i>fencing / demoting</span><span><i style="background:var(--fenced)"></i>fenced</span><span><i style="background:var(--standby)"></i>standby</span><span><i style="background:var(--starting)"></i>starting</span><span><i style="background:repeating-linear-gradient(45deg,#ccc 0 2px,#fff 2px 4px)"></i>no record</span><span>▮ register writes · ▮ member heartbeats · ● events (hover)</span></div>`

// htmlScript draws the lanes from the JSON in #report-data.
const htmlScript = `
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("report-data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  var chart = document.getElementById("chart");
  var tip = document.getElementById("tip");
  var t0 = Date.parse(D.from), t1 = Date.parse(D.to);
  if (!(t1 > t0)) { t1 = t0 + 1000; }
  var tEnd = t1;
  t1 = t1 + (t1 - t0) * 0.08; // room after the last record for labels
  var W = Math.max(chart.clientWidth || 0, 900), left = 110, right = 20;
  var laneH = 64, top = 34;
  var H = top + D.sites.length * laneH + 24;
  function x(t) { return left + (Date.parse(t) - t0) / (t1 - t0) * (W - left - right); }
  function xs(ms) { return left + (ms - t0) / (t1 - t0) * (W - left - right); }
  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) { e.setAttribute(k, attrs[k]); }
    if (parent) { parent.appendChild(e); }
    return e;
  }
  function clock(t) { return new Date(typeof t === "number" ? t : Date.parse(t)).toISOString().slice(11, 23); }
  function fmtMS(v) { return v === null || v === undefined ? "—" : Math.round(v) + " ms"; }
  var svg = el("svg", { viewBox: "0 0 " + W + " " + H, width: W, height: H, "aria-label": "lanes of pair " + D.pair });
  var defs = el("defs", {}, svg);
  var pat = el("pattern", { id: "hatch", width: 4, height: 4, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" }, defs);
  el("rect", { width: 4, height: 4, fill: "#fff" }, pat);
  el("rect", { width: 2, height: 4, fill: "#ccc" }, pat);

  // Time axis.
  var axis = el("g", { "class": "axis" }, svg);
  var span = t1 - t0, steps = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 3e4, 6e4, 12e4, 3e5, 6e5, 9e5, 18e5, 36e5, 72e5, 144e5, 432e5, 864e5];
  var step = steps[steps.length - 1];
  for (var i = 0; i < steps.length; i++) { if (span / steps[i] <= 12) { step = steps[i]; break; } }
  for (var t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
    el("line", { x1: xs(t), x2: xs(t), y1: top - 6, y2: H - 20 }, axis);
    var lab = el("text", { x: xs(t), y: top - 10, "text-anchor": "middle" }, axis);
    lab.textContent = step < 1000 ? clock(t) : clock(t).slice(0, step < 60000 ? 8 : 5);
  }

  var laneY = {};
  var nSegs = 0, nEvents = 0, nMarks = 0;
  D.sites.forEach(function (site, i) {
    var y = top + i * laneH;
    laneY[site] = y;
    var g = el("g", { "class": "lane", "data-site": site, id: "lane-" + site }, svg);
    var label = el("text", { x: 6, y: y + 18, "class": "lane-label" }, g);
    label.textContent = site;
    el("rect", { x: left, y: y + 4, width: W - left - right, height: 26, fill: "#fafbfc", stroke: "#e3e7ea" }, g);
    D.lanes.forEach(function (s) {
      if (s.site !== site) { return; }
      var a = Math.max(x(s.from), left), b = Math.min(x(s.to), W - right);
      var r = el("rect", { x: a, y: y + 4, width: Math.max(b - a, 0.8), height: 26, "class": "seg st-" + s.state }, g);
      var txt = site + ": " + s.state + (s.term ? " (term " + s.term + ")" : "") + "\n" + clock(s.from) + " → " + clock(s.to) +
        " (" + Math.round(Date.parse(s.to) - Date.parse(s.from)) + " ms)" + (s.note ? "\n" + s.note : "");
      r.setAttribute("data-tip", txt);
      nSegs++;
    });
    var hbLabel = el("text", { x: left - 6, y: y + 41, "text-anchor": "end", "class": "axis" }, g);
    hbLabel.textContent = "";
    D.marks.forEach(function (m) {
      if (m.site !== site) { return; }
      var yy = y + (m.series === "register" ? 34 : 46);
      var bw = (xs(tEnd) - left) / D.bins;
      m.bins.forEach(function (b) {
        var r = el("rect", { x: xs(t0 + b[0] * (tEnd - t0) / D.bins), y: yy, width: Math.max(bw * 0.8, 0.6), height: 9, "class": "hb-" + m.series }, g);
        r.setAttribute("data-tip", site + " " + m.series + " heartbeats: " + b[1] + " around " + clock(t0 + (b[0] + 0.5) * (tEnd - t0) / D.bins));
        nMarks++;
      });
    });
  });

  var endLine = el("line", { x1: xs(tEnd), x2: xs(tEnd), y1: top - 4, y2: top + D.sites.length * laneH, stroke: "#5b6670", "stroke-width": 1 }, svg);
  endLine.setAttribute("data-tip", "end of the record " + clock(tEnd));

  // Split-brain bands, failover and handover markers.
  var over = el("g", { "class": "markers" }, svg);
  D.split_brain.forEach(function (o) {
    var a = x(o.from), b = x(o.to);
    var r = el("rect", { x: a, y: top, width: Math.max(b - a, 2), height: D.sites.length * laneH, "class": "sb-band" }, over);
    r.setAttribute("data-tip", "SPLIT-BRAIN " + clock(o.from) + " → " + clock(o.to) + " (" + Math.round(o.ms) + " ms)\n" +
      o.intervals.map(function (t) { return t.site + " term " + t.term + ": " + clock(t.from) + " → " + (t.up_until ? clock(t.up_until) : "open") + " (" + t.up_basis + ")"; }).join("\n"));
  });
  D.failovers.forEach(function (f) {
    if (!f.promoted_at) { return; }
    var px = x(f.promoted_at);
    el("line", { x1: px, x2: px, y1: top - 4, y2: top + D.sites.length * laneH, "class": "fo-line" }, over);
    if (f.last_primary_heartbeat) {
      var lx = x(f.last_primary_heartbeat);
      el("line", { x1: lx, x2: lx, y1: top, y2: top + D.sites.length * laneH, "class": "lhb-line" }, over);
    }
    var nearEnd = px > W - 260;
    var lab = el("text", { x: nearEnd ? px - 3 : px + 3, y: top + D.sites.length * laneH + 12, "class": "fo-label", "text-anchor": nearEnd ? "end" : "start" }, over);
    lab.textContent = "failover " + f.from + " → " + f.to + " (" + fmtMS(f.failover_ms) + ")";
    var hit = el("rect", { x: px - 4, y: top - 4, width: 8, height: D.sites.length * laneH + 4, fill: "transparent" }, over);
    hit.setAttribute("data-tip", "FAILOVER term " + f.term + ": " + f.from + " → " + f.to + " (" + f.reason + ")\nlast primary heartbeat " +
      (f.last_primary_heartbeat ? clock(f.last_primary_heartbeat) : "—") + "\nfenced " + (f.fenced_at ? clock(f.fenced_at) : "—") +
      "\npromotion attempt " + (f.promotion_attempt_at ? clock(f.promotion_attempt_at) : "—") + "\npromoted " + clock(f.promoted_at) +
      "\nserving " + (f.serving_at ? clock(f.serving_at) : "—") + "\ndetection " + fmtMS(f.detection_ms) + ", failover " + fmtMS(f.failover_ms) +
      ", read-only " + fmtMS(f.read_only_gap_ms));
  });
  D.handovers.forEach(function (h) {
    if (!h.promoted_at || h.kind === "bootstrap") { return; }
    var px = x(h.promoted_at);
    el("line", { x1: px, x2: px, y1: top - 4, y2: top + D.sites.length * laneH, "class": "ho-line" }, over);
    var hEnd = px > W - 200;
    var lab = el("text", { x: hEnd ? px - 3 : px + 3, y: top + D.sites.length * laneH + 22, "class": "ho-label", "text-anchor": hEnd ? "end" : "start" }, over);
    lab.textContent = h.kind + " → " + h.to;
  });

  // Events, with a tooltip each.
  D.events.forEach(function (e) {
    var y = laneY[e.site];
    if (y === undefined) { y = top - 2; }
    var c = el("circle", { cx: x(e.time), cy: y + 17, r: e.mark ? 4.5 : 3, "class": "ev" + (e.mark ? " m-" + e.mark : "") }, svg);
    c.setAttribute("data-tip", clock(e.time) + "  " + (e.site || "") + "\n" + e.type + (e.detail ? "\n" + e.detail : "") + "\n" + e.subject + " #" + e.sequence);
    nEvents++;
  });
  chart.appendChild(svg);
  if (D.omitted > 0) {
    document.getElementById("chart-note").textContent = D.omitted + " routine events not drawn (see the JSON or text report).";
  }

  function showTip(ev) {
    var t = ev.target && ev.target.closest ? ev.target.closest("[data-tip]") : null;
    if (!t) { tip.style.display = "none"; return; }
    tip.textContent = t.getAttribute("data-tip");
    tip.style.display = "block";
    var px = ev.clientX + 14, py = ev.clientY + 14;
    if (px + tip.offsetWidth > window.innerWidth) { px = ev.clientX - tip.offsetWidth - 10; }
    tip.style.left = px + "px";
    tip.style.top = py + "px";
  }
  svg.addEventListener("mousemove", showTip);
  svg.addEventListener("mouseleave", function () { tip.style.display = "none"; });
  console.log("understudy-replay: rendered " + D.sites.length + " lanes, " + nSegs + " segments, " + nEvents + " events, " + nMarks + " heartbeat marks");
})();
`
