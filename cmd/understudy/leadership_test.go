package main

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The first node records the deployment's leadership; `leadership set`
// refuses while a node runs; a node whose file disagrees with the record
// refuses to start, naming both; one that agrees starts.
func TestLeadershipRecordAndSet(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const pair = "cli-leadership"
	data := filepath.Join(dir, "data")
	file := func(name, extra string, members string) string {
		return writeTestFile(t, dir, name, "node: site-a\n"+extra+"data_dir: "+data+`
nats: {listen: "127.0.0.1:0"}
http: 127.0.0.1:0
log: {format: json}
`+members)
	}
	perPair := file("per-pair.yaml", "", "pairs:\n"+pairMemberYAML(pair, "site-a"))
	node := file("node.yaml", "leadership: node\n", "pairs:\n"+pairMemberYAML(pair, "site-a"))
	store := file("store.yaml", "", "")

	stop := func(n *servingNode) {
		t.Helper()
		_ = n.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-n.exited:
		case <-time.After(20 * time.Second):
			t.Fatal("serve did not stop within 20s")
		}
	}

	n, ready := startServeBinary(t, "serve", "--config", perPair)
	url, _ := ready["client_url"].(string)
	code, stdout, stderr := runBinary(t, 15*time.Second, "leadership", "show", "--nats-url", url)
	if code != exitOK || !strings.Contains(stdout, "leadership per-pair, recorded by site-a") {
		t.Fatalf("leadership show: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	code, stdout, stderr = runBinary(t, 15*time.Second, "leadership", "set", "node", "--nats-url", url)
	if code == exitOK || !strings.Contains(stderr, "a node appears to run") {
		t.Fatalf("leadership set while a node runs: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	code, _, stderr = runBinary(t, 15*time.Second, "leadership", "set", "both", "--nats-url", url)
	if code == exitOK || !strings.Contains(stderr, "leadership") {
		t.Fatalf("leadership set both: exit %d, stderr: %s", code, stderr)
	}
	stop(n)

	// Every node stopped: the store alone (no members) serves the bucket.
	n, ready = startServeBinary(t, "serve", "--config", store)
	url, _ = ready["client_url"].(string)
	code, stdout, stderr = runBinary(t, 15*time.Second, "leadership", "set", "node", "--force", "--nats-url", url)
	if code != exitOK || !strings.Contains(stdout, "leadership node recorded") {
		t.Fatalf("leadership set node --force: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	stop(n)

	code, _, stderr = runBinary(t, 30*time.Second, "serve", "--config", perPair)
	if code == exitOK || !strings.Contains(stderr, "the node file says per-pair, but this deployment runs node") {
		t.Fatalf("a per-pair node in a node deployment: exit %d\nstderr: %s", code, stderr)
	}
	n, _ = startServeBinary(t, "serve", "--config", node)
	stop(n)
}
