package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"understudy/runtime"
)

// The failover commands, run as the built binary.

var (
	binOnce sync.Once
	binDir  string // removed by TestMain
	binPath string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// understudyBinary builds the binary once per test run, with
// understudy-libvirt beside it as make build puts it (a node that runs an
// agent needs it at load).
func understudyBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "understudy-cli-test-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "understudy")
		out, err := exec.Command("go", "build", "-tags", "libvirt_dlopen", "-o", binDir+string(filepath.Separator), ".", "understudy/cmd/understudy-libvirt").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// runBinary runs the binary to completion and returns its exit code and output.
func runBinary(t testing.TB, timeout time.Duration, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(understudyBinary(t), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatalf("%v: %v", args, err)
		}
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%v still running after %v; stderr:\n%s", args, timeout, errb.String())
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// Fast rules: failover_timeout 1s >= (2 + 1) * 200ms + 300ms.
const (
	fastHeartbeat = 200 * time.Millisecond
	fastFailover  = time.Second
	fastRulesYAML = `heartbeat_timeout: 200ms
failure_threshold: 2
success_threshold: 2
failover_timeout: 1s
fence_grace: 300ms
`
	// cliSlack is what timing bounds allow for a loaded machine.
	cliSlack = 400 * time.Millisecond
)

// provisionedNATS starts an embedded NATS server with its data in dir and
// the default assets provisioned, and connects to it; the connection and
// the server end with the test.
func provisionedNATS(t testing.TB, dir string) (*runtime.EmbeddedNATS, *nats.Conn, jetstream.JetStream, runtime.AssetsConfig) {
	t.Helper()
	logger := runtime.NewLogger(os.Stderr, 8, runtime.LogText)
	es, err := runtime.StartEmbedded(runtime.EmbeddedConfig{DataDir: filepath.Join(dir, "nats"), Host: "127.0.0.1", Port: -1}, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(es.Shutdown)
	nc, err := nats.Connect(es.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	names := runtime.DefaultConfig().Assets
	if _, err := runtime.Provision(ctx, js, runtime.DefaultAssets(names, 1), logger); err != nil {
		t.Fatal(err)
	}
	return es, nc, js, names
}

func writeTestFile(t testing.TB, dir, name, body string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestDemoJSONSummary(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pairFile := writeTestFile(t, dir, "fast.yaml", "pair: demo-fast\nprimary: site-a\nreplica: site-b\n"+fastRulesYAML)
	code, stdout, stderr := runBinary(t, 30*time.Second, "demo", "--kill-after", "1s", "--json", "--pair-config", pairFile,
		"--data-dir", filepath.Join(dir, "data"))
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}

	// stdout is exactly one JSON object.
	dec := json.NewDecoder(strings.NewReader(stdout))
	var sum map[string]any
	if err := dec.Decode(&sum); err != nil {
		t.Fatalf("stdout is not a JSON object: %v\n%s", err, stdout)
	}
	if err := dec.Decode(new(any)); err != io.EOF {
		t.Fatalf("stdout holds more than one JSON value (%v):\n%s", err, stdout)
	}
	t.Logf("summary: %v", sum)
	if sum["pair"] != "demo-fast" || sum["primary"] != "site-a" || sum["replica"] != "site-b" {
		t.Errorf("pair and sites from the pair file: %v", sum)
	}
	if sum["promoted"] != "site-b" || sum["promotions"] != 1.0 || sum["mode"] != "power-cut" {
		t.Errorf("promoted %v %v times (mode %v), want site-b once", sum["promoted"], sum["promotions"], sum["mode"])
	}
	fo, hb := float64(fastFailover.Milliseconds()), float64(fastHeartbeat.Milliseconds())
	failoverMS, _ := sum["failover_ms"].(float64)
	if max := fo + 2*hb + float64(cliSlack.Milliseconds()); failoverMS < fo || failoverMS > max {
		t.Errorf("failover_ms %v, want %v..%v", sum["failover_ms"], fo, max)
	}
	if sum["failover_timeout_ms"] != fo || sum["heartbeat_timeout_ms"] != hb {
		t.Errorf("rules in the summary: failover_timeout_ms %v heartbeat_timeout_ms %v", sum["failover_timeout_ms"], sum["heartbeat_timeout_ms"])
	}
	for _, k := range []string{"serving_at", "promoted_at", "promotion_attempt_at", "last_primary_heartbeat", "fault_at"} {
		if s, _ := sum[k].(string); s == "" {
			t.Errorf("%s missing: %v", k, sum[k])
		}
	}

	// The live lines go to stderr, in the order things happened.
	for _, want := range []string{"embedded NATS at nats://", "site-a  failover.serving_started", "POWER CUT", "site-b  failover.promoted", "site-b  failover.serving_started"} {
		i := strings.Index(stderr, want)
		if i < 0 {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
			continue
		}
		stderr = stderr[i:]
	}
	if strings.Contains(stdout, "POWER CUT") {
		t.Errorf("live lines on stdout with --json")
	}
}

// servingNode is `understudy serve` running in the background.
type servingNode struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once Wait returned waitErr
	wait   error

	mu   sync.Mutex
	logs bytes.Buffer
}

func (n *servingNode) stderr() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.logs.String()
}

// startServe starts serve with args and returns it with its "ready" line.
func startServeBinary(t testing.TB, args ...string) (*servingNode, map[string]any) {
	t.Helper()
	n := &servingNode{cmd: exec.Command(understudyBinary(t), args...), exited: make(chan struct{})}
	stderr, err := n.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			n.mu.Lock()
			n.logs.Write(append(sc.Bytes(), '\n'))
			n.mu.Unlock()
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == "ready" {
				ready <- line
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		n.wait = n.cmd.Wait()
		close(n.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-n.exited:
		default:
			_ = n.cmd.Process.Kill()
			<-n.exited
		}
		if t.Failed() {
			t.Logf("serve's stderr:\n%s", n.stderr())
		}
	})
	select {
	case line := <-ready:
		return n, line
	case <-n.exited:
		t.Fatalf("serve exited before ready: %v", n.wait)
	case <-time.After(15 * time.Second):
		t.Fatal("no ready line within 15s")
	}
	return nil, nil
}

func statusOf(t *testing.T, url, pair string) []PairStatus {
	t.Helper()
	code, stdout, stderr := runBinary(t, 15*time.Second, "status", "--nats-url", url, "--pair", pair, "--json")
	if code != exitOK {
		t.Fatalf("status: exit %d; stderr: %s", code, stderr)
	}
	var st []PairStatus
	if err := json.Unmarshal([]byte(stdout), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, stdout)
	}
	return st
}

// waitLeader polls status until leader leads pair, unfenced.
func waitLeader(t *testing.T, url, pair, leader string, timeout time.Duration) PairStatus {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		st := statusOf(t, url, pair)
		if len(st) == 1 && st[0].Pair == pair && st[0].Leader == leader && !st[0].Fenced {
			return st[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("status after %v: %+v, want %s leading %s", timeout, st, leader, pair)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

const exitTrue = `{steps: [{driver: exec, timeout: 200ms, exec: {command: "true"}}]}`

// pairMemberYAML is one entry of a node file's pairs hosting member.
func pairMemberYAML(pair, member string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "  - pair: %s\n    primary: site-a\n    replica: site-b\n    member: %s\n", pair, member)
	for _, l := range strings.Split(strings.TrimSpace(fastRulesYAML), "\n") {
		b.WriteString("    " + l + "\n")
	}
	fmt.Fprintf(&b, "    procedures:\n      fence: %s\n      promote: %s\n      demote: %s\n", exitTrue, exitTrue, exitTrue)
	return b.String()
}

func TestServeNodeFileStatusSwitchover(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const pair = "cli-pair"
	node := writeTestFile(t, dir, "node.yaml", `node: site-a
data_dir: `+filepath.Join(dir, "data")+`
nats: {listen: "127.0.0.1:0"}
http: 127.0.0.1:0
log: {format: json}
pairs:
`+pairMemberYAML(pair, "site-a")+pairMemberYAML(pair, "site-b"))
	n, ready := startServeBinary(t, "serve", "--config", node)
	url, _ := ready["client_url"].(string)
	if !strings.HasPrefix(url, "nats://127.0.0.1:") || ready["members"] != 2.0 {
		t.Fatalf("ready line: %v", ready)
	}

	st := waitLeader(t, url, pair, "site-a", 5*time.Second)
	if st.Term != 1 {
		t.Errorf("status: %+v, want site-a in term 1", st)
	}
	// The follower's own heartbeat, by the server's clock.
	time.Sleep(2 * fastHeartbeat)
	if hb, ok := statusOf(t, url, pair)[0].Heartbeats["site-b"]; !ok || hb.Phase != "follower" || hb.Age > 1 {
		t.Errorf("status: site-b's heartbeat %+v (present %v), want a fresh follower heartbeat", hb, ok)
	}

	code, stdout, stderr := runBinary(t, 20*time.Second, "switchover", "--nats-url", url, "--pair", pair, "--to", "site-b", "--wait", "10s")
	if code != exitOK {
		t.Fatalf("switchover: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "site-b now holds the register of pair "+pair) {
		t.Errorf("switchover printed %q", stdout)
	}
	st = statusOf(t, url, pair)[0]
	if st.Leader != "site-b" || st.Fenced || st.Term != 2 {
		t.Errorf("status after switchover: %+v, want site-b in term 2", st)
	}

	if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-n.exited:
		if n.wait != nil {
			t.Fatalf("serve after SIGTERM: %v, want exit code 0", n.wait)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("serve still running 5s after SIGTERM")
	}
	for _, l := range strings.Split(strings.TrimSpace(n.stderr()), "\n") {
		var line map[string]any
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Errorf("stderr line not JSON: %q", l)
			continue
		}
		if line["level"] == "ERROR" {
			t.Errorf("serve logged an error: %s", l)
		}
	}
}

func TestServeRefusesUnsafePair(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	node := writeTestFile(t, dir, "bad.yaml", `node: site-a
data_dir: `+filepath.Join(dir, "data")+`
nats: {listen: "127.0.0.1:0"}
http: 127.0.0.1:0
pairs:
  - pair: unsafe
    primary: site-a
    replica: site-b
    heartbeat_timeout: 200ms
    failover_timeout: 800ms
    fence_grace: 300ms
    procedures:
      fence: `+exitTrue+`
`)
	code, stdout, stderr := runBinary(t, 15*time.Second, "serve", "--config", node)
	if code != exitUsage {
		t.Fatalf("exit %d, want %d; stderr:\n%s", code, exitUsage, stderr)
	}
	for _, want := range []string{
		"pairs[0].failover_timeout",
		"safety inequality: failover_timeout >= (failure_threshold + 1) * heartbeat_timeout + fence_grace",
		"(2 + 1) * 200ms + 300ms = 900ms",
		"raise failover_timeout to at least 900ms",
		`(got 800ms)`,
		"understudy serve --help",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if stdout != "" {
		t.Errorf("stdout %q", stdout)
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused configuration started something: data dir %v", err)
	}
}

func TestStatusWithoutNATSFailsFast(t *testing.T) {
	t.Parallel()
	understudyBinary(t) // built before the clock starts
	start := time.Now()
	code, stdout, stderr := runBinary(t, 15*time.Second, "status", "--nats-url", "nats://127.0.0.1:1")
	took := time.Since(start)
	if code != exitFailure {
		t.Errorf("exit %d, want %d; stderr %q", code, exitFailure, stderr)
	}
	if took > 3*time.Second {
		t.Errorf("took %v to give up on a closed port", took)
	}
	for _, want := range []string{"connect to NATS at nats://127.0.0.1:1", "is a node running?"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr %q lacks %q", stderr, want)
		}
	}
	if stdout != "" {
		t.Errorf("stdout %q", stdout)
	}
	// A password in the URL never reaches an error message.
	_, _, stderr = runBinary(t, 15*time.Second, "status", "--nats-url", "nats://operator:s3cret@127.0.0.1:1")
	if strings.Contains(stderr, "s3cret") || !strings.Contains(stderr, "connect to NATS at nats://operator:xxxxx@127.0.0.1:1") {
		t.Errorf("stderr with a password in the URL: %q", stderr)
	}
}

// A switchover towards a member that does not run is refused by the
// leader, which keeps serving; the command says why and fails.
func TestSwitchoverToAbsentMemberIsRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const pair = "cli-lonely"
	node := writeTestFile(t, dir, "node.yaml", `node: site-a
data_dir: `+filepath.Join(dir, "data")+`
nats: {listen: "127.0.0.1:0"}
http: 127.0.0.1:0
log: {format: json}
pairs:
`+pairMemberYAML(pair, "site-a"))
	_, ready := startServeBinary(t, "serve", "--config", node)
	url, _ := ready["client_url"].(string)
	st := waitLeader(t, url, pair, "site-a", 5*time.Second)

	code, stdout, stderr := runBinary(t, 20*time.Second, "switchover", "--nats-url", url, "--pair", pair, "--to", "site-b", "--wait", "10s")
	if code == exitOK {
		t.Fatalf("switchover to an absent member succeeded: %s", stdout)
	}
	if !strings.Contains(stderr, "refused by the leader") || !strings.Contains(stderr, "no heartbeat of site-b seen") {
		t.Errorf("switchover stderr %q does not say why it was refused", stderr)
	}
	after := waitLeader(t, url, pair, "site-a", time.Second)
	if after.Term != st.Term {
		t.Errorf("term moved from %d to %d: the leader let go", st.Term, after.Term)
	}
}
