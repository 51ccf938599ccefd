package projections

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/events"
)

func at(d time.Duration) time.Time { return testBase.Add(d) }

func msEq(t *testing.T, what string, got *float64, want float64) {
	t.Helper()
	if got == nil {
		t.Errorf("%s: missing, want %.3f", what, want)
		return
	}
	if d := *got - want; d > 0.001 || d < -0.001 {
		t.Errorf("%s = %.3f, want %.3f", what, *got, want)
	}
}

func timeEq(t *testing.T, what string, got *time.Time, want time.Time) {
	t.Helper()
	if got == nil || !got.Equal(want) {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

// A power cut: site-a's writes stop at 10s, site-b takes over at 15.1s.
func powerCut(t testing.TB) (*history, uint64) {
	h := newHistory(t, "pg-main")
	last := h.bootstrap(10*time.Second, 15*time.Second)
	h.takeover(15100*time.Millisecond, last, 5100*time.Millisecond, 20*time.Second)
	return h, last
}

func TestPowerCutFailover(t *testing.T) {
	h, _ := powerCut(t)
	r := foldAll(t, "pg-main", h.recs)

	if len(r.Failovers) != 1 {
		t.Fatalf("failovers %d, want 1: %+v", len(r.Failovers), r.Failovers)
	}
	fo := r.Failovers[0]
	if fo.From != "site-a" || fo.To != "site-b" || fo.Term != 2 || fo.FromTerm != 1 || fo.Estimated {
		t.Errorf("failover %+v", fo)
	}
	timeEq(t, "last_primary_heartbeat", fo.LastPrimaryHeartbeat, at(10*time.Second))
	timeEq(t, "promotion_attempt_at", fo.PromotionAttemptAt, at(15100*time.Millisecond))
	timeEq(t, "promoted_at", fo.PromotedAt, at(15102*time.Millisecond))
	timeEq(t, "serving_at", fo.ServingAt, at(15110*time.Millisecond))
	msEq(t, "detection_ms", fo.DetectionMS, 5100)
	msEq(t, "failover_ms", fo.FailoverMS, 5102)
	msEq(t, "serving_ms", fo.ServingMS, 5110)
	// A power cut records no stop: site-a served until its last heartbeat.
	msEq(t, "read_only_gap_ms", fo.ReadOnlyGapMS, 5110)
	if fo.FencedAt != nil || fo.FenceRequestedAt != nil {
		t.Errorf("a power cut has no fence: %v %v", fo.FencedAt, fo.FenceRequestedAt)
	}

	if len(r.Leadership) != 2 {
		t.Fatalf("leadership %+v", r.Leadership)
	}
	a, b := r.Leadership[0], r.Leadership[1]
	if a.Site != "site-a" || a.Term != 1 || a.EndBasis != "last-heartbeat" || a.End != "silent" {
		t.Errorf("site-a tenure %+v", a)
	}
	timeEq(t, "site-a to", a.To, at(10*time.Second))
	// Database up until at most: last write + (2+1) × 1s + 2s.
	timeEq(t, "site-a up_until", a.UpUntil, at(15*time.Second))
	if b.Site != "site-b" || b.Term != 2 || b.To != nil || b.EndBasis != "open" {
		t.Errorf("site-b tenure %+v", b)
	}
	if len(r.SplitBrain) != 0 {
		t.Errorf("split brain in a clean failover: %+v", r.SplitBrain)
	}
	// Served: 0.1s–10s and 15.11s–19.1s (the end of the record).
	wantServed := (9900 + 3990) * time.Millisecond
	if got := r.Availability.ServedMS; got != ms(wantServed) {
		t.Errorf("served %v ms, want %v", got, ms(wantServed))
	}
	if got := r.Availability.LongestGapMS; got != 5110 {
		t.Errorf("longest gap %v, want 5110", got)
	}
	if len(r.Handovers) != 1 || r.Handovers[0].Kind != "bootstrap" || r.Handovers[0].To != "site-a" {
		t.Errorf("handovers %+v", r.Handovers)
	}

	hb := r.Heartbeats["site-a"].Register
	if hb.Count != 11 || hb.Intervals != 10 || hb.P50MS != 1000 || hb.MaxGap != 1000 || hb.Gaps != 0 {
		t.Errorf("site-a register heartbeats %+v", hb)
	}
	mb := r.Heartbeats["site-b"].Member
	if mb.Count != 15 || mb.Intervals != 14 || mb.P99MS != 1000 || mb.Missed != 0 {
		t.Errorf("site-b member heartbeats %+v", mb)
	}
	if r.Records.Gaps != 0 || r.Records.Corrupt != 0 || r.Records.Unknown != 0 || r.Records.Duplicates != 0 {
		t.Errorf("records %+v", r.Records.RecordCounts)
	}
	if r.Rules == nil || r.Rules.Primary != "site-a" || r.Rules.FailoverTimeoutMS != 5000 {
		t.Errorf("rules %+v", r.Rules)
	}
}

// Every record twice, in a shuffled order: the same history, the
// duplicates counted.
func TestIdempotentAndOrderFree(t *testing.T) {
	h, _ := powerCut(t)
	want := foldAll(t, "pg-main", h.recs)

	recs := append(slices.Clone(h.recs), h.recs...)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(recs), func(i, j int) { recs[i], recs[j] = recs[j], recs[i] })
	got := foldAll(t, "pg-main", recs)

	if got.Records.Duplicates != len(h.recs) || got.Records.Read != 2*len(h.recs) {
		t.Errorf("duplicates %d of %d read, want %d of %d", got.Records.Duplicates, got.Records.Read, len(h.recs), 2*len(h.recs))
	}
	// Links are checked in arrival order, so a shuffle may show some as
	// gaps: compare everything else.
	got.Records, want.Records = RecordsReport{}, RecordsReport{}
	if !reflect.DeepEqual(got.marks, want.marks) {
		t.Errorf("heartbeat marks differ")
	}
	got.marks, want.marks = nil, nil
	gotJ, _ := json.Marshal(got)
	wantJ, _ := json.Marshal(want)
	if !bytes.Equal(gotJ, wantJ) {
		gj, _ := json.MarshalIndent(got, "", " ")
		wj, _ := json.MarshalIndent(want, "", " ")
		gl, wl := strings.Split(string(gj), "\n"), strings.Split(string(wj), "\n")
		for i := range min(len(gl), len(wl)) {
			if gl[i] != wl[i] {
				t.Fatalf("report differs at JSON line %d: %q, want %q\n%s", i, gl[i], wl[i], strings.Join(wl[max(i-15, 0):i], "\n"))
			}
		}
		t.Fatalf("report differs (%d vs %d JSON lines)", len(gl), len(wl))
	}
}

// A member cut off from NATS self-fences in time but its events land when
// the link heals: not a split-brain (its serving ends by the rules' bound).
func TestLateEventsAreNotSplitBrain(t *testing.T) {
	h := newHistory(t, "pg-main")
	last := h.bootstrap(10*time.Second, 20*time.Second)
	h.takeover(15100*time.Millisecond, last, 5100*time.Millisecond, 40*time.Second)
	h.at(30 * time.Second) // the link heals: the queued events land
	h.event("site-a", &failover.HeartbeatFailed{Term: 1, Failures: 3, Cause: "timeout"})
	h.event("site-a", &failover.FenceRequested{Seq: 3, Reason: failover.FenceHeartbeatFailures, Term: 1, Then: failover.AfterSuspend})
	h.chain("site-a", procedure.ChainFence, 3, false)
	h.event("site-a", &failover.Fenced{Seq: 3})
	h.at(30*time.Second+5*time.Millisecond).event("site-a", &failover.LeadershipLost{Term: 1, Rev: 99, Holder: failover.Leader{Site: "site-b", Term: 2}})

	r := foldAll(t, "pg-main", h.recs)
	if len(r.SplitBrain) != 0 {
		t.Fatalf("late events read as a split brain: %+v", r.SplitBrain)
	}
	a := r.Leadership[0]
	if a.EndBasis != "last-heartbeat" || !strings.Contains(a.End, "recorded late") {
		t.Errorf("site-a tenure %+v", a)
	}
	timeEq(t, "site-a to", a.To, at(10*time.Second))
	timeEq(t, "site-a up_until", a.UpUntil, at(15*time.Second))
	if !strings.Contains(a.UpBasis, "late") {
		t.Errorf("up basis %q should say the completion landed late", a.UpBasis)
	}
	fo := r.Failovers[0]
	timeEq(t, "fenced_at (as recorded)", fo.FencedAt, at(30*time.Second))
}

// Two members serving at once: reported with both intervals and the events
// that bound them.
func TestSplitBrainReported(t *testing.T) {
	h := newHistory(t, "pg-main")
	last := h.bootstrap(20*time.Second, 20*time.Second)
	// site-b promotes although site-a keeps writing (a broken member).
	h.takeover(15100*time.Millisecond, last, 5100*time.Millisecond, 20*time.Second)

	r := foldAll(t, "pg-main", h.recs)
	if len(r.SplitBrain) != 1 {
		t.Fatalf("split brain: %+v", r.SplitBrain)
	}
	o := r.SplitBrain[0]
	if !o.From.Equal(at(15110*time.Millisecond)) || !o.To.Equal(at(20003*time.Millisecond)) { // the end of the record
		t.Errorf("overlap %v → %v", o.From, o.To)
	}
	sites := []string{o.Intervals[0].Site, o.Intervals[1].Site}
	if !slices.Equal(sites, []string{"site-a", "site-b"}) {
		t.Errorf("intervals of %v", sites)
	}
	if o.Intervals[1].FromEvent == nil || o.Intervals[1].FromEvent.Type != "failover.serving_started" || o.Intervals[1].FromEvent.Subject != "ev.failover.pg-main.site-b" {
		t.Errorf("the overlap's bounding event: %+v", o.Intervals[1].FromEvent)
	}
	var text bytes.Buffer
	if err := WriteText(&text, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "SPLIT-BRAIN: 1 OVERLAP") || !strings.Contains(text.String(), "failover.serving_started ev.failover.pg-main.site-b") {
		t.Errorf("text report does not show the split brain:\n%s", text.String())
	}
}

// Failback by handshake after a power cut, and an escalated fence.
func TestFailbackAndEscalation(t *testing.T) {
	h, _ := powerCut(t)
	h.at(21 * time.Second)
	h.event("site-a", &failover.Started{Pair: "pg-main", Site: "site-a", Rules: h.rules})
	h.event("site-a", &failover.FenceRequested{Seq: 1, Reason: failover.FenceRestart, Then: failover.AfterResume})
	h.chain("site-a", procedure.ChainFence, 1, true)
	h.event("site-a", &failover.Fenced{Seq: 1})
	h.at(22*time.Second).hb("site-a", 1)
	h.at(23*time.Second).hb("site-a", 2)
	h.at(23100*time.Millisecond).event("site-b", &failover.DemotionRequested{Seq: 3, Reason: failover.DemoteFailback, Handoff: "site-a"})
	h.chain("site-b", procedure.ChainDemote, 3, false)
	h.at(23200*time.Millisecond).event("site-b", &failover.Demoted{Seq: 3})
	rel := h.leader(failover.Leader{Term: 2, Handoff: "site-a"})
	h.event("site-b", &failover.Released{Term: 2, Rev: rel, Handoff: "site-a"})
	h.at(23300*time.Millisecond).event("site-a", &failover.AcquireAttempted{Reason: failover.AcquireHandoff, Term: 3, ExpectRev: rel})
	rev := h.leader(failover.Leader{Site: "site-a", Term: 3})
	h.event("site-a", &failover.Promoted{Seq: 2, Term: 3, Rev: rev, Reason: failover.AcquireHandoff})
	h.at(23400*time.Millisecond).event("site-a", &failover.ServingStarted{Seq: 2, Term: 3})
	h.at(24 * time.Second).leader(failover.Leader{Site: "site-a", Term: 3, Beat: 1})

	r := foldAll(t, "pg-main", h.recs)
	if len(r.Handovers) != 2 {
		t.Fatalf("handovers %+v", r.Handovers)
	}
	fb := r.Handovers[1]
	if fb.Kind != "failback" || fb.From != "site-b" || fb.To != "site-a" || fb.Term != 3 {
		t.Errorf("failback %+v", fb)
	}
	timeEq(t, "requested", fb.RequestedAt, at(23100*time.Millisecond))
	msEq(t, "failback read-only gap", fb.ReadOnlyGapMS, 300)
	b := r.Leadership[1]
	if b.Site != "site-b" || b.End != "demote:failback" || b.EndBasis != "recorded" || b.UpEvent == nil || b.UpEvent.Type != "failover.demoted" {
		t.Errorf("site-b tenure %+v", b)
	}
	if len(r.SplitBrain) != 0 {
		t.Errorf("split brain: %+v", r.SplitBrain)
	}
	if r.Escalations != 1 {
		t.Errorf("escalations %d, want 1", r.Escalations)
	}
	var esc *Chain
	for i := range r.Procedures {
		if r.Procedures[i].Escalated {
			esc = &r.Procedures[i]
		}
	}
	if esc == nil || esc.Site != "site-a" || esc.Kind != "fence" || len(esc.Steps) != 2 || esc.Steps[0].Result != "timed-out" || esc.Steps[1].Result != "ok" {
		t.Errorf("escalated chain %+v", esc)
	}
	// The member heartbeats of site-a after its restart are not an
	// interval across its time as holder.
	if mb := r.Heartbeats["site-a"].Member; mb.Count != 2 || mb.Intervals != 1 {
		t.Errorf("site-a member heartbeats %+v", mb)
	}
}

// A missing record between two linked ones is a gap; unknown event types
// and corrupt records are counted and shown, never folded silently.
func TestGapsUnknownCorrupt(t *testing.T) {
	h, _ := powerCut(t)
	// Remove one of site-a's events from the middle of its subject.
	var recs []events.Record
	var dropped events.Record
	n := 0
	for _, r := range h.recs {
		if r.Subject == "ev.failover.pg-main.site-a" {
			n++
			if n == 3 {
				dropped = r
				continue
			}
		}
		recs = append(recs, r)
	}
	// An event type of a newer build.
	future := events.NewRegistry()
	future.MustRegister(&futureEvent{}, 1)
	data, err := future.Encode(&futureEvent{X: 1})
	if err != nil {
		t.Fatal(err)
	}
	recs = append(recs,
		events.Record{Stream: testStream, Subject: "ev.failover.pg-main.site-b", Sequence: 9001, Time: at(21 * time.Second), Data: data},
		events.Record{Stream: testStream, Subject: "ev.failover.pg-main.site-b", Sequence: 9002, Time: at(21 * time.Second), Data: []byte{0x93, 0xff}},
		events.KVRecord(DefaultBucket, events.Entry{Key: "pg-main.leader", Value: []byte("not msgpack"), Revision: 9003, Time: at(21 * time.Second), Op: events.OpPut}),
		// Another pair's record is not this pair's business.
		events.KVRecord(DefaultBucket, events.Entry{Key: "other.leader", Value: failover.EncodeLeader(failover.Leader{Site: "x", Term: 1}), Revision: 9004, Time: at(21 * time.Second), Op: events.OpPut}),
	)
	r := foldAll(t, "pg-main", recs)
	if r.Records.Gaps != 1 || len(r.Records.GapList) != 1 {
		t.Fatalf("gaps %+v", r.Records.GapList)
	}
	g := r.Records.GapList[0]
	if g.Subject != "ev.failover.pg-main.site-a" || g.MissingSeq != dropped.Sequence || g.After >= dropped.Sequence || g.Before <= dropped.Sequence {
		t.Errorf("gap %+v, dropped sequence %d", g, dropped.Sequence)
	}
	if r.Records.Unknown != 1 || r.Records.UnknownTypes["failover.future v1"] != 1 {
		t.Errorf("unknown %+v", r.Records.UnknownTypes)
	}
	if r.Records.Corrupt != 2 || len(r.Records.CorruptList) != 2 {
		t.Fatalf("corrupt %+v", r.Records.CorruptList)
	}
	if c := r.Records.CorruptList[0]; c.Subject != "ev.failover.pg-main.site-b" || c.Sequence != 9002 {
		t.Errorf("corrupt event %+v", c)
	}
	if c := r.Records.CorruptList[1]; c.Subject != "$KV.understudy_failover.pg-main.leader" || c.Sequence != 9003 {
		t.Errorf("corrupt register value %+v", c)
	}
	if r.Records.Foreign != 1 {
		t.Errorf("foreign %d, want 1", r.Records.Foreign)
	}
	// Still the same failover.
	if len(r.Failovers) != 1 || r.Failovers[0].To != "site-b" {
		t.Errorf("failovers %+v", r.Failovers)
	}
	var text bytes.Buffer
	if err := WriteText(&text, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"unknown failover.future v1: 1", "corrupt: ev.failover.pg-main.site-b sequence 9002", "gap: ev.failover.pg-main.site-a"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q", want)
		}
	}
}

type futureEvent struct {
	X int `msgpack:"x"`
}

func (*futureEvent) EventType() string { return "failover.future" }

// The JSON has the documented keys; the HTML is one file with nothing to fetch.
func TestRenderers(t *testing.T) {
	h, _ := powerCut(t)
	r := foldAll(t, "pg-main", h.recs)
	var js bytes.Buffer
	if err := WriteJSON(&js, r); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(js.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"pair", "window", "leadership", "failovers", "split_brain", "heartbeats", "availability", "records", "handovers", "config_changes", "procedures", "lanes", "timeline"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	lead := m["leadership"].([]any)[0].(map[string]any)
	for _, k := range []string{"site", "term", "from", "to"} {
		if _, ok := lead[k]; !ok {
			t.Errorf("leadership entry lacks %q", k)
		}
	}
	rec := m["records"].(map[string]any)
	for _, k := range []string{"unknown", "corrupt", "gaps", "duplicates"} {
		if _, ok := rec[k]; !ok {
			t.Errorf("records lack %q", k)
		}
	}

	var page bytes.Buffer
	if err := WriteHTML(&page, r); err != nil {
		t.Fatal(err)
	}
	AssertSelfContained(t, page.String())
	if !strings.Contains(page.String(), `"failover_ms":5102`) {
		t.Errorf("the page's data lacks the failover")
	}
}

var externalRef = regexp.MustCompile(`(?i)(src|href|action)\s*=\s*["']?\s*(https?:|//)|url\(\s*["']?\s*(https?:|//)|@import|fetch\(|XMLHttpRequest|WebSocket|<link\b|<iframe\b`)

// AssertSelfContained fails when page could fetch anything.
func AssertSelfContained(t testing.TB, page string) {
	t.Helper()
	if loc := externalRef.FindStringIndex(page); loc != nil {
		t.Errorf("the page refers to something outside itself: %q", page[max(loc[0]-40, 0):min(loc[1]+40, len(page))])
	}
	if !strings.HasPrefix(page, "<!doctype html>") || !strings.Contains(page, "</html>") {
		t.Errorf("not one whole HTML page")
	}
}

// The fast value decoders agree with the failover package's own.
func TestFastDecodersAgree(t *testing.T) {
	f, err := NewFold(Options{Pair: "p"})
	if err != nil {
		t.Fatal(err)
	}
	rapid.Check(t, func(t *rapid.T) {
		l := failover.Leader{
			Site: rapid.SampledFrom([]string{"", "site-a", "b", strings.Repeat("s", 40)}).Draw(t, "site"),
			Term: rapid.Uint64().Draw(t, "term"), Beat: rapid.Uint64().Draw(t, "beat"),
			Handoff: rapid.SampledFrom([]string{"", "site-a", "x"}).Draw(t, "handoff"),
			Fenced:  rapid.Bool().Draw(t, "fenced"), Planned: rapid.Bool().Draw(t, "planned"),
			By:   rapid.SampledFrom([]string{"", "site-a", "b"}).Draw(t, "by"),
			Prev: rapid.Uint64().Draw(t, "prev"),
			Node: rapid.SampledFrom([]string{"", "node-a", "n"}).Draw(t, "node"), Epoch: rapid.Uint64().Draw(t, "epoch"),
			Resumed: rapid.Bool().Draw(t, "resumed"),
		}
		if rapid.Bool().Draw(t, "signed") {
			l.Sig = rapid.SliceOfN(rapid.Byte(), 1, 80).Draw(t, "sig")
		}
		b := failover.EncodeLeader(l)
		fast, ok := f.decodeLeaderFast(b)
		if !ok {
			t.Fatalf("fast decoder refused % x", b)
		}
		slow, err := failover.DecodeLeader(b)
		if err != nil {
			t.Fatal(err)
		}
		if f.siteOf(fast.site) != slow.Site || f.siteOf(fast.handoff) != slow.Handoff || fast.term != slow.Term || fast.beat != slow.Beat ||
			fast.fenced != slow.Fenced || fast.planned != slow.Planned || fast.forAnother != slow.ForAnother() ||
			fast.epoch != slow.Epoch || (fast.node >= 0) != (slow.Node != "") {
			t.Fatalf("fast %+v, slow %+v", fast, slow)
		}
		hb := failover.Heartbeat{Site: rapid.SampledFrom([]string{"site-a", "b"}).Draw(t, "hsite"), Beat: rapid.Uint64().Draw(t, "hbeat"),
			Phase: failover.Phase(rapid.IntRange(0, 9).Draw(t, "phase")), Ready: rapid.Bool().Draw(t, "ready"),
			RulesRev: rapid.Uint64().Draw(t, "rulesrev"), RejectedRev: rapid.Uint64().Draw(t, "rejectedrev")}
		hbb := failover.EncodeHeartbeat(hb)
		fh, ok := f.decodeHeartbeatFast(hbb)
		if !ok {
			t.Fatalf("fast decoder refused % x", hbb)
		}
		sh, err := failover.DecodeHeartbeat(hbb)
		if err != nil {
			t.Fatal(err)
		}
		if f.siteOf(fh.site) != sh.Site || fh.beat != sh.Beat || fh.phase != sh.Phase || fh.ready != sh.Ready {
			t.Fatalf("fast %+v, slow %+v", fh, sh)
		}
		// Any cut of the bytes: the fast decoder refuses or the slow one agrees.
		cut := rapid.IntRange(0, len(b)).Draw(t, "cut")
		if _, ok := f.decodeLeaderFast(b[:cut]); ok && cut < len(b) {
			if _, err := failover.DecodeLeader(b[:cut]); err != nil {
				t.Fatalf("fast decoder accepted a cut the slow one refuses: % x", b[:cut])
			}
		}
	})
}

func (f *Fold) siteOf(i int32) string {
	if i < 0 {
		return ""
	}
	return f.sites[i]
}

// Records before --from set who served; heartbeats outside the window are
// not counted.
func TestWindow(t *testing.T) {
	h, _ := powerCut(t)
	f, err := NewFold(Options{Pair: "pg-main", From: at(5 * time.Second), To: at(18 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range h.recs {
		f.Add(r)
	}
	r := f.Report()
	if !r.Window.From.Equal(at(5*time.Second)) || !r.Window.To.Equal(at(18*time.Second)) || !r.Window.Asked {
		t.Errorf("window %+v", r.Window)
	}
	if n := r.Heartbeats["site-a"].Register.Count; n != 6 { // 5s..10s
		t.Errorf("site-a register writes in the window %d, want 6", n)
	}
	// Served 5–10s and 15.11–18s of 13s.
	if got, want := r.Availability.ServedMS, float64(5000+2890); got != want {
		t.Errorf("served %v, want %v", got, want)
	}

	// A window that opens with site-a serving: only the register says so.
	var late []events.Record
	for _, rec := range h.recs {
		if !rec.Time.Before(at(5 * time.Second)) {
			late = append(late, rec)
		}
	}
	r = foldAll(t, "pg-main", late)
	if len(r.Leadership) != 2 || r.Leadership[0].FromBasis != "register" || r.Leadership[0].Site != "site-a" {
		t.Fatalf("leadership from the register: %+v", r.Leadership)
	}
	if len(r.Failovers) != 1 || r.Failovers[0].FailoverMS == nil || *r.Failovers[0].FailoverMS != 5102 {
		t.Errorf("failover %+v", r.Failovers)
	}
	if r.Records.TruncatedSubjects == 0 {
		t.Errorf("subjects starting inside the record not reported")
	}
}

// A failback whose stop events land late (an append slow after a heal):
// the register's release of the term, written after the demote chain
// completed, shows the old holder had stopped by then. No split brain,
// although the new holder's serving_started landed before the old one's
// demotion_requested (seen in the real partition suite).
func TestLateStopEventsBoundedByTheRelease(t *testing.T) {
	h, _ := powerCut(t)
	h.at(21 * time.Second)
	h.start("site-a")
	h.at(22*time.Second).hb("site-a", 1)
	h.at(23*time.Second).hb("site-a", 2)
	rel := h.at(23100 * time.Millisecond).leader(failover.Leader{Term: 2, Handoff: "site-a"})
	h.at(23105*time.Millisecond).event("site-a", &failover.AcquireAttempted{Reason: failover.AcquireHandoff, Term: 3, ExpectRev: rel})
	rev := h.leader(failover.Leader{Site: "site-a", Term: 3})
	h.event("site-a", &failover.Promoted{Seq: 2, Term: 3, Rev: rev, Reason: failover.AcquireHandoff})
	h.at(23110*time.Millisecond).event("site-a", &failover.ServingStarted{Seq: 2, Term: 3})
	// site-b's stop events land 250ms late.
	h.at(23350*time.Millisecond).event("site-b", &failover.DemotionRequested{Seq: 3, Reason: failover.DemoteFailback, Handoff: "site-a"})
	h.chain("site-b", procedure.ChainDemote, 3, false)
	h.event("site-b", &failover.Demoted{Seq: 3})
	h.event("site-b", &failover.Released{Term: 2, Rev: rel, Handoff: "site-a"})
	h.at(24 * time.Second).leader(failover.Leader{Site: "site-a", Term: 3, Beat: 1})

	r := foldAll(t, "pg-main", h.recs)
	if len(r.SplitBrain) != 0 {
		t.Fatalf("split brain reported: %+v", r.SplitBrain)
	}
	for _, ten := range r.Leadership {
		if ten.Site == "site-b" && ten.Term == 2 {
			if ten.To == nil || !ten.To.Equal(at(23100*time.Millisecond)) || !strings.Contains(ten.EndBasis, "by the release register write") {
				t.Errorf("site-b's tenure ends %v (%s), want at the release, 23.1s", ten.To, ten.EndBasis)
			}
		}
	}
}
