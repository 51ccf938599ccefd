package runtime

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"iter"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"understudy/actors/failover"
	"understudy/events"
)

// PairRecordOptions select one pair's record on a live JetStream: the
// failover bucket's messages for keys <pair>.> (register, heartbeats,
// config, switchover) and _live.> (the nodes' liveness records, node
// leadership), and the event stream's ev.failover.<pair>.> and
// ev.procedure.<pair>.>.
type PairRecordOptions struct {
	Pair   string
	Bucket string // failover KV bucket; DefaultFailoverBucket when empty
	Stream string // events stream; DefaultEventsStream when empty
	// From, when set, starts each source at its first message stored at or
	// after it; To, when set, ends each source before its first message
	// stored after it.
	From, To time.Time
	// Progress, when set, is called from the reading goroutine about every
	// progressEvery records and once at the end with the records read so
	// far and the number the sources held when the read began (all time,
	// ignoring From and To; 0 when unknown).
	Progress func(read int, total uint64)
}

// progressEvery is how often (in records) Progress is called.
const progressEvery = 4096

func (o PairRecordOptions) withDefaults() PairRecordOptions {
	if o.Bucket == "" {
		o.Bucket = DefaultFailoverBucket
	}
	if o.Stream == "" {
		o.Stream = DefaultEventsStream
	}
	return o
}

// pairSource is one stream and subject filter of a pair's record.
type pairSource struct {
	stream, filter string
}

func (o PairRecordOptions) sources() []pairSource {
	return []pairSource{
		{events.KVStream(o.Bucket), "$KV." + o.Bucket + "." + failover.NamesOf(o.Pair).Keys()},
		// Node leadership: the nodes' liveness records, which a holder's
		// lease lives in (a few writes a second per node in all).
		{events.KVStream(o.Bucket), "$KV." + o.Bucket + "." + failover.LivenessPrefix + ".>"},
		{o.Stream, failover.NamesOf(o.Pair).Members()},
		{o.Stream, failover.NamesOf(o.Pair).Procedures()},
	}
}

// Subjects names the sources as "stream:filter", for export headers.
func (o PairRecordOptions) Subjects() []string {
	var s []string
	for _, src := range o.withDefaults().sources() {
		s = append(s, src.stream+":"+src.filter)
	}
	return s
}

// pairBatch is a run of records from one source (a channel operation per
// batch, not per record).
type pairBatch struct {
	recs []events.Record
	err  error
}

// pairBatchSize is the number of records a source hands over at once;
// pairQueue is how many batches may wait per source, enough to keep each
// source's reader busy while the merge works on one batch.
const (
	pairBatchSize = 512
	pairQueue     = 4
)

// ReadPairRecords yields a pair's record in a deterministic order: by
// server timestamp, then stream name, then sequence — a merge of its
// sources, each read in stream order by its own ordered consumer
// (concurrently, so the caller's work on one record overlaps the reading
// of the next). The read ends after the messages present when it began.
// Records are the caller's to keep. A non-nil error ends the iteration.
func ReadPairRecords(ctx context.Context, js jetstream.JetStream, opts PairRecordOptions) iter.Seq2[events.Record, error] {
	opts = opts.withDefaults()
	return func(yield func(events.Record, error) bool) {
		if opts.Pair == "" || strings.ContainsAny(opts.Pair, "*> ") {
			yield(events.Record{}, fmt.Errorf("runtime: read pair records: invalid pair %q", opts.Pair))
			return
		}
		srcs := opts.sources()
		var total uint64
		if opts.Progress != nil {
			// A subject-filtered count costs the server a scan: only for progress.
			total = countSources(ctx, js, srcs)
		}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		chans := make([]chan pairBatch, len(srcs))
		frees := make([]chan []events.Record, len(srcs))
		for i, src := range srcs {
			l, err := events.NewJetStreamLog(js, src.stream, Codec())
			if err != nil {
				yield(events.Record{}, fmt.Errorf("runtime: read pair %s: %w", opts.Pair, err))
				return
			}
			chans[i] = make(chan pairBatch, pairQueue)
			frees[i] = make(chan []events.Record, pairQueue+1)
			go readSource(ctx, l, src.filter, opts, chans[i], frees[i])
		}
		// Merge: the head of each source, smallest (time, stream, sequence) first.
		type head struct {
			batch []events.Record
			i     int
			done  bool
		}
		heads := make([]head, len(srcs))
		next := func(k int) error {
			h := &heads[k]
			for !h.done && h.i >= len(h.batch) {
				if h.batch != nil {
					select { // hand the spent batch back for reuse
					case frees[k] <- h.batch[:0]:
					default:
					}
					h.batch = nil
				}
				b, ok := <-chans[k]
				if !ok {
					h.done = true
					break
				}
				if b.err != nil {
					return b.err
				}
				h.batch, h.i = b.recs, 0
			}
			return nil
		}
		for k := range heads {
			if err := next(k); err != nil {
				yield(events.Record{}, err)
				return
			}
		}
		n := 0
		for {
			best := -1
			for k := range heads {
				h := &heads[k]
				if h.done {
					continue
				}
				if best < 0 || before(h.batch[h.i], heads[best].batch[heads[best].i]) {
					best = k
				}
			}
			if best < 0 {
				break
			}
			h := &heads[best]
			rec := h.batch[h.i]
			h.batch[h.i] = events.Record{}
			h.i++
			if !yield(rec, nil) {
				return
			}
			n++
			if opts.Progress != nil && n%progressEvery == 0 {
				opts.Progress(n, total)
			}
			if err := next(best); err != nil {
				yield(events.Record{}, err)
				return
			}
		}
		if opts.Progress != nil {
			opts.Progress(n, total)
		}
	}
}

// before orders records by (time, stream, sequence).
func before(a, b events.Record) bool {
	if c := a.Time.Compare(b.Time); c != 0 {
		return c < 0
	}
	if c := cmp.Compare(a.Stream, b.Stream); c != 0 {
		return c < 0
	}
	return a.Sequence < b.Sequence
}

// readSource reads one source into batches on out, which it closes,
// reusing the spent batches the merge hands back on free.
func readSource(ctx context.Context, l *events.JetStreamLog, filter string, opts PairRecordOptions, out chan<- pairBatch, free <-chan []events.Record) {
	defer close(out)
	send := func(b pairBatch) bool {
		select {
		case out <- b:
			return true
		case <-ctx.Done():
			return false
		}
	}
	batch := make([]events.Record, 0, pairBatchSize)
	for rec, err := range l.Read(ctx, events.ReadOptions{Subject: filter, FromTime: opts.From}) {
		if err != nil {
			if ctx.Err() == nil {
				send(pairBatch{err: fmt.Errorf("runtime: read %s of stream %s: %w", filter, l.Stream(), err)})
			}
			return
		}
		if !opts.To.IsZero() && rec.Time.After(opts.To) {
			break
		}
		batch = append(batch, rec)
		if len(batch) == pairBatchSize {
			if !send(pairBatch{recs: batch}) {
				return
			}
			select {
			case batch = <-free:
			default:
				batch = make([]events.Record, 0, pairBatchSize)
			}
		}
	}
	if len(batch) > 0 {
		send(pairBatch{recs: batch})
	}
}

// countSources returns how many messages the sources hold (0 if unknown).
func countSources(ctx context.Context, js jetstream.JetStream, srcs []pairSource) uint64 {
	var total uint64
	for _, src := range srcs {
		s, err := js.Stream(ctx, src.stream)
		if err != nil {
			return 0
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(src.filter))
		if err != nil {
			return 0
		}
		for _, n := range info.State.Subjects {
			total += n
		}
	}
	return total
}

// ExportPair writes a pair's record (ReadPairRecords) as an export file to
// out: header (source, pair, window, and in Meta the bucket, stream and
// subjects), the records, the trailer. It returns the number of records
// written. It does not close out.
func ExportPair(ctx context.Context, js jetstream.JetStream, opts PairRecordOptions, source string, out io.Writer) (int, error) {
	opts = opts.withDefaults()
	h := events.ExportHeader{
		Created: time.Now().UTC(), Source: source, Pair: opts.Pair, From: opts.From, To: opts.To,
		Meta: map[string]string{
			"bucket":   opts.Bucket,
			"stream":   opts.Stream,
			"subjects": strings.Join(opts.Subjects(), " "),
			"order":    "server time, then stream name, then sequence",
			"version":  Version,
		},
	}
	w, err := events.NewExportWriter(out, h)
	if err != nil {
		return 0, err
	}
	for rec, err := range ReadPairRecords(ctx, js, opts) {
		if err != nil {
			return w.Count(), err
		}
		if err := w.Write(rec); err != nil {
			return w.Count(), err
		}
	}
	if err := w.Close(); err != nil {
		return w.Count(), err
	}
	return w.Count(), nil
}
