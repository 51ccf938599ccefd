package simulations

import (
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"understudy/actors/procedure"
)

// Every schedule the generators produce survives FormatFaults and
// ParseFaults unchanged: a printed schedule reproduces the run.
func TestFaultSyntaxRoundTrip(t *testing.T) {
	rules := DefaultPair()
	for _, sc := range Scenarios() {
		for seed := uint64(1); seed <= 20; seed++ {
			fs := sc.Schedule(rand.New(rand.NewPCG(seed, streamSchedule)), rules, sc.Duration)
			text := FormatFaults(fs)
			back, err := ParseFaults(text, rules.Primary, rules.Replica)
			if err != nil {
				t.Fatalf("%s seed %d: parse %q: %v", sc.Name, seed, text, err)
			}
			if len(fs) == 0 && len(back) == 0 {
				continue
			}
			if !reflect.DeepEqual(sortedByTime(fs), back) {
				t.Fatalf("%s seed %d: round trip changed the schedule\n in: %v\nout: %v", sc.Name, seed, fs, back)
			}
		}
	}
}

func sortedByTime(fs []Fault) []Fault {
	out := append([]Fault(nil), fs...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j].At < out[j-1].At; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

func TestParseForge(t *testing.T) {
	spec := "forge(handoff,replica)@10s;forge(handoff,site-b,by=replica)@11s;forge(beats,primary)@12s+1m;forge(ready,site-a,site-b)@13s+30s;forge(replay,primary)@14s+20s;forge(msgid,replica)@15s+1m"
	fs, err := ParseFaults(spec, "site-a", "site-b")
	if err != nil {
		t.Fatal(err)
	}
	want := []Fault{
		{Kind: FaultForge, Forge: ForgeHandoff, Site: "site-b", At: 10 * time.Second},
		{Kind: FaultForge, Forge: ForgeHandoff, Site: "site-b", By: "site-b", At: 11 * time.Second},
		{Kind: FaultForge, Forge: ForgeBeats, Site: "site-a", At: 12 * time.Second, For: time.Minute},
		{Kind: FaultForge, Forge: ForgeReady, Site: "site-a", Key: "site-b", At: 13 * time.Second, For: 30 * time.Second},
		{Kind: FaultForge, Forge: ForgeReplay, Site: "site-a", At: 14 * time.Second, For: 20 * time.Second},
		{Kind: FaultForge, Forge: ForgeMsgID, Site: "site-b", At: 15 * time.Second, For: time.Minute},
	}
	if !reflect.DeepEqual(fs, want) {
		t.Fatalf("parsed\n %v\nwant\n %v", fs, want)
	}
	if got := FormatFaults(fs); got != "forge(handoff,site-b)@10s;forge(handoff,site-b,by=site-b)@11s;forge(beats,site-a)@12s+1m0s;forge(ready,site-a,site-b)@13s+30s;forge(replay,site-a)@14s+20s;forge(msgid,site-b)@15s+1m0s" {
		t.Errorf("formatted %q", got)
	}
}

func TestParseFaults(t *testing.T) {
	fs, err := ParseFaults(" partition(primary,both)@12.5s+4s; crash(nats)@1m ;loss(site-b,2.5%)@3s+1m;proc(site-a,fence,fail-all)@2s+1s;serverclock(-1.5s)@4s;jump(replica,+30s)@5s", "site-a", "site-b")
	if err != nil {
		t.Fatal(err)
	}
	want := []Fault{
		{Kind: FaultProc, Site: "site-a", Chain: procedure.ChainFence, Mode: ProcFailAll, At: 2 * time.Second, For: time.Second},
		{Kind: FaultLoss, Site: "site-b", Dir: DirBoth, Loss: 25, At: 3 * time.Second, For: time.Minute},
		{Kind: FaultServerClock, Value: -1500 * time.Millisecond, At: 4 * time.Second},
		{Kind: FaultJump, Site: "site-b", Value: 30 * time.Second, At: 5 * time.Second},
		{Kind: FaultPartition, Site: "site-a", Dir: DirBoth, At: 12500 * time.Millisecond, For: 4 * time.Second},
		{Kind: FaultCrash, Site: NATS, At: time.Minute},
	}
	if !reflect.DeepEqual(fs, want) {
		t.Fatalf("parsed\n %v\nwant\n %v", fs, want)
	}
	if got := FormatFaults(fs); got != "proc(site-a,fence,fail-all)@2s+1s;loss(site-b,2.5%)@3s+1m0s;serverclock(-1.5s)@4s;jump(site-b,+30s)@5s;partition(site-a,both)@12.5s+4s;crash(nats)@1m0s" {
		t.Errorf("formatted %q", got)
	}
	for _, tc := range []struct{ spec, want string }{
		{"partition(site-a,both)", "missing @TIME"},
		{"flood(site-a)@1s", `unknown fault "flood"`},
		{"partition(site-c,both)@1s+1s", `site "site-c"`},
		{"partition(site-a,sideways)@1s+1s", `direction "sideways"`},
		{"partition(site-a,both)@1s", "needs a duration"},
		{"pause(site-a)@1s", "needs a duration"},
		{"jump(site-a,-1s)@1s", "only jumps forward"},
		{"jump(site-a,+1s)@1s+2s", "no +DURATION"},
		{"loss(site-a,120%)@1s+1s", "percentage"},
		{"latency(site-a,up)@1s+1s", "want latency(SITE,DIR,DURATION)"},
		{"proc(site-a,check,fail)@1s+1s", `chain "check"`},
		{"proc(site-a,fence,explode)@1s+1s", `mode "explode"`},
		{"pause(nats)@1s+1s", `site "nats"`},
		{"crash(site-a)@-1s", "non-negative"},
		{"crash(site-a@1s", "missing ')'"},
		{"forge(handoff,site-b)@1s+1s", "no +DURATION"},
		{"forge(beats,site-a)@1s", "needs a duration"},
		{"forge(ready,site-a,site-a)@1s+1s", "NATS permissions"},
		{"forge(ready,site-a)@1s+1s", "KEY"},
		{"forge(beats,site-a,site-b)@1s+1s", "by=SITE"},
		{"forge(beats,site-a,by=site-c)@1s+1s", `site "site-c"`},
		{"forge(votes,site-a)@1s+1s", `forged value "votes"`},
		{"forge(replay,site-a,by=site-b)@1s+1s", "no by=SITE"},
		{"forge(replay,site-a)@1s", "needs a duration"},
		{"forge(msgid,site-a,by=site-b)@1s+1s", "no by=SITE"},
		{"forge(msgid,site-a)@1s", "needs a duration"},
	} {
		_, err := ParseFaults(tc.spec, "site-a", "site-b")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseFaults(%q) = %v, want an error containing %q", tc.spec, err, tc.want)
		}
	}
}
