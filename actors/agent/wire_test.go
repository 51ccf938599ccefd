package agent

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// hostileManifest is a manifest whose one spec holds inner (msgpack).
func hostileManifest(inner []byte) []byte {
	var b bytes.Buffer
	b.Write([]byte{0x83, 0xa5, 'a', 'g', 'e', 'n', 't', 0xa2, 'n', '1', 0xa3, 'g', 'e', 'n', 0x01, 0xa3, 'r', 'e', 's', 0x91,
		0x83, 0xa2, 'i', 'd', 0xa1, 'a', 0xa4, 'k', 'i', 'n', 'd', 0xa4, 'f', 'i', 'l', 'e', 0xa4, 's', 'p', 'e', 'c', 0x81, 0xa1, 'x'})
	b.Write(inner)
	return b.Bytes()
}

// Finding: a 4 MB deeply nested value ended serve with "fatal error:
// stack overflow" (msgpack decodes nesting by recursion). It is refused
// before msgpack sees it.
func TestDecodeManifestRefusesDeepNesting(t *testing.T) {
	deep := hostileManifest(append(bytes.Repeat([]byte{0x91}, 4<<20), 0xc0))
	if _, err := DecodeManifest(deep); err == nil || !strings.Contains(err.Error(), "more than the 1048576 allowed") {
		t.Fatalf("4 MB: %v", err)
	}
	// Under the size limit, the depth limit.
	deep = hostileManifest(append(bytes.Repeat([]byte{0x91}, 900<<10), 0xc0))
	if _, err := DecodeManifest(deep); err == nil || !strings.Contains(err.Error(), "nested deeper than 32 levels") {
		t.Fatalf("900 KB deep: %v", err)
	}
	if _, err := DecodeStatus(append(bytes.Repeat([]byte{0x91}, 900<<10), 0xc0)); err == nil || !strings.Contains(err.Error(), "nested deeper than 32 levels") {
		t.Fatalf("a deep status: %v", err)
	}
}

// Finding: a 900 KB value raised the node's memory from 31 to 560 MB (a Go
// map for every one-byte empty map). It is refused after 65536 values,
// having allocated next to nothing.
func TestDecodeManifestBoundsMemory(t *testing.T) {
	n := 900 << 10
	wide := hostileManifest(append([]byte{0xdd, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, bytes.Repeat([]byte{0x80}, n)...))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := DecodeManifest(wide)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "more than 65536 values") {
		t.Fatalf("900 KB of empty maps: %v", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
		t.Errorf("refusing it allocated %d bytes", alloc)
	}
}

func TestCheckWireRules(t *testing.T) {
	good, err := EncodeManifest(Manifest{Agent: "n1", Generation: 3, Resources: []Resource{{ID: "a", Kind: "file", Spec: map[string]any{"path": "/a", "content": "x", "n": 5, "f": 1.5, "l": []any{"a", -3, true, nil}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeManifest(good); err != nil {
		t.Fatalf("a good manifest: %v", err)
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "truncated"},
		{"trailing", append(bytes.Clone(good), 0xc0), "1 bytes after the value"},
		{"truncated", good[:len(good)-2], "truncated"},
		{"reserved", hostileManifest([]byte{0xc1}), "0xc1 is reserved"},
		{"ext", hostileManifest([]byte{0xd4, 0x01, 0x00}), "extension type"},
		{"int key", hostileManifest([]byte{0x81, 0x01, 0x02}), "map key is not a string"},
		{"huge declared map", hostileManifest([]byte{0xdf, 0xff, 0xff, 0xff, 0xff}), "truncated"},
		{"huge declared string", hostileManifest([]byte{0xdb, 0xff, 0xff, 0xff, 0xff}), "truncated"},
		{"garbage", []byte("not a manifest at all"), "manifest:"},
	} {
		_, err := DecodeManifest(tc.b)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	// A status holds timestamps; a manifest does not.
	st, err := EncodeStatus(Status{Agent: "n1", Resources: map[string]ResourceStatus{"a": {Phase: Ready}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodeStatus(st); err != nil {
		t.Errorf("a status with timestamps: %v", err)
	}
	// apply refuses what an agent would not read.
	big := Manifest{Agent: "n1"}
	for i := range 200 {
		big.Resources = append(big.Resources, Resource{ID: fmt.Sprint("r", i), Kind: "file", Spec: map[string]any{"content": strings.Repeat("x", 60<<10)}})
	}
	if _, err := EncodeManifest(big); err == nil || !strings.Contains(err.Error(), "too large for an agent to read") {
		t.Errorf("a 12 MB manifest: %v", err)
	}
}

// FuzzDecodeManifest: whatever is stored at desired-state.<agent>, the
// decoder returns a manifest or an error — no panic, no unbounded memory
// — and what it returns encodes and decodes again to the same thing.
func FuzzDecodeManifest(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/manifest-seeds/*.msgpack")
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeManifest(b)
		if err != nil {
			return
		}
		enc, err := msgpack.Marshal(m)
		if err != nil {
			t.Fatalf("a decoded manifest does not encode: %v", err)
		}
		back, err := DecodeManifest(enc)
		if err != nil {
			t.Fatalf("a decoded manifest does not decode again: %v", err)
		}
		if len(back.Resources) != len(m.Resources) || back.Agent != m.Agent || back.Generation != m.Generation {
			t.Fatalf("round trip changed the manifest: %+v / %+v", m, back)
		}
		for i := range m.Resources {
			if SpecKey(back.Resources[i]) != SpecKey(m.Resources[i]) {
				t.Fatalf("round trip changed resources[%d]: %#v / %#v", i, m.Resources[i], back.Resources[i])
			}
		}
	})
}

// FuzzDecodeStatus: whatever is stored at actual-state.<agent>, the
// decoder returns a status or an error, never a panic, within the bounds
// of StatusLimits.
func FuzzDecodeStatus(f *testing.F) {
	seed, err := msgpack.Marshal(Status{Agent: "n1", ManifestGeneration: 3, Resources: map[string]ResourceStatus{"motd": {}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add(append(bytes.Repeat([]byte{0x91}, 100), 0xc0))
	f.Add([]byte{0xdf, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeStatus(b)
		if err != nil {
			return
		}
		if _, err := msgpack.Marshal(s); err != nil {
			t.Fatalf("a decoded status does not encode: %v", err)
		}
	})
}
