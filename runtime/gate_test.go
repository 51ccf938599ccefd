package runtime

import (
	"context"
	"sync"
	"testing"
	"time"
)

// While a register or liveness write waits or flies, appends get only
// appendsBesideWrites turns; once none does, they get maxAppends again.
func TestStoreGateAppendsMakeWayForWrites(t *testing.T) {
	g := newStoreGate()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := g.priority() // the node's liveness write flies

	var mu sync.Mutex
	var releases []func()
	var wg sync.WaitGroup
	for range maxAppends {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rel, err := g.appendTurn(ctx)
			if err != nil {
				return
			}
			mu.Lock()
			releases = append(releases, rel)
			mu.Unlock()
		}()
	}
	in := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(releases)
	}
	time.Sleep(100 * time.Millisecond)
	if n := in(); n != appendsBesideWrites {
		t.Fatalf("%d appends in flight beside a liveness write, want %d", n, appendsBesideWrites)
	}
	// A member write still gets its turn at once.
	wctx, wcancel := context.WithTimeout(ctx, 50*time.Millisecond)
	rel, err := g.write(wctx)
	wcancel()
	if err != nil {
		t.Fatalf("a member write waited behind appends: %v", err)
	}
	rel()
	done()
	deadline := time.Now().Add(5 * time.Second)
	for in() < maxAppends && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := in(); n != maxAppends {
		t.Fatalf("%d appends in flight once no write waits, want %d", n, maxAppends)
	}
	mu.Lock()
	for _, r := range releases {
		r()
	}
	mu.Unlock()
	wg.Wait()
	if !g.settled() || g.pending.Load() != 0 || g.kv.Load() != 0 {
		t.Errorf("after every turn ended: pending %d, kv %d", g.pending.Load(), g.kv.Load())
	}
	// A turn given up (its context ends) leaves nothing taken.
	g.priority()
	for range appendsBesideWrites {
		if _, err := g.appendTurn(ctx); err != nil {
			t.Fatal(err)
		}
	}
	short, scancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer scancel()
	if _, err := g.appendTurn(short); err == nil {
		t.Fatal("an append beyond the narrow bound got a turn")
	}
	if n := len(g.appends); n != appendsBesideWrites {
		t.Errorf("%d append turns held after one was given up, want %d", n, appendsBesideWrites)
	}
}
