package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/events"
)

// Leadership: node on a real embedded JetStream: two nodes, several pairs
// each, one liveness record per node.

// nodePairs returns n pairs' fast rules, primary site-a.
func nodePairs(t *testing.T, prefix string, n int) []failover.Rules {
	t.Helper()
	out := make([]failover.Rules, n)
	for i := range out {
		out[i] = fastRules(t, fmt.Sprintf("%s-%d", prefix, i))
	}
	return out
}

// nodeHost is one node of leadership: node, on a connection of its own.
type nodeHost struct {
	name string
	nc   *nats.Conn
	host *Host
	stop func() // a crash: no hand-over; idempotent
}

// hostNode starts node name running site's member of every pair with
// leadership: node. edit, when set, changes the options.
func hostNode(t *testing.T, fn *failoverNATS, name, site string, pairs []failover.Rules, tr *transitions, log *slog.Logger, edit func(*HostOptions)) *nodeHost {
	t.Helper()
	nc, err := nats.Connect("nats://"+fn.addr, nats.Name("understudy "+name), nats.MaxReconnects(-1))
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
	members := make([]MemberConfig, 0, len(pairs))
	for _, r := range pairs {
		members = append(members, MemberConfig{Rules: r, Site: site, Procedures: recordedProcedures()})
	}
	opts := HostOptions{Logger: log.With("node", name), Drivers: procedure.Drivers{"exec": &stepRecorder{}}, Observe: tr.observe,
		Node: name, Leadership: LeadershipNode}
	if edit != nil {
		edit(&opts)
	}
	h, err := StartHost(context.Background(), js, fn.names.EventsStream, fn.names.FailoverBucket, members, opts)
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	nh := &nodeHost{name: name, nc: nc, host: h}
	stopped := false
	nh.stop = func() {
		if !stopped {
			stopped = true
			h.Stop(context.Background())
			nc.Close()
		}
	}
	t.Cleanup(nh.stop)
	return nh
}

// slowerPairs gives pairs a heartbeat_timeout of 600ms (failover 3s),
// three times fastRules': for tests whose timing a loaded -race run would
// otherwise break.
func slowerPairs(t *testing.T, pairs []failover.Rules) []failover.Rules {
	t.Helper()
	for i := range pairs {
		pairs[i].HeartbeatTimeout, pairs[i].FailoverTimeout = 600*time.Millisecond, 3*time.Second
		if err := pairs[i].Validate(); err != nil {
			t.Fatal(err)
		}
	}
	return pairs
}

// waitPair returns the n-th transition of pair's member site with the
// event type, failing the test after timeout.
func (tr *transitions) waitPair(t *testing.T, pair, site, eventType string, n int, timeout time.Duration) Transition {
	t.Helper()
	return tr.waitMatch(t, pair+"/"+site, eventType, n, timeout, func(x Transition) bool {
		return x.Pair == pair && x.Site == site && x.Event.EventType() == eventType
	})
}

// countPair counts pair's transitions of the event type at any site.
func (tr *transitions) countPair(pair, eventType string) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	n := 0
	for _, x := range tr.list {
		if x.Pair == pair && x.Event.EventType() == eventType {
			n++
		}
	}
	return n
}

// register reads pair's register.
func register(t *testing.T, kv events.KV, pair string) failover.LeaderEntry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e, err := kv.Get(ctx, failover.LeaderKey(pair))
	if err != nil {
		t.Fatal(err)
	}
	le, err := failover.LeaderEntryOf(e, 0)
	if err != nil {
		t.Fatal(err)
	}
	return le
}

// liveness reads node's liveness record.
func liveness(t *testing.T, kv events.KV, node string) failover.LivenessEntry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e, err := kv.Get(ctx, failover.LivenessKey(node))
	if err != nil {
		t.Fatal(err)
	}
	l, err := failover.DecodeLiveness(e.Value)
	if err != nil {
		t.Fatal(err)
	}
	return failover.LivenessEntry{Rev: e.Revision, Time: e.Time, Value: l}
}

// Two nodes serve several pairs: every pair serves on its preferred
// primary, each register names node-a and its epoch, and the registers are
// not written while nothing changes (the nodes' liveness records are).
func TestNodeLeadershipServesEveryPair(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	pairs := nodePairs(t, "node-serve", 4)
	tr := newTransitions()
	hostNode(t, fn, "node-a", "site-a", pairs, tr, nil, nil)
	hostNode(t, fn, "node-b", "site-b", pairs, tr, nil, nil)
	for _, r := range pairs {
		tr.waitPair(t, r.Pair, r.Primary, "failover.serving_started", 1, 10*time.Second)
	}
	live := liveness(t, fn.kv, "node-a")
	regs := map[string]uint64{}
	for _, r := range pairs {
		le := register(t, fn.kv, r.Pair)
		if le.Value.Site != r.Primary || le.Value.Node != "node-a" || le.Value.Epoch != live.Value.Epoch || le.Value.Fenced {
			t.Errorf("register of %s: %+v; node-a's liveness %+v", r.Pair, le.Value, live.Value)
		}
		regs[r.Pair] = le.Rev
	}
	// Five heartbeats: the liveness records move, the registers do not.
	time.Sleep(5 * pairs[0].HeartbeatTimeout)
	if later := liveness(t, fn.kv, "node-a"); later.Value.Beat <= live.Value.Beat || later.Value.Epoch != live.Value.Epoch {
		t.Errorf("node-a's liveness did not beat on in its epoch: %+v then %+v", live.Value, later.Value)
	}
	if b := liveness(t, fn.kv, "node-b"); b.Value.Node != "node-b" || !b.Value.Own() {
		t.Errorf("node-b's liveness: %+v", b.Value)
	}
	for _, r := range pairs {
		if le := register(t, fn.kv, r.Pair); le.Rev != regs[r.Pair] {
			t.Errorf("register of %s written while nothing changed: revision %d then %d (%+v)", r.Pair, regs[r.Pair], le.Rev, le.Value)
		}
		if n := tr.countPair(r.Pair, "failover.fence_requested"); n > 2 { // the routine fence of each start
			t.Errorf("pair %s: %d fences", r.Pair, n)
		}
	}
}

// A node dies (its host stops without a hand-over): the other node's
// members raise its epoch — one write for all its pairs, the others join
// it — and take every pair, the last within failover_timeout + 2 ×
// heartbeat_timeout of the death.
func TestNodeDeathFailsOverEveryPair(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	pairs := nodePairs(t, "node-death", 6)
	tr := newTransitions()
	a := hostNode(t, fn, "node-a", "site-a", pairs, tr, nil, nil)
	b := hostNode(t, fn, "node-b", "site-b", pairs, tr, nil, nil)
	for _, r := range pairs {
		tr.waitPair(t, r.Pair, r.Primary, "failover.serving_started", 1, 10*time.Second)
	}
	before := liveness(t, fn.kv, "node-a")

	a.stop()
	died := time.Now()
	r0 := pairs[0]
	bound := r0.FailoverTimeout + 2*r0.HeartbeatTimeout + raceSlack
	var last time.Duration
	for _, r := range pairs {
		p := tr.waitPair(t, r.Pair, r.Replica, "failover.promoted", 1, 10*time.Second)
		last = max(last, p.At.Sub(died))
		tr.waitPair(t, r.Pair, r.Replica, "failover.serving_started", 1, 10*time.Second)
	}
	if last > bound {
		t.Errorf("the last pair was promoted %v after node-a died, over %v", last, bound)
	} else {
		t.Logf("the last of %d pairs was promoted %v after node-a died (bound %v)", len(pairs), last, bound)
	}
	after := liveness(t, fn.kv, "node-a")
	if after.Value.Epoch != before.Value.Epoch+1 || after.Value.By != "node-b" {
		t.Errorf("node-a's liveness after the takeover: %+v (before %+v): want its epoch raised once, by node-b", after.Value, before.Value)
	}
	for _, r := range pairs {
		if le := register(t, fn.kv, r.Pair); le.Value.Site != r.Replica || le.Value.Node != "node-b" {
			t.Errorf("register of %s: %+v", r.Pair, le.Value)
		}
	}
	// Members that saw the raise on the watch before judging node-a stale
	// take the register without raising; the others' raises are one write.
	written, joined := b.host.Raises()
	t.Logf("raises of node-a's epoch: %d written, %d joined", written, joined)
	if written != 1 {
		t.Errorf("raises: %d written, %d joined; want one write", written, joined)
	}
}

// countingKV counts the compare-and-sets of liveness keys and holds each
// until release is closed.
type countingKV struct {
	events.KV
	cas     atomic.Int64
	release chan struct{}
}

func (k *countingKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	k.cas.Add(1)
	<-k.release
	return k.KV.Update(ctx, key, value, rev)
}

// Identical raises (same key, same expected revision) in flight make one
// write and share its answer, each with its own Op; a raise answered less
// than a heartbeat ago answers a late identical one; another expected
// revision is another write.
func TestRaisesAreDeduplicated(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	ctx := context.Background()
	key := failover.LivenessKey("node-dead")
	rev, err := fn.kv.Create(ctx, key, failover.EncodeLiveness(failover.Liveness{Node: "node-dead", Epoch: 2, Beat: 7, By: "node-dead"}))
	if err != nil {
		t.Fatal(err)
	}
	kv := &countingKV{KV: fn.kv, release: make(chan struct{})}
	d := newRaiseDeduper(kv, nil, time.Minute)
	raise := failover.Liveness{Node: "node-dead", Epoch: 3, By: "node-b", Prev: rev}
	value := failover.EncodeLiveness(raise)
	const n = 20
	results := make(chan failover.WriteResult, n)
	for i := range n {
		go func() {
			w := failover.Write{Op: uint64(100 + i), Kind: failover.WriteBump, Key: key, Live: raise, ExpectRev: rev}
			res, ok := d.raise(ctx, w, value, time.Now().Add(5*time.Second))
			if !ok {
				t.Error("raise gave up")
			}
			results <- res
		}()
	}
	for d.joined.Load() != n-1 {
		time.Sleep(time.Millisecond)
	}
	close(kv.release)
	ops := map[uint64]bool{}
	var landed uint64
	for range n {
		res := <-results
		ops[res.Op] = true
		if res.Err != failover.WriteOK || (landed != 0 && res.Revision != landed) {
			t.Errorf("answer %+v", res)
		}
		landed = res.Revision
	}
	if len(ops) != n || kv.cas.Load() != 1 || d.written.Load() != 1 {
		t.Errorf("%d ops answered, %d compare-and-sets, %d written; want %d, 1, 1", len(ops), kv.cas.Load(), d.written.Load(), n)
	}
	// Late, identical: the same answer, no write.
	w := failover.Write{Op: 7, Kind: failover.WriteBump, Key: key, Live: raise, ExpectRev: rev}
	if res, _ := d.raise(ctx, w, value, time.Now().Add(5*time.Second)); res.Err != failover.WriteOK || res.Revision != landed || res.Op != 7 || kv.cas.Load() != 1 {
		t.Errorf("late identical raise: %+v after %d compare-and-sets", res, kv.cas.Load())
	}
	// Another expected revision: a write of its own, which loses and
	// reads the record back.
	w.ExpectRev, w.Op = rev+5, 8
	res, _ := d.raise(ctx, w, value, time.Now().Add(5*time.Second))
	if res.Err != failover.WriteConflict || res.CurrentLive == nil || res.CurrentLive.Rev != landed || res.CurrentLive.Value.Epoch != 3 || kv.cas.Load() != 2 {
		t.Errorf("raise on another revision: %+v (read back %+v)", res, res.CurrentLive)
	}
}

// A liveness value nobody's key signed (a forger that may write NATS)
// changes nothing: the serving node's members keep serving, its writer
// writes over it, and the forgery is reported.
func TestForgedLivenessIsIgnored(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	pairs := nodePairs(t, "node-forged", 1)
	_, trustA, trustB := trustedPair(t, pairs[0].Pair)
	tr := newTransitions()
	log, rec := newLogRecorder(t)
	hostNode(t, fn, "node-a", "site-a", pairs, tr, log, func(o *HostOptions) { o.Trust = trustA })
	hostNode(t, fn, "node-b", "site-b", pairs, tr, log, func(o *HostOptions) { o.Trust = trustB })
	r := pairs[0]
	tr.waitPair(t, r.Pair, r.Primary, "failover.serving_started", 1, 10*time.Second)
	live := liveness(t, fn.kv, "node-a")
	if live.Value.Sig == nil {
		t.Fatalf("node-a's liveness is not signed: %+v", live.Value)
	}
	if err := trustB.VerifyLiveness("node-a", mustGet(t, fn.kv, failover.LivenessKey("node-a")), live.Value); err != nil {
		t.Fatalf("node-a's liveness does not verify at node-b: %v", err)
	}
	// A raise claiming node-b, unsigned, and a beat signed by node-b's key
	// claiming node-a wrote it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	raise := failover.Liveness{Node: "node-a", Epoch: live.Value.Epoch + 1, By: "node-b", Prev: live.Rev}
	if _, err := fn.kv.Put(ctx, failover.LivenessKey("node-a"), failover.EncodeLiveness(raise)); err != nil {
		t.Fatal(err)
	}
	beat := failover.Liveness{Node: "node-a", Epoch: live.Value.Epoch + 1, Beat: 1, By: "node-b"}
	signed, err := trustB.SignLiveness(beat)
	if err != nil {
		t.Fatal(err)
	}
	signed = resign(t, signed, "node-a")
	if _, err := fn.kv.Put(ctx, failover.LivenessKey("node-a"), signed); err != nil {
		t.Fatal(err)
	}
	rec.waitFor(t, "liveness value not genuine: no member takes it for a beat or a raise", 2, 5*time.Second)
	time.Sleep(5 * r.HeartbeatTimeout)
	if n := tr.countPair(r.Pair, "failover.leadership_lost"); n != 0 {
		t.Errorf("the leader lost its leadership %d times to forged liveness values", n)
	}
	if n := tr.countPair(r.Pair, "failover.promoted"); n != 1 {
		t.Errorf("%d promotions, want the first one only", n)
	}
	if now := liveness(t, fn.kv, "node-a"); now.Value.By != "node-a" || now.Value.Epoch != live.Value.Epoch {
		t.Errorf("node-a's liveness after the forgeries: %+v, want its own beats in epoch %d", now.Value, live.Value.Epoch)
	}
	if le := register(t, fn.kv, r.Pair); le.Value.Site != r.Primary {
		t.Errorf("register: %+v", le.Value)
	}
}

func mustGet(t *testing.T, kv events.KV, key string) []byte {
	t.Helper()
	e, err := kv.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return e.Value
}

// resign rewrites the writer of a signed liveness value without signing it
// again: the signature no longer matches who it says wrote it.
func resign(t *testing.T, raw []byte, by string) []byte {
	t.Helper()
	l, err := failover.DecodeLiveness(raw)
	if err != nil {
		t.Fatal(err)
	}
	l.By = by
	return failover.EncodeLiveness(l)
}

// A node refuses at start to host more members than its store can
// heartbeat with per-pair leadership, with the numbers and the way out; with
// leadership: node it refuses pairs of different heartbeat_timeout.
func TestHostRefusesWhatItCannotHeartbeat(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	js := fn.js
	r := fastRules(t, "capacity")
	r.HeartbeatTimeout, r.FailoverTimeout = failover.MinHeartbeat, time.Second
	var members []MemberConfig
	for i := range 5000 { // 100,000 writes per second
		mr := r
		mr.Pair = fmt.Sprintf("capacity-%d", i)
		members = append(members, MemberConfig{Rules: mr, Site: mr.Primary, Procedures: recordedProcedures()})
	}
	_, err := StartHost(context.Background(), js, fn.names.EventsStream, fn.names.FailoverBucket, members,
		HostOptions{Logger: slog.New(slog.DiscardHandler), Drivers: procedure.Drivers{"exec": &stepRecorder{}}, Node: "node-a"})
	var ce *CapacityError
	if !errors.As(err, &ce) {
		t.Fatalf("StartHost with %d members at %v: %v, want a CapacityError", len(members), r.HeartbeatTimeout, err)
	}
	if ce.Members != len(members) || ce.Need != 100000 || ce.Sustained <= 0 || !strings.Contains(err.Error(), "leadership: node") {
		t.Errorf("refusal %+v: %v", ce, err)
	}
	t.Log(err)

	a, b := fastRules(t, "hb-a"), fastRules(t, "hb-b")
	b.HeartbeatTimeout = 2 * a.HeartbeatTimeout
	b.FailoverTimeout = 2 * a.FailoverTimeout
	_, err = StartHost(context.Background(), js, fn.names.EventsStream, fn.names.FailoverBucket,
		[]MemberConfig{{Rules: a, Site: "site-a", Procedures: recordedProcedures()}, {Rules: b, Site: "site-a", Procedures: recordedProcedures()}},
		HostOptions{Logger: slog.New(slog.DiscardHandler), Drivers: procedure.Drivers{"exec": &stepRecorder{}}, Node: "node-a", Leadership: LeadershipNode})
	var cfe *ConfigError
	if !errors.As(err, &cfe) || cfe.Field != "heartbeat_timeout" || !strings.Contains(cfe.Rule, "hb-a has 200ms") || !strings.Contains(cfe.Rule, "hb-b has 400ms") {
		t.Errorf("pairs of different heartbeat_timeout: %v", err)
	}
}

// slowLivenessKV answers the liveness writes late: over half of
// heartbeat_timeout, under it.
type slowLivenessKV struct {
	events.KV
	delay atomic.Int64 // nanoseconds
}

func (k *slowLivenessKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if failover.LivenessNode(key) != "" {
		select {
		case <-time.After(time.Duration(k.delay.Load())):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return k.KV.Update(ctx, key, value, rev)
}

// A store that answers the node's liveness writes in over half of
// heartbeat_timeout makes the node degraded — metric, one warning, and
// /healthz degraded (200) — while its members keep serving: overload is
// not failure. It is back to normal when the writes are fast again.
// heartbeat_timeout is 600ms here, not fastRules' 200ms: a write slowed
// to 0.6 of it then has 240ms, not 80ms, for the rest of its way, which a
// loaded machine under -race took (a heartbeat failed in make test).
func TestSlowStoreIsDegradedNotFailed(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	pairs := slowerPairs(t, nodePairs(t, "node-slow", 2))
	tr := newTransitions()
	log, rec := newLogRecorder(t)
	slow := &slowLivenessKV{}
	metrics := NewMemberMetrics(promRegistry())
	a := hostNode(t, fn, "node-a", "site-a", pairs, tr, log, func(o *HostOptions) {
		o.wrapKV = func(kv events.KV) events.KV { slow.KV = kv; return slow }
		o.Metrics = metrics
	})
	hostNode(t, fn, "node-b", "site-b", pairs, tr, nil, nil)
	for _, r := range pairs {
		tr.waitPair(t, r.Pair, r.Primary, "failover.serving_started", 1, 10*time.Second)
	}
	if h := a.host.StoreHealth(); h.Degraded {
		t.Fatalf("degraded before the store slowed: %+v", h)
	}
	hb := pairs[0].HeartbeatTimeout
	slow.delay.Store(int64(hb * 3 / 5))
	rec.waitFor(t, "store writes are slow: heartbeats are at risk (overload, not failure); members fence only if writes keep missing heartbeat_timeout", 1, 20*hb)
	if h := a.host.StoreHealth(); !h.Degraded || h.Worst <= hb/2 {
		t.Errorf("store health after slow writes: %+v", h)
	}
	if got := gaugeValue(t, metrics.degraded); got != 1 {
		t.Errorf("understudy_node_degraded %v, want 1", got)
	}
	if got := gaugeValue(t, metrics.writeLatency); got <= (hb / 2).Seconds() {
		t.Errorf("understudy_store_write_latency_seconds %v, want over %v", got, (hb / 2).Seconds())
	}
	// /healthz: degraded, 200.
	n := &node{log: slog.New(slog.DiscardHandler)}
	n.nc.Store(a.nc)
	n.provisioned.Store(true)
	n.host.Store(a.host)
	w := httptest.NewRecorder()
	n.healthz(w, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if body := w.Body.String(); w.Code != http.StatusOK || !strings.Contains(body, `"status":"degraded"`) || !strings.Contains(body, "heartbeat writes take up to") {
		t.Errorf("/healthz %d %s", w.Code, body)
	}
	time.Sleep(10 * hb)
	if n := len(rec.matching("store writes are slow: heartbeats are at risk (overload, not failure); members fence only if writes keep missing heartbeat_timeout")); n != 1 {
		t.Errorf("%d warnings for one episode, want 1", n)
	}
	for _, r := range pairs {
		if n := tr.countPair(r.Pair, "failover.leadership_lost") + tr.countPair(r.Pair, "failover.heartbeat_failed"); n != 0 {
			t.Errorf("pair %s: %d lost leaderships or failed heartbeats while the store was only slow", r.Pair, n)
		}
	}
	slow.delay.Store(0)
	rec.waitFor(t, "store write latency is back to normal", 1, 40*hb)
}

func promRegistry() *prometheus.Registry { return prometheus.NewRegistry() }

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// The node's one watch stops delivering while the node's liveness writes
// are acknowledged: it is noticed within a heartbeat or two and replaced,
// the liveness records are read directly meanwhile, and the members keep
// serving.
func TestNodeWatchLagIsReplaced(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	pairs := nodePairs(t, "node-lag", 2)
	tr := newTransitions()
	log, rec := newLogRecorder(t)
	stall := &stallingKV{}
	hostNode(t, fn, "node-b", "site-b", pairs, tr, nil, nil)
	hostNode(t, fn, "node-a", "site-a", pairs, tr, log, func(o *HostOptions) {
		o.wrapKV = func(kv events.KV) events.KV { stall.KV = kv; return stall }
	})
	for _, r := range pairs {
		tr.waitPair(t, r.Pair, r.Primary, "failover.serving_started", 1, 10*time.Second)
	}
	rec.waitFor(t, "kv watch of the node lags behind acknowledged writes; watching afresh, and reading the liveness records directly meanwhile", 1, 20*pairs[0].HeartbeatTimeout)
	// The warning comes just before the fresh watch.
	if watches := stall.waitWatches(2, pairs[0].HeartbeatTimeout); watches < 2 {
		t.Errorf("%d watches a heartbeat after the lag was noticed", watches)
	}
	time.Sleep(5 * pairs[0].HeartbeatTimeout)
	for _, r := range pairs {
		if n := tr.countPair(r.Pair, "failover.leadership_lost"); n != 0 {
			t.Errorf("pair %s lost its leadership %d times", r.Pair, n)
		}
		if n := tr.countPair(r.Pair, "failover.promoted"); n != 1 {
			t.Errorf("pair %s: %d promotions", r.Pair, n)
		}
	}
}

// A node's watch that delivers every write, but late (a busy node, a
// store serving thousands of keys), is slow, not stuck: the liveness
// records are read directly until it catches up and it is never replaced
// — a fresh watch would redeliver every key of the bucket and make the
// node slower still.
func TestSlowNodeWatchIsNotReplaced(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	pairs := nodePairs(t, "node-slow-watch", 2)
	hb := pairs[0].HeartbeatTimeout
	tr := newTransitions()
	log, rec := newLogRecorder(t)
	slow := &delayingKV{delay: 3 * hb / 2}
	// A steady stream of other writes: the watch always has something to
	// deliver, late.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for i := 0; ctx.Err() == nil; i++ {
			if _, err := fn.kv.Put(ctx, "slowtest.filler", []byte(fmt.Sprint(i))); err != nil && i < 3 {
				t.Logf("filler: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	hostNode(t, fn, "node-b", "site-b", pairs, tr, nil, nil)
	hostNode(t, fn, "node-a", "site-a", pairs, tr, log, func(o *HostOptions) {
		o.wrapKV = func(kv events.KV) events.KV { slow.KV = kv; return slow }
	})
	for _, r := range pairs {
		tr.waitPair(t, r.Pair, r.Primary, "failover.serving_started", 1, 10*time.Second)
	}
	rec.waitFor(t, "kv watch of the node delivers, but behind acknowledged writes; reading the liveness records directly until it catches up", 1, 20*hb)
	time.Sleep(10 * hb)
	if n := len(rec.matching("kv watch of the node lags behind acknowledged writes; watching afresh, and reading the liveness records directly meanwhile")); n != 0 {
		t.Errorf("a slow watch was replaced %d times", n)
	}
	if w := slow.count(); w != 1 {
		t.Errorf("%d watches; want the first one kept", w)
	}
	for _, r := range pairs {
		if n := tr.countPair(r.Pair, "failover.leadership_lost"); n != 0 {
			t.Errorf("pair %s lost its leadership %d times", r.Pair, n)
		}
		if n := tr.countPair(r.Pair, "failover.promoted"); n != 1 {
			t.Errorf("pair %s: %d promotions", r.Pair, n)
		}
	}
}

// delayingKV's watches deliver the initial values at once, then every
// entry later than the real watch did — by as long as the watch has been
// live, up to delay — in order: a watch that keeps delivering but falls
// behind in time.
type delayingKV struct {
	events.KV
	delay   time.Duration
	mu      sync.Mutex
	watches int
}

func (k *delayingKV) count() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.watches
}

func (k *delayingKV) Watch(ctx context.Context, pattern string, opts events.WatchOptions) (events.Watcher, error) {
	k.mu.Lock()
	k.watches++
	k.mu.Unlock()
	real, err := k.KV.Watch(ctx, pattern, opts)
	if err != nil {
		return nil, err
	}
	type timed struct {
		e  events.Entry
		at time.Time
	}
	line := make(chan timed, 1<<16)
	w := &delayedWatch{ch: make(chan events.Entry, 64), done: make(chan struct{})}
	go func() {
		defer close(line)
		var liveSince time.Time // the end marker's arrival
		for e := range real.Updates() {
			now := time.Now()
			at := now.Add(-k.delay) // deliver at once
			if !liveSince.IsZero() {
				at = now.Add(min(k.delay, now.Sub(liveSince)) - k.delay)
			}
			if e.Revision == 0 {
				liveSince = now
			}
			line <- timed{e, at}
		}
	}()
	go func() {
		defer close(w.ch)
		defer real.Stop()
		for x := range line {
			time.Sleep(time.Until(x.at.Add(k.delay)))
			select {
			case w.ch <- x.e:
			case <-w.done:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	return w, nil
}

type delayedWatch struct {
	ch   chan events.Entry
	done chan struct{}
	once sync.Once
}

func (w *delayedWatch) Updates() <-chan events.Entry { return w.ch }
func (w *delayedWatch) Stop() error {
	w.once.Do(func() { close(w.done) })
	return nil
}

// A node may write its own liveness record and probe key, and the records
// of the nodes it shares a pair with (to raise their epoch); no other
// node's.
func TestPermissionsOfLiveness(t *testing.T) {
	sec := &SecuritySection{Nodes: map[string]NodeIdentity{
		"a": {NKey: "UA", Pairs: []string{"pg-1", "pg-2"}},
		"b": {NKey: "UB", Pairs: []string{"pg-2"}},
		"c": {NKey: "UC", Pairs: []string{"pg-3"}},
	}}
	names := DefaultConfig().Assets
	allowed := map[string][]string{}
	for _, u := range Permissions(sec, names) {
		allowed[u.Nkey] = u.Permissions.Publish.Allow
	}
	key := func(k string) string { return "$KV." + names.FailoverBucket + "." + k }
	for _, c := range []struct {
		who, key string
		want     bool
	}{
		{"UA", failover.LivenessKey("a"), true},
		{"UA", probeKey("a"), true},
		{"UA", failover.LivenessKey("b"), true},
		{"UA", failover.LivenessKey("c"), false},
		{"UB", failover.LivenessKey("a"), true},
		{"UC", failover.LivenessKey("a"), false},
		{"UC", failover.LivenessKey("c"), true},
		{"UC", probeKey("a"), false},
	} {
		if got := slices.Contains(allowed[c.who], key(c.key)); got != c.want {
			t.Errorf("%s may write %s: %v, want %v", c.who, c.key, got, c.want)
		}
	}
}

// Liveness values are signed by the writing node, bound to the record's
// node, and never verify as a register value (nor the reverse).
func TestLivenessSignatures(t *testing.T) {
	_, a, b := trustedPair(t, "pg")
	l := failover.Liveness{Node: "node-a", Epoch: 2, Beat: 5, By: "node-a"}
	raw, err := a.SignLiveness(l)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := failover.DecodeLiveness(raw)
	if err := b.VerifyLiveness("node-a", raw, got); err != nil {
		t.Errorf("a beat of node-a does not verify: %v", err)
	}
	if err := b.VerifyLiveness("node-b", raw, got); err == nil {
		t.Error("node-a's value verifies in node-b's record")
	}
	if _, err := a.SignLiveness(failover.Liveness{Node: "node-b", Epoch: 3, By: "node-b"}); err == nil {
		t.Error("node-a signed a value written by node-b")
	}
	raise, err := a.SignLiveness(failover.Liveness{Node: "node-b", Epoch: 3, By: "node-a", Prev: 9})
	if err != nil {
		t.Fatal(err)
	}
	got, _ = failover.DecodeLiveness(raise)
	if err := b.VerifyLiveness("node-b", raise, got); err != nil {
		t.Errorf("node-a's raise of node-b's epoch does not verify: %v", err)
	}
	got.By = "node-b" // claims another writer
	if err := b.VerifyLiveness("node-b", raise, got); err == nil {
		t.Error("a raise verifies for a writer that did not sign it")
	}
	// A register value's signature is no liveness value's.
	reg, err := a.Sign("pg", "site-a", failover.Leader{Site: "site-a", Term: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.VerifyLiveness("node-a", reg, failover.Liveness{Node: "node-a", By: "node-a"}); err == nil {
		t.Error("a register value verifies as a liveness value")
	}
}

// slowHistoryKV holds every read of a pair key's history until its
// context ends (a store that answers history reads slowly).
type slowHistoryKV struct {
	events.KV
	reads atomic.Int64
}

func (k *slowHistoryKV) History(ctx context.Context, key string) ([]events.Entry, error) {
	if failover.LivenessNode(key) != "" {
		return k.KV.History(ctx, key)
	}
	k.reads.Add(1)
	<-ctx.Done()
	return nil, ctx.Err()
}

// A member that reads its register's history (here: a value that does not
// decode) reads it on its own time: the node's watch, its other members
// and its liveness writer go on meanwhile.
func TestMemberHistoryReadHoldsUpNoOtherMember(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	pairs := nodePairs(t, "node-hist", 2)
	tr := newTransitions()
	slow := &slowHistoryKV{}
	hostNode(t, fn, "node-b", "site-b", pairs, tr, nil, nil)
	hostNode(t, fn, "node-a", "site-a", pairs, tr, nil, func(o *HostOptions) {
		o.wrapKV = func(kv events.KV) events.KV { slow.KV = kv; return slow }
	})
	for _, r := range pairs {
		tr.waitPair(t, r.Pair, r.Primary, "failover.serving_started", 1, 10*time.Second)
	}
	if _, err := fn.kv.Put(context.Background(), failover.LeaderKey(pairs[0].Pair), []byte{0xc1}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(15 * pairs[1].HeartbeatTimeout)
	if slow.reads.Load() == 0 {
		t.Fatal("no member read the register's history")
	}
	other := pairs[1].Pair
	if n := tr.countPair(other, "failover.heartbeat_failed") + tr.countPair(other, "failover.leadership_lost"); n != 0 {
		t.Errorf("pair %s, whose register nobody touched: %d failed heartbeats or lost leaderships while another pair's member read its history", other, n)
	}
}

// Idle members take their node's routine liveness records and results in
// at their next run (the node's liveness log), not one run each per
// record: a member of an idle node runs about once per heartbeat_timeout
// (its timer), where it ran four times (its timer, its own node's record,
// the other node's, its node's liveness result) before. With 40 pairs
// over two nodes, both nodes' members, over 10 heartbeats.
func TestIdleMembersRunAboutOncePerHeartbeat(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	// The count is per heartbeat, and a loaded -race run must not fence
	// the holders meanwhile.
	pairs := slowerPairs(t, nodePairs(t, "node-idle", 40))
	tr := newTransitions()
	ma, mb := NewMemberMetrics(promRegistry()), NewMemberMetrics(promRegistry())
	a := hostNode(t, fn, "node-a", "site-a", pairs, tr, nil, func(o *HostOptions) { o.Metrics = ma })
	hostNode(t, fn, "node-b", "site-b", pairs, tr, nil, func(o *HostOptions) { o.Metrics = mb })
	for _, r := range pairs {
		tr.waitPair(t, r.Pair, r.Primary, "failover.serving_started", 1, 20*time.Second)
	}
	hb := pairs[0].HeartbeatTimeout
	time.Sleep(3 * hb) // past the start's runs
	counter := func(m *MemberMetrics) float64 {
		var d dto.Metric
		if err := m.steps.Write(&d); err != nil {
			t.Fatal(err)
		}
		return d.GetCounter().GetValue()
	}
	a0, b0, start := counter(ma), counter(mb), time.Now()
	time.Sleep(10 * hb)
	beats := float64(time.Since(start)) / float64(hb)
	for _, x := range []struct {
		node string
		runs float64
	}{{"node-a (holders)", counter(ma) - a0}, {"node-b (followers)", counter(mb) - b0}} {
		per := x.runs / float64(len(pairs)) / beats
		t.Logf("%s: %.0f member runs in %.1f heartbeats: %.2f per member and heartbeat", x.node, x.runs, beats, per)
		if per > 2 || per < 0.5 {
			t.Errorf("%s: %.2f runs per member and heartbeat_timeout, want about one (0.5 to 2)", x.node, per)
		}
	}
	// Still current: no member fenced but at its start.
	tr.mu.Lock()
	for _, x := range tr.list {
		if f, ok := x.Event.(*failover.FenceRequested); ok && f.Reason != failover.FenceRestart {
			t.Errorf("pair %s site %s fenced at %v: %+v", x.Pair, x.Site, x.At.Format("15:04:05.000"), f)
		}
	}
	tr.mu.Unlock()
	// The store's health is the machine's (a loaded -race run's fsyncs
	// reach half a heartbeat_timeout): shown, not judged.
	t.Logf("node-a's store health: %+v", a.host.StoreHealth())
}
