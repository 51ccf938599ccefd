package runtime

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"understudy/actors/failover"
)

// Failover on real embedded JetStream: 20 trials per mode, with the default
// rules (heartbeat_timeout 1s, failure_threshold 2, failover_timeout 5s,
// fence_grace 2s). Trials run a few at a time, each pair on its own two
// connections behind its own fault proxies. Figures in docs/benchmarks.md.
//
//	go test -run '^$' -bench 'BenchmarkFailover' -benchtime 1x ./runtime/

const failoverTrials = 20

func benchServer(b *testing.B) (addr string, names AssetsConfig) {
	b.Helper()
	log := slog.New(slog.DiscardHandler)
	es, err := StartEmbedded(EmbeddedConfig{DataDir: b.TempDir(), Host: "127.0.0.1", Port: -1}, log)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(es.Shutdown)
	nc, err := nats.Connect(es.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	names = DefaultConfig().Assets
	if _, err := Provision(context.Background(), js, DefaultAssets(names, 1), log); err != nil {
		b.Fatal(err)
	}
	return es.Server().Addr().String(), names
}

func runTrials(b *testing.B, mode TrialMode, parallel int, window time.Duration) []TrialSummary {
	addr, names := benchServer(b)
	out := make([]TrialSummary, failoverTrials)
	errs := make([]error, failoverTrials)
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i := range failoverTrials {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			rules := failover.DefaultRules(fmt.Sprintf("bench-%s-%d", mode, i), "site-a", "site-b")
			out[i], errs[i] = RunTrial(context.Background(), addr, TrialOptions{
				Rules: rules, Mode: mode, FaultAfter: 2 * time.Second, Window: window,
				Stream: names.EventsStream, Bucket: names.FailoverBucket,
			})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			b.Fatalf("trial %d: %v", i, err)
		}
	}
	return out
}

func BenchmarkFailoverPowerCut(b *testing.B) {
	for b.Loop() {
		sums := runTrials(b, TrialPowerCut, 5, 30*time.Second)
		var failover, serving []float64
		for i, s := range sums {
			if s.Promoted != s.Replica || s.Promotions != 1 {
				b.Fatalf("trial %d: promoted %q %d times, want %s once", i, s.Promoted, s.Promotions, s.Replica)
			}
			failover = append(failover, s.FailoverMS)
			serving = append(serving, s.ServingMS)
		}
		bound := sums[0].FailoverTimeoutMS
		b.ReportMetric(Percentile(failover, 50), "median-failover-ms")
		b.ReportMetric(Percentile(failover, 100), "max-failover-ms")
		b.ReportMetric(Percentile(failover, 0), "min-failover-ms")
		b.ReportMetric(Percentile(failover, 50)-bound, "median-over-bound-ms")
		b.ReportMetric(Percentile(serving, 50), "median-serving-ms")
		b.ReportMetric(bound, "bound-ms")
	}
}

func BenchmarkFailoverReplicaCut(b *testing.B) {
	for b.Loop() {
		rules := failover.DefaultRules("x", "a", "b")
		sums := runTrials(b, TrialReplicaCut, 10, 2*rules.FailoverTimeout)
		promotions := 0
		for _, s := range sums {
			promotions += s.Promotions
		}
		b.ReportMetric(float64(promotions), "promotions")
		b.ReportMetric(float64(len(sums)), "trials")
	}
}
