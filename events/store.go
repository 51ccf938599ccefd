package events

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"time"
)

// Errors with stable identities. Callers use errors.Is.
var (
	// ErrConflict reports a lost optimistic-concurrency check: the expected
	// last subject sequence (Log) or revision (KV) had moved. JetStream reports
	// it as error 10071. Re-read, then decide again; never blindly retry the
	// same write.
	ErrConflict = errors.New("events: conflict: expected sequence or revision has moved")

	// ErrInFlight reports a conditional write the server could not decide:
	// an earlier write to the same subject is still being proposed
	// (JetStream error 10164; seen when the stream leader is cut off from its
	// quorum). Nothing is known of the write, and it says nothing of a rival:
	// the store is unavailable for it; try again later. Never ErrConflict.
	ErrInFlight = errors.New("events: unavailable: an earlier write to this subject is still being proposed")

	// ErrBatchUnsupported: the KV or Log takes no batch at the moment (a
	// bucket or stream provisioned before batches, or a server that has
	// them off); nothing was written. Write one at a time.
	ErrBatchUnsupported = errors.New("events: the store takes no atomic batches here")

	// ErrBatchNotCommitted: a batch was not committed this time, and
	// nothing of it was written — the connection failed before its commit
	// was sent, no server took the commit (a stream leader being elected),
	// the server received it incomplete, or the stream had too many
	// batches open. Unlike ErrBatchUnsupported it says nothing of later
	// batches: the writes may be sent again, alone or batched.
	ErrBatchNotCommitted = errors.New("events: the batch was not committed, nothing was written")

	// ErrBatchDuplicate: an append of a batch carries a message id the
	// stream has stored within its duplicate window, so the batch was
	// refused and nothing was written. Which append is not said; alone,
	// the same append is acknowledged as a duplicate (Ack.Duplicate).
	ErrBatchDuplicate = errors.New("events: an append of the batch carries a message id already stored")

	// ErrNotFound reports a key (KV) or sequence (Log) that does not exist.
	ErrNotFound = errors.New("events: not found")

	// ErrCorrupt is wrapped by *DecodeError: stored bytes are not a valid envelope.
	ErrCorrupt = errors.New("events: corrupt event")

	// ErrInvalid reports a subject, key or pattern that breaks NATS naming
	// rules (empty tokens, whitespace, wildcards where none are allowed).
	ErrInvalid = errors.New("events: invalid name")
)

// AppendOptions qualify one Log.Append.
type AppendOptions struct {
	// ExpectLastSubjectSeq, when ExpectSet is true, makes the append fail with
	// ErrConflict unless the subject's last sequence equals it (0: the
	// subject must be empty). This is what keeps a zombie writer from
	// interleaving with its successor.
	ExpectLastSubjectSeq uint64
	ExpectSet            bool

	// MsgID, when set, makes the append idempotent: a retry with the same id
	// within the dedup window returns the original sequence with Duplicate set
	// — even when the retry carries the same, now stale, expectation (a
	// single NATS server checks the expectation first; both implementations
	// guarantee Duplicate regardless). With an expectation it does so past
	// the window too: the subject's first record after the expected
	// sequence carrying the same id is the original.
	MsgID string

	// Headers are stored with the record. The map is read, not kept.
	Headers map[string]string
}

// HeaderExpectedLastSubjectSeq is the header JetStream keeps on a message
// appended with an expected last subject sequence (AppendOptions): the
// subject's sequence before it, so "0" marks a subject's first record.
const HeaderExpectedLastSubjectSeq = "Nats-Expected-Last-Subject-Sequence"

// HeaderQueued is the header an appender may store with an event: how
// long the event waited on its node — queued behind earlier appends, or
// retried after timeouts — before the append attempt that stored it was
// sent, in nanoseconds of the node's monotonic clock (decimal; absent: not
// measured, or no wait). The record's server timestamp minus it is when
// the event happened, to within the one-way latency of that attempt: a
// fact recorded while its member was cut off from NATS is dated when it
// happened, not when it could finally be appended. Readers must treat it as
// an estimate (a monotonic clock may jump forward) and never move a
// record's server timestamp for anything that must be conservative.
const HeaderQueued = "Understudy-Queued-Ns"

// Expect returns options expecting the subject's last sequence to be seq.
func Expect(seq uint64) AppendOptions {
	return AppendOptions{ExpectLastSubjectSeq: seq, ExpectSet: true}
}

// Ack is the result of a successful append.
type Ack struct {
	Sequence  uint64
	Duplicate bool // the MsgID was seen before; Sequence is the original one
}

// Record is one stored message as the server holds it.
type Record struct {
	Stream   string
	Subject  string
	Sequence uint64
	Time     time.Time // server timestamp, UTC
	Headers  map[string]string
	Data     []byte // the encoded envelope
}

// Queued is how long the record's event waited on its node before the
// append that stored it (HeaderQueued; 0 when absent or unreadable).
func (r Record) Queued() time.Duration {
	v, ok := r.Headers[HeaderQueued]
	if !ok {
		return 0
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n)
}

// Occurred is when the record's event happened on its node, as far as the
// record tells: the server timestamp less Queued. An estimate (see
// HeaderQueued): never use it where a bound must stay conservative.
func (r Record) Occurred() time.Time { return r.Time.Add(-r.Queued()) }

// ReadOptions select records from a Log.
type ReadOptions struct {
	// Subject filters by subject; NATS wildcards (* and >) are allowed.
	// Empty means every subject of the log.
	Subject string
	// FromSeq starts at this stream sequence (0 or 1: the beginning).
	FromSeq uint64
	// FromTime, if non-zero, starts at the first record stored at or after it.
	// It wins over FromSeq.
	FromTime time.Time
	// Follow keeps the read open after the records present at the start and
	// yields new ones as they are appended (a live tail) until ctx ends.
	// Without it the read ends after the last record present when it began.
	Follow bool
}

// Log is an append-only stream of encoded events. Safe for concurrent use.
type Log interface {
	// Append encodes ev with the Log's codec and stores it on subject.
	Append(ctx context.Context, subject string, ev Event, opts AppendOptions) (Ack, error)
	// AppendRaw stores data (an encoded envelope, or bytes kept from an
	// Unknown event) unchanged.
	AppendRaw(ctx context.Context, subject string, data []byte, opts AppendOptions) (Ack, error)
	// LastSequence returns the last sequence stored on subject (no
	// wildcards), or 0 when the subject is empty.
	LastSequence(ctx context.Context, subject string) (uint64, error)
	// Record returns the record stored at stream sequence seq, or
	// ErrNotFound when there is none (never stored, or removed by the
	// stream's limits). One request, no consumer: what a writer checks
	// after an ambiguous answer (a duplicate ack names a sequence).
	Record(ctx context.Context, seq uint64) (Record, error)
	// RecordOn returns the first record on subject (no wildcards) at or
	// after stream sequence from, or ErrNotFound when there is none. One
	// request, no consumer.
	RecordOn(ctx context.Context, subject string, from uint64) (Record, error)
	// Read yields records in sequence order. A non-nil error ends the
	// iteration; ctx cancellation ends it with ctx.Err() only when Follow is
	// false (a followed read simply stops).
	Read(ctx context.Context, opts ReadOptions) iter.Seq2[Record, error]
	// Codec returns the registry used to encode and decode events.
	Codec() *Registry
}

// LogAppend is one append of a batch (LogBatcher.AppendBatch).
type LogAppend struct {
	Subject string
	Data    []byte // an encoded envelope, as AppendRaw takes it
	Opts    AppendOptions
}

// MaxLogBatch bounds the appends of one batch.
const MaxLogBatch = MaxKVBatch

// LogBatcher is a Log that appends on several subjects at once,
// atomically: every append of a batch is stored, in order and at
// consecutive sequences, or none is.
type LogBatcher interface {
	Log
	// Batches reports whether AppendBatch may succeed (the stream allows
	// atomic batches).
	Batches() bool
	// AppendBatch stores appends (1..MaxLogBatch of them, each subject at
	// most once) and returns their acks. An append whose expectation
	// fails fails the whole batch with an error wrapping ErrConflict; one
	// whose message id the stream holds, with ErrBatchDuplicate; in both
	// cases nothing is written and which append is not said (append them
	// alone to find out, where the same rules as Append's answer). An
	// error wrapping ErrBatchUnsupported says the stream takes no batches
	// at the moment, one wrapping ErrBatchNotCommitted that this batch was
	// not committed (in both, nothing was written); any other error leaves
	// the outcome unknown, as for any append.
	AppendBatch(ctx context.Context, appends []LogAppend) ([]Ack, error)
}

// CheckLogBatch checks what every LogBatcher requires of a batch:
// 1..MaxLogBatch appends, each subject at most once.
func CheckLogBatch(appends []LogAppend) error {
	return checkDistinct(len(appends), MaxLogBatch, "appends", "subject", "is appended to twice", func(i int) string { return appends[i].Subject })
}

// checkDistinct checks a batch of n (1..max) items whose names (name(i))
// are distinct: what is the items' noun, key the names', twice what a
// name met twice is said to be.
func checkDistinct(n, max int, what, key, twice string, name func(int) string) error {
	if n == 0 || n > max {
		return fmt.Errorf("events: batch: a batch holds 1..%d %s, not %d", max, what, n)
	}
	seen := make(map[string]struct{}, n)
	for i := range n {
		k := name(i)
		if _, dup := seen[k]; dup {
			return fmt.Errorf("events: batch %s %d: %s %q %s in one batch (a %s at most once)", what[:len(what)-1], i, key, k, twice, key)
		}
		seen[k] = struct{}{}
	}
	return nil
}

// Op is the kind of a KV entry.
type Op int

const (
	OpPut Op = iota + 1
	OpDelete
	OpPurge
)

func (o Op) String() string {
	switch o {
	case OpPut:
		return "put"
	case OpDelete:
		return "delete"
	case OpPurge:
		return "purge"
	}
	return "unset"
}

// Entry is one revision of a KV key.
type Entry struct {
	Bucket   string
	Key      string
	Value    []byte
	Revision uint64    // stream sequence of this write; strictly increasing per bucket
	Time     time.Time // server timestamp, UTC
	Op       Op
}

// WatchOptions qualify KV.Watch.
type WatchOptions struct {
	// History delivers every retained revision of the matching keys first,
	// instead of only the latest one per key.
	History bool
	// UpdatesOnly delivers no existing entries, only new writes (the
	// zero-Entry marker still comes first). With History it wins.
	UpdatesOnly bool
}

// Watcher delivers KV entries in revision order.
type Watcher interface {
	// Updates yields entries. A zero Entry (Revision 0) marks the end of the
	// initial values; live updates follow it. The channel closes on Stop or
	// when the watch fails.
	Updates() <-chan Entry
	// Stop ends the watch. Safe to call more than once.
	Stop() error
}

// HistoryLimit is the number of revisions per key both implementations keep
// in the buckets understudy provisions.
const HistoryLimit = 64

// KV is a revisioned key/value bucket. Keys are dot-separated tokens.
// Safe for concurrent use.
type KV interface {
	// Get returns the latest entry of key, or ErrNotFound if it has none or
	// was deleted.
	Get(ctx context.Context, key string) (Entry, error)
	// Create writes key only if it has no live value; ErrConflict otherwise.
	Create(ctx context.Context, key string, value []byte) (uint64, error)
	// Update writes key only if its latest revision is lastRevision;
	// ErrConflict otherwise. This is the compare-and-set that decides
	// leadership.
	Update(ctx context.Context, key string, value []byte, lastRevision uint64) (uint64, error)
	// Put writes key unconditionally.
	Put(ctx context.Context, key string, value []byte) (uint64, error)
	// Delete marks key deleted (history is kept).
	Delete(ctx context.Context, key string) error
	// History returns the retained revisions of key, oldest first;
	// ErrNotFound if none.
	History(ctx context.Context, key string) ([]Entry, error)
	// Watch follows keys matching pattern (a key, or with * and >
	// wildcards: "pg-main.>").
	Watch(ctx context.Context, pattern string, opts WatchOptions) (Watcher, error)
	// Bucket is the bucket's name.
	Bucket() string
}

// KVWrite is one write of a batch (KVBatcher.WriteBatch).
type KVWrite struct {
	Key   string
	Value []byte
	// Put writes the key whatever its revision; otherwise the key's latest
	// revision must be Revision (0: the key was never written, or its
	// history is gone — as Update with lastRevision 0; a key whose latest
	// entry is a delete marker is written again with Create, not in a
	// batch).
	Put      bool
	Revision uint64
}

// MaxKVBatch bounds the writes of one batch (JetStream's default bound on
// an atomic batch is 1,000 messages).
const MaxKVBatch = 256

// KVBatcher is a KV that writes several keys at once, atomically: every
// write of the batch lands, at consecutive revisions in the order given,
// or none does. A store that syncs every write to disk syncs a batch once,
// so a node taking over thousands of registers does not wait for
// thousands of disk syncs one after another.
type KVBatcher interface {
	KV
	// WriteBatch performs writes (1..MaxKVBatch of them, each key at most
	// once) and returns their revisions. A write whose expectation fails
	// fails the whole batch with an error wrapping ErrConflict, and nothing
	// is written; which write failed is not said (write them one at a
	// time, or in smaller batches, to find out). An error wrapping
	// ErrBatchUnsupported says the bucket takes no batches at the moment,
	// one wrapping ErrBatchNotCommitted that this batch was not committed
	// (in both, nothing was written); any other error leaves the outcome
	// unknown, as for any write.
	WriteBatch(ctx context.Context, writes []KVWrite) ([]uint64, error)
}

// CheckBatch checks what every KVBatcher requires of a batch: 1..MaxKVBatch
// writes, each key at most once.
func CheckBatch(writes []KVWrite) error {
	return checkDistinct(len(writes), MaxKVBatch, "writes", "key", "is written twice", func(i int) string { return writes[i].Key })
}
