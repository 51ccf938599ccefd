package projections

import (
	"bufio"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/events"
)

// writeHistoryExport writes an export file of about n records shaped like a
// pair's history over days: the holder's register write and the
// follower's heartbeat every second (with jitter), and every cycle a power
// cut of the holder, the takeover with its events and procedures, and the
// old holder's restart. It returns the records written.
func writeHistoryExport(tb testing.TB, path string, n int) int {
	fh, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer fh.Close()
	bw := bufio.NewWriterSize(fh, 1<<20)
	w, err := events.NewExportWriter(bw, events.ExportHeader{Source: "projections benchmark", Pair: "pg-main"})
	if err != nil {
		tb.Fatal(err)
	}
	h := newHistory(tb, "pg-main")
	flush := func() {
		for _, r := range h.recs {
			if err := w.Write(r); err != nil {
				tb.Fatal(err)
			}
		}
		h.recs = h.recs[:0]
	}
	rng := rand.New(rand.NewPCG(7, 7))
	jitter := func() time.Duration { return time.Duration(rng.IntN(20_000)) * time.Microsecond }

	h.at(0).config()
	h.start("site-a")
	h.start("site-b")
	holder, follower := "site-a", "site-b"
	term := uint64(1)
	rev := h.at(50 * time.Millisecond).leader(failover.Leader{Site: holder, Term: term})
	h.event(holder, &failover.Promoted{Seq: 2, Term: term, Rev: rev, Reason: failover.AcquireBootstrap})
	h.event(holder, &failover.ServingStarted{Seq: 2, Term: term})
	const cycle = 20_000 // seconds between failovers
	beat, hbBeat := uint64(0), uint64(0)
	seq := uint64(3)
	for s := 1; w.Count()+len(h.recs) < n; s++ {
		t := time.Duration(s) * time.Second
		if s%cycle == 0 {
			// The holder loses power; the follower takes over 5s later.
			for k := 1; k <= 5; k++ {
				hbBeat++
				h.at(t+time.Duration(k)*time.Second+jitter()).hb(follower, hbBeat)
			}
			at := t + 4100*time.Millisecond
			h.at(at).event(follower, &failover.AcquireAttempted{Reason: failover.AcquireStale, Term: term + 1, ExpectRev: rev, Stale: 5100 * time.Millisecond})
			term++
			rev = h.at(at + 2*time.Millisecond).leader(failover.Leader{Site: follower, Term: term})
			h.event(follower, &failover.Promoted{Seq: seq, Term: term, Rev: rev, Reason: failover.AcquireStale})
			h.chain(follower, procedure.ChainPromote, seq, false)
			h.at(at+10*time.Millisecond).event(follower, &failover.ServingStarted{Seq: seq, Term: term})
			// The old holder comes back fenced and follows.
			h.at(at+30*time.Second).event(holder, &failover.Started{Pair: "pg-main", Site: holder, Rules: h.rules})
			h.event(holder, &failover.FenceRequested{Seq: seq + 1, Reason: failover.FenceRestart, Then: failover.AfterResume})
			h.chain(holder, procedure.ChainFence, seq+1, s%(2*cycle) == 0)
			h.event(holder, &failover.Fenced{Seq: seq + 1})
			seq += 2
			holder, follower = follower, holder
			beat = 0
			s += 40 // the new holder's writes resume below
			continue
		}
		beat++
		rev = h.at(t + jitter()).leader(failover.Leader{Site: holder, Term: term, Beat: beat})
		if rng.IntN(5000) == 0 { // a write that did not make it in time
			h.event(holder, &failover.HeartbeatFailed{Term: term, Failures: 1, Cause: "timeout"})
			h.event(holder, &failover.HeartbeatRecovered{Term: term, AfterFailures: 1})
		}
		hbBeat++
		h.at(t+3*time.Millisecond+jitter()).hb(follower, hbBeat)
		if len(h.recs) > 4096 {
			flush()
		}
	}
	flush()
	if err := w.Close(); err != nil {
		tb.Fatal(err)
	}
	if err := bw.Flush(); err != nil {
		tb.Fatal(err)
	}
	return w.Count()
}

// writeEventsExport writes an export file of about n records shaped like a
// pair's history under continual faults — the mix of the simulator's
// random scenario, where stream events are about a fifth of the record
// (20–28 % in its 10-hour runs) instead of the 0.1 % of a quiet pair:
// besides the holder's register write and the follower's heartbeat every
// second, every 10 s a write that misses its deadline (heartbeat_failed,
// heartbeat_recovered), every 45 s the holder fencing itself on two
// failures, suspended (fenced writes) and unfencing (14 events, two
// procedure chains), every 240 s the follower's process restarting (7), and
// every 600 s a power cut of the holder with the follower's takeover and
// the old holder's restart (14), every other one followed 300 s later by a
// failback handover (15). It returns the records written.
func writeEventsExport(tb testing.TB, path string, n int) int {
	fh, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer fh.Close()
	bw := bufio.NewWriterSize(fh, 1<<20)
	w, err := events.NewExportWriter(bw, events.ExportHeader{Source: "projections benchmark (events)", Pair: "pg-main"})
	if err != nil {
		tb.Fatal(err)
	}
	h := newHistory(tb, "pg-main")
	flush := func() {
		for _, r := range h.recs {
			if err := w.Write(r); err != nil {
				tb.Fatal(err)
			}
		}
		h.recs = h.recs[:0]
	}
	rng := rand.New(rand.NewPCG(11, 11))
	jitter := func() time.Duration { return time.Duration(rng.IntN(20_000)) * time.Microsecond }
	ms := func(d int) time.Duration { return time.Duration(d) * time.Millisecond }

	h.at(0).config()
	h.start("site-a")
	h.start("site-b")
	holder, follower := "site-a", "site-b"
	term, seq := uint64(1), map[string]uint64{"site-a": 2, "site-b": 2}
	next := func(site string) uint64 { seq[site]++; return seq[site] }
	rev := h.at(ms(50)).leader(failover.Leader{Site: holder, Term: term})
	h.event(holder, &failover.Promoted{Seq: 2, Term: term, Rev: rev, Reason: failover.AcquireBootstrap})
	h.at(ms(100)).chain(holder, procedure.ChainPromote, 2, false)
	h.event(holder, &failover.ServingStarted{Seq: 2, Term: term})
	beat, hbBeat := uint64(0), uint64(0)
	write := func(t time.Duration, fenced bool) {
		beat++
		rev = h.at(t + jitter()).leader(failover.Leader{Site: holder, Term: term, Beat: beat, Fenced: fenced})
	}
	promote := func(site string, t time.Duration, s uint64) {
		h.at(t+ms(5)).chain(site, procedure.ChainPromote, s, false)
		h.event(site, &failover.ServingStarted{Seq: s, Term: term})
	}
	restart := func(site string, t time.Duration, escalate bool) {
		s := next(site)
		h.at(t).event(site, &failover.Started{Pair: "pg-main", Site: site, Rules: h.rules})
		h.event(site, &failover.FenceRequested{Seq: s, Reason: failover.FenceRestart, Then: failover.AfterResume})
		h.at(t+ms(60)).chain(site, procedure.ChainFence, s, escalate)
		h.event(site, &failover.Fenced{Seq: s})
	}
	for s := 1; w.Count()+len(h.recs) < n; s++ {
		t := time.Duration(s) * time.Second
		switch {
		case s%600 == 0:
			// The holder loses power; the follower takes over 5.1s after its
			// last write; the old holder is back, fenced, 30s later.
			for k := 1; k <= 5; k++ {
				hbBeat++
				h.at(t+time.Duration(k)*time.Second+jitter()).hb(follower, hbBeat)
			}
			at := t + ms(4100)
			h.at(at).event(follower, &failover.AcquireAttempted{Reason: failover.AcquireStale, Term: term + 1, ExpectRev: rev, Stale: ms(5100)})
			term++
			rev = h.at(at + ms(2)).leader(failover.Leader{Site: follower, Term: term})
			p := next(follower)
			h.event(follower, &failover.Promoted{Seq: p, Term: term, Rev: rev, Reason: failover.AcquireStale})
			promote(follower, at, p)
			restart(holder, at+30*time.Second, s%1200 == 0)
			holder, follower = follower, holder
			beat = 0
			s += 5
			continue
		case s%1200 == 300:
			// Failback: the holder demotes and hands over to the preferred
			// primary, which promotes.
			d := next(holder)
			h.at(t).event(holder, &failover.DemotionRequested{Seq: d, Reason: failover.DemoteFailback, Handoff: follower})
			h.at(t+ms(200)).chain(holder, procedure.ChainDemote, d, false)
			h.event(holder, &failover.Demoted{Seq: d})
			rel := h.at(t + ms(220)).leader(failover.Leader{Term: term, Handoff: follower})
			h.event(holder, &failover.Released{Term: term, Rev: rel, Handoff: follower})
			h.at(t+ms(240)).event(follower, &failover.AcquireAttempted{Reason: failover.AcquireHandoff, Term: term + 1, ExpectRev: rel})
			term++
			rev = h.at(t + ms(250)).leader(failover.Leader{Site: follower, Term: term})
			p := next(follower)
			h.event(follower, &failover.Promoted{Seq: p, Term: term, Rev: rev, Reason: failover.AcquireHandoff})
			promote(follower, t+ms(250), p)
			holder, follower = follower, holder
			beat = 0
		case s%45 == 0:
			// Two writes miss their deadline: the holder fences itself,
			// stays suspended for two fenced writes, announces it is back
			// by an unfenced one, and serves again after its promote.
			h.at(t-time.Second).event(holder, &failover.HeartbeatFailed{Term: term, Failures: 1, Cause: "timeout"})
			h.at(t).event(holder, &failover.HeartbeatFailed{Term: term, Failures: 2, Cause: "timeout"})
			f := next(holder)
			h.event(holder, &failover.FenceRequested{Seq: f, Reason: failover.FenceHeartbeatFailures, Term: term, Then: failover.AfterSuspend})
			h.at(t+ms(80)).chain(holder, procedure.ChainFence, f, false)
			h.event(holder, &failover.Fenced{Seq: f})
			write(t+time.Second, true)
			write(t+2*time.Second, true)
			write(t+ms(2500), false)
			u := next(holder)
			h.at(t+ms(2520)).event(holder, &failover.Unfenced{Seq: u, Term: term})
			promote(holder, t+ms(2600), u)
			hbBeat++
			h.at(t+3*time.Millisecond+jitter()).hb(follower, hbBeat)
			s += 2
			continue
		case s%240 == 120:
			restart(follower, t+ms(500), false)
		case s%10 == 0:
			h.at(t+time.Second).event(holder, &failover.HeartbeatFailed{Term: term, Failures: 1, Cause: "timeout"})
			h.at(t+ms(1100)).event(holder, &failover.HeartbeatRecovered{Term: term, AfterFailures: 1})
		}
		write(t, false)
		hbBeat++
		h.at(t+3*time.Millisecond+jitter()).hb(follower, hbBeat)
		if len(h.recs) > 4096 {
			flush()
		}
	}
	flush()
	if err := w.Close(); err != nil {
		tb.Fatal(err)
	}
	if err := bw.Flush(); err != nil {
		tb.Fatal(err)
	}
	return w.Count()
}

// replayFile folds the export file at path into every projection.
func replayFile(tb testing.TB, path string) (*Report, int) {
	fh, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer fh.Close()
	r, err := events.NewExportReader(fh)
	if err != nil {
		tb.Fatal(err)
	}
	f, err := NewFold(Options{Pair: r.Header().Pair})
	if err != nil {
		tb.Fatal(err)
	}
	for rec, err := range events.ReadAhead(r, nil) {
		if err != nil {
			tb.Fatal(err)
		}
		f.Add(rec)
	}
	return f.Report(), f.Count()
}

const benchRecords = 1_000_000

// BenchmarkReplayFile: read a 1M-record export file and fold it into every
// projection (Report included). Goal: at least 1,000,000 records/s. A
// record is a message of the pair's KV keys or event subjects; events/s
// counts the event-stream records alone. Two histories: a quiet pair's
// (heartbeats: 99.9 % KV writes) and one under continual faults (events: a
// fifth of the records, the simulator's random scenario's mix).
func BenchmarkReplayFile(b *testing.B) {
	for _, fx := range []struct {
		name  string
		write func(testing.TB, string, int) int
	}{{"heartbeats", writeHistoryExport}, {"events", writeEventsExport}} {
		b.Run(fx.name, func(b *testing.B) {
			path := filepath.Join(b.TempDir(), "history.export")
			n := fx.write(b, path, benchRecords)
			st, _ := os.Stat(path)
			b.SetBytes(st.Size())
			b.ReportAllocs()
			var rep *Report
			for b.Loop() {
				var got int
				rep, got = replayFile(b, path)
				if got != n {
					b.Fatalf("folded %d records, want %d", got, n)
				}
			}
			s := b.Elapsed().Seconds()
			b.ReportMetric(float64(n)*float64(b.N)/s, "records/s")
			b.ReportMetric(float64(rep.Records.Events)*float64(b.N)/s, "events/s")
			b.ReportMetric(100*float64(rep.Records.Events)/float64(n), "%events")
			if len(rep.Failovers) == 0 || len(rep.SplitBrain) != 0 {
				b.Fatalf("the history's failovers: %d, split brains %d", len(rep.Failovers), len(rep.SplitBrain))
			}
		})
	}
}

// The benchmark's history replays as what it is: a failover every cycle,
// no split brain, every heartbeat counted.
func TestBenchmarkHistory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "history.export")
	n := writeHistoryExport(t, path, 100_000)
	r, got := replayFile(t, path)
	if got != n {
		t.Fatalf("folded %d of %d", got, n)
	}
	if len(r.Failovers) != 2 || len(r.SplitBrain) != 0 || r.Records.Gaps != 0 || r.Records.Corrupt != 0 {
		t.Fatalf("failovers %d, split brain %d, records %+v", len(r.Failovers), len(r.SplitBrain), r.Records.RecordCounts)
	}
	for _, fo := range r.Failovers {
		if fo.FailoverMS == nil || *fo.FailoverMS < 5000 || *fo.FailoverMS > 5200 {
			t.Errorf("failover %+v", fo)
		}
	}
	if r.Escalations != 1 {
		t.Errorf("escalations %d", r.Escalations)
	}
	hb := r.Heartbeats["site-a"].Register
	if hb.P50MS < 980 || hb.P50MS > 1020 || hb.P99MS > 1030 {
		t.Errorf("register heartbeat percentiles %+v", hb)
	}
}

// The events-heavy history replays as what it is: its failovers,
// failbacks, self-fences and restarts, a fifth of its records events, no
// split brain, every outage dated by its events.
func TestBenchmarkEventsHistory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "history.export")
	n := writeEventsExport(t, path, 60_000)
	r, got := replayFile(t, path)
	if got != n {
		t.Fatalf("folded %d of %d", got, n)
	}
	share := float64(r.Records.Events) / float64(n)
	if share < 0.18 || share > 0.3 || len(r.SplitBrain) != 0 || r.Records.Gaps != 0 || r.Records.Corrupt != 0 || r.Records.Unknown != 0 {
		t.Fatalf("events %.1f %%, split brain %d, records %+v", 100*share, len(r.SplitBrain), r.Records.RecordCounts)
	}
	span := r.Window.To.Sub(r.Window.From)
	cycles := int(span / (600 * time.Second))
	if len(r.Failovers) != cycles {
		t.Errorf("%d failovers in %v, want one per 600s: %d", len(r.Failovers), span, cycles)
	}
	var failbacks, fences int
	for _, ho := range r.Handovers {
		if ho.Kind == "failback" {
			failbacks++
		}
	}
	for _, ch := range r.Procedures {
		if ch.Kind == "fence" {
			fences++
		}
	}
	if failbacks < cycles/2 || fences < int(span/(45*time.Second)) {
		t.Errorf("%d failbacks, %d fence chains in %v", failbacks, fences, span)
	}
	// Power cuts leave the outage bounded; nothing else does.
	if a := r.Availability; a.Bounded != len(r.Failovers) {
		t.Errorf("%d bounded outages, %d failovers: %+v", a.Bounded, len(r.Failovers), a)
	}
}
