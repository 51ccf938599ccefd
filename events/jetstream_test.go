package events_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"understudy/events"
	"understudy/events/eventstest"
)

// One embedded nats-server per test binary, started on first use, with
// JetStream on file storage and fsync on every write as in production.
// Every log or bucket a test asks for lives in an account of its own, so
// each can capture "ev.>" and tests can run in parallel.
var testNATS struct {
	once sync.Once
	srv  *server.Server
	dir  string
	auth *accountAuth
	err  error
	n    atomic.Int64
}

func TestMain(m *testing.M) {
	code := m.Run()
	if testNATS.srv != nil {
		testNATS.srv.Shutdown()
		testNATS.srv.WaitForShutdown()
	}
	if testNATS.dir != "" {
		_ = os.RemoveAll(testNATS.dir)
	}
	os.Exit(code)
}

// accountAuth admits a client whose user name is a registered account and
// binds it to that account.
type accountAuth struct {
	mu   sync.Mutex
	accs map[string]*server.Account
}

func (a *accountAuth) Check(c server.ClientAuthentication) bool {
	name := c.GetOpts().Username
	a.mu.Lock()
	acc := a.accs[name]
	a.mu.Unlock()
	if acc == nil {
		return false
	}
	c.RegisterUser(&server.User{Username: name, Account: acc})
	return true
}

func natsServer(tb testing.TB) *server.Server {
	tb.Helper()
	testNATS.once.Do(func() {
		dir, err := os.MkdirTemp("", "understudy-events-jetstream-")
		if err != nil {
			testNATS.err = err
			return
		}
		testNATS.dir = dir
		testNATS.auth = &accountAuth{accs: map[string]*server.Account{}}
		srv, err := server.NewServer(&server.Options{
			ServerName:                 "events-test",
			Host:                       "127.0.0.1",
			Port:                       -1,
			JetStream:                  true,
			StoreDir:                   dir,
			SyncAlways:                 true,
			NoLog:                      true,
			NoSigs:                     true,
			CustomClientAuthentication: testNATS.auth,
		})
		if err != nil {
			testNATS.err = err
			return
		}
		srv.Start()
		if !srv.ReadyForConnections(10 * time.Second) {
			testNATS.err = errors.New("embedded nats-server not ready within 10s")
			srv.Shutdown()
			return
		}
		testNATS.srv = srv
	})
	if testNATS.err != nil {
		tb.Fatalf("embedded nats-server: %v", testNATS.err)
	}
	return testNATS.srv
}

// newJetStream connects to a fresh JetStream-enabled account and returns
// the account's name for more connections.
func newJetStream(tb testing.TB) (jetstream.JetStream, string) {
	tb.Helper()
	name := newAccount(tb)
	return connect(tb, name), name
}

// newAccount registers a JetStream-enabled account on the test server.
func newAccount(tb testing.TB) string {
	tb.Helper()
	srv := natsServer(tb)
	name := fmt.Sprintf("T%d", testNATS.n.Add(1))
	acc, err := srv.RegisterAccount(name)
	if err != nil {
		tb.Fatalf("register account: %v", err)
	}
	if err := acc.EnableJetStream(nil, nil); err != nil {
		tb.Fatalf("enable JetStream for account %s: %v", name, err)
	}
	testNATS.auth.mu.Lock()
	testNATS.auth.accs[name] = acc
	testNATS.auth.mu.Unlock()
	return name
}

// connect opens a connection to account, closed when tb ends.
func connect(tb testing.TB, account string, opts ...jetstream.JetStreamOpt) jetstream.JetStream {
	tb.Helper()
	js, nc, err := dial(account, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	return js
}

// dial connects to account on the test server (which must be running).
func dial(account string, opts ...jetstream.JetStreamOpt) (jetstream.JetStream, *nats.Conn, error) {
	nc, err := nats.Connect(testNATS.srv.ClientURL(), nats.UserInfo(account, ""))
	if err != nil {
		return nil, nil, fmt.Errorf("connect to account %s: %w", account, err)
	}
	js, err := jetstream.New(nc, opts...)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return js, nc, nil
}

// createLogStream creates the empty stream the test logs live on: file
// storage, synced on every write as the server is configured, unless
// persist is jetstream.AsyncPersistMode.
// testDedupWindow is the test stream's duplicate window: short, so that
// the conformance suite can wait past it.
const testDedupWindow = time.Second

func createLogStream(js jetstream.JetStream, persist jetstream.PersistModeType) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:        testStream,
		Subjects:    []string{"ev.>"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Duplicates:  testDedupWindow,
		PersistMode: persist,
		// As provisioning does for understudy's events stream (the server
		// refuses atomic batches on a stream not synced on every write).
		AllowAtomicPublish: persist == jetstream.DefaultPersistMode,
	})
	return err
}

const testStream = "EVENTS"

// newTestLog creates an empty stream capturing "ev.>" in a fresh account and
// opens the Log on it. It returns the account's JetStream context and name.
func newTestLog(tb testing.TB, codec *events.Registry) (*events.JetStreamLog, jetstream.JetStream, string) {
	tb.Helper()
	return newTestLogPersist(tb, codec, jetstream.DefaultPersistMode)
}

// newBulkLog is newTestLog on a stream that is not synced on every write,
// for tests that need thousands of records to read: reading is the same.
func newBulkLog(tb testing.TB, codec *events.Registry) (*events.JetStreamLog, jetstream.JetStream, string) {
	tb.Helper()
	return newTestLogPersist(tb, codec, jetstream.AsyncPersistMode)
}

func newTestLogPersist(tb testing.TB, codec *events.Registry, persist jetstream.PersistModeType) (*events.JetStreamLog, jetstream.JetStream, string) {
	tb.Helper()
	js, account := newJetStream(tb)
	if err := createLogStream(js, persist); err != nil {
		tb.Fatalf("create stream: %v", err)
	}
	l, err := events.NewJetStreamLog(js, testStream, codec)
	if err != nil {
		tb.Fatalf("NewJetStreamLog: %v", err)
	}
	return l, js, account
}

// newTestKV creates an empty bucket keeping events.HistoryLimit revisions.
func newTestKV(tb testing.TB) (*events.JetStreamKV, jetstream.JetStream) {
	tb.Helper()
	js, _ := newJetStream(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:  "kv",
		History: events.HistoryLimit,
		Storage: jetstream.FileStorage,
	}); err != nil {
		tb.Fatalf("create bucket: %v", err)
	}
	// As provisioning does for understudy's buckets: atomic batches allowed.
	allowAtomic(tb, js, "KV_kv", true)
	kv, err := events.NewJetStreamKV(ctx, js, "kv")
	if err != nil {
		tb.Fatalf("NewJetStreamKV: %v", err)
	}
	return kv, js
}

type jsTestEvent struct {
	N    int    `msgpack:"n"`
	Note string `msgpack:"s"`
}

func (*jsTestEvent) EventType() string { return "test.jetstream" }

func testCodec(tb testing.TB) *events.Registry {
	r := events.NewRegistry()
	if err := r.Register(&jsTestEvent{}, 1); err != nil {
		tb.Fatal(err)
	}
	return r
}

func testCtx(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

func mustAppend(t *testing.T, l events.Log, subject string, n int, opts events.AppendOptions) events.Ack {
	t.Helper()
	ack, err := l.Append(testCtx(t), subject, &jsTestEvent{N: n}, opts)
	if err != nil {
		t.Fatalf("append %s #%d: %v", subject, n, err)
	}
	return ack
}

func collect(t *testing.T, ctx context.Context, l events.Log, opts events.ReadOptions) []events.Record {
	t.Helper()
	var out []events.Record
	for rec, err := range l.Read(ctx, opts) {
		if err != nil {
			t.Fatalf("read %+v: %v", opts, err)
		}
		out = append(out, rec)
	}
	return out
}

func seqs(recs []events.Record) []uint64 {
	out := make([]uint64, len(recs))
	for i, r := range recs {
		out[i] = r.Sequence
	}
	return out
}

func TestJetStreamLogAppendAndRead(t *testing.T) {
	t.Parallel()
	codec := testCodec(t)
	l, _, _ := newTestLog(t, codec)
	ctx := testCtx(t)

	before := time.Now()
	a1 := mustAppend(t, l, "ev.pair.a", 1, events.AppendOptions{Headers: map[string]string{"x-Trace": "abc"}})
	a2 := mustAppend(t, l, "ev.pair.b", 2, events.Expect(0))
	a3 := mustAppend(t, l, "ev.pair.a", 3, events.AppendOptions{MsgID: "m3", ExpectLastSubjectSeq: a1.Sequence, ExpectSet: true})
	after := time.Now()
	if a1.Sequence != 1 || a2.Sequence != 2 || a3.Sequence != 3 || a1.Duplicate || a3.Duplicate {
		t.Fatalf("acks = %+v %+v %+v, want sequences 1, 2, 3, none duplicate", a1, a2, a3)
	}

	recs := collect(t, ctx, l, events.ReadOptions{})
	if got := seqs(recs); fmt.Sprint(got) != "[1 2 3]" {
		t.Fatalf("read sequences %v, want [1 2 3]", got)
	}
	r1 := recs[0]
	if r1.Stream != testStream || r1.Subject != "ev.pair.a" {
		t.Errorf("record 1 stream/subject = %q/%q", r1.Stream, r1.Subject)
	}
	if r1.Time.Location() != time.UTC {
		t.Errorf("record time %v is not UTC", r1.Time)
	}
	// Server and test share a clock; allow for its coarse granularity.
	if r1.Time.Before(before.Add(-time.Second)) || r1.Time.After(after.Add(time.Second)) {
		t.Errorf("record time %v outside [%v, %v]", r1.Time, before, after)
	}
	if r1.Headers["x-Trace"] != "abc" {
		t.Errorf("record 1 headers = %v, want x-Trace=abc (case kept)", r1.Headers)
	}
	if r3 := recs[2]; r3.Headers["Nats-Msg-Id"] != "m3" || r3.Headers["Nats-Expected-Last-Subject-Sequence"] != "1" {
		t.Errorf("record 3 headers = %v, want the msg id and expectation JetStream stores", r3.Headers)
	}
	ev, err := l.Codec().DecodeRecord(recs[2])
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	if e, ok := ev.(*jsTestEvent); !ok || e.N != 3 {
		t.Fatalf("decoded %#v, want N=3", ev)
	}

	for subj, want := range map[string]uint64{"ev.pair.a": 3, "ev.pair.b": 2, "ev.pair.none": 0} {
		got, err := l.LastSequence(ctx, subj)
		if err != nil || got != want {
			t.Errorf("LastSequence(%s) = %d, %v; want %d", subj, got, err, want)
		}
	}
	if _, err := l.LastSequence(ctx, "ev.pair.*"); err == nil {
		t.Errorf("LastSequence with a wildcard: want an error")
	}

	raw := []byte{0x80} // not an envelope: AppendRaw stores bytes unchanged
	if _, err := l.AppendRaw(ctx, "ev.raw.x", raw, events.AppendOptions{}); err != nil {
		t.Fatal(err)
	}
	got := collect(t, ctx, l, events.ReadOptions{Subject: "ev.raw.x"})
	if len(got) != 1 || string(got[0].Data) != string(raw) {
		t.Fatalf("raw read = %+v", got)
	}
}

func TestJetStreamLogConflictIs10071(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLog(t, testCodec(t))
	ctx := testCtx(t)
	mustAppend(t, l, "ev.m.x", 1, events.Expect(0))

	_, err := l.Append(ctx, "ev.m.x", &jsTestEvent{N: 2}, events.Expect(0))
	if !errors.Is(err, events.ErrConflict) {
		t.Fatalf("stale expectation: err = %v, want ErrConflict", err)
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		t.Fatalf("err = %v, want the NATS 10071 APIError in the chain", err)
	}
	if !strings.Contains(err.Error(), "10071") || !strings.Contains(err.Error(), "ev.m.x") {
		t.Errorf("message %q should name the subject and keep the NATS detail", err)
	}
	// Expect(n) for a subject that moved elsewhere in the stream.
	mustAppend(t, l, "ev.m.y", 1, events.AppendOptions{})
	if _, err := l.Append(ctx, "ev.m.x", &jsTestEvent{}, events.Expect(2)); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("expectation of another subject's sequence: err = %v, want ErrConflict", err)
	}
	if last, _ := l.LastSequence(ctx, "ev.m.x"); last != 1 {
		t.Fatalf("a refused append was stored: last = %d", last)
	}
}

func TestJetStreamLogDedup(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLog(t, testCodec(t))
	ctx := testCtx(t)

	a := mustAppend(t, l, "ev.d.x", 1, events.AppendOptions{MsgID: "once"})
	b := mustAppend(t, l, "ev.d.x", 1, events.AppendOptions{MsgID: "once"})
	if b.Sequence != a.Sequence || !b.Duplicate {
		t.Fatalf("retry ack %+v, want sequence %d duplicate", b, a.Sequence)
	}

	// A conditional append retried after it landed: a single server answers
	// 10071, the log recognises its own earlier write.
	opts := events.AppendOptions{MsgID: "cas-1", ExpectLastSubjectSeq: a.Sequence, ExpectSet: true}
	c := mustAppend(t, l, "ev.d.x", 2, opts)
	mustAppend(t, l, "ev.d.other", 3, events.AppendOptions{})
	d, err := l.Append(ctx, "ev.d.x", &jsTestEvent{N: 2}, opts)
	if err != nil || d.Sequence != c.Sequence || !d.Duplicate {
		t.Fatalf("conditional retry = %+v, %v; want sequence %d duplicate", d, err, c.Sequence)
	}
	// Same expectation, different id: a real conflict.
	opts.MsgID = "cas-2"
	if _, err := l.Append(ctx, "ev.d.x", &jsTestEvent{N: 2}, opts); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("competing writer: err = %v, want ErrConflict", err)
	}
	if n := len(collect(t, ctx, l, events.ReadOptions{Subject: "ev.d.x"})); n != 2 {
		t.Fatalf("ev.d.x holds %d records, want 2", n)
	}
}

func TestJetStreamLogReadSelection(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLog(t, testCodec(t))
	ctx := testCtx(t)
	for i := 1; i <= 6; i++ {
		mustAppend(t, l, fmt.Sprintf("ev.k%d.m%d", i%2, i), i, events.AppendOptions{})
	}
	all := collect(t, ctx, l, events.ReadOptions{})
	cases := []struct {
		name string
		opts events.ReadOptions
		want string
	}{
		{"all", events.ReadOptions{}, "[1 2 3 4 5 6]"},
		{"from 1", events.ReadOptions{FromSeq: 1}, "[1 2 3 4 5 6]"},
		{"from 4", events.ReadOptions{FromSeq: 4}, "[4 5 6]"},
		{"from past the end", events.ReadOptions{FromSeq: 7}, "[]"},
		{"wildcard", events.ReadOptions{Subject: "ev.k1.*"}, "[1 3 5]"},
		{"full wildcard from 3", events.ReadOptions{Subject: "ev.k0.>", FromSeq: 3}, "[4 6]"},
		{"literal", events.ReadOptions{Subject: "ev.k0.m2"}, "[2]"},
		{"no match", events.ReadOptions{Subject: "ev.none"}, "[]"},
		{"from time", events.ReadOptions{FromTime: all[3].Time}, ""},
		{"from time wins over seq", events.ReadOptions{FromTime: all[3].Time, FromSeq: 6}, ""},
		{"from the future", events.ReadOptions{FromTime: time.Now().Add(time.Hour)}, "[]"},
	}
	for _, tc := range cases {
		got := collect(t, ctx, l, tc.opts)
		want := tc.want
		if want == "" { // by time: every record stored at or after it
			var w []uint64
			for _, r := range all {
				if !r.Time.Before(tc.opts.FromTime) {
					w = append(w, r.Sequence)
				}
			}
			want = fmt.Sprint(w)
		}
		if fmt.Sprint(seqs(got)) != want && !(want == "[]" && len(got) == 0) {
			t.Errorf("%s: read %v, want %v", tc.name, seqs(got), want)
		}
	}
}

func TestJetStreamLogReadEmptyEndsAtOnce(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLog(t, testCodec(t))
	start := time.Now()
	if got := collect(t, testCtx(t), l, events.ReadOptions{}); len(got) != 0 {
		t.Fatalf("empty log read %d records", len(got))
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("reading an empty log took %v", d)
	}
}

// A non-follow read ends after the records present when it began, also when
// more arrive while it runs, and more records than one pull or batch.
func TestJetStreamLogReadStopsAtStart(t *testing.T) {
	t.Parallel()
	l, js, _ := newBulkLog(t, testCodec(t))
	ctx := testCtx(t)
	const n = events.ReadPullMax + 1000 // more than one pull, many batches
	fill(t, js, "ev.bulk.x", n)

	var got []uint64
	for rec, err := range l.Read(ctx, events.ReadOptions{}) {
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 {
			for i := 0; i < 5; i++ {
				mustAppend(t, l, "ev.bulk.late", i, events.AppendOptions{})
			}
		}
		got = append(got, rec.Sequence)
	}
	if len(got) != n {
		t.Fatalf("read %d records, want the %d present at the start", len(got), n)
	}
	for i, s := range got {
		if s != uint64(i+1) {
			t.Fatalf("record %d has sequence %d: out of order or gap", i, s)
		}
	}
	// Same with a filter that leaves the late records out and a start point.
	got = seqs(collect(t, ctx, l, events.ReadOptions{Subject: "ev.bulk.x", FromSeq: n - 2}))
	if fmt.Sprint(got) != fmt.Sprint([]uint64{n - 2, n - 1, n}) {
		t.Fatalf("tail read %v", got)
	}
}

// fill publishes n small messages asynchronously.
func fill(tb testing.TB, js jetstream.JetStream, subject string, n int) {
	tb.Helper()
	data := make([]byte, 64)
	for i := 0; i < n; i++ {
		if _, err := js.PublishAsync(subject, data); err != nil {
			tb.Fatalf("publish async: %v", err)
		}
		if i%1000 == 999 { // below the client's default of 4000 outstanding
			waitAsync(tb, js)
		}
	}
	waitAsync(tb, js)
}

func waitAsync(tb testing.TB, js jetstream.JetStream) {
	tb.Helper()
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(60 * time.Second):
		tb.Fatal("async publish did not complete")
	}
}

func TestJetStreamLogReadFollow(t *testing.T) {
	t.Parallel()
	l, _, _ := newTestLog(t, testCodec(t))
	mustAppend(t, l, "ev.f.x", 1, events.AppendOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var got []int
	for rec, err := range l.Read(ctx, events.ReadOptions{Subject: "ev.f.>", Follow: true}) {
		if err != nil {
			t.Fatalf("follow: %v", err)
		}
		ev, err := l.Codec().DecodeRecord(rec)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev.(*jsTestEvent).N)
		switch len(got) {
		case 1, 2:
			// A live tail: the next record is appended only now.
			go func(n int) {
				_, _ = l.Append(ctx, "ev.f.x", &jsTestEvent{N: n}, events.AppendOptions{})
			}(len(got) + 1)
		case 3:
			cancel() // a followed read ends quietly
		}
	}
	if fmt.Sprint(got) != "[1 2 3]" {
		t.Fatalf("followed %v, want [1 2 3]", got)
	}

	// Following an empty selection waits for ctx, then ends without error.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	start := time.Now()
	if n := len(collect(t, ctx2, l, events.ReadOptions{Subject: "ev.none", Follow: true})); n != 0 {
		t.Fatalf("followed %d records of an empty subject", n)
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Fatalf("follow ended after %v, before its context", d)
	}
}

func TestJetStreamLogReadCancelled(t *testing.T) {
	t.Parallel()
	l, js, _ := newBulkLog(t, testCodec(t))
	fill(t, js, "ev.c.x", 2000)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := 0
	var last error
	for _, err := range l.Read(ctx, events.ReadOptions{}) {
		if err != nil {
			last = err
			break
		}
		if n++; n == 10 {
			cancel()
		}
	}
	if !errors.Is(last, context.Canceled) || n != 10 {
		t.Fatalf("after cancel at record 10: read %d records, err %v; want 10 and context.Canceled", n, last)
	}

	// Already cancelled before the read starts.
	n = 0
	for _, err := range l.Read(ctx, events.ReadOptions{}) {
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("read with a cancelled context: err %v", err)
		}
		n++
	}
	if n != 1 {
		t.Fatalf("read with a cancelled context yielded %d times, want one error", n)
	}
}

// Breaking out of a read removes its consumer from the server.
func TestJetStreamLogReadCleansUp(t *testing.T) {
	t.Parallel()
	l, js, _ := newBulkLog(t, testCodec(t))
	ctx := testCtx(t)
	fill(t, js, "ev.u.x", 3000)
	for range l.Read(ctx, events.ReadOptions{}) {
		break
	}
	_ = collect(t, ctx, l, events.ReadOptions{})
	_ = collect(t, ctx, l, events.ReadOptions{Subject: "ev.none"})
	s, err := js.Stream(ctx, testStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Consumers != 0 {
		t.Fatalf("%d consumers left on the stream after the reads ended", info.State.Consumers)
	}
}

// A followed read whose connection closes ends with an error rather than
// waiting for a context that may never end.
func TestJetStreamLogFollowEndsWhenConnectionCloses(t *testing.T) {
	t.Parallel()
	l, _, account := newTestLog(t, testCodec(t))
	mustAppend(t, l, "ev.cc.x", 1, events.AppendOptions{})
	js, nc, err := dial(account)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	own, err := events.NewJetStreamLog(js, testStream, testCodec(t))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	var last error
	for _, err := range own.Read(testCtx(t), events.ReadOptions{Follow: true}) {
		if err != nil {
			last = err
			continue
		}
		if n++; n == 1 {
			nc.Close()
		}
	}
	if n != 1 || !errors.Is(last, jetstream.ErrConnectionClosed) {
		t.Fatalf("read %d records, ended with %v; want 1 and ErrConnectionClosed", n, last)
	}
}

func TestNewJetStreamLogMissingStream(t *testing.T) {
	t.Parallel()
	js, _ := newJetStream(t)
	_, err := events.NewJetStreamLog(js, "NOPE", testCodec(t))
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("err = %v, want ErrStreamNotFound", err)
	}
	if _, err := events.NewJetStreamKV(testCtx(t), js, "nope"); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("err = %v, want ErrBucketNotFound", err)
	}
}

func TestMapJetStreamError(t *testing.T) {
	api := func(code jetstream.ErrorCode) *jetstream.APIError {
		return &jetstream.APIError{Code: 400, ErrorCode: code, Description: "wrong last sequence: 7"}
	}
	cases := []struct {
		name string
		in   error
		want error // nil: passed through unchanged
	}{
		{"10071", api(jetstream.JSErrCodeStreamWrongLastSequence), events.ErrConflict},
		// 10164: an earlier write to the subject is still being proposed
		// (nats-server 2.15, a stream leader cut off from its quorum): never
		// a lost CAS, even where the KV client wraps it in its CAS sentinels.
		{"10164 replicated", api(jetstream.JSErrCodeStreamWrongLastSequenceConstant), events.ErrInFlight},
		{"10164 wrapped", fmt.Errorf("publish: %w", api(jetstream.JSErrCodeStreamWrongLastSequenceConstant)), events.ErrInFlight},
		{"kv create 10164", fmt.Errorf("%w: %w", api(jetstream.JSErrCodeStreamWrongLastSequenceConstant), jetstream.ErrKeyExists), events.ErrInFlight},
		{"kv update 10164", fmt.Errorf("%w: %w", api(jetstream.JSErrCodeStreamWrongLastSequenceConstant), jetstream.ErrKeyRevisionMismatch), events.ErrInFlight},
		{"kv update 10071", fmt.Errorf("%w: %w", api(jetstream.JSErrCodeStreamWrongLastSequence), jetstream.ErrKeyRevisionMismatch), events.ErrConflict},
		{"kv update", jetstream.ErrKeyRevisionMismatch, events.ErrConflict},
		{"key not found", jetstream.ErrKeyNotFound, events.ErrNotFound},
		{"key deleted", jetstream.ErrKeyDeleted, events.ErrNotFound},
		{"message not found", jetstream.ErrMsgNotFound, events.ErrNotFound},
		{"other API error", api(jetstream.JSErrCodeStreamNotFound), nil},
		{"timeout", context.DeadlineExceeded, nil},
	}
	for _, tc := range cases {
		got := events.MapJetStreamError(tc.in)
		if tc.want == nil {
			if got != tc.in {
				t.Errorf("%s: mapped to %v, want it unchanged", tc.name, got)
			}
			continue
		}
		if !errors.Is(got, tc.want) {
			t.Errorf("%s: %v is not %v", tc.name, got, tc.want)
		}
		if !errors.Is(got, tc.in) {
			t.Errorf("%s: %v lost the NATS error from its chain", tc.name, got)
		}
		if !strings.Contains(got.Error(), tc.in.Error()) {
			t.Errorf("%s: message %q lost the NATS detail %q", tc.name, got, tc.in)
		}
		for _, other := range []error{events.ErrConflict, events.ErrInFlight, events.ErrNotFound} {
			if other != tc.want && errors.Is(got, other) {
				t.Errorf("%s: %v is %v too", tc.name, got, other)
			}
		}
	}
	if events.MapJetStreamError(nil) != nil {
		t.Errorf("nil mapped to non-nil")
	}
}

func TestParseAckReply(t *testing.T) {
	cases := []struct {
		reply            string
		seq, ts, pending uint64
		ok               bool
	}{
		{"$JS.ACK.S.C.1.42.7.1700000000123456789.3", 42, 1700000000123456789, 3, true},
		{"$JS.ACK._.ACCHASH.S.C.1.42.7.1700000000123456789.0.tok", 42, 1700000000123456789, 0, true},
		{"$JS.ACK.dom.ACCHASH.S.C.2.9.7.5.11", 9, 5, 11, true},
		{"$JS.ACK.S.C.1.42.7.170000", 0, 0, 0, false},
		{"$JS.ACK.S.C.1.x.7.1.3", 0, 0, 0, false},
		{"_INBOX.abc", 0, 0, 0, false},
		{"$JS.ACK.S.C.1.99999999999999999999999.7.1.3", 0, 0, 0, false},
	}
	for _, tc := range cases {
		seq, ts, pending, ok := events.ParseAckReply(tc.reply)
		if ok != tc.ok || (ok && (seq != tc.seq || ts != tc.ts || pending != tc.pending)) {
			t.Errorf("%s: got %d %d %d %v", tc.reply, seq, ts, pending, ok)
		}
	}
}

func TestJetStreamKV(t *testing.T) {
	t.Parallel()
	kv, _ := newTestKV(t)
	ctx := testCtx(t)
	if kv.Bucket() != "kv" {
		t.Fatalf("bucket %q", kv.Bucket())
	}
	if _, err := kv.Get(ctx, "p.leader"); !errors.Is(err, events.ErrNotFound) {
		t.Fatalf("get missing: %v, want ErrNotFound", err)
	}
	if _, err := kv.History(ctx, "p.leader"); !errors.Is(err, events.ErrNotFound) {
		t.Fatalf("history missing: %v, want ErrNotFound", err)
	}
	before := time.Now()
	r1, err := kv.Create(ctx, "p.leader", []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, "p.leader", []byte("b")); !errors.Is(err, events.ErrConflict) {
		t.Fatalf("second create: %v, want ErrConflict", err)
	}
	r2, err := kv.Update(ctx, "p.leader", []byte("b"), r1)
	if err != nil || r2 <= r1 {
		t.Fatalf("update: %d, %v", r2, err)
	}
	_, err = kv.Update(ctx, "p.leader", []byte("c"), r1)
	var apiErr *jetstream.APIError
	if !errors.Is(err, events.ErrConflict) || !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		t.Fatalf("stale update: %v, want ErrConflict carrying NATS 10071", err)
	}
	e, err := kv.Get(ctx, "p.leader")
	if err != nil || string(e.Value) != "b" || e.Revision != r2 || e.Op != events.OpPut || e.Key != "p.leader" || e.Bucket != "kv" {
		t.Fatalf("get = %+v, %v", e, err)
	}
	if e.Time.Location() != time.UTC || e.Time.Before(before.Add(-time.Second)) || e.Time.After(time.Now().Add(time.Second)) {
		t.Fatalf("entry time %v: want the server's, in UTC", e.Time)
	}
	if err := kv.Delete(ctx, "p.leader"); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "p.leader"); !errors.Is(err, events.ErrNotFound) {
		t.Fatalf("get deleted: %v, want ErrNotFound", err)
	}
	r4, err := kv.Create(ctx, "p.leader", []byte("d"))
	if err != nil {
		t.Fatalf("create after delete: %v", err)
	}
	if r5, err := kv.Put(ctx, "p.leader", []byte("e")); err != nil || r5 <= r4 {
		t.Fatalf("put: %d, %v", r5, err)
	}
	h, err := kv.History(ctx, "p.leader")
	if err != nil {
		t.Fatal(err)
	}
	var ops []string
	for _, e := range h {
		ops = append(ops, fmt.Sprintf("%s:%s", e.Op, e.Value))
	}
	if got := strings.Join(ops, " "); got != "put:a put:b delete: put:d put:e" {
		t.Fatalf("history %q", got)
	}
}

func recvEntry(t *testing.T, w events.Watcher) events.Entry {
	t.Helper()
	select {
	case e, ok := <-w.Updates():
		if !ok {
			t.Fatal("watch closed")
		}
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no watch update within 10s")
	}
	return events.Entry{}
}

func describe(e events.Entry) string {
	if e.Revision == 0 {
		return "|"
	}
	return fmt.Sprintf("%s=%s/%s", e.Key, e.Op, e.Value)
}

func TestJetStreamKVWatch(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	cases := []struct {
		opts events.WatchOptions
		want string
	}{
		{events.WatchOptions{}, "p.a=put/2 p.b=delete/ | p.c=put/1"},
		{events.WatchOptions{History: true}, "p.a=put/1 p.b=put/1 p.a=put/2 p.b=delete/ | p.c=put/1"},
		{events.WatchOptions{UpdatesOnly: true}, "| p.c=put/1"},
	}
	for _, tc := range cases {
		kv, _ := newTestKV(t)
		for _, kvp := range [][2]string{{"p.a", "1"}, {"p.b", "1"}, {"p.a", "2"}, {"q.a", "1"}} {
			if _, err := kv.Put(ctx, kvp[0], []byte(kvp[1])); err != nil {
				t.Fatal(err)
			}
		}
		if err := kv.Delete(ctx, "p.b"); err != nil {
			t.Fatal(err)
		}
		w, err := kv.Watch(ctx, "p.>", tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for {
			e := recvEntry(t, w)
			got = append(got, describe(e))
			if e.Revision == 0 {
				break
			}
			if e.Time.Location() != time.UTC || e.Time.IsZero() {
				t.Errorf("entry time %v: want server time in UTC", e.Time)
			}
		}
		if _, err := kv.Put(ctx, "p.c", []byte("1")); err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, "q.z", []byte("1")); err != nil { // not watched
			t.Fatal(err)
		}
		got = append(got, describe(recvEntry(t, w)))
		if s := strings.Join(got, " "); s != tc.want {
			t.Errorf("watch %+v: %s, want %s", tc.opts, s, tc.want)
		}
		if err := w.Stop(); err != nil {
			t.Fatal(err)
		}
		if _, ok := <-w.Updates(); ok {
			t.Fatalf("updates still open after Stop")
		}
		if err := w.Stop(); err != nil {
			t.Fatalf("second Stop: %v", err)
		}
	}
}

// A watch ends with its context, and a Stop while the watcher has entries
// nobody reads does not hang.
func TestJetStreamKVWatchEnds(t *testing.T) {
	t.Parallel()
	kv, _ := newTestKV(t)
	ctx := testCtx(t)
	for i := range 300 { // more than the 256 the NATS watcher buffers
		if _, err := kv.Put(ctx, fmt.Sprintf("k.%d", i%10), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	w, err := kv.Watch(ctx, ">", events.WatchOptions{History: true})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // let the NATS side fill up
	done := make(chan struct{})
	go func() { _ = w.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop hung with unread entries")
	}

	wctx, cancel := context.WithCancel(ctx)
	w, err = kv.Watch(wctx, "k.1", events.WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if e := recvEntry(t, w); e.Key != "k.1" {
		t.Fatalf("first entry %+v", e)
	}
	cancel()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-w.Updates():
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("watch still open 10s after its context ended")
		}
	}
}

func TestJetStreamConformance(t *testing.T) {
	eventstest.Run(t, eventstest.Harness{
		NewLog: func(t *testing.T, codec *events.Registry) events.Log {
			l, _, _ := newTestLog(t, codec)
			return l
		},
		NewKV: func(t *testing.T) events.KV {
			kv, _ := newTestKV(t)
			return kv
		},
		Advance:     func(t *testing.T, d time.Duration) { time.Sleep(d) },
		DedupWindow: testDedupWindow,
		Batches:     true,
	})
}

// A bucket whose stream does not allow atomic publish answers a batch with
// ErrBatchUnsupported and writes nothing; so does one that stopped allowing
// it after the KV was opened (the server refuses the commit).
func TestJetStreamBatchUnsupported(t *testing.T) {
	js, _ := newJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "plain", History: 4, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	kv, err := events.NewJetStreamKV(ctx, js, "plain")
	if err != nil {
		t.Fatal(err)
	}
	if kv.Batches() {
		t.Fatal("Batches() on a bucket without allow_atomic")
	}
	if _, err := kv.WriteBatch(ctx, []events.KVWrite{{Key: "a.leader", Value: []byte("x")}}); !errors.Is(err, events.ErrBatchUnsupported) {
		t.Fatalf("WriteBatch on a bucket without allow_atomic: %v, want ErrBatchUnsupported", err)
	}

	kvb, jsb := newTestKV(t)
	if !kvb.Batches() {
		t.Fatal("Batches() false on a bucket with allow_atomic")
	}
	allowAtomic(t, jsb, "KV_kv", false)
	_, err = kvb.WriteBatch(ctx, []events.KVWrite{{Key: "a.leader", Value: []byte("x")}, {Key: "b.leader", Value: []byte("y")}})
	if !errors.Is(err, events.ErrBatchUnsupported) {
		t.Fatalf("WriteBatch after allow_atomic was turned off: %v, want ErrBatchUnsupported", err)
	}
	if _, err := kvb.Get(ctx, "a.leader"); !errors.Is(err, events.ErrNotFound) {
		t.Fatalf("a.leader after the refused batch: %v, want ErrNotFound", err)
	}
}

// A log on a stream that takes no atomic batches (here: one not synced on
// every write, where the server refuses them) says so and answers a batch
// with ErrBatchUnsupported; so does one whose stream stopped allowing them
// after it was opened, and nothing is stored.
func TestJetStreamLogBatchUnsupported(t *testing.T) {
	codec := testCodec(t)
	bulk, _, _ := newBulkLog(t, codec)
	if bulk.Batches() {
		t.Fatal("Batches() on a stream without allow_atomic")
	}
	data, err := codec.Encode(&jsTestEvent{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := bulk.AppendBatch(ctx, []events.LogAppend{{Subject: "ev.a", Data: data}}); !errors.Is(err, events.ErrBatchUnsupported) {
		t.Fatalf("AppendBatch on a stream without allow_atomic: %v, want ErrBatchUnsupported", err)
	}

	log, js, _ := newTestLog(t, codec)
	if !log.Batches() {
		t.Fatal("Batches() false on a stream allowing atomic publish")
	}
	allowAtomic(t, js, testStream, false)
	if _, err := log.AppendBatch(ctx, []events.LogAppend{{Subject: "ev.a", Data: data}, {Subject: "ev.b", Data: data}}); !errors.Is(err, events.ErrBatchUnsupported) {
		t.Fatalf("AppendBatch after allow_atomic was turned off: %v, want ErrBatchUnsupported", err)
	}
	if seq, err := log.LastSequence(ctx, "ev.a"); err != nil || seq != 0 {
		t.Fatalf("ev.a after the refused batch: %d, %v; want nothing", seq, err)
	}
}

// allowAtomic turns atomic batch publish on or off on stream.
func allowAtomic(tb testing.TB, js jetstream.JetStream, stream string, on bool) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		tb.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	cfg.AllowAtomicPublish = on
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		tb.Fatalf("allow_atomic %v on %s: %v", on, stream, err)
	}
}

// A batch whose connection fails before its commit is sent wrote nothing,
// and says so with ErrBatchNotCommitted — never ErrBatchUnsupported, which
// would turn a node's batches off though the stream takes them (a real
// 10,000-pair takeover whose connection was given up ran a minute
// without batches so). After the reconnection batches land again.
func TestJetStreamBatchNotCommittedOnABrokenConnection(t *testing.T) {
	codec := testCodec(t)
	_, js, account := newTestLog(t, codec)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "kv", History: 4, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	allowAtomic(t, js, "KV_kv", true)

	p := newCutProxy(t, testNATS.srv.Addr().String())
	nc, err := nats.Connect("nats://"+p.addr(), nats.UserInfo(account, ""), nats.MaxReconnects(-1),
		nats.ReconnectWait(20*time.Millisecond), nats.ReconnectBufSize(-1)) // as runtime.Connect: nothing buffered while reconnecting
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	pjs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := events.NewJetStreamKV(ctx, pjs, "kv")
	if err != nil {
		t.Fatal(err)
	}
	log, err := events.NewJetStreamLog(pjs, testStream, codec)
	if err != nil {
		t.Fatal(err)
	}
	data, err := codec.Encode(&jsTestEvent{})
	if err != nil {
		t.Fatal(err)
	}

	p.cut(true)
	for deadline := time.Now().Add(10 * time.Second); nc.IsConnected(); {
		if time.Now().After(deadline) {
			t.Fatal("the client still connected 10 s after its proxy was cut")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, n := range []int{1, 3} { // 1: the commit is the only message; 3: two before it
		writes := make([]events.KVWrite, n)
		appends := make([]events.LogAppend, n)
		for i := range n {
			writes[i] = events.KVWrite{Key: fmt.Sprintf("p%d.leader", i), Value: []byte("x")}
			appends[i] = events.LogAppend{Subject: fmt.Sprintf("ev.p%d", i), Data: data}
		}
		_, err := kv.WriteBatch(ctx, writes)
		if !errors.Is(err, events.ErrBatchNotCommitted) || errors.Is(err, events.ErrBatchUnsupported) {
			t.Fatalf("WriteBatch of %d while reconnecting: %v; want ErrBatchNotCommitted only", n, err)
		}
		_, err = log.AppendBatch(ctx, appends)
		if !errors.Is(err, events.ErrBatchNotCommitted) || errors.Is(err, events.ErrBatchUnsupported) {
			t.Fatalf("AppendBatch of %d while reconnecting: %v; want ErrBatchNotCommitted only", n, err)
		}
	}

	p.cut(false)
	for deadline := time.Now().Add(10 * time.Second); !nc.IsConnected(); {
		if time.Now().After(deadline) {
			t.Fatal("the client not reconnected 10 s after its proxy was healed")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := kv.WriteBatch(ctx, []events.KVWrite{{Key: "p0.leader", Value: []byte("x")}, {Key: "p1.leader", Value: []byte("y")}}); err != nil {
		t.Fatalf("WriteBatch after the reconnection: %v", err)
	}
	if _, err := log.AppendBatch(ctx, []events.LogAppend{{Subject: "ev.p0", Data: data}, {Subject: "ev.p1", Data: data}}); err != nil {
		t.Fatalf("AppendBatch after the reconnection: %v", err)
	}
	if seq, err := log.LastSequence(ctx, "ev.p2"); err != nil || seq != 0 {
		t.Fatalf("ev.p2, appended only while reconnecting: %d, %v; want nothing stored", seq, err)
	}
}

// cutProxy forwards TCP connections to a server; cut(true) closes every
// connection and refuses new ones until cut(false).
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	down   bool
	conns  []net.Conn
}

func newCutProxy(tb testing.TB, target string) *cutProxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	tb.Cleanup(func() { ln.Close(); p.cut(true) })
	go p.accept()
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.down {
			p.mu.Unlock()
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(s, c); s.Close() }()
		go func() { _, _ = io.Copy(c, s); c.Close() }()
	}
}

func (p *cutProxy) cut(down bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if down {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}
