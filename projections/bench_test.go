package projections

import (
	"bufio"
	"io"
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
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			tb.Fatal(err)
		}
		f.Add(rec)
	}
	return f.Report(), f.Count()
}

const benchRecords = 1_000_000

// BenchmarkReplayFile: read a 1M-record export file and fold it into every
// projection (Report included). Goal: at least 1,000,000 records/s.
func BenchmarkReplayFile(b *testing.B) {
	path := filepath.Join(b.TempDir(), "history.export")
	n := writeHistoryExport(b, path, benchRecords)
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
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
	if len(rep.Failovers) == 0 || len(rep.SplitBrain) != 0 {
		b.Fatalf("the history's failovers: %d, split brains %d", len(rep.Failovers), len(rep.SplitBrain))
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
