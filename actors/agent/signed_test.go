package agent

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// testKey is shaped like an operator public key; the signature checks
// are the runtime's (nkeys), these tests are about the envelope.
const testKey = "OAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"

func testEnvelope(t testing.TB) (SignedManifest, []byte) {
	t.Helper()
	mb, err := EncodeManifest(Manifest{Agent: "n1", Generation: 4, Resources: []Resource{{ID: "motd", Kind: "file", Spec: map[string]any{"path": "/etc/motd", "content": "hi\n"}}}})
	if err != nil {
		t.Fatal(err)
	}
	s := SignedManifest{Format: SignedFormat, Manifest: mb, Key: testKey, Sig: bytes.Repeat([]byte{7}, 64)}
	b, err := EncodeSigned(s)
	if err != nil {
		t.Fatal(err)
	}
	return s, b
}

func TestSignedManifestRoundTrip(t *testing.T) {
	s, b := testEnvelope(t)
	d, err := DecodeDesired(b)
	if err != nil {
		t.Fatal(err)
	}
	if d.Signed == nil || !bytes.Equal(d.Signed.Manifest, s.Manifest) || d.Signed.Key != s.Key || !bytes.Equal(d.Signed.Sig, s.Sig) || d.Signed.Format != SignedFormat {
		t.Fatalf("round trip: %+v", d.Signed)
	}
	if d.Manifest.Agent != "" {
		t.Errorf("the manifest inside an envelope is decoded only after its signature verifies: %+v", d.Manifest)
	}
	in := SigningInput(s.Manifest)
	if !bytes.HasSuffix(in, s.Manifest) || bytes.Equal(in, s.Manifest) {
		t.Errorf("the signed bytes are the manifest after a context: %q", in)
	}
}

// An old, unsigned manifest is recognised as one: not an error, not an
// envelope.
func TestUnsignedManifestIsRecognised(t *testing.T) {
	b, err := EncodeManifest(Manifest{Agent: "n1", Generation: 2, Resources: []Resource{{ID: "a", Kind: "file"}}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := DecodeDesired(b)
	if err != nil || d.Signed != nil || d.Manifest.Agent != "n1" || d.Manifest.Generation != 2 || len(d.Manifest.Resources) != 1 {
		t.Fatalf("unsigned: %+v %v", d, err)
	}
}

func TestDecodeDesiredRefusesMalformedEnvelopes(t *testing.T) {
	s, good := testEnvelope(t)
	enc := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	over := bytes.Repeat([]byte{'x'}, SignedLimits.Bytes)
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"garbage", []byte("not a manifest at all"), "desired state: msgpack at byte 1"},
		{"a map but not a manifest", enc(map[string]any{"agent": []any{1}}), "manifest:"},
		{"empty", nil, "truncated"},
		{"truncated", good[:len(good)-3], "truncated"},
		{"trailing", append(bytes.Clone(good), 0xc0), "bytes after the value"},
		{"unknown format", enc(map[string]any{"format": "understudy.signed-manifest/v9", "manifest": s.Manifest, "key": s.Key, "sig": s.Sig}), "upgrade the agent"},
		{"format not a string", enc(map[string]any{"format": 1, "manifest": s.Manifest}), "format: not a string"},
		{"unknown field", enc(map[string]any{"format": SignedFormat, "manifest": s.Manifest, "key": s.Key, "sig": s.Sig, "extra": 1}), "unknown field"},
		{"no manifest", enc(map[string]any{"format": SignedFormat, "key": s.Key, "sig": s.Sig}), "manifest: required"},
		{"short signature", enc(map[string]any{"format": SignedFormat, "manifest": s.Manifest, "key": s.Key, "sig": s.Sig[:10]}), "64 bytes (got 10)"},
		{"no key", enc(map[string]any{"format": SignedFormat, "manifest": s.Manifest, "sig": s.Sig}), "key: must be a public key"},
		{"long key", enc(map[string]any{"format": SignedFormat, "manifest": s.Manifest, "key": strings.Repeat("O", 65), "sig": s.Sig}), "at most 64 characters"},
		{"oversize", enc(map[string]any{"format": SignedFormat, "manifest": over, "key": s.Key, "sig": s.Sig}), "allowed"},
		{"deep", append(bytes.Repeat([]byte{0x91}, 100), 0xc0), "nested deeper than 32 levels"},
	} {
		d, err := DecodeDesired(tc.b)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %+v %v, want %q", tc.name, d, err, tc.want)
		}
	}
	// apply refuses what an agent would not read.
	if _, err := EncodeSigned(SignedManifest{Manifest: over, Key: s.Key, Sig: s.Sig}); err == nil || !strings.Contains(err.Error(), "more than the 1048576 allowed") {
		t.Errorf("an oversize envelope: %v", err)
	}
	if _, err := EncodeSigned(SignedManifest{Manifest: s.Manifest, Key: s.Key}); err == nil || !strings.Contains(err.Error(), "sig:") {
		t.Errorf("an envelope without a signature: %v", err)
	}
}

// FuzzDecodeDesired: whatever is stored at desired-state.<agent>, the
// decoder returns an envelope, an unsigned manifest or an error — no
// panic, no unbounded memory — and an envelope it returns encodes and
// decodes again to the same thing.
func FuzzDecodeDesired(f *testing.F) {
	_, good := testEnvelope(f)
	f.Add(good)
	seeds, _ := filepath.Glob("testdata/manifest-seeds/*.msgpack")
	for _, p := range seeds {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := DecodeDesired(b)
		if err != nil {
			return
		}
		if d.Signed == nil {
			if _, err := EncodeManifest(d.Manifest); err != nil {
				t.Fatalf("a decoded unsigned manifest does not encode: %v", err)
			}
			return
		}
		enc, err := EncodeSigned(*d.Signed)
		if err != nil {
			t.Fatalf("a decoded envelope does not encode: %v", err)
		}
		back, err := DecodeDesired(enc)
		if err != nil || back.Signed == nil {
			t.Fatalf("a decoded envelope does not decode again: %v", err)
		}
		if !bytes.Equal(back.Signed.Manifest, d.Signed.Manifest) || back.Signed.Key != d.Signed.Key || !bytes.Equal(back.Signed.Sig, d.Signed.Sig) {
			t.Fatalf("round trip changed the envelope: %+v / %+v", d.Signed, back.Signed)
		}
	})
}
