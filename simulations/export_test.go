package simulations

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/events"
)

// The history a run exports is what a real export of the same pair would
// hold: the failover bucket's KV records (register writes and member
// heartbeats) and the event stream's records, with server timestamps.
func TestExportHistory(t *testing.T) {
	var buf bytes.Buffer
	res, err := Run(Config{Scenario: "return-to-normal", Seed: 2, Export: &buf})
	if err != nil {
		t.Fatal(err)
	}
	r, err := events.NewExportReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	h := r.Header()
	if h.Pair != "pg-main" || h.Meta["scenario"] != "return-to-normal" || h.Meta["seed"] != "2" || h.Meta["digest"] != res.Digest {
		t.Errorf("header %+v", h)
	}
	if !strings.Contains(h.Source, "understudy simulate --scenario return-to-normal --seed 2") {
		t.Errorf("source %q", h.Source)
	}
	codec := NewCodec()
	kinds := map[string]int{}
	var last time.Time
	var promotedAt, lastKVRev uint64
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Time.Before(Epoch) || rec.Time.After(Epoch.Add(res.Duration())) {
			t.Fatalf("record %s/%d stamped %v, outside the run", rec.Stream, rec.Sequence, rec.Time)
		}
		switch rec.Stream {
		case "KV_understudy_failover":
			_, e, ok := events.EntryFromRecord(rec)
			if !ok {
				t.Fatalf("not a KV record: %+v", rec)
			}
			if e.Revision <= lastKVRev {
				t.Fatalf("KV revisions not increasing: %d after %d", e.Revision, lastKVRev)
			}
			lastKVRev = e.Revision
			switch {
			case e.Key == failover.LeaderKey("pg-main"):
				if _, err := failover.DecodeLeader(e.Value); err != nil {
					t.Fatal(err)
				}
				kinds["leader"]++
			case strings.HasPrefix(e.Key, "pg-main.hb."):
				kinds["hb"]++
			}
		case "UNDERSTUDY_EVENTS":
			if rec.Time.Before(last) {
				t.Fatalf("event %d stamped before its predecessor", rec.Sequence)
			}
			last = rec.Time
			ev, err := codec.DecodeRecord(rec)
			if err != nil {
				t.Fatalf("event %s/%d: %v", rec.Subject, rec.Sequence, err)
			}
			switch {
			case strings.HasPrefix(rec.Subject, "ev.failover.pg-main."):
				kinds["failover"]++
				if _, ok := ev.(*failover.Promoted); ok {
					promotedAt = rec.Sequence
				}
			case strings.HasPrefix(rec.Subject, "ev.procedure.pg-main."):
				if _, ok := ev.(*procedure.ChainStarted); ok {
					kinds["procedure"]++
				}
			}
			if rec.Headers["Nats-Msg-Id"] == "" {
				t.Errorf("event %d has no message id", rec.Sequence)
			}
		default:
			t.Fatalf("record of unexpected stream %q", rec.Stream)
		}
	}
	if kinds["leader"] < 100 || kinds["hb"] < 100 || kinds["failover"] < 10 || kinds["procedure"] < 4 || promotedAt == 0 {
		t.Fatalf("export holds %v (promoted at %d): want register writes, heartbeats, failover and procedure events", kinds, promotedAt)
	}
}
