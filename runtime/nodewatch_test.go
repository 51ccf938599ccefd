package runtime

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"understudy/actors/failover"
	"understudy/events"
)

// A wake of the node's members runs without the watch's lock: the store
// gate's check of the cache (storeGate.stale, before every member write)
// and the liveness writer's results do not wait for it. In a 10,000-pair
// takeover three wakes of every member held both for half a second, and
// the survivor sent no register in that time.
func TestWakeOfMembersDoesNotHoldTheWatch(t *testing.T) {
	w := newNodeWatch(nil, nil, "site-b", time.Second, slog.New(slog.DiscardHandler))
	entered, release := make(chan struct{}), make(chan struct{})
	var woken atomic.Int64
	w.wake = func(*memberActor) {
		if woken.Add(1) == 1 {
			close(entered)
			<-release
		}
	}
	const members = 3
	for i := range members {
		a := &memberActor{}
		a.prompt.Store(true)
		w.mu.Lock()
		w.members[fmt.Sprint("member-", i)] = a
		w.rosterStale = true
		w.mu.Unlock()
	}
	w.route(events.Entry{Key: "pg-1.leader", Revision: 5, Op: events.OpPut}, 1)

	rec := events.Entry{Key: failover.LivenessKey("site-b"), Revision: 6, Op: events.OpPut,
		Value: failover.EncodeLiveness(failover.Liveness{Node: "site-b", Epoch: 1, Beat: 1, By: "site-b"})}
	routed := make(chan struct{})
	go func() { w.route(rec, 1); close(routed) }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the node's own liveness record woke no member")
	}

	got := make(chan bool, 1)
	go func() { _, ok := w.cached("pg-1.leader"); got <- ok }()
	select {
	case ok := <-got:
		if !ok {
			t.Fatal("cached: the register's entry the watch delivered is not there")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch's cache (read before every member write) waited for a wake of the members")
	}
	done := make(chan struct{})
	go func() {
		w.broadcast(failover.LivenessResult{Err: failover.WriteOK, Epoch: 1, Revision: 6})
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a result of the node's liveness writer waited for a wake of the members")
	}
	close(release)
	<-routed
	if n := woken.Load(); n < members {
		t.Fatalf("%d wakes, want at least one per member (%d)", n, members)
	}
	if got := w.lives.latest.Load(); got != 2 {
		t.Fatalf("the log holds %d items, want 2 (the record and the result)", got)
	}
}

// A member woken again before it has stepped is not sent a second wake:
// its next step reads all the log gained. A step lets the next wake
// through.
func TestAMemberIsWokenOnceUntilItSteps(t *testing.T) {
	a := &memberActor{}
	a.ctx = context.Background()
	a.inbox.busy = true // deliveries queue, as behind a pair key's hand-over
	for range 3 {
		a.wakeLive()
	}
	if n := len(a.inbox.queue); n != 1 {
		t.Fatalf("three wakes before a step queued %d deliveries, want 1", n)
	}
	a.step(nil) // no machine yet: it only takes the wake in
	a.wakeLive()
	if n := len(a.inbox.queue); n != 2 {
		t.Fatalf("a wake after the step queued %d deliveries in all, want 2", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	a.ctx = ctx
	a.step(nil)
	a.wakeLive()
	if n := len(a.inbox.queue); n != 2 {
		t.Fatalf("a stopped member was woken: %d deliveries, want 2", n)
	}
}
