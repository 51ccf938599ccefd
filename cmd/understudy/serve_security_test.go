package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// serve refuses an embedded server off loopback without TLS and the
// deployment's identities, saying what is missing and where to get it.
func TestServeRefusesOffLoopbackWithoutSecurity(t *testing.T) {
	code, _, errOut := runCLI(t, "serve", "--data-dir", t.TempDir(), "--nats-listen", "0.0.0.0:4222")
	if code != exitUsage {
		t.Fatalf("exit %d, want %d (stderr %q)", code, exitUsage, errOut)
	}
	for _, want := range []string{"--nats-listen: the embedded NATS server listens off loopback", "nats.server.tls", "security section", "understudy init", "docs/security.md"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr %q does not contain %q", errOut, want)
		}
	}
}

// --nats-nkey, and $UNDERSTUDY_NATS_NKEY when the flag is not given, name
// the node's seed file, checked at load.
func TestServeNKeyFlagAndEnvironment(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.nk")
	code, _, errOut := runCLI(t, "serve", "--data-dir", t.TempDir(), "--nats-nkey", missing)
	if code != exitUsage || !strings.Contains(errOut, "--nats-nkey: must be a readable file") {
		t.Errorf("flag: exit %d, stderr %q", code, errOut)
	}
	t.Setenv("UNDERSTUDY_NATS_NKEY", missing)
	code, _, errOut = runCLI(t, "serve", "--data-dir", t.TempDir())
	if code != exitUsage || !strings.Contains(errOut, "--nats-nkey: must be a readable file") || !strings.Contains(errOut, missing) {
		t.Errorf("environment: exit %d, stderr %q", code, errOut)
	}
}
