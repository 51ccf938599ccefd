package simulations

import (
	"testing"
	"time"
)

func TestPatternFaults(t *testing.T) {
	s := time.Second
	beats := func(from, to time.Duration) []time.Duration {
		var out []time.Duration
		for t := from; t <= to; t += s {
			out = append(out, t)
		}
		return out
	}
	// site-a: steady to 10s, one write 300ms late at 11.3s, a gap (12.3s →
	// 20.3s: cut off), steady again, a restart at 30s, then silent from 40.3s.
	a := append(beats(0, 10*s), 11300*time.Millisecond, 12300*time.Millisecond)
	a = append(a, beats(20300*time.Millisecond, 25300*time.Millisecond)...)
	a = append(a, beats(31*s, 40*s)...)
	p := Pattern{
		Duration: 60 * s, Interval: s,
		Sites: []SitePattern{
			{Site: "site-a", Writes: a, Restarts: []time.Duration{0, 30 * s}},
			{Site: "site-b", Writes: beats(0, 60*s)},
		},
		Switchovers: []Switch{{At: 50 * s, To: "site-b"}},
	}
	got := FormatFaults(p.Faults())
	want := "latency(site-a,up,300ms)@10.5s+1s;partition(site-a,both)@12.8s+7s;crash(site-a)@25.8s+4.2s;powercut(site-a)@40.5s;switchover(site-b)@50s"
	if got != want {
		t.Errorf("faults\n got %s\nwant %s", got, want)
	}
	// The schedule is one the simulator accepts as --faults.
	if _, err := ParseFaults(got, "site-a", "site-b"); err != nil {
		t.Fatal(err)
	}
}

func TestPatternFaultsSteadyIsEmpty(t *testing.T) {
	var w []time.Duration
	for t := time.Duration(0); t < time.Minute; t += 1010 * time.Millisecond {
		w = append(w, t) // 10ms of drift per beat: within a tenth of the interval
	}
	p := Pattern{Duration: time.Minute, Interval: time.Second, Sites: []SitePattern{{Site: "site-a", Writes: w}}}
	if fs := p.Faults(); len(fs) != 0 {
		t.Errorf("a steady pattern gave faults: %s", FormatFaults(fs))
	}
}
