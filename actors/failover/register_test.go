package failover

import (
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
	for _, key := range []string{"p.leader", "p.hb.a", "p.switchover"} {
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
