package runtime

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"understudy/actors/agent"
	"understudy/actors/resources"
	"understudy/events"
)

// newManifestKey makes an operator key; it returns the key and its seed.
func newManifestKey(t *testing.T) (*ManifestKey, []byte) {
	t.Helper()
	kp, err := nkeys.CreateOperator()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	k, err := ParseManifestKey(seed)
	if err != nil {
		t.Fatal(err)
	}
	return k, seed
}

func signedFor(t *testing.T, k *ManifestKey, m agent.Manifest) []byte {
	t.Helper()
	b, err := k.Sign(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// reenvelope changes a signed value's envelope with edit and encodes it
// again.
func reenvelope(t *testing.T, b []byte, edit func(*agent.SignedManifest)) []byte {
	t.Helper()
	d, err := agent.DecodeDesired(b)
	if err != nil || d.Signed == nil {
		t.Fatalf("not an envelope: %v", err)
	}
	edit(d.Signed)
	out, err := agent.EncodeSigned(*d.Signed)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// The agent's verdict on every kind of stored desired state: a manifest
// signed by a trusted key runs; a tampered manifest byte, a signature
// claimed by another (trusted) key, an untrusted key, an unsigned
// manifest where signatures are required, garbage and an oversize value
// are refused, each with its reason and the key it names.
func TestManifestSignatureVerdicts(t *testing.T) {
	trusted, _ := newManifestKey(t)
	other, _ := newManifestKey(t)
	stranger, _ := newManifestKey(t)
	keys := []string{trusted.Public(), other.Public()}
	m := agent.Manifest{Agent: "n1", Generation: 3, Resources: []agent.Resource{res("motd", "file", map[string]any{"path": "/etc/motd", "content": "hi\n"})}}
	good := signedFor(t, trusted, m)
	unsigned, err := agent.EncodeManifest(m)
	if err != nil {
		t.Fatal(err)
	}

	got, signer, err := openDesired(good, keys)
	if err != nil || signer != trusted.Public() || got.Generation != 3 || got.Resources[0].ID != "motd" {
		t.Fatalf("signed by a trusted key: %+v %q %v", got, signer, err)
	}
	// Without trusted keys, an unsigned manifest runs and a signed one
	// runs when it verifies against the key it names.
	if _, signer, err := openDesired(unsigned, nil); err != nil || signer != "" {
		t.Errorf("unsigned, no keys: %q %v", signer, err)
	}
	if _, signer, err := openDesired(signedFor(t, stranger, m), nil); err != nil || signer != stranger.Public() {
		t.Errorf("signed, no keys: %q %v", signer, err)
	}

	tampered := reenvelope(t, good, func(s *agent.SignedManifest) {
		i := strings.Index(string(s.Manifest), "hi\n")
		s.Manifest[i] = 'H' // still a manifest, no longer the one signed
	})
	forgedClaim := reenvelope(t, good, func(s *agent.SignedManifest) { s.Key = other.Public() })
	resigned := reenvelope(t, good, func(s *agent.SignedManifest) {
		// A signature of the bare manifest, without the context: not a
		// manifest signature.
		s.Sig, _ = trusted.kp.Sign(s.Manifest)
	})
	for _, tc := range []struct {
		name   string
		b      []byte
		keys   []string
		reason agent.RefusalReason
		signer string
		want   string
	}{
		{"tampered manifest byte", tampered, keys, agent.RefusedBadSignature, trusted.Public(), "does not verify against " + trusted.Public()},
		{"tampered, no keys", tampered, nil, agent.RefusedBadSignature, trusted.Public(), "signature does not verify"},
		{"claims another trusted key", forgedClaim, keys, agent.RefusedBadSignature, other.Public(), "does not verify against " + other.Public()},
		{"signed without the context", resigned, keys, agent.RefusedBadSignature, trusted.Public(), "signature does not verify"},
		{"untrusted key", signedFor(t, stranger, m), keys, agent.RefusedUntrustedKey, stranger.Public(), "not a key of security.manifest_keys"},
		{"unsigned", unsigned, keys, agent.RefusedUnsigned, "", "--sign-key"},
	} {
		_, signer, err := openDesired(tc.b, tc.keys)
		var ue *untrustedManifestError
		if !errors.As(err, &ue) || ue.reason != tc.reason || ue.signer != tc.signer || signer != tc.signer || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: signer %q, %v; want %s by %q (%q)", tc.name, signer, err, tc.reason, tc.signer, tc.want)
		}
	}
	// What does not decode is not a trust verdict: the agent reports it
	// as undecodable.
	deep, err := agent.EncodeSigned(agent.SignedManifest{Manifest: hostileDeep(), Key: trusted.Public(), Sig: make([]byte, 64)})
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		"garbage":         []byte("not a manifest"),
		"oversize":        make([]byte, agent.SignedLimits.Bytes+1),
		"deep, unsigned":  hostileDeep(),
		"envelope of bad": deep,
	} {
		_, _, err := openDesired(b, keys)
		var ue *untrustedManifestError
		if err == nil || (errors.As(err, &ue) && name != "envelope of bad") {
			t.Errorf("%s: %v", name, err)
		}
	}
	// Its signature is checked before the manifest inside is decoded.
	if _, _, err := openDesired(deep, keys); !strings.Contains(err.Error(), "signature does not verify") {
		t.Errorf("a hostile manifest inside a bad envelope: %v", err)
	}
	signedDeep := reenvelope(t, deep, func(s *agent.SignedManifest) { s.Sig, _ = trusted.kp.Sign(agent.SigningInput(s.Manifest)) })
	if _, _, err := openDesired(signedDeep, keys); err == nil || !strings.Contains(err.Error(), "nested deeper than 32 levels") {
		t.Errorf("a hostile manifest, signed: %v", err)
	}
}

// hostileDeep is a manifest nested 40 levels deep (msgpack).
func hostileDeep() []byte {
	b := []byte{0x81, 0xa5, 'a', 'g', 'e', 'n', 't'}
	for range 40 {
		b = append(b, 0x91)
	}
	return append(b, 0xc0)
}

func TestManifestKeyFiles(t *testing.T) {
	dir := t.TempDir()
	k, seed := newManifestKey(t)
	path := filepath.Join(dir, "manifest.nk")
	if err := os.WriteFile(path, append(append([]byte("\n"), seed...), '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := LoadManifestKey(path)
	if err != nil || got.Public() != k.Public() {
		t.Fatalf("load: %v", err)
	}
	user, _ := nkeys.CreateUser()
	useed, _ := user.Seed()
	upath := filepath.Join(dir, "user.nk")
	if err := os.WriteFile(upath, useed, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]string{"user seed": upath, "missing": filepath.Join(dir, "nope"), "directory": dir} {
		_, err := LoadManifestKey(p)
		if err == nil || !strings.Contains(err.Error(), "manifest signing key") || strings.Contains(err.Error(), string(useed)) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := LoadManifestKey(upath); !strings.Contains(err.Error(), "not an operator seed") {
		t.Errorf("user seed: %v", err)
	}
	upub, _ := user.PublicKey()
	if CheckManifestKey(k.Public()) != "" || CheckManifestKey(upub) == "" || CheckManifestKey("O123") == "" {
		t.Error("CheckManifestKey")
	}
}

// A signed write vouches for the whole manifest: it carries resources over
// from the stored one (the postgres-pair resources an agent's manifest
// keeps, the resources around a pair) only when that one is signed by the
// same key or a trusted one, or the operator says so (TrustStored).
func TestManifestWriterCarriesOverOnlyWhatItVouchesFor(t *testing.T) {
	ctx := context.Background()
	key, _ := newManifestKey(t)
	colleague, _ := newManifestKey(t)
	reg := AgentRegistry(AgentConfig{}, resources.NewProcess())
	pm, err := ParsePairManifest(pairDoc(nil))
	if err != nil {
		t.Fatal(err)
	}
	motd := agent.Manifest{Agent: "site-a", Resources: []agent.Resource{res("motd", "file", map[string]any{"path": "/etc/motd", "content": "x"})}}
	signer := func(kv events.KV, ag string) (string, uint64) {
		t.Helper()
		e, err := kv.Get(ctx, agent.DesiredKey(ag))
		if err != nil {
			t.Fatal(err)
		}
		m, s, err := ReadStoredManifest(e.Value)
		if err != nil {
			t.Fatal(err)
		}
		return s, m.Generation
	}
	newKV := func() events.KV { return events.NewMemoryKV("fleet", events.NewManualClock(time.Unix(0, 0))) }

	// The pair applied unsigned (an attacker, or before signatures): a
	// signed apply of the agent's manifest would carry it over.
	kv := newKV()
	if _, err := ApplyPair(ctx, kv, pm, ManifestWriter{}); err != nil {
		t.Fatal(err)
	}
	_, _, err = ApplyManifest(ctx, kv, motd, reg, ManifestWriter{Key: key})
	var sc *StoredContentError
	if !errors.As(err, &sc) || sc.Signer != "" || strings.Join(sc.Resources, ",") != "pg-main" || !strings.Contains(err.Error(), "--trust-stored") {
		t.Fatalf("signed apply over an unsigned pair: %v", err)
	}
	// Signed by a colleague: refused unless trusted.
	if _, err := ApplyPair(ctx, kv, pm, ManifestWriter{Key: colleague}); err != nil {
		t.Fatalf("signing the pair alone carries nothing over: %v", err)
	}
	if s, gen := signer(kv, "site-a"); s != colleague.Public() || gen != 2 {
		t.Fatalf("re-signed: %s generation %d", s, gen)
	}
	if _, _, err = ApplyManifest(ctx, kv, motd, reg, ManifestWriter{Key: key}); !errors.As(err, &sc) || sc.Signer != colleague.Public() {
		t.Fatalf("signed apply over a colleague's pair: %v", err)
	}
	m, _, err := ApplyManifest(ctx, kv, motd, reg, ManifestWriter{Key: key, Trusted: []string{colleague.Public()}})
	if err != nil || len(m.Resources) != 2 || m.Generation != 3 {
		t.Fatalf("with --trust-key: %+v %v", m, err)
	}
	if s, _ := signer(kv, "site-a"); s != key.Public() {
		t.Errorf("signer %s", s)
	}
	// Its own: carried over.
	if m, _, err = ApplyManifest(ctx, kv, motd, reg, ManifestWriter{Key: key}); err != nil || len(m.Resources) != 2 || m.Generation != 4 {
		t.Fatalf("over its own: %+v %v", m, err)
	}

	// The pair applied signed around an unsigned manifest of other
	// resources: the edit would vouch for motd.
	kv = newKV()
	if _, _, err := ApplyManifest(ctx, kv, motd, reg, ManifestWriter{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ApplyPair(ctx, kv, pm, ManifestWriter{Key: key}); !errors.As(err, &sc) || strings.Join(sc.Resources, ",") != "motd" {
		t.Fatalf("signed pair over an unsigned manifest: %v", err)
	}
	if _, err := DeletePair(ctx, kv, "pg-main", pm.Pair.Agents(), ManifestWriter{Key: key}); err != nil {
		t.Fatalf("deleting what is not there writes nothing: %v", err)
	}
	if _, err := ApplyPair(ctx, kv, pm, ManifestWriter{Key: key, TrustStored: true}); err != nil {
		t.Fatalf("with --trust-stored: %v", err)
	}
	if s, gen := signer(kv, "site-a"); s != key.Public() || gen != 2 {
		t.Errorf("site-a: %s generation %d", s, gen)
	}
	if _, err := DeletePair(ctx, kv, "pg-main", pm.Pair.Agents(), ManifestWriter{Key: key}); err != nil {
		t.Fatalf("delete over its own: %v", err)
	}

	// A forged stored value (its signature does not verify): an edit
	// refuses it, an apply replaces it with a generation above the key's
	// revision.
	kv = newKV()
	if _, _, err := ApplyManifest(ctx, kv, motd, reg, ManifestWriter{Key: key}); err != nil {
		t.Fatal(err)
	}
	e, _ := kv.Get(ctx, agent.DesiredKey("site-a"))
	forged := reenvelope(t, e.Value, func(s *agent.SignedManifest) { s.Sig[0] ^= 1 })
	rev, err := kv.Put(ctx, agent.DesiredKey("site-a"), forged)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ApplyPair(ctx, kv, pm, ManifestWriter{Key: key}); err == nil || !strings.Contains(err.Error(), "does not decode or verify") {
		t.Errorf("edit over a forged value: %v", err)
	}
	if m, _, err := ApplyManifest(ctx, kv, motd, reg, ManifestWriter{Key: key}); err != nil || m.Generation != rev+1 {
		t.Errorf("apply over a forged value: generation %d (revision %d) %v", m.Generation, rev, err)
	}

	// An unchanged pair over an unsigned manifest holding only it: signed
	// now, for agents that require signatures.
	kv = newKV()
	if _, err := ApplyPair(ctx, kv, pm, ManifestWriter{}); err != nil {
		t.Fatal(err)
	}
	done, err := ApplyPair(ctx, kv, pm, ManifestWriter{Key: key})
	if err != nil || !done[0].Changed || done[0].Generation != 2 {
		t.Fatalf("re-signing an unchanged pair: %+v %v", done, err)
	}
	if done, err = ApplyPair(ctx, kv, pm, ManifestWriter{Key: key}); err != nil || done[0].Changed {
		t.Fatalf("the same again: %+v %v", done, err)
	}
}

// A key deleted and written again starts above the generation the agent
// reports, so that an agent refusing replays accepts it.
func TestApplyManifestAfterTheKeyWasDeleted(t *testing.T) {
	ctx := context.Background()
	kv := events.NewMemoryKV("fleet", events.NewManualClock(time.Unix(0, 0)))
	st, err := agent.EncodeStatus(agent.Status{Agent: "n1", ManifestGeneration: 41})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, agent.ActualKey("n1"), st); err != nil {
		t.Fatal(err)
	}
	reg := AgentRegistry(AgentConfig{}, resources.NewProcess())
	m, _, err := ApplyManifest(ctx, kv, agent.Manifest{Agent: "n1"}, reg, ManifestWriter{})
	if err != nil || m.Generation != 42 {
		t.Fatalf("generation %d %v", m.Generation, err)
	}
	// A stored generation below the reported one (written before the
	// status could be read): the next write is above both.
	low, err := agent.EncodeManifest(agent.Manifest{Agent: "n1", Generation: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, agent.DesiredKey("n1"), low); err != nil {
		t.Fatal(err)
	}
	if m, _, err = ApplyManifest(ctx, kv, agent.Manifest{Agent: "n1"}, reg, ManifestWriter{}); err != nil || m.Generation != 42 {
		t.Fatalf("over a low generation: %d %v", m.Generation, err)
	}
	pm, err := ParsePairManifest(pairDoc(func(d map[string]any) {
		d["sites"] = map[string]any{"site-a": map[string]any{"address": "10.0.1.10", "agent": "n1"}, "site-b": "10.0.2.10"}
	}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, agent.DesiredKey("n1"), low); err != nil {
		t.Fatal(err)
	}
	if done, err := ApplyPair(ctx, kv, pm, ManifestWriter{}); err != nil || done[0].Generation != 42 {
		t.Fatalf("a pair over a low generation: %+v %v", done, err)
	}
}

// The node file's security.manifest_keys reach the agent; a secured node
// with an agent must list at least one.
func TestAgentManifestKeysFromTheNodeFile(t *testing.T) {
	key, _ := newManifestKey(t)
	user, _ := nkeys.CreateUser()
	seed, _ := user.Seed()
	upub, _ := user.PublicKey()
	seedFile := filepath.Join(t.TempDir(), "nats.nkey")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	c := DefaultConfig()
	c.Node = "n1"
	c.DataDir = t.TempDir()
	c.Agent = &AgentSection{}
	c.Libvirt.Driver = "/bin/true" // any executable: the agent needs one at load
	c.NATS.NKey = seedFile
	c.Security = &SecuritySection{Nodes: map[string]NodeIdentity{"n1": {NKey: upub}}}
	hasField := func(err error, field string) bool {
		for _, e := range flattenErrors(err) {
			var ce *ConfigError
			if errors.As(e, &ce) && ce.Field == field {
				return true
			}
		}
		return false
	}
	if _, err := c.resolve(); !hasField(err, "security.manifest_keys") {
		t.Errorf("no manifest keys: %v", err)
	}
	c.Security.ManifestKeys = []string{key.Public()}
	s, err := c.resolve()
	if hasField(err, "security.manifest_keys") || s.agent == nil || len(s.agent.ManifestKeys) != 1 || s.agent.ManifestKeys[0] != key.Public() {
		t.Errorf("with a key: %+v %v", s.agent, err)
	}
	c.Security = nil
	if s, _ := c.resolve(); s.agent == nil || s.agent.ManifestKeys != nil {
		t.Errorf("no security section: %+v", s.agent)
	}
}

// flattenErrors unwraps errors.Join.
func flattenErrors(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flattenErrors(e)...)
		}
		return out
	}
	if err == nil {
		return nil
	}
	return []error{err}
}
