package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"understudy/actors/failover"
	"understudy/runtime"
	"understudy/simulations"
)

// simulateFlags are the flags of `understudy simulate`.
type simulateFlags struct {
	list          bool
	scenario      string
	seed          uint64
	duration      time.Duration
	pairConfig    string
	allowUnsafe   bool
	leadership    string
	pairs         int
	storeWrite    time.Duration
	batchWrite    time.Duration
	writeBound    int
	hostBatch     int
	noAppendBatch bool
	raiseOnce     bool
	cpu           simulations.CPUModel
	connWatch     bool
	connNaive     bool
	faults        string
	fsync         string
	out           string
	asJSON        bool
	trace         bool
	swarm         bool
	seeds         int
	firstSeed     uint64
	workers       int
	shrink        int
}

func newSimulateCmd(stdout, stderr io.Writer) *cobra.Command {
	var f simulateFlags
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Run the failover members in the deterministic simulator: scenarios, seeds, swarms",
		Long: `Run the unmodified failover state machines of a pair in a deterministic
discrete-event simulation: virtual clocks, a simulated JetStream, simulated
links, crashes, power cuts, pauses, clock jumps and slow or failing
procedures, with invariants checked at every step (never two members
serving, a dead primary replaced within a bound, no promotion while the
primary's writes land, no flapping). The same seed gives the same bytes:
the digest of the event trace proves it.

  understudy simulate --list
  understudy simulate --scenario power-cut --seed 7 [--duration 1h] [--json] [--out run.export]
  understudy simulate --scenario random --seed 7 --faults 'partition(site-a,both)@12.5s+4s'
  understudy simulate --swarm --seeds 2000 [--first-seed 1] [--duration 10m] [--json]

Exit status 1 when an invariant was violated; each failing swarm seed is
printed with the command that reproduces it, and with the minimal fault
schedule delta debugging found. See docs/simulation.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runSimulate(cmd, f, stdout, stderr)
		},
	}
	fl := cmd.Flags()
	fl.BoolVar(&f.list, "list", false, "list the scenarios, one line each")
	fl.StringVar(&f.scenario, "scenario", "", "scenario to run (see --list)")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of the run")
	fl.DurationVar(&f.duration, "duration", 0, "simulated time (default: the scenario's; 10m per seed with --swarm)")
	fl.StringVar(&f.pairConfig, "pair-config", "", "pair file with the rules to simulate (default: DESIGN.md's defaults)")
	fl.BoolVar(&f.allowUnsafe, "allow-unsafe-config", false, "accept rules that break the safety inequality (to watch the checker find the split brain)")
	fl.StringVar(&f.leadership, "leadership", "per-pair", "how leadership is kept: per-pair (every pair heartbeats its register) or node (one liveness record per node, docs/failover.md)")
	fl.IntVar(&f.pairs, "pairs", 1, "pairs each node hosts (every pair with the same rules)")
	fl.DurationVar(&f.storeWrite, "store-write-time", 0, "the store's service time per write, writes served one after another (0: none; docs/simulation.md)")
	fl.DurationVar(&f.batchWrite, "store-batch-write-time", 0, "with --host-batch: what each write of a batch beyond the first adds to the batch's service time (0: 10µs)")
	fl.IntVar(&f.writeBound, "host-write-bound", 0, "at most this many member KV writes, and as many event appends, in flight per node, as the runtime keeps (64); 0: unbounded")
	fl.IntVar(&f.hostBatch, "host-batch", 0, "with --host-write-bound: a node sends its members' waiting KV writes in atomic batches of up to this many, served by the store as one write, as the runtime does (256); 0: one at a time")
	fl.BoolVar(&f.noAppendBatch, "host-batch-no-appends", false, "with --host-batch: batch only the KV writes, each event append going alone as before the runtime batched them too (for comparison)")
	fl.BoolVar(&f.raiseOnce, "host-raise-once", false, "with --leadership node: a node's members' raises of another node's epoch go outside --host-write-bound, identical ones as one write, as the runtime does")
	fl.DurationVar(&f.cpu.StepCost, "host-step-cost", 0, "model each node's CPU: every input a member or the liveness writer takes in costs this much of one core, served in arrival order (0: no CPU model; docs/simulation.md)")
	fl.IntVar(&f.cpu.Cores, "host-cores", 0, "with --host-step-cost: each node's cores (0: 2)")
	fl.DurationVar(&f.cpu.StartCost, "host-start-cost", 0, "with --host-step-cost: what starting one procedure step's process costs the node's CPU")
	fl.IntVar(&f.cpu.StartLimit, "host-start-limit", 0, "with --host-start-cost: starts served at once (0: the runtime's, 2 × cores; -1: unbounded, as before the runtime bounded them)")
	fl.BoolVar(&f.connWatch, "host-conn-watch", false, "model the node's judgement of its NATS connection: silent for heartbeat_timeout, it is given up and reconnected unless its server answers a side connection (a busy store), as the runtime does (docs/simulation.md)")
	fl.BoolVar(&f.connNaive, "host-conn-naive", false, "the judgement before the runtime's fix (implies --host-conn-watch): no side connection, and a batch broken by the reconnection turns batches off for a minute (for comparison)")
	fl.StringVar(&f.faults, "faults", "", "fault schedule replacing the scenario's, e.g. 'partition(site-a,both)@12.5s+4s;crash(site-b)@1m'")
	fl.StringVar(&f.fsync, "fsync", "", "simulated NATS durability: always or interval (default: always)")
	fl.StringVar(&f.out, "out", "", "write the run's history to this file in the export format")
	fl.BoolVar(&f.asJSON, "json", false, "print the result as one JSON object")
	fl.BoolVar(&f.trace, "trace", false, "print the timeline of the run (stderr with --json)")
	fl.BoolVar(&f.swarm, "swarm", false, "run many seeds of the random scenario")
	fl.IntVar(&f.seeds, "seeds", 0, "number of seeds with --swarm")
	fl.Uint64Var(&f.firstSeed, "first-seed", 1, "first seed with --swarm")
	fl.IntVar(&f.workers, "workers", 0, "simulations at once with --swarm (default: GOMAXPROCS)")
	fl.IntVar(&f.shrink, "shrink-budget", 400, "runs spent minimising each failing seed's schedule with --swarm (0: no shrinking)")
	return cmd
}

func runSimulate(cmd *cobra.Command, f simulateFlags, stdout, stderr io.Writer) error {
	usage := func(format string, args ...any) error {
		return &usageError{cmd: cmd.CommandPath(), err: fmt.Errorf(format, args...)}
	}
	set := func(name string) bool { return cmd.Flags().Changed(name) }
	if f.list {
		for _, name := range []string{"scenario", "swarm", "faults", "out", "seeds"} {
			if set(name) {
				return usage("--list takes no --%s", name)
			}
		}
		return listScenarios(stdout)
	}
	rules := simulations.DefaultPair()
	if f.pairConfig != "" {
		r, err := loadRulesFile(f.pairConfig, f.allowUnsafe, "simulate")
		if err != nil {
			return usage("%v", err)
		}
		rules = r
	}
	var fsync simulations.FsyncMode
	if f.fsync != "" {
		m, err := simulations.ParseFsync(f.fsync)
		if err != nil {
			return usage("--fsync: %v", err)
		}
		fsync = m
	}
	if f.duration < 0 {
		return usage("--duration must be positive, got %v", f.duration)
	}
	lead, err := simulations.ParseLeadership(f.leadership)
	if err != nil {
		return usage("--leadership: %v", err)
	}
	if f.pairs < 1 {
		return usage("--pairs = %d: must be at least 1", f.pairs)
	}
	if f.batchWrite < 0 {
		return usage("--store-batch-write-time = %v: must not be negative", f.batchWrite)
	}
	if f.storeWrite < 0 || f.writeBound < 0 {
		return usage("--store-write-time and --host-write-bound must not be negative")
	}
	if f.hostBatch < 0 || f.hostBatch > simulations.HostBatchRuntime {
		return usage("--host-batch = %d: 0 (no batches) to %d", f.hostBatch, simulations.HostBatchRuntime)
	}
	if f.hostBatch > 0 && f.writeBound == 0 {
		return usage("--host-batch needs --host-write-bound (the runtime's: %d): writes are batched while they wait at it", simulations.HostWriteBoundRuntime)
	}
	if f.cpu.StepCost < 0 || f.cpu.Cores < 0 || f.cpu.StartCost < 0 || f.cpu.StartLimit < -1 {
		return usage("--host-step-cost, --host-cores and --host-start-cost must not be negative; --host-start-limit is -1 (unbounded), 0 (the runtime's) or a count")
	}
	if f.cpu.StepCost == 0 && (f.cpu.Cores != 0 || f.cpu.StartCost != 0 || f.cpu.StartLimit != 0) {
		return usage("--host-cores, --host-start-cost and --host-start-limit need --host-step-cost: they refine the CPU model it turns on")
	}
	if f.noAppendBatch && f.hostBatch == 0 {
		return usage("--host-batch-no-appends needs --host-batch")
	}
	if f.swarm {
		for _, name := range []string{"scenario", "seed", "faults", "out", "trace", "host-conn-watch", "host-conn-naive"} {
			if set(name) {
				return usage("--swarm runs the random scenario over --seeds: it takes no --%s", name)
			}
		}
		if f.seeds <= 0 {
			return usage("--swarm needs --seeds N (N > 0)")
		}
		if f.workers < 0 || f.shrink < 0 {
			return usage("--workers and --shrink-budget must not be negative")
		}
		return runSwarm(cmd, f, rules, fsync, lead, stdout, stderr)
	}
	for _, name := range []string{"seeds", "first-seed", "workers", "shrink-budget"} {
		if set(name) {
			return usage("--%s needs --swarm", name)
		}
	}
	if f.scenario == "" {
		return usage("give --scenario NAME (see --list), or --swarm --seeds N")
	}
	if simulations.ScenarioByName(f.scenario) == nil {
		return usage("unknown scenario %q; see understudy simulate --list", f.scenario)
	}
	cfg := simulations.Config{Scenario: f.scenario, Seed: f.seed, Duration: f.duration, Rules: rules, AllowUnsafe: f.allowUnsafe, Fsync: fsync,
		Leadership: lead, Pairs: f.pairs, StoreWriteTime: f.storeWrite, StoreBatchWritePart: f.batchWrite, HostWriteBound: f.writeBound, HostBatch: f.hostBatch, HostBatchNoAppends: f.noAppendBatch, HostRaiseOnce: f.raiseOnce, CPU: f.cpu,
		HostConnWatch: f.connWatch, HostConnNaive: f.connNaive}
	if set("faults") {
		fs, err := simulations.ParseFaults(f.faults, rules.Primary, rules.Replica)
		if err != nil {
			return usage("--faults: %v", err)
		}
		cfg.Faults, cfg.FaultsSet = fs, true
	}
	if f.trace {
		cfg.Trace = stdout
		if f.asJSON {
			cfg.Trace = stderr
		}
	}
	if cfg.Duration == 0 {
		cfg.Duration = simulations.ScenarioByName(f.scenario).Duration
	}
	cfg.Source = simulations.Command(cfg, f.pairConfig)
	var outFile *os.File
	if f.out != "" {
		file, err := os.Create(f.out)
		if err != nil {
			return fmt.Errorf("--out: %w", err)
		}
		outFile = file
		cfg.Export = file
	}
	res, err := simulations.Run(cfg)
	if outFile != nil {
		if cerr := outFile.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("--out %s: %w", f.out, cerr)
		}
	}
	if err != nil {
		if res == nil {
			return usage("%v", err) // refused before it ran
		}
		return err
	}
	reproduce := simulations.Command(cfg, f.pairConfig)
	if f.asJSON {
		out := struct {
			*simulations.Result
			Reproduce string    `json:"reproduce"`
			Rules     rulesJSON `json:"rules"`
			Out       string    `json:"out,omitempty"`
		}{res, reproduce, rulesOf(rules), f.out}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return err
		}
	} else {
		printRun(stdout, res, reproduce, f.out)
	}
	if res.Failed() {
		return fmt.Errorf("%s", plural(len(res.Violations), "invariant violation"))
	}
	return nil
}

// loadRulesFile reads a pair file's rules. Rules that break the safety
// inequality are refused, saying how to use them anyway (verb: what the
// command would do with them).
func loadRulesFile(path string, allowUnsafe bool, verb string) (failover.Rules, error) {
	r, err := runtime.LoadPairFile(path, allowUnsafe)
	if err != nil && !allowUnsafe {
		if _, uerr := runtime.LoadPairFile(path, true); uerr == nil {
			return r, fmt.Errorf("%w (to %s these rules anyway, add --allow-unsafe-config)", err, verb)
		}
	}
	return r, err
}

// rulesJSON are a pair's rules as --json prints them (seconds).
type rulesJSON struct {
	Pair             string  `json:"pair"`
	Primary          string  `json:"primary"`
	Replica          string  `json:"replica"`
	HeartbeatTimeout float64 `json:"heartbeat_timeout_s"`
	FailureThreshold int     `json:"failure_threshold"`
	SuccessThreshold int     `json:"success_threshold"`
	FailoverTimeout  float64 `json:"failover_timeout_s"`
	FenceGrace       float64 `json:"fence_grace_s"`
	Failback         string  `json:"failback"`
	Safe             bool    `json:"safe"`
}

func rulesOf(r failover.Rules) rulesJSON {
	return rulesJSON{
		Pair: r.Pair, Primary: r.Primary, Replica: r.Replica,
		HeartbeatTimeout: r.HeartbeatTimeout.Seconds(), FailureThreshold: r.FailureThreshold, SuccessThreshold: r.SuccessThreshold,
		FailoverTimeout: r.FailoverTimeout.Seconds(), FenceGrace: r.FenceGrace.Seconds(), Failback: r.Failback.String(),
		Safe: r.Validate() == nil,
	}
}

func listScenarios(w io.Writer) error {
	width := 0
	for _, sc := range simulations.Scenarios() {
		width = max(width, len(sc.Name))
	}
	for _, sc := range simulations.Scenarios() {
		if _, err := fmt.Fprintf(w, "%-*s  %s (default %s)\n", width, sc.Name, sc.Summary, simulations.FormatDuration(sc.Duration)); err != nil {
			return err
		}
	}
	return nil
}

func printRun(w io.Writer, r *simulations.Result, reproduce, out string) {
	fmt.Fprintf(w, "scenario %s, seed %d: %s simulated in %s (%s real time), %d steps\n",
		r.Scenario, r.Seed, simulations.FormatDuration(time.Duration(r.SimulatedSeconds*float64(time.Second)).Round(time.Millisecond)),
		time.Duration(r.WallSeconds*float64(time.Second)).Round(time.Microsecond), speedup(r.Speedup), r.Steps)
	faults := r.Faults
	if faults == "" {
		faults = "none"
	}
	fmt.Fprintf(w, "faults (fsync %s): %s\n", r.Fsync, faults)
	fmt.Fprintf(w, "failovers %d, leadership changes %d, longest time nobody served %.0f ms (%.0f ms in all) as the record dates it; %.0f ms (%.0f ms) by the simulator's clock\n",
		r.Failovers, r.LeadershipChanges, r.MaxUnavailableMS, r.UnavailableMS, r.TrueMaxUnavailableMS, r.TrueUnavailableMS)
	var parts []string
	for _, c := range r.Sometimes {
		mark := ""
		if c.Required {
			mark = "*"
		}
		parts = append(parts, fmt.Sprintf("%s%s=%d", c.Name, mark, c.Count))
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "sometimes (* required): %s\n", strings.Join(parts, " "))
	}
	if len(r.Unexercised) > 0 {
		fmt.Fprintf(w, "NOT EXERCISED: %s — this run did not test what scenario %s claims\n", strings.Join(r.Unexercised, ", "), r.Scenario)
	}
	fmt.Fprintf(w, "digest %s\n", r.Digest)
	if out != "" {
		fmt.Fprintf(w, "history written to %s\n", out)
	}
	if len(r.Violations) == 0 {
		fmt.Fprintf(w, "no invariant violated\n")
		return
	}
	for _, v := range r.Violations {
		fmt.Fprintf(w, "VIOLATION %s at %.3fs: %s\n", v.Invariant, v.At, v.Detail)
	}
	fmt.Fprintf(w, "reproduce: %s --trace\n", reproduce)
}

func speedup(x float64) string {
	if math.IsInf(x, 0) || x <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f×", x)
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func runSwarm(cmd *cobra.Command, f simulateFlags, rules failover.Rules, fsync simulations.FsyncMode, lead simulations.Leadership, stdout, stderr io.Writer) error {
	sc := simulations.SwarmConfig{
		Seeds: f.seeds, FirstSeed: f.firstSeed, Duration: f.duration, Rules: rules, AllowUnsafe: f.allowUnsafe,
		Fsync: fsync, Workers: f.workers, ShrinkBudget: f.shrink, PairConfig: f.pairConfig,
		Leadership: lead, Pairs: f.pairs, StoreWriteTime: f.storeWrite, StoreBatchWritePart: f.batchWrite, HostWriteBound: f.writeBound, HostBatch: f.hostBatch, HostBatchNoAppends: f.noAppendBatch, HostRaiseOnce: f.raiseOnce, CPU: f.cpu,
	}
	if sc.Duration == 0 {
		sc.Duration = 10 * time.Minute
	}
	bar := newProgress(stderr, "swarm")
	if bar.on {
		sc.Progress = func(done, failed int) {
			const width = 30
			fill := width * done / f.seeds
			bar.draw(done == f.seeds, "[%s%s] %d/%d seeds, %d failed", strings.Repeat("#", fill), strings.Repeat(".", width-fill), done, f.seeds, failed)
		}
	}
	res := simulations.Swarm(cmd.Context(), sc)
	bar.done()
	if len(res.Errors) > 0 {
		return fmt.Errorf("swarm: %s", res.Errors[0])
	}
	if f.asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return err
		}
	} else {
		printSwarm(stdout, res, sc)
	}
	if err := cmd.Context().Err(); err != nil {
		return fmt.Errorf("swarm interrupted: %w", err)
	}
	if len(res.Failed) > 0 {
		return fmt.Errorf("%d of %d seeds violated an invariant", len(res.Failed), res.Seeds)
	}
	return nil
}

func printSwarm(w io.Writer, r simulations.SwarmResult, sc simulations.SwarmConfig) {
	speed := 0.0
	if r.WallSeconds > 0 {
		speed = r.SimulatedSeconds / r.WallSeconds
	}
	fmt.Fprintf(w, "swarm: %d seeds (%d..%d) × %s of random faults on %d workers: %d failed; %.1f simulated hours in %.1fs (%s real time)\n",
		r.Seeds, r.FirstSeed, r.FirstSeed+uint64(r.Seeds)-1, simulations.FormatDuration(sc.Duration), r.Workers, len(r.Failed),
		r.SimulatedSeconds/3600, r.WallSeconds, speedup(speed))
	for _, fl := range r.Failed {
		fmt.Fprintf(w, "\nFAIL seed %d: %s at %.3fs: %s\n", fl.Seed, fl.Invariant, fl.At, fl.Detail)
		fmt.Fprintf(w, "  reproduce: %s\n", fl.Reproduce)
		if fl.Minimal != "" || fl.MinimalReproduce != "" {
			fmt.Fprintf(w, "  minimal schedule (%d of %d faults, %d shrink runs): %s\n", fl.MinimalFaults, fl.Faults, fl.ShrinkRuns, fl.Minimal)
			fmt.Fprintf(w, "  reproduce minimal: %s\n", fl.MinimalReproduce)
		}
	}
}
