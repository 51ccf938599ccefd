package projections

import (
	"strconv"
	"testing"
	"time"

	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/events"
)

// history builds a pair's record as JetStream would hold it: events on
// UNDERSTUDY_EVENTS with their subject links, KV writes on the bucket's
// stream (register writes by CAS with their link, heartbeats by put).
type history struct {
	t      testing.TB
	codec  *events.Registry
	pair   string
	base   time.Time
	now    time.Time
	evSeq  uint64
	kvSeq  uint64
	last   map[string]uint64 // last sequence per subject
	recs   []events.Record
	rules  failover.Rules
	procNo map[string]uint64
}

const testStream = "UNDERSTUDY_EVENTS"

var testBase = time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)

func newHistory(t testing.TB, pair string) *history {
	reg := events.NewRegistry()
	if err := failover.RegisterEvents(reg); err != nil {
		t.Fatal(err)
	}
	if err := procedure.RegisterEvents(reg); err != nil {
		t.Fatal(err)
	}
	return &history{t: t, codec: reg, pair: pair, base: testBase, now: testBase, last: map[string]uint64{},
		rules: failover.DefaultRules(pair, "site-a", "site-b"), procNo: map[string]uint64{}}
}

// at sets the server clock to base + d.
func (h *history) at(d time.Duration) *history {
	h.now = h.base.Add(d)
	return h
}

func (h *history) append(subject string, data []byte, expect bool) events.Record {
	h.evSeq++
	rec := events.Record{Stream: testStream, Subject: subject, Sequence: h.evSeq, Time: h.now, Data: data}
	if expect {
		rec.Headers = map[string]string{expectHeader: strconv.FormatUint(h.last[subject], 10), "Nats-Msg-Id": subject + "@" + strconv.FormatUint(h.last[subject]+1, 10)}
	}
	h.last[subject] = h.evSeq
	h.recs = append(h.recs, rec)
	return rec
}

// event appends a member event of site.
func (h *history) event(site string, ev events.Event) events.Record {
	data, err := h.codec.Encode(ev)
	if err != nil {
		h.t.Fatal(err)
	}
	return h.append(failover.Subject(h.pair, site), data, true)
}

// proc appends a procedure event of site.
func (h *history) proc(site string, ev events.Event) events.Record {
	data, err := h.codec.Encode(ev)
	if err != nil {
		h.t.Fatal(err)
	}
	return h.append(procedure.Subject(h.pair+"."+site), data, true)
}

func (h *history) kv(key string, value []byte, cas bool) events.Record {
	h.kvSeq++
	rec := events.KVRecord(DefaultBucket, events.Entry{Key: key, Value: value, Revision: h.kvSeq, Time: h.now, Op: events.OpPut})
	if cas {
		rec.Headers = map[string]string{expectHeader: strconv.FormatUint(h.last[rec.Subject], 10)}
	}
	h.last[rec.Subject] = h.kvSeq
	h.recs = append(h.recs, rec)
	return rec
}

// leader writes the register by CAS; it returns the revision.
func (h *history) leader(l failover.Leader) uint64 {
	return h.kv(failover.LeaderKey(h.pair), failover.EncodeLeader(l), true).Sequence
}

func (h *history) hb(site string, beat uint64) {
	h.kv(failover.HeartbeatKey(h.pair, site), failover.EncodeHeartbeat(failover.Heartbeat{Site: site, Beat: beat, Phase: failover.PhaseFollower, Ready: true}), false)
}

func (h *history) config() {
	h.kv(failover.ConfigKey(h.pair), failover.EncodeRules(h.rules), false)
}

// chain records a procedure chain of one ok step (or a failing first step
// and an ok second one when escalate).
func (h *history) chain(site string, kind procedure.ChainKind, seq uint64, escalate bool) {
	res := h.pair + "." + site
	steps := 1
	if escalate {
		steps = 2
	}
	h.proc(site, &procedure.ChainStarted{Resource: res, Kind: kind, Seq: seq, Steps: steps})
	i := 0
	if escalate {
		h.proc(site, &procedure.StepStarted{Resource: res, Kind: kind, Seq: seq, Index: 0, Name: "pg-stop", Driver: "exec"})
		h.proc(site, &procedure.StepFinished{Resource: res, Kind: kind, Seq: seq, Index: 0, Name: "pg-stop", Result: procedure.ResultTimedOut, ExitCode: -1, Took: 10 * time.Second})
		i = 1
	}
	h.proc(site, &procedure.StepStarted{Resource: res, Kind: kind, Seq: seq, Index: i, Name: "noop", Driver: "exec"})
	h.proc(site, &procedure.StepFinished{Resource: res, Kind: kind, Seq: seq, Index: i, Name: "noop", Result: procedure.ResultOK, Took: time.Millisecond})
	h.proc(site, &procedure.ChainFinished{Resource: res, Kind: kind, Seq: seq, OK: true, Took: time.Millisecond})
}

// start records a member's start: started, its restart fence, fenced.
func (h *history) start(site string) {
	h.event(site, &failover.Started{Pair: h.pair, Site: site, Rules: h.rules})
	h.event(site, &failover.FenceRequested{Seq: 1, Reason: failover.FenceRestart, Then: failover.AfterResume})
	h.chain(site, procedure.ChainFence, 1, false)
	h.event(site, &failover.Fenced{Seq: 1})
}

// bootstrap: site-a and site-b start, site-a takes term 1 and serves at
// 100ms; site-a's register writes and site-b's heartbeats follow every
// second up to lastA (site-a) and upTo (site-b). It returns the revision of
// site-a's last write.
func (h *history) bootstrap(lastA, upTo time.Duration) uint64 {
	h.at(0).config()
	h.start("site-a")
	h.start("site-b")
	h.at(50 * time.Millisecond)
	h.event("site-a", &failover.AcquireAttempted{Reason: failover.AcquireBootstrap, Term: 1})
	rev := h.leader(failover.Leader{Site: "site-a", Term: 1})
	h.event("site-a", &failover.Promoted{Seq: 2, Term: 1, Rev: rev, Reason: failover.AcquireBootstrap})
	h.chain("site-a", procedure.ChainPromote, 2, false)
	h.at(100*time.Millisecond).event("site-a", &failover.ServingStarted{Seq: 2, Term: 1})
	for s := time.Second; s <= max(lastA, upTo); s += time.Second {
		if s <= lastA {
			rev = h.at(s).leader(failover.Leader{Site: "site-a", Term: 1, Beat: uint64(s / time.Second)})
		}
		if s <= upTo {
			h.at(s+3*time.Millisecond).hb("site-b", uint64(s/time.Second))
		}
	}
	return rev
}

// takeover: site-b attempts at attempt (expecting lastRev), wins 2ms
// later, serves 10ms after the attempt, then writes the register every
// second up to until.
func (h *history) takeover(attempt time.Duration, lastRev uint64, stale time.Duration, until time.Duration) {
	h.at(attempt).event("site-b", &failover.AcquireAttempted{Reason: failover.AcquireStale, Term: 2, ExpectRev: lastRev, Stale: stale})
	rev := h.at(attempt + 2*time.Millisecond).leader(failover.Leader{Site: "site-b", Term: 2})
	h.at(attempt+3*time.Millisecond).event("site-b", &failover.Promoted{Seq: 2, Term: 2, Rev: rev, Reason: failover.AcquireStale})
	h.chain("site-b", procedure.ChainPromote, 2, false)
	h.at(attempt+10*time.Millisecond).event("site-b", &failover.ServingStarted{Seq: 2, Term: 2})
	for s := attempt + time.Second; s <= until; s += time.Second {
		h.at(s).leader(failover.Leader{Site: "site-b", Term: 2, Beat: uint64((s - attempt) / time.Second)})
	}
}

// fold folds recs into a report.
func foldAll(t testing.TB, pair string, recs []events.Record) *Report {
	t.Helper()
	f, err := NewFold(Options{Pair: pair})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		f.Add(r)
	}
	return f.Report()
}
