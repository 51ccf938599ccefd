package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"understudy/actors/failover"
	"understudy/events"
	"understudy/runtime"
)

// The deployment's leadership record (runtime/deployment.go): shown, and
// changed by an operator once every node is stopped.

func newLeadershipCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "leadership",
		Short: "Show or change the leadership every node of the deployment runs (node or per-pair)",
		Long: "The first node that starts with members records its leadership in the failover bucket\n" +
			"(" + failover.DeploymentLeadershipKey + "); a node whose file says otherwise refuses to start.\n" +
			"To change it: stop every node, run 'understudy leadership set node|per-pair', change every\n" +
			"node file's leadership, start the nodes.",
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newLeadershipShowCmd(stdout), newLeadershipSetCmd(stdout))
	return cmd
}

func newLeadershipShowCmd(stdout io.Writer) *cobra.Command {
	var nf natsFlags
	cmd := &cobra.Command{
		Use:   "show",
		Short: "The deployment's leadership, who recorded it and when",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			nc, kv, err := nf.connect(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			e, err := kv.Get(ctx, failover.DeploymentLeadershipKey)
			if errors.Is(err, events.ErrNotFound) {
				fmt.Fprintf(stdout, "no leadership recorded yet: the first node that starts with members records its own\n")
				return nil
			}
			if err != nil {
				return fmt.Errorf("read %s: %w", failover.DeploymentLeadershipKey, err)
			}
			d, _, err := runtime.DecodeDeploymentLeadership(e.Value)
			if err != nil {
				return fmt.Errorf("%w (revision %d): record it again with 'understudy leadership set node|per-pair'", err, e.Revision)
			}
			fmt.Fprintf(stdout, "leadership %s, recorded by %s at %s (revision %d)\n", d.Leadership, d.By, d.At.UTC().Format(time.RFC3339), e.Revision)
			return nil
		},
	}
	nf.add(cmd)
	return cmd
}

func newLeadershipSetCmd(stdout io.Writer) *cobra.Command {
	var nf natsFlags
	var quiet time.Duration
	var force bool
	cmd := &cobra.Command{
		Use:   "set node|per-pair",
		Short: "Change the deployment's leadership (every node stopped)",
		Long: "set records a new leadership for the deployment. It refuses while a node appears to run:\n" +
			"a node's liveness record, a pair's register or a member's heartbeat written within --quiet\n" +
			"(by the server's clock). Then change every\n" +
			"node file's leadership and start the nodes; a node whose file disagrees refuses to start.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := failover.ParseLeadership(args[0])
			if err != nil {
				return &usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("leadership: %w", err)}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), time.Minute)
			defer cancel()
			nc, kv, err := nf.connect(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			if !force {
				js, err := jetstream.New(nc)
				if err != nil {
					return err
				}
				if key, age, err := latestWrite(ctx, js, nf.bucket); err != nil {
					return err
				} else if key != "" && age < quiet {
					return fmt.Errorf("%s was written %v ago: a node appears to run; stop every node of the deployment first (or wait --quiet %v after the last one stopped; --force skips the check)",
						key, age.Round(time.Millisecond), quiet)
				}
			}
			host, _ := os.Hostname()
			v, _ := json.Marshal(runtime.DeploymentLeadership{Leadership: l.String(), By: "operator@" + host, At: time.Now().UTC()})
			rev, err := kv.Put(ctx, failover.DeploymentLeadershipKey, v)
			if err != nil {
				return fmt.Errorf("write %s: %w", failover.DeploymentLeadershipKey, err)
			}
			fmt.Fprintf(stdout, "leadership %s recorded (revision %d): set leadership: %s in every node file before starting the nodes\n", l, rev, l)
			return nil
		},
	}
	nf.add(cmd)
	cmd.Flags().DurationVar(&quiet, "quiet", 30*time.Second, "refuse while a liveness record, register or member heartbeat was written within this time")
	cmd.Flags().BoolVar(&force, "force", false, "skip the check that no node runs")
	return cmd
}

// latestWrite is the most recently written of the bucket's liveness
// records, registers and member heartbeats, and how long ago by the
// server's clock ("": none), read in one pass.
func latestWrite(ctx context.Context, js jetstream.JetStream, bucket string) (string, time.Duration, error) {
	kvh, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return "", 0, fmt.Errorf("open bucket %s: %w", bucket, err)
	}
	st, err := js.Stream(ctx, events.KVStream(bucket))
	if err != nil {
		return "", 0, fmt.Errorf("open bucket %s: %w", bucket, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return "", 0, fmt.Errorf("bucket %s: %w", bucket, err)
	}
	now := info.TimeStamp // the server's clock, which dated every entry
	w, err := kvh.WatchFiltered(ctx, []string{failover.LivenessPrefix + ".*", "*.leader", "*.hb.*"}, jetstream.MetaOnly(), jetstream.IgnoreDeletes())
	if err != nil {
		return "", 0, fmt.Errorf("watch %s: %w", bucket, err)
	}
	defer func() { _ = w.Stop() }()
	var key string
	var at time.Time
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return "", 0, fmt.Errorf("watch %s ended early", bucket)
			}
			if e == nil { // every current value delivered
				if key == "" {
					return "", 0, nil
				}
				return key, now.Sub(at), nil
			}
			if e.Created().After(at) {
				key, at = e.Key(), e.Created()
			}
		case <-ctx.Done():
			return "", 0, ctx.Err()
		}
	}
}
