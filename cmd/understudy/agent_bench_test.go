package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"understudy/runtime"
)

// The node agent's resident memory when idle (goal ≤ 30 MiB: the fleet
// includes Raspberry Pi class machines), measured on the real binary:
// `understudy serve --config` with only an agent section, joined to an
// external NATS (here: a server embedded in the benchmark process, so the
// agent's process holds no server). Reference in the same run: the same
// binary serving with its own embedded NATS and no agent.
//
//	go test -run '^$' -bench 'BenchmarkAgentIdleRSS' -benchtime 1x ./cmd/understudy/
func BenchmarkAgentIdleRSS(b *testing.B) {
	es, err := runtime.StartEmbedded(runtime.EmbeddedConfig{DataDir: b.TempDir(), Host: "127.0.0.1", Port: -1}, runtime.NewLogger(os.Stderr, 8, runtime.LogText))
	if err != nil {
		b.Fatal(err)
	}
	defer es.Shutdown()
	dir := b.TempDir()
	motd := filepath.Join(dir, "motd")
	agentNode := writeTestFile(b, dir, "agent.yaml", fmt.Sprintf(`node: n1
nats: {url: %q}
assets: {replicas: 1}
http: 127.0.0.1:0
log: {format: json}
agent: {observe_interval: 1s}
`, es.ClientURL()))
	embeddedNode := writeTestFile(b, dir, "embedded.yaml", fmt.Sprintf(`node: n2
data_dir: %s
nats: {listen: "127.0.0.1:0"}
http: 127.0.0.1:0
log: {format: json}
`, filepath.Join(dir, "data")))
	manifest := writeTestFile(b, dir, "m.yaml", "resources:\n  - id: motd\n    kind: file\n    spec: {path: "+motd+", content: \"hello\\n\"}\n")

	for b.Loop() {
		n, _ := startServeBinary(b, "serve", "--config", agentNode)
		// One resource to keep an eye on: the agent observes it every second.
		if code, _, stderr := runBinary(b, 10*time.Second, "apply", "--nats-url", es.ClientURL(), "-f", manifest, "--agent", "n1"); code != exitOK {
			b.Fatalf("apply: %s", stderr)
		}
		deadline := time.Now().Add(15 * time.Second)
		for {
			if got, err := os.ReadFile(motd); err == nil && string(got) == "hello\n" {
				break
			}
			if time.Now().After(deadline) {
				b.Fatal("the agent never wrote its file")
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(5 * time.Second) // idle: presence, drift checks, nothing else
		rss, hwm := memoryOf(b, n.cmd.Process.Pid)
		b.ReportMetric(rss, "MiB-rss")
		b.ReportMetric(hwm, "MiB-peak")

		e, _ := startServeBinary(b, "serve", "--config", embeddedNode)
		time.Sleep(5 * time.Second)
		rss, _ = memoryOf(b, e.cmd.Process.Pid)
		b.ReportMetric(rss, "MiB-rss-embedded-nats-ref")
		_ = n.cmd.Process.Kill()
		_ = e.cmd.Process.Kill()
	}
}

// memoryOf reads a process's resident set and its peak, in MiB.
func memoryOf(b *testing.B, pid int) (rss, peak float64) {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 2 {
			continue
		}
		kb, err := strconv.ParseFloat(string(f[1]), 64)
		if err != nil {
			continue
		}
		switch string(f[0]) {
		case "VmRSS:":
			rss = kb / 1024
		case "VmHWM:":
			peak = kb / 1024
		}
	}
	if rss == 0 {
		b.Fatalf("no VmRSS for pid %d", pid)
	}
	return rss, peak
}
