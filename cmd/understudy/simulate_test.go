package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"understudy/events"
)

func TestSimulateList(t *testing.T) {
	code, out, errOut := runCLI(t, "simulate", "--list")
	if code != exitOK || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	for _, name := range []string{"power-cut", "flaky-network", "slow-death", "replica-partition", "replica-lag", "late-ack",
		"clock-jump", "failed-fence", "return-to-normal", "switchover", "random"} {
		if !regexp.MustCompile(`(?m)^` + name + ` +\S.*$`).MatchString(out) {
			t.Errorf("--list lacks a line for %s:\n%s", name, out)
		}
	}
}

type simulateJSON struct {
	Scenario         string  `json:"scenario"`
	Seed             uint64  `json:"seed"`
	SimulatedSeconds float64 `json:"simulated_seconds"`
	WallSeconds      float64 `json:"wall_seconds"`
	Steps            uint64  `json:"steps"`
	Digest           string  `json:"digest"`
	Violations       []struct {
		Invariant string  `json:"invariant"`
		At        float64 `json:"at"`
		Detail    string  `json:"detail"`
	} `json:"violations"`
	Failovers        int     `json:"failovers"`
	MaxUnavailableMS float64 `json:"max_unavailable_ms"`
	Reproduce        string  `json:"reproduce"`
	Sometimes        []struct {
		Name  string `json:"name"`
		Count int    `json:"count"`
	} `json:"sometimes"`
}

func simulateRun(t *testing.T, args ...string) (int, simulateJSON, string) {
	t.Helper()
	code, out, errOut := runCLI(t, append([]string{"simulate"}, args...)...)
	var r simulateJSON
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v: exit %d, stdout is not one JSON object: %v\n%s\nstderr: %s", args, code, err, out, errOut)
	}
	return code, r, errOut
}

func TestSimulateScenarioJSON(t *testing.T) {
	code, r, errOut := simulateRun(t, "--scenario", "power-cut", "--seed", "3", "--json")
	if code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if r.Scenario != "power-cut" || r.Seed != 3 || r.SimulatedSeconds != 120 || r.WallSeconds <= 0 || r.Steps == 0 ||
		len(r.Digest) != 64 || r.Violations == nil || len(r.Violations) != 0 || r.Failovers != 1 || r.MaxUnavailableMS <= 0 {
		t.Fatalf("result %+v", r)
	}
	if r.Reproduce != "understudy simulate --scenario power-cut --seed 3 --duration 2m" {
		t.Errorf("reproduce %q", r.Reproduce)
	}
	_, again, _ := simulateRun(t, "--scenario", "power-cut", "--seed", "3", "--json", "--duration", "2m")
	if again.Digest != r.Digest {
		t.Errorf("same seed, digests %s and %s", r.Digest, again.Digest)
	}
	_, other, _ := simulateRun(t, "--scenario", "power-cut", "--seed", "4", "--json")
	if other.Digest == r.Digest {
		t.Errorf("seeds 3 and 4 gave the same digest")
	}
}

// --host-batch and --host-raise-once reach the run and its reproduce command.
func TestSimulateHostBatch(t *testing.T) {
	args := []string{"--scenario", "power-cut", "--seed", "1", "--duration", "30s", "--leadership", "node", "--pairs", "100",
		"--store-write-time", "1ms", "--host-write-bound", "64", "--host-batch", "256", "--host-raise-once", "--json"}
	code, r, errOut := simulateRun(t, args...)
	if code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	want := "understudy simulate --scenario power-cut --seed 1 --duration 30s --leadership node --pairs 100 --store-write-time 1ms --host-write-bound 64 --host-batch 256 --host-raise-once"
	if r.Reproduce != want {
		t.Errorf("reproduce %q, want %q", r.Reproduce, want)
	}
	sent, appends := 0, 0
	for _, c := range r.Sometimes {
		switch c.Name {
		case "host-batch-sent":
			sent = c.Count
		case "host-batch-appends-sent":
			appends = c.Count
		}
	}
	if sent == 0 || appends == 0 {
		t.Errorf("%d batches of KV writes sent, %d of appends: %+v", sent, appends, r.Sometimes)
	}

	// --host-batch-no-appends keeps the appends out of the batches.
	code, r, errOut = simulateRun(t, append(args, "--host-batch-no-appends")...)
	if code != exitOK {
		t.Fatalf("--host-batch-no-appends: exit %d, stderr %q", code, errOut)
	}
	want = strings.Replace(want, "--host-batch 256", "--host-batch 256 --host-batch-no-appends", 1)
	if r.Reproduce != want {
		t.Errorf("reproduce %q, want %q", r.Reproduce, want)
	}
	for _, c := range r.Sometimes {
		if c.Name == "host-batch-appends-sent" {
			t.Errorf("--host-batch-no-appends: %d batches of appends sent", c.Count)
		}
	}
}

// The digest is the same whatever GOMAXPROCS the process runs with.
func TestSimulateDigestAcrossGOMAXPROCS(t *testing.T) {
	var digests []string
	for _, procs := range []string{"1", "2"} {
		cmd := exec.Command(understudyBinary(t), "simulate", "--scenario", "random", "--seed", "11", "--duration", "30m", "--json")
		cmd.Env = append(os.Environ(), "GOMAXPROCS="+procs)
		out, err := cmd.Output()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatal(err)
		}
		var r simulateJSON
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("GOMAXPROCS=%s: %v\n%s", procs, err, out)
		}
		digests = append(digests, r.Digest)
	}
	if digests[0] != digests[1] || len(digests[0]) != 64 {
		t.Fatalf("digests %v differ between GOMAXPROCS=1 and 2", digests)
	}
}

func TestSimulateOutWritesExport(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.export")
	code, out, errOut := runCLI(t, "simulate", "--scenario", "slow-death", "--seed", "1", "--out", path)
	if code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if !strings.Contains(out, "history written to "+path) || !strings.Contains(out, "no invariant violated") {
		t.Errorf("output:\n%s", out)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := events.NewExportReader(f)
	if err != nil {
		t.Fatal(err)
	}
	streams := map[string]int{}
	subjects := map[string]bool{}
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		streams[rec.Stream]++
		subjects[rec.Subject] = true
	}
	for _, want := range []string{"$KV.understudy_failover.pg-main.leader", "$KV.understudy_failover.pg-main.hb.site-b",
		"ev.failover.pg-main.site-a", "ev.failover.pg-main.site-b", "ev.procedure.pg-main.site-a"} {
		if !subjects[want] {
			t.Errorf("export lacks subject %s (streams %v)", want, streams)
		}
	}
	if streams["KV_understudy_failover"] == 0 || streams["UNDERSTUDY_EVENTS"] == 0 || r.Header().Meta["scenario"] != "slow-death" {
		t.Errorf("streams %v, header %+v", streams, r.Header())
	}
}

const unsafePairYAML = `pair: pg-main
primary: site-a
replica: site-b
heartbeat_timeout: 1s
failure_threshold: 2
success_threshold: 2
failover_timeout: 2s
fence_grace: 2s
`

// Rules that break the safety inequality are refused; with
// --allow-unsafe-config the swarm finds the split brain, prints the command
// that reproduces each failing seed, and that command does.
func TestSimulateUnsafeConfigSwarmFindsSplitBrain(t *testing.T) {
	pair := writeTestFile(t, t.TempDir(), "unsafe.yaml", unsafePairYAML)
	code, _, errOut := runCLI(t, "simulate", "--scenario", "random", "--seed", "1", "--pair-config", pair)
	if code != exitUsage || !strings.Contains(errOut, "safety inequality") || !strings.Contains(errOut, "--allow-unsafe-config") {
		t.Fatalf("unsafe rules: exit %d, stderr %q", code, errOut)
	}
	code, out, errOut := runCLI(t, "simulate", "--swarm", "--seeds", "4", "--duration", "10m", "--pair-config", pair, "--allow-unsafe-config", "--shrink-budget", "60")
	if code != exitFailure || !strings.Contains(errOut, "seeds violated an invariant") {
		t.Fatalf("swarm: exit %d, stderr %q\n%s", code, errOut, out)
	}
	m := regexp.MustCompile(`(?m)^  reproduce: understudy (simulate --scenario random --seed \d+ --duration 10m --pair-config \S+ --allow-unsafe-config)$`).FindStringSubmatch(out)
	if m == nil || !strings.Contains(out, "split-brain") || !strings.Contains(out, "minimal schedule (") {
		t.Fatalf("swarm output lacks a split brain with its reproduce command and minimal schedule:\n%s", out)
	}
	code, again, _ := simulateRun(t, append(strings.Fields(m[1])[1:], "--json")...)
	if code != exitFailure || len(again.Violations) == 0 {
		t.Fatalf("reproduce command %q: exit %d, violations %v", m[1], code, again.Violations)
	}
	mm := regexp.MustCompile(`(?m)^  reproduce minimal: understudy simulate (.*) --faults '([^']*)'$`).FindStringSubmatch(out)
	if mm == nil {
		t.Fatalf("no minimal reproduce line:\n%s", out)
	}
	code, minimal, _ := simulateRun(t, append(strings.Fields(mm[1]), "--faults", mm[2], "--json")...)
	if code != exitFailure || len(minimal.Violations) == 0 {
		t.Fatalf("minimal reproduce: exit %d, violations %v", code, minimal.Violations)
	}
}

func TestSimulateSwarmJSON(t *testing.T) {
	code, out, errOut := runCLI(t, "simulate", "--swarm", "--seeds", "4", "--first-seed", "1", "--duration", "3m", "--json")
	var r struct {
		Seeds            int               `json:"seeds"`
		Failed           []json.RawMessage `json:"failed"`
		SimulatedSeconds float64           `json:"simulated_seconds"`
		WallSeconds      float64           `json:"wall_seconds"`
		Workers          int               `json:"workers"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("exit %d: %v\n%s\n%s", code, err, out, errOut)
	}
	if r.Seeds != 4 || r.Failed == nil || r.SimulatedSeconds != 4*180 || r.WallSeconds <= 0 || r.Workers < 1 {
		t.Fatalf("swarm result %s", out)
	}
	if want := exitOK; len(r.Failed) > 0 {
		want = exitFailure
		if code != want {
			t.Fatalf("exit %d with %d failed seeds", code, len(r.Failed))
		}
	} else if code != want {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}

func TestSimulateFaultsFlag(t *testing.T) {
	code, r, errOut := simulateRun(t, "--scenario", "random", "--seed", "5", "--duration", "2m", "--json",
		"--faults", "partition(site-a,both)@30s+12s;crash(site-b)@1m30s+5s")
	if code != exitOK || r.Failovers != 1 {
		t.Fatalf("exit %d, failovers %d, stderr %q", code, r.Failovers, errOut)
	}
	if !strings.Contains(r.Reproduce, "--faults 'partition(site-a,both)@30s+12s;crash(site-b)@1m30s+5s'") {
		t.Errorf("reproduce %q", r.Reproduce)
	}
	code, quiet, _ := simulateRun(t, "--scenario", "random", "--seed", "5", "--duration", "2m", "--json", "--faults", "")
	if code != exitOK || quiet.Failovers != 0 {
		t.Fatalf("no faults: exit %d, failovers %d", code, quiet.Failovers)
	}
}

func TestSimulateTrace(t *testing.T) {
	code, out, _ := runCLI(t, "simulate", "--scenario", "power-cut", "--seed", "2", "--trace")
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"fault   powercut(site-a)", "failover.promoted", "resource SERVING"} {
		if !strings.Contains(out, want) {
			t.Errorf("trace lacks %q", want)
		}
	}
}

func TestSimulateUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"simulate"}, "give --scenario NAME"},
		{[]string{"simulate", "--scenario", "nope"}, `unknown scenario "nope"`},
		{[]string{"simulate", "--swarm"}, "--swarm needs --seeds"},
		{[]string{"simulate", "--swarm", "--seeds", "2", "--scenario", "power-cut"}, "takes no --scenario"},
		{[]string{"simulate", "--scenario", "random", "--seeds", "3"}, "--seeds needs --swarm"},
		{[]string{"simulate", "--scenario", "random", "--faults", "flood(site-a)@1s"}, `unknown fault "flood"`},
		{[]string{"simulate", "--scenario", "random", "--fsync", "sometimes"}, "--fsync"},
		{[]string{"simulate", "--list", "--scenario", "random"}, "--list takes no --scenario"},
		{[]string{"simulate", "--scenario", "random", "--pair-config", "/nonexistent/pair.yaml"}, "pair file"},
		{[]string{"simulate", "--scenario", "random", "--host-batch", "256"}, "--host-batch needs --host-write-bound"},
		{[]string{"simulate", "--scenario", "random", "--host-write-bound", "64", "--host-batch", "257"}, "--host-batch = 257"},
		{[]string{"simulate", "--scenario", "random", "--host-write-bound", "64", "--host-batch-no-appends"}, "--host-batch-no-appends needs --host-batch"},
		{[]string{"simulate", "--scenario", "random", "--host-start-cost", "1ms"}, "--host-start-limit need --host-step-cost"},
		{[]string{"simulate", "--scenario", "random", "--host-step-cost", "20us", "--host-start-limit", "-2"}, "--host-start-limit is -1 (unbounded)"},
	} {
		code, _, errOut := runCLI(t, tc.args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, errOut, exitUsage, tc.want)
		}
	}
}

// Violations exit 1 and print how to reproduce them (a planted fault: the
// power cut in the switchover scenario breaks its expectation).
func TestSimulateViolationExitsOne(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(t.Context(), []string{"simulate", "--scenario", "switchover", "--seed", "1", "--faults", "powercut(site-a)@30s"}, &out, &errb)
	if code != exitFailure || !strings.Contains(out.String(), "VIOLATION scenario-expectation") ||
		!strings.Contains(out.String(), "reproduce: understudy simulate --scenario switchover --seed 1 --duration 4m --faults 'powercut(site-a)@30s' --trace") {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errb.String())
	}
}
