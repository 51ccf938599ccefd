package runtime

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are a node's Prometheus metrics, in a registry of their own so
// that several nodes (tests) in one process do not collide.
type metrics struct {
	reg        *prometheus.Registry
	provisions *prometheus.CounterVec
	refused    *prometheus.GaugeVec
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
