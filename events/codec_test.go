package events

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// --- test event types ----------------------------------------------------------

// testHeartbeat is shaped like a member heartbeat: pair, site, term,
// revision, a server time, a duration and a few labels.
type testHeartbeat struct {
	Pair     string            `msgpack:"p" json:"p"`
	Site     string            `msgpack:"s" json:"s"`
	Term     uint64            `msgpack:"tm" json:"tm"`
	Revision uint64            `msgpack:"r" json:"r"`
	At       time.Time         `msgpack:"at" json:"at"`
	Timeout  time.Duration     `msgpack:"to" json:"to"`
	Labels   map[string]string `msgpack:"l,omitempty" json:"l,omitempty"`
}

func (*testHeartbeat) EventType() string { return "test.heartbeat" }

// testPromotedV1 is the version 1 body of test.promoted, kept to write old data.
type testPromotedV1 struct {
	Pair    string `msgpack:"p"`
	Primary string `msgpack:"pr"`
	Term    uint64 `msgpack:"tm"`
}

// testPromoted is version 2 of test.promoted: "pr" became "s", and From,
// Steps and Votes were added. Votes is a map msgpack does not sort.
type testPromoted struct {
	Pair  string         `msgpack:"p"`
	Site  string         `msgpack:"s"`
	From  string         `msgpack:"f,omitempty"`
	Term  uint64         `msgpack:"tm"`
	Steps []testStep     `msgpack:"st,omitempty"`
	Votes map[string]int `msgpack:"vo,omitempty"`
}

func (*testPromoted) EventType() string { return "test.promoted" }

type testStep struct {
	Name string        `msgpack:"n"`
	Took time.Duration `msgpack:"d"`
	At   *time.Time    `msgpack:"at,omitempty"`
}

func upcastPromotedV1(body []byte) ([]byte, error) {
	var v1 testPromotedV1
	if err := UnmarshalValue(body, &v1); err != nil {
		return nil, err
	}
	return MarshalValue(&testPromoted{Pair: v1.Pair, Site: v1.Primary, Term: v1.Term})
}

// testAudit holds times in every place msgpack can put one.
type testAudit struct {
	At     time.Time            `msgpack:"at"`
	Last   *time.Time           `msgpack:"l"`
	Pair   [2]time.Time         `msgpack:"pa"`
	Seen   map[string]time.Time `msgpack:"se"`
	ByTime map[time.Time]string `msgpack:"bt"`
	Steps  []testStep           `msgpack:"st"`
	Extra  map[string]any       `msgpack:"x"`
	Any    any                  `msgpack:"an"`
}

func (*testAudit) EventType() string { return "test.audit" }

// testNamed lets one Go type stand for any type name.
type testNamed struct {
	name string
	N    int `msgpack:"n"`
}

func (e *testNamed) EventType() string { return e.name }

// testImpostor claims a name registered for another Go type.
type testImpostor struct {
	Pair string `msgpack:"p"`
}

func (*testImpostor) EventType() string { return "test.heartbeat" }

// testValue is an event used as a value, not a pointer.
type testValue struct {
	N int `msgpack:"n"`
}

func (testValue) EventType() string { return "test.value" }

// testRegistry knows test.heartbeat v1 and test.promoted v2 (upcast from v1).
func testRegistry(tb testing.TB) *Registry {
	tb.Helper()
	r := NewRegistry()
	if err := r.Register(&testHeartbeat{}, 1); err != nil {
		tb.Fatal(err)
	}
	if err := r.Register(&testPromoted{}, 2); err != nil {
		tb.Fatal(err)
	}
	if err := r.RegisterUpcast("test.promoted", 1, upcastPromotedV1); err != nil {
		tb.Fatal(err)
	}
	return r
}

// referenceEnvelope encodes an envelope with plain msgpack.Marshal, not
// with the codec under test.
func referenceEnvelope(tb testing.TB, typ string, version uint16, body any) []byte {
	tb.Helper()
	var raw []byte
	if body != nil {
		var buf bytes.Buffer
		enc := msgpack.NewEncoder(&buf)
		enc.SetSortMapKeys(true)
		if err := enc.Encode(body); err != nil {
			tb.Fatal(err)
		}
		raw = buf.Bytes()
	}
	data, err := msgpack.Marshal(&envelope{Type: typ, Version: version, Body: raw})
	if err != nil {
		tb.Fatal(err)
	}
	return data
}

// plainDecode decodes with msgpack alone, as another reader would.
func plainDecode(b []byte, v any) error {
	return msgpack.NewDecoder(bytes.NewReader(b)).Decode(v)
}

// mustMarshal is msgpack.Marshal for hand-built envelopes.
func mustMarshal(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func promotedEvent() *testPromoted {
	at := time.Date(2025, 3, 14, 3, 12, 9, 500, time.UTC)
	return &testPromoted{
		Pair: "pg-main", Site: "shop", From: "basement", Term: 43,
		Steps: []testStep{{Name: "fence", Took: 1500 * time.Millisecond, At: &at}, {Name: "promote", Took: 20 * time.Millisecond}},
		Votes: map[string]int{"basement": 0, "shop": 2, "cloud": 1},
	}
}

// --- round trips -------------------------------------------------------------------

func TestEncodeDecodeRoundTrip(t *testing.T) {
	reg := testRegistry(t)
	for _, ev := range []Event{benchEvent(), promotedEvent(), &testHeartbeat{}, &testPromoted{Pair: "p"}} {
		t.Run(fmt.Sprintf("%T", ev), func(t *testing.T) {
			data, err := reg.Encode(ev)
			if err != nil {
				t.Fatal(err)
			}
			got, err := reg.Decode("ev.pair.pg-main", 3, data)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, ev) {
				t.Fatalf("decoded %#v\nwant %#v", got, ev)
			}
		})
	}
}

func TestDecodedTimesAreUTC(t *testing.T) {
	reg := NewRegistry()
	reg.MustRegister(&testAudit{}, 1)
	// A zone east of UTC, so a decoded local time differs in every field.
	zone := time.FixedZone("UTC+5", 5*3600)
	at := time.Date(2025, 3, 14, 8, 12, 7, 123456789, zone)
	ev := &testAudit{
		At:     at,
		Last:   &at,
		Pair:   [2]time.Time{at, at.Add(time.Second)},
		Seen:   map[string]time.Time{"a": at, "b": at.Add(time.Minute)},
		ByTime: map[time.Time]string{at: "first"},
		Steps:  []testStep{{Name: "s", At: &at}},
		Extra:  map[string]any{"when": at, "list": []any{at, "x"}, "nested": map[string]any{"when": at}},
		Any:    at,
	}
	data, err := reg.Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	got, err := reg.Decode("ev.audit.x", 1, data)
	if err != nil {
		t.Fatal(err)
	}
	a := got.(*testAudit)
	check := func(what string, v any) {
		t.Helper()
		tm, ok := v.(time.Time)
		if !ok {
			t.Fatalf("%s: got %T, want time.Time", what, v)
		}
		if tm.Location() != time.UTC || !tm.Equal(at) && !tm.Equal(at.Add(time.Second)) && !tm.Equal(at.Add(time.Minute)) {
			t.Errorf("%s = %v (%v), want %v in UTC", what, tm, tm.Location(), at.UTC())
		}
	}
	check("At", a.At)
	check("*Last", *a.Last)
	check("Pair[0]", a.Pair[0])
	check("Pair[1]", a.Pair[1])
	check("Seen[a]", a.Seen["a"])
	check("Seen[b]", a.Seen["b"])
	if len(a.ByTime) != 1 {
		t.Fatalf("ByTime has %d keys, want 1", len(a.ByTime))
	}
	for k := range a.ByTime {
		check("ByTime key", k)
	}
	check("Steps[0].At", *a.Steps[0].At)
	check("Extra[when]", a.Extra["when"])
	check("Extra[list][0]", a.Extra["list"].([]any)[0])
	check("Extra[nested][when]", a.Extra["nested"].(map[string]any)["when"])
	check("Any", a.Any)
	// The precise form: a UTC time equal field by field to the original.
	if want := at.UTC(); a.At != want {
		t.Errorf("At = %#v, want %#v", a.At, want)
	}
}

func TestZeroTimeStaysZero(t *testing.T) {
	reg := testRegistry(t)
	data, err := reg.Encode(&testHeartbeat{Pair: "p"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := reg.Decode("s", 1, data)
	if err != nil {
		t.Fatal(err)
	}
	if at := got.(*testHeartbeat).At; !at.IsZero() || at != (time.Time{}) {
		t.Fatalf("zero time decoded as %#v", at)
	}
}

// --- wire format ---------------------------------------------------------------------

// TestEncodeMatchesReferenceLayout holds the hand-written envelope to what
// msgpack writes for the envelope struct, short names and long ones.
func TestEncodeMatchesReferenceLayout(t *testing.T) {
	reg := testRegistry(t)
	for _, n := range []int{1, 31, 32, 255, 256, 70000} {
		name := strings.Repeat("n", n)
		if err := reg.Register(&testNamed{name: name}, 300); err != nil {
			t.Fatal(err)
		}
		ev := &testNamed{name: name, N: n}
		got, err := reg.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		if want := referenceEnvelope(t, name, 300, ev); !bytes.Equal(got, want) {
			t.Errorf("name of %d bytes: Encode = %x\nwant %x", n, got[:min(len(got), 64)], want[:min(len(want), 64)])
		}
	}
	hb := benchEvent()
	got, err := reg.Encode(hb)
	if err != nil {
		t.Fatal(err)
	}
	if want := referenceEnvelope(t, hb.EventType(), 1, hb); !bytes.Equal(got, want) {
		t.Errorf("heartbeat: Encode = %x\nwant %x", got, want)
	}
	// The stored form is a map with short keys, never an array.
	var m map[string]any
	if err := plainDecode(got, &m); err != nil {
		t.Fatal(err)
	}
	if len(m) != 3 || m["t"] != "test.heartbeat" || m["b"] == nil {
		t.Errorf("envelope as a map: %v", m)
	}
}

// TestEncodeIsDeterministic: the simulator digests encoded events, so a map
// msgpack leaves in Go's random order must still give the same bytes.
func TestEncodeIsDeterministic(t *testing.T) {
	reg := testRegistry(t)
	ev := promotedEvent()
	ev.Votes = map[string]int{}
	for i := range 40 {
		ev.Votes[fmt.Sprintf("site-%02d", i)] = i
	}
	first, err := reg.Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	for range 30 {
		again, err := reg.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(first, again) {
			t.Fatalf("two encodings of one event differ:\n%x\n%x", first, again)
		}
	}
	got, err := reg.Decode("s", 1, first)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, ev) {
		t.Fatalf("decoded %#v, want %#v", got, ev)
	}
	// Still plain msgpack for any other reader.
	var env envelope
	if err := plainDecode(first, &env); err != nil || env.Type != "test.promoted" || env.Version != 2 {
		t.Fatalf("reference decode: %+v, %v", env, err)
	}
}

// --- unknown events -----------------------------------------------------------------

func TestUnknownTypeKeepsBytes(t *testing.T) {
	writer := NewRegistry()
	writer.MustRegister(&testNamed{name: "test.future"}, 4)
	data, err := writer.Encode(&testNamed{name: "test.future", N: 9})
	if err != nil {
		t.Fatal(err)
	}
	input := bytes.Clone(data)

	reg := testRegistry(t)
	ev, err := reg.Decode("ev.x.y", 12, data)
	if err != nil {
		t.Fatal(err)
	}
	u, ok := ev.(*Unknown)
	if !ok {
		t.Fatalf("got %T, want *Unknown", ev)
	}
	if u.Type != "test.future" || u.EventType() != "test.future" || u.Version != 4 {
		t.Errorf("unknown = %q v%d", u.Type, u.Version)
	}
	if !bytes.Equal(u.Raw, input) {
		t.Errorf("Raw = %x, want %x", u.Raw, input)
	}
	if want := mustMarshal(t, &testNamed{N: 9}); !bytes.Equal(u.Body, want) {
		t.Errorf("Body = %x, want %x", u.Body, want)
	}
	// Unknown keeps its own copy: the caller may reuse its buffer.
	for i := range data {
		data[i] = 0xc1
	}
	again, err := reg.Encode(u)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, input) {
		t.Errorf("re-encoded unknown = %x, want %x", again, input)
	}
	// Growing Body must not write into Raw.
	_ = append(u.Body, 0xff)
	if !bytes.Equal(u.Raw, input) {
		t.Errorf("appending to Body changed Raw")
	}
}

func TestUnknownVersion(t *testing.T) {
	hb := benchEvent()
	// A registry that knows test.heartbeat at v3, upcasting only from v2.
	reg := NewRegistry()
	reg.MustRegister(&testHeartbeat{}, 3)
	if err := reg.RegisterUpcast("test.heartbeat", 2, func(b []byte) ([]byte, error) { return b, nil }); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		version uint16
		unknown bool
	}{
		{version: 4, unknown: true},     // newer than this build
		{version: 65535, unknown: true}, // far newer
		{version: 3, unknown: false},    // current
		{version: 2, unknown: false},    // upcast 2 -> 3
		{version: 1, unknown: true},     // no upcaster from 1
	} {
		data := referenceEnvelope(t, "test.heartbeat", tc.version, hb)
		ev, err := reg.Decode("s", uint64(tc.version), data)
		if err != nil {
			t.Fatalf("v%d: %v", tc.version, err)
		}
		u, isUnknown := ev.(*Unknown)
		if isUnknown != tc.unknown {
			t.Fatalf("v%d: got %T, unknown=%v", tc.version, ev, tc.unknown)
		}
		if isUnknown {
			if u.Version != tc.version || !bytes.Equal(u.Raw, data) {
				t.Errorf("v%d: unknown version %d raw %x", tc.version, u.Version, u.Raw)
			}
			continue
		}
		if !reflect.DeepEqual(ev, hb) {
			t.Errorf("v%d: decoded %#v, want %#v", tc.version, ev, hb)
		}
	}
}

func TestUnknownWithoutBody(t *testing.T) {
	reg := testRegistry(t)
	data := mustMarshal(t, map[string]any{"t": "test.later", "v": 1})
	ev, err := reg.Decode("s", 1, data)
	if err != nil {
		t.Fatal(err)
	}
	u, ok := ev.(*Unknown)
	if !ok || u.Body != nil || !bytes.Equal(u.Raw, data) {
		t.Fatalf("got %#v", ev)
	}
}

func TestEnvelopeExtraKeysAreIgnored(t *testing.T) {
	reg := testRegistry(t)
	hb := benchEvent()
	data := mustMarshal(t, map[string]any{
		"t": "test.heartbeat", "v": uint8(1), "b": msgpack.RawMessage(mustMarshal(t, hb)),
		"meta": map[string]any{"trace": []any{1, "two"}}, "x": nil,
	})
	ev, err := reg.Decode("s", 1, data)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ev, hb) {
		t.Fatalf("decoded %#v, want %#v", ev, hb)
	}
}

// --- corrupt input ---------------------------------------------------------------------

func TestCorruptInputs(t *testing.T) {
	reg := testRegistry(t)
	good, err := reg.Encode(benchEvent())
	if err != nil {
		t.Fatal(err)
	}
	hbBody := msgpack.RawMessage(mustMarshal(t, benchEvent()))
	nested := func(depth int) []byte {
		b := bytes.Repeat([]byte{0x91}, depth)
		return append(b, 0xc0)
	}
	for _, tc := range []struct {
		name string
		data []byte
		typ  string // DecodeError.Type, when the envelope was readable
	}{
		{name: "nil", data: nil},
		{name: "empty", data: []byte{}},
		{name: "garbage", data: []byte("not msgpack at all")},
		{name: "reserved code", data: []byte{0xc1}},
		{name: "one byte of map", data: good[:1]},
		{name: "truncated half", data: good[:len(good)/2]},
		{name: "truncated last byte", data: good[:len(good)-1]},
		{name: "trailing byte", data: append(bytes.Clone(good), 0)},
		{name: "two envelopes", data: append(bytes.Clone(good), good...)},
		{name: "array envelope", data: mustMarshal(t, []any{"test.heartbeat", 1, hbBody})},
		{name: "no type", data: mustMarshal(t, map[string]any{"v": 1, "b": hbBody})},
		{name: "nil type", data: mustMarshal(t, map[string]any{"t": nil, "v": 1, "b": hbBody})},
		{name: "empty type", data: mustMarshal(t, map[string]any{"t": "", "v": 1, "b": hbBody})},
		{name: "int type", data: mustMarshal(t, map[string]any{"t": 7, "v": 1, "b": hbBody})},
		{name: "no version", data: mustMarshal(t, map[string]any{"t": "test.heartbeat", "b": hbBody})},
		{name: "version zero", data: mustMarshal(t, map[string]any{"t": "test.heartbeat", "v": 0, "b": hbBody})},
		{name: "negative version", data: mustMarshal(t, map[string]any{"t": "test.heartbeat", "v": -1, "b": hbBody})},
		{name: "version too big", data: mustMarshal(t, map[string]any{"t": "test.heartbeat", "v": 70000, "b": hbBody})},
		{name: "string version", data: mustMarshal(t, map[string]any{"t": "test.heartbeat", "v": "1", "b": hbBody})},
		{name: "non-string key", data: mustMarshal(t, map[any]any{"t": "test.heartbeat", "v": 1, 3: 4})},
		{name: "duplicate type", data: append([]byte{0x84, 0xa1, 't', 0xa1, 'x', 0xa1, 't', 0xa1, 'y', 0xa1, 'v', 0x01, 0xa1, 'b'}, hbBody...)},
		{name: "unknown type too deep", data: append([]byte{0x83, 0xa1, 't', 0xa1, 'x', 0xa1, 'v', 0x01, 0xa1, 'b'}, nested(maxDepth+1)...)},
		{name: "megabyte of nesting", data: append([]byte{0x81, 0xa1, 'z'}, nested(1<<20)...)},
		{name: "huge array claim", data: append([]byte{0x83, 0xa1, 't', 0xa1, 'x', 0xa1, 'v', 0x01, 0xa1, 'b'}, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x01)},
		{name: "huge string claim", data: append([]byte{0x83, 0xa1, 't', 0xa1, 'x', 0xa1, 'v', 0x01, 0xa1, 'b'}, 0xdb, 0xff, 0xff, 0xff, 0xff, 'a')},
		{name: "huge map claim", data: []byte{0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 't'}},
		{name: "no body", data: mustMarshal(t, map[string]any{"t": "test.heartbeat", "v": 1}), typ: "test.heartbeat"},
		{name: "body is a string", data: mustMarshal(t, map[string]any{"t": "test.heartbeat", "v": 1, "b": "hello"}), typ: "test.heartbeat"},
		{name: "body field of wrong type", data: mustMarshal(t, map[string]any{"t": "test.heartbeat", "v": 1, "b": map[string]any{"p": []int{1}}}), typ: "test.heartbeat"},
		{name: "body time of wrong size", data: mustMarshal(t, map[string]any{"t": "test.heartbeat", "v": 1, "b": map[string]any{"at": &msgpack.RawMessage{0xd5, 0xff, 0, 0}}}), typ: "test.heartbeat"},
		{name: "v1 body the upcaster rejects", data: mustMarshal(t, map[string]any{"t": "test.promoted", "v": 1, "b": "not a struct"}), typ: "test.promoted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const subject, seq = "ev.pair.pg-main.basement", 424242
			ev, err := reg.Decode(subject, seq, tc.data)
			if err == nil {
				t.Fatalf("decoded %#v, want an error", ev)
			}
			if ev != nil {
				t.Errorf("got event %#v with the error", ev)
			}
			assertCorrupt(t, err, subject, seq)
			var de *DecodeError
			errors.As(err, &de)
			if de.Type != tc.typ {
				t.Errorf("DecodeError.Type = %q, want %q (%v)", de.Type, tc.typ, err)
			}
		})
	}
}

// assertCorrupt checks the contract of every Decode error.
func assertCorrupt(t testing.TB, err error, subject string, seq uint64) {
	t.Helper()
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("error %v does not wrap ErrCorrupt", err)
	}
	var de *DecodeError
	if !errors.As(err, &de) {
		t.Fatalf("error %T %v is not a *DecodeError", err, err)
	}
	if de.Subject != subject || de.Sequence != seq || de.Err == nil {
		t.Fatalf("DecodeError = %+v, want subject %q sequence %d and a cause", de, subject, seq)
	}
	msg := err.Error()
	if !strings.Contains(msg, fmt.Sprintf("%q", subject)) || !strings.Contains(msg, fmt.Sprintf("sequence %d", seq)) {
		t.Fatalf("message %q does not name subject %q and sequence %d", msg, subject, seq)
	}
}

func TestDecodeRecordNamesRecord(t *testing.T) {
	reg := testRegistry(t)
	_, err := reg.DecodeRecord(Record{Subject: "ev.pair.pg-main", Sequence: 99, Data: []byte{0x92}})
	assertCorrupt(t, err, "ev.pair.pg-main", 99)

	data, err := reg.Encode(benchEvent())
	if err != nil {
		t.Fatal(err)
	}
	ev, err := reg.DecodeRecord(Record{Subject: "ev.pair.pg-main", Sequence: 100, Data: data})
	if err != nil || !reflect.DeepEqual(ev, benchEvent()) {
		t.Fatalf("DecodeRecord = %#v, %v", ev, err)
	}
}

// --- upcasting --------------------------------------------------------------------------

func TestUpcastV1ToV2(t *testing.T) {
	reg := testRegistry(t)
	data := referenceEnvelope(t, "test.promoted", 1, &testPromotedV1{Pair: "pg-main", Primary: "shop", Term: 7})
	ev, err := reg.Decode("ev.pair.pg-main", 5, data)
	if err != nil {
		t.Fatal(err)
	}
	want := &testPromoted{Pair: "pg-main", Site: "shop", Term: 7}
	if !reflect.DeepEqual(ev, want) {
		t.Fatalf("decoded %#v, want %#v", ev, want)
	}
	// Re-encoding writes the current version.
	again, err := reg.Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	if ref := referenceEnvelope(t, "test.promoted", 2, want); !bytes.Equal(again, ref) {
		t.Fatalf("re-encoded %x, want %x", again, ref)
	}
}

func TestUpcastChain(t *testing.T) {
	reg := NewRegistry()
	reg.MustRegister(&testNamed{name: "test.chain"}, 3)
	var calls []string
	step := func(from uint16) Upcaster {
		return func(body []byte) ([]byte, error) {
			calls = append(calls, fmt.Sprintf("%d->%d", from, from+1))
			var v testNamed
			if err := UnmarshalValue(body, &v); err != nil {
				return nil, err
			}
			v.N *= 10
			return MarshalValue(&v)
		}
	}
	for _, from := range []uint16{2, 1} { // order of registration does not matter
		if err := reg.RegisterUpcast("test.chain", from, step(from)); err != nil {
			t.Fatal(err)
		}
	}
	data := referenceEnvelope(t, "test.chain", 1, &testNamed{N: 4})
	ev, err := reg.Decode("s", 1, data)
	if err != nil {
		t.Fatal(err)
	}
	if got := ev.(*testNamed).N; got != 400 {
		t.Errorf("N = %d, want 400", got)
	}
	if want := []string{"1->2", "2->3"}; !reflect.DeepEqual(calls, want) {
		t.Errorf("upcasts ran %v, want %v", calls, want)
	}
	calls = nil
	if _, err := reg.Decode("s", 2, referenceEnvelope(t, "test.chain", 3, &testNamed{N: 4})); err != nil || len(calls) != 0 {
		t.Errorf("current version: err %v, upcasts %v", err, calls)
	}
}

func TestUpcasterFailures(t *testing.T) {
	for _, tc := range []struct {
		name string
		fn   Upcaster
	}{
		{name: "error", fn: func([]byte) ([]byte, error) { return nil, errors.New("field x missing") }},
		{name: "invalid msgpack", fn: func([]byte) ([]byte, error) { return []byte{0x92, 0x01}, nil }},
		{name: "two values", fn: func([]byte) ([]byte, error) { return []byte{0x80, 0x80}, nil }},
		{name: "panic", fn: func([]byte) ([]byte, error) { panic("upcaster bug") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := NewRegistry()
			reg.MustRegister(&testNamed{name: "test.up"}, 2)
			if err := reg.RegisterUpcast("test.up", 1, tc.fn); err != nil {
				t.Fatal(err)
			}
			ev, err := reg.Decode("ev.up", 8, referenceEnvelope(t, "test.up", 1, &testNamed{N: 1}))
			if err == nil {
				t.Fatalf("decoded %#v", ev)
			}
			assertCorrupt(t, err, "ev.up", 8)
			var de *DecodeError
			if errors.As(err, &de); de.Type != "test.up" {
				t.Errorf("Type = %q", de.Type)
			}
		})
	}
}

// --- registration and encode errors -------------------------------------------------------

func TestRegisterRules(t *testing.T) {
	reg := testRegistry(t)
	var nilHB *testHeartbeat
	for _, tc := range []struct {
		name string
		err  error
	}{
		{name: "nil", err: reg.Register(nil, 1)},
		{name: "typed nil", err: reg.Register(nilHB, 1)},
		{name: "not a pointer", err: reg.Register(testValue{}, 1)},
		{name: "empty name", err: reg.Register(&testNamed{}, 1)},
		{name: "version zero", err: reg.Register(&testNamed{name: "test.v0"}, 0)},
		{name: "name taken by another type", err: reg.Register(&testImpostor{}, 1)},
		{name: "other version", err: reg.Register(&testHeartbeat{}, 2)},
		{name: "upcast of unknown type", err: reg.RegisterUpcast("test.none", 1, upcastPromotedV1)},
		{name: "upcast from zero", err: reg.RegisterUpcast("test.promoted", 0, upcastPromotedV1)},
		{name: "upcast from current", err: reg.RegisterUpcast("test.promoted", 2, upcastPromotedV1)},
		{name: "nil upcaster", err: reg.RegisterUpcast("test.promoted", 1, nil)},
	} {
		if !errors.Is(tc.err, ErrInvalidRegistration) {
			t.Errorf("%s: error %v, want ErrInvalidRegistration", tc.name, tc.err)
		}
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("MustRegister of a bad prototype did not panic")
			}
		}()
		reg.MustRegister(&testNamed{}, 1)
	}()

	// Registering the same thing again is harmless and keeps the upcaster.
	if err := reg.Register(&testPromoted{}, 2); err != nil {
		t.Fatal(err)
	}
	ev, err := reg.Decode("s", 1, referenceEnvelope(t, "test.promoted", 1, &testPromotedV1{Primary: "shop"}))
	if err != nil || ev.(*testPromoted).Site != "shop" {
		t.Fatalf("after re-registration: %#v, %v", ev, err)
	}
}

func TestZeroRegistryWorks(t *testing.T) {
	var reg Registry
	if _, err := reg.Encode(benchEvent()); !errors.Is(err, ErrUnregistered) {
		t.Fatalf("encode on empty registry: %v", err)
	}
	reg.MustRegister(&testHeartbeat{}, 1)
	data, err := reg.Encode(benchEvent())
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := reg.Decode("s", 1, data); err != nil || !reflect.DeepEqual(ev, benchEvent()) {
		t.Fatalf("Decode = %#v, %v", ev, err)
	}
}

func TestEncodeErrors(t *testing.T) {
	reg := testRegistry(t)
	var nilHB *testHeartbeat
	var nilUnknown *Unknown
	for _, tc := range []struct {
		name string
		ev   Event
	}{
		{name: "nil", ev: nil},
		{name: "typed nil", ev: nilHB},
		{name: "unregistered", ev: &testNamed{name: "test.nobody"}},
		{name: "registered name, other Go type", ev: &testImpostor{Pair: "p"}},
		{name: "unknown without bytes", ev: &Unknown{Type: "test.x", Version: 1}},
		{name: "nil unknown", ev: nilUnknown},
	} {
		data, err := reg.Encode(tc.ev)
		if !errors.Is(err, ErrUnregistered) || data != nil {
			t.Errorf("%s: Encode = %x, %v; want ErrUnregistered", tc.name, data, err)
		}
	}
	// A body msgpack cannot write is an encode error, not a panic.
	reg.MustRegister(&testChan{}, 1)
	if _, err := reg.Encode(&testChan{C: make(chan int)}); err == nil {
		t.Error("Encode of a channel field succeeded")
	}
}

type testChan struct {
	C chan int `msgpack:"c"`
}

func (*testChan) EventType() string { return "test.chan" }

func TestValueEvents(t *testing.T) {
	reg := NewRegistry()
	reg.MustRegister(&testValue{}, 1)
	data, err := reg.Encode(testValue{N: 3})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := reg.Decode("s", 1, data)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := ev.(*testValue); !ok || got.N != 3 {
		t.Fatalf("decoded %#v", ev)
	}
}

// TestConcurrentUse runs encoders, decoders and registrations at once;
// the race detector is the judge.
func TestConcurrentUse(t *testing.T) {
	reg := testRegistry(t)
	v1 := referenceEnvelope(t, "test.promoted", 1, &testPromotedV1{Pair: "p", Primary: "s"})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				ev := benchEvent()
				ev.Term = uint64(g*1000 + i)
				data, err := reg.Encode(ev)
				if err != nil {
					t.Error(err)
					return
				}
				got, err := reg.Decode("s", uint64(i), data)
				if err != nil || got.(*testHeartbeat).Term != ev.Term {
					t.Errorf("round trip: %#v, %v", got, err)
					return
				}
				if _, err := reg.Decode("s", uint64(i), v1); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 200 {
			name := fmt.Sprintf("test.late.%d", i)
			if err := reg.Register(&testNamed{name: name}, 2); err != nil {
				t.Error(err)
				return
			}
			if err := reg.RegisterUpcast(name, 1, upcastPromotedV1); err != nil {
				t.Error(err)
				return
			}
			if err := reg.RegisterUpcast("test.promoted", 1, upcastPromotedV1); err != nil {
				t.Error(err)
				return
			}
		}
	})
	wg.Wait()
}

// --- the msgpack walker ------------------------------------------------------------------

// TestValueEndAgreesWithMsgpack checks the hand-written walker against
// msgpack's own encoder for every kind of item.
func TestValueEndAgreesWithMsgpack(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)
	values := []any{
		nil, true, false, 0, 127, -1, -32, -33, 128, 255, 256, 65535, 65536, int64(1) << 40, -(int64(1) << 40),
		uint64(1) << 63, float32(1.5), 2.5, "", "short", strings.Repeat("s", 31), strings.Repeat("s", 32),
		strings.Repeat("s", 256), strings.Repeat("s", 65536), []byte{}, []byte("bin"), bytes.Repeat([]byte{1}, 256),
		bytes.Repeat([]byte{1}, 65536), []any{}, []any{1, "a", nil}, make([]int, 16), make([]int, 65536),
		map[string]any{}, map[string]any{"a": []any{map[string]any{"b": 1}}}, bigMap(16), bigMap(65536),
		at, time.Unix(1<<35, 1), time.Unix(1, 0), msgpack.RawMessage{0xd4, 1, 2}, msgpack.RawMessage{0xd8, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		msgpack.RawMessage{0xc7, 3, 9, 1, 2, 3}, msgpack.RawMessage(append([]byte{0xc8, 1, 0, 9}, make([]byte, 256)...)),
		msgpack.RawMessage(append([]byte{0xc9, 0, 1, 0, 0, 9}, make([]byte, 65536)...)),
	}
	for _, v := range values {
		b := mustMarshal(t, v)
		end, err := valueEnd(b, 0)
		if err != nil || end != len(b) {
			t.Errorf("%T: valueEnd = %d, %v; want %d", v, end, err, len(b))
		}
		for cut := range min(len(b), 40) {
			if _, err := valueEnd(b[:cut], 0); !errors.Is(err, errTruncated) {
				t.Errorf("%T cut at %d: %v, want errTruncated", v, cut, err)
			}
		}
	}
	if _, err := valueEnd(append(bytes.Repeat([]byte{0x91}, maxDepth), 0xc0), 0); err != nil {
		t.Errorf("nesting of %d: %v", maxDepth, err)
	}
	if _, err := valueEnd(append(bytes.Repeat([]byte{0x91}, maxDepth+1), 0xc0), 0); !errors.Is(err, errTooDeep) {
		t.Errorf("nesting of %d: %v, want errTooDeep", maxDepth+1, err)
	}
}

func bigMap(n int) map[string]int {
	m := make(map[string]int, n)
	for i := range n {
		m[fmt.Sprint(i)] = i
	}
	return m
}

// --- plain values --------------------------------------------------------------------------

type testLeader struct {
	Site  string         `msgpack:"s"`
	Term  uint64         `msgpack:"tm"`
	Since time.Time      `msgpack:"at"`
	Seen  map[string]int `msgpack:"sn"`
}

func TestValueHelpers(t *testing.T) {
	zone := time.FixedZone("UTC-3", -3*3600)
	in := &testLeader{Site: "shop", Term: 9, Since: time.Date(2025, 3, 14, 0, 12, 7, 0, zone), Seen: bigMap(30)}
	data, err := MarshalValue(in)
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		again, err := MarshalValue(in)
		if err != nil || !bytes.Equal(again, data) {
			t.Fatalf("MarshalValue is not deterministic: %v", err)
		}
	}
	var out testLeader
	if err := UnmarshalValue(data, &out); err != nil {
		t.Fatal(err)
	}
	if out.Since.Location() != time.UTC || !out.Since.Equal(in.Since) {
		t.Errorf("Since = %v (%v), want %v in UTC", out.Since, out.Since.Location(), in.Since)
	}
	out.Since = in.Since
	if !reflect.DeepEqual(&out, in) {
		t.Errorf("UnmarshalValue = %#v, want %#v", out, in)
	}

	for _, bad := range [][]byte{nil, data[:len(data)-1], append(bytes.Clone(data), 0xc0), {0xc1}, append(bytes.Repeat([]byte{0x91}, maxDepth+1), 0xc0), {0xa1, 'x'}} {
		var v testLeader
		if err := UnmarshalValue(bad, &v); !errors.Is(err, ErrCorrupt) {
			t.Errorf("UnmarshalValue(%x) = %v, want ErrCorrupt", bad[:min(len(bad), 16)], err)
		}
	}
	var nilLeader *testLeader
	for _, target := range []any{testLeader{}, nilLeader, nil} {
		if err := UnmarshalValue(data, target); err == nil || errors.Is(err, ErrCorrupt) {
			t.Errorf("UnmarshalValue into %T: %v, want a usage error", target, err)
		}
	}
	if _, err := MarshalValue(make(chan int)); err == nil {
		t.Error("MarshalValue of a channel succeeded")
	}
	if b, err := MarshalValue(nil); err != nil || !bytes.Equal(b, []byte{0xc0}) {
		t.Errorf("MarshalValue(nil) = %x, %v", b, err)
	}
}
