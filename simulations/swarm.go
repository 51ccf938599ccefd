package simulations

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"understudy/actors/failover"
)

// SwarmConfig runs many seeds of the random scenario.
type SwarmConfig struct {
	// Scenario is the scenario each seed runs: "" for random; db-random
	// and db-random-sync swarm the database mode.
	Scenario  string
	Seeds     int
	FirstSeed uint64
	Duration  time.Duration // per seed; default 10 minutes
	Rules     failover.Rules
	// AllowUnsafe accepts rules that break the safety inequality.
	AllowUnsafe bool
	Fsync       FsyncMode
	// Leadership and Pairs: how each seed keeps leadership, and how many
	// pairs each node hosts (see Config).
	Leadership Leadership
	Pairs      int
	// StoreWriteTime, StoreBatchWritePart and HostWriteBound: the store's
	// throughput and the nodes' bound on writes in flight (see Config).
	StoreWriteTime      time.Duration
	StoreBatchWritePart time.Duration
	HostWriteBound      int
	// HostBatch, HostBatchNoAppends and HostRaiseOnce: the nodes' batches
	// of waiting member KV writes and appends, and their raises made once
	// (see Config).
	HostBatch          int
	HostBatchNoAppends bool
	HostRaiseOnce      bool
	// CPU: the nodes' CPU (see Config).
	CPU CPUModel
	// Workers is how many simulations run at once; default GOMAXPROCS.
	Workers int
	// ShrinkBudget bounds the runs spent minimising each failing seed's
	// schedule (0: no shrinking).
	ShrinkBudget int
	// PairConfig is the --pair-config path, for the reproduce commands.
	PairConfig string
	// Progress, when set, is called after each seed (from worker goroutines,
	// one call at a time).
	Progress func(done, failed int)
}

// SwarmFailure is one failing seed.
type SwarmFailure struct {
	Seed      uint64  `json:"seed"`
	Invariant string  `json:"invariant"`
	At        float64 `json:"at"`
	Detail    string  `json:"detail"`
	Reproduce string  `json:"reproduce"`
	// The shrunk schedule, when shrinking ran.
	Faults           int    `json:"faults"`
	MinimalFaults    int    `json:"minimal_faults,omitempty"`
	Minimal          string `json:"minimal_schedule,omitempty"`
	MinimalReproduce string `json:"minimal_reproduce,omitempty"`
	ShrinkRuns       int    `json:"shrink_runs,omitempty"`
}

// SwarmResult is a swarm's outcome. Failed is sorted by seed.
type SwarmResult struct {
	Seeds            int            `json:"seeds"` // seeds run
	Requested        int            `json:"requested"`
	FirstSeed        uint64         `json:"first_seed"`
	Failed           []SwarmFailure `json:"failed"`
	SimulatedSeconds float64        `json:"simulated_seconds"`
	WallSeconds      float64        `json:"wall_seconds"`
	Steps            uint64         `json:"steps"`
	Workers          int            `json:"workers"`
	Errors           []string       `json:"errors,omitempty"`
}

// SeedConfig is the Config a swarm runs for one seed.
func (c SwarmConfig) SeedConfig(seed uint64) Config {
	d := c.Duration
	if d <= 0 {
		d = 10 * time.Minute
	}
	sc := c.Scenario
	if sc == "" {
		sc = "random"
	}
	return Config{Scenario: sc, Seed: seed, Duration: d, Rules: c.Rules, AllowUnsafe: c.AllowUnsafe, Fsync: c.Fsync, Leadership: c.Leadership, Pairs: c.Pairs,
		StoreWriteTime: c.StoreWriteTime, StoreBatchWritePart: c.StoreBatchWritePart, HostWriteBound: c.HostWriteBound, HostBatch: c.HostBatch, HostBatchNoAppends: c.HostBatchNoAppends, HostRaiseOnce: c.HostRaiseOnce, CPU: c.CPU}
}

// Swarm runs c.Seeds independent simulations on c.Workers goroutines (each
// simulation itself single-threaded) and shrinks the failing ones. It stops
// early when ctx ends.
func Swarm(ctx context.Context, c SwarmConfig) SwarmResult {
	workers := c.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	start := time.Now()
	res := SwarmResult{Requested: c.Seeds, FirstSeed: c.FirstSeed, Workers: workers, Failed: []SwarmFailure{}}
	type outcome struct {
		sim   float64
		steps uint64
		fail  *SwarmFailure
		err   string
	}
	outs := make([]outcome, c.Seeds)
	var next atomic.Int64
	var mu sync.Mutex
	done, failed := 0, 0
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= c.Seeds {
					return
				}
				outs[i] = func() outcome {
					cfg := c.SeedConfig(c.FirstSeed + uint64(i))
					r, err := Run(cfg)
					if err != nil {
						return outcome{err: err.Error()}
					}
					o := outcome{sim: r.SimulatedSeconds, steps: r.Steps}
					if !r.Failed() {
						return o
					}
					v := r.Violations[0]
					f := &SwarmFailure{Seed: cfg.Seed, Invariant: v.Invariant, At: v.At, Detail: v.Detail, Reproduce: Command(cfg, c.PairConfig)}
					s, _ := newSim(cfg)
					f.Faults = len(s.faults)
					if c.ShrinkBudget > 0 {
						min, mv, runs := Shrink(cfg, v.Invariant, c.ShrinkBudget)
						f.ShrinkRuns = runs
						if mv != nil {
							mc := cfg
							mc.Faults, mc.FaultsSet = min, true
							f.MinimalFaults, f.Minimal, f.MinimalReproduce = len(min), FormatFaults(min), Command(mc, c.PairConfig)
						}
					}
					o.fail = f
					return o
				}()
				mu.Lock()
				done++
				if outs[i].fail != nil {
					failed++
				}
				if c.Progress != nil {
					c.Progress(done, failed)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	res.Seeds = done // fewer than asked when ctx ended
	for _, o := range outs {
		res.SimulatedSeconds += o.sim
		res.Steps += o.steps
		if o.fail != nil {
			res.Failed = append(res.Failed, *o.fail)
		}
		if o.err != "" {
			res.Errors = append(res.Errors, o.err)
		}
	}
	res.WallSeconds = time.Since(start).Seconds()
	return res
}
