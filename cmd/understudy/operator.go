package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"understudy/actors/failover"
	"understudy/events"
	"understudy/runtime"
)

// The operator's controls of a pair beyond switchover: maintenance mode
// (pause, resume) and a failover to a chosen member when the leader is
// gone (failover --to). Both are KV values the members read on their
// watch; docs/failover.md, "Pause, resume and failover --to".

func requestID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func newPauseCmd(stdout io.Writer) *cobra.Command {
	var nf natsFlags
	var pair, reason string
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "pause --pair P [--reason TEXT]",
		Short: "Maintenance mode: no automatic failover, failback or hand-over of a pair until resume",
		Long: "pause writes <pair>.pause. While a pair is paused no member moves leadership on its own:\n" +
			"a follower does not take over a stale leader, a leader neither fails back nor hands over\n" +
			"for failed checks. A leader still fences itself when its heartbeats fail (safety first),\n" +
			"and switchover and failover --to still work.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return setPause(cmd, &nf, pair, true, reason, wait, stdout)
		},
	}
	nf.add(cmd)
	cmd.Flags().StringVar(&pair, "pair", "", "the pair")
	cmd.Flags().StringVar(&reason, "reason", "", "why, for status and the members' events")
	cmd.Flags().DurationVar(&wait, "wait", 5*time.Second, "how long to wait for the members to report that they saw it")
	return cmd
}

func newResumeCmd(stdout io.Writer) *cobra.Command {
	var nf natsFlags
	var pair string
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "resume --pair P",
		Short: "End a pair's maintenance mode: automatic failover, failback and hand-overs apply again",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return setPause(cmd, &nf, pair, false, "", wait, stdout)
		},
	}
	nf.add(cmd)
	cmd.Flags().StringVar(&pair, "pair", "", "the pair")
	cmd.Flags().DurationVar(&wait, "wait", 5*time.Second, "how long to wait for the members to report that they saw it")
	return cmd
}

// setPause writes the pair's pause and waits, up to wait, until each
// member reports (in its heartbeat, or the holder in the register) that
// it saw that revision. A member that does not report in time is named;
// it reads the key when it comes back, so that is no failure.
func setPause(cmd *cobra.Command, nf *natsFlags, pair string, paused bool, reason string, wait time.Duration, stdout io.Writer) error {
	if pair == "" {
		return &usageError{cmd: cmd.CommandPath(), err: errors.New("--pair is required")}
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), wait+10*time.Second)
	defer cancel()
	nc, kv, err := nf.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	rules, _, err := readRules(ctx, kv, pair)
	if err != nil {
		return err
	}
	p := failover.Pause{ID: requestID(), Paused: paused, Reason: reason, At: time.Now().UTC()}
	rev, err := kv.Put(ctx, failover.PauseKey(pair), failover.EncodePause(p))
	if err != nil {
		return fmt.Errorf("write %s: %w", failover.PauseKey(pair), err)
	}
	if paused {
		fmt.Fprintf(stdout, "pair %s paused (pause %s, revision %d): no automatic failover, failback or hand-over until 'understudy resume --pair %s'; leaders still fence on failed heartbeats\n",
			pair, p.ID, rev, pair)
	} else {
		fmt.Fprintf(stdout, "pair %s resumed (revision %d): automatic failover, failback and hand-overs apply again\n", pair, rev)
	}
	sites := []string{rules.Primary, rules.Replica}
	deadline := time.Now().Add(wait)
	for {
		views := memberPauseViews(ctx, kv, pair)
		var missing []string
		for _, s := range sites {
			if v, ok := views[s]; !ok || v.rev < rev {
				missing = append(missing, s)
			}
		}
		if len(missing) == 0 {
			fmt.Fprintf(stdout, "seen by %s\n", strings.Join(sites, " and "))
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			fmt.Fprintf(stdout, "not yet seen by %s after %v (is it running? it reads the pause when it starts); see 'understudy status --pair %s'\n",
				strings.Join(missing, " and "), wait, pair)
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pauseView is what a member last reported of <pair>.pause.
type pauseView struct {
	paused bool
	rev    uint64
}

// memberPauseViews reads each member's report of the pause: from its own
// heartbeat, and for the register's holder from the register (a holder
// beats through it). Keys that cannot be read are left out.
func memberPauseViews(ctx context.Context, kv events.KV, pair string) map[string]pauseView {
	out := map[string]pauseView{}
	if rules, _, err := readRules(ctx, kv, pair); err == nil {
		for _, s := range []string{rules.Primary, rules.Replica} {
			if e, err := kv.Get(ctx, failover.HeartbeatKey(pair, s)); err == nil {
				if h, err := failover.DecodeHeartbeat(e.Value); err == nil {
					out[s] = pauseView{paused: h.Paused, rev: h.PauseRev}
				}
			}
		}
	}
	if e, err := kv.Get(ctx, failover.LeaderKey(pair)); err == nil {
		if l, err := failover.DecodeLeader(e.Value); err == nil && l.Site != "" {
			out[l.Site] = pauseView{paused: l.Paused, rev: l.PauseRev}
		}
	}
	return out
}

// PauseStatus is a pair's <pair>.pause as status shows it, with which
// members report that revision (or a later one).
type PauseStatus struct {
	Paused bool      `json:"paused"`
	ID     string    `json:"id"`
	Reason string    `json:"reason,omitempty"`
	At     time.Time `json:"at"`
	Rev    uint64    `json:"rev"`
	// Seen says, per site, whether the member reports this revision.
	Seen map[string]bool `json:"seen"`
}

// pauseStatus reads the pair's pause (nil: never paused, or unreadable).
func pauseStatus(ctx context.Context, kv events.KV, pair string) *PauseStatus {
	e, err := kv.Get(ctx, failover.PauseKey(pair))
	if err != nil {
		return nil
	}
	p, err := failover.DecodePause(e.Value)
	if err != nil {
		return nil
	}
	st := &PauseStatus{Paused: p.Paused, ID: p.ID, Reason: p.Reason, At: p.At, Rev: e.Revision, Seen: map[string]bool{}}
	for s, v := range memberPauseViews(ctx, kv, pair) {
		st.Seen[s] = v.rev >= e.Revision
	}
	return st
}

// printPause prints status's pause line: when the pair is paused, or
// resumed but not yet seen so by every member.
func printPause(w io.Writer, p *PauseStatus) {
	if p == nil {
		return
	}
	var seen, unseen []string
	for s, ok := range p.Seen {
		if ok {
			seen = append(seen, s)
		} else {
			unseen = append(unseen, s)
		}
	}
	slices.Sort(seen)
	slices.Sort(unseen)
	if !p.Paused && len(unseen) == 0 {
		return
	}
	line := "RESUMED (rev " + fmt.Sprint(p.Rev) + ")"
	if p.Paused {
		line = fmt.Sprintf("PAUSED since %s (rev %d)", p.At.Format(time.RFC3339), p.Rev)
		if p.Reason != "" {
			line += ": " + p.Reason
		}
		line += "; no automatic failover"
	}
	if len(seen) > 0 {
		line += "; seen by " + strings.Join(seen, ", ")
	}
	if len(unseen) > 0 {
		line += "; NOT yet seen by " + strings.Join(unseen, ", ")
	}
	fmt.Fprintf(w, "  pause    %s\n", line)
}

func newFailoverCmd(stdout io.Writer) *cobra.Command {
	var nf natsFlags
	var pair, to string
	var force bool
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "failover --pair P --to SITE [--force]",
		Short: "Make SITE take over a pair whose leader is gone, when the automatic rules do not",
		Long: "failover writes <pair>.failover. The member on SITE takes the register (by compare-and-set\n" +
			"on the revision it saw) once the holder is gone by the usual staleness rules; it refuses\n" +
			"while the holder writes the register (use switchover then). Without --force it refuses,\n" +
			"with the numbers, when the lag rules forbid the promotion: its lag over\n" +
			"maximum_lag_on_failover, or with synchronous on or strict, when it lacks some of what\n" +
			"the leader published and the register does not say sync. --force promotes regardless;\n" +
			"the member records what it may lose.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), wait+10*time.Second)
			defer cancel()
			nc, kv, err := nf.pairTarget(ctx, cmd, pair, to)
			if err != nil {
				return err
			}
			defer nc.Close()
			var startTerm uint64 // a new holder's term is above it
			if e, err := kv.Get(ctx, failover.LeaderKey(pair)); err == nil {
				le, _ := failover.LeaderEntryOf(e, 0)
				if l := le.Value; l.Site == to && !l.Fenced {
					fmt.Fprintf(stdout, "%s already leads pair %s (term %d)\n", to, pair, l.Term)
					return nil
				}
				startTerm = le.Value.Term
			}
			req := failover.ManualFailover{ID: requestID(), To: to, Force: force, Requested: time.Now().UTC(), Within: wait}
			// Tail the target's events before writing, so its answer is not missed.
			answers := tailMemberEvents(ctx, nc, pair, to, req.Requested.Add(-time.Second))
			if _, err := kv.Put(ctx, failover.ManualFailoverKey(pair), failover.EncodeManualFailover(req)); err != nil {
				return fmt.Errorf("write failover request: %w", err)
			}
			fmt.Fprintf(stdout, "failover %s requested: pair %s to %s (force %v); waiting up to %v\n", req.ID, pair, to, force, wait)
			w, err := kv.Watch(ctx, failover.LeaderKey(pair), events.WatchOptions{})
			if err != nil {
				return err
			}
			defer w.Stop()
			deadline := time.After(wait)
			accepted, took := false, false
			var settle <-chan time.Time // after took: a moment for the accepted event, to print what it says
			for {
				select {
				case ev := <-answers:
					switch e := ev.(type) {
					case *failover.ManualFailoverRejected:
						if e.ID == req.ID {
							return fmt.Errorf("failover %s refused by %s: %s", req.ID, to, e.Reason)
						}
					case *failover.ManualFailoverAccepted:
						if e.ID == req.ID {
							accepted = true
							printFailoverAccepted(stdout, e)
							if took {
								return nil
							}
						}
					case *failover.PromotionRejected:
						if accepted {
							return fmt.Errorf("failover %s: the register moved before %s's compare-and-set (now revision %d, %v): nothing changed; see 'understudy status --pair %s'", req.ID, to, e.CurrentRev, e.Current, pair)
						}
					case *failover.AcquireFailed:
						if accepted {
							return fmt.Errorf("failover %s: %s could not write the register: %s", req.ID, to, e.Cause)
						}
					case *failover.PromoteFailed:
						if accepted {
							return fmt.Errorf("failover %s: %s took the register but its promotion failed: %s (it hands over to the other member)", req.ID, to, e.Detail)
						}
					}
				case e, ok := <-w.Updates():
					if !ok {
						return errors.New("watch of the leadership register ended")
					}
					if e.Revision == 0 {
						continue
					}
					if l, err := failover.DecodeLeader(e.Value); err == nil && !took && l.Site == to && !l.Fenced && l.Term > startTerm {
						took = true
						fmt.Fprintf(stdout, "%s now holds the register of pair %s (term %d)\n", to, pair, l.Term)
						if accepted {
							return nil
						}
						settle = time.After(time.Second)
					}
				case <-settle:
					return nil // it leads; the event stream is slow or not readable
				case <-deadline:
					if accepted {
						return fmt.Errorf("%s accepted failover %s but does not hold the register after %v; see 'understudy status --pair %s'", to, req.ID, wait, pair)
					}
					return fmt.Errorf("no answer from %s to failover %s within %v (is its member running, and a follower?); the request lapses; see 'understudy status --pair %s'", to, req.ID, wait, pair)
				}
			}
		},
	}
	nf.add(cmd)
	cmd.Flags().StringVar(&pair, "pair", "", "the pair")
	cmd.Flags().StringVar(&to, "to", "", "the site that should take over")
	cmd.Flags().BoolVar(&force, "force", false, "promote even when the lag rules forbid it (acknowledged commits may be lost)")
	cmd.Flags().DurationVar(&wait, "wait", 30*time.Second, "how long to wait; the request lapses after it")
	return cmd
}

func printFailoverAccepted(w io.Writer, e *failover.ManualFailoverAccepted) {
	fmt.Fprintf(w, "%s accepted: it takes the register (revision %d", e.To, e.LeaderRev)
	if e.Holder != "" {
		fmt.Fprintf(w, ", held by %s, silent for %v", e.Holder, e.Stale.Round(time.Millisecond))
	}
	fmt.Fprintln(w, ")")
	if e.Forced {
		fmt.Fprintf(w, "FORCED over: %s\n", e.Overrode)
		if e.Lag > 0 {
			fmt.Fprintf(w, "it may lose %d bytes of log (leader flushed %s, %s had %s), and what was committed after the leader's last register write\n",
				e.Lag, e.LeaderFlush, e.To, e.Receive)
		}
	}
}

// tailMemberEvents delivers the events of site's member from `from` on,
// until ctx ends. Without access to the event stream it delivers nothing.
func tailMemberEvents(ctx context.Context, nc *nats.Conn, pair, site string, from time.Time) <-chan events.Event {
	out := make(chan events.Event, 16) // a burst: accepted, attempted, promoted; the reader keeps up
	js, err := jetstream.New(nc)
	if err != nil {
		return out
	}
	evlog, err := events.NewJetStreamLog(js, runtime.DefaultEventsStream, runtime.Codec())
	if err != nil {
		return out
	}
	go func() {
		opts := events.ReadOptions{Subject: failover.Subject(pair, site), FromTime: from, Follow: true}
		for rec, err := range evlog.Read(ctx, opts) {
			if err != nil {
				return
			}
			ev, err := evlog.Codec().DecodeRecord(rec)
			if err != nil {
				continue
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}
