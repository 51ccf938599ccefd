package runtime

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"understudy/actors/failover"
	"understudy/events"
)

// metrics are a node's Prometheus metrics, in a registry of their own so
// that several nodes (tests) in one process do not collide.
type metrics struct {
	reg        *prometheus.Registry
	provisions *prometheus.CounterVec
	refused    *prometheus.GaugeVec
	members    *MemberMetrics
}

// newMetrics registers the node's metrics; connected is read at each scrape.
func newMetrics(b BuildInfo, connected func() bool) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		provisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "understudy_provision_total",
			Help: "Provisionings of JetStream assets, by asset and outcome (created, updated, unchanged, failed).",
		}, []string{"kind", "name", "outcome"}),
		refused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "understudy_provision_refused_changes",
			Help: "Settings of a JetStream asset that differ from the configuration but were not changed at the last provisioning (see the logs).",
		}, []string{"kind", "name"}),
	}
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "understudy_build_info",
		Help: "Build information of the running binary; always 1.",
	}, []string{"version", "goversion", "revision"})
	buildInfo.WithLabelValues(b.Version, b.GoVersion, b.Revision).Set(1)
	natsConnected := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "understudy_nats_connected",
		Help: "1 while the node's NATS connection is up, else 0.",
	}, func() float64 {
		if connected() {
			return 1
		}
		return 0
	})
	m.reg.MustRegister(
		buildInfo, natsConnected, m.provisions, m.refused,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	m.members = NewMemberMetrics(m.reg)
	return m
}

// observeProvision records a provisioning run; failed names the asset whose
// provisioning failed, if any.
func (m *metrics) observeProvision(p Provisioned, failed *ProvisionError) {
	for _, a := range p.Assets {
		m.provisions.WithLabelValues(a.Kind.String(), a.Name, a.Outcome.String()).Inc()
		m.refused.WithLabelValues(a.Kind.String(), a.Name).Set(float64(len(a.Refused)))
	}
	if failed != nil {
		m.provisions.WithLabelValues(failed.Kind.String(), failed.Name, "failed").Inc()
	}
}

// MemberMetrics are the failover members' gauges and counters, by pair and
// site, and their node's store health (write latency, degraded). One value
// serves every member of a node.
type MemberMetrics struct {
	writeLatency prometheus.Gauge
	degraded     prometheus.Gauge
	serving      *prometheus.GaugeVec
	term         *prometheus.GaugeVec
	phase        *prometheus.GaugeVec
	failures     *prometheus.GaugeVec
	events       *memberEvents
	stops        *prometheus.CounterVec
	writes       *prometheus.CounterVec
	batches      *prometheus.CounterVec
	appends      *prometheus.CounterVec
	appendBatch  *prometheus.CounterVec
	steps        prometheus.Counter
}

// NewMemberMetrics registers the member metrics in reg.
func NewMemberMetrics(reg prometheus.Registerer) *MemberMetrics {
	m := &MemberMetrics{
		writeLatency: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "understudy_store_write_latency_seconds",
			Help: "The worst recent answer time of the node's heartbeat writes (its liveness record's with leadership: node, its members' own otherwise).",
		}),
		degraded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "understudy_node_degraded",
			Help: "1 while the node's heartbeat writes take more than half of heartbeat_timeout: the store is overloaded, members are at risk of fencing; else 0.",
		}),
		serving: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "understudy_member_serving",
			Help: "1 while the member serves (leads, unfenced), else 0.",
		}, []string{"pair", "site"}),
		term: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "understudy_member_term",
			Help: "The member's leadership term.",
		}, []string{"pair", "site"}),
		phase: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "understudy_member_phase",
			Help: "1 for the member's current phase, 0 for the others.",
		}, []string{"pair", "site", "phase"}),
		failures: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "understudy_member_heartbeat_failures",
			Help: "Consecutive failed register writes of the member (fences at failure_threshold).",
		}, []string{"pair", "site"}),
		events: &memberEvents{
			desc:  prometheus.NewDesc("understudy_member_events_total", "Events the member recorded, by type.", []string{"pair", "site", "type"}, nil),
			byKey: map[[2]string]*memberEventCounts{},
		},
		stops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "understudy_member_stops_total",
			Help: "Times the member stopped for good while its node ran on (the node restarts it, fenced).",
		}, []string{"pair", "site"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "understudy_store_member_writes_total",
			Help: "The node's member KV writes by how they went: alone, batched (in an atomic batch of two or more that was answered), not_issued (their turn came after half their window: counted failed by the member), stale (a compare-and-set on a revision the node's watch had already seen replaced: answered as a conflict without the store).",
		}, []string{"how"}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "understudy_store_batches_total",
			Help: "The node's atomic batches of member writes by outcome: landed, split (a conflict or a key in flight: halved), refused (the store took none: written one by one, and no batch for a minute), not_committed (this batch only: its connection failed before the commit, or too many batches were open; written one by one), failed (no answer by the earliest deadline, or another error).",
		}, []string{"outcome"}),
		appends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "understudy_store_appends_total",
			Help: "The node's member event appends by how they were sent: alone, batched (in an atomic batch of two or more that was answered).",
		}, []string{"how"}),
		steps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "understudy_member_steps_total",
			Help: "Times the node's members ran: once per input handed to a member (a timer, an answer, a watch delivery, a procedure's result) and per wake to take in the node's liveness log. The routine liveness records and results a member takes in when it runs are not counted apart: with leadership: node an idle member runs about once per heartbeat_timeout.",
		}),
		appendBatch: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "understudy_store_append_batches_total",
			Help: "The node's atomic batches of event appends by outcome: landed, split (a stale expectation or a stored message id: halved), refused (the stream took none: appended one by one), not_committed (this batch only: its connection failed before the commit, or too many batches were open; each append retried by its appender), failed (no answer in time, or another error).",
		}, []string{"outcome"}),
	}
	reg.MustRegister(m.writeLatency, m.degraded, m.serving, m.term, m.phase, m.failures, m.events, m.stops, m.writes, m.batches, m.appends, m.appendBatch, m.steps)
	return m
}

// memberWrites counts n of the node's member KV writes gone how.
func (m *MemberMetrics) memberWrites(how string, n int) {
	if m != nil {
		m.writes.WithLabelValues(how).Add(float64(n))
	}
}

// appended counts n of the node's member appends sent how.
func (m *MemberMetrics) appended(how string, n int) {
	if m != nil {
		m.appends.WithLabelValues(how).Add(float64(n))
	}
}

// appendBatchOutcome counts one of the node's append batches by outcome.
func (m *MemberMetrics) appendBatchOutcome(outcome string) {
	if m != nil {
		m.appendBatch.WithLabelValues(outcome).Inc()
	}
}

// batch counts one of the node's batches by outcome.
func (m *MemberMetrics) batch(outcome string) {
	if m != nil {
		m.batches.WithLabelValues(outcome).Inc()
	}
}

// storeHealth records the node's store write latency and whether it is
// degraded.
func (m *MemberMetrics) storeHealth(worst time.Duration, degraded bool) {
	if m == nil {
		return
	}
	m.writeLatency.Set(worst.Seconds())
	d := 0.0
	if degraded {
		d = 1
	}
	m.degraded.Set(d)
}

// memberGauges are one member's series, looked up once: a node steps
// thousands of members many times a second, and a label lookup per
// series and step cost it a fifth of its CPU at 10,000 pairs. A gauge is
// set only when its value changes.
type memberGauges struct {
	m                       *MemberMetrics
	pair, site              string
	serving, term, failures prometheus.Gauge
	phase                   map[failover.Phase]prometheus.Gauge
	events                  *memberEventCounts

	set          bool // the values below were set once
	lastServing  bool
	lastTerm     uint64
	lastFailures int
	lastPhase    failover.Phase
}

// member returns pair's member site's series (nil without metrics).
func (m *MemberMetrics) member(pair, site string) *memberGauges {
	if m == nil {
		return nil
	}
	g := &memberGauges{m: m, pair: pair, site: site,
		serving: m.serving.WithLabelValues(pair, site), term: m.term.WithLabelValues(pair, site),
		failures: m.failures.WithLabelValues(pair, site),
		phase:    map[failover.Phase]prometheus.Gauge{}, events: m.events.member(pair, site)}
	for _, p := range failover.Phases() {
		g.phase[p] = m.phase.WithLabelValues(pair, site, p.String())
	}
	return g
}

// stepped counts one run of the member (understudy_member_steps_total).
func (g *memberGauges) stepped() {
	if g != nil {
		g.m.steps.Inc()
	}
}

// observe records the member's state after a step and the events it
// recorded.
func (g *memberGauges) observe(mem *failover.Member, evs []events.Event) {
	if g == nil || mem == nil {
		return
	}
	serving, term, failures, phase := mem.Serving(), mem.Term(), mem.Failures(), mem.Phase()
	if !g.set || serving != g.lastServing {
		v := 0.0
		if serving {
			v = 1
		}
		g.serving.Set(v)
	}
	if !g.set || term != g.lastTerm {
		g.term.Set(float64(term))
	}
	if !g.set || failures != g.lastFailures {
		g.failures.Set(float64(failures))
	}
	if !g.set || phase != g.lastPhase {
		for p, pg := range g.phase {
			v := 0.0
			if p == phase {
				v = 1
			}
			pg.Set(v)
		}
	}
	g.set, g.lastServing, g.lastTerm, g.lastFailures, g.lastPhase = true, serving, term, failures, phase
	if len(evs) > 0 {
		g.events.add(evs)
	}
}

// memberEvents is understudy_member_events_total: each member counts its
// events by type in counts of its own, and a scrape reads them all. A
// CounterVec looked up on a member's first event of a type took the
// vector's one lock to create the series: in a 10,000-pair takeover every
// member met new types in the same second, and the members queued on that
// lock for most of the survivor's scheduling delay (an execution trace of
// run 36: 74 % of it in getOrCreateMetricWithLabelValues).
type memberEvents struct {
	desc  *prometheus.Desc
	mu    sync.Mutex // guards byKey: taken when a member starts and by a scrape
	byKey map[[2]string]*memberEventCounts
}

// memberEventCounts are one member's counts (pair, site); a member that
// restarts carries on its counts, as a counter must.
type memberEventCounts struct {
	pair, site string
	mu         sync.Mutex // the member's step and a scrape; nobody else
	n          map[string]uint64
}

func (c *memberEvents) member(pair, site string) *memberEventCounts {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := [2]string{pair, site}
	if e := c.byKey[k]; e != nil {
		return e
	}
	e := &memberEventCounts{pair: pair, site: site, n: map[string]uint64{}}
	c.byKey[k] = e
	return e
}

func (e *memberEventCounts) add(evs []events.Event) {
	e.mu.Lock()
	for _, ev := range evs {
		e.n[ev.EventType()]++
	}
	e.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (c *memberEvents) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *memberEvents) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	members := slices.Collect(maps.Values(c.byKey))
	c.mu.Unlock()
	for _, e := range members {
		e.mu.Lock()
		n := maps.Clone(e.n) // not held while the scrape takes them
		e.mu.Unlock()
		for t, v := range n {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(v), e.pair, e.site, t)
		}
	}
}

// stopped records a member that stopped: it serves no more and is in no
// phase until it restarts.
func (m *MemberMetrics) stopped(pair, site string) {
	if m == nil {
		return
	}
	m.stops.WithLabelValues(pair, site).Inc()
	m.serving.WithLabelValues(pair, site).Set(0)
	m.failures.WithLabelValues(pair, site).Set(0)
	for _, p := range failover.Phases() {
		m.phase.WithLabelValues(pair, site, p.String()).Set(0)
	}
}
