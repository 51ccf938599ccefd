package simulations

import (
	"testing"
	"time"

	"understudy/actors/failover"
)

// Each scenario exercises what it claims: its required "sometimes"
// counters are non-zero in every one of a few seeds, with the default
// rules and with failback: manual (where failback is not required).
func TestScenariosExerciseWhatTheyClaim(t *testing.T) {
	manual := DefaultPair()
	manual.Failback = failover.FailbackManual
	for _, sc := range Scenarios() {
		t.Run(sc.Name, func(t *testing.T) {
			t.Parallel()
			for _, rules := range []failover.Rules{{}, manual} {
				for seed := uint64(1); seed <= 3; seed++ {
					cfg := Config{Scenario: sc.Name, Seed: seed, Rules: rules}
					if sc.Name == "random" {
						cfg.Duration = 20 * time.Minute
					}
					r, err := Run(cfg)
					if err != nil {
						t.Fatal(err)
					}
					if len(r.Unexercised) > 0 {
						t.Errorf("%s: %v stayed 0 (counters: %v)", Command(cfg, ""), r.Unexercised, r.Sometimes)
					}
				}
			}
		})
	}
}

// A run reports every required counter, even at 0, and only those are
// marked required.
func TestUnexercisedIsReported(t *testing.T) {
	// power-cut's fault removed: nothing fails over.
	r, err := Run(Config{Scenario: "power-cut", Seed: 1, Faults: nil, FaultsSet: true})
	if err != nil {
		t.Fatal(err)
	}
	want := ScenarioByName("power-cut").RequiredCounters(DefaultPair())
	if len(r.Unexercised) != len(want) {
		t.Fatalf("unexercised %v, want all of %v", r.Unexercised, want)
	}
	for _, c := range r.Sometimes {
		if c.Required && c.Count != 0 {
			t.Errorf("counter %s counted %d without a fault", c.Name, c.Count)
		}
	}
}
