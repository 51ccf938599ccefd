package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"understudy/actors/failover"
	"understudy/events"
	"understudy/runtime"
)

func newConfigCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Read or change a pair's rules in force (<pair>.config) at run time",
	}
	cmd.AddCommand(newConfigGetCmd(stdout), newConfigSetCmd(stdout))
	return cmd
}

func newConfigGetCmd(stdout io.Writer) *cobra.Command {
	var nf natsFlags
	var pair string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "get --pair P",
		Short: "Print the rules in <pair>.config as a pair file",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if pair == "" {
				return &usageError{cmd: cmd.CommandPath(), err: errors.New("--pair is required")}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			nc, kv, err := nf.connect(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			r, e, err := readRules(ctx, kv, pair)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"pair": pair, "key": e.Key, "rev": e.Revision, "written": e.Time, "rules": runtime.PairFileOf(r)})
			}
			fmt.Fprintf(stdout, "# %s revision %d, written %s (server time)\n", e.Key, e.Revision, e.Time.Format(time.RFC3339Nano))
			if e.Key != failover.ConfigKey(pair) {
				fmt.Fprintf(stdout, "# no %s yet: the rules of the members' pair file, as a member published them\n", failover.ConfigKey(pair))
			}
			out, err := yaml.Marshal(runtime.PairFileOf(r))
			if err != nil {
				return err
			}
			_, err = stdout.Write(out)
			return err
		},
	}
	nf.add(cmd)
	cmd.Flags().StringVar(&pair, "pair", "", "the pair")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newConfigSetCmd(stdout io.Writer) *cobra.Command {
	var nf natsFlags
	var pair, file string
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "set --pair P -f pair.yaml",
		Short: "Validate a pair file and make it the pair's rules; wait for each member's verdict",
		Long: `Validates the pair file like a node does at load (every field, then the
safety inequality), writes it to <pair>.config by compare-and-set on the
revision it read, and waits for each member to apply or refuse it (a
member also refuses rules whose fence_grace does not cover its fence
chain). Exits non-zero if the file is invalid, a member refuses it, or a
member gives no verdict within --wait.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return &usageError{cmd: cmd.CommandPath(), err: errors.New("-f pair.yaml is required")}
			}
			rules, err := runtime.LoadPairFile(file, false)
			if err != nil {
				return err
			}
			if pair == "" {
				pair = rules.Pair
			}
			if rules.Pair != pair {
				return &usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--pair %s: the file is for pair %s", pair, rules.Pair)}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), wait+10*time.Second)
			defer cancel()
			nc, kv, err := nf.connect(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			key := failover.ConfigKey(pair)
			var rev uint64
			cur, err := kv.Get(ctx, key)
			switch {
			case err == nil:
				old, derr := failover.DecodeRules(cur.Value)
				if derr == nil {
					if old.Primary != rules.Primary || old.Replica != rules.Replica {
						return fmt.Errorf("primary/replica: %s/%s in force, the file says %s/%s: sites cannot change at run time; restart the members with a new pair file",
							old.Primary, old.Replica, rules.Primary, rules.Replica)
					}
					if old == rules {
						fmt.Fprintf(stdout, "pair %s: these rules are already %s revision %d; nothing written\n", pair, key, cur.Revision)
						return nil
					}
				}
				started := time.Now()
				rev, err = kv.Update(ctx, key, failover.EncodeRules(rules), cur.Revision)
				if errors.Is(err, events.ErrConflict) {
					return fmt.Errorf("%s changed while this command ran (revision %d is no longer the last); read it again with 'understudy config get --pair %s'", key, cur.Revision, pair)
				}
				if err != nil {
					return fmt.Errorf("write %s: %w", key, err)
				}
				return awaitVerdicts(ctx, stdout, nc, rules, rev, started, wait)
			case errors.Is(err, events.ErrNotFound):
				started := time.Now()
				rev, err = kv.Create(ctx, key, failover.EncodeRules(rules))
				if err != nil {
					return fmt.Errorf("create %s: %w", key, err)
				}
				return awaitVerdicts(ctx, stdout, nc, rules, rev, started, wait)
			default:
				return fmt.Errorf("read %s: %w", key, err)
			}
		},
	}
	nf.add(cmd)
	cmd.Flags().StringVar(&pair, "pair", "", "the pair (default: the file's)")
	cmd.Flags().StringVarP(&file, "file", "f", "", "the pair file (YAML)")
	cmd.Flags().DurationVar(&wait, "wait", 10*time.Second, "how long to wait for the members' verdicts (0: do not wait)")
	return cmd
}

// awaitVerdicts tails the pair's member events for ConfigApplied or
// ConfigRejected of rev from each site.
func awaitVerdicts(ctx context.Context, stdout io.Writer, nc *nats.Conn, rules failover.Rules, rev uint64, since time.Time, wait time.Duration) error {
	fmt.Fprintf(stdout, "pair %s: rules written as %s revision %d\n", rules.Pair, failover.ConfigKey(rules.Pair), rev)
	if wait <= 0 {
		return nil
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	evlog, err := events.NewJetStreamLog(js, runtime.DefaultEventsStream, runtime.Codec())
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	verdicts := map[string]string{}
	var refused []string
	names := failover.NamesOf(rules.Pair)
	opts := events.ReadOptions{Subject: names.Members(), FromTime: since.Add(-time.Second), Follow: true}
	for rec, err := range evlog.Read(wctx, opts) {
		if err != nil {
			break
		}
		ev, err := evlog.Codec().DecodeRecord(rec)
		if err != nil {
			continue
		}
		site, ok := names.MemberSite(rec.Subject)
		if !ok {
			continue
		}
		switch e := ev.(type) {
		case *failover.ConfigApplied:
			if e.Rev == rev && verdicts[site] == "" {
				verdicts[site] = "applied"
				fmt.Fprintf(stdout, "  %s applied revision %d\n", site, rev)
			}
		case *failover.ConfigRejected:
			if e.Rev == rev && verdicts[site] == "" {
				verdicts[site] = "refused"
				refused = append(refused, fmt.Sprintf("%s: %s: %s", site, e.Field, e.Rule))
				fmt.Fprintf(stdout, "  %s REFUSED revision %d: %s = %s: %s\n", site, rev, e.Field, e.Value, e.Rule)
			}
		}
		if verdicts[rules.Primary] != "" && verdicts[rules.Replica] != "" {
			break
		}
	}
	if len(refused) > 0 {
		return fmt.Errorf("revision %d refused (the refusing members keep their rules): %v", rev, refused)
	}
	var silent []string
	for _, s := range []string{rules.Primary, rules.Replica} {
		if verdicts[s] == "" {
			silent = append(silent, s)
		}
	}
	slices.Sort(silent)
	if len(silent) > 0 {
		return fmt.Errorf("no verdict on revision %d from %v within %v (not running? it checks the rules when it starts)", rev, silent, wait)
	}
	return nil
}
