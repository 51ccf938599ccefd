package failover

import (
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestNeverServesAfterLostCAS drives a member with random inputs and checks
// that once it has seen its register taken by another writer in term T, it
// serves again only after winning the register anew (a term above T).
func TestNeverServesAfterLostCAS(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rules := DefaultRules("pg", "a", "b")
		site := rapid.SampledFrom([]string{"a", "b"}).Draw(t, "site")
		m, err := NewMember(site, rules, Options{})
		if err != nil {
			t.Fatal(err)
		}
		var now time.Duration
		var writes []Write
		var procs []Procedure
		var rev uint64 = 1
		lostAt := uint64(0) // highest term in which a loss was observed
		wonAfterLoss := false
		check := func(r Ready) {
			writes = append(writes, r.Writes...)
			procs = append(procs, r.Procedures...)
			for _, ev := range r.Events {
				switch e := ev.(type) {
				case *LeadershipLost:
					if e.Term > lostAt || lostAt == 0 {
						lostAt = e.Term
					}
					wonAfterLoss = false
				case *Promoted:
					if e.Term > lostAt {
						wonAfterLoss = true
					}
				case *Resumed:
					if e.Term > lostAt {
						wonAfterLoss = true
					}
				}
			}
			if m.Serving() && lostAt != 0 && !wonAfterLoss {
				t.Fatalf("member %s serves in term %d after losing the register in term %d without winning it again", site, m.Term(), lostAt)
			}
			if m.Serving() && m.Term() <= m.LostTerm() {
				t.Fatalf("member serves in term %d <= lost term %d", m.Term(), m.LostTerm())
			}
		}
		check(m.Start(now))
		leader := func(t *rapid.T) Leader {
			return Leader{
				Site:   rapid.SampledFrom([]string{"a", "b", ""}).Draw(t, "lsite"),
				Term:   m.Term() + rapid.Uint64Range(0, 2).Draw(t, "lterm"),
				Beat:   rapid.Uint64Range(0, 9).Draw(t, "lbeat"),
				Fenced: rapid.Bool().Draw(t, "lfenced"),
			}
		}
		steps := rapid.IntRange(1, 200).Draw(t, "steps")
		for i := 0; i < steps; i++ {
			now += rapid.SampledFrom([]time.Duration{0, 10 * time.Millisecond, 300 * time.Millisecond, time.Second, 3 * time.Second}).Draw(t, "dt")
			var in Input
			switch rapid.SampledFrom([]int{0, 1, 2, 2, 2, 2, 3, 3, 4, 5, 5, 6, 7}).Draw(t, "kind") {
			case 0:
				in = Tick{}
			case 1:
				in = Synced{}
			case 2:
				if len(writes) == 0 {
					continue
				}
				// Mostly answer the latest write, mostly with success, so
				// runs reach the deep states (resume, unfence, serve).
				w := writes[len(writes)-1]
				if rapid.IntRange(0, 4).Draw(t, "older") == 0 {
					w = writes[rapid.IntRange(0, len(writes)-1).Draw(t, "write")]
				}
				res := WriteResult{Op: w.Op, Err: WriteErr(rapid.SampledFrom([]int{1, 1, 1, 2, 3}).Draw(t, "err"))}
				if res.Err == WriteOK {
					rev++
					res.Revision = rev
				}
				if res.Err == WriteConflict && rapid.Bool().Draw(t, "hasCurrent") {
					rev++
					res.Current = &LeaderEntry{Rev: rev, Time: epoch.Add(now), Value: leader(t)}
				}
				in = res
			case 3:
				rev++
				in = LeaderObserved{Entry: LeaderEntry{Rev: rev, Time: epoch.Add(now), Value: leader(t)}}
			case 4:
				rev++
				// The key's site counts, whatever the value claims.
				in = HeartbeatObserved{Rev: rev, Time: epoch.Add(now), Site: rapid.SampledFrom([]string{"a", "b", "c"}).Draw(t, "hkey"), Value: Heartbeat{
					Site: rapid.SampledFrom([]string{"a", "b"}).Draw(t, "hsite"), Ready: rapid.Bool().Draw(t, "hready")}}
			case 5:
				if len(procs) == 0 {
					continue
				}
				p := procs[len(procs)-1]
				if rapid.IntRange(0, 4).Draw(t, "olderProc") == 0 {
					p = procs[rapid.IntRange(0, len(procs)-1).Draw(t, "proc")]
				}
				in = ProcedureResult{Kind: p.Kind, Seq: p.Seq, OK: rapid.IntRange(0, 3).Draw(t, "procFail") != 0}
			case 6:
				in = SwitchoverObserved{Rev: rev, Request: Switchover{
					ID: rapid.SampledFrom([]string{"x", "y"}).Draw(t, "swid"), To: rapid.SampledFrom([]string{"a", "b"}).Draw(t, "swto")}}
			case 7:
				rev++
				r := rules
				r.FailoverTimeout = rapid.SampledFrom([]time.Duration{3 * time.Second, 5 * time.Second, 9 * time.Second}).Draw(t, "fo")
				in = ConfigObserved{Rev: rev, Rules: r}
			}
			check(m.Step(now, in))
			if err := checkRules(m.Rules(), Options{}); err != nil {
				t.Fatalf("rules in force break the inequality: %v", err)
			}
		}
	})
}

// TestForgedValuesChangeNothing drives a member with random inputs, among
// them register values no member wrote (Forged, or signed by a site other
// than the holder they name) at fresh revisions, and checks that such a
// value, arriving at the moment of the previous input, makes the member
// record it and do nothing else: no promotion, no loss of the register, no
// demotion, no fence, no procedure; at most a write that replaces it.
func TestForgedValuesChangeNothing(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rules := DefaultRules("pg", "a", "b")
		site := rapid.SampledFrom([]string{"a", "b"}).Draw(t, "site")
		m, err := NewMember(site, rules, Options{})
		if err != nil {
			t.Fatal(err)
		}
		var now time.Duration
		var writes []Write
		var rev uint64 = 1
		keep := func(r Ready) { writes = append(writes, r.Writes...) }
		keep(m.Start(now))
		value := func(t *rapid.T) Leader {
			l := Leader{
				Site: rapid.SampledFrom([]string{"a", "b", ""}).Draw(t, "lsite"),
				Term: m.Term() + rapid.Uint64Range(0, 2).Draw(t, "lterm"),
				Beat: rapid.Uint64Range(0, 9).Draw(t, "lbeat"),
			}
			if l.Site == "" {
				l.Handoff = rapid.SampledFrom([]string{"a", "b", ""}).Draw(t, "lhandoff")
			}
			l.By = rapid.SampledFrom([]string{l.Site, "a", "b", ""}).Draw(t, "lby")
			return l
		}
		steps := rapid.IntRange(1, 200).Draw(t, "steps")
		for i := 0; i < steps; i++ {
			kind := rapid.SampledFrom([]int{0, 1, 2, 2, 2, 3, 3, 4, 4}).Draw(t, "kind")
			if kind != 4 {
				now += rapid.SampledFrom([]time.Duration{0, 10 * time.Millisecond, 300 * time.Millisecond, time.Second, 3 * time.Second}).Draw(t, "dt")
			}
			var in Input
			switch kind {
			case 0:
				in = Tick{}
			case 1:
				in = Synced{}
			case 2:
				if len(writes) == 0 {
					continue
				}
				w := writes[len(writes)-1]
				res := WriteResult{Op: w.Op, Err: WriteErr(rapid.SampledFrom([]int{1, 1, 1, 2, 3}).Draw(t, "err"))}
				if res.Err == WriteOK {
					rev++
					res.Revision = rev
				}
				in = res
			case 3:
				// A member's write: by the site it names (a release by whoever).
				rev++
				l := value(t)
				l.By = l.Site
				if l.Site == "" {
					l.By = rapid.SampledFrom([]string{"a", "b"}).Draw(t, "relby")
				}
				in = LeaderObserved{Entry: LeaderEntry{Rev: rev, Time: epoch.Add(now), Value: l}}
			case 4:
				rev++
				l := value(t)
				forged := rapid.Bool().Draw(t, "forged")
				if !forged && (l.Site == "" || l.By == l.Site || l.By == "") {
					l.Site, l.By = "a", "b" // signed, but not by the holder it names
				}
				r := m.Step(now, LeaderObserved{Entry: LeaderEntry{Rev: rev, Time: epoch.Add(now), Value: l, Forged: forged}})
				keep(r)
				ignored := 0
				for _, ev := range r.Events {
					if _, ok := ev.(*ForgedValueIgnored); !ok {
						t.Fatalf("forged %v (forged=%v) at rev %d made member %s record %s %+v", l, forged, rev, site, ev.EventType(), ev)
					}
					ignored++
				}
				if ignored != 1 {
					t.Fatalf("forged %v at rev %d recorded %d times", l, rev, ignored)
				}
				if len(r.Procedures) > 0 {
					t.Fatalf("forged %v made member %s run %+v", l, site, r.Procedures)
				}
				for _, w := range r.Writes {
					if w.Kind != WriteBeat && w.Kind != WriteMemberBeat {
						t.Fatalf("forged %v made member %s write %v", l, site, w.Kind)
					}
				}
				continue
			}
			keep(m.Step(now, in))
		}
	})
}

// TestRulesRefusedAtLoad covers the bad-input contract of the pair rules.
func TestRulesRefusedAtLoad(t *testing.T) {
	base := DefaultRules("pg-main", "site-a", "site-b")
	cases := []struct {
		name  string
		edit  func(*Rules)
		field string
	}{
		{"inequality", func(r *Rules) { r.FailoverTimeout = 4 * time.Second }, "failover_timeout"},
		{"negative grace", func(r *Rules) { r.FenceGrace = -time.Second }, "fence_grace"},
		{"zero heartbeat", func(r *Rules) { r.HeartbeatTimeout = 0 }, "heartbeat_timeout"},
		{"same sites", func(r *Rules) { r.Replica = "site-a" }, "replica"},
		{"dotted pair", func(r *Rules) { r.Pair = "pg.main" }, "pair"},
		{"threshold", func(r *Rules) { r.FailureThreshold = 0 }, "failure_threshold"},
		{"failback", func(r *Rules) { r.Failback = 0 }, "failback"},
	}
	for _, c := range cases {
		r := base
		c.edit(&r)
		err := r.Validate()
		if err == nil {
			t.Fatalf("%s: accepted %+v", c.name, r)
		}
		if got := err.Error(); !containsAll(got, c.field) {
			t.Errorf("%s: error %q does not name %s", c.name, got, c.field)
		}
	}
	if err := base.Validate(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	if _, err := NewMember("site-c", base, Options{}); err == nil {
		t.Fatal("a member of an unknown site was accepted")
	}
	unsafe := base
	unsafe.FailoverTimeout = time.Second
	if _, err := NewMember("site-a", unsafe, Options{AllowUnsafe: true}); err != nil {
		t.Fatalf("AllowUnsafe refused an unsafe but well-formed config: %v", err)
	}
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		found := false
		for i := 0; i+len(p) <= len(s); i++ {
			if s[i:i+len(p)] == p {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
