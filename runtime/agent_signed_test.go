package runtime

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"understudy/actors/agent"
)

// An agent with trusted manifest keys, on embedded NATS: an unsigned
// manifest, a mis-signed one and one signed by an untrusted key are
// refused — nothing runs, the status says why and names the key, the log
// says it once per revision; a correctly signed one runs; a forged one
// and a replay of an older signed one arriving later are refused while
// the accepted one keeps converging (drift repaired); after a restart
// whose first desired state is refused, the agent runs the last manifest
// it accepted.
func TestAgentRunsOnlySignedManifests(t *testing.T) {
	key, _ := newManifestKey(t)
	stranger, _ := newManifestKey(t)
	logger, logs := newLogRecorder(t)
	stateDir := t.TempDir()
	cfg := AgentConfig{ID: "sig1", ManifestKeys: []string{key.Public()}, ObserveInterval: 100 * time.Millisecond,
		RetryBase: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond, StateDir: stateDir}
	w := startAgentWorldLogged(t, cfg, logger)
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "motd")
	motd := func(content string) agent.Manifest {
		return agent.Manifest{Agent: "sig1", Resources: []agent.Resource{res("motd", "file", map[string]any{"path": path, "content": content})}}
	}
	reg := w.a.actor.reg
	put := func(b []byte) uint64 {
		t.Helper()
		rev, err := w.fleet.Put(ctx, agent.DesiredKey("sig1"), b)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	refusedAt := func(what string, rev uint64, reason agent.RefusalReason, signer string) agent.Status {
		t.Helper()
		s := w.waitStatus(what, func(s agent.Status) bool {
			r := s.RefusedManifest
			return r != nil && r.Revision == rev && r.Reason == reason && r.Signer == signer
		})
		for _, c := range s.Conditions {
			if c.Type == "ManifestTrusted" && (c.Status || c.Reason != string(reason) || !strings.Contains(c.Message, "revision")) {
				t.Errorf("%s: condition %+v", what, c)
			}
		}
		return s
	}

	// Unsigned: refused, nothing runs.
	_, rev, err := ApplyManifest(ctx, w.fleet, motd("unsigned\n"), reg, ManifestWriter{})
	if err != nil {
		t.Fatal(err)
	}
	s := refusedAt("unsigned refused", rev, agent.RefusedUnsigned, "")
	if !strings.Contains(s.RefusedManifest.Message, "unsigned: this agent runs only manifests signed by a key of security.manifest_keys ("+key.Public()+")") ||
		!strings.Contains(s.RefusedManifest.Message, "nothing runs yet") {
		t.Errorf("unsigned: %q", s.RefusedManifest.Message)
	}
	// Signed by the trusted key, then changed: refused.
	signed, err := key.Sign(motd("tampered\n"))
	if err != nil {
		t.Fatal(err)
	}
	tampered := reenvelope(t, signed, func(s *agent.SignedManifest) {
		i := strings.Index(string(s.Manifest), "tampered")
		copy(s.Manifest[i:], "TAMPERED")
	})
	rev = put(tampered)
	s = refusedAt("tampered refused", rev, agent.RefusedBadSignature, key.Public())
	if !strings.Contains(s.RefusedManifest.Message, "signature does not verify against "+key.Public()) {
		t.Errorf("tampered: %q", s.RefusedManifest.Message)
	}
	// Signed by a key the node does not trust: refused.
	rev = put(signedFor(t, stranger, motd("stranger\n")))
	s = refusedAt("untrusted key refused", rev, agent.RefusedUntrustedKey, stranger.Public())
	if _, err := os.Stat(path); !os.IsNotExist(err) || len(s.Resources) != 0 || s.ManifestGeneration != 0 || s.ManifestSigner != "" {
		t.Fatalf("something ran: %v %+v", err, s)
	}

	// Signed correctly: runs.
	m, _, err := ApplyManifest(ctx, w.fleet, motd("signed\n"), reg, ManifestWriter{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	s = w.waitStatus("the signed manifest converged", func(s agent.Status) bool {
		b, _ := os.ReadFile(path)
		return s.ManifestGeneration == m.Generation && s.Converged() && string(b) == "signed\n"
	})
	if s.ManifestSigner != key.Public() || s.RefusedManifest != nil {
		t.Errorf("accepted: signer %q refused %+v", s.ManifestSigner, s.RefusedManifest)
	}
	e, err := w.fleet.Get(ctx, agent.DesiredKey("sig1"))
	if err != nil {
		t.Fatal(err)
	}
	old := e.Value
	m, _, err = ApplyManifest(ctx, w.fleet, motd("signed again\n"), reg, ManifestWriter{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	w.waitStatus("the next signed manifest converged", func(s agent.Status) bool {
		b, _ := os.ReadFile(path)
		return s.ManifestGeneration == m.Generation && s.Converged() && string(b) == "signed again\n"
	})
	accepted := m.Generation

	// A forged one later: refused; the accepted one keeps converging.
	forged := reenvelope(t, signedFor(t, key, motd("evil\n")), func(s *agent.SignedManifest) {
		i := strings.Index(string(s.Manifest), "evil")
		copy(s.Manifest[i:], "EVIL")
	})
	rev = put(forged)
	s = refusedAt("forged refused", rev, agent.RefusedBadSignature, key.Public())
	if s.ManifestGeneration != accepted || s.ManifestSigner != key.Public() ||
		!strings.Contains(s.RefusedManifest.Message, "keeps running generation "+itoa(accepted)+" (signed by "+key.Public()+")") {
		t.Errorf("forged: %+v", s)
	}
	if err := os.WriteFile(path, []byte("drift\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w.waitStatus("drift repaired to the accepted manifest", func(s agent.Status) bool {
		b, _ := os.ReadFile(path)
		return string(b) == "signed again\n" && s.RefusedManifest != nil
	})
	// A replay of an older signed manifest: refused.
	rev = put(old)
	s = refusedAt("replay refused", rev, agent.RefusedRollback, key.Public())
	if !strings.Contains(s.RefusedManifest.Message, "is older than generation "+itoa(accepted)) {
		t.Errorf("replay: %q", s.RefusedManifest.Message)
	}
	// Logged once per revision, however often the resource is observed.
	time.Sleep(500 * time.Millisecond)
	perRev := map[uint64]int{}
	for _, l := range logs.all() {
		if strings.HasPrefix(l.Msg, "agent: manifest refused") {
			perRev[l.Attrs["revision"].Uint64()]++
		}
	}
	if len(perRev) != 5 {
		t.Errorf("refusals logged for %d revisions, want 5: %v", len(perRev), perRev)
	}
	for r, n := range perRev {
		if n != 1 {
			t.Errorf("revision %d logged %d times", r, n)
		}
	}

	// A restart whose first desired state is refused (the replay still
	// stored): the agent runs the last manifest it accepted.
	w.a.Stop()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	w.a, err = StartAgent(ctx, w.nc, w.nats.names.FleetBucket, w.nats.names.EventsStream, cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.a.Stop)
	s = w.waitStatus("the last accepted manifest runs after a restart", func(s agent.Status) bool {
		b, _ := os.ReadFile(path)
		return s.ManifestGeneration == accepted && s.Converged() && string(b) == "signed again\n" &&
			s.RefusedManifest != nil && s.RefusedManifest.Reason == agent.RefusedRollback
	})
	if s.ManifestSigner != key.Public() {
		t.Errorf("after restart: signer %q", s.ManifestSigner)
	}
	// And a new signed one replaces it.
	m, _, err = ApplyManifest(ctx, w.fleet, motd("third\n"), reg, ManifestWriter{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	w.waitStatus("the third converged", func(s agent.Status) bool {
		b, _ := os.ReadFile(path)
		return s.ManifestGeneration == m.Generation && s.Converged() && string(b) == "third\n" && s.RefusedManifest == nil
	})
}

// Without manifest keys, unsigned manifests run and the agent warns once,
// at start, that they are not verified; a bad key in the configuration is
// refused.
func TestAgentWithoutManifestKeysWarnsOnce(t *testing.T) {
	logger, logs := newLogRecorder(t)
	w := startAgentWorldLogged(t, AgentConfig{ID: "sig2", ObserveInterval: 100 * time.Millisecond}, logger)
	path := filepath.Join(t.TempDir(), "motd")
	m := w.apply(agent.Manifest{Resources: []agent.Resource{res("motd", "file", map[string]any{"path": path, "content": "x"})}})
	w.waitStatus("converged", func(s agent.Status) bool { return s.ManifestGeneration == m.Generation && s.Converged() })
	n := 0
	for _, l := range logs.all() {
		if strings.Contains(l.Msg, "manifests are not verified") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("warned %d times", n)
	}
	_, err := StartAgent(context.Background(), w.nc, w.nats.names.FleetBucket, w.nats.names.EventsStream,
		AgentConfig{ID: "sig3", StateDir: t.TempDir(), ManifestKeys: []string{"UABC"}}, logger)
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "security.manifest_keys[0]" {
		t.Errorf("a bad key: %v", err)
	}
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
