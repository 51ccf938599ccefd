package runtime

import (
	"maps"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"understudy/actors/failover"
	"understudy/events"
)

// understudy_member_events_total counts each member's events by type,
// while scrapes run (-race), and a member that starts again carries on
// its counts.
func TestMemberEventsCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMemberMetrics(reg)
	a, b := m.member("p1", "site-a"), m.member("p2", "site-b")
	evs := []events.Event{&failover.AcquireAttempted{Term: 1}, &failover.Promoted{Term: 1}, &failover.AcquireAttempted{Term: 2}}
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			_, _ = reg.Gather()
		})
	}
	for range 100 {
		a.events.add(evs)
	}
	b.events.add(evs[1:2])
	wg.Wait()
	if again := m.member("p1", "site-a"); again.events != a.events {
		t.Errorf("a restarted member's counts start afresh")
	}
	got := map[string]float64{}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "understudy_member_events_total" {
			continue
		}
		for _, mt := range mf.GetMetric() {
			var l []string
			for _, lp := range mt.GetLabel() {
				l = append(l, lp.GetValue())
			}
			got[strings.Join(l, " ")] = mt.GetCounter().GetValue()
		}
	}
	want := map[string]float64{
		"p1 site-a failover.acquire_attempted": 200,
		"p1 site-a failover.promoted":          100,
		"p2 site-b failover.promoted":          1,
	}
	if !maps.Equal(got, want) {
		t.Errorf("understudy_member_events_total %v, want %v", got, want)
	}
}
