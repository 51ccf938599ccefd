package simulations

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"
)

// One pair, default rules, the random scenario, one simulated hour per
// op. The goal is ≥ 50,000× real time: an hour in ≤ 72ms.
//
//	go test -run '^$' -bench 'BenchmarkSimulateHour' -benchmem ./simulations/
func BenchmarkSimulateHour(b *testing.B) {
	sim, wall := runSeeds(b, Config{Scenario: "random", Duration: time.Hour})
	b.ReportMetric(sim/wall, "x-realtime")
}

// runSeeds runs cfg with seeds 1, 2, … one per op, reports the steps per
// op and returns the simulated and wall seconds of all the runs.
func runSeeds(b *testing.B, cfg Config) (sim, wall float64) {
	var steps uint64
	for b.Loop() {
		cfg.Seed++
		start := time.Now()
		r, err := Run(cfg)
		if err != nil {
			b.Fatal(err)
		}
		wall += time.Since(start).Seconds()
		sim += r.SimulatedSeconds
		steps += r.Steps
	}
	b.ReportMetric(float64(steps)/float64(b.N), "steps/op")
	return sim, wall
}

// Swarm throughput on every core: seeds of 10 simulated minutes per wall
// minute (shrinking off: it only runs for failing seeds).
//
//	go test -run '^$' -bench 'BenchmarkSwarm' -benchtime 3x ./simulations/
func BenchmarkSwarm(b *testing.B) {
	const seeds = 400
	var wall float64
	first := uint64(1)
	for b.Loop() {
		r := Swarm(context.Background(), SwarmConfig{Seeds: seeds, FirstSeed: first, Duration: 10 * time.Minute})
		wall += r.WallSeconds
		first += seeds
	}
	b.ReportMetric(float64(seeds*b.N)/(wall/60), "seeds10m/wall-min")
	b.ReportMetric(float64(runtime.GOMAXPROCS(0)), "workers")
}

// Planted bugs: the median number of seeds (of 10 simulated minutes) until
// the first violation, over 21 independent seed ranges, for rules that
// break the safety inequality (failover_timeout 2s instead of 5s), —
// built with -tags understudy_mutation_skipfence — for a primary that never
// fences itself, and — built with -tags understudy_mutation_staleepoch — for
// a lease honoured after its node's epoch was raised (db-random in node
// mode, 5 pairs per node).
//
//	go test -run '^$' -bench 'BenchmarkPlantedBugs' -benchtime 1x ./simulations/
//	go test -tags understudy_mutation_skipfence -run '^$' -bench 'BenchmarkPlantedBugs' -benchtime 1x ./simulations/
//	go test -tags understudy_mutation_staleepoch -run '^$' -bench 'BenchmarkPlantedBugs' -benchtime 1x ./simulations/
func BenchmarkPlantedBugs(b *testing.B) {
	unsafe := DefaultPair()
	unsafe.FailoverTimeout = 2 * time.Second
	variants := []struct {
		name   string
		cfg    SwarmConfig
		active bool
	}{
		{"unsafe-config", SwarmConfig{Rules: unsafe, AllowUnsafe: true}, true},
		{"skipfence", SwarmConfig{}, plantedSkipFence},
		{"staleepoch", SwarmConfig{Scenario: "db-random", Leadership: LeadershipNode, Pairs: 5}, plantedStaleEpoch},
	}
	for _, v := range variants {
		if !v.active {
			continue
		}
		b.Run(v.name, func(b *testing.B) {
			for b.Loop() {
				var counts []int
				for r := uint64(0); r < 21; r++ {
					n := 0
					for ; n < 1000; n++ {
						c := v.cfg.SeedConfig(1_000_000*(r+1) + uint64(n))
						c.StopAtFirstViolation = true
						res, err := Run(c)
						if err != nil {
							b.Fatal(err)
						}
						if res.Failed() {
							break
						}
					}
					counts = append(counts, n+1)
				}
				slices.Sort(counts)
				b.ReportMetric(float64(counts[len(counts)/2]), "median-seeds-to-violation")
				b.ReportMetric(float64(counts[len(counts)-1]), "max-seeds-to-violation")
			}
		})
	}
}

// Node leadership: simulated seconds per wall second with 1 and with 1,000
// pairs per node (random schedule, 10 simulated minutes per op), and the
// pairs' simulated seconds per wall second (pair-s: simulated time × pairs).
//
//	go test -run '^$' -bench 'BenchmarkNodeMode' -benchtime 1x ./simulations/
func BenchmarkNodeMode(b *testing.B) {
	for _, pairs := range []int{1, 1000} {
		b.Run(fmt.Sprintf("pairs=%d", pairs), func(b *testing.B) {
			sim, wall := runSeeds(b, Config{Scenario: "random", Duration: 10 * time.Minute, Leadership: LeadershipNode, Pairs: pairs})
			b.ReportMetric(sim/wall, "sim-s/wall-s")
			b.ReportMetric(sim*float64(pairs)/wall, "pair-s/wall-s")
		})
	}
}
