package runtime

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"understudy/events"
)

var testNames = AssetsConfig{
	FailoverBucket: DefaultFailoverBucket,
	FleetBucket:    DefaultFleetBucket,
	EventsStream:   DefaultEventsStream,
}

func jetStreamOf(t *testing.T, e *EmbeddedNATS) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(e.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func streamConfig(t *testing.T, js jetstream.JetStream, name string) jetstream.StreamConfig {
	t.Helper()
	s, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	return s.CachedInfo().Config
}

func outcomes(p Provisioned) map[string]Outcome {
	m := map[string]Outcome{}
	for _, a := range p.Assets {
		m[a.Name] = a.Outcome
	}
	return m
}

func TestProvisionCreatesThenChangesNothing(t *testing.T) {
	log, rec := newLogRecorder(t)
	js := jetStreamOf(t, startEmbedded(t, log))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	assets := DefaultAssets(testNames, 1)

	p, err := Provision(ctx, js, assets, log)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Assets) != 3 {
		t.Fatalf("report has %d assets, want 3: %v", len(p.Assets), p)
	}
	for _, a := range p.Assets {
		if a.Outcome != Created || len(a.Applied)+len(a.Refused) != 0 {
			t.Errorf("first provisioning of %s %s: %v", a.Kind, a.Name, a)
		}
	}

	// The assets have the settings of DESIGN.md.
	failover := streamConfig(t, js, "KV_understudy_failover")
	if failover.Storage != jetstream.FileStorage || failover.MaxMsgsPerSubject != 64 || failover.MaxAge != 0 || failover.Replicas != 1 {
		t.Errorf("failover bucket: storage %s, history %d, ttl %s, replicas %d; want File, 64, 0s, 1",
			failover.Storage, failover.MaxMsgsPerSubject, failover.MaxAge, failover.Replicas)
	}
	if fleet := streamConfig(t, js, "KV_understudy_fleet"); fleet.Storage != jetstream.FileStorage || fleet.MaxMsgsPerSubject != 16 {
		t.Errorf("fleet bucket: storage %s, history %d; want File, 16", fleet.Storage, fleet.MaxMsgsPerSubject)
	}
	ev := streamConfig(t, js, DefaultEventsStream)
	if len(ev.Subjects) != 1 || ev.Subjects[0] != "ev.>" || ev.Storage != jetstream.FileStorage ||
		ev.Retention != jetstream.LimitsPolicy || ev.Duplicates != 2*time.Minute ||
		ev.Discard != jetstream.DiscardOld || ev.MaxMsgsPerSubject != -1 || ev.MaxAge != 0 {
		t.Errorf("events stream: %+v", ev)
	}
	if by := failover.Metadata[createdByKey]; by == "" {
		t.Errorf("failover bucket metadata %v: no %s", failover.Metadata, createdByKey)
	}
	kv, err := js.KeyValue(ctx, DefaultFailoverBucket)
	if err != nil {
		t.Fatalf("failover bucket is not a usable KV: %v", err)
	}
	rev, err := kv.Put(ctx, "pair.leader", []byte("a"))
	if err != nil {
		t.Fatal(err)
	}

	// Again: nothing to do, nothing lost.
	p, err = Provision(ctx, js, assets, log)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range p.Assets {
		if a.Outcome != Unchanged || len(a.Applied)+len(a.Refused) != 0 {
			t.Errorf("second provisioning of %s %s: %v", a.Kind, a.Name, a)
		}
	}
	if got := streamConfig(t, js, "KV_understudy_failover"); got.MaxMsgsPerSubject != failover.MaxMsgsPerSubject {
		t.Error("second provisioning changed the failover bucket")
	}
	if e, err := kv.Get(ctx, "pair.leader"); err != nil || e.Revision() != rev {
		t.Errorf("after re-provisioning: %v, %v; want revision %d", e, err, rev)
	}
	for _, l := range rec.all() {
		if l.Level >= 4 /* warn */ && l.Attrs["component"].String() != "nats-server" {
			t.Errorf("unexpected warning: %v", l)
		}
	}
}

func TestProvisionUpdatesWhatItCanAndReportsTheRest(t *testing.T) {
	log, rec := newLogRecorder(t)
	js := jetStreamOf(t, startEmbedded(t, log))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := Provision(ctx, js, DefaultAssets(testNames, 1), log); err != nil {
		t.Fatal(err)
	}

	changed := DefaultAssets(testNames, 1)
	changed[0].History = 32                         // updatable
	changed[0].MaxBytes = 1 << 20                   // updatable
	changed[0].Storage = jetstream.MemoryStorage    // NATS cannot
	changed[2].Duplicates = 5 * time.Minute         // updatable
	changed[2].Retention = jetstream.InterestPolicy // understudy will not
	changed[2].Replicas = 3                         // a single server cannot

	p, err := Provision(ctx, js, changed, log)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		outcome Outcome
		applied map[string][2]string // field -> current, wanted
		refused map[string][2]string
	}{
		DefaultFailoverBucket: {Updated,
			map[string][2]string{"history": {"64", "32"}, "max_bytes": {"unlimited", "1048576"}},
			map[string][2]string{"storage": {"File", "Memory"}}},
		DefaultFleetBucket: {Unchanged, nil, nil},
		DefaultEventsStream: {Updated,
			map[string][2]string{"duplicate_window": {"2m0s", "5m0s"}},
			map[string][2]string{"retention": {"Limits", "Interest"}, "replicas": {"1", "3"}}},
	}
	check := func(p Provisioned, updatedNow bool) {
		t.Helper()
		for _, a := range p.Assets {
			w := want[a.Name]
			wantOutcome, wantApplied := w.outcome, w.applied
			if !updatedNow {
				wantOutcome, wantApplied = Unchanged, nil
			}
			if a.Outcome != wantOutcome {
				t.Errorf("%s: outcome %s, want %s", a.Name, a.Outcome, wantOutcome)
			}
			for _, list := range []struct {
				what string
				got  []Change
				want map[string][2]string
			}{{"applied", a.Applied, wantApplied}, {"refused", a.Refused, w.refused}} {
				if len(list.got) != len(list.want) {
					t.Errorf("%s: %s %v, want %v", a.Name, list.what, list.got, list.want)
					continue
				}
				for _, c := range list.got {
					cw, ok := list.want[c.Field]
					if !ok || c.Current != cw[0] || c.Wanted != cw[1] {
						t.Errorf("%s: %s %v, want %v", a.Name, list.what, c, list.want)
					}
					if list.what == "refused" && c.Reason == "" {
						t.Errorf("%s: refused %s without a reason", a.Name, c.Field)
					}
				}
			}
		}
	}
	check(p, true)
	if p.Refused() != 3 {
		t.Errorf("Refused() = %d, want 3", p.Refused())
	}

	// NATS holds the updated values and kept the refused ones.
	failover := streamConfig(t, js, "KV_understudy_failover")
	if failover.MaxMsgsPerSubject != 32 || failover.MaxBytes != 1<<20 || failover.Storage != jetstream.FileStorage {
		t.Errorf("failover bucket after update: history %d, max bytes %d, storage %s", failover.MaxMsgsPerSubject, failover.MaxBytes, failover.Storage)
	}
	ev := streamConfig(t, js, DefaultEventsStream)
	if ev.Duplicates != 5*time.Minute || ev.Retention != jetstream.LimitsPolicy || ev.Replicas != 1 {
		t.Errorf("events stream after update: duplicates %s, retention %s, replicas %d", ev.Duplicates, ev.Retention, ev.Replicas)
	}

	// Each refused change is a warning naming field, current and wanted.
	warned := map[string]bool{}
	for _, l := range rec.matching("asset setting not changed") {
		if l.Level != 4 {
			t.Errorf("refused change logged at %s, want WARN", l.Level)
		}
		warned[l.Attrs["name"].String()+"/"+l.Attrs["field"].String()+"/"+l.Attrs["current"].String()+"/"+l.Attrs["wanted"].String()] = true
	}
	for _, k := range []string{
		DefaultFailoverBucket + "/storage/File/Memory",
		DefaultEventsStream + "/retention/Limits/Interest",
		DefaultEventsStream + "/replicas/1/3",
	} {
		if !warned[k] {
			t.Errorf("no warning for %s; got %v", k, warned)
		}
	}

	// Again with the same wishes: nothing more to update, the same refusals.
	p, err = Provision(ctx, js, changed, log)
	if err != nil {
		t.Fatal(err)
	}
	check(p, false)
}

func TestProvisionConcurrentNodesCreateOnce(t *testing.T) {
	log, _ := newLogRecorder(t)
	e := startEmbedded(t, log)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const nodes = 4
	reports := make([]Provisioned, nodes)
	errs := make([]error, nodes)
	var wg sync.WaitGroup
	for i := range nodes {
		js := jetStreamOf(t, e)
		wg.Add(1)
		go func() {
			defer wg.Done()
			reports[i], errs[i] = Provision(ctx, js, DefaultAssets(testNames, 1), log)
		}()
	}
	wg.Wait()
	created := map[string]int{}
	for i := range nodes {
		if errs[i] != nil {
			t.Fatalf("node %d: %v", i, errs[i])
		}
		for name, o := range outcomes(reports[i]) {
			if o == Created {
				created[name]++
			} else if o != Unchanged {
				t.Errorf("node %d: %s %s", i, name, o)
			}
		}
	}
	for _, name := range []string{DefaultFailoverBucket, DefaultFleetBucket, DefaultEventsStream} {
		if created[name] != 1 {
			t.Errorf("%s created %d times, want once", name, created[name])
		}
	}
}

func TestProvisionReplicasOnSingleServerIsRefused(t *testing.T) {
	log, _ := newLogRecorder(t)
	js := jetStreamOf(t, startEmbedded(t, log))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := Provision(ctx, js, DefaultAssets(testNames, 3), log)
	if !errors.Is(err, ErrReplicasUnsupported) {
		t.Fatalf("error %v: want ErrReplicasUnsupported", err)
	}
	var perr *ProvisionError
	if !errors.As(err, &perr) || perr.Kind != KVBucket || perr.Name != DefaultFailoverBucket {
		t.Fatalf("error %#v: want a *ProvisionError for the failover bucket", err)
	}
	if retryableProvisionError(err) {
		t.Error("a refused replica count is treated as retryable")
	}
}

func TestProvisionRejectsInvalidAsset(t *testing.T) {
	log, _ := newLogRecorder(t)
	js := jetStreamOf(t, startEmbedded(t, log))
	bad := DefaultAssets(testNames, 1)
	bad[1].History = 65
	p, err := Provision(context.Background(), js, bad, log)
	var perr *ProvisionError
	if !errors.As(err, &perr) || perr.Name != DefaultFleetBucket || !errors.Is(err, ErrInvalidAsset) {
		t.Fatalf("error %v: want a *ProvisionError for the fleet bucket wrapping ErrInvalidAsset", err)
	}
	if retryableProvisionError(err) {
		t.Error("an invalid asset is treated as retryable")
	}
	if len(p.Assets) != 1 || p.Assets[0].Name != DefaultFailoverBucket {
		t.Errorf("report so far %v: want the failover bucket only", p)
	}
}

// Buckets made by hand (nats kv add) with the same settings are adopted as
// they are, but for rollups, which nats kv add allows and understudy turns
// off (a rollup on one key would purge every pair's keys), and atomic
// batches, which understudy turns on (a node's register writes go in
// batches under load).
func TestProvisionAdoptsEqualAssetsMadeElsewhere(t *testing.T) {
	log, _ := newLogRecorder(t)
	js := jetStreamOf(t, startEmbedded(t, log))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: DefaultFailoverBucket, History: 64, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	p, err := Provision(ctx, js, DefaultAssets(testNames, 1), log)
	if err != nil {
		t.Fatal(err)
	}
	got := p.Assets[0]
	if got.Outcome != Updated || len(got.Refused) != 0 || len(got.Applied) != 2 || got.Applied[0].Field != "allow_rollup" || got.Applied[1].Field != "allow_atomic" {
		t.Errorf("bucket made by CreateKeyValue: %+v, want only allow_rollup turned off and allow_atomic on", got)
	}
	kv, err := events.NewJetStreamKV(ctx, js, DefaultFailoverBucket)
	if err != nil {
		t.Fatal(err)
	}
	if !kv.Batches() {
		t.Error("the provisioned failover bucket takes no batches")
	}
}

// An events stream provisioned by a version before append batches gets
// allow_atomic at the next provisioning, and its log then takes batches.
func TestProvisionAllowsAtomicAppendsOnAnOlderEventsStream(t *testing.T) {
	log, _ := newLogRecorder(t)
	js := jetStreamOf(t, startEmbedded(t, log))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	assets := DefaultAssets(testNames, 1)
	evs := assets[2]
	older := evs.streamConfig(true)
	older.AllowAtomicPublish = false
	if _, err := js.CreateStream(ctx, older); err != nil {
		t.Fatal(err)
	}
	p, err := Provision(ctx, js, assets, log)
	if err != nil {
		t.Fatal(err)
	}
	got := p.Assets[2]
	if got.Name != evs.Name || got.Outcome != Updated || len(got.Applied) != 1 || got.Applied[0].Field != "allow_atomic" {
		t.Fatalf("events stream of an older version: %+v, want allow_atomic turned on only", got)
	}
	l, err := events.NewJetStreamLog(js, evs.Name, Codec())
	if err != nil {
		t.Fatal(err)
	}
	if !l.Batches() {
		t.Error("the provisioned events stream takes no batches")
	}
}

// Answers of a cluster that is forming or electing are retried; the
// others stop provisioning.
func TestRetryableProvisionErrorsOfAFormingCluster(t *testing.T) {
	api := func(code int) error {
		return &ProvisionError{Kind: KVBucket, Name: "understudy_failover", Err: &jetstream.APIError{Code: 400, ErrorCode: jetstream.ErrorCode(code), Description: "x"}}
	}
	for code, want := range map[int]bool{10008: true, 10009: true, 10059: true, 10005: false, 10058: false, 10074: false} {
		if got := retryableProvisionError(api(code)); got != want {
			t.Errorf("error code %d: retryable %v, want %v", code, got, want)
		}
	}
	if !isAPIError(api(10005), codeClusterNoPeers) {
		t.Error("10005 is not recognised (it is retried only while the cluster forms)")
	}
}
