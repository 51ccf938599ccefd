package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"understudy/actors/failover"
	"understudy/events"
	"understudy/projections"
	"understudy/runtime"
	"understudy/simulations"
)

// whatIfOut is the part of `replay --what-if --format json` the tests read.
type whatIfOut struct {
	Schedule string `json:"schedule"`
	Faults   int    `json:"faults"`
	Actual   struct {
		Failovers      int     `json:"failovers"`
		FalseFailovers int     `json:"false_failovers"`
		UnavailableMS  float64 `json:"unavailable_ms"`
	} `json:"actual"`
	Recorded, Proposed struct {
		Rules struct {
			FailureThreshold int  `json:"failure_threshold"`
			Safe             bool `json:"safe"`
		} `json:"rules"`
		Failovers        int     `json:"failovers"`
		FalseFailovers   int     `json:"false_failovers"`
		UnavailableMS    float64 `json:"unavailable_ms"`
		MaxUnavailableMS float64 `json:"max_unavailable_ms"`
		Violations       []struct {
			Invariant string `json:"invariant"`
		} `json:"violations"`
		Reproduce string `json:"reproduce"`
		PairFile  string `json:"pair_file"`
	}
}

// simRecord writes a simulated run's record and returns its path.
func simRecord(t *testing.T, scenario string, seed int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), scenario+".usx")
	if code, _, errOut := runCLI(t, "simulate", "--scenario", scenario, "--seed", fmt.Sprint(seed), "--out", path); code != exitOK {
		t.Fatalf("simulate %s %d: exit %d: %s", scenario, seed, code, errOut)
	}
	return path
}

func whatIfJSON(t *testing.T, record, pairFile string, extra ...string) whatIfOut {
	t.Helper()
	args := append([]string{"replay", "--file", record, "--what-if", pairFile, "--format", "json"}, extra...)
	code, out, errOut := runCLI(t, args...)
	var w whatIfOut
	if err := json.Unmarshal([]byte(out), &w); err != nil || code != exitOK {
		t.Fatalf("replay --what-if %s: exit %d, %v\n%s\n%s", pairFile, code, err, out, errOut)
	}
	return w
}

func example(name string) string { return filepath.Join("..", "..", "docs", "examples", name+".yaml") }

// A power cut of the primary, replayed under the three profiles of the
// staleness decision: one failover each, none of a live primary, and the
// outage grows with how long each profile waits (nervous < the recorded
// defaults < sticky < tank).
func TestWhatIfProfilesOnAPowerCut(t *testing.T) {
	rec := simRecord(t, "power-cut", 1)
	un := map[string]float64{}
	var recorded float64
	for _, prof := range []string{"nervous", "sticky", "tank"} {
		w := whatIfJSON(t, rec, example(prof))
		if w.Actual.Failovers != 1 || w.Recorded.Failovers != 1 || w.Proposed.Failovers != 1 {
			t.Errorf("%s: failovers actual %d, recorded rules %d, proposed %d; want 1 each", prof, w.Actual.Failovers, w.Recorded.Failovers, w.Proposed.Failovers)
		}
		if w.Actual.FalseFailovers+w.Recorded.FalseFailovers+w.Proposed.FalseFailovers != 0 {
			t.Errorf("%s: a dead primary's replacement counted as a false failover", prof)
		}
		if len(w.Recorded.Violations)+len(w.Proposed.Violations) != 0 {
			t.Errorf("%s: violations %v %v", prof, w.Recorded.Violations, w.Proposed.Violations)
		}
		if !strings.HasPrefix(w.Schedule, "powercut(site-a)@") || w.Faults != 1 {
			t.Errorf("%s: schedule %q, want the primary's power cut alone", prof, w.Schedule)
		}
		if !strings.Contains(w.Recorded.PairFile, "failure_threshold: 2") || !strings.Contains(w.Proposed.Reproduce, "--faults 'powercut(site-a)@") {
			t.Errorf("%s: recorded pair file %q, proposed reproduce %q", prof, w.Recorded.PairFile, w.Proposed.Reproduce)
		}
		un[prof], recorded = w.Proposed.UnavailableMS, w.Recorded.UnavailableMS
	}
	if !(un["nervous"] < recorded && recorded < un["sticky"] && un["sticky"] < un["tank"]) {
		t.Errorf("unavailable ms: nervous %.0f, recorded %.0f, sticky %.0f, tank %.0f: want them in that order", un["nervous"], recorded, un["sticky"], un["tank"])
	}
}

// Under the recorded rules the pattern reproduces the record's failovers,
// for the scenarios whose story heartbeat arrivals tell.
func TestWhatIfRecordedRulesReproduceTheRecord(t *testing.T) {
	for _, sc := range []string{"power-cut", "slow-death", "return-to-normal", "switchover", "replica-partition", "pause"} {
		for seed := 1; seed <= 4; seed++ {
			t.Run(fmt.Sprintf("%s/%d", sc, seed), func(t *testing.T) {
				t.Parallel()
				w := whatIfJSON(t, simRecord(t, sc, seed), example("tank"))
				if w.Recorded.Failovers != w.Actual.Failovers {
					t.Errorf("failovers: record %d, recorded rules simulated %d (schedule %s)", w.Actual.Failovers, w.Recorded.Failovers, w.Schedule)
				}
			})
		}
	}
}

// Unsafe proposed rules are refused unless asked for, and then the
// simulator finds what they break.
func TestWhatIfUnsafeRules(t *testing.T) {
	rec := simRecord(t, "slow-death", 1)
	unsafe := filepath.Join(t.TempDir(), "unsafe.yaml")
	if err := os.WriteFile(unsafe, []byte("pair: pg-main\nprimary: site-a\nreplica: site-b\nheartbeat_timeout: 1s\nfailure_threshold: 5\nsuccess_threshold: 1\nfailover_timeout: 2s\nfence_grace: 2s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, "replay", "--file", rec, "--what-if", unsafe)
	if code != exitUsage || out != "" || !strings.Contains(errOut, "failover_timeout") || !strings.Contains(errOut, "--allow-unsafe-config") {
		t.Fatalf("unsafe rules: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	w := whatIfJSON(t, rec, unsafe, "--allow-unsafe-config")
	if w.Proposed.Rules.Safe || len(w.Proposed.Violations) == 0 || w.Proposed.Violations[0].Invariant != "split-brain" {
		t.Errorf("unsafe rules on a slow death: violations %v, want split-brain", w.Proposed.Violations)
	}
	if len(w.Recorded.Violations) != 0 {
		t.Errorf("recorded (safe) rules: violations %v", w.Recorded.Violations)
	}
	if !strings.Contains(w.Proposed.Reproduce, "--allow-unsafe-config") {
		t.Errorf("reproduce %q lacks --allow-unsafe-config", w.Proposed.Reproduce)
	}
}

func TestWhatIfBadArguments(t *testing.T) {
	rec := simRecord(t, "power-cut", 1)
	other := filepath.Join(t.TempDir(), "other.yaml")
	if err := os.WriteFile(other, []byte("pair: pg-main\nprimary: site-x\nreplica: site-b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"replay", "--file", rec, "--what-if", other}, "primary: site-x is not a site of the record"},
		{[]string{"replay", "--pair", "pg-main", "--what-if", example("tank")}, "--what-if needs --file"},
		{[]string{"replay", "--file", rec, "--what-if", example("tank"), "--format", "html"}, "--what-if prints text or json"},
		{[]string{"replay", "--file", rec, "--seed", "3"}, "apply to --what-if only"},
		{[]string{"replay", "--file", rec, "--what-if", filepath.Join(t.TempDir(), "missing.yaml")}, "missing.yaml"},
	} {
		code, _, errOut := runCLI(t, tc.args...)
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tc.args, code, errOut, exitUsage, tc.want)
		}
	}
}

func TestWhatIfText(t *testing.T) {
	rec := simRecord(t, "power-cut", 1)
	code, out, errOut := runCLI(t, "replay", "--file", rec, "--what-if", example("nervous"))
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"WHAT-IF  pair pg-main", "as recorded", "recorded rules", "proposed rules", "failovers", "of a live primary", "unavailable, total", "reproduce recorded: understudy simulate"} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
}

// A member's first start is not a crash, even when its first heartbeat
// landed before the start event did; a later start is a restart.
func TestPatternTapRestarts(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rules := failover.DefaultRules("p", "site-a", "site-b")
	tap := newPatternTap("p", "")
	put := func(key string, at time.Duration, value []byte) {
		tap.add(events.KVRecord(runtime.DefaultFailoverBucket, events.Entry{Key: key, Value: value, Revision: uint64(at), Time: t0.Add(at), Op: events.OpPut}))
	}
	started := func(at time.Duration, expect string) {
		data, err := runtime.Codec().Encode(&failover.Started{Pair: "p", Site: "site-b", Rules: rules})
		if err != nil {
			t.Fatal(err)
		}
		tap.add(events.Record{Stream: "UNDERSTUDY_EVENTS", Subject: failover.Subject("p", "site-b"), Sequence: uint64(at), Time: t0.Add(at), Data: data,
			Headers: map[string]string{events.HeaderExpectedLastSubjectSeq: expect}})
	}
	put("p.config", 0, failover.EncodeRules(rules))
	for i := range 10 {
		at := time.Duration(i) * time.Second
		put("p.leader", at, failover.EncodeLeader(failover.Leader{Site: "site-a", Term: 1, Beat: uint64(i)}))
		if i != 5 && i != 6 {
			put("p.hb.site-b", at+10*time.Millisecond, failover.EncodeHeartbeat(failover.Heartbeat{Site: "site-b"}))
		}
	}
	started(20*time.Millisecond, "0")   // after its first heartbeat: the first start
	started(6500*time.Millisecond, "7") // between 4.01s and 7.01s: a restart
	rep := &projections.Report{Window: projections.Window{From: t0, To: t0.Add(10 * time.Second)}}
	p, got, _, err := tap.pattern(rep)
	if err != nil {
		t.Fatal(err)
	}
	if got != rules {
		t.Errorf("recorded rules %+v", got)
	}
	if s := simulations.FormatFaults(p.Faults()); s != "crash(site-b)@4.51s+1.99s" {
		t.Errorf("schedule %q, want site-b's one crash", s)
	}
}
