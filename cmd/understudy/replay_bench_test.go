package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"understudy/actors/failover"
	"understudy/projections"
	"understudy/runtime"
)

// The live replay benchmark's record: a pair's history on an embedded
// server, mostly KV heartbeats (the holder's register write and the
// follower's heartbeat each second), with a failover's events every
// liveCycle seconds.
const (
	liveRecords = 400_000
	liveBucket  = "bench_failover"
	liveStream  = "BENCH_EVENTS"
	livePair    = "bench"
	liveCycle   = 5000
)

var liveData struct {
	once  sync.Once
	es    *runtime.EmbeddedNATS
	js    jetstream.JetStream
	count int
	err   error
}

// liveFixture fills the streams once per test binary. Like the events
// read benchmark's, the streams opt out of the server's SyncAlways (an
// fsync per message makes the fill take minutes); reading is the same.
// The KV stream keeps every revision (a real bucket keeps 64 per key),
// so the read is as long as the history.
func liveFixture(b *testing.B) (jetstream.JetStream, int) {
	liveData.once.Do(func() {
		dir, err := os.MkdirTemp("", "understudy-replay-bench-")
		if err != nil {
			liveData.err = err
			return
		}
		liveData.es, liveData.err = runtime.StartEmbedded(runtime.EmbeddedConfig{DataDir: filepath.Join(dir, "nats"), Host: "127.0.0.1", Port: -1},
			slog.New(slog.DiscardHandler))
		if liveData.err != nil {
			return
		}
		liveData.js, liveData.count, liveData.err = fillLive(b, liveData.es.ClientURL())
	})
	if liveData.err != nil {
		b.Fatal(liveData.err)
	}
	return liveData.js, liveData.count
}

func fillLive(b *testing.B, url string) (jetstream.JetStream, int, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, 0, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	for _, cfg := range []jetstream.StreamConfig{
		{Name: "KV_" + liveBucket, Subjects: []string{"$KV." + liveBucket + ".>"}, Storage: jetstream.FileStorage, AllowRollup: true, PersistMode: jetstream.AsyncPersistMode},
		{Name: liveStream, Subjects: []string{"ev.>"}, Storage: jetstream.FileStorage, PersistMode: jetstream.AsyncPersistMode},
	} {
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			return nil, 0, err
		}
	}
	pnc, err := nats.Connect(url)
	if err != nil {
		return nil, 0, err
	}
	defer pnc.Close()
	pub, err := jetstream.New(pnc, jetstream.WithPublishAsyncMaxPending(16384))
	if err != nil {
		return nil, 0, err
	}
	codec := runtime.Codec()
	n := 0
	publish := func(subject string, data []byte) error {
		n++
		_, err := pub.PublishAsync(subject, data, jetstream.WithStallWait(time.Minute))
		return err
	}
	event := func(site string, ev interface{ EventType() string }) error {
		data, err := codec.Encode(ev)
		if err != nil {
			return err
		}
		return publish(failover.Subject(livePair, site), data)
	}
	kv := func(key string) string { return "$KV." + liveBucket + "." + key }
	holder, follower := "site-a", "site-b"
	term := uint64(1)
	if err := event(holder, &failover.ServingStarted{Seq: 1, Term: term}); err != nil {
		return nil, 0, err
	}
	start := time.Now()
	for s := 1; n < liveRecords; s++ {
		if s%liveCycle == 0 {
			term++
			if err := event(follower, &failover.AcquireAttempted{Reason: failover.AcquireStale, Term: term, Stale: 5 * time.Second}); err != nil {
				return nil, 0, err
			}
			if err := publish(kv(failover.LeaderKey(livePair)), failover.EncodeLeader(failover.Leader{Site: follower, Term: term})); err != nil {
				return nil, 0, err
			}
			if err := event(follower, &failover.Promoted{Seq: uint64(s), Term: term, Reason: failover.AcquireStale}); err != nil {
				return nil, 0, err
			}
			if err := event(follower, &failover.ServingStarted{Seq: uint64(s), Term: term}); err != nil {
				return nil, 0, err
			}
			holder, follower = follower, holder
			continue
		}
		if err := publish(kv(failover.LeaderKey(livePair)), failover.EncodeLeader(failover.Leader{Site: holder, Term: term, Beat: uint64(s)})); err != nil {
			return nil, 0, err
		}
		if err := publish(kv(failover.HeartbeatKey(livePair, follower)), failover.EncodeHeartbeat(failover.Heartbeat{Site: follower, Beat: uint64(s), Phase: failover.PhaseFollower, Ready: true})); err != nil {
			return nil, 0, err
		}
	}
	select {
	case <-pub.PublishAsyncComplete():
	case <-ctx.Done():
		return nil, 0, fmt.Errorf("the fill of %d records did not complete", n)
	}
	b.Logf("filled %d records in %v", n, time.Since(start))
	return js, n, nil
}

// replayLiveOnce folds the pair's record read live into every projection.
func replayLiveOnce(b *testing.B, js jetstream.JetStream, want int) {
	fold, err := projections.NewFold(projections.Options{Pair: livePair, Bucket: liveBucket, Codec: runtime.Codec()})
	if err != nil {
		b.Fatal(err)
	}
	for rec, err := range runtime.ReadPairRecords(context.Background(), js, runtime.PairRecordOptions{Pair: livePair, Bucket: liveBucket, Stream: liveStream}) {
		if err != nil {
			b.Fatal(err)
		}
		fold.Add(rec)
	}
	if fold.Count() != want {
		b.Fatalf("folded %d records, want %d", fold.Count(), want)
	}
	if r := fold.Report(); len(r.Failovers) == 0 {
		b.Fatalf("no failover in the record")
	}
}

// rawReadOnce reads the same messages with bare ordered consumers (one
// per stream, concurrently, with the same pull size as ours) whose
// handlers only count.
func rawReadOnce(b *testing.B, js jetstream.JetStream, want int) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for _, src := range []struct {
		stream  string
		filters []string
	}{
		{"KV_" + liveBucket, []string{"$KV." + liveBucket + "." + livePair + ".>"}},
		{liveStream, []string{"ev.failover." + livePair + ".>", "ev.procedure." + livePair + ".>"}},
	} {
		cons, err := js.OrderedConsumer(context.Background(), src.stream, jetstream.OrderedConsumerConfig{FilterSubjects: src.filters})
		if err != nil {
			b.Fatal(err)
		}
		pending := cons.CachedInfo().NumPending
		if pending == 0 {
			continue
		}
		wg.Add(1)
		done := make(chan struct{})
		n := uint64(0)
		cc, err := cons.Consume(func(msg jetstream.Msg) {
			n++
			if n == pending {
				close(done)
			}
		}, jetstream.PullMaxMessages(4096))
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			defer wg.Done()
			<-done
			cc.Stop()
			mu.Lock()
			total += int(n)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if total != want {
		b.Fatalf("raw read %d messages, want %d", total, want)
	}
}

// BenchmarkReplayLive: replay from a live JetStream (our merged read of
// the pair's sources, folded into every projection) against bare ordered
// consumers that only count the same messages. interleaved alternates the
// two in each op and reports their throughput ratio (goal ≥ 0.8).
func BenchmarkReplayLive(b *testing.B) {
	js, n := liveFixture(b)
	perSecond := func(b *testing.B, d time.Duration) {
		b.ReportMetric(float64(n)*float64(b.N)/d.Seconds(), "records/s")
	}
	b.Run("replay", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			replayLiveOnce(b, js, n)
		}
		perSecond(b, b.Elapsed())
	})
	b.Run("raw-ordered-consumer", func(b *testing.B) {
		for b.Loop() {
			rawReadOnce(b, js, n)
		}
		perSecond(b, b.Elapsed())
	})
	b.Run("interleaved", func(b *testing.B) {
		var ours, raw time.Duration
		for b.Loop() {
			start := time.Now()
			replayLiveOnce(b, js, n)
			ours += time.Since(start)
			start = time.Now()
			rawReadOnce(b, js, n)
			raw += time.Since(start)
		}
		b.ReportMetric(raw.Seconds()/ours.Seconds(), "replay/raw")
		perSecond(b, ours)
	})
}
