package projections

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"understudy/actors/failover"
)

// The config_changes read model: each write of <pair>.config by revision,
// with the rules it holds, and which members applied or refused it (and
// why) — from the events the real member emits for them.
func TestConfigChanges(t *testing.T) {
	h := newHistory(t, "pg-main")
	h.bootstrap(20*time.Second, 20*time.Second)

	faster := h.rules
	faster.HeartbeatTimeout, faster.FailoverTimeout, faster.FenceGrace = 500*time.Millisecond, 3*time.Second, time.Second
	unsafe := faster
	unsafe.FailoverTimeout = time.Second // below (2+1) × 500ms + 1s
	if faster.Validate() != nil || unsafe.Validate() == nil {
		t.Fatalf("fixture: %v / %v", faster.Validate(), unsafe.Validate())
	}
	members := map[string]*failover.Member{}
	for _, site := range []string{"site-a", "site-b"} {
		m, err := failover.NewMember(site, h.rules, failover.Options{})
		if err != nil {
			t.Fatal(err)
		}
		m.Start(0)
		members[site] = m
	}
	// observe feeds a config write to both members and records what they
	// make of it, site-a 10ms after the write, site-b 20ms.
	observe := func(rev uint64, write time.Duration, rules failover.Rules) {
		for i, site := range []string{"site-a", "site-b"} {
			rd := members[site].Step(time.Second, failover.ConfigObserved{Rev: rev, Rules: rules})
			h.at(write + time.Duration(i+1)*10*time.Millisecond)
			n := 0
			for _, ev := range rd.Events {
				switch ev.(type) {
				case *failover.ConfigApplied, *failover.ConfigRejected:
					h.event(site, ev)
					n++
				}
			}
			if n != 1 {
				t.Fatalf("%s made %d config events of rev %d: %+v", site, n, rev, rd.Events)
			}
		}
	}
	h.at(12 * time.Second)
	rev1 := h.kv(failover.ConfigKey(h.pair), failover.EncodeRules(faster), false).Sequence
	observe(rev1, 12*time.Second, faster)
	h.at(14 * time.Second)
	rev2 := h.kv(failover.ConfigKey(h.pair), failover.EncodeRules(unsafe), false).Sequence
	observe(rev2, 14*time.Second, unsafe)

	r := foldAll(t, "pg-main", h.recs)
	if len(r.ConfigChanges) != 3 {
		t.Fatalf("config changes %+v, want the bootstrap's and two more", r.ConfigChanges)
	}
	boot, applied, refused := r.ConfigChanges[0], r.ConfigChanges[1], r.ConfigChanges[2]
	if boot.Rev != 1 || len(boot.Applied) != 0 || len(boot.Rejected) != 0 || !strings.Contains(boot.Rules, "heartbeat_timeout=1s ") {
		t.Errorf("the first config write: %+v", boot)
	}

	if applied.Rev != rev1 || applied.WrittenAt == nil || !applied.WrittenAt.Equal(at(12*time.Second)) {
		t.Errorf("applied change: rev %d written %v, want rev %d at 12s", applied.Rev, applied.WrittenAt, rev1)
	}
	if want := "heartbeat_timeout=500ms failure_threshold=2 success_threshold=2 failover_timeout=3s fence_grace=1s failback=auto"; applied.Rules != want {
		t.Errorf("applied rules %q, want %q", applied.Rules, want)
	}
	if len(applied.Rejected) != 0 || len(applied.Applied) != 2 ||
		applied.Applied[0] != (SiteAt{Site: "site-a", At: at(12010 * time.Millisecond)}) ||
		applied.Applied[1] != (SiteAt{Site: "site-b", At: at(12020 * time.Millisecond)}) {
		t.Errorf("applied by %+v, rejected by %+v; want site-a at 12.010s and site-b at 12.020s", applied.Applied, applied.Rejected)
	}

	if refused.Rev != rev2 || refused.WrittenAt == nil || !refused.WrittenAt.Equal(at(14*time.Second)) || !strings.Contains(refused.Rules, "failover_timeout=1s") {
		t.Errorf("refused change: %+v", refused)
	}
	if len(refused.Applied) != 0 || len(refused.Rejected) != 2 {
		t.Fatalf("refused change applied by %+v, rejected by %+v", refused.Applied, refused.Rejected)
	}
	for i, x := range refused.Rejected {
		site := []string{"site-a", "site-b"}[i]
		if x.Site != site || !x.At.Equal(at(14*time.Second+time.Duration(i+1)*10*time.Millisecond)) ||
			x.Field != "failover_timeout" || x.Value != "1s" || !strings.Contains(x.Rule, ">=") {
			t.Errorf("rejection %d: %+v, want %s refusing failover_timeout=1s by the safety inequality", i, x, site)
		}
	}

	// The applied rules are the ones in force after it; the refused ones
	// never are.
	if r.Rules == nil || r.Rules.HeartbeatTimeoutMS != 500 || r.Rules.FailoverTimeoutMS != 3000 {
		t.Errorf("rules in force %+v, want the applied change's", r.Rules)
	}
	var marks int
	for _, te := range r.Timeline {
		if te.Mark == "config" {
			marks++
		}
	}
	if marks != 3+4 { // three writes, four member events
		t.Errorf("%d timeline entries marked config, want 7", marks)
	}
	var text bytes.Buffer
	if err := WriteText(&text, r); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"CONFIG CHANGES (3)",
		"applied by site-a at 10:00:12.010",
		"REJECTED by site-b at 10:00:14.020: failover_timeout",
	} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
}
