package simulations

import (
	"context"
	"errors"
	"testing"
	"time"

	"understudy/actors/failover"
	"understudy/events"
	"understudy/events/eventstest"
)

// The simulated JetStream server's stores pass the same conformance suite
// as the JetStream implementation; Advance moves its virtual clock.
func TestServerConformance(t *testing.T) {
	var cur *Server
	eventstest.Run(t, eventstest.Harness{
		NewLog: func(t *testing.T, codec *events.Registry) events.Log {
			cur = NewServer(ServerOptions{Codec: codec})
			return cur.Log()
		},
		NewKV: func(t *testing.T) events.KV {
			cur = NewServer(ServerOptions{})
			return cur.KV()
		},
		Advance: func(t *testing.T, d time.Duration) { cur.Advance(d) },
		Batches: true,
	})
}

func put(t *testing.T, s *Server, at time.Duration, key string, expect uint64) writeResult {
	t.Helper()
	w := failover.Write{Key: key, Value: []byte(key), ExpectRev: expect, Put: expect == 0}
	return s.write(at, &w)
}

// With fsync: interval a power cut loses what was acknowledged since the
// last sync, revisions and sequences included; with fsync: always, and
// after a mere crash, nothing is lost.
func TestPowerCutDurability(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fsync    FsyncMode
		power    bool
		wantRev  uint64
		wantLost int
	}{
		{"interval-power-cut", FsyncInterval, true, 2, 2},
		{"interval-crash", FsyncInterval, false, 4, 0},
		{"always-power-cut", FsyncAlways, true, 4, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewServer(ServerOptions{Fsync: tc.fsync, FsyncInterval: time.Minute})
			put(t, s, time.Second, "p.a", 0)
			put(t, s, 2*time.Second, "p.b", 0)
			s.appendEvent(3*time.Second, "ev.x", []byte("one"), 0, false, 0, "n1", "e1")
			// The sync at 1m keeps the above; what follows is acknowledged, not synced.
			put(t, s, time.Minute+time.Second, "p.a", 0)
			put(t, s, time.Minute+2*time.Second, "p.c", 0)
			s.appendEvent(time.Minute+3*time.Second, "ev.x", []byte("two"), 1, true, 0, msgID("ev.x", 1, "n1", "e2"), "")
			lostKV, lostEv := s.stop(time.Minute+4*time.Second, tc.power)
			if lostKV != tc.wantLost {
				t.Fatalf("lost %d KV writes, want %d", lostKV, tc.wantLost)
			}
			s.start(time.Minute + 10*time.Second)
			if got := s.kv.Revision(); got != tc.wantRev {
				t.Fatalf("revision after restart %d, want %d", got, tc.wantRev)
			}
			if _, err := s.kv.Get(context.Background(), "p.c"); (err == nil) != (tc.wantLost == 0) {
				t.Errorf("p.c after restart: err %v, lost %d", err, tc.wantLost)
			}
			recs := s.records("ev.x")
			if want := 2 - lostEv; len(recs) != want {
				t.Fatalf("%d events after restart, want %d", len(recs), want)
			}
			if len(recs) > 0 && !recs[0].Time.Equal(Epoch.Add(3*time.Second)) {
				t.Errorf("rebuilt record time %v: the server timestamp must survive", recs[0].Time)
			}
			// The store goes on: the next write takes the next revision.
			r := put(t, s, time.Minute+11*time.Second, "p.d", 0)
			if !r.ok || r.rev != tc.wantRev+1 {
				t.Errorf("write after restart: %+v, want revision %d", r, tc.wantRev+1)
			}
		})
	}
}

// CAS on the revision, as the leadership register needs: a stale
// expectation conflicts and reports the current entry.
func TestServerCompareAndSet(t *testing.T) {
	s := NewServer(ServerOptions{})
	w := failover.Write{Key: "p.leader", Value: []byte("a")}
	first := s.write(time.Second, &w)
	if !first.ok || first.rev != 1 || !first.ts.Equal(Epoch.Add(time.Second)) {
		t.Fatalf("create: %+v", first)
	}
	again := s.write(2*time.Second, &w) // create again: conflict
	if !again.conflict || again.current.Revision != 1 {
		t.Fatalf("second create: %+v", again)
	}
	w.ExpectRev, w.Value = 1, []byte("b")
	if r := s.write(3*time.Second, &w); !r.ok || r.rev != 2 {
		t.Fatalf("update on 1: %+v", r)
	}
	if r := s.write(4*time.Second, &w); !r.conflict || r.current.Revision != 2 {
		t.Fatalf("stale update on 1: %+v", r)
	}
	s.offset = -time.Hour // a clock bump: timestamps follow the server's clock
	w.ExpectRev = 2
	if r := s.write(5*time.Second, &w); !r.ok || !r.ts.Equal(Epoch.Add(5*time.Second-time.Hour)) {
		t.Fatalf("write after bump: %+v", r)
	}
	if _, err := s.kv.Get(context.Background(), "missing"); !errors.Is(err, events.ErrNotFound) {
		t.Fatalf("get missing: %v", err)
	}
}
