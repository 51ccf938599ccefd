package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"understudy/actors/failover"
	"understudy/runtime"
)

func newDemoCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		killAfter time.Duration
		asJSON    bool
		dataDir   string
		pairFile  string
		logLevel  string
		out       string
		withPG    bool
	)
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run a pair on an embedded NATS, kill the primary, watch the replica take over",
		Long: `Run a failover pair (site-a preferred primary, site-b replica) as two nodes in
one process on an embedded NATS with JetStream, each node on its own connection
behind its own link. Transitions are printed as they happen. After --kill-after
the primary loses power: its link stalls and its process stops, mid-heartbeat.
The replica promotes once the register is stale, and a summary follows: last
primary heartbeat, promotion, detection delay, all by JetStream server time.

With --json the summary is printed on stdout as one JSON object (with
failover_ms and promoted) and the live lines go to stderr.

With --out FILE the pair's record (KV history and events) is exported to FILE
before the embedded server stops: 'understudy replay --file FILE' rebuilds the
failover from it.

With --postgres each site runs a real PostgreSQL 15 server driven by its member
(the preferred primary creates the database, the replica clones it and
streams), and a writer commits a counter continuously through a read-write
connection to whichever site accepts writes. The power cut SIGKILLs the
primary's PostgreSQL too. The summary adds first_write_ms (power cut to the
first commit accepted by the new primary) and lost_writes (acknowledged
commits missing afterwards). It needs the postgresql-15 package; as root,
PostgreSQL runs as the postgres user.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rules := failover.DefaultRules("demo", "site-a", "site-b")
			if pairFile != "" {
				r, err := runtime.LoadPairFile(pairFile, false)
				if err != nil {
					return &usageError{cmd: cmd.CommandPath(), err: err}
				}
				rules = r
			}
			if killAfter <= 0 {
				return &usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--kill-after must be positive, got %v", killAfter)}
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return &usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--log-level: %w", err)}
			}
			live := stdout
			if asJSON {
				live = stderr
			}
			logger := runtime.NewLogger(stderr, level, runtime.LogText)
			slog.SetDefault(logger.With("component", "library")) // the actor engine logs to the default
			if withPG {
				if out != "" {
					return &usageError{cmd: cmd.CommandPath(), err: errors.New("--out is not available with --postgres")}
				}
				return runDemoPostgres(cmd.Context(), rules, killAfter, dataDir, asJSON, stdout, live, logger)
			}
			return runDemo(cmd.Context(), rules, killAfter, dataDir, out, asJSON, stdout, live, logger)
		},
	}
	f := cmd.Flags()
	f.DurationVar(&killAfter, "kill-after", 10*time.Second, "how long the primary serves before it loses power")
	f.BoolVar(&asJSON, "json", false, "print the summary as JSON on stdout (live lines go to stderr)")
	f.StringVar(&dataDir, "data-dir", "", "JetStream data directory (default: a temporary one, removed afterwards)")
	f.StringVar(&pairFile, "pair-config", "", "pair file with the rules to use (pair and sites are taken from it)")
	f.StringVar(&logLevel, "log-level", "warn", "log level of the nodes (debug, info, warn, error)")
	f.StringVar(&out, "out", "", "export the pair's record to FILE after the run (see 'understudy replay')")
	f.BoolVar(&withPG, "postgres", false, "run the pair on two real PostgreSQL 15 servers with a writer committing a counter; the summary adds first_write_ms and lost_writes")
	return cmd
}

func runDemo(ctx context.Context, rules failover.Rules, killAfter time.Duration, dataDir, out string, asJSON bool, stdout, live io.Writer, logger *slog.Logger) error {
	if dataDir == "" {
		dir, err := os.MkdirTemp("", "understudy-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		dataDir = dir
	}
	es, err := runtime.StartEmbedded(runtime.EmbeddedConfig{DataDir: dataDir, Host: "127.0.0.1", Port: -1}, logger)
	if err != nil {
		return err
	}
	defer es.Shutdown()
	nc, err := nats.Connect(es.ClientURL())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	names := runtime.DefaultConfig().Assets
	if _, err := runtime.Provision(ctx, js, runtime.DefaultAssets(names, 1), logger); err != nil {
		return err
	}
	start := time.Now()
	var mu sync.Mutex
	fmt.Fprintf(live, "embedded NATS at %s; pair %s: %s (preferred primary) and %s; rules: heartbeat_timeout=%v failure_threshold=%d failover_timeout=%v fence_grace=%v\n",
		es.ClientURL(), rules.Pair, rules.Primary, rules.Replica, rules.HeartbeatTimeout, rules.FailureThreshold, rules.FailoverTimeout, rules.FenceGrace)
	observe := func(t runtime.Transition) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(live, "%8.3fs  %-7s %s\n", t.At.Sub(start).Seconds(), t.Site, runtime.DescribeEvent(t.Event))
	}
	opts := runtime.TrialOptions{
		Rules: rules, Mode: runtime.TrialPowerCut, FaultAfter: killAfter, Window: 4*rules.FailoverTimeout + 10*rules.HeartbeatTimeout,
		Stream: names.EventsStream, Bucket: names.FailoverBucket, Logger: logger, Observe: observe,
	}
	opts.OnFault = func() {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(live, "%8.3fs  %-7s POWER CUT: link stalled, process killed\n", time.Since(start).Seconds(), rules.Primary)
	}
	addr := es.Server().Addr().String()
	sum, err := runtime.RunTrial(ctx, addr, opts)
	if err != nil {
		return err
	}
	if out != "" {
		ropts := runtime.PairRecordOptions{Pair: rules.Pair, Bucket: names.FailoverBucket, Stream: names.EventsStream}
		n, size, err := exportToFile(ctx, js, ropts, "understudy demo (embedded NATS "+es.ClientURL()+")", out, io.Discard)
		if err != nil {
			return err
		}
		fmt.Fprintf(live, "record of pair %s exported to %s: %d records, %d bytes (replay it with 'understudy replay --file %s')\n", rules.Pair, out, n, size, out)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(sum)
	}
	printSummary(stdout, sum, start)
	return nil
}

func printSummary(w io.Writer, s runtime.TrialSummary, start time.Time) {
	at := func(t *time.Time) string {
		if t == nil {
			return "—"
		}
		return t.Format("15:04:05.000")
	}
	fmt.Fprintf(w, "\nsummary (JetStream server time)\n")
	fmt.Fprintf(w, "  primary %s lost power at     %s (local clock, %.3fs into the run)\n", s.Primary, s.FaultAt.Format("15:04:05.000"), s.FaultAt.Sub(start).Seconds())
	fmt.Fprintf(w, "  last primary heartbeat        %s\n", s.LastPrimaryHeartbeat.Format("15:04:05.000"))
	if s.PrimaryFencedAt != nil {
		fmt.Fprintf(w, "  primary fenced                %s\n", at(s.PrimaryFencedAt))
	} else {
		fmt.Fprintf(w, "  primary fenced                — (power cut: the machine is off, nothing left to fence)\n")
	}
	if s.PrimaryFenceDeadline != nil {
		fmt.Fprintf(w, "  fenced at the latest by       %s  (a primary still running; the rules' bound)\n", at(s.PrimaryFenceDeadline))
	}
	fmt.Fprintf(w, "  promotion attempt by %s   %s  (detection %.0f ms)\n", s.Replica, at(s.PromotionAttemptAt), s.DetectionMS)
	fmt.Fprintf(w, "  register won by %s        %s  (failover %.0f ms; bound failover_timeout = %.0f ms)\n", s.Replica, at(s.PromotedAt), s.FailoverMS, s.FailoverTimeoutMS)
	fmt.Fprintf(w, "  %s serving                %s  (%.0f ms after the last primary heartbeat)\n", s.Replica, at(s.ServingAt), s.ServingMS)
	if s.Promoted == "" {
		fmt.Fprintf(w, "  NO PROMOTION happened within the wait window\n")
	}
	for _, u := range s.Unreadable {
		fmt.Fprintf(w, "  UNREADABLE record left out of the summary: %s\n", u)
	}
}
