package events_test

import (
	"testing"
	"time"

	"understudy/events"
)

type described struct {
	Pair    string        `msgpack:"pair"`
	Term    uint64        `msgpack:"t,omitempty"`
	Took    time.Duration `msgpack:"took"`
	At      time.Time     `msgpack:"at"`
	Nested  struct{ X int }
	Skipped int `msgpack:"-"`
	Zero    int `msgpack:"zero"`
	hidden  int
}

func (*described) EventType() string { return "test.described" }

func TestDescribe(t *testing.T) {
	ev := &described{Pair: "p", Term: 3, Took: 1500 * time.Millisecond, At: time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("x", 3600)), Skipped: 9, hidden: 1}
	ev.Nested.X = 2
	want := "t=3 took=1.5s at=2026-01-02T02:04:05.000000006Z nested={X:2} skipped=9"
	if got := events.Describe(ev, "Pair"); got != want {
		t.Errorf("Describe\n got %s\nwant %s", got, want)
	}
	if got := events.Describe(&described{}); got != "" {
		t.Errorf("a zero event: %q", got)
	}
	if got := events.Describe((*described)(nil)); got != "" {
		t.Errorf("a nil event: %q", got)
	}
}
