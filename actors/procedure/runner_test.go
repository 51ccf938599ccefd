package procedure

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"gopkg.in/yaml.v3"

	"understudy/actors/failover"
	"understudy/events"
)

// TestTranscripts drives a Runner through the scenarios in testdata/runner.
// Regenerate with: go test ./actors/procedure -run Transcripts -rewrite
// and review the diff.
//
//	spec                                  YAML Spec as input; builds the runner
//	run at=<dur> kind=<kind> seq=<n>      Runner.Run
//	done at=<dur> run=<id> result=ok|failed|timed-out [exit=<n>] [detail=(...)]
//	tick at=<dur>                         Runner.Tick
//	wake                                  Runner.NextWake
func TestTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata/runner", func(t *testing.T, path string) {
		var r *Runner
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			arg := func(key string) (string, bool) {
				for _, a := range d.CmdArgs {
					if a.Key == key {
						return strings.Join(a.Vals, ", "), true
					}
				}
				return "", false
			}
			must := func(key string) string {
				v, ok := arg(key)
				if !ok {
					d.Fatalf(t, "%s= required", key)
				}
				return v
			}
			at := func() time.Duration {
				v, err := time.ParseDuration(must("at"))
				if err != nil {
					d.Fatalf(t, "at: %v", err)
				}
				return v
			}
			num := func(key string) uint64 {
				v, err := strconv.ParseUint(must(key), 10, 64)
				if err != nil {
					d.Fatalf(t, "%s: %v", key, err)
				}
				return v
			}
			if d.Cmd != "spec" && r == nil {
				d.Fatalf(t, "spec must come first")
			}
			switch d.Cmd {
			case "spec":
				var spec Spec
				dec := yaml.NewDecoder(strings.NewReader(d.Input))
				dec.KnownFields(true)
				if err := dec.Decode(&spec); err != nil {
					d.Fatalf(t, "yaml: %v", err)
				}
				if err := spec.Validate(); err != nil {
					return "error: " + err.Error()
				}
				r = NewRunner("pg-main", spec)
				return "ok"
			case "run":
				return render(r.Run(at(), parseKind(t, d, must("kind")), num("seq")))
			case "done":
				o := Outcome{Result: parseResult(t, d, must("result"))}
				if s, ok := arg("exit"); ok {
					n, err := strconv.Atoi(s)
					if err != nil {
						d.Fatalf(t, "exit: %v", err)
					}
					o.ExitCode = n
				}
				o.Detail, _ = arg("detail")
				return render(r.StepDone(at(), StepResult{RunID: num("run"), Outcome: o}))
			case "tick":
				return render(r.Tick(at()))
			case "wake":
				w, ok := r.NextWake()
				if !ok {
					return "idle"
				}
				return "wake at " + w.String()
			}
			d.Fatalf(t, "unknown command %q", d.Cmd)
			return ""
		})
	})
}

func parseKind(t *testing.T, d *datadriven.TestData, s string) ChainKind {
	for k := ChainFence; k <= ChainCheck; k++ {
		if k.String() == s {
			return k
		}
	}
	d.Fatalf(t, "unknown kind %q", s)
	return 0
}

func parseResult(t *testing.T, d *datadriven.TestData, s string) OutcomeResult {
	for r := ResultOK; r <= ResultTimedOut; r++ {
		if r.String() == s {
			return r
		}
	}
	d.Fatalf(t, "unknown result %q", s)
	return 0
}

// render prints an Out one line per item: events with their msgpack field
// names (the resource left out), then starts, cancels and the result.
func render(out Out) string {
	var b strings.Builder
	for _, ev := range out.Events {
		b.WriteString(ev.EventType())
		v := reflect.ValueOf(ev).Elem()
		for i := range v.NumField() {
			tag, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("msgpack"), ",")
			if tag == "res" {
				continue
			}
			f := v.Field(i)
			if f.Kind() == reflect.String {
				fmt.Fprintf(&b, " %s=%q", tag, f.String())
			} else {
				fmt.Fprintf(&b, " %s=%v", tag, f.Interface())
			}
		}
		b.WriteByte('\n')
	}
	for _, s := range out.Start {
		fmt.Fprintf(&b, "START run=%d %s seq=%d step %d %q deadline=%v\n", s.RunID, s.Kind, s.Seq, s.Index, s.Step.Name, s.Deadline)
	}
	for _, id := range out.Cancel {
		fmt.Fprintf(&b, "CANCEL run=%d\n", id)
	}
	if c := out.Done; c != nil {
		fmt.Fprintf(&b, "DONE %s seq=%d ok=%v detail=%q\n", c.Kind, c.Seq, c.OK, c.Detail)
	}
	return b.String()
}

// TestEventsRoundTrip encodes and decodes every event through a registry.
func TestEventsRoundTrip(t *testing.T) {
	reg := events.NewRegistry()
	if err := RegisterEvents(reg); err != nil {
		t.Fatal(err)
	}
	if err := RegisterEvents(reg); err != nil {
		t.Fatalf("registering again must be a no-op: %v", err)
	}
	for _, ev := range []events.Event{
		&ChainStarted{Resource: "pg", Kind: ChainFence, Seq: 7, Steps: 2},
		&StepStarted{Resource: "pg", Kind: ChainFence, Seq: 7, Index: 1, Name: "kill", Driver: "exec", Command: "pkill -9 postgres", Timeout: 5 * time.Second},
		&StepFinished{Resource: "pg", Kind: ChainFence, Seq: 7, Index: 1, Name: "kill", Result: ResultTimedOut, ExitCode: -1, Detail: "deadline", Took: 5 * time.Second},
		&ChainFinished{Resource: "pg", Kind: ChainPromote, Seq: 8, OK: true, Superseded: true, Detail: "x", Took: time.Millisecond},
	} {
		raw, err := reg.Encode(ev)
		if err != nil {
			t.Fatalf("encode %T: %v", ev, err)
		}
		got, err := reg.Decode(Subject("pg"), 1, raw)
		if err != nil {
			t.Fatalf("decode %T: %v", ev, err)
		}
		if !reflect.DeepEqual(got, ev) {
			t.Errorf("round trip of %s:\n got %+v\nwant %+v", ev.EventType(), got, ev)
		}
	}
}

// TestChainKindValues pins the values a host converts directly from the
// member's procedure kinds.
func TestChainKindValues(t *testing.T) {
	for k, want := range map[ChainKind]failover.ProcKind{ChainFence: failover.ProcFence, ChainPromote: failover.ProcPromote, ChainDemote: failover.ProcDemote} {
		if int(k) != int(want) || k.String() != want.String() {
			t.Errorf("%s = %d, failover.%s = %d", k, int(k), want, int(want))
		}
	}
	if ChainKind(0).String() != "unset" || OutcomeResult(0).String() != "unset" {
		t.Error("zero enums must print as unset")
	}
}
