package runtime

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthdm/hollywood/actor"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/events"
)

// Failover pairs hosted on a real embedded JetStream, with fast rules:
// failover_timeout 1s >= (2 + 1) * 200ms + 300ms.

// raceSlack is what timing bounds allow for scheduling under -race on a
// small, busy machine.
const raceSlack = 400 * time.Millisecond

func fastRules(t *testing.T, pair string) failover.Rules {
	t.Helper()
	r := failover.DefaultRules(pair, "site-a", "site-b")
	r.HeartbeatTimeout, r.FailureThreshold, r.SuccessThreshold = 200*time.Millisecond, 2, 2
	r.FailoverTimeout, r.FenceGrace = time.Second, 300*time.Millisecond
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	return r
}

// failoverNATS is an embedded server with the assets provisioned, and an
// observer connection to it.
type failoverNATS struct {
	addr   string // host:port
	names  AssetsConfig
	js     jetstream.JetStream // the observer's
	kv     events.KV           // the failover bucket, through the observer
	evlog  events.Log          // the event stream, through the observer
	server *EmbeddedNATS
}

func startFailoverNATS(t *testing.T) *failoverNATS {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	es := startEmbedded(t, log)
	nc := connectTo(t, es.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	names := DefaultConfig().Assets
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := Provision(ctx, js, DefaultAssets(names, 1), log); err != nil {
		t.Fatal(err)
	}
	kv, err := events.NewJetStreamKV(ctx, js, names.FailoverBucket)
	if err != nil {
		t.Fatal(err)
	}
	evlog, err := events.NewJetStreamLog(js, names.EventsStream, Codec())
	if err != nil {
		t.Fatal(err)
	}
	return &failoverNATS{addr: es.Server().Addr().String(), names: names, js: js, kv: kv, evlog: evlog, server: es}
}

func connectTo(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// stepRecorder is a procedure driver that succeeds at once and records
// every step it runs, with the local time.
type stepRecorder struct {
	mu    sync.Mutex
	calls []stepCall
}

type stepCall struct {
	name string
	at   time.Time
}

func (r *stepRecorder) Run(_ context.Context, step procedure.StepSpec) procedure.Outcome {
	r.mu.Lock()
	r.calls = append(r.calls, stepCall{step.Name, time.Now()})
	r.mu.Unlock()
	return procedure.Outcome{Result: procedure.ResultOK}
}

// since returns the calls of the named step made at or after from.
func (r *stepRecorder) since(name string, from time.Time) []stepCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []stepCall
	for _, c := range r.calls {
		if c.name == name && !c.at.Before(from) {
			out = append(out, c)
		}
	}
	return out
}

func (r *stepRecorder) waitFor(t *testing.T, name string, from time.Time, timeout time.Duration) stepCall {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if c := r.since(name, from); len(c) > 0 {
			return c[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s step within %v", name, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// recordedProcedures name each chain's one step after the chain, so a
// stepRecorder tells them apart.
func recordedProcedures() procedure.Spec {
	chain := func(name string) procedure.ChainSpec {
		// 300ms: the fence chain's worst case must fit in fence_grace.
		return procedure.ChainSpec{Steps: []procedure.StepSpec{{Name: name, Driver: "exec", Timeout: 300 * time.Millisecond, Exec: &procedure.ExecSpec{Command: "true"}}}}
	}
	return procedure.Spec{Fence: chain("fence"), Promote: chain("promote"), Demote: chain("demote")}
}

// transitions collects what members record (HostOptions.Observe).
type transitions struct {
	mu      sync.Mutex
	list    []Transition
	changed chan struct{} // closed and replaced on every transition
}

func newTransitions() *transitions { return &transitions{changed: make(chan struct{})} }

func (tr *transitions) observe(t Transition) {
	tr.mu.Lock()
	tr.list = append(tr.list, t)
	close(tr.changed)
	tr.changed = make(chan struct{})
	tr.mu.Unlock()
}

// waitFor returns the n-th (1-based) transition of site with the event
// type, failing the test after timeout.
func (tr *transitions) waitFor(t *testing.T, site, eventType string, n int, timeout time.Duration) Transition {
	t.Helper()
	return tr.waitMatch(t, site, eventType, n, timeout, func(x Transition) bool { return x.Site == site && x.Event.EventType() == eventType })
}

// waitMatch returns the n-th (1-based) transition that match accepts (who's
// of the event type, as the failure after timeout says).
func (tr *transitions) waitMatch(t *testing.T, who, eventType string, n int, timeout time.Duration, match func(Transition) bool) Transition {
	t.Helper()
	deadline := time.After(timeout)
	for {
		tr.mu.Lock()
		changed := tr.changed
		seen := 0
		for _, x := range tr.list {
			if match(x) {
				if seen++; seen == n {
					tr.mu.Unlock()
					return x
				}
			}
		}
		tr.mu.Unlock()
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no %s #%d of %s within %v", eventType, n, who, timeout)
		}
	}
}

// siteHost is one member hosted on its own NATS connection, as a node.
type siteHost struct {
	nc   *nats.Conn
	host *Host
}

// hostMember starts a Host running site's member of rules on a fresh
// connection to url. The test's cleanup stops it.
func hostMember(t *testing.T, url string, fn *failoverNATS, rules failover.Rules, site string, drivers procedure.Drivers, tr *transitions, log *slog.Logger) *siteHost {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name("understudy-"+site), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h, err := StartHost(context.Background(), js, fn.names.EventsStream, fn.names.FailoverBucket,
		[]MemberConfig{{Rules: rules, Site: site, Procedures: recordedProcedures()}},
		HostOptions{Logger: log, Drivers: drivers, Observe: tr.observe})
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	sh := &siteHost{nc: nc, host: h}
	t.Cleanup(func() {
		sh.host.Stop(context.Background())
		sh.nc.Close()
	})
	return sh
}

// loggedEvent is one decoded record of a member's subject.
type loggedEvent struct {
	seq uint64
	at  time.Time
	ev  events.Event
}

func (l loggedEvent) String() string {
	return fmt.Sprintf("#%d %s %s %+v", l.seq, l.at.Format("15:04:05.000"), l.ev.EventType(), l.ev)
}

func readSubject(t *testing.T, fn *failoverNATS, subject string) []loggedEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []loggedEvent
	for rec, err := range fn.evlog.Read(ctx, events.ReadOptions{Subject: subject}) {
		if err != nil {
			t.Fatalf("read %s: %v", subject, err)
		}
		ev, err := fn.evlog.Codec().DecodeRecord(rec)
		if err != nil {
			t.Fatalf("decode %s #%d: %v", subject, rec.Sequence, err)
		}
		out = append(out, loggedEvent{rec.Sequence, rec.Time, ev})
	}
	return out
}

// expectInOrder finds, from index from on, events matching each check in
// turn (others may come between) and returns their indexes.
func expectInOrder(t *testing.T, log []loggedEvent, from int, checks ...func(events.Event) bool) []int {
	t.Helper()
	var at []int
	i := from
	for n, check := range checks {
		for i < len(log) && !check(log[i].ev) {
			i++
		}
		if i == len(log) {
			t.Errorf("log lacks expected event #%d (after index %d); the log:", n+1, from)
			for _, l := range log {
				t.Log(l)
			}
			t.FailNow()
		}
		at = append(at, i)
		i++
	}
	return at
}

func is[T events.Event](extra ...func(T) bool) func(events.Event) bool {
	return func(ev events.Event) bool {
		e, ok := ev.(T)
		if !ok {
			return false
		}
		for _, f := range extra {
			if !f(e) {
				return false
			}
		}
		return true
	}
}

func leaderHistory(t *testing.T, fn *failoverNATS, pair string) []failover.LeaderEntry {
	t.Helper()
	hist, err := fn.kv.History(context.Background(), failover.LeaderKey(pair))
	if err != nil {
		t.Fatal(err)
	}
	var out []failover.LeaderEntry
	for _, e := range hist {
		le, _ := failover.LeaderEntryOf(e, 0) // a value that does not decode comes back Corrupt
		out = append(out, le)
	}
	return out
}

func TestTrialPowerCutPromotesReplicaWithinBound(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	r := fastRules(t, "trial-power-cut")
	sum, err := RunTrial(context.Background(), fn.addr, TrialOptions{
		Rules: r, Mode: TrialPowerCut, FaultAfter: 300 * time.Millisecond, Window: 10 * r.FailoverTimeout,
		Stream: fn.names.EventsStream, Bucket: fn.names.FailoverBucket,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("summary: %+v", sum)
	if sum.Promoted != r.Replica || sum.Promotions != 1 {
		t.Fatalf("promoted %q %d times, want %s once", sum.Promoted, sum.Promotions, r.Replica)
	}
	fo, hb := ms(r.FailoverTimeout), ms(r.HeartbeatTimeout)
	if sum.FailoverTimeoutMS != fo || sum.HeartbeatTimeoutMS != hb {
		t.Errorf("summary rules: failover_timeout %vms heartbeat_timeout %vms", sum.FailoverTimeoutMS, sum.HeartbeatTimeoutMS)
	}
	// Never before failover_timeout of server time (that is the safety
	// argument), and not much later: one replica heartbeat to notice, one
	// CAS to land.
	if max := fo + 2*hb + ms(raceSlack); sum.FailoverMS < fo || sum.FailoverMS > max {
		t.Errorf("failover took %.1fms, want %.0f..%.0fms", sum.FailoverMS, fo, max)
	}
	if sum.PromotionAttemptAt == nil || sum.DetectionMS < fo {
		t.Errorf("promotion attempt at %v, detection %.1fms: want one, after failover_timeout %.0fms", sum.PromotionAttemptAt, sum.DetectionMS, fo)
	}
	if sum.ServingAt == nil || sum.ServingMS < sum.FailoverMS {
		t.Errorf("replica serving at %v (%.1fms), want after the promotion (%.1fms)", sum.ServingAt, sum.ServingMS, sum.FailoverMS)
	}
	if sum.LastPrimaryHeartbeat.IsZero() || sum.LastPrimaryHeartbeat.After(sum.FaultAt.Add(50*time.Millisecond)) {
		t.Errorf("last primary heartbeat %v, fault at %v: a dead primary's write landed", sum.LastPrimaryHeartbeat, sum.FaultAt)
	}
	if sum.PrimaryFencedAt != nil {
		t.Errorf("primary fenced at %v: a powered-off primary records nothing", sum.PrimaryFencedAt)
	}
}

func TestTrialReplicaCutNeverPromotes(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	r := fastRules(t, "trial-replica-cut")
	window := 3 * r.FailoverTimeout
	sum, err := RunTrial(context.Background(), fn.addr, TrialOptions{
		Rules: r, Mode: TrialReplicaCut, FaultAfter: 300 * time.Millisecond, Window: window,
		Stream: fn.names.EventsStream, Bucket: fn.names.FailoverBucket,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("summary: %+v", sum)
	if sum.Promotions != 0 || sum.Promoted != "" || sum.PromotedAt != nil || sum.ServingAt != nil {
		t.Errorf("a cut-off replica promoted: %+v", sum)
	}
	// The primary kept its register fresh all along.
	if got := sum.LastPrimaryHeartbeat.Sub(sum.FaultAt); got < window {
		t.Errorf("last primary heartbeat %v after the cut began, want at least the window %v", got, window)
	}
	for _, l := range leaderHistory(t, fn, r.Pair) {
		if l.Value.Site != r.Primary || l.Value.Term != 1 || l.Value.Fenced {
			t.Errorf("register revision %d: %v, want only %s serving in term 1", l.Rev, l.Value, r.Primary)
		}
	}
}

// A primary that cannot reach NATS fences itself within
// (failure_threshold + 1) * heartbeat_timeout — before the replica could
// promote — and records it once NATS is reachable again; then it recovers.
func TestPrimaryCutOffFencesItself(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	r := fastRules(t, "cut-off-primary")
	proxy, err := NewFaultProxy(fn.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	rec := &stepRecorder{}
	tr := newTransitions()
	hostMember(t, proxy.URL(), fn, r, r.Primary, procedure.Drivers{"exec": rec}, tr, nil)
	tr.waitFor(t, r.Primary, "failover.serving_started", 1, 5*time.Second)
	time.Sleep(r.HeartbeatTimeout / 2) // somewhere between two beats

	blockedAt := time.Now()
	proxy.SetBlocked(true)
	fence := rec.waitFor(t, "fence", blockedAt, r.FailoverTimeout+raceSlack)
	if got, max := fence.at.Sub(blockedAt), time.Duration(r.FailureThreshold+1)*r.HeartbeatTimeout+raceSlack/2; got > max {
		t.Errorf("fenced %v after the cut, want within (failure_threshold + 1) * heartbeat_timeout (+ slack) = %v", got, max)
	}
	// Stay cut off past failover_timeout: it must not promote itself again.
	time.Sleep(time.Until(blockedAt.Add(r.FailoverTimeout + r.HeartbeatTimeout)))
	if p := rec.since("promote", blockedAt); len(p) > 0 {
		t.Errorf("promote step ran %v after the cut, while NATS was unreachable", p[0].at.Sub(blockedAt))
	}
	// Nothing it recorded while cut off reached the log yet.
	for _, l := range readSubject(t, fn, failover.Subject(r.Pair, r.Primary)) {
		if _, ok := l.ev.(*failover.HeartbeatFailed); ok {
			t.Fatalf("heartbeat_failed in the log while the member is cut off: %v", l)
		}
	}

	unblockedAt := time.Now()
	proxy.SetBlocked(false)
	tr.waitFor(t, r.Primary, "failover.serving_started", 2, 5*time.Second)

	log := readSubject(t, fn, failover.Subject(r.Pair, r.Primary))
	first := expectInOrder(t, log, 0, is[*failover.ServingStarted]())[0]
	at := expectInOrder(t, log, first+1,
		is(func(e *failover.HeartbeatFailed) bool { return e.Failures == 1 && e.Term == 1 }),
		is(func(e *failover.HeartbeatFailed) bool { return e.Failures == 2 && e.Term == 1 }),
		is(func(e *failover.FenceRequested) bool {
			return e.Reason == failover.FenceHeartbeatFailures && e.Then == failover.AfterSuspend && e.Term == 1
		}),
		is[*failover.Fenced](),
		is[*failover.HeartbeatRecovered](),
		is(func(e *failover.Unfenced) bool { return e.Term == 1 }),
		is(func(e *failover.ServingStarted) bool { return e.Term == 1 }),
	)
	req := log[at[2]].ev.(*failover.FenceRequested)
	if f := log[at[3]].ev.(*failover.Fenced); f.Seq != req.Seq {
		t.Errorf("fenced seq %d, want the fence request's %d", f.Seq, req.Seq)
	}
	// Appended late: the records carry server times after the cut healed.
	if got := log[at[0]].at; got.Before(unblockedAt.Add(-50 * time.Millisecond)) {
		t.Errorf("heartbeat_failed stamped %v, before the link healed at %v", got, unblockedAt)
	}
	for _, l := range log[first:] {
		switch l.ev.(type) {
		case *failover.LeadershipLost, *failover.Promoted, *failover.Started:
			t.Errorf("unexpected %v: its own late writes are not a rival", l)
		}
	}
	// While fenced it held the register as a fenced holder, same term.
	var fencedBeat bool
	for _, l := range leaderHistory(t, fn, r.Pair) {
		if l.Value.Site != r.Primary || l.Value.Term != 1 {
			t.Errorf("register revision %d: %v, want only %s in term 1", l.Rev, l.Value, r.Primary)
		}
		fencedBeat = fencedBeat || l.Value.Fenced
	}
	if !fencedBeat {
		t.Error("no fenced heartbeat in the register's history")
	}
}

// Stopping the leader's host hands over at once (demote, leader = none
// naming the other site), instead of after failover_timeout.
func TestHostShutdownHandsOver(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	r := fastRules(t, "shutdown-handover")
	url := "nats://" + fn.addr
	tr := newTransitions()
	recA, recB := &stepRecorder{}, &stepRecorder{}
	a := hostMember(t, url, fn, r, r.Primary, procedure.Drivers{"exec": recA}, tr, nil)
	hostMember(t, url, fn, r, r.Replica, procedure.Drivers{"exec": recB}, tr, nil)
	tr.waitFor(t, r.Primary, "failover.serving_started", 1, 5*time.Second)
	tr.waitFor(t, r.Replica, "failover.fenced", 1, 5*time.Second)
	time.Sleep(2 * r.HeartbeatTimeout) // the replica follows and heartbeats

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	a.host.Shutdown(ctx)
	returned := time.Now()
	if took := returned.Sub(start); took > r.FailoverTimeout {
		t.Errorf("Shutdown took %v, want well under failover_timeout %v", took, r.FailoverTimeout)
	}
	if len(recA.since("demote", start)) != 1 {
		t.Errorf("demote steps run by the stopping leader: %v, want one", recA.since("demote", start))
	}

	// The replica holds the register soon after.
	var held time.Duration
	for {
		e, err := fn.kv.Get(context.Background(), failover.LeaderKey(r.Pair))
		if err != nil {
			t.Fatal(err)
		}
		l, err := failover.DecodeLeader(e.Value)
		if err != nil {
			t.Fatal(err)
		}
		if l.Site == r.Replica {
			held = time.Since(returned)
			break
		}
		if time.Since(returned) > r.FailoverTimeout {
			t.Fatalf("register %v %v after Shutdown returned, want %s", l, time.Since(returned), r.Replica)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if held > r.FailoverTimeout/2 {
		t.Errorf("replica held the register %v after Shutdown returned, want under failover_timeout/2 = %v", held, r.FailoverTimeout/2)
	}
	tr.waitFor(t, r.Replica, "failover.serving_started", 1, 5*time.Second)

	// The register's history: site-a term 1, the release naming site-b,
	// then site-b term 2 taking it by CAS on the release's revision.
	hist := leaderHistory(t, fn, r.Pair)
	release := slices.IndexFunc(hist, func(l failover.LeaderEntry) bool {
		return l.Value.Site == "" && l.Value.Handoff == r.Replica && l.Value.Term == 1
	})
	if release < 0 {
		t.Fatalf("no none-with-handoff revision in the register's history: %v", hist)
	}
	if next := hist[min(release+1, len(hist)-1)].Value; release+1 >= len(hist) || next.Site != r.Replica || next.Term != 2 || next.Beat != 0 || next.By != r.Replica {
		t.Errorf("after the release %v: %v, want %s term 2 beat 0 next", hist[release], hist[release+1:], r.Replica)
	}
	for _, l := range hist[:release] {
		if l.Value.Site != r.Primary || l.Value.Term != 1 {
			t.Errorf("before the release: %v", l.Value)
		}
	}

	log := readSubject(t, fn, failover.Subject(r.Pair, r.Primary))
	at := expectInOrder(t, log, 0,
		is[*failover.ServingStarted](),
		is(func(e *failover.DemotionRequested) bool {
			return e.Reason == failover.DemoteShutdown && e.Handoff == r.Replica
		}),
		is[*failover.Demoted](),
		is(func(e *failover.Released) bool { return e.Handoff == r.Replica && e.Term == 1 }),
	)
	if rel := log[at[3]].ev.(*failover.Released); rel.Rev != hist[release].Rev {
		t.Errorf("released at revision %d, the register's release is %d", rel.Rev, hist[release].Rev)
	}
	logB := readSubject(t, fn, failover.Subject(r.Pair, r.Replica))
	expectInOrder(t, logB, 0,
		is(func(e *failover.AcquireAttempted) bool {
			return e.Reason == failover.AcquireHandoff && e.ExpectRev == hist[release].Rev
		}),
		is(func(e *failover.Promoted) bool { return e.Term == 2 && e.Reason == failover.AcquireHandoff }),
		is[*failover.ServingStarted](),
	)
}

// A member restarted on a fresh connection replays its subject, appends
// after it without conflict, comes up fenced, wins the register back
// (it still names it) and serves again in the same term.
func TestMemberRestartReplaysAndServesAgain(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	r := fastRules(t, "restart")
	url := "nats://" + fn.addr
	subject := failover.Subject(r.Pair, r.Primary)

	tr1 := newTransitions()
	first := hostMember(t, url, fn, r, r.Primary, procedure.Drivers{"exec": &stepRecorder{}}, tr1, nil)
	tr1.waitFor(t, r.Primary, "failover.serving_started", 1, 5*time.Second)
	time.Sleep(2 * r.HeartbeatTimeout)
	first.host.Stop(context.Background()) // a crash, as far as the register knows: no handover
	first.nc.Close()
	before := readSubject(t, fn, subject)
	if len(before) == 0 {
		t.Fatal("nothing logged by the first run")
	}
	lastSeq := before[len(before)-1].seq
	var lastProcSeq uint64
	for _, l := range before {
		switch e := l.ev.(type) {
		case *failover.FenceRequested:
			lastProcSeq = max(lastProcSeq, e.Seq)
		case *failover.Promoted:
			lastProcSeq = max(lastProcSeq, e.Seq)
		}
	}

	logger, logs := newLogRecorder(t)
	tr2 := newTransitions()
	rec := &stepRecorder{}
	restartedAt := time.Now()
	hostMember(t, url, fn, r, r.Primary, procedure.Drivers{"exec": rec}, tr2, logger)
	tr2.waitFor(t, r.Primary, "failover.serving_started", 1, 5*time.Second)

	replayed := logs.waitFor(t, "member replayed its log", 1, time.Second)[0]
	if n := replayed.Attrs["events"].Int64(); n != int64(len(before)) {
		t.Errorf("replayed %d events, want %d", n, len(before))
	}
	if seq := replayed.Attrs["last_seq"].Uint64(); seq != lastSeq {
		t.Errorf("replay ended at sequence %d, want %d", seq, lastSeq)
	}
	if term := replayed.Attrs["term"].Uint64(); term != 1 {
		t.Errorf("term after replay %d, want 1", term)
	}
	for _, l := range logs.all() {
		if l.Level >= slog.LevelWarn {
			t.Errorf("restart logged %v", l)
		}
	}

	log := readSubject(t, fn, subject)
	if len(log) <= len(before) || log[len(before)].seq <= lastSeq {
		t.Fatalf("nothing appended after sequence %d by the restarted member", lastSeq)
	}
	for i, l := range log[:len(before)] {
		if l.seq != before[i].seq {
			t.Fatalf("the first run's records changed: %v, was %v", l, before[i])
		}
	}
	at := expectInOrder(t, log, len(before),
		is(func(e *failover.Started) bool { return e.Site == r.Primary && e.Rules == r }),
		is(func(e *failover.FenceRequested) bool {
			return e.Reason == failover.FenceRestart && e.Then == failover.AfterResume && e.Term == 1
		}),
		is[*failover.Fenced](),
		is(func(e *failover.Resumed) bool { return e.Term == 1 }),
		is(func(e *failover.Unfenced) bool { return e.Term == 1 }),
		is(func(e *failover.ServingStarted) bool { return e.Term == 1 }),
	)
	if at[0] != len(before) {
		t.Errorf("first record of the restart: %v, want started", log[len(before)])
	}
	if req := log[at[1]].ev.(*failover.FenceRequested); req.Seq <= lastProcSeq {
		t.Errorf("restart fence has procedure seq %d, want after the replayed %d", req.Seq, lastProcSeq)
	}
	for _, l := range log[len(before):] {
		switch l.ev.(type) {
		case *failover.LeadershipLost, *failover.Promoted, *failover.AcquireAttempted:
			t.Errorf("unexpected %v: the register still named it", l)
		}
	}
	// It fenced before it promoted again.
	fence := rec.waitFor(t, "fence", restartedAt, time.Second)
	if promote := rec.waitFor(t, "promote", restartedAt, time.Second); promote.at.Before(fence.at) {
		t.Errorf("promote step at %v before the fence at %v", promote.at, fence.at)
	}
	// And the register shows it as a fenced holder, same term, before it served.
	var fencedBeats int
	for _, l := range leaderHistory(t, fn, r.Pair) {
		if l.Value.Site != r.Primary || l.Value.Term != 1 {
			t.Errorf("register revision %d: %v, want only %s in term 1", l.Rev, l.Value, r.Primary)
		}
		if l.Value.Fenced {
			fencedBeats++
		}
	}
	if fencedBeats < r.SuccessThreshold {
		t.Errorf("%d fenced heartbeats in the register, want at least success_threshold = %d", fencedBeats, r.SuccessThreshold)
	}
}

// A serving member that finds another process writing its event subject
// (a zombie or a twin) fences its resource before it stops; its node
// reports it stopped (health, event on the host subject), and restarts it
// after a backoff, fenced: it reads the subject afresh and serves again.
func TestConflictingMemberFencesStopsAndIsRestarted(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	r := fastRules(t, "twin-member")
	rec := &stepRecorder{}
	tr := newTransitions()
	sh := hostMember(t, "nats://"+fn.addr, fn, r, r.Primary, procedure.Drivers{"exec": rec}, tr, nil)
	tr.waitFor(t, r.Primary, "failover.serving_started", 1, 5*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The twin appends to the member's subject, as an appender does (with a
	// message id of its own nonce); the member's next append (the config
	// change below makes one) then conflicts.
	subject := failover.Subject(r.Pair, r.Primary)
	last, err := fn.evlog.LastSequence(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	twin := events.Expect(last)
	twin.MsgID = events.AppenderMsgID(subject, last+1, "7771", "")
	if _, err := fn.evlog.Append(ctx, subject, &failover.HeartbeatRecovered{Term: 99}, twin); err != nil {
		t.Fatal(err)
	}
	changed := r
	changed.SuccessThreshold = 3
	triggered := time.Now()
	if _, err := fn.kv.Put(ctx, failover.ConfigKey(r.Pair), failover.EncodeRules(changed)); err != nil {
		t.Fatal(err)
	}
	fence := rec.waitFor(t, "fence", triggered, 5*time.Second)
	if fence.at.Sub(triggered) > 2*time.Second {
		t.Errorf("fenced %v after the conflict", fence.at.Sub(triggered))
	}
	var stopped MemberState
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if m := sh.host.Members(); len(m) == 1 && !m[0].Running {
			stopped = m[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the member was not reported stopped: %+v", sh.host.Members())
		}
	}
	if stopped.Stops != 1 || !strings.Contains(stopped.Reason, "another process appends") || stopped.RestartAt.Sub(stopped.Since) != memberRestartMin {
		t.Errorf("stopped member reported as %+v", stopped)
	}
	// The stop is an event of its own, on the host subject.
	var recorded *failover.MemberStopped
	for deadline := time.Now().Add(5 * time.Second); recorded == nil; time.Sleep(20 * time.Millisecond) {
		for _, le := range readSubject(t, fn, failover.HostSubject(r.Pair, r.Primary)) {
			if ms, ok := le.ev.(*failover.MemberStopped); ok {
				recorded = ms
			}
		}
		if recorded == nil && time.Now().After(deadline) {
			t.Fatal("no failover.member_stopped on the host subject")
		}
	}
	if recorded.Stops != 1 || recorded.RestartIn != memberRestartMin || recorded.Reason != stopped.Reason {
		t.Errorf("recorded %+v, reported %+v", recorded, stopped)
	}
	// Restarted, fenced first (a second fence after the conflict fence),
	// and serving again in the same term.
	tr.waitFor(t, r.Primary, "failover.serving_started", 2, 10*time.Second)
	if m := sh.host.Members(); !m[0].Running || m[0].Stops != 1 {
		t.Errorf("after the restart: %+v", m)
	}
	if fences := rec.since("fence", triggered); len(fences) < 2 {
		t.Errorf("fence steps since the conflict: %d, want the conflict fence and the restart fence", len(fences))
	}
}

// failingCheck fails the steps named "check" and records the others.
type failingCheck struct{ stepRecorder }

func (f *failingCheck) Run(ctx context.Context, step procedure.StepSpec) procedure.Outcome {
	f.stepRecorder.Run(ctx, step)
	if step.Name == "check" {
		return procedure.Outcome{Result: procedure.ResultFailed, ExitCode: 1, Detail: "pg_isready: no response"}
	}
	return procedure.Outcome{Result: procedure.ResultOK}
}

// A serving leader whose database fails its checks hands over to the
// ready replica, on a real JetStream, and says why.
func TestFailedChecksHandOver(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	r := fastRules(t, "check-pair")
	tr := newTransitions()
	procs := recordedProcedures()
	procs.Check = procedure.ChainSpec{Steps: []procedure.StepSpec{{Name: "check", Driver: "exec", Timeout: 100 * time.Millisecond, Exec: &procedure.ExecSpec{Command: "true"}}}}
	for _, site := range []string{r.Primary, r.Replica} {
		nc := connectTo(t, "nats://"+fn.addr)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		drv := procedure.Drivers{"exec": &stepRecorder{}}
		if site == r.Primary {
			drv = procedure.Drivers{"exec": &failingCheck{}}
		}
		h, err := StartHost(context.Background(), js, fn.names.EventsStream, fn.names.FailoverBucket,
			[]MemberConfig{{Rules: r, Site: site, Procedures: procs, Options: failover.Options{CheckInterval: 200 * time.Millisecond, CheckFailures: 2}}},
			HostOptions{Logger: slog.New(slog.DiscardHandler), Drivers: drv, Observe: tr.observe})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Stop(context.Background()) })
	}
	tr.waitFor(t, r.Primary, "failover.serving_started", 1, 5*time.Second)
	// Until the replica heartbeats ready, the leader keeps leading (and
	// says so); then the next failed check hands over.
	var failed *failover.CheckFailed
	for n := 2; failed == nil || !failed.HandOver; n++ {
		if n > 20 {
			t.Fatalf("no hand-over after %d failed checks; last %+v", n-1, failed)
		}
		failed = tr.waitFor(t, r.Primary, "failover.check_failed", n, 5*time.Second).Event.(*failover.CheckFailed)
	}
	if failed.Failures < 2 || !strings.Contains(failed.Detail, "pg_isready") {
		t.Errorf("hand-over check_failed: %+v", failed)
	}
	tr.waitFor(t, r.Replica, "failover.serving_started", 1, 5*time.Second)
	if l, err := fn.kv.Get(context.Background(), failover.LeaderKey(r.Pair)); err != nil {
		t.Fatal(err)
	} else if ld, _ := failover.DecodeLeader(l.Value); ld.Site != r.Replica {
		t.Errorf("register after the hand-over: %+v", ld)
	}
}

// A value that is not a register in <pair>.leader: the serving primary
// loses its term and fences, nobody loops on refused acquires, and the
// register is replaced by CAS with a term above every earlier one, after
// failover_timeout; the pair serves again without anyone touching the key.
func TestGarbageRegisterIsReplacedWithoutLoop(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	r := fastRules(t, "garbage-register")
	tr := newTransitions()
	log, rec := newLogRecorder(t)
	hostMember(t, "nats://"+fn.addr, fn, r, r.Primary, procedure.Drivers{"exec": &stepRecorder{}}, tr, log)
	hostMember(t, "nats://"+fn.addr, fn, r, r.Replica, procedure.Drivers{"exec": &stepRecorder{}}, tr, log)
	tr.waitFor(t, r.Primary, "failover.serving_started", 1, 5*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := fn.kv.Put(ctx, failover.LeaderKey(r.Pair), []byte("not a register \xc1")); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	tr.waitFor(t, r.Primary, "failover.leadership_lost", 1, 5*time.Second)
	// Someone serves again, in a term above 1.
	var served Transition
	for deadline := time.Now().Add(r.FailoverTimeout + 5*time.Second); ; time.Sleep(20 * time.Millisecond) {
		tr.mu.Lock()
		for _, x := range tr.list {
			if ss, ok := x.Event.(*failover.ServingStarted); ok && ss.Term > 1 && x.At.After(written) {
				served = x
			}
		}
		tr.mu.Unlock()
		if served.Event != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nobody serves %v after the garbage register", time.Since(written))
		}
	}
	if took := served.At.Sub(written); took < r.FailoverTimeout {
		t.Errorf("%s served %v after the garbage was written, before failover_timeout %v: the last holder might still have served", served.Site, took, r.FailoverTimeout)
	}
	time.Sleep(5 * r.HeartbeatTimeout) // a loop would show here
	tr.mu.Lock()
	refused := 0
	for _, x := range tr.list {
		switch x.Event.(type) {
		case *failover.PromotionRejected, *failover.AcquireFailed:
			refused++
		}
	}
	tr.mu.Unlock()
	if refused > 4 {
		t.Errorf("%d acquires refused or failed: a retry loop", refused)
	}
	if n := len(rec.matching("leader register value does not decode: it counts as held by nobody, and is replaced by CAS with a term above the highest of its history")); n == 0 || n > 2 {
		t.Errorf("the corrupt register was reported %d times, want once per member that saw it", n)
	}
	// Every register value since decodes, and no two holders share a term.
	holders := map[uint64]string{}
	for _, le := range leaderHistory(t, fn, r.Pair) {
		if le.Value.Site == "" {
			continue
		}
		if h, ok := holders[le.Value.Term]; ok && h != le.Value.Site {
			t.Errorf("term %d held by %s and %s", le.Value.Term, h, le.Value.Site)
		}
		holders[le.Value.Term] = le.Value.Site
	}
}

// memberOnKV runs site's member of rules on kv (a wrapped bucket) and the
// event stream of fn, on an engine of its own stopped by the cleanup.
func memberOnKV(t *testing.T, fn *failoverNATS, kv events.KV, r failover.Rules, site string, tr *transitions, log *slog.Logger) {
	t.Helper()
	engine, err := actor.NewEngine(actor.NewEngineConfig())
	if err != nil {
		t.Fatal(err)
	}
	deps := MemberDeps{Log: fn.evlog, KV: kv, Drivers: procedure.Drivers{"exec": &stepRecorder{}}, Logger: log, Observe: tr.observe}
	pid := engine.Spawn(NewMemberActor(MemberConfig{Rules: r, Site: site, Procedures: recordedProcedures()}, deps), "member", actor.WithID(site))
	t.Cleanup(func() { <-engine.Poison(pid).Done() })
}

// stallingKV's first watch delivers the initial values and the end marker,
// then nothing more while staying open: a stuck ordered consumer.
type stallingKV struct {
	events.KV
	mu      sync.Mutex
	watches int
	all     bool // every watch stalls, not only the first
}

type stalledWatch struct {
	ch   chan events.Entry
	once sync.Once
}

func (w *stalledWatch) Updates() <-chan events.Entry { return w.ch }
func (w *stalledWatch) Stop() error {
	w.once.Do(func() { close(w.ch) })
	return nil
}

// waitWatches waits until n watches were made or within passed, and
// returns how many were.
func (k *stallingKV) waitWatches(n int, within time.Duration) int {
	deadline := time.Now().Add(within)
	for {
		k.mu.Lock()
		watches := k.watches
		k.mu.Unlock()
		if watches >= n || time.Now().After(deadline) {
			return watches
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (k *stallingKV) Watch(ctx context.Context, pattern string, opts events.WatchOptions) (events.Watcher, error) {
	k.mu.Lock()
	k.watches++
	n := k.watches
	k.mu.Unlock()
	if n > 1 && !k.all {
		return k.KV.Watch(ctx, pattern, opts)
	}
	real, err := k.KV.Watch(ctx, pattern, opts)
	if err != nil {
		return nil, err
	}
	w := &stalledWatch{ch: make(chan events.Entry, 64)}
	go func() {
		defer real.Stop()
		for e := range real.Updates() {
			w.ch <- e
			if e.Revision == 0 {
				return // the initial values only
			}
		}
	}()
	return w, nil
}

// A watch that stops delivering while writes are acknowledged is noticed
// within two heartbeats and replaced; the member goes on seeing its pair.
func TestLaggingWatchIsReplaced(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	r := fastRules(t, "stuck-watch")
	log, rec := newLogRecorder(t)
	tr := newTransitions()
	kv := &stallingKV{KV: fn.kv}
	memberOnKV(t, fn, kv, r, r.Primary, tr, log)
	tr.waitFor(t, r.Primary, "failover.serving_started", 1, 5*time.Second)
	lines := rec.waitFor(t, "kv watch lags behind acknowledged writes; watching afresh, and reading the pair's keys directly meanwhile", 1, 10*r.HeartbeatTimeout)
	// The warning comes just before the fresh watch.
	if watches := kv.waitWatches(2, r.HeartbeatTimeout); watches < 2 {
		t.Errorf("%d watches a heartbeat after the lag was noticed", watches)
	}
	t.Logf("noticed: %v", lines[0])
	// Served throughout: nothing made it fence.
	time.Sleep(5 * r.HeartbeatTimeout)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, x := range tr.list {
		if f, ok := x.Event.(*failover.FenceRequested); ok && f.Reason != failover.FenceRestart {
			t.Errorf("fenced: %+v", f)
		}
	}
}

// A foreign message on a member's subject (no appender wrote it) is
// reported and skipped: the member appends after it, never folds it into
// its state, and does not stop; a restart skips it too.
func TestForeignRecordOnMemberSubjectIsSkipped(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	r := fastRules(t, "foreign-record")
	log, rec := newLogRecorder(t)
	tr := newTransitions()
	sh := hostMember(t, "nats://"+fn.addr, fn, r, r.Primary, procedure.Drivers{"exec": &stepRecorder{}}, tr, log)
	tr.waitFor(t, r.Primary, "failover.serving_started", 1, 5*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	subject := failover.Subject(r.Pair, r.Primary)
	// A well-formed event that would make the member lose its term, and
	// bytes that are not an event at all.
	if _, err := fn.evlog.Append(ctx, subject, &failover.LeadershipLost{Term: 1}, events.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := fn.evlog.AppendRaw(ctx, subject, []byte("hello"), events.AppendOptions{MsgID: "not-an-appender"}); err != nil {
		t.Fatal(err)
	}
	changed := r
	changed.SuccessThreshold = 3
	if _, err := fn.kv.Put(ctx, failover.ConfigKey(r.Pair), failover.EncodeRules(changed)); err != nil {
		t.Fatal(err)
	}
	tr.waitFor(t, r.Primary, "failover.config_applied", 1, 5*time.Second)
	if n := len(rec.matching("foreign record on an actor's subject: skipped, never folded into its state")); n != 2 {
		t.Errorf("foreign records reported %d times, want 2", n)
	}
	if m := sh.host.Members(); !m[0].Running || m[0].Stops != 0 {
		t.Errorf("member after foreign records: %+v", m)
	}
	// A restarted member skips them while replaying, and serves again.
	sh.host.Stop(context.Background())
	sh2 := hostMember(t, "nats://"+fn.addr, fn, r, r.Primary, procedure.Drivers{"exec": &stepRecorder{}}, tr, log)
	tr.waitFor(t, r.Primary, "failover.serving_started", 2, 5*time.Second)
	if n := len(rec.matching("foreign record in member log (no appender wrote it), skipped")); n != 2 {
		t.Errorf("replay reported %d foreign records, want 2", n)
	}
	if m := sh2.host.Members(); !m[0].Running {
		t.Errorf("restarted member: %+v", m)
	}
}

// A follower whose every watch stalls (its consumers cannot be created or
// do not deliver) still sees its pair through direct reads, and replaces a
// dead leader within failover_timeout + 2 × heartbeat_timeout (plus the
// promote chain and scheduling).
func TestStalledWatchesDoNotDelayFailover(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	r := fastRules(t, "stalled-watches")
	tr := newTransitions()
	primary := hostMember(t, "nats://"+fn.addr, fn, r, r.Primary, procedure.Drivers{"exec": &stepRecorder{}}, tr, nil)
	tr.waitFor(t, r.Primary, "failover.serving_started", 1, 5*time.Second)

	log, rec := newLogRecorder(t)
	kv := &stallingKV{KV: fn.kv, all: true}
	memberOnKV(t, fn, kv, r, r.Replica, tr, log)
	rec.waitFor(t, "kv watch lags behind acknowledged writes; watching afresh, and reading the pair's keys directly meanwhile", 1, 20*r.HeartbeatTimeout)

	primary.host.Stop(context.Background()) // the primary's process dies
	died := time.Now()
	served := tr.waitFor(t, r.Replica, "failover.serving_started", 1, 10*time.Second)
	bound := r.FailoverTimeout + 2*r.HeartbeatTimeout + 500*time.Millisecond
	if took := served.At.Sub(died); took > bound {
		t.Errorf("the replica served %v after the primary died, over %v", took, bound)
	} else {
		t.Logf("the replica served %v after the primary died (bound %v)", took, bound)
	}
}

// A member steps only with one of its host's step slots: with every slot
// held, its start-up fence's result is not taken in (no fenced); freed,
// it is.
func TestMemberStepsWithAStepSlot(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	r := failover.DefaultRules("slots", "site-a", "site-b")
	tr := newTransitions()
	engine, err := actor.NewEngine(actor.NewEngineConfig())
	if err != nil {
		t.Fatal(err)
	}
	steps := make(chan struct{}, 1)
	steps <- struct{}{} // every slot held
	deps := MemberDeps{Log: fn.evlog, KV: fn.kv, Drivers: procedure.Drivers{"exec": &stepRecorder{}},
		Logger: slog.New(slog.DiscardHandler), Observe: tr.observe, steps: steps}
	pid := engine.Spawn(NewMemberActor(MemberConfig{Rules: r, Site: r.Replica, Procedures: recordedProcedures()}, deps), "member", actor.WithID("slots"))
	t.Cleanup(func() { <-engine.Poison(pid).Done() })
	tr.waitFor(t, r.Replica, "failover.fence_requested", 1, 10*time.Second)
	time.Sleep(500 * time.Millisecond)
	tr.mu.Lock()
	for _, x := range tr.list {
		if x.Event.EventType() == "failover.fenced" {
			t.Errorf("the member stepped with every step slot held: %+v", x)
		}
	}
	tr.mu.Unlock()
	<-steps
	tr.waitFor(t, r.Replica, "failover.fenced", 1, 10*time.Second)
}
