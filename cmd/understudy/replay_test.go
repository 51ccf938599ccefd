package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"understudy/actors/failover"
	"understudy/runtime"
)

// replayJSON is the part of `replay --format json` the tests read.
type replayJSON struct {
	Pair       string `json:"pair"`
	Leadership []struct {
		Site string     `json:"site"`
		Term uint64     `json:"term"`
		From time.Time  `json:"from"`
		To   *time.Time `json:"to"`
	} `json:"leadership"`
	Failovers []struct {
		From                 string     `json:"from"`
		To                   string     `json:"to"`
		LastPrimaryHeartbeat *time.Time `json:"last_primary_heartbeat"`
		PromotedAt           *time.Time `json:"promoted_at"`
		FailoverMS           *float64   `json:"failover_ms"`
		DetectionMS          *float64   `json:"detection_ms"`
		ServingMS            *float64   `json:"serving_ms"`
		ReadOnlyGapMS        *float64   `json:"read_only_gap_ms"`
	} `json:"failovers"`
	SplitBrain   []any                     `json:"split_brain"`
	Heartbeats   map[string]map[string]any `json:"heartbeats"`
	Availability struct {
		Fraction float64 `json:"fraction"`
	} `json:"availability"`
	Partial *struct {
		Offset    int64 `json:"offset"`
		Recovered int   `json:"recovered"`
	} `json:"partial"`
	Records struct {
		Read    int `json:"read"`
		Corrupt int `json:"corrupt"`
		Gaps    int `json:"gaps"`
		Unknown int `json:"unknown"`
	} `json:"records"`
}

func decodeReplay(t *testing.T, stdout string) replayJSON {
	t.Helper()
	var r replayJSON
	dec := json.NewDecoder(strings.NewReader(stdout))
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("replay --format json: %v\n%s", err, stdout)
	}
	if dec.More() {
		t.Fatalf("stdout holds more than one JSON value:\n%s", stdout)
	}
	return r
}

// checkAgainstTrial: the replay finds the failover the trial measured, to
// within a few milliseconds (both read the same server timestamps).
func checkAgainstTrial(t *testing.T, r replayJSON, sum runtime.TrialSummary) {
	t.Helper()
	if len(r.Failovers) != 1 {
		t.Fatalf("replay found %d failovers, want 1: %+v", len(r.Failovers), r.Failovers)
	}
	fo := r.Failovers[0]
	if fo.From != sum.Primary || fo.To != sum.Promoted {
		t.Errorf("replay: failover %s → %s; trial: %s → %s", fo.From, fo.To, sum.Primary, sum.Promoted)
	}
	near := func(what string, got *float64, want float64) {
		t.Helper()
		if got == nil || math.Abs(*got-want) > 3 {
			t.Errorf("%s: replay %v ms, trial %v ms (want within 3 ms)", what, deref(got), want)
		}
	}
	near("failover_ms", fo.FailoverMS, sum.FailoverMS)
	near("detection_ms", fo.DetectionMS, sum.DetectionMS)
	near("serving_ms", fo.ServingMS, sum.ServingMS)
	if fo.LastPrimaryHeartbeat == nil || !fo.LastPrimaryHeartbeat.Equal(sum.LastPrimaryHeartbeat) {
		t.Errorf("last primary heartbeat: replay %v, trial %v", fo.LastPrimaryHeartbeat, sum.LastPrimaryHeartbeat)
	}
	if len(r.SplitBrain) != 0 {
		t.Errorf("split brain in a clean failover: %v", r.SplitBrain)
	}
	if len(r.Leadership) != 2 || r.Leadership[0].Site != sum.Primary || r.Leadership[1].Site != sum.Promoted {
		t.Errorf("leadership %+v", r.Leadership)
	}
	if r.Records.Corrupt != 0 || r.Records.Gaps != 0 || r.Records.Unknown != 0 {
		t.Errorf("records %+v", r.Records)
	}
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

// `understudy demo --out`: the record of a real embedded-NATS failover
// replays to the failover the demo itself measured.
func TestDemoOutReplays(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pairFile := writeTestFile(t, dir, "fast.yaml", "pair: demo-out\nprimary: site-a\nreplica: site-b\n"+fastRulesYAML)
	export := filepath.Join(dir, "demo.export")
	code, stdout, stderr := runBinary(t, 30*time.Second, "demo", "--kill-after", "1s", "--json", "--pair-config", pairFile,
		"--data-dir", filepath.Join(dir, "data"), "--out", export)
	if code != exitOK {
		t.Fatalf("demo exit %d; stderr:\n%s", code, stderr)
	}
	var sum runtime.TrialSummary
	if err := json.Unmarshal([]byte(stdout), &sum); err != nil {
		t.Fatalf("demo summary: %v\n%s", err, stdout)
	}
	if !strings.Contains(stderr, "exported to "+export) {
		t.Errorf("demo does not say where the record went:\n%s", stderr)
	}

	code, stdout, stderr = runBinary(t, 30*time.Second, "replay", "--file", export, "--format", "json")
	if code != exitOK {
		t.Fatalf("replay exit %d; stderr:\n%s", code, stderr)
	}
	r := decodeReplay(t, stdout)
	if r.Pair != "demo-out" {
		t.Errorf("pair %q", r.Pair)
	}
	checkAgainstTrial(t, r, sum)

	// The text form: the failover table and the verdict.
	code, stdout, stderr = runBinary(t, 30*time.Second, "replay", "--file", export)
	if code != exitOK {
		t.Fatalf("replay exit %d; stderr:\n%s", code, stderr)
	}
	for _, want := range []string{"LEADERSHIP", "FAILOVERS (1)", "site-a→site-b", "SPLIT-BRAIN CHECK: none", "HEARTBEATS", "TIMELINE"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("text replay lacks %q:\n%s", want, stdout)
		}
	}
	if stderr != "" {
		t.Errorf("replay wrote to stderr (no terminal, no progress): %q", stderr)
	}

	// What if the pair had been a tank (failure_threshold 10)? The record's
	// pattern is the primary's power cut; the recorded rules (read from the
	// record's config write) fail over as the demo did, the tank later.
	tank := writeTestFile(t, dir, "tank.yaml", "pair: demo-out\nprimary: site-a\nreplica: site-b\nheartbeat_timeout: 200ms\nfailure_threshold: 10\nsuccess_threshold: 1\nfailover_timeout: 2.6s\nfence_grace: 300ms\n")
	code, stdout, stderr = runBinary(t, 30*time.Second, "replay", "--file", export, "--what-if", tank, "--format", "json")
	if code != exitOK {
		t.Fatalf("replay --what-if exit %d; stderr:\n%s", code, stderr)
	}
	var w whatIfOut
	if err := json.Unmarshal([]byte(stdout), &w); err != nil {
		t.Fatalf("what-if json: %v\n%s", err, stdout)
	}
	// The pattern is the power cut, last; a loaded machine may also have
	// delayed a heartbeat enough to show as latency before it.
	faults := strings.Split(w.Schedule, ";")
	if !strings.HasPrefix(faults[len(faults)-1], "powercut(site-a)@") || strings.Count(w.Schedule, "powercut") != 1 ||
		w.Actual.Failovers != 1 || w.Recorded.Failovers != 1 || w.Proposed.Failovers != 1 {
		t.Errorf("what-if of the demo: schedule %q, failovers actual %d, recorded %d, proposed %d", w.Schedule, w.Actual.Failovers, w.Recorded.Failovers, w.Proposed.Failovers)
	}
	if w.Recorded.Rules.FailureThreshold != 2 || !strings.Contains(w.Recorded.PairFile, "heartbeat_timeout: 200ms") {
		t.Errorf("recorded rules are not the demo's: %+v\n%s", w.Recorded.Rules, w.Recorded.PairFile)
	}
	if w.Proposed.UnavailableMS <= w.Recorded.UnavailableMS {
		t.Errorf("the tank's outage (%.0f ms) is not longer than the recorded rules' (%.0f ms)", w.Proposed.UnavailableMS, w.Recorded.UnavailableMS)
	}

	// A damaged file: an error with the offset and what was recovered, and
	// no history on stdout.
	checkDamaged(t, export)
	// The HTML in a real browser.
	html := filepath.Join(dir, "demo.html")
	if code, _, stderr := runBinary(t, 30*time.Second, "replay", "--file", export, "--format", "html", "--out", html); code != exitOK {
		t.Fatalf("replay --format html exit %d: %s", code, stderr)
	}
	checkInChromium(t, html, []string{"site-a", "site-b"})
}

var byteOffset = regexp.MustCompile(`at byte (\d+): .*; (\d+) records? read intact before it`)

func checkDamaged(t *testing.T, export string) {
	t.Helper()
	data, err := os.ReadFile(export)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cut := filepath.Join(dir, "cut.export")
	if err := os.WriteFile(cut, data[:len(data)*2/3], 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runBinary(t, 30*time.Second, "replay", "--file", cut, "--format", "json")
	if code != exitFailure {
		t.Fatalf("replay of a truncated file: exit %d, want %d; stderr:\n%s", code, exitFailure, stderr)
	}
	m := byteOffset.FindStringSubmatch(stderr)
	if m == nil || !strings.Contains(stderr, "truncated") {
		t.Fatalf("the error does not give the byte offset and what was recovered:\n%s", stderr)
	}
	if stdout != "" {
		t.Errorf("a truncated file printed a history without --partial:\n%s", stdout)
	}
	// --partial: the history read so far, marked, and still exit 1.
	code, stdout, stderr = runBinary(t, 30*time.Second, "replay", "--file", cut, "--format", "json", "--partial")
	if code != exitFailure {
		t.Fatalf("replay --partial of a truncated file: exit %d; stderr:\n%s", code, stderr)
	}
	r := decodeReplay(t, stdout)
	if r.Partial == nil || fmt.Sprint(r.Partial.Offset) != m[1] || fmt.Sprint(r.Partial.Recovered) != m[2] || r.Records.Read != r.Partial.Recovered {
		t.Errorf("partial %+v, records read %d; the error said byte %s, %s records", r.Partial, r.Records.Read, m[1], m[2])
	}
	code, stdout, _ = runBinary(t, 30*time.Second, "replay", "--file", cut, "--partial")
	if code != exitFailure || strings.Count(stdout, "*** PARTIAL") != 2 {
		t.Errorf("text --partial: exit %d, want the PARTIAL banner at both ends:\n%s", code, stdout)
	}

	// One flipped bit in the middle: a checksum error, exit 1.
	flip := filepath.Join(dir, "flip.export")
	bad := append([]byte(nil), data...)
	bad[len(bad)/2] ^= 0x10
	if err := os.WriteFile(flip, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = runBinary(t, 30*time.Second, "replay", "--file", flip)
	if code != exitFailure || !strings.Contains(stderr, "bad checksum") || byteOffset.FindString(stderr) == "" || stdout != "" {
		t.Errorf("a flipped bit: exit %d, stderr %q, stdout %d bytes", code, stderr, len(stdout))
	}
}

// `understudy export` and `replay --nats-url` against a live NATS after a
// failover trial: the file and the live read give the same history, and
// it agrees with the trial.
func TestExportAndLiveReplay(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	es, _, js, names := provisionedNATS(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rules := failover.DefaultRules("live", "site-a", "site-b")
	rules.HeartbeatTimeout, rules.FailoverTimeout, rules.FenceGrace = fastHeartbeat, fastFailover, 300*time.Millisecond
	sum, err := runtime.RunTrial(ctx, es.Server().Addr().String(), runtime.TrialOptions{
		Rules: rules, Mode: runtime.TrialPowerCut, FaultAfter: time.Second, Window: 10 * time.Second,
		Stream: names.EventsStream, Bucket: names.FailoverBucket,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Another pair on the same server is left out of the export.
	other := failover.DefaultRules("other", "site-a", "site-b")
	kv, err := js.KeyValue(ctx, names.FailoverBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, failover.LeaderKey(other.Pair), failover.EncodeLeader(failover.Leader{Site: "site-a", Term: 7})); err != nil {
		t.Fatal(err)
	}

	export := filepath.Join(dir, "live.export")
	code, stdout, stderr := runBinary(t, 30*time.Second, "export", "--nats-url", es.ClientURL(), "--pair", "live", "--out", export)
	if code != exitOK || !strings.Contains(stdout, "exported") {
		t.Fatalf("export exit %d: %s %s", code, stdout, stderr)
	}
	code, fromFile, stderr := runBinary(t, 30*time.Second, "replay", "--file", export, "--format", "json")
	if code != exitOK {
		t.Fatalf("replay --file exit %d: %s", code, stderr)
	}
	code, live, stderr := runBinary(t, 30*time.Second, "replay", "--nats-url", es.ClientURL(), "--pair", "live", "--format", "json")
	if code != exitOK {
		t.Fatalf("replay --nats-url exit %d: %s", code, stderr)
	}
	rf, rl := decodeReplay(t, fromFile), decodeReplay(t, live)
	checkAgainstTrial(t, rf, sum)
	checkAgainstTrial(t, rl, sum)
	if rf.Records.Read != rl.Records.Read || rf.Records.Read == 0 {
		t.Errorf("file read %d records, live %d", rf.Records.Read, rl.Records.Read)
	}
	// Same history, bit for bit, apart from where it came from.
	strip := func(s string) string { return regexp.MustCompile(`"source": "[^"]*",`).ReplaceAllString(s, "") }
	if strip(fromFile) != strip(live) {
		t.Errorf("the file and the live read give different histories")
	}

	// A window before everything: nothing to export, still a valid file.
	empty := filepath.Join(dir, "empty.export")
	if code, _, stderr := runBinary(t, 30*time.Second, "export", "--nats-url", es.ClientURL(), "--pair", "live", "--to", "2000-01-01T00:00:00Z", "--out", empty); code != exitOK {
		t.Fatalf("export of an empty window: exit %d: %s", code, stderr)
	}
	code, out, stderr := runBinary(t, 30*time.Second, "replay", "--file", empty, "--format", "json")
	if r := decodeReplay(t, out); code != exitOK || r.Records.Read != 0 || len(r.Failovers) != 0 {
		t.Errorf("replay of an empty window: exit %d, %+v, %s", code, r.Records, stderr)
	}
}

func TestReplayUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"replay"},
		{"replay", "--file", "x", "--nats-url", "nats://127.0.0.1:1"},
		{"replay", "--file", "x", "--format", "pdf"},
		{"replay", "--pair", "p", "--partial"},
		{"replay", "--file", "x", "--from", "yesterday"},
		{"export", "--out", "x"},
		{"export", "--pair", "p"},
		{"export", "--pair", "p", "--out", "x", "--from", "1h", "--to", "2h"},
	} {
		code, _, stderr := runBinary(t, 10*time.Second, args...)
		if code != exitUsage || !strings.Contains(stderr, "--help") {
			t.Errorf("%v: exit %d, want %d with usage; stderr %q", args, code, exitUsage, stderr)
		}
	}
	code, _, stderr := runBinary(t, 10*time.Second, "replay", "--file", filepath.Join(t.TempDir(), "missing.export"))
	if code != exitFailure || !strings.Contains(stderr, "no such file") {
		t.Errorf("missing file: exit %d %q", code, stderr)
	}
}

func TestParseWhen(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"":                          {},
		"1h":                        now.Add(-time.Hour),
		"90m":                       now.Add(-90 * time.Minute),
		"2025-03-01T10:00:00Z":      time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC),
		"2025-03-01T11:00:00+01:00": time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC),
	} {
		got, err := parseWhen("--from", in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("parseWhen(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"-1h", "yesterday", "2025-03-01"} {
		if _, err := parseWhen("--from", bad, now); err == nil {
			t.Errorf("parseWhen(%q) accepted", bad)
		}
	}
}

// checkInChromium loads the page in headless Chromium: the script ran
// (the lanes are in the DOM), and the console shows nothing but the
// page's own report line — no error, warning or uncaught exception.
func checkInChromium(t *testing.T, page string, sites []string) {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium not found (%v): the HTML check needs it; install it with scripts/install-test-deps.sh (make test does)", err)
	}
	abs, err := filepath.Abs(page)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--user-data-dir="+t.TempDir(),
		"--enable-logging=stderr", "--v=0", "--dump-dom", "file://"+abs)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}
	dom := stdout.String()
	for _, site := range sites {
		if !strings.Contains(dom, `<g class="lane" data-site="`+site+`"`) {
			t.Errorf("no lane for %s in the DOM after the scripts ran", site)
		}
	}
	if n := strings.Count(dom, `class="seg st-`); n < len(sites) {
		t.Errorf("%d lane segments drawn", n)
	}
	if !strings.Contains(dom, `class="seg st-serving"`) {
		t.Errorf("no serving segment drawn")
	}
	var console []string
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(line, ":CONSOLE") {
			console = append(console, line)
		}
	}
	rendered := 0
	for _, line := range console {
		if strings.Contains(line, `"understudy-replay: rendered `+fmt.Sprint(len(sites))+` lanes`) {
			rendered++
			continue
		}
		t.Errorf("console message: %s", line)
	}
	// The page's own line shows the console is captured at all.
	if rendered == 0 {
		t.Errorf("the page's report line is not in chromium's console output: the check cannot see errors\n%s", stderr.String())
	}
}
