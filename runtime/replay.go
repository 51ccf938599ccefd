package runtime

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"understudy/actors/failover"
	"understudy/events"
)

// replayed is one member's state machine folded from its own subject
// before its actor starts. It is taken once: an actor restarted later
// reads its log afresh.
type replayed struct {
	m     *failover.Member
	last  uint64 // the subject's last sequence
	n     int    // events folded
	taken atomic.Bool
}

// take returns r the first time it is called, nil afterwards (and on a
// nil r).
func (r *replayed) take() *replayed {
	if r == nil || r.taken.Swap(true) {
		return nil
	}
	return r
}

// bulkReplayMin is the number of a host's members on one site from which
// the host replays their subjects with one read of the site's subjects
// (ev.failover.*.<site>) before starting them, rather than one read (one
// consumer) per member as each starts: a node with thousands of members
// otherwise starts one member after another, each waiting for its own
// consumer.
const bulkReplayMin = 16

// bulkReplayTimeout bounds one site's read. A read that does not finish
// in time (or fails) replays nothing: those members read their own
// subjects as they start, as a member added later does.
const bulkReplayTimeout = 2 * time.Minute

// replayMembers folds each slot's subject into a fresh state machine of
// its member (slot.deps.replayed), one read per site with at least
// bulkReplayMin members. A slot whose member refuses its rules is left
// alone: its actor reports the refusal as it starts.
func replayMembers(ctx context.Context, log events.Log, slots []*memberSlot, logger *slog.Logger) {
	bySite := map[string][]*memberSlot{}
	for _, sl := range slots {
		bySite[sl.cfg.Site] = append(bySite[sl.cfg.Site], sl)
	}
	for site, group := range bySite {
		if len(group) < bulkReplayMin {
			continue
		}
		began := time.Now()
		bySubject := make(map[string]*replayed, len(group))
		for _, sl := range group {
			m, err := memberMachine(sl.cfg)
			if err != nil {
				continue
			}
			bySubject[failover.Subject(sl.cfg.Rules.Pair, sl.cfg.Site)] = &replayed{m: m}
		}
		records, folded, others, err := readSite(ctx, log, site, bySubject, logger)
		if err != nil {
			logger.Warn("members' logs not read in one pass at start; each member reads its own as it starts",
				"site", site, "members", len(group), "err", err, "after", time.Since(began))
			continue
		}
		for _, sl := range group {
			sl.deps.replayed = bySubject[failover.Subject(sl.cfg.Rules.Pair, sl.cfg.Site)]
		}
		logger.Info("members replayed their logs in one pass", "site", site, "members", len(group),
			"records", records, "events", folded, "other_records", others, "took", time.Since(began))
	}
}

// readSite reads every record on the site's member subjects once and
// folds each into its member's machine; records of members this host
// does not run are counted and passed over.
func readSite(ctx context.Context, log events.Log, site string, bySubject map[string]*replayed, logger *slog.Logger) (records, folded, others int, err error) {
	rctx, cancel := context.WithTimeout(ctx, bulkReplayTimeout)
	defer cancel()
	codec := log.Codec()
	for rec, rerr := range log.Read(rctx, events.ReadOptions{Subject: failover.Subject("*", site)}) {
		if rerr != nil {
			return records, folded, others, rerr
		}
		records++
		r, ok := bySubject[rec.Subject]
		if !ok {
			others++
			continue
		}
		r.last = rec.Sequence
		if foldRecord(r.m, codec, rec, logger) { // its warnings name the subject
			r.n++
			folded++
		}
	}
	return records, folded, others, nil
}
