package events

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sort"
	"strconv"
	"sync"
	"time"
)

// This file holds the in-memory Log and KV. They reproduce the JetStream
// semantics understudy relies on (per-subject expectations, dedup window, KV
// history and revisions, wildcard filters, watch markers) with timestamps from
// an injected Clock, so unit tests and the deterministic simulator see what a
// real server would do. Every state transition is a plain method under one
// mutex; the only goroutine is the pump behind KV.Watch, and a followed Read
// blocks on a channel in the caller's goroutine.

// Clock is the source of server timestamps for the in-memory stores. Its Now
// may be called from any goroutine that uses the store.
type Clock interface {
	Now() time.Time
}

// SystemClock reads the wall clock. It is what a real server would use.
type SystemClock struct{}

// Now implements Clock.
func (SystemClock) Now() time.Time { return time.Now() }

// ManualClock is a Clock that moves only when told to. It is safe for
// concurrent use. The zero value reads the zero time; use NewManualClock.
type ManualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewManualClock returns a clock reading start.
func NewManualClock(start time.Time) *ManualClock { return &ManualClock{now: start} }

// Now implements Clock.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set makes the clock read t. It may move the clock backwards, as a server's
// clock can jump.
func (c *ManualClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// Advance moves the clock by d and returns the new reading.
func (c *ManualClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// memDefaultDedupWindow is JetStream's default duplicate window.
const memDefaultDedupWindow = 2 * time.Minute

// The headers JetStream keeps on a stored message when the publish carried
// these options; the in-memory log stores them the same way.
const (
	memHeaderMsgID          = "Nats-Msg-Id"
	memHeaderExpectedSubSeq = HeaderExpectedLastSubjectSeq
)

// memReadBatch bounds how many records or entries are copied under the lock
// at once, so a long read does not hold writers off.
const memReadBatch = 256

// MemoryLogOption configures NewMemoryLog.
type MemoryLogOption func(*MemoryLog)

// MemoryDedupWindow sets how long, in clock time, a MsgID is remembered
// (JetStream's stream setting Duplicates). Non-positive values keep the
// default of two minutes, as a zero Duplicates does on a NATS stream.
func MemoryDedupWindow(d time.Duration) MemoryLogOption {
	return func(l *MemoryLog) {
		if d > 0 {
			l.dedupWindow = d
		}
	}
}

type memDedupEntry struct {
	seq uint64
	at  time.Time
}

// MemoryLog is the in-memory Log: one stream with limits retention and no
// limits, stamped by its Clock. Safe for concurrent use.
type MemoryLog struct {
	name        string
	clock       Clock
	codec       *Registry
	dedupWindow time.Duration

	mu            sync.Mutex
	records       []Record // records[i].Sequence == i+1; never modified once stored
	lastBySubject map[string]uint64
	timesOrdered  bool // record times are non-decreasing, so FromTime can binary search
	dedup         map[string]memDedupEntry
	dedupOrder    []string      // ids in the order stored, for expiry
	changed       chan struct{} // closed and replaced by every append
}

var _ LogBatcher = (*MemoryLog)(nil)

// NewMemoryLog returns an empty log named name (the Stream of its records)
// that stamps records with clock (nil: SystemClock) and encodes with codec.
func NewMemoryLog(name string, clock Clock, codec *Registry, opts ...MemoryLogOption) *MemoryLog {
	if clock == nil {
		clock = SystemClock{}
	}
	l := &MemoryLog{
		name:          name,
		clock:         clock,
		codec:         codec,
		dedupWindow:   memDefaultDedupWindow,
		lastBySubject: map[string]uint64{},
		timesOrdered:  true,
		dedup:         map[string]memDedupEntry{},
		changed:       make(chan struct{}),
	}
	for _, o := range opts {
		o(l)
	}
	return l
}

// Name is the stream name stamped on every record.
func (l *MemoryLog) Name() string { return l.name }

// Codec implements Log.
func (l *MemoryLog) Codec() *Registry { return l.codec }

// Append implements Log.
func (l *MemoryLog) Append(ctx context.Context, subject string, ev Event, opts AppendOptions) (Ack, error) {
	if err := ctx.Err(); err != nil {
		return Ack{}, err
	}
	data, err := l.codec.Encode(ev)
	if err != nil {
		return Ack{}, err
	}
	return l.store(subject, data, opts)
}

// AppendRaw implements Log. data is copied.
func (l *MemoryLog) AppendRaw(ctx context.Context, subject string, data []byte, opts AppendOptions) (Ack, error) {
	if err := ctx.Err(); err != nil {
		return Ack{}, err
	}
	return l.store(subject, data, opts)
}

// retriedLocked recognises, as JetStreamLog does, the retry of a
// conditional append whose first attempt landed, also past the dedup
// window: the subject's first record after the expected sequence carries
// the same message id.
func (l *MemoryLog) retriedLocked(subject string, opts AppendOptions) (Ack, bool) {
	if opts.MsgID == "" {
		return Ack{}, false
	}
	for i := opts.ExpectLastSubjectSeq; i < uint64(len(l.records)); i++ {
		if r := l.records[i]; r.Subject == subject {
			if r.Headers[memHeaderMsgID] == opts.MsgID {
				return Ack{Sequence: r.Sequence, Duplicate: true}, true
			}
			return Ack{}, false
		}
	}
	return Ack{}, false
}

// Batches implements LogBatcher: a memory log always takes batches.
func (l *MemoryLog) Batches() bool { return true }

// AppendBatch implements LogBatcher: every append is checked, as
// JetStream checks a batch (its message id, then its expectation), before
// any is stored.
func (l *MemoryLog) AppendBatch(ctx context.Context, appends []LogAppend) ([]Ack, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := CheckLogBatch(appends); err != nil {
		return nil, err
	}
	for _, a := range appends {
		if err := memCheckSubject(a.Subject, false); err != nil {
			return nil, err
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expireDedupLocked(l.clock.Now().UTC())
	ids := make(map[string]struct{}, len(appends))
	for i, a := range appends {
		if id := a.Opts.MsgID; id != "" {
			_, stored := l.dedup[id]
			_, twice := ids[id]
			if stored || twice {
				return nil, fmt.Errorf("%w: batch append %d on %q: message id %q", ErrBatchDuplicate, i, a.Subject, id)
			}
			ids[id] = struct{}{}
		}
		if last := l.lastBySubject[a.Subject]; a.Opts.ExpectSet && a.Opts.ExpectLastSubjectSeq != last {
			return nil, fmt.Errorf("%w: batch append %d: subject %q is at sequence %d, append expected %d", ErrConflict, i, a.Subject, last, a.Opts.ExpectLastSubjectSeq)
		}
	}
	acks := make([]Ack, len(appends))
	for i, a := range appends {
		ack, err := l.storeLocked(a.Subject, a.Data, a.Opts)
		if err != nil {
			return nil, err // unreachable: every append was checked under the lock
		}
		acks[i] = ack
	}
	return acks, nil
}

// store is the append state transition. The order of the checks is the
// contract's: a MsgID seen within the window acks as a duplicate before any
// expectation is looked at, so a retry whose first attempt landed is
// idempotent even though its expectation is now stale (clustered JetStream
// checks in this order too).
func (l *MemoryLog) store(subject string, data []byte, opts AppendOptions) (Ack, error) {
	if err := memCheckSubject(subject, false); err != nil {
		return Ack{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.storeLocked(subject, data, opts)
}

func (l *MemoryLog) storeLocked(subject string, data []byte, opts AppendOptions) (Ack, error) {
	now := l.clock.Now().UTC()
	l.expireDedupLocked(now)
	if opts.MsgID != "" {
		if d, ok := l.dedup[opts.MsgID]; ok {
			return Ack{Sequence: d.seq, Duplicate: true}, nil
		}
	}
	last := l.lastBySubject[subject]
	if opts.ExpectSet && opts.ExpectLastSubjectSeq != last {
		if ack, ok := l.retriedLocked(subject, opts); ok {
			return ack, nil
		}
		return Ack{}, fmt.Errorf("%w: subject %q is at sequence %d, append expected %d", ErrConflict, subject, last, opts.ExpectLastSubjectSeq)
	}
	seq := uint64(len(l.records)) + 1
	var hdr map[string]string
	if len(opts.Headers) > 0 || opts.MsgID != "" || opts.ExpectSet {
		hdr = make(map[string]string, len(opts.Headers)+2)
		for k, v := range opts.Headers {
			hdr[k] = v
		}
		if opts.MsgID != "" {
			hdr[memHeaderMsgID] = opts.MsgID
		}
		if opts.ExpectSet {
			hdr[memHeaderExpectedSubSeq] = strconv.FormatUint(opts.ExpectLastSubjectSeq, 10)
		}
	}
	if n := len(l.records); n > 0 && now.Before(l.records[n-1].Time) {
		l.timesOrdered = false
	}
	l.records = append(l.records, Record{
		Stream:   l.name,
		Subject:  subject,
		Sequence: seq,
		Time:     now,
		Headers:  hdr,
		Data:     append([]byte(nil), data...),
	})
	l.lastBySubject[subject] = seq
	if opts.MsgID != "" {
		l.dedup[opts.MsgID] = memDedupEntry{seq: seq, at: now}
		l.dedupOrder = append(l.dedupOrder, opts.MsgID)
	}
	close(l.changed)
	l.changed = make(chan struct{})
	return Ack{Sequence: seq}, nil
}

// expireDedupLocked forgets ids stored a window or more before now, as the
// server's purge timer does.
func (l *MemoryLog) expireDedupLocked(now time.Time) {
	n := 0
	for _, id := range l.dedupOrder {
		if now.Sub(l.dedup[id].at) < l.dedupWindow {
			break
		}
		delete(l.dedup, id)
		n++
	}
	if n > 0 {
		l.dedupOrder = append([]string(nil), l.dedupOrder[n:]...)
	}
}

// LastSequence implements Log.
func (l *MemoryLog) LastSequence(ctx context.Context, subject string) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := memCheckSubject(subject, false); err != nil {
		return 0, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastBySubject[subject], nil
}

// Record implements Log. The record is a copy.
func (l *MemoryLog) Record(ctx context.Context, seq uint64) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if seq == 0 || seq > uint64(len(l.records)) {
		return Record{}, fmt.Errorf("events: record %d of log %q: %w", seq, l.name, ErrNotFound)
	}
	return memCopyRecord(l.records[seq-1]), nil
}

// RecordOn implements Log. The record is a copy.
func (l *MemoryLog) RecordOn(ctx context.Context, subject string, from uint64) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, err
	}
	if err := memCheckSubject(subject, false); err != nil {
		return Record{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for seq := max(from, 1); seq <= uint64(len(l.records)); seq++ {
		if rec := l.records[seq-1]; rec.Subject == subject {
			return memCopyRecord(rec), nil
		}
	}
	return Record{}, fmt.Errorf("events: no record on %q from %d in log %q: %w", subject, from, l.name, ErrNotFound)
}

// Read implements Log. Records are copies; the caller may keep and modify
// them. The body of the loop may append to the same log.
func (l *MemoryLog) Read(ctx context.Context, opts ReadOptions) iter.Seq2[Record, error] {
	return func(yield func(Record, error) bool) {
		stop := func(err error) {
			if !opts.Follow {
				yield(Record{}, err)
			}
		}
		if opts.Subject != "" {
			if err := memCheckSubject(opts.Subject, true); err != nil {
				yield(Record{}, err)
				return
			}
		}
		if err := ctx.Err(); err != nil {
			stop(err)
			return
		}
		l.mu.Lock()
		next := l.startLocked(opts)
		end := uint64(len(l.records)) // the last record present now
		l.mu.Unlock()
		if opts.Follow {
			end = ^uint64(0)
		}
		for {
			batch, after, wake := l.scan(opts.Subject, next, end)
			for _, rec := range batch {
				if err := ctx.Err(); err != nil {
					stop(err)
					return
				}
				if !yield(rec, nil) {
					return
				}
			}
			next = after
			if len(batch) > 0 {
				continue
			}
			if !opts.Follow {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-wake:
			}
		}
	}
}

// startLocked is the first sequence a read with opts considers.
func (l *MemoryLog) startLocked(opts ReadOptions) uint64 {
	if !opts.FromTime.IsZero() {
		at := func(i int) bool { return !l.records[i].Time.Before(opts.FromTime) }
		if l.timesOrdered {
			return uint64(sort.Search(len(l.records), at)) + 1
		}
		for i := range l.records {
			if at(i) {
				return uint64(i) + 1
			}
		}
		return uint64(len(l.records)) + 1
	}
	if opts.FromSeq <= 1 {
		return 1
	}
	return opts.FromSeq
}

// scan copies up to memReadBatch records matching filter with sequences in
// [from, end], and returns the sequence to continue from. When it returns
// no records it has reached the end of the log, and wake is closed by the
// next append.
func (l *MemoryLog) scan(filter string, from, end uint64) (batch []Record, next uint64, wake <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	last := min(end, uint64(len(l.records)))
	next = from
	for ; next <= last && len(batch) < memReadBatch; next++ {
		rec := l.records[next-1]
		if filter == "" || memMatch(filter, rec.Subject) {
			batch = append(batch, memCopyRecord(rec))
		}
	}
	return batch, next, l.changed
}

func memCopyRecord(r Record) Record {
	if r.Headers != nil {
		h := make(map[string]string, len(r.Headers))
		for k, v := range r.Headers {
			h[k] = v
		}
		r.Headers = h
	}
	r.Data = append([]byte(nil), r.Data...)
	return r
}

// MemoryKVOption configures NewMemoryKV.
type MemoryKVOption func(*MemoryKV)

// MemoryHistory sets how many revisions per key the bucket keeps, within
// JetStream's bounds [1, 64]; values outside are clamped.
func MemoryHistory(n int) MemoryKVOption {
	return func(kv *MemoryKV) {
		kv.history = min(max(n, 1), HistoryLimit)
	}
}

// MemoryKV is the in-memory KV. Like a JetStream bucket it is a stream:
// revisions are the bucket's own sequence, strictly increasing across keys,
// and each key keeps its last history revisions (delete markers included).
// Safe for concurrent use.
type MemoryKV struct {
	bucket  string
	clock   Clock
	history int

	mu      sync.Mutex
	rev     uint64           // last revision written
	entries map[uint64]Entry // retained entries by revision; never modified once stored
	order   []uint64         // revisions in order; may hold dropped ones until compacted
	keys    map[string][]uint64
	changed chan struct{} // closed and replaced by every write
}

var _ KVBatcher = (*MemoryKV)(nil)

// NewMemoryKV returns an empty bucket that stamps entries with clock (nil:
// SystemClock) and keeps HistoryLimit revisions per key.
func NewMemoryKV(bucket string, clock Clock, opts ...MemoryKVOption) *MemoryKV {
	if clock == nil {
		clock = SystemClock{}
	}
	kv := &MemoryKV{
		bucket:  bucket,
		clock:   clock,
		history: HistoryLimit,
		entries: map[uint64]Entry{},
		keys:    map[string][]uint64{},
		changed: make(chan struct{}),
	}
	for _, o := range opts {
		o(kv)
	}
	return kv
}

// Bucket implements KV.
func (kv *MemoryKV) Bucket() string { return kv.bucket }

// Get implements KV.
func (kv *MemoryKV) Get(ctx context.Context, key string) (Entry, error) {
	if err := memCheckCall(ctx, key, false); err != nil {
		return Entry{}, err
	}
	kv.mu.Lock()
	defer kv.mu.Unlock()
	e, ok := kv.latestLocked(key)
	if !ok || e.Op != OpPut {
		return Entry{}, fmt.Errorf("%w: key %q in bucket %q", ErrNotFound, key, kv.bucket)
	}
	return memCopyEntry(e), nil
}

// Create implements KV. A key whose latest revision is a delete marker may be
// created again, as with nats.go.
func (kv *MemoryKV) Create(ctx context.Context, key string, value []byte) (uint64, error) {
	if err := memCheckCall(ctx, key, false); err != nil {
		return 0, err
	}
	kv.mu.Lock()
	defer kv.mu.Unlock()
	var expect uint64
	if e, ok := kv.latestLocked(key); ok {
		if e.Op == OpPut {
			return 0, fmt.Errorf("%w: key %q exists at revision %d", ErrConflict, key, e.Revision)
		}
		expect = e.Revision
	}
	return kv.writeLocked(key, value, OpPut, &expect)
}

// Update implements KV. lastRevision 0 expects a key that was never written
// (or whose history is gone), as JetStream does.
func (kv *MemoryKV) Update(ctx context.Context, key string, value []byte, lastRevision uint64) (uint64, error) {
	if err := memCheckCall(ctx, key, false); err != nil {
		return 0, err
	}
	kv.mu.Lock()
	defer kv.mu.Unlock()
	return kv.writeLocked(key, value, OpPut, &lastRevision)
}

// Put implements KV.
func (kv *MemoryKV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	if err := memCheckCall(ctx, key, false); err != nil {
		return 0, err
	}
	kv.mu.Lock()
	defer kv.mu.Unlock()
	return kv.writeLocked(key, value, OpPut, nil)
}

// Delete implements KV. Like nats.go it writes a delete marker even for a
// key that has no value.
func (kv *MemoryKV) Delete(ctx context.Context, key string) error {
	if err := memCheckCall(ctx, key, false); err != nil {
		return err
	}
	kv.mu.Lock()
	defer kv.mu.Unlock()
	_, err := kv.writeLocked(key, nil, OpDelete, nil)
	return err
}

// WriteBatch implements KVBatcher: every expectation is checked before
// anything is written.
func (kv *MemoryKV) WriteBatch(ctx context.Context, writes []KVWrite) ([]uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := CheckBatch(writes); err != nil {
		return nil, err
	}
	for _, w := range writes {
		if err := memCheckKey(w.Key, false); err != nil {
			return nil, err
		}
	}
	kv.mu.Lock()
	defer kv.mu.Unlock()
	for i, w := range writes {
		if w.Put {
			continue
		}
		var last uint64
		if revs := kv.keys[w.Key]; len(revs) > 0 {
			last = revs[len(revs)-1]
		}
		if last != w.Revision {
			return nil, fmt.Errorf("%w: batch write %d: key %q is at revision %d, write expected %d", ErrConflict, i, w.Key, last, w.Revision)
		}
	}
	revs := make([]uint64, len(writes))
	for i, w := range writes {
		rev, err := kv.writeLocked(w.Key, w.Value, OpPut, nil)
		if err != nil {
			return nil, err // unreachable: expectations were checked under the lock
		}
		revs[i] = rev
	}
	return revs, nil
}

// History implements KV.
func (kv *MemoryKV) History(ctx context.Context, key string) ([]Entry, error) {
	if err := memCheckCall(ctx, key, false); err != nil {
		return nil, err
	}
	kv.mu.Lock()
	defer kv.mu.Unlock()
	revs := kv.keys[key]
	if len(revs) == 0 {
		return nil, fmt.Errorf("%w: key %q in bucket %q has no history", ErrNotFound, key, kv.bucket)
	}
	out := make([]Entry, len(revs))
	for i, r := range revs {
		out[i] = memCopyEntry(kv.entries[r])
	}
	return out, nil
}

// Revision is the bucket's last revision (0 when nothing was ever written).
func (kv *MemoryKV) Revision() uint64 {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	return kv.rev
}

// Snapshot returns the initial values a Watch of pattern with opts delivers
// before its marker, and the revision they are consistent with: a watch
// continues with Changes(pattern, revision). It is Watch without the
// goroutine, for hosts that poll (the deterministic simulator).
func (kv *MemoryKV) Snapshot(pattern string, opts WatchOptions) ([]Entry, uint64, error) {
	if err := memCheckKey(pattern, true); err != nil {
		return nil, 0, err
	}
	kv.mu.Lock()
	defer kv.mu.Unlock()
	return kv.snapshotLocked(pattern, opts), kv.rev, nil
}

// Changes returns the retained entries of keys matching pattern written
// after revision afterRev, in revision order. Revisions dropped by the
// history limit before being read are missed, as by a JetStream consumer.
func (kv *MemoryKV) Changes(pattern string, afterRev uint64) ([]Entry, error) {
	if err := memCheckKey(pattern, true); err != nil {
		return nil, err
	}
	var out []Entry
	for {
		batch, _ := kv.changes(pattern, afterRev)
		if len(batch) == 0 {
			return out, nil
		}
		out = append(out, batch...)
		afterRev = batch[len(batch)-1].Revision
	}
}

// Watch implements KV. The pump goroutine ends, closing Updates, on Stop or
// when ctx ends.
func (kv *MemoryKV) Watch(ctx context.Context, pattern string, opts WatchOptions) (Watcher, error) {
	if err := memCheckCall(ctx, pattern, true); err != nil {
		return nil, err
	}
	kv.mu.Lock()
	initial := kv.snapshotLocked(pattern, opts)
	cursor := kv.rev
	kv.mu.Unlock()
	w := &memWatcher{
		updates: make(chan Entry),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	go w.run(ctx, kv, pattern, initial, cursor)
	return w, nil
}

func (kv *MemoryKV) latestLocked(key string) (Entry, bool) {
	revs := kv.keys[key]
	if len(revs) == 0 {
		return Entry{}, false
	}
	return kv.entries[revs[len(revs)-1]], true
}

// writeLocked is the one KV state transition: with expect non-nil the write
// happens only if the key's latest revision (0: none) equals *expect.
func (kv *MemoryKV) writeLocked(key string, value []byte, op Op, expect *uint64) (uint64, error) {
	revs := kv.keys[key]
	if expect != nil {
		var last uint64
		if len(revs) > 0 {
			last = revs[len(revs)-1]
		}
		if last != *expect {
			return 0, fmt.Errorf("%w: key %q is at revision %d, write expected %d", ErrConflict, key, last, *expect)
		}
	}
	kv.rev++
	var v []byte
	if op == OpPut {
		v = append([]byte{}, value...)
	}
	kv.entries[kv.rev] = Entry{
		Bucket:   kv.bucket,
		Key:      key,
		Value:    v,
		Revision: kv.rev,
		Time:     kv.clock.Now().UTC(),
		Op:       op,
	}
	kv.order = append(kv.order, kv.rev)
	revs = append(revs, kv.rev)
	if len(revs) > kv.history {
		drop := len(revs) - kv.history
		for _, r := range revs[:drop] {
			delete(kv.entries, r)
		}
		revs = append([]uint64(nil), revs[drop:]...)
	}
	kv.keys[key] = revs
	if len(kv.order) > 2*len(kv.entries)+memReadBatch {
		kept := kv.order[:0]
		for _, r := range kv.order {
			if _, ok := kv.entries[r]; ok {
				kept = append(kept, r)
			}
		}
		kv.order = kept
	}
	close(kv.changed)
	kv.changed = make(chan struct{})
	return kv.rev, nil
}

// snapshotLocked lists, in revision order, the latest retained entry of
// every matching key (every retained entry with History, none with
// UpdatesOnly). Delete markers are included, as JetStream delivers them.
func (kv *MemoryKV) snapshotLocked(pattern string, opts WatchOptions) []Entry {
	if opts.UpdatesOnly {
		return nil
	}
	var out []Entry
	for _, r := range kv.order {
		e, ok := kv.entries[r]
		if !ok || !memMatch(pattern, e.Key) {
			continue
		}
		if !opts.History {
			revs := kv.keys[e.Key]
			if revs[len(revs)-1] != r {
				continue
			}
		}
		out = append(out, memCopyEntry(e))
	}
	return out
}

// changes copies up to memReadBatch matching entries after afterRev. When
// it returns none, wake is closed by the next write.
func (kv *MemoryKV) changes(pattern string, afterRev uint64) (batch []Entry, wake <-chan struct{}) {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	i := sort.Search(len(kv.order), func(i int) bool { return kv.order[i] > afterRev })
	for ; i < len(kv.order) && len(batch) < memReadBatch; i++ {
		e, ok := kv.entries[kv.order[i]]
		if ok && memMatch(pattern, e.Key) {
			batch = append(batch, memCopyEntry(e))
		}
	}
	return batch, kv.changed
}

func memCopyEntry(e Entry) Entry {
	if e.Value != nil {
		e.Value = append([]byte{}, e.Value...)
	}
	return e
}

// memWatcher is the thin goroutine layer over Snapshot and Changes.
type memWatcher struct {
	updates  chan Entry
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

func (w *memWatcher) Updates() <-chan Entry { return w.updates }

// Stop ends the pump and returns once Updates is closed.
func (w *memWatcher) Stop() error {
	w.stopOnce.Do(func() { close(w.stop) })
	<-w.done
	return nil
}

func (w *memWatcher) run(ctx context.Context, kv *MemoryKV, pattern string, initial []Entry, cursor uint64) {
	defer close(w.done)
	defer close(w.updates)
	send := func(e Entry) bool {
		select {
		case w.updates <- e:
			return true
		case <-w.stop:
		case <-ctx.Done():
		}
		return false
	}
	for _, e := range initial {
		if !send(e) {
			return
		}
	}
	if !send(Entry{}) {
		return
	}
	for {
		batch, wake := kv.changes(pattern, cursor)
		for _, e := range batch {
			if !send(e) {
				return
			}
			cursor = e.Revision
		}
		if len(batch) > 0 {
			continue
		}
		select {
		case <-wake:
		case <-w.stop:
			return
		case <-ctx.Done():
			return
		}
	}
}

// memMatch reports whether subject matches pattern with NATS wildcards: a
// "*" token matches exactly one token, a final ">" one or more.
func memMatch(pattern, subject string) bool {
	for {
		pt, prest, pmore := memCut(pattern)
		st, srest, smore := memCut(subject)
		if pt == ">" && !pmore {
			return true
		}
		if pt != "*" && pt != st {
			return false
		}
		if !pmore || !smore {
			return pmore == smore
		}
		pattern, subject = prest, srest
	}
}

func memCut(s string) (token, rest string, more bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == '.' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

var errMemEmptyToken = errors.New("empty token")

// memCheckSubject enforces NATS subject syntax: non-empty dot-separated
// tokens without whitespace; wildcards ("*", final ">") only in filters.
func memCheckSubject(subject string, filter bool) error {
	if err := memCheckTokens(subject, filter); err != nil {
		return fmt.Errorf("%w: subject %q: %w", ErrInvalid, subject, err)
	}
	return nil
}

func memCheckTokens(s string, wildcards bool) error {
	if s == "" {
		return errMemEmptyToken
	}
	for rest, more := s, true; more; {
		var tok string
		tok, rest, more = memCut(rest)
		switch {
		case tok == "":
			return errMemEmptyToken
		case (tok == "*" || tok == ">") && !wildcards:
			return fmt.Errorf("wildcard %q not allowed here", tok)
		case tok == ">" && more:
			return errors.New(`">" must be the last token`)
		}
		for i := 0; i < len(tok); i++ {
			if c := tok[i]; c == ' ' || c == '\t' || c == '\r' || c == '\n' {
				return errors.New("whitespace")
			}
		}
	}
	return nil
}

// memCheckKey enforces nats.go's KV key syntax: tokens of [-/_=a-zA-Z0-9]
// (plus "*" and a final ">" in watch patterns).
func memCheckKey(key string, pattern bool) error {
	if err := memCheckTokens(key, pattern); err != nil {
		return fmt.Errorf("%w: key %q: %w", ErrInvalid, key, err)
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		ok := c == '-' || c == '/' || c == '_' || c == '=' || c == '.' ||
			('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9') ||
			(pattern && (c == '*' || (c == '>' && i == len(key)-1)))
		if !ok {
			return fmt.Errorf("%w: key %q: character %q not allowed", ErrInvalid, key, c)
		}
	}
	return nil
}

func memCheckCall(ctx context.Context, key string, pattern bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return memCheckKey(key, pattern)
}
