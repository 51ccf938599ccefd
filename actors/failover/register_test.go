package failover

import (
	"strings"
	"testing"
	"time"

	"understudy/events"
)

func TestInputOf(t *testing.T) {
	at := time.Unix(100, 0).UTC()
	entry := func(key string, value []byte) events.Entry {
		return events.Entry{Key: key, Value: value, Revision: 7, Time: at, Op: events.OpPut}
	}
	l := Leader{Site: "a", Term: 3, Beat: 9}
	in, err := InputOf("p", entry("p.leader", EncodeLeader(l)))
	if lo, ok := in.(LeaderObserved); err != nil || !ok || lo.Entry != (LeaderEntry{Rev: 7, Time: at, Value: l}) {
		t.Errorf("leader: %#v %v", in, err)
	}
	if in, err := InputOf("p", entry("p.config", []byte{0xc1})); err != nil || in.(ConfigObserved).DecodeErr == "" {
		t.Errorf("corrupt rules are an input the member refuses: %#v %v", in, err)
	}
	// A corrupt register is an input (held by nobody) and an error to report.
	in, err = InputOf("p", entry("p.leader", []byte{0xc1}))
	if lo, ok := in.(LeaderObserved); err == nil || !ok || lo.Entry != (LeaderEntry{Rev: 7, Time: at, Corrupt: true}) ||
		!strings.Contains(err.Error(), "revision 7, 1 bytes c1") {
		t.Errorf("corrupt leader: %#v %v", in, err)
	}
	hist := []events.Entry{entry("p.leader", EncodeLeader(Leader{Site: "a", Term: 4})), entry("p.leader", []byte{0xc1}),
		entry("p.leader", EncodeLeader(Leader{Term: 2, Handoff: "b"}))}
	if got := HighestTerm(hist); got != 4 {
		t.Errorf("highest term %d, want 4", got)
	}
	if le, err := LeaderEntryOf(entry("p.leader", []byte("garbage")), 4); err == nil || !le.Corrupt || le.Value != (Leader{Term: 4}) {
		t.Errorf("corrupt entry with history: %+v %v", le, err)
	}
	for _, key := range []string{"p.hb.a", "p.switchover"} {
		if in, err := InputOf("p", entry(key, []byte{0xc1})); in != nil || err == nil {
			t.Errorf("corrupt %s: %#v %v", key, in, err)
		}
	}
	del := entry("p.leader", nil)
	del.Op = events.OpDelete
	for _, e := range []events.Entry{del, entry("q.leader", EncodeLeader(l)), entry("p.other", nil)} {
		if in, err := InputOf("p", e); in != nil || err != nil {
			t.Errorf("%s op %v: %#v %v", e.Key, e.Op, in, err)
		}
	}
}
