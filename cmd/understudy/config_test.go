package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// understudy config set: validated locally, written by CAS, and each
// member's verdict reported; a change a member refuses fails the command
// and shows in status.
func TestConfigSetReportsVerdicts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const pair = "cli-config"
	node := writeTestFile(t, dir, "node.yaml", `node: site-a
data_dir: `+filepath.Join(dir, "data")+`
nats: {listen: "127.0.0.1:0"}
http: 127.0.0.1:0
log: {format: json}
pairs:
`+pairMemberYAML(pair, "site-a")+pairMemberYAML(pair, "site-b"))
	_, ready := startServeBinary(t, "serve", "--config", node)
	url, _ := ready["client_url"].(string)
	waitLeader(t, url, pair, "site-a", 5*time.Second)
	time.Sleep(2 * fastHeartbeat) // both members have seen the config key

	head := "pair: " + pair + "\nprimary: site-a\nreplica: site-b\n"
	// Refused locally: the safety inequality, with field and numbers.
	unsafe := writeTestFile(t, dir, "unsafe.yaml", head+strings.Replace(fastRulesYAML, "failover_timeout: 1s", "failover_timeout: 500ms", 1))
	code, _, stderr := runBinary(t, 10*time.Second, "config", "set", "--nats-url", url, "-f", unsafe)
	if code == exitOK || !strings.Contains(stderr, "failover_timeout") || !strings.Contains(stderr, "safety inequality") {
		t.Errorf("unsafe file: exit %d, stderr %q", code, stderr)
	}

	// Applied by both.
	slower := writeTestFile(t, dir, "slower.yaml", head+strings.Replace(fastRulesYAML, "failover_timeout: 1s", "failover_timeout: 2s", 1))
	code, stdout, stderr := runBinary(t, 20*time.Second, "config", "set", "--nats-url", url, "-f", slower)
	if code != exitOK || !strings.Contains(stdout, "site-a applied revision") || !strings.Contains(stdout, "site-b applied revision") {
		t.Fatalf("config set: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	code, stdout, _ = runBinary(t, 10*time.Second, "config", "get", "--nats-url", url, "--pair", pair)
	if code != exitOK || !strings.Contains(stdout, "failover_timeout: 2s") {
		t.Errorf("config get: exit %d\n%s", code, stdout)
	}

	// Refused by the members: fence_grace under the fence chain's 200ms.
	short := writeTestFile(t, dir, "short.yaml", head+strings.Replace(fastRulesYAML, "fence_grace: 300ms", "fence_grace: 100ms", 1))
	code, stdout, stderr = runBinary(t, 20*time.Second, "config", "set", "--nats-url", url, "-f", short)
	if code == exitOK || !strings.Contains(stdout, "REFUSED") || !strings.Contains(stderr, "fence_grace") {
		t.Fatalf("config set of a fence_grace under the fence chain: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	// The follower's next own heartbeat carries its verdict.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st := statusOf(t, url, pair)[0]
		hb := st.Heartbeats["site-b"]
		if st.Rules != nil && hb.RejectedRev == st.Rules.Rev && hb.RulesRev != 0 && hb.RulesRev < st.Rules.Rev {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status after a refused change: rules %+v, site-b %+v", st.Rules, hb)
		}
	}
	code, stdout, _ = runBinary(t, 10*time.Second, "status", "--nats-url", url, "--pair", pair)
	if code != exitOK || !strings.Contains(stdout, "REFUSED rules rev") {
		t.Errorf("status text does not show the refusal:\n%s", stdout)
	}
}
