package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"understudy/actors/failover"
	"understudy/actors/procedure"
)

// writeFile writes body to dir/name (creating dir) and returns the path.
func writeFile(t *testing.T, dir, name, body string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

const pairHead = "pair: pg-main\nprimary: site-a\nreplica: site-b\n"

func TestPairFileRefusalsNameFieldRuleAndNumbers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		body  string
		field string   // of the *ConfigError; "" when the refusal is not one (YAML)
		value string   // of the *ConfigError
		want  []string // parts of the message
	}{
		{
			name:  "safety inequality",
			body:  pairHead + "failover_timeout: 4s\n",
			field: "failover_timeout", value: "4s",
			want: []string{"failover_timeout = 4s", "safety inequality",
				"failover_timeout >= (failure_threshold + 1) * heartbeat_timeout + fence_grace",
				"(2 + 1) * 1s + 2s = 5s", "raise failover_timeout to at least 5s"},
		},
		{
			name:  "safety inequality with fast rules",
			body:  pairHead + "heartbeat_timeout: 200ms\nfailure_threshold: 3\nfailover_timeout: 1s\nfence_grace: 300ms\n",
			field: "failover_timeout", value: "1s",
			want: []string{"(3 + 1) * 200ms + 300ms = 1.1s", "at least 1.1s"},
		},
		{
			name:  "negative duration",
			body:  pairHead + "fence_grace: -1s\n",
			field: "fence_grace", value: "-1s",
			want: []string{"fence_grace = -1s", "must not be negative"},
		},
		{
			name:  "zero heartbeat",
			body:  pairHead + "heartbeat_timeout: 0s\n",
			field: "heartbeat_timeout", value: "0s",
			want: []string{"heartbeat_timeout = 0s", "must be a positive duration"},
		},
		{
			name:  "unparsable duration",
			body:  pairHead + "heartbeat_timeout: soon\n",
			field: "heartbeat_timeout", value: "soon",
			want: []string{"heartbeat_timeout = soon", `must be a duration such as "1s"`},
		},
		{
			name:  "duration without unit",
			body:  pairHead + "failover_timeout: 5\n",
			field: "failover_timeout", value: "5",
			want: []string{"failover_timeout = 5", "must be a duration"},
		},
		{
			name:  "threshold below one",
			body:  pairHead + "failure_threshold: 0\n",
			field: "failure_threshold", value: "0",
			want: []string{"failure_threshold = 0", "must be between 1 and 10000"},
		},
		{
			name:  "failback invalid",
			body:  pairHead + "failback: sometimes\n",
			field: "failback", value: `"sometimes"`,
			want: []string{`failback = "sometimes"`, `must be "auto" or "manual"`},
		},
		{
			name:  "same primary and replica",
			body:  "pair: pg-main\nprimary: site-a\nreplica: site-a\n",
			field: "replica", value: `"site-a"`,
			want: []string{"replica", "must differ from primary"},
		},
		{
			name:  "missing replica",
			body:  "pair: pg-main\nprimary: site-a\n",
			field: "replica",
			want:  []string{"replica: must not be empty"},
		},
		{
			name:  "site not a subject token",
			body:  "pair: pg.main\nprimary: site-a\nreplica: site-b\n",
			field: "pair", value: `"pg.main"`,
			want: []string{"must be one NATS subject token"},
		},
		{
			name: "unknown key (typo)",
			body: pairHead + "failover_timout: 9s\n",
			want: []string{"failover_timout", "not found"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, t.TempDir(), "pair.yaml", tc.body)
			r, err := LoadPairFile(path, false)
			if err == nil {
				t.Fatalf("accepted: %+v", r)
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("message %q does not name the file", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("message %q does not contain %q", err, w)
				}
			}
			var ce *ConfigError
			switch {
			case tc.field == "":
				if errors.As(err, &ce) {
					t.Errorf("YAML refusal reported as a config error of %s", ce.Field)
				}
			case !errors.As(err, &ce):
				t.Errorf("%v: not a *ConfigError", err)
			case ce.Field != tc.field || ce.Value != tc.value:
				t.Errorf("field %q value %q, want %q %q", ce.Field, ce.Value, tc.field, tc.value)
			}
		})
	}
}

func TestPairFileDefaultsAbsentKeys(t *testing.T) {
	dir := t.TempDir()
	r, err := LoadPairFile(writeFile(t, dir, "minimal.yaml", pairHead), false)
	if err != nil {
		t.Fatal(err)
	}
	if want := failover.DefaultRules("pg-main", "site-a", "site-b"); r != want {
		t.Errorf("minimal file: %+v, want the defaults %+v", r, want)
	}

	// Keys given win; the others keep their defaults.
	r, err = LoadPairFile(writeFile(t, dir, "partial.yaml", pairHead+"heartbeat_timeout: 500ms\nfailback: manual\n"), false)
	if err != nil {
		t.Fatal(err)
	}
	want := failover.DefaultRules("pg-main", "site-a", "site-b")
	want.HeartbeatTimeout, want.Failback = 500*time.Millisecond, failover.FailbackManual
	if r != want {
		t.Errorf("partial file: %+v, want %+v", r, want)
	}

	// fence_grace 0 is allowed (a fence that is instant) and is not "absent".
	r, err = LoadPairFile(writeFile(t, dir, "zero-grace.yaml", pairHead+"fence_grace: 0s\nfailover_timeout: 3s\n"), false)
	if err != nil {
		t.Fatal(err)
	}
	if r.FenceGrace != 0 || r.FailoverTimeout != 3*time.Second {
		t.Errorf("fence_grace 0s: %+v", r)
	}
}

func TestPairFileAllowUnsafeSkipsOnlyTheInequality(t *testing.T) {
	path := writeFile(t, t.TempDir(), "unsafe.yaml", pairHead+"failover_timeout: 1s\n")
	r, err := LoadPairFile(path, true)
	if err != nil {
		t.Fatalf("allowUnsafe: %v", err)
	}
	if r.FailoverTimeout != time.Second {
		t.Errorf("failover_timeout %v", r.FailoverTimeout)
	}
	path = writeFile(t, t.TempDir(), "bad.yaml", pairHead+"failover_timeout: 1s\nfence_grace: -1s\n")
	if _, err := LoadPairFile(path, true); err == nil || !strings.Contains(err.Error(), "fence_grace") {
		t.Errorf("allowUnsafe accepted a negative fence_grace: %v", err)
	}
}

func TestPairFileMissing(t *testing.T) {
	_, err := LoadPairFile(filepath.Join(t.TempDir(), "nope.yaml"), false)
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "pair file") {
		t.Errorf("missing file: %v", err)
	}
}

// fastPairYAML are fast rules that satisfy the inequality:
// 1s >= (2 + 1) * 200ms + 300ms = 900ms.
const fastPairYAML = `heartbeat_timeout: 200ms
failure_threshold: 2
success_threshold: 2
failover_timeout: 1s
fence_grace: 300ms
failback: manual
`

// indent prefixes every line of s with n spaces.
func indent(s string, n int) string {
	pad := strings.Repeat(" ", n)
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = pad + l
	}
	return strings.Join(lines, "\n") + "\n"
}

const nodeProcedures = `procedures:
  fence:
    steps:
      - {name: stop, driver: exec, timeout: 200ms, exec: {command: "true"}}
      - {driver: exec, timeout: 100ms, exec: {command: "true", args: ["-x"]}}
  promote:
    steps:
      - {name: promote, driver: exec, timeout: 3s, exec: {command: "true"}}
      - {driver: exec, exec: {command: "true"}}
`

// loadNode writes a node file into dir and loads it; the caller validates.
func loadNode(t *testing.T, dir, body string) Config {
	t.Helper()
	c, err := LoadConfigFile(writeFile(t, dir, "node.yaml", "data_dir: "+filepath.Join(dir, "data")+"\n"+body))
	if err != nil {
		t.Fatalf("LoadConfigFile: %v", err)
	}
	return c
}

func TestNodeFilePairsInlineAndByFile(t *testing.T) {
	root := t.TempDir()
	nodeDir := filepath.Join(root, "etc")
	// The pair file sits next to the node file's directory, not the test's.
	writeFile(t, nodeDir, "pairs/pg-main.yaml", pairHead+fastPairYAML)
	c := loadNode(t, nodeDir, `node: site-b
pairs:
  - file: pairs/pg-main.yaml
`+indent(nodeProcedures, 4)+`  - pair: pg-other
    primary: site-b
    replica: site-c
    failover_timeout: 6s
    member: site-c
`+indent(nodeProcedures, 4))
	if c.BaseDir != nodeDir {
		t.Errorf("BaseDir %q, want the node file's directory %q", c.BaseDir, nodeDir)
	}
	s, err := c.resolve()
	if err != nil {
		t.Fatalf("valid node file refused: %v", err)
	}
	if len(s.members) != 2 {
		t.Fatalf("members: %+v", s.members)
	}

	byFile := s.members[0]
	want := failover.DefaultRules("pg-main", "site-a", "site-b")
	want.HeartbeatTimeout, want.FailoverTimeout, want.FenceGrace = 200*time.Millisecond, time.Second, 300*time.Millisecond
	want.Failback = failover.FailbackManual
	if byFile.Rules != want {
		t.Errorf("pair from file: %+v, want %+v", byFile.Rules, want)
	}
	if byFile.Site != "site-b" {
		t.Errorf("member of the file pair %q, want the node's name site-b", byFile.Site)
	}
	fence := byFile.Procedures.Fence.Steps
	if len(fence) != 2 || fence[0].Name != "stop" || fence[0].Timeout != 200*time.Millisecond ||
		fence[1].Name != "exec-1" || fence[1].Timeout != 100*time.Millisecond ||
		fence[1].Exec == nil || fence[1].Exec.Command != "true" || len(fence[1].Exec.Args) != 1 {
		t.Errorf("fence steps: %+v", fence)
	}
	if p := byFile.Procedures.Promote.Steps; len(p) != 2 || p[0].Timeout != 3*time.Second || p[1].Timeout != procedure.DefaultStepTimeout {
		t.Errorf("promote steps: %+v", p)
	}

	inline := s.members[1]
	want = failover.DefaultRules("pg-other", "site-b", "site-c")
	want.FailoverTimeout = 6 * time.Second
	if inline.Rules != want || inline.Site != "site-c" {
		t.Errorf("inline pair: site %q rules %+v, want site-c %+v", inline.Site, inline.Rules, want)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

func TestNodeFileAbsolutePairFile(t *testing.T) {
	root := t.TempDir()
	abs := writeFile(t, filepath.Join(root, "elsewhere"), "pg.yaml", pairHead)
	c := loadNode(t, filepath.Join(root, "etc"), "node: site-a\npairs:\n  - file: "+abs+"\n"+indent(nodeProcedures, 4))
	s, err := c.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if len(s.members) != 1 || s.members[0].Site != "site-a" || s.members[0].Rules.Pair != "pg-main" {
		t.Errorf("members %+v", s.members)
	}
}

func TestNodeFilePairRefusalsNameTheirPath(t *testing.T) {
	inlinePair := "  - " + strings.TrimPrefix(indent(pairHead+fastPairYAML, 4), "    ")
	for _, tc := range []struct {
		name  string
		files map[string]string // written next to the node file
		body  string            // the node file after data_dir
		field string            // of the *ConfigError
		want  []string          // parts of the message
	}{
		{
			name:  "unknown member",
			body:  "node: site-z\npairs:\n" + inlinePair + indent(nodeProcedures, 4),
			field: "pairs[0].member",
			want:  []string{"pairs[0].member = site-z", "must name a member of pair pg-main (site-a or site-b)", "defaults to the node name"},
		},
		{
			name:  "synchronous without a replicating workload",
			body:  "node: site-a\npairs:\n" + inlinePair + "    synchronous: on\n" + indent(nodeProcedures, 4),
			field: "pairs[0].synchronous",
			want:  []string{"pairs[0].synchronous = on", "must be off unless the member protects a workload that replicates (postgres)"},
		},
		{
			name:  "synchronous misspelt",
			body:  "node: site-a\npairs:\n" + inlinePair + "    synchronous: yes\n" + indent(nodeProcedures, 4),
			field: "pairs[0].synchronous",
			want:  []string{`pairs[0].synchronous = "yes"`, `must be "off", "on" or "strict"`},
		},
		{
			name:  "lag limit not a size",
			body:  "node: site-a\npairs:\n" + inlinePair + "    maximum_lag_on_failover: lots\n" + indent(nodeProcedures, 4),
			field: "pairs[0].maximum_lag_on_failover",
			want:  []string{"pairs[0].maximum_lag_on_failover = lots", `must be a size in bytes, with an optional unit such as "1MiB"`},
		},
		{
			name:  "postgres and vm",
			body:  "node: site-a\npairs:\n" + inlinePair + "    postgres: {data_dir: /var/lib/pg, peer: 'b:5432'}\n    vm: {domain: d}\n",
			field: "pairs[0].vm",
			want:  []string{"pairs[0].vm", "one workload: postgres or vm, not both"},
		},
		{
			name:  "vm with a promote chain",
			body:  "node: site-a\npairs:\n" + inlinePair + "    vm: {domain: d}\n" + indent(nodeProcedures, 4),
			field: "pairs[0].procedures.promote",
			want:  []string{"pairs[0].procedures.promote", "must be empty with vm", "only fence steps"},
		},
		{
			name:  "vm without a domain",
			body:  "node: site-a\npairs:\n" + inlinePair + "    vm: {uri: 'test:///default'}\n",
			field: "pairs[0].vm.domain",
			want:  []string{"pairs[0].vm.domain"},
		},
		{
			name:  "unknown member given explicitly",
			body:  "node: site-a\npairs:\n" + inlinePair + "    member: site-q\n" + indent(nodeProcedures, 4),
			field: "pairs[0].member",
			want:  []string{"pairs[0].member = site-q"},
		},
		{
			name:  "both file and inline",
			files: map[string]string{"pg.yaml": pairHead},
			body:  "node: site-a\npairs:\n  - file: pg.yaml\n    pair: pg-main\n" + indent(nodeProcedures, 4),
			field: "pairs[0].file",
			want:  []string{"pairs[0].file = pg.yaml", "either as a file or inline, not both"},
		},
		{
			name:  "bad step timeout",
			body:  "node: site-a\npairs:\n" + inlinePair + "    procedures:\n      fence:\n        steps:\n          - {name: stop, driver: exec, timeout: soon, exec: {command: x}}\n",
			field: "pairs[0].procedures.fence.steps[0].timeout",
			want:  []string{"pairs[0].procedures.fence.steps[0].timeout", `"soon"`, "must be a Go duration"},
		},
		{
			name:  "bad step command",
			body:  "node: site-a\npairs:\n" + inlinePair + "    procedures:\n      fence:\n        steps:\n          - {name: ok, driver: exec, exec: {command: x}}\n          - {name: empty, driver: exec, exec: {command: \" \"}}\n",
			field: "pairs[0].procedures.fence.steps[1].exec.command",
			want:  []string{"pairs[0].procedures.fence.steps[1].exec.command: must not be empty"},
		},
		{
			name:  "unknown driver",
			body:  "node: site-a\npairs:\n" + inlinePair + "    procedures:\n      fence:\n        steps:\n          - {name: zap, driver: laser}\n",
			field: "pairs[0].procedures.fence.steps[0].driver",
			want:  []string{"pairs[0].procedures.fence.steps[0].driver", "unknown driver", "exec"},
		},
		{
			name:  "no fence chain",
			body:  "node: site-a\npairs:\n" + inlinePair,
			field: "pairs[0].procedures.fence.steps",
			want:  []string{"pairs[0].procedures.fence.steps: must have at least one step"},
		},
		{
			name:  "the same member twice",
			files: map[string]string{"pg.yaml": pairHead + fastPairYAML},
			body: "node: site-a\npairs:\n" + inlinePair + indent(nodeProcedures, 4) +
				"  - file: pg.yaml\n" + indent(nodeProcedures, 4),
			field: "pairs[1]",
			want:  []string{"pairs[1] = pg-main/site-a", "each pair member may be hosted once per node"},
		},
		{
			name:  "inline pair breaks the inequality",
			body:  "node: site-a\npairs:\n  - pair: pg-main\n    primary: site-a\n    replica: site-b\n    failover_timeout: 4s\n" + indent(nodeProcedures, 4),
			field: "pairs[0].failover_timeout",
			want:  []string{"pairs[0].failover_timeout = 4s", "safety inequality", "= 5s", "at least 5s"},
		},
		{
			name: "fence chain longer than fence_grace",
			body: "node: site-a\npairs:\n  - pair: pg-main\n    primary: site-a\n    replica: site-b\n    procedures:\n      fence:\n        steps:\n" +
				"          - {driver: exec, timeout: 1500ms, exec: {command: x}}\n          - {driver: exec, exec: {command: y}}\n",
			field: "pairs[0].fence_grace",
			want:  []string{"pairs[0].fence_grace = 2s", "sum of its step timeouts (31.5s)", "procedures.fence"},
		},
		{
			name:  "threshold beyond its bound",
			body:  "node: site-a\npairs:\n  - pair: pg-main\n    primary: site-a\n    replica: site-b\n    failure_threshold: 4000000000\n" + indent(nodeProcedures, 4),
			field: "pairs[0].failure_threshold",
			want:  []string{"pairs[0].failure_threshold = 4000000000", "between 1 and 10000"},
		},
		{
			name:  "pair file breaks a rule",
			files: map[string]string{"pg.yaml": pairHead + "fence_grace: -1s\n"},
			body:  "node: site-a\npairs:\n  - file: pg.yaml\n" + indent(nodeProcedures, 4),
			field: "pairs[0].fence_grace",
			want:  []string{"pairs[0].fence_grace = -1s", "must not be negative"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, body := range tc.files {
				writeFile(t, dir, name, body)
			}
			c := loadNode(t, dir, tc.body)
			err := c.Validate()
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("message %q does not contain %q", err, w)
				}
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("%v: not a *ConfigError", err)
			}
			if ce.Field != tc.field {
				t.Errorf("field %q, want %q", ce.Field, tc.field)
			}
		})
	}
}

func TestNodeFileRefusesUnknownKeys(t *testing.T) {
	for _, tc := range []struct{ name, body, key string }{
		{"pair entry", "node: site-a\npairs:\n  - pair: pg-main\n    primary: site-a\n    replica: site-b\n    failover_timout: 9s\n", "failover_timout"},
		{"step", "node: site-a\npairs:\n  - pair: pg-main\n    primary: site-a\n    replica: site-b\n    procedures:\n      fence:\n        steps:\n          - {name: s, driver: exec, exec: {comand: x}}\n", "comand"},
		{"chain", "node: site-a\npairs:\n  - pair: pg-main\n    primary: site-a\n    replica: site-b\n    procedures:\n      fense: {steps: []}\n", "fense"},
		{"top level", "node: site-a\npair: pg-main\n", "pair"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := writeFile(t, dir, "node.yaml", tc.body)
			_, err := LoadConfigFile(path)
			if err == nil || !strings.Contains(err.Error(), tc.key) || !strings.Contains(err.Error(), path) {
				t.Errorf("unknown key %s: %v", tc.key, err)
			}
		})
	}
}

func TestNodeFileMissingPairFile(t *testing.T) {
	dir := t.TempDir()
	c := loadNode(t, dir, "node: site-a\npairs:\n  - file: nope.yaml\n"+indent(nodeProcedures, 4))
	err := c.Validate()
	if err == nil || !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), filepath.Join(dir, "nope.yaml")) {
		t.Errorf("missing pair file: %v", err)
	}
}

// A second YAML document in a node or pair file would be ignored (typos
// included), and an empty node file would start a node on all defaults:
// both are refused, naming the file and the rule.
func TestFilesRefuseSecondDocumentAndEmptiness(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, body, want string }{
		{"second document", "node: site-a\n---\nnode: site-b\nhttp: typo\n", "line 2: a second YAML document (after ---)"},
		{"second empty-ish document", "node: site-a\n---\nfailover_timout: 9s\n", "a second YAML document"},
		{"empty", "", "the file is empty"},
		{"comments only", "# nothing here\n", "the file is empty"},
	} {
		path := writeFile(t, dir, tc.name+".yaml", tc.body)
		if _, err := LoadConfigFile(path); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("node file, %s: %v", tc.name, err)
		}
	}
	path := writeFile(t, dir, "pair.yaml", "pair: pg-main\nprimary: site-a\nreplica: site-b\n---\nfailover_timeout: 1s\n")
	if _, err := LoadPairFile(path, false); err == nil || !strings.Contains(err.Error(), "a second YAML document") {
		t.Errorf("pair file with a second document: %v", err)
	}
}

func TestPairFileReplicationRules(t *testing.T) {
	for _, tc := range []struct {
		body string
		lag  uint64
		sync failover.Synchronous
	}{
		{"", failover.DefaultMaxLag, failover.SyncOff},
		{"maximum_lag_on_failover: 16MiB\nsynchronous: strict\n", 16 << 20, failover.SyncStrict},
		{"maximum_lag_on_failover: 0\nsynchronous: \"on\"\n", 0, failover.SyncOn},
		{"maximum_lag_on_failover: 500000\n", 500000, failover.SyncOff},
	} {
		path := writeFile(t, t.TempDir(), "p.yaml", pairHead+tc.body)
		r, err := LoadPairFile(path, false)
		if err != nil {
			t.Fatalf("%q: %v", tc.body, err)
		}
		if r.MaxLagOnFailover != tc.lag || r.Synchronous != tc.sync {
			t.Errorf("%q: lag %d sync %v, want %d %v", tc.body, r.MaxLagOnFailover, r.Synchronous, tc.lag, tc.sync)
		}
	}
}

// A member whose workload fences itself needs no procedures: a postgres
// member with none loads, with fence_grace covering only the database's
// fence (pgsuite's TestNodeFileWithoutProcedures found the refusal).
func TestNodeFilePostgresMemberNeedsNoProcedures(t *testing.T) {
	if _, err := os.Stat("/usr/lib/postgresql/15/bin/initdb"); err != nil {
		t.Fatalf("PostgreSQL 15 is missing (scripts/install-test-deps.sh installs postgresql-15): %v", err)
	}
	dir := t.TempDir()
	c := loadNode(t, dir, "node: site-a\npairs:\n  - "+strings.TrimPrefix(indent(pairHead, 4), "    ")+
		"    fence_grace: 500ms\n    failover_timeout: 4s\n    postgres: {data_dir: "+filepath.Join(dir, "pg")+", peer: '127.0.0.1:5433', replication: {password: x}}\n")
	if err := c.Validate(); err != nil {
		t.Fatalf("refused: %v", err)
	}
	s, err := c.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if len(s.members) != 1 || s.members[0].Postgres == nil || !s.members[0].Options.Positions {
		t.Fatalf("members %+v", s.members)
	}
}
