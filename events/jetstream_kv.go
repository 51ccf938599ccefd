package events

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStreamKV is the KV on a NATS JetStream key/value bucket. The bucket
// must exist (the runtime provisions it). It is safe for concurrent use.
type JetStreamKV struct {
	kv     jetstream.KeyValue
	bucket string
	nc     *nats.Conn
	// atomic: the bucket's stream allows atomic batch publish (checked
	// when opened); without it WriteBatch answers ErrBatchUnsupported.
	atomic bool
}

var _ KVBatcher = (*JetStreamKV)(nil)

// NewJetStreamKV returns the KV on the existing bucket named bucket.
func NewJetStreamKV(ctx context.Context, js jetstream.JetStream, bucket string) (*JetStreamKV, error) {
	if js == nil {
		return nil, errors.New("events: NewJetStreamKV: nil JetStream context")
	}
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, fmt.Errorf("events: KV bucket %q does not exist; provision it before opening it: %w", bucket, err)
		}
		return nil, fmt.Errorf("events: open KV bucket %q: %w", bucket, err)
	}
	k := &JetStreamKV{kv: kv, bucket: bucket, nc: js.Conn()}
	if st, err := js.Stream(ctx, KVStream(bucket)); err == nil {
		k.atomic = st.CachedInfo().Config.AllowAtomicPublish
	}
	return k, nil
}

// Bucket implements KV.
func (k *JetStreamKV) Bucket() string { return k.bucket }

func (k *JetStreamKV) fail(op, key string, err error) error {
	return fmt.Errorf("events: %s %q in bucket %q: %w", op, key, k.bucket, mapJetStreamError(err))
}

// Get implements KV.
func (k *JetStreamKV) Get(ctx context.Context, key string) (Entry, error) {
	e, err := k.kv.Get(ctx, key)
	if err != nil {
		return Entry{}, k.fail("get", key, err)
	}
	return k.entry(e), nil
}

// Create implements KV. A key whose latest entry is a delete marker counts
// as having no live value.
func (k *JetStreamKV) Create(ctx context.Context, key string, value []byte) (uint64, error) {
	rev, err := k.kv.Create(ctx, key, value)
	if err != nil {
		return 0, k.fail("create", key, err)
	}
	return rev, nil
}

// Update implements KV.
func (k *JetStreamKV) Update(ctx context.Context, key string, value []byte, lastRevision uint64) (uint64, error) {
	rev, err := k.kv.Update(ctx, key, value, lastRevision)
	if err != nil {
		return 0, k.fail("update", key, err)
	}
	return rev, nil
}

// Put implements KV.
func (k *JetStreamKV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	rev, err := k.kv.Put(ctx, key, value)
	if err != nil {
		return 0, k.fail("put", key, err)
	}
	return rev, nil
}

// Batches reports whether WriteBatch may succeed: the bucket's stream
// allowed atomic batch publish when the KV was opened.
func (k *JetStreamKV) Batches() bool { return k.atomic }

// WriteBatch implements KVBatcher with one JetStream atomic batch (on the
// bucket's own subjects: a KV opened through a JetStream domain or API
// prefix is not batched by understudy, which uses neither): every
// write is a message on the key's subject with the batch's id and its
// place in it (and the expected last revision of its key unless Put); the
// last commits the batch, and its acknowledgement names the last
// revision. The server checks every expectation before it stores any,
// and syncs the batch to disk once. The bucket's stream must allow atomic
// publish (provisioning sets allow_atomic on understudy's buckets).
func (k *JetStreamKV) WriteBatch(ctx context.Context, writes []KVWrite) ([]uint64, error) {
	if err := CheckBatch(writes); err != nil {
		return nil, err
	}
	if !k.atomic {
		return nil, fmt.Errorf("events: batch in bucket %q: %w (its stream does not allow atomic publish)", k.bucket, ErrBatchUnsupported)
	}
	for _, w := range writes {
		if err := memCheckKey(w.Key, false); err != nil {
			return nil, err
		}
	}
	msgs := make([]*nats.Msg, len(writes))
	for i, w := range writes {
		m := nats.NewMsg("$KV." + k.bucket + "." + w.Key)
		m.Data = w.Value
		if !w.Put {
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(w.Revision, 10))
		}
		msgs[i] = m
	}
	return publishBatch(ctx, k.nc, fmt.Sprintf("batch of %d in bucket %q", len(writes), k.bucket), "", msgs)
}

// Delete implements KV.
func (k *JetStreamKV) Delete(ctx context.Context, key string) error {
	if err := k.kv.Delete(ctx, key); err != nil {
		return k.fail("delete", key, err)
	}
	return nil
}

// History implements KV. Delete markers are part of the history.
func (k *JetStreamKV) History(ctx context.Context, key string) ([]Entry, error) {
	w, err := k.Watch(ctx, key, WatchOptions{History: true})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	var out []Entry
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("events: history %q in bucket %q: watch ended early", key, k.bucket)
			}
			if e.Revision == 0 {
				if len(out) == 0 {
					return nil, fmt.Errorf("events: history %q in bucket %q: %w", key, k.bucket, ErrNotFound)
				}
				return out, nil
			}
			out = append(out, e)
		case <-ctx.Done():
			return nil, fmt.Errorf("events: history %q in bucket %q: %w", key, k.bucket, ctx.Err())
		}
	}
}

// Watch implements KV. The watch ends when ctx ends or Stop is called,
// whichever comes first; the Updates channel is closed then.
func (k *JetStreamKV) Watch(ctx context.Context, pattern string, opts WatchOptions) (Watcher, error) {
	var wopts []jetstream.WatchOpt
	switch {
	case opts.UpdatesOnly: // wins over History, which nats.go refuses with it
		wopts = append(wopts, jetstream.UpdatesOnly())
	case opts.History:
		wopts = append(wopts, jetstream.IncludeHistory())
	}
	nw, err := k.kv.Watch(ctx, pattern, wopts...)
	if err != nil {
		return nil, k.fail("watch", pattern, err)
	}
	w := &kvWatcher{
		kv:      k,
		nw:      nw,
		updates: make(chan Entry),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	go w.run(ctx, opts.UpdatesOnly)
	return w, nil
}

// kvWatcher translates a NATS key watcher: its nil end-of-initial-values
// marker becomes the zero Entry.
type kvWatcher struct {
	kv      *JetStreamKV
	nw      jetstream.KeyWatcher
	updates chan Entry // unbuffered: the NATS watcher buffers already
	stop    chan struct{}
	once    sync.Once
	done    chan struct{} // closed after updates
}

func (w *kvWatcher) Updates() <-chan Entry { return w.updates }

// Stop ends the watch and returns once Updates is closed.
func (w *kvWatcher) Stop() error {
	w.once.Do(func() { close(w.stop) })
	<-w.done
	return nil
}

func (w *kvWatcher) run(ctx context.Context, updatesOnly bool) {
	defer close(w.done)
	defer close(w.updates)
	defer func() {
		_ = w.nw.Stop()
		// The NATS watcher's callback may be blocked handing over an entry;
		// its updates channel closes only once that callback has returned.
		for range w.nw.Updates() {
		}
	}()
	// NATS sends no marker when initial values are not asked for; the
	// contract always has one.
	if updatesOnly {
		select {
		case w.updates <- Entry{}:
		case <-w.stop:
			return
		case <-ctx.Done():
			return
		}
	}
	for {
		var e Entry
		select {
		case ne, ok := <-w.nw.Updates():
			if !ok {
				return
			}
			if ne != nil {
				e = w.kv.entry(ne)
			}
		case <-w.stop:
			return
		case <-ctx.Done():
			return
		}
		select {
		case w.updates <- e:
		case <-w.stop:
			return
		case <-ctx.Done():
			return
		}
	}
}

func (k *JetStreamKV) entry(e jetstream.KeyValueEntry) Entry {
	op := OpPut
	switch e.Operation() {
	case jetstream.KeyValueDelete:
		op = OpDelete
	case jetstream.KeyValuePurge:
		op = OpPurge
	}
	return Entry{
		Bucket:   k.bucket,
		Key:      e.Key(),
		Value:    e.Value(),
		Revision: e.Revision(),
		Time:     e.Created().UTC(),
		Op:       op,
	}
}
