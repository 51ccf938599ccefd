package events

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// lookupTimeout bounds the stream lookup of NewJetStreamLog, which has no
// context of its own.
const lookupTimeout = 10 * time.Second

// cleanupTimeout bounds the deletion of a finished read's ordered consumer.
const cleanupTimeout = 2 * time.Second

// Read tuning. The client keeps up to readPullMax messages requested from
// the server (asking for more at half of it), and hands records from the
// NATS dispatcher goroutine to the reading goroutine readBatchSize at a
// time, so the per-record cost is a slice append, not a channel operation.
const (
	readPullMax   = 4096
	readBatchSize = 256
	// readQueue is the number of filled batches that may wait for the
	// reader: enough to keep the dispatcher busy while the reader works on
	// one batch; with the pull it bounds a slow reader's backlog to
	// readPullMax + readQueue*readBatchSize records.
	readQueue = 4
)

// JetStreamLog is the Log on a NATS JetStream stream. The stream must exist
// (the runtime provisions it); every subject appended to must be one of its
// subjects. It is safe for concurrent use.
type JetStreamLog struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	name   string
	codec  *Registry
	// atomic: the stream allows atomic batch publish (checked when
	// opened); without it AppendBatch answers ErrBatchUnsupported.
	atomic bool
}

var _ LogBatcher = (*JetStreamLog)(nil)

// NewJetStreamLog returns the Log on the existing stream named stream,
// encoding and decoding events with codec (kept, not copied).
func NewJetStreamLog(js jetstream.JetStream, stream string, codec *Registry) (*JetStreamLog, error) {
	if js == nil {
		return nil, errors.New("events: NewJetStreamLog: nil JetStream context")
	}
	if codec == nil {
		return nil, errors.New("events: NewJetStreamLog: nil codec; pass the Registry the events are registered in")
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("events: stream %q does not exist; provision it before opening the log: %w", stream, err)
		}
		return nil, fmt.Errorf("events: look up stream %q: %w", stream, err)
	}
	return &JetStreamLog{js: js, stream: s, name: stream, codec: codec, atomic: s.CachedInfo().Config.AllowAtomicPublish}, nil
}

// Stream is the name of the underlying JetStream stream.
func (l *JetStreamLog) Stream() string { return l.name }

// Codec implements Log.
func (l *JetStreamLog) Codec() *Registry { return l.codec }

// Append implements Log.
func (l *JetStreamLog) Append(ctx context.Context, subject string, ev Event, opts AppendOptions) (Ack, error) {
	data, err := l.codec.Encode(ev)
	if err != nil {
		return Ack{}, err
	}
	return l.AppendRaw(ctx, subject, data, opts)
}

// AppendRaw implements Log. The stored message carries opts.Headers and,
// as JetStream keeps them, Nats-Msg-Id and
// Nats-Expected-Last-Subject-Sequence. data is not kept after the call.
func (l *JetStreamLog) AppendRaw(ctx context.Context, subject string, data []byte, opts AppendOptions) (Ack, error) {
	msg := &nats.Msg{Subject: subject, Data: data, Header: appendHeaders(opts, 0)}
	var pubOpts []jetstream.PublishOpt
	if opts.ExpectSet {
		pubOpts = append(pubOpts, jetstream.WithExpectLastSequencePerSubject(opts.ExpectLastSubjectSeq))
	}
	if opts.MsgID != "" {
		pubOpts = append(pubOpts, jetstream.WithMsgID(opts.MsgID))
	}
	pa, err := l.js.PublishMsg(ctx, msg, pubOpts...)
	if err != nil {
		err = mapJetStreamError(err)
		if errors.Is(err, ErrConflict) && opts.ExpectSet && opts.MsgID != "" {
			if ack, ok := l.findRetried(ctx, subject, opts); ok {
				return ack, nil
			}
		}
		return Ack{}, fmt.Errorf("events: append to %q in stream %q: %w", subject, l.name, err)
	}
	if pa.Stream != l.name {
		// Not refused up front with Nats-Expected-Stream: that header would
		// be stored with every record.
		return Ack{}, fmt.Errorf("events: append to %q: stored in stream %q (sequence %d), not in %q; the subject belongs to another stream", subject, pa.Stream, pa.Sequence, l.name)
	}
	return Ack{Sequence: pa.Sequence, Duplicate: pa.Duplicate}, nil
}

// appendHeaders are an append's stored headers (opts.Headers; with
// extra > 0, room for as many more), nil when there are none.
func appendHeaders(opts AppendOptions, extra int) nats.Header {
	if len(opts.Headers)+extra == 0 {
		return nil
	}
	// Written directly, not with Header.Set, so keys keep their case.
	h := make(nats.Header, len(opts.Headers)+extra)
	for k, v := range opts.Headers {
		h[k] = []string{v}
	}
	return h
}

// Batches implements LogBatcher.
func (l *JetStreamLog) Batches() bool { return l.atomic }

// AppendBatch implements LogBatcher with one JetStream atomic batch: each
// append is a message on its subject with its headers, message id and
// expectation, as AppendRaw sends it, plus the batch's; the server checks
// every one before it stores any, and syncs the batch to disk once. The
// stream must allow atomic publish (provisioning sets allow_atomic on
// understudy's events stream). data is not kept after the call.
func (l *JetStreamLog) AppendBatch(ctx context.Context, appends []LogAppend) ([]Ack, error) {
	if err := CheckLogBatch(appends); err != nil {
		return nil, err
	}
	what := fmt.Sprintf("batch of %d appends in stream %q", len(appends), l.name)
	if !l.atomic {
		return nil, fmt.Errorf("events: %s: %w (the stream does not allow atomic publish)", what, ErrBatchUnsupported)
	}
	msgs := make([]*nats.Msg, len(appends))
	for i, a := range appends {
		if err := memCheckSubject(a.Subject, false); err != nil {
			return nil, err
		}
		m := &nats.Msg{Subject: a.Subject, Data: a.Data, Header: appendHeaders(a.Opts, 4)}
		if a.Opts.ExpectSet {
			m.Header[jetstream.ExpectedLastSubjSeqHeader] = []string{strconv.FormatUint(a.Opts.ExpectLastSubjectSeq, 10)}
		}
		if a.Opts.MsgID != "" {
			m.Header[jetstream.MsgIDHeader] = []string{a.Opts.MsgID}
		}
		msgs[i] = m
	}
	seqs, err := publishBatch(ctx, l.js.Conn(), what, l.name, msgs)
	if err != nil {
		return nil, err
	}
	acks := make([]Ack, len(seqs))
	for i, s := range seqs {
		acks[i] = Ack{Sequence: s}
	}
	return acks, nil
}

// findRetried recognises the retry of an append that already landed. A
// single (non-clustered) server checks the expected subject sequence before
// the dedup window, so the retry of a conditional append whose first attempt
// succeeded comes back as 10071 where a clustered stream answers duplicate;
// past the dedup window every server does. The first attempt, if it landed,
// is the first record on subject after the expected sequence; if it carries
// the same Nats-Msg-Id this is a retry, however long ago it landed (a
// partition can hold an appender's retries for longer than the window).
func (l *JetStreamLog) findRetried(ctx context.Context, subject string, opts AppendOptions) (Ack, bool) {
	m, err := l.stream.GetMsg(ctx, opts.ExpectLastSubjectSeq+1, jetstream.WithGetMsgSubject(subject))
	if err != nil || m.Subject != subject {
		return Ack{}, false
	}
	if m.Header.Get(jetstream.MsgIDHeader) != opts.MsgID {
		return Ack{}, false
	}
	return Ack{Sequence: m.Sequence, Duplicate: true}, true
}

// LastSequence implements Log.
func (l *JetStreamLog) LastSequence(ctx context.Context, subject string) (uint64, error) {
	if subject == "" || strings.ContainsAny(subject, "*>") {
		return 0, fmt.Errorf("events: last sequence of %q: a single subject without wildcards is required", subject)
	}
	m, err := l.stream.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return 0, nil
		}
		return 0, fmt.Errorf("events: last sequence of %q in stream %q: %w", subject, l.name, mapJetStreamError(err))
	}
	return m.Sequence, nil
}

// Record implements Log with one message get (a direct get where the
// stream allows it).
func (l *JetStreamLog) Record(ctx context.Context, seq uint64) (Record, error) {
	if seq == 0 {
		return Record{}, fmt.Errorf("events: record 0 of stream %q: %w", l.name, ErrNotFound)
	}
	m, err := l.stream.GetMsg(ctx, seq)
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return Record{}, fmt.Errorf("events: record %d of stream %q: %w", seq, l.name, ErrNotFound)
		}
		return Record{}, fmt.Errorf("events: record %d of stream %q: %w", seq, l.name, mapJetStreamError(err))
	}
	return Record{Stream: l.name, Subject: m.Subject, Sequence: m.Sequence, Time: m.Time.UTC(),
		Headers: copyHeaders(m.Header), Data: m.Data}, nil
}

// RecordOn implements Log with one message get of the next record on
// subject.
func (l *JetStreamLog) RecordOn(ctx context.Context, subject string, from uint64) (Record, error) {
	if subject == "" || strings.ContainsAny(subject, "*>") {
		return Record{}, fmt.Errorf("events: record on %q: a single subject without wildcards is required: %w", subject, ErrInvalid)
	}
	m, err := l.stream.GetMsg(ctx, max(from, 1), jetstream.WithGetMsgSubject(subject))
	if err != nil {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return Record{}, fmt.Errorf("events: no record on %q from %d in stream %q: %w", subject, from, l.name, ErrNotFound)
		}
		return Record{}, fmt.Errorf("events: record on %q from %d in stream %q: %w", subject, from, l.name, mapJetStreamError(err))
	}
	if m.Subject != subject {
		return Record{}, fmt.Errorf("events: record on %q from %d in stream %q: the server answered with a record on %q", subject, from, l.name, m.Subject)
	}
	return Record{Stream: l.name, Subject: m.Subject, Sequence: m.Sequence, Time: m.Time.UTC(),
		Headers: copyHeaders(m.Header), Data: m.Data}, nil
}

// Read implements Log with an ordered consumer (ephemeral, in memory,
// recreated by the client on a gap), deleted when the read ends. Records
// are not decoded; Data and Subject are the client's own copies and may be
// kept.
func (l *JetStreamLog) Read(ctx context.Context, opts ReadOptions) iter.Seq2[Record, error] {
	return func(yield func(Record, error) bool) {
		cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
		if opts.Subject != "" {
			cfg.FilterSubjects = []string{opts.Subject}
		}
		switch {
		case !opts.FromTime.IsZero():
			t := opts.FromTime.UTC()
			cfg.DeliverPolicy = jetstream.DeliverByStartTimePolicy
			cfg.OptStartTime = &t
		case opts.FromSeq > 1:
			cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
			cfg.OptStartSeq = opts.FromSeq
		}
		fail := func(err error) {
			if opts.Follow && ctx.Err() != nil {
				return // a followed read simply stops
			}
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			yield(Record{}, err)
		}

		cons, err := l.stream.OrderedConsumer(ctx, cfg)
		if err != nil {
			fail(fmt.Errorf("events: read stream %q: %w", l.name, mapJetStreamError(err)))
			return
		}
		// A gap makes the client recreate the consumer under a new name:
		// delete whichever is current when the read ends.
		defer func() { l.deleteConsumer(cons.CachedInfo().Name) }()
		info := cons.CachedInfo()
		// The consumer is created at one point of the stream: what it counts
		// as pending then is exactly the records present at the start.
		if !opts.Follow && info.NumPending == 0 {
			return
		}

		r := newLogReader(l.name)
		cc, err := cons.Consume(r.handle,
			jetstream.PullMaxMessages(readPullMax),
			jetstream.ConsumeErrHandler(r.handleErr))
		if err != nil {
			fail(fmt.Errorf("events: read stream %q: %w", l.name, err))
			return
		}
		defer func() {
			close(r.done) // unblocks a handler waiting to hand a batch over
			cc.Stop()
		}()

		remaining := info.NumPending
		for {
			var b readBatch
			select {
			case b = <-r.batches:
			case err := <-r.errs:
				fail(fmt.Errorf("events: read stream %q: %w", l.name, err))
				return
			case <-ctx.Done():
				fail(ctx.Err())
				return
			}
			for _, rec := range b.recs {
				if err := ctx.Err(); err != nil {
					fail(err)
					return
				}
				if !yield(rec, nil) {
					return
				}
				// Records deleted by limits while reading make the count
				// overshoot; the pending==0 mark below still ends the read.
				if remaining--; !opts.Follow && remaining == 0 {
					return
				}
			}
			if !opts.Follow && b.caughtUp {
				return
			}
			r.recycle(b.recs)
		}
	}
}

// deleteConsumer removes a finished read's ordered consumer at once rather
// than leaving it to the server's inactivity threshold.
func (l *JetStreamLog) deleteConsumer(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := l.js.DeleteConsumer(ctx, l.name, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		slog.Debug("events: delete read consumer", "stream", l.name, "consumer", name, "err", err)
	}
}

// readBatch is a run of records handed from the NATS dispatcher to the
// reading goroutine. caughtUp is set when its last record had nothing
// pending after it.
type readBatch struct {
	recs     []Record
	caughtUp bool
}

// logReader collects records on the NATS dispatcher goroutine.
type logReader struct {
	stream  string
	batches chan readBatch // see readQueue
	free    chan []Record  // recycled batch slices, same bound as batches
	errs    chan error     // size one: the first terminal error is enough
	done    chan struct{}  // closed when the reader is gone

	// mu guards cur: after an ordered-consumer reset the handler of the old
	// subscription may still be running while the new one starts.
	mu  sync.Mutex
	cur []Record
}

func newLogReader(stream string) *logReader {
	return &logReader{
		stream:  stream,
		batches: make(chan readBatch, readQueue),
		free:    make(chan []Record, readQueue+1),
		errs:    make(chan error, 1),
		done:    make(chan struct{}),
	}
}

func (r *logReader) handle(msg jetstream.Msg) {
	meta, ok := parseAckReply(msg.Reply())
	if !ok {
		r.handleErr(nil, fmt.Errorf("%w: reply subject %q", jetstream.ErrNotJSMessage, msg.Reply()))
		return
	}
	rec := Record{
		Stream:   r.stream,
		Subject:  msg.Subject(),
		Sequence: meta.streamSeq,
		Time:     meta.time,
		Headers:  copyHeaders(msg.Headers()),
		Data:     msg.Data(),
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur == nil {
		select {
		case r.cur = <-r.free:
		default:
			r.cur = make([]Record, 0, readBatchSize)
		}
	}
	r.cur = append(r.cur, rec)
	if len(r.cur) < readBatchSize && meta.pending > 0 {
		return
	}
	b := readBatch{recs: r.cur, caughtUp: meta.pending == 0}
	r.cur = nil
	select {
	case r.batches <- b:
	case <-r.done:
	}
}

// handleErr keeps the errors that end a read. The ordered consumer recovers
// from the others (missed heartbeats, gaps, a deleted consumer) itself.
func (r *logReader) handleErr(_ jetstream.ConsumeContext, err error) {
	if errors.Is(err, jetstream.ErrConnectionClosed) || errors.Is(err, jetstream.ErrNotJSMessage) ||
		errors.Is(err, jetstream.ErrStreamNotFound) {
		select {
		case r.errs <- err:
		default:
		}
		return
	}
	slog.Debug("events: read consumer recovering", "stream", r.stream, "err", err)
}

func (r *logReader) recycle(recs []Record) {
	clear(recs) // drop references to the yielded records' data
	select {
	case r.free <- recs[:0]:
	default:
	}
}

// copyHeaders returns the first value of each header, or nil when there are
// none.
func copyHeaders(h nats.Header) map[string]string {
	if len(h) == 0 {
		return nil
	}
	m := make(map[string]string, len(h))
	for k, vs := range h {
		if len(vs) > 0 {
			m[k] = vs[0]
		} else {
			m[k] = ""
		}
	}
	return m
}

// ackMeta is what a JetStream delivery carries in its reply subject.
type ackMeta struct {
	streamSeq uint64
	time      time.Time // UTC
	pending   uint64
}

// parseAckReply reads a JetStream reply subject in one pass, without
// allocating:
//
//	$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
//	$JS.ACK.<domain>.<acc>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>[.<token>...]
func parseAckReply(reply string) (ackMeta, bool) {
	const prefix = "$JS.ACK."
	if len(reply) < len(prefix) || reply[:len(prefix)] != prefix {
		return ackMeta{}, false
	}
	// Token boundaries after the prefix: starts[i] is where token i begins.
	var starts [13]int
	n := 1
	starts[0] = len(prefix)
	for i := len(prefix); i < len(reply) && n < len(starts); i++ {
		if reply[i] == '.' {
			starts[n] = i + 1
			n++
		}
	}
	token := func(i int) string {
		end := len(reply)
		if i+1 < n {
			end = starts[i+1] - 1
		}
		return reply[starts[i]:end]
	}
	first := 3 // index of <sseq>: after stream, consumer, delivered
	switch {
	case n == 7:
	case n >= 9:
		first = 5 // after domain, account hash, stream, consumer, delivered
	default:
		return ackMeta{}, false
	}
	seq, ok1 := parseUint(token(first))
	nanos, ok2 := parseUint(token(first + 2))
	np, ok3 := parseUint(token(first + 3))
	if !ok1 || !ok2 || !ok3 {
		return ackMeta{}, false
	}
	return ackMeta{streamSeq: seq, time: time.Unix(0, int64(nanos)).UTC(), pending: np}, true
}

func parseUint(s string) (uint64, bool) {
	if s == "" || len(s) > 20 {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		d := uint64(c - '0')
		if n > (^uint64(0)-d)/10 {
			return 0, false
		}
		n = n*10 + d
	}
	return n, true
}

// mapJetStreamError gives NATS errors the events identities: a lost
// compare-and-set (10071, including the KV client's ErrKeyExists and
// ErrKeyRevisionMismatch for it) wraps ErrConflict; an earlier write to the
// subject still being proposed (10164, which the KV client wraps in the
// same sentinels) wraps ErrInFlight; a missing key or message wraps
// ErrNotFound. The API error code is looked at before the KV sentinels, so
// 10164 is never taken for a lost CAS. The NATS error stays in the chain
// and in the message. Other errors are returned unchanged.
func mapJetStreamError(err error) error {
	if err == nil {
		return nil
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeStreamWrongLastSequenceConstant:
			return fmt.Errorf("%w: %w", ErrInFlight, err)
		case jetstream.JSErrCodeStreamWrongLastSequence:
			return fmt.Errorf("%w: %w", ErrConflict, err)
		}
	}
	switch {
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		return fmt.Errorf("%w: %w", ErrConflict, err)
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted),
		errors.Is(err, jetstream.ErrMsgNotFound):
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case errors.Is(err, jetstream.ErrInvalidKey), errors.Is(err, jetstream.ErrInvalidSubject):
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return err
}
