package partition

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// at is a time t seconds after an arbitrary origin.
func at(t float64) time.Time {
	return time.Unix(1_700_000_000, 0).Add(time.Duration(t * float64(time.Second)))
}

func events(t *testing.T, text string) []Event {
	t.Helper()
	evs, err := ParseOracle(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	SortEvents(evs)
	return evs
}

func TestParseOracle(t *testing.T) {
	evs := events(t, "fence 1700000000000000000 site-a\n\npromote 1700000001500000000 site-a\n")
	if len(evs) != 2 || evs[1].Kind != KindPromote || !evs[1].At.Equal(at(1.5)) || evs[1].Site != "site-a" {
		t.Fatalf("got %+v", evs)
	}
	for _, bad := range []string{"promote 17000 ", "serve 1 site-a", "promote x site-a"} {
		if _, err := ParseOracle(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestServingAndOverlaps(t *testing.T) {
	// a serves 1..5, b serves 7..12, a again from 12.5; b also from 4
	// (a split brain 4..5).
	evs := []Event{
		{KindFence, at(0), "site-a"}, {KindFence, at(0), "site-b"},
		{KindPromote, at(1), "site-a"}, {KindPromote, at(2), "site-a"}, // a re-run promote extends
		{KindPromote, at(4), "site-b"},
		{KindFence, at(5), "site-a"},
		{KindDemote, at(12), "site-b"},
		{KindPromote, at(12.5), "site-a"},
	}
	SortEvents(evs)
	ivs := Serving(evs, at(20))
	want := []Interval{
		{Site: "site-a", From: at(1), To: at(5)},
		{Site: "site-b", From: at(4), To: at(12)},
		{Site: "site-a", From: at(12.5), To: at(20), Open: true},
	}
	if !slices.Equal(ivs, want) {
		t.Fatalf("intervals\n got %v\nwant %v", ivs, want)
	}
	ov := Overlaps(ivs)
	if len(ov) != 1 || !ov[0].From.Equal(at(4)) || !ov[0].To.Equal(at(5)) {
		t.Fatalf("overlaps: %v", ov)
	}
	if got := LeadershipChanges(ivs); got != 2 {
		t.Errorf("leadership changes %d, want 2", got)
	}
	if got := ServingAt(ivs, at(20)); !slices.Equal(got, []string{"site-a"}) {
		t.Errorf("serving at the end: %v", got)
	}
	if got := ServingAt(ivs, at(4.5)); !slices.Equal(got, []string{"site-a", "site-b"}) {
		t.Errorf("serving at 4.5: %v", got)
	}
	if got := ServingAt(ivs, at(12.2)); len(got) != 0 {
		t.Errorf("serving at 12.2: %v", got)
	}
}

func TestTouchingIntervalsDoNotOverlap(t *testing.T) {
	ivs := []Interval{{Site: "site-a", From: at(1), To: at(3)}, {Site: "site-b", From: at(3), To: at(5)}}
	if ov := Overlaps(ivs); len(ov) != 0 {
		t.Fatalf("overlaps: %v", ov)
	}
}

func TestGaps(t *testing.T) {
	ivs := []Interval{
		{Site: "site-a", From: at(1), To: at(5)},
		{Site: "site-b", From: at(7), To: at(12)},
		{Site: "site-a", From: at(12.5), To: at(20), Open: true},
	}
	got := Gaps(ivs, at(0), at(20))
	want := []Gap{{at(0), at(1)}, {at(5), at(7)}, {at(12), at(12.5)}}
	if !slices.Equal(got, want) {
		t.Fatalf("gaps\n got %v\nwant %v", got, want)
	}
	if l := Longest(got); l != (Gap{at(5), at(7)}) {
		t.Errorf("longest %v", l)
	}
	// A window inside one interval has no gap; one after the last closed
	// interval is one gap to the end.
	if g := Gaps(ivs, at(2), at(4)); len(g) != 0 {
		t.Errorf("inside: %v", g)
	}
	closed := ivs[:2]
	if g := Gaps(closed, at(10), at(15)); !slices.Equal(g, []Gap{{at(12), at(15)}}) {
		t.Errorf("tail: %v", g)
	}
	if g := Gaps(nil, at(0), at(3)); !slices.Equal(g, []Gap{{at(0), at(3)}}) {
		t.Errorf("nobody: %v", g)
	}
}

func TestFirstAfterAndCount(t *testing.T) {
	evs := events(t, "promote 1700000001000000000 site-a\nfence 1700000005000000000 site-a\npromote 1700000007000000000 site-b\npromote 1700000009000000000 site-a\n")
	if e, ok := FirstAfter(evs, KindPromote, "site-b", at(2)); !ok || !e.At.Equal(at(7)) {
		t.Errorf("first promote of b: %v %v", e, ok)
	}
	if _, ok := FirstAfter(evs, KindPromote, "site-b", at(8)); ok {
		t.Error("a promote of b after 8")
	}
	if n := Count(evs, KindPromote, at(2)); n != 2 {
		t.Errorf("promotes after 2: %d", n)
	}
}
