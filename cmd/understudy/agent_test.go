package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"understudy/actors/agent"
	"understudy/runtime"
)

// The fleet commands against a node that runs an agent (the node file's
// agent section): apply, get status (text and JSON), ping; a bad manifest
// is refused before anything is stored.
func TestAgentCommandsEndToEnd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	node := writeTestFile(t, dir, "node.yaml", `node: n1
data_dir: `+filepath.Join(dir, "data")+`
nats: {listen: "127.0.0.1:0"}
http: 127.0.0.1:0
log: {format: json}
agent: {observe_interval: 200ms}
`)
	_, ready := startServeBinary(t, "serve", "--config", node)
	url, _ := ready["client_url"].(string)
	motd := filepath.Join(dir, "motd")
	manifest := writeTestFile(t, dir, "m.yaml", "resources:\n  - id: motd\n    kind: file\n    spec: {path: "+motd+", content: \"hello\\n\"}\n  - id: gizmo\n    kind: gizmo\n")

	code, stdout, stderr := runBinary(t, 10*time.Second, "apply", "--nats-url", url, "-f", manifest, "--agent", "n1")
	if code != exitOK || !strings.Contains(stdout, "applied manifest generation 1 for agent n1 (2 resources") {
		t.Fatalf("apply: exit %d\n%s\n%s", code, stdout, stderr)
	}
	var s agent.Status
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		code, stdout, _ = runBinary(t, 10*time.Second, "get", "status", "--nats-url", url, "--agent", "n1", "--json")
		s = agent.Status{}
		if code == exitOK && json.Unmarshal([]byte(stdout), &s) == nil && s.Settled() && s.ManifestGeneration == 1 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if s.Resources["motd"].Phase != agent.Ready || s.Resources["gizmo"].Phase != agent.UnknownResource || s.Converged() {
		t.Fatalf("status: %+v", s)
	}
	if b, err := os.ReadFile(motd); err != nil || string(b) != "hello\n" {
		t.Errorf("motd %q %v", b, err)
	}
	code, stdout, _ = runBinary(t, 10*time.Second, "get", "status", "--nats-url", url, "--agent", "n1")
	if code != exitOK || !strings.Contains(stdout, "motd   file   Ready") || !strings.Contains(stdout, "UnknownResource") || !strings.Contains(stdout, "converged false") {
		t.Errorf("status text:\n%s", stdout)
	}
	code, stdout, stderr = runBinary(t, 10*time.Second, "ping", "--nats-url", url, "n1")
	if code != exitOK || !strings.HasPrefix(stdout, "n1: agent ") || !strings.Contains(stdout, "round trip") {
		t.Errorf("ping: exit %d %q %q", code, stdout, stderr)
	}
	bad := writeTestFile(t, dir, "bad.yaml", "agent: n1\nresources:\n  - id: x\n    kind: file\n    spec: {path: rel, content: x}\n")
	code, _, stderr = runBinary(t, 10*time.Second, "apply", "--nats-url", url, "-f", bad)
	if code != exitUsage || !strings.Contains(stderr, "resources[0].spec: file spec: path: must be an absolute, clean path (got rel)") {
		t.Errorf("bad manifest: exit %d %q", code, stderr)
	}
	code, _, stderr = runBinary(t, 10*time.Second, "get", "status", "--nats-url", url, "--agent", "n9")
	if code != exitFailure || !strings.Contains(stderr, "agent n9: no status") {
		t.Errorf("unknown agent: exit %d %q", code, stderr)
	}
	code, _, stderr = runBinary(t, 10*time.Second, "ping", "--nats-url", url, "--timeout", "300ms", "n9")
	if code != exitFailure || !strings.Contains(stderr, "ping n9") {
		t.Errorf("ping of an absent agent: exit %d %q", code, stderr)
	}
}

// apply reads a manifest file of bounded size, and no device or FIFO.
func TestApplyRefusesAnEndlessFile(t *testing.T) {
	t.Parallel()
	code, _, stderr := runBinary(t, 10*time.Second, "apply", "--nats-url", "nats://127.0.0.1:1", "-f", "/dev/zero", "--agent", "n1")
	if code == exitOK || !strings.Contains(stderr, "/dev/zero: not a regular file") {
		t.Errorf("exit %d: %s", code, stderr)
	}
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, make([]byte, maxManifestFile+1), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runBinary(t, 10*time.Second, "apply", "--nats-url", "nats://127.0.0.1:1", "-f", big, "--agent", "n1")
	if code == exitOK || !strings.Contains(stderr, "more than 8388608 bytes: not a manifest") {
		t.Errorf("exit %d: %s", code, stderr)
	}
}

// A postgres-pair manifest: apply writes it into both sites' agents (the
// agent inside serve runs it on the node's Host: here its password file is
// missing, so the resource fails with that, not with "no host"); an
// agent's own manifest applied later keeps it; delete -f takes it out.
func TestPairManifestCommands(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	node := writeTestFile(t, dir, "node.yaml", `node: n1
data_dir: `+filepath.Join(dir, "data")+`
nats: {listen: "127.0.0.1:0"}
http: 127.0.0.1:0
log: {format: json}
agent: {observe_interval: 200ms}
`)
	_, ready := startServeBinary(t, "serve", "--config", node)
	url, _ := ready["client_url"].(string)
	pairYAML := `kind: postgres-pair
pair: pg-x
primary: site-a
replica: site-b
sites:
  site-a: {address: 127.0.0.1, agent: n1}
  site-b: {address: 127.0.0.2, agent: n2}
storage: ` + filepath.Join(dir, "pg") + `
replication: {password_file: ` + filepath.Join(dir, "missing.pass") + `}
`
	pair := writeTestFile(t, dir, "pair.yaml", pairYAML)
	code, stdout, stderr := runBinary(t, 10*time.Second, "apply", "--nats-url", url, "-f", pair)
	if code != exitOK || !strings.Contains(stdout, "applied postgres-pair pg-x for agent n1: manifest generation 1") ||
		!strings.Contains(stdout, "applied postgres-pair pg-x for agent n2: manifest generation 1") {
		t.Fatalf("apply: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if code, stdout, _ = runBinary(t, 10*time.Second, "apply", "--nats-url", url, "-f", pair); code != exitOK || !strings.Contains(stdout, "pg-x for agent n1: unchanged") {
		t.Errorf("apply again: exit %d %q", code, stdout)
	}
	status := func(what string, ok func(agent.ResourceStatus, bool) bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		var last string
		for time.Now().Before(deadline) {
			code, stdout, _ := runBinary(t, 10*time.Second, "get", "status", "--nats-url", url, "--agent", "n1", "--json")
			var s agent.Status
			if code == exitOK && json.Unmarshal([]byte(stdout), &s) == nil {
				r, found := s.Resources["pg-x"]
				if ok(r, found) {
					return
				}
			}
			last = stdout
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("%s: not within 20s; last status %s", what, last)
	}
	status("pg-x failing on the missing password file", func(r agent.ResourceStatus, found bool) bool {
		return found && r.Phase == agent.Failed && strings.Contains(r.Error, "replication.password_file") && strings.Contains(r.Error, "cannot read it")
	})

	manifest := writeTestFile(t, dir, "m.yaml", "resources:\n  - id: motd\n    kind: file\n    spec: {path: "+filepath.Join(dir, "motd")+", content: \"hi\\n\"}\n")
	if code, stdout, stderr = runBinary(t, 10*time.Second, "apply", "--nats-url", url, "-f", manifest, "--agent", "n1"); code != exitOK || !strings.Contains(stdout, "(2 resources") {
		t.Errorf("an agent manifest keeps the pair: exit %d %q %q", code, stdout, stderr)
	}
	bad := writeTestFile(t, dir, "bad.yaml", strings.Replace(pairYAML, "{password_file: ", "{password: hunter2, password_file: ", 1))
	code, _, stderr = runBinary(t, 10*time.Second, "apply", "--nats-url", url, "-f", bad)
	if code != exitUsage || !strings.Contains(stderr, "postgres-pair spec: replication.password: not in a manifest") || strings.Contains(stderr, "hunter2") {
		t.Errorf("inline password: exit %d %q", code, stderr)
	}

	code, stdout, stderr = runBinary(t, 10*time.Second, "delete", "--nats-url", url, "-f", pair)
	if code != exitOK || !strings.Contains(stdout, "deleted postgres-pair pg-x for agent n1") || !strings.Contains(stdout, "deleted postgres-pair pg-x for agent n2") {
		t.Fatalf("delete: exit %d\n%s\n%s", code, stdout, stderr)
	}
	status("pg-x gone", func(_ agent.ResourceStatus, found bool) bool { return !found })
}

// apply --sign-key writes a manifest an agent with security.manifest_keys
// runs; without a key apply warns, and that agent refuses the unsigned
// manifest (get status says why); get manifest shows who signed what is
// stored. $UNDERSTUDY_SIGN_KEY works as --sign-key. (Not parallel: it
// sets the environment.)
func TestApplySignKey(t *testing.T) {
	dir := t.TempDir()
	logger := runtime.NewLogger(os.Stderr, 8, runtime.LogText)
	es, nc, _, names := provisionedNATS(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kp, err := nkeys.CreateOperator()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	keyFile := writeTestFile(t, dir, "manifest.nk", string(seed)+"\n")
	a, err := runtime.StartAgent(ctx, nc, names.FleetBucket, names.EventsStream, runtime.AgentConfig{ID: "n1", ManifestKeys: []string{pub},
		StateDir: filepath.Join(dir, "agent"), ObserveInterval: 200 * time.Millisecond}, logger)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop()
	url := es.ClientURL()
	motd := filepath.Join(dir, "motd")
	manifest := writeTestFile(t, dir, "m.yaml", "agent: n1\nresources:\n  - id: motd\n    kind: file\n    spec: {path: "+motd+", content: \"hello\\n\"}\n")
	status := func(what string, ok func(agent.Status) bool) agent.Status {
		t.Helper()
		var s agent.Status
		for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			code, stdout, _ := runBinary(t, 10*time.Second, "get", "status", "--nats-url", url, "--agent", "n1", "--json")
			// A fresh value each time: decoding over the last one would keep
			// the fields this answer leaves out (refused_manifest).
			s = agent.Status{}
			if code == exitOK && json.Unmarshal([]byte(stdout), &s) == nil && ok(s) {
				return s
			}
		}
		t.Fatalf("status never %s: %+v", what, s)
		return s
	}

	code, stdout, stderr := runBinary(t, 10*time.Second, "apply", "--nats-url", url, "-f", manifest)
	if code != exitOK || !strings.Contains(stdout, "unsigned") || !strings.Contains(stderr, "warning: writing an unsigned manifest") || !strings.Contains(stderr, "security.manifest_keys") {
		t.Fatalf("unsigned apply: exit %d\n%s\n%s", code, stdout, stderr)
	}
	status("refusing the unsigned manifest", func(s agent.Status) bool {
		return s.RefusedManifest != nil && s.RefusedManifest.Reason == agent.RefusedUnsigned
	})
	if code, stdout, _ = runBinary(t, 10*time.Second, "get", "status", "--nats-url", url, "--agent", "n1"); code != exitOK ||
		!strings.Contains(stdout, "refused desired-state.n1 revision") || !strings.Contains(stdout, "(Unsigned)") || !strings.Contains(stdout, "condition ManifestTrusted=false Unsigned") {
		t.Errorf("status text:\n%s", stdout)
	}
	if _, err := os.Stat(motd); !os.IsNotExist(err) {
		t.Fatalf("the unsigned manifest ran: %v", err)
	}

	code, stdout, stderr = runBinary(t, 10*time.Second, "apply", "--nats-url", url, "-f", manifest, "--sign-key", keyFile)
	// Over an unsigned manifest, the generation is the key's revision + 1:
	// a generation nobody signed is not continued.
	var gen uint64
	if _, err := fmt.Sscanf(stdout, "applied manifest generation %d for agent n1", &gen); err != nil || code != exitOK || gen < 2 ||
		!strings.Contains(stdout, "signed by "+pub) || strings.Contains(stderr, "warning") {
		t.Fatalf("signed apply: exit %d %v\n%s\n%s", code, err, stdout, stderr)
	}
	s := status("converged on the signed manifest", func(s agent.Status) bool { return s.ManifestGeneration == gen && s.Converged() })
	if s.ManifestSigner != pub || s.RefusedManifest != nil {
		t.Errorf("status: %+v", s)
	}
	if b, err := os.ReadFile(motd); err != nil || string(b) != "hello\n" {
		t.Errorf("motd %q %v", b, err)
	}
	code, stdout, _ = runBinary(t, 10*time.Second, "get", "manifest", "--nats-url", url, "--agent", "n1")
	if code != exitOK || !strings.Contains(stdout, fmt.Sprintf("generation %d: signed by %s (the signature verifies)", gen, pub)) || !strings.Contains(stdout, "content: |") {
		t.Errorf("get manifest: exit %d\n%s", code, stdout)
	}

	// $UNDERSTUDY_SIGN_KEY, and a key that is not a manifest key.
	t.Setenv("UNDERSTUDY_SIGN_KEY", keyFile)
	if code, stdout, stderr = runBinary(t, 10*time.Second, "apply", "--nats-url", url, "-f", manifest); code != exitOK || !strings.Contains(stdout, fmt.Sprintf("generation %d", gen+1)) || !strings.Contains(stdout, "signed by "+pub) {
		t.Errorf("apply with $UNDERSTUDY_SIGN_KEY: exit %d\n%s\n%s", code, stdout, stderr)
	}
	user, _ := nkeys.CreateUser()
	useed, _ := user.Seed()
	t.Setenv("UNDERSTUDY_SIGN_KEY", writeTestFile(t, dir, "user.nk", string(useed)))
	if code, _, stderr = runBinary(t, 10*time.Second, "apply", "--nats-url", url, "-f", manifest); code != exitUsage || !strings.Contains(stderr, "$UNDERSTUDY_SIGN_KEY") || !strings.Contains(stderr, "not an operator seed") {
		t.Errorf("a user seed: exit %d %s", code, stderr)
	}
	if code, _, stderr = runBinary(t, 10*time.Second, "apply", "--nats-url", url, "-f", manifest, "--sign-key", filepath.Join(dir, "none")); code != exitUsage || !strings.Contains(stderr, "--sign-key") {
		t.Errorf("a missing key file: exit %d %s", code, stderr)
	}
}
