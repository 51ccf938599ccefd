package runtime

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/vmihailenco/msgpack/v5"

	"understudy/actors/failover"
	"understudy/actors/procedure"
)

// trustedPair makes two node identities (node-a runs site-a, node-b runs
// site-b) for pair, with their seed files, and each node's ValueTrust.
func trustedPair(t testing.TB, pair string) (sec *SecuritySection, a, b *ValueTrust) {
	t.Helper()
	dir := t.TempDir()
	sec = &SecuritySection{Nodes: map[string]NodeIdentity{}}
	seeds := map[string]string{}
	for _, n := range []struct{ node, site string }{{"node-a", "site-a"}, {"node-b", "site-b"}} {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := kp.Seed()
		pub, _ := kp.PublicKey()
		path := filepath.Join(dir, n.node+".nkey")
		if err := os.WriteFile(path, seed, 0o600); err != nil {
			t.Fatal(err)
		}
		seeds[n.node] = path
		sec.Nodes[n.node] = NodeIdentity{NKey: pub, Pairs: []string{pair}, Sites: []string{n.site}}
	}
	var err error
	if a, err = NewValueTrust(sec, "node-a", seeds["node-a"]); err != nil {
		t.Fatal(err)
	}
	if b, err = NewValueTrust(sec, "node-b", seeds["node-b"]); err != nil {
		t.Fatal(err)
	}
	return sec, a, b
}

func TestValueTrustSignsAndVerifies(t *testing.T) {
	_, a, b := trustedPair(t, "p")
	l := failover.Leader{Site: "site-a", Term: 3, Beat: 7, Flush: 42}
	raw, err := a.Sign("pg", "site-a", l)
	if err != nil {
		t.Fatal(err)
	}
	got, err := failover.DecodeLeader(raw)
	if err != nil || got.By != "site-a" || len(got.Sig) == 0 || got.Term != 3 || got.Beat != 7 {
		t.Fatalf("signed value %+v %v", got, err)
	}
	// Every node verifies every node's values.
	for _, tr := range []*ValueTrust{a, b} {
		if err := tr.Verify("pg", raw, got); err != nil {
			t.Errorf("genuine value refused: %v", err)
		}
	}
	if _, err := a.Sign("pg", "site-b", l); err == nil || !strings.Contains(err.Error(), "does not run site site-b") {
		t.Errorf("node-a signed for site-b: %v", err)
	}
	bad := func(name string, raw []byte, want string) {
		t.Helper()
		l, err := failover.DecodeLeader(raw)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := b.Verify("pg", raw, l); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error with %q", name, err, want)
		}
	}
	bad("unsigned", failover.EncodeLeader(failover.Leader{Term: 3, Handoff: "site-b"}), "names no writer")
	bad("claimed", failover.EncodeLeader(failover.Leader{Term: 3, Handoff: "site-b", By: "site-a"}), "not signed")
	tampered := got
	tampered.Beat++
	bad("tampered", failover.EncodeLeader(tampered), "does not verify against the key of a node that runs site-a")
	// Signed by node-b, claiming node-a's site.
	stolen, _ := b.Sign("pg", "site-b", failover.Leader{Site: "site-a", Term: 3})
	sl, _ := failover.DecodeLeader(stolen)
	sl.By = "site-a"
	bad("signed by another node", failover.EncodeLeader(sl), "does not verify against the key of a node that runs site-a")
	bad("unknown site", failover.EncodeLeader(failover.Leader{Site: "site-c", Term: 1, By: "site-c", Sig: []byte{1}}), "no node of security.nodes runs")

	// A garbage value is Forged with a trust, and not without one.
	e := failover.LeaderEntry{Rev: 9, Corrupt: true}
	if err := a.Judge("pg", &e, []byte{0xc1}); err == nil || !e.Forged {
		t.Errorf("corrupt value not forged: %+v %v", e, err)
	}
	var none *ValueTrust
	e = failover.LeaderEntry{Rev: 9, Corrupt: true}
	if err := none.Judge("pg", &e, []byte{0xc1}); err != nil || e.Forged {
		t.Errorf("no trust, yet %+v %v", e, err)
	}
	if raw, err := none.Sign("pg", "site-a", l); err != nil || string(raw) != string(failover.EncodeLeader(l)) {
		t.Errorf("no trust signs: %v", err)
	}
	if tr, err := NewValueTrust(nil, "node-a", ""); tr != nil || err != nil {
		t.Errorf("no security section: %v %v", tr, err)
	}
}

// A value written by a later version, with a field this one does not
// know, verifies: the signature covers the bytes as written, less the
// signature.
func TestValueTrustVerifiesUnknownFields(t *testing.T) {
	_, a, b := trustedPair(t, "p")
	type future struct {
		Site string `msgpack:"s"`
		Term uint64 `msgpack:"t"`
		Beat uint64 `msgpack:"n"`
		By   string `msgpack:"by"`
		New  []int  `msgpack:"zz"`
		Sig  []byte `msgpack:"sg,omitempty"`
	}
	v := future{Site: "site-a", Term: 2, Beat: 1, By: "site-a", New: []int{1, 2, 3}}
	msg, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := a.kp.Sign(signedMessage(registerDomain, "pg", msg))
	if err != nil {
		t.Fatal(err)
	}
	v.Sig = sig
	raw, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	l, err := failover.DecodeLeader(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Verify("pg", raw, l); err != nil {
		t.Fatalf("a value with a field unknown here does not verify: %v", err)
	}
}

// A value signed for one pair's register does not verify in another's: a
// node that is a member of both cannot replay one into the other.
func TestValueTrustBindsThePair(t *testing.T) {
	_, a, b := trustedPair(t, "p")
	l := failover.Leader{Site: "site-a", Term: 4, Beat: 9}
	raw, err := a.Sign("pg", "site-a", l)
	if err != nil {
		t.Fatal(err)
	}
	got, err := failover.DecodeLeader(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Verify("pg", raw, got); err != nil {
		t.Fatalf("the value does not verify in its own pair: %v", err)
	}
	if err := b.Verify("other", raw, got); err == nil {
		t.Fatal("a value signed for pair pg verifies in pair other's register")
	}
}

// hostTrusted starts a Host running site's member of rules with trust, on
// a fresh connection to fn; stop stops it (a crash: no hand-over).
func hostTrusted(t *testing.T, fn *failoverNATS, rules failover.Rules, site string, trust *ValueTrust, tr *transitions) (stop func()) {
	t.Helper()
	nc, err := nats.Connect("nats://"+fn.addr, nats.Name("understudy-"+site), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	h, err := StartHost(context.Background(), js, fn.names.EventsStream, fn.names.FailoverBucket,
		[]MemberConfig{{Rules: rules, Site: site, Procedures: recordedProcedures()}},
		HostOptions{Drivers: procedure.Drivers{"exec": &stepRecorder{}}, Observe: tr.observe, Trust: trust})
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			h.Stop(context.Background())
			nc.Close()
		}
	}
	t.Cleanup(stop)
	return stop
}

// count counts the transitions of site with the event type since from.
func (tr *transitions) count(site, eventType string, from time.Time) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	n := 0
	for _, x := range tr.list {
		if x.Site == site && x.Event.EventType() == eventType && !x.At.Before(from) {
			n++
		}
	}
	return n
}

// The world findings of issue 15 on a real NATS, with signed register
// values: a forger (a client that may write the pair's keys, as every
// client may on this unsecured server) writes a forged hand-over while the
// primary serves (F1), beats of the dead primary (F2), and ready
// heartbeats claiming the dead primary's site under the replica's key and
// under a key of neither member (F3, F4). None has any effect.
func TestForgedValuesHaveNoEffect(t *testing.T) {
	t.Parallel()
	fn := startFailoverNATS(t)
	r := fastRules(t, "forged")
	_, trustA, trustB := trustedPair(t, r.Pair)
	tr := newTransitions()
	stopA := hostTrusted(t, fn, r, r.Primary, trustA, tr)
	hostTrusted(t, fn, r, r.Replica, trustB, tr)
	tr.waitFor(t, r.Primary, "failover.serving_started", 1, 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key := failover.LeaderKey(r.Pair)
	current := func() failover.Leader {
		t.Helper()
		e, err := fn.kv.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		l, err := failover.DecodeLeader(e.Value)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	put := func(k string, v []byte) {
		t.Helper()
		if _, err := fn.kv.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	for current().Site != r.Primary { // its first signed beat
		time.Sleep(10 * time.Millisecond)
	}

	// F1: leader = none naming the replica, unsigned, then signed with the
	// replica's own key (a peer's): no release of the holder.
	f1 := time.Now()
	term := current().Term
	put(key, failover.EncodeLeader(failover.Leader{Term: term, Handoff: r.Replica}))
	tr.waitFor(t, r.Replica, "failover.forged_value_ignored", 1, 2*time.Second)
	peer, err := trustB.Sign(r.Pair, r.Replica, failover.Leader{Term: term, Handoff: r.Replica})
	if err != nil {
		t.Fatal(err)
	}
	put(key, peer)
	tr.waitFor(t, r.Replica, "failover.forged_value_ignored", 2, 2*time.Second)
	time.Sleep(5 * r.HeartbeatTimeout)
	if n := tr.count(r.Replica, "failover.promoted", f1) + tr.count(r.Primary, "failover.leadership_lost", f1); n > 0 {
		t.Fatalf("a forged hand-over moved leadership (%d promotions or losses)", n)
	}
	if l := current(); l.Site != r.Primary || l.Term != term || l.By != r.Primary {
		t.Fatalf("the holder did not replace the forged value: the register holds %v by %q", l, l.By)
	}
	for _, site := range []string{r.Primary, r.Replica} {
		if n := tr.count(site, "failover.forged_value_ignored", f1); n != 2 {
			t.Errorf("%s recorded %d forged values, want the 2 written", site, n)
		}
	}

	// F2: the primary dies; the forger writes its beats every half
	// heartbeat. The replica takes over as it would without them.
	last := current()
	stopA()
	died := time.Now()
	forging, stopForging := context.WithCancel(ctx)
	forged := make(chan struct{})
	go func() {
		defer close(forged)
		for beat := last.Beat + 1; forging.Err() == nil; beat++ {
			_, _ = fn.kv.Put(ctx, key, failover.EncodeLeader(failover.Leader{Site: r.Primary, Term: last.Term, Beat: beat}))
			select {
			case <-forging.Done():
			case <-time.After(r.HeartbeatTimeout / 2):
			}
		}
	}()
	promoted := tr.waitFor(t, r.Replica, "failover.promoted", 1, r.FailoverTimeout+5*time.Second)
	took := promoted.At.Sub(died)
	t.Logf("the replica promoted %v after the primary's death, under forged beats", took)
	if bound := r.FailoverTimeout + 2*r.HeartbeatTimeout + raceSlack; took < r.FailoverTimeout-r.HeartbeatTimeout || took > bound {
		t.Errorf("promotion %v after the primary's death, want within failover_timeout (%v) + 2 heartbeat_timeout + slack = %v", took, r.FailoverTimeout, bound)
	}
	tr.waitFor(t, r.Replica, "failover.serving_started", 1, 2*time.Second)
	time.Sleep(5 * r.HeartbeatTimeout) // forged beats on top of the new holder's
	stopForging()
	<-forged
	if n := tr.count(r.Replica, "failover.leadership_lost", died); n > 0 {
		t.Fatalf("forged beats took the register from the new holder")
	}

	// F3, F4: ready heartbeats claiming the dead primary, under the
	// replica's key and under one of neither member: no failback.
	f3 := time.Now()
	for i := range 2 * r.FailoverTimeout / (r.HeartbeatTimeout / 2) {
		hb := failover.EncodeHeartbeat(failover.Heartbeat{Site: r.Primary, Beat: uint64(i + 1), Phase: failover.PhaseFollower, Ready: true})
		put(failover.HeartbeatKey(r.Pair, r.Replica), hb)
		put(failover.HeartbeatKey(r.Pair, "mallory"), hb)
		time.Sleep(r.HeartbeatTimeout / 2)
	}
	if n := tr.count(r.Replica, "failover.demotion_requested", f3); n > 0 {
		t.Fatalf("the replica failed back to a dead primary on forged heartbeats")
	}
	if l := current(); l.Site != r.Replica || l.By != r.Replica {
		t.Errorf("the register holds %v by %q, want the replica's", l, l.By)
	}

	// The primary returns: its own heartbeats, signed values, a real failback.
	hostTrusted(t, fn, r, r.Primary, trustA, tr)
	tr.waitFor(t, r.Replica, "failover.demotion_requested", 1, 10*time.Second)
	tr.waitFor(t, r.Primary, "failover.serving_started", 2, 5*time.Second)
	hist, err := fn.kv.History(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range hist {
		le, _ := failover.LeaderEntryOf(e, 0)
		if le.Value.By != "" && trustA.Verify(r.Pair, e.Value, le.Value) == nil && le.Value.Site != "" && le.Value.By != le.Value.Site {
			t.Errorf("revision %d: %v signed by %s", e.Revision, le.Value, le.Value.By)
		}
	}
}
