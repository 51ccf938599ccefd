package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"understudy/actors/failover"
	"understudy/events"
	"understudy/projections"
	"understudy/runtime"
)

// eventCounts counts the failover events of a window by "type@site"
// (failover.promoted@site-b: takeovers by the replica).
type eventCounts map[string]int

// readEventCounts reads the failover events stored in [from, to).
func readEventCounts(ctx context.Context, js jetstream.JetStream, from, to time.Time) (eventCounts, error) {
	out := eventCounts{}
	err := readFailoverEvents(ctx, js, from, func(rec events.Record, pair, site string, ev events.Event) bool {
		if !rec.Time.Before(to) {
			return false
		}
		out[ev.EventType()+"@"+site]++
		return true
	})
	return out, err
}

// readFailoverEvents calls fn with every failover event stored from from
// on (subjects ev.failover.<pair>.<site>) until fn returns false.
func readFailoverEvents(ctx context.Context, js jetstream.JetStream, from time.Time, fn func(rec events.Record, pair, site string, ev events.Event) bool) error {
	l, err := events.NewJetStreamLog(js, eventsStream, runtime.Codec())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for rec, err := range l.Read(ctx, events.ReadOptions{Subject: "ev.failover.>", FromTime: from}) {
		if err != nil {
			return fmt.Errorf("read events: %w", err)
		}
		parts := strings.Split(rec.Subject, ".")
		if len(parts) != 4 {
			continue
		}
		ev, err := l.Codec().DecodeRecord(rec)
		if err != nil {
			continue // counted nowhere: the replay reports unreadable records
		}
		if !fn(rec, parts[2], parts[3], ev) {
			return nil
		}
	}
	return nil
}

// takeover is what the record says of one pair's failover after the kill.
type takeover struct {
	lastBeat time.Time // site-a's last write that kept the pair (register or liveness) before the kill
	acquired time.Time // the first register value naming site-b after the kill
	serving  time.Time // site-b's member started serving (failover.serving_started)
}

// readTakeovers reads the register writes and the events stored since
// from (a little before the kill) and dates each pair's takeover by
// site-b. Pairs site-a did not hold at the kill are left out by the caller.
func readTakeovers(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, from, kill time.Time) (map[string]*takeover, error) {
	out := map[string]*takeover{}
	get := func(pair string) *takeover {
		t := out[pair]
		if t == nil {
			t = &takeover{}
			out[pair] = t
		}
		return t
	}
	var lastLive time.Time // site-a's node liveness record, in node mode
	err := readKV(ctx, nc, from, func(rec kvRecord) {
		if node, ok := strings.CutPrefix(rec.key, "_live."); ok {
			if node == siteA && rec.time.Before(kill) {
				lastLive = rec.time
			}
			return
		}
		pair, ok := strings.CutSuffix(rec.key, ".leader")
		if !ok || rec.data == nil {
			return
		}
		l, err := failover.DecodeLeader(rec.data)
		if err != nil {
			return
		}
		t := get(pair)
		switch {
		case l.Site == siteA && rec.time.Before(kill):
			t.lastBeat = rec.time
		case l.Site == siteB && !rec.time.Before(kill) && t.acquired.IsZero():
			t.acquired = rec.time
		}
	})
	if err != nil {
		return nil, err
	}
	if !lastLive.IsZero() {
		for _, t := range out {
			if lastLive.After(t.lastBeat) {
				t.lastBeat = lastLive
			}
		}
	}
	err = readFailoverEvents(ctx, js, kill, func(rec events.Record, pair, site string, ev events.Event) bool {
		if _, ok := ev.(*failover.ServingStarted); ok && site == siteB {
			if t := get(pair); t.serving.IsZero() {
				t.serving = rec.Occurred()
			}
		}
		return true
	})
	return out, err
}

// splitBrains replays each pair's record over [from, to] as `understudy
// replay` does and returns the reports of the pairs whose two members
// served at once, and the failovers the replay found (takeovers of a
// stale holder) in all pairs.
func splitBrains(ctx context.Context, js jetstream.JetStream, pairs []string, from, to time.Time, progress func(done int)) (split map[string]*projections.Report, failovers int, err error) {
	split = map[string]*projections.Report{}
	const workers = 4 // the store is the bottleneck; more only queue there
	var (
		mu   sync.Mutex
		done int
		errs []error
		wg   sync.WaitGroup
	)
	next := make(chan string)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for pair := range next {
				rep, err := replayPair(ctx, js, pair, from, to)
				mu.Lock()
				done++
				if err != nil {
					errs = append(errs, err)
				} else {
					failovers += len(rep.Failovers)
					if len(rep.SplitBrain) > 0 {
						split[pair] = rep
					}
				}
				if progress != nil {
					progress(done)
				}
				mu.Unlock()
			}
		}()
	}
	for _, p := range pairs {
		select {
		case next <- p:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		return split, failovers, fmt.Errorf("replay: %d of %d pairs failed, the first: %w", len(errs), len(pairs), errs[0])
	}
	return split, failovers, ctx.Err()
}

func replayPair(ctx context.Context, js jetstream.JetStream, pair string, from, to time.Time) (*projections.Report, error) {
	fold, err := projections.NewFold(projections.Options{Pair: pair, Bucket: failoverBucket, Codec: runtime.Codec(), From: from, To: to, Source: "bench-pairs"})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for rec, err := range runtime.ReadPairRecords(ctx, js, runtime.PairRecordOptions{Pair: pair, Bucket: failoverBucket, Stream: eventsStream, To: to}) {
		if err != nil {
			return nil, fmt.Errorf("pair %s: %w", pair, err)
		}
		fold.Add(rec)
	}
	return fold.Report(), nil
}
