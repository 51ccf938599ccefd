package procedure

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"understudy/actors"
)

// node is how the node config file embeds a Spec.
type node struct {
	Procedures Spec `yaml:"procedures"`
}

func load(t *testing.T, text string) (Spec, error) {
	t.Helper()
	var n node
	dec := yaml.NewDecoder(strings.NewReader(text))
	dec.KnownFields(true)
	if err := dec.Decode(&n); err != nil {
		return Spec{}, err
	}
	return n.Procedures, n.Procedures.Validate()
}

const goodYAML = `
procedures:
  fence:
    steps:
      - name: stop
        driver: exec
        timeout: 10s
        exec:
          command: pg_ctl
          args: [stop, -D, /var/lib/pg, -m, fast]
          env: {PGUSER: postgres}
          dir: /var/lib/pg
      - driver: exec
        exec: {command: pkill, args: ["-9", postgres]}
  promote:
    steps:
      - {name: promote, driver: exec, timeout: 1m30s, exec: {command: pg_ctl, args: [promote]}}
`

func TestSpecGood(t *testing.T) {
	spec, err := load(t, goodYAML)
	if err != nil {
		t.Fatal(err)
	}
	want := Spec{
		Fence: ChainSpec{Steps: []StepSpec{
			{Name: "stop", Driver: "exec", Timeout: 10 * time.Second, Exec: &ExecSpec{
				Command: "pg_ctl", Args: []string{"stop", "-D", "/var/lib/pg", "-m", "fast"},
				Env: map[string]string{"PGUSER": "postgres"}, Dir: "/var/lib/pg",
			}},
			{Name: "exec-1", Driver: "exec", Timeout: DefaultStepTimeout, Exec: &ExecSpec{Command: "pkill", Args: []string{"-9", "postgres"}}},
		}},
		Promote: ChainSpec{Steps: []StepSpec{
			{Name: "promote", Driver: "exec", Timeout: 90 * time.Second, Exec: &ExecSpec{Command: "pg_ctl", Args: []string{"promote"}}},
		}},
	}
	if !reflect.DeepEqual(spec, want) {
		t.Fatalf("loaded\n %+v\nwant\n %+v", spec, want)
	}

	// Written back and read again, it is the same spec (timeouts as "10s").
	text, err := yaml.Marshal(node{Procedures: spec})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(text), "timeout: 1m30s") {
		t.Errorf("timeouts must be written as durations:\n%s", text)
	}
	again, err := load(t, string(text))
	if err != nil {
		t.Fatalf("reload: %v\n%s", err, text)
	}
	if !reflect.DeepEqual(again, spec) {
		t.Errorf("round trip changed the spec:\n got %+v\nwant %+v", again, spec)
	}
}

func TestSpecErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, field, rule, value string
	}{
		{
			name: "negative timeout",
			yaml: `
procedures:
  fence:
    steps:
      - {name: stop, driver: exec, exec: {command: pg_ctl}}
      - {name: kill, driver: exec, timeout: -1s, exec: {command: pkill}}`,
			field: "procedures.fence.steps[1].timeout", rule: "positive", value: "-1s",
		},
		{
			name: "zero timeout",
			yaml: `
procedures:
  fence: {steps: [{name: stop, driver: exec, timeout: 0s, exec: {command: pg_ctl}}]}`,
			field: "procedures.fence.steps[0].timeout", rule: "positive", value: "0s",
		},
		{
			name: "timeout without unit",
			yaml: `
procedures:
  fence: {steps: [{name: stop, driver: exec, timeout: 10, exec: {command: pg_ctl}}]}`,
			field: "procedures.fence.steps[0].timeout", rule: "Go duration", value: `"10"`,
		},
		{
			name: "unknown driver",
			yaml: `
procedures:
  fence: {steps: [{name: stop, driver: exec, exec: {command: pg_ctl}}]}
  demote:
    steps:
      - {name: a, driver: exec, exec: {command: pg_ctl}}
      - {name: b, driver: exec, exec: {command: pg_ctl}}
      - {name: c, driver: ipmi-power-off}`,
			field: "procedures.demote.steps[2].driver", rule: "unknown driver; known drivers: exec, libvirt-destroy, libvirt-link-down", value: `"ipmi-power-off"`,
		},
		{
			name: "missing driver",
			yaml: `
procedures:
  fence: {steps: [{name: stop, exec: {command: pg_ctl}}]}`,
			field: "procedures.fence.steps[0].driver", rule: "must be set",
		},
		{
			name: "empty command",
			yaml: `
procedures:
  fence: {steps: [{name: stop, driver: exec, exec: {command: pg_ctl}}]}
  promote: {steps: [{name: promote, driver: exec, exec: {command: "  ", args: [promote]}}]}`,
			field: "procedures.promote.steps[0].exec.command", rule: "must not be empty",
		},
		{
			name: "exec fields missing",
			yaml: `
procedures:
  fence: {steps: [{name: stop, driver: exec}]}`,
			field: "procedures.fence.steps[0].exec", rule: "must be set with driver exec",
		},
		{
			name: "bad env name",
			yaml: `
procedures:
  fence: {steps: [{name: stop, driver: exec, exec: {command: pg_ctl, env: {"A=B": x}}}]}`,
			field: "procedures.fence.steps[0].exec.env", rule: "no '='", value: `"A=B"`,
		},
		{
			name: "no fence step",
			yaml: `
procedures:
  promote: {steps: [{name: promote, driver: exec, exec: {command: pg_ctl}}]}`,
			field: "procedures.fence.steps", rule: "at least one step",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := load(t, tc.yaml)
			var ce *actors.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("want *actors.ConfigError, got %v", err)
			}
			if ce.Field != tc.field || !strings.Contains(ce.Rule, tc.rule) || ce.Value != tc.value {
				t.Errorf("got Field=%q Rule=%q Value=%q\nwant Field=%q Rule~%q Value=%q", ce.Field, ce.Rule, ce.Value, tc.field, tc.rule, tc.value)
			}
		})
	}
}

// A step without a name is only possible from Go; YAML names it.
func TestSpecMissingName(t *testing.T) {
	spec := Spec{Fence: ChainSpec{Steps: []StepSpec{{Driver: "exec", Timeout: time.Second, Exec: &ExecSpec{Command: "true"}}}}}
	var ce *actors.ConfigError
	if err := spec.Validate(); !errors.As(err, &ce) || ce.Field != "procedures.fence.steps[0].name" {
		t.Fatalf("want a missing-name error on procedures.fence.steps[0].name, got %v", err)
	}
}

// A misspelled key is an error, not a silently defaulted value: the
// custom unmarshalers keep the decoder's KnownFields.
func TestSpecUnknownKey(t *testing.T) {
	_, err := load(t, `
procedures:
  fence: {steps: [{name: stop, driver: exec, timeot: 5s, exec: {command: pg_ctl}}]}`)
	if err == nil || !strings.Contains(err.Error(), "timeot") {
		t.Fatalf("want an error naming the unknown key, got %v", err)
	}
	_, err = load(t, `
procedures:
  fence: {steps: [{name: stop, driver: exec, exec: {command: pg_ctl, arg: [x]}}]}`)
	if err == nil || !strings.Contains(err.Error(), "arg") {
		t.Fatalf("want an error naming the unknown exec key, got %v", err)
	}
}

func TestSummary(t *testing.T) {
	s := StepSpec{Driver: "exec", Exec: &ExecSpec{Command: "sh", Args: []string{"-c", "echo $X", ""}, Env: map[string]string{"SECRET": "hunter2"}}}
	if got, want := s.Summary(), `sh -c "echo $X" ""`; got != want {
		t.Errorf("Summary = %s, want %s", got, want)
	}
	long := StepSpec{Driver: "exec", Exec: &ExecSpec{Command: "echo", Args: []string{strings.Repeat("é", 400)}}}
	if got := long.Summary(); len(got) > maxSummary || !strings.HasSuffix(got, "…") {
		t.Errorf("long summary not bounded: %d bytes, %q", len(got), got[len(got)-8:])
	}
}
