package events

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

var updateFuzzCorpus = flag.Bool("update-fuzz-corpus", false, "rewrite testdata/fuzz/FuzzDecode from fuzzSeeds")

const fuzzSubject, fuzzSeq = "ev.pair.pg-main.basement", 7

// FuzzDecode: Decode never panics and returns exactly one of a known event
// that survives a re-encode, an *Unknown that keeps the input, or a
// *DecodeError naming subject and sequence.
func FuzzDecode(f *testing.F) {
	reg := testRegistry(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		input := bytes.Clone(data)
		ev, err := reg.Decode(fuzzSubject, fuzzSeq, data)
		if !bytes.Equal(data, input) {
			t.Fatal("Decode modified its input")
		}
		if err != nil {
			if ev != nil {
				t.Fatalf("Decode returned %T with error %v", ev, err)
			}
			assertCorrupt(t, err, fuzzSubject, fuzzSeq)
			return
		}
		switch ev := ev.(type) {
		case *Unknown:
			checkUnknown(t, reg, ev, data)
		case *testHeartbeat:
			assertUTC(t, ev.At)
			checkReencode(t, reg, ev)
		case *testPromoted:
			for _, s := range ev.Steps {
				if s.At != nil {
					assertUTC(t, *s.At)
				}
			}
			checkReencode(t, reg, ev)
		default:
			t.Fatalf("Decode returned %T", ev)
		}
	})
}

func checkUnknown(t *testing.T, reg *Registry, u *Unknown, data []byte) {
	t.Helper()
	if !bytes.Equal(u.Raw, data) {
		t.Fatalf("Unknown.Raw = %x, want the input %x", u.Raw, data)
	}
	if u.Body != nil && !bytes.Contains(u.Raw, u.Body) {
		t.Fatalf("Unknown.Body %x is not part of Raw", u.Body)
	}
	// Only a type or version this build cannot read is unknown.
	if r, ok := reg.byName[u.Type]; ok && u.Version == r.version {
		t.Fatalf("current version %d of %q decoded as Unknown", u.Version, u.Type)
	}
	out, err := reg.Encode(u)
	if err != nil || !bytes.Equal(out, data) {
		t.Fatalf("re-encoding Unknown = %x, %v; want the input", out, err)
	}
}

func checkReencode(t *testing.T, reg *Registry, ev Event) {
	t.Helper()
	data, err := reg.Encode(ev)
	if err != nil {
		t.Fatalf("re-encoding decoded %#v: %v", ev, err)
	}
	again, err := reg.Decode(fuzzSubject, fuzzSeq, data)
	if err != nil {
		t.Fatalf("decoding re-encoded %#v: %v", ev, err)
	}
	// omitempty drops empty maps and slices, so empty and nil are equal here.
	want := reflect.New(reflect.TypeOf(ev).Elem())
	want.Elem().Set(reflect.ValueOf(ev).Elem())
	nilEmpty(want.Elem())
	nilEmpty(reflect.ValueOf(again).Elem())
	if !reflect.DeepEqual(again, want.Interface()) {
		t.Fatalf("re-encoded event decodes to %#v\nwant %#v", again, ev)
	}
}

// nilEmpty sets the empty maps and slices reachable from v to nil.
func nilEmpty(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			nilEmpty(v.Elem())
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				nilEmpty(v.Field(i))
			}
		}
	case reflect.Slice, reflect.Map:
		if v.Len() == 0 {
			v.SetZero()
			return
		}
		if v.Kind() == reflect.Slice {
			for i := range v.Len() {
				nilEmpty(v.Index(i))
			}
		}
	}
}

func assertUTC(t *testing.T, tm time.Time) {
	t.Helper()
	if tm.Location() != time.UTC {
		t.Fatalf("decoded time %v is in %v, want UTC", tm, tm.Location())
	}
}

// fuzzSeed is one committed seed of FuzzDecode and what decoding it gives.
type fuzzSeed struct {
	name string
	data []byte
	want string // "event", "unknown" or "corrupt"
}

func fuzzSeeds(tb testing.TB) []fuzzSeed {
	reg := testRegistry(tb)
	enc := func(ev Event) []byte {
		b, err := reg.Encode(ev)
		if err != nil {
			tb.Fatal(err)
		}
		return b
	}
	hb := enc(benchEvent())
	envHead := []byte{0x83, 0xa1, 't', 0xa1, 'x', 0xa1, 'v', 0x01, 0xa1, 'b'}
	return []fuzzSeed{
		{"heartbeat-v1", hb, "event"},
		{"heartbeat-zero", enc(&testHeartbeat{Pair: "pg-main"}), "event"},
		{"promoted-v2", enc(promotedEvent()), "event"},
		{"promoted-v1-upcast", referenceEnvelope(tb, "test.promoted", 1, &testPromotedV1{Pair: "pg-main", Primary: "shop", Term: 7}), "event"},
		{"unknown-type", referenceEnvelope(tb, "test.future", 1, map[string]any{"x": 1, "at": time.Unix(1, 0)}), "unknown"},
		{"promoted-empty-votes", referenceEnvelope(tb, "test.promoted", 2, map[string]any{"p": "pg-main", "vo": map[string]int{}}), "event"},
		{"heartbeat-newer-version", referenceEnvelope(tb, "test.heartbeat", 2, benchEvent()), "unknown"},
		{"truncated", hb[:len(hb)/2], "corrupt"},
		{"trailing-byte", append(bytes.Clone(hb), 0), "corrupt"},
		{"garbage", []byte("\x00\xffnot an envelope\xc1"), "corrupt"},
		{"array-envelope", mustMarshal(tb, []any{"test.heartbeat", 1, map[string]any{}}), "corrupt"},
		{"version-zero", referenceEnvelope(tb, "test.heartbeat", 0, benchEvent()), "corrupt"},
		{"body-wrong-type", referenceEnvelope(tb, "test.heartbeat", 1, map[string]any{"p": 1}), "corrupt"},
		{"deep-nesting", append(envHead, append(bytes.Repeat([]byte{0x91}, 150), 0xc0)...), "corrupt"},
		{"huge-length", append(envHead, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x01), "corrupt"},
	}
}

// TestFuzzSeedCorpus keeps the committed seeds meaningful: each decodes as
// its name says, and each file still holds what the codec writes today, so
// a change of the wire format shows up here. Regenerate with
// go test ./events -run TestFuzzSeedCorpus -update-fuzz-corpus.
func TestFuzzSeedCorpus(t *testing.T) {
	reg := testRegistry(t)
	dir := filepath.Join("testdata", "fuzz", "FuzzDecode")
	for _, s := range fuzzSeeds(t) {
		ev, err := reg.Decode(fuzzSubject, fuzzSeq, s.data)
		got := "event"
		if _, ok := ev.(*Unknown); ok {
			got = "unknown"
		}
		if err != nil {
			got = "corrupt"
			assertCorrupt(t, err, fuzzSubject, fuzzSeq)
		}
		if got != s.want {
			t.Errorf("seed %s decodes as %s (%v), want %s", s.name, got, err, s.want)
		}

		file := fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", s.data)
		path := filepath.Join(dir, s.name)
		if *updateFuzzCorpus {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, file, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		stored, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("seed %s: %v (regenerate with -update-fuzz-corpus)", s.name, err)
		}
		if !bytes.Equal(stored, file) {
			t.Errorf("seed %s: stored file differs from what the codec writes now:\n%s\nwant\n%s", s.name, stored, file)
		}
	}
}
