package simulations

import (
	"bytes"
	"runtime"
	"sync"
	"testing"
	"time"
)

func digestOf(t *testing.T, cfg Config) string {
	t.Helper()
	r, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r.Digest
}

// Same seed, same bytes: the digest of a run does not depend on
// GOMAXPROCS, on other simulations running at the same time, or on the
// run before it; another seed gives another trace.
func TestSameSeedSameDigest(t *testing.T) {
	cfgs := []Config{
		{Scenario: "random", Seed: 42, Duration: 20 * time.Minute},
		{Scenario: "failed-fence", Seed: 7},
		{Scenario: "nats-outage", Seed: 3, Fsync: FsyncInterval},
		{Scenario: "db-synchronous", Seed: 2},
	}
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	var single []string
	for _, cfg := range cfgs {
		single = append(single, digestOf(t, cfg))
	}
	runtime.GOMAXPROCS(2)
	for round := 0; round < 2; round++ {
		var wg sync.WaitGroup
		got := make([]string, len(cfgs))
		for i, cfg := range cfgs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := Run(cfg)
				if err != nil {
					t.Error(err)
					return
				}
				got[i] = r.Digest
			}()
		}
		wg.Wait()
		for i := range cfgs {
			if got[i] != single[i] {
				t.Errorf("%s seed %d: digest %s with GOMAXPROCS=2 and concurrent runs, %s with GOMAXPROCS=1", cfgs[i].Scenario, cfgs[i].Seed, got[i], single[i])
			}
		}
	}
	other := cfgs[0]
	other.Seed++
	if d := digestOf(t, other); d == single[0] {
		t.Errorf("seeds %d and %d gave the same digest %s", cfgs[0].Seed, other.Seed, d)
	}
	moved := cfgs[1]
	s, err := newSim(moved)
	if err != nil {
		t.Fatal(err)
	}
	moved.Faults, moved.FaultsSet = append([]Fault(nil), s.faults...), true
	if d := digestOf(t, moved); d != single[1] {
		t.Errorf("the scenario's schedule passed as --faults gave digest %s, want %s", d, single[1])
	}
	moved.Faults[0].At += time.Millisecond
	if d := digestOf(t, moved); d == single[1] {
		t.Errorf("moving a fault by 1ms left the digest unchanged")
	}
}

// The export of a run is as deterministic as its digest.
func TestExportIsDeterministic(t *testing.T) {
	var a, b bytes.Buffer
	for _, buf := range []*bytes.Buffer{&a, &b} {
		if _, err := Run(Config{Scenario: "return-to-normal", Seed: 5, Export: buf}); err != nil {
			t.Fatal(err)
		}
	}
	if a.Len() == 0 || !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatalf("two exports of one run differ (%d and %d bytes)", a.Len(), b.Len())
	}
}
