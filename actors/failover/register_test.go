package failover

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"understudy/actors/procedure"
	"understudy/events"
)

func TestInputOf(t *testing.T) {
	at := time.Unix(100, 0).UTC()
	entry := func(key string, value []byte) events.Entry {
		return events.Entry{Key: key, Value: value, Revision: 7, Time: at, Op: events.OpPut}
	}
	l := Leader{Site: "a", Term: 3, Beat: 9}
	in, err := InputOf("p", entry("p.leader", EncodeLeader(l)))
	if lo, ok := in.(LeaderObserved); err != nil || !ok || !reflect.DeepEqual(lo.Entry, LeaderEntry{Rev: 7, Time: at, Value: l}) {
		t.Errorf("leader: %#v %v", in, err)
	}
	if in, err := InputOf("p", entry("p.config", []byte{0xc1})); err != nil || in.(ConfigObserved).DecodeErr == "" {
		t.Errorf("corrupt rules are an input the member refuses: %#v %v", in, err)
	}
	// A corrupt register is an input (held by nobody) and an error to report.
	in, err = InputOf("p", entry("p.leader", []byte{0xc1}))
	if lo, ok := in.(LeaderObserved); err == nil || !ok || !reflect.DeepEqual(lo.Entry, LeaderEntry{Rev: 7, Time: at, Corrupt: true}) ||
		!strings.Contains(err.Error(), "revision 7, 1 bytes c1") {
		t.Errorf("corrupt leader: %#v %v", in, err)
	}
	hist := []events.Entry{entry("p.leader", EncodeLeader(Leader{Site: "a", Term: 4})), entry("p.leader", []byte{0xc1}),
		entry("p.leader", EncodeLeader(Leader{Term: 2, Handoff: "b"}))}
	if got := HighestTerm(hist); got != 4 {
		t.Errorf("highest term %d, want 4", got)
	}
	if le, err := LeaderEntryOf(entry("p.leader", []byte("garbage")), 4); err == nil || !le.Corrupt || !reflect.DeepEqual(le.Value, Leader{Term: 4}) {
		t.Errorf("corrupt entry with history: %+v %v", le, err)
	}
	// A heartbeat is the site's its key names, whatever the value claims.
	in, err = InputOf("p", entry("p.hb.b", EncodeHeartbeat(Heartbeat{Site: "a", Beat: 3, Ready: true})))
	if ho, ok := in.(HeartbeatObserved); err != nil || !ok || ho.Site != "b" || ho.Value.Site != "a" {
		t.Errorf("heartbeat under b's key claiming a: %#v %v", in, err)
	}
	for _, key := range []string{"p.hb.", "p.hb.a.x"} {
		if in, err := InputOf("p", entry(key, EncodeHeartbeat(Heartbeat{Site: "a"}))); in != nil || err != nil {
			t.Errorf("%s is no heartbeat key: %#v %v", key, in, err)
		}
	}
	// By and Sig round-trip, and are left out when empty.
	signed := Leader{Site: "a", Term: 3, Beat: 9, By: "a", Sig: []byte{1, 2, 3}}
	if got, err := DecodeLeader(EncodeLeader(signed)); err != nil || !reflect.DeepEqual(got, signed) {
		t.Errorf("signed value: %+v %v", got, err)
	}
	if b := EncodeLeader(l); strings.Contains(string(b), "by") || strings.Contains(string(b), "sg") {
		t.Errorf("unsigned value carries by or sg: %q", b)
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

// A pause deleted from the bucket is a pair that is not paused; a failover
// request carries its entry's server time.
func TestInputOfOperatorKeys(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	in, err := InputOf("p", events.Entry{Key: PauseKey("p"), Revision: 7, Time: at, Op: events.OpDelete})
	if po, ok := in.(PauseObserved); err != nil || !ok || po.Rev != 7 || po.Pause.Paused {
		t.Errorf("pause deleted: %#v %v", in, err)
	}
	in, err = InputOf("p", events.Entry{Key: PauseKey("p"), Revision: 8, Time: at, Op: events.OpPut,
		Value: EncodePause(Pause{ID: "x", Paused: true, Reason: "upgrade", At: at})})
	if po, ok := in.(PauseObserved); err != nil || !ok || !po.Pause.Paused || po.Pause.Reason != "upgrade" || po.Pause.ID != "x" {
		t.Errorf("pause: %#v %v", in, err)
	}
	req := ManualFailover{ID: "y", To: "b", Force: true, Requested: at, Within: time.Minute}
	in, err = InputOf("p", events.Entry{Key: ManualFailoverKey("p"), Revision: 9, Time: at, Op: events.OpPut, Value: EncodeManualFailover(req)})
	if fo, ok := in.(ManualFailoverObserved); err != nil || !ok || fo.Request != req || !fo.Time.Equal(at) || fo.Rev != 9 {
		t.Errorf("failover: %#v %v", in, err)
	}
	if in, err := InputOf("p", events.Entry{Key: ManualFailoverKey("p"), Revision: 10, Op: events.OpPut, Value: []byte{0xc1}}); in != nil || err == nil {
		t.Errorf("corrupt failover request: %#v %v", in, err)
	}
}

// Names spells what the writers write and parses it back; a subject of
// another pair (one whose name the first is a prefix of) or a deeper one
// is not this pair's.
func TestNamesRoundTrip(t *testing.T) {
	n := NamesOf("pg")
	for _, site := range []string{"site-a", "b"} {
		if got, ok := n.MemberSite(n.Member(site)); !ok || got != site || n.Member(site) != Subject("pg", site) {
			t.Errorf("member subject %q: site %q %v", n.Member(site), got, ok)
		}
		if n.Procedure(site) != procedure.Subject("pg."+site) {
			t.Errorf("procedure subject %q, procedure.Subject %q", n.Procedure(site), procedure.Subject("pg."+site))
		}
		if got, ok := n.ProcedureSite(n.Procedure(site)); !ok || got != site {
			t.Errorf("procedure subject %q: site %q %v", n.Procedure(site), got, ok)
		}
	}
	for _, s := range []string{"ev.failover.pg-main.site-a", "ev.failover.pg.site-a.x", "ev.failover.pg.", "ev.procedure.pg.site-a", "ev.host.pg.site-a"} {
		if site, ok := n.MemberSite(s); ok {
			t.Errorf("MemberSite(%q) = %q, want not this pair's member subject", s, site)
		}
	}
	if n.Members() != "ev.failover.pg.>" || n.Procedures() != "ev.procedure.pg.>" || n.Keys() != "pg.>" {
		t.Errorf("filters %q %q %q", n.Members(), n.Procedures(), n.Keys())
	}
	if n.Leader() != LeaderKey("pg") || n.Heartbeat("b") != HeartbeatKey("pg", "b") {
		t.Errorf("keys %q %q", n.Leader(), n.Heartbeat("b"))
	}
}
