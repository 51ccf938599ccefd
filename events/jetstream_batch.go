package events

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The atomic batch publish headers (NATS server 2.12 and later).
const (
	batchIDHeader     = "Nats-Batch-Id"
	batchSeqHeader    = "Nats-Batch-Sequence"
	batchCommitHeader = "Nats-Batch-Commit"
)

// JetStream error codes of atomic batches that mean nothing was written.
// The stream takes no batch of this kind (ErrBatchUnsupported): publish
// disabled on the stream (10174), a batch larger than the server's
// max_batch_size (10199). This batch only (ErrBatchNotCommitted): an
// incomplete batch (10176: a message of it was not received), too many
// batches in flight on the stream (10210). A message id the stream holds
// (10201) refuses the batch too: ErrBatchDuplicate.
const (
	jsAtomicDisabled   = 10174
	jsAtomicIncomplete = 10176
	jsAtomicTooLarge   = 10199
	jsAtomicDuplicate  = 10201
	jsAtomicInflight   = 10210
)

// batchAck is the acknowledgement of a committed atomic batch.
type batchAck struct {
	Error  *jetstream.APIError `json:"error"`
	Stream string              `json:"stream"`
	Seq    uint64              `json:"seq"`
	Batch  string              `json:"batch"`
	Count  int                 `json:"count"`
}

// publishBatch sends msgs (headers and all but the batch's own) as one
// JetStream atomic batch and returns the stream sequence of each. what
// names the batch in errors ("batch of 3 in bucket \"x\""). The server
// checks every message before it stores any, and syncs the batch to disk
// once. Errors: ErrBatchUnsupported when nothing was written and the
// stream takes no such batch (the messages may go alone);
// ErrBatchNotCommitted when nothing was written this time (the connection
// failed before the commit was sent, no server took it, the stream had
// too many batches open); ErrBatchDuplicate; mapJetStreamError's (a stale
// expectation wraps ErrConflict); anything else leaves the outcome
// unknown.
func publishBatch(ctx context.Context, nc *nats.Conn, what, stream string, msgs []*nats.Msg) ([]uint64, error) {
	var idb [16]byte
	_, _ = rand.Read(idb[:]) // crypto/rand.Read never fails (Go 1.24+)
	id := hex.EncodeToString(idb[:])
	var resp *nats.Msg
	for i, m := range msgs {
		if m.Header == nil {
			m.Header = nats.Header{}
		}
		m.Header.Set(batchIDHeader, id)
		m.Header.Set(batchSeqHeader, strconv.Itoa(i+1))
		if i < len(msgs)-1 {
			// No reply: a message the server refuses fails the commit.
			if err := nc.PublishMsg(m); err != nil {
				// The commit was never sent (the connection failed): the
				// server drops what it received of the batch. This says
				// nothing of the stream's batches — taken for a refusal,
				// it turned a real takeover's batches off for a minute.
				return nil, fmt.Errorf("events: %s: %w: %w", what, ErrBatchNotCommitted, err)
			}
			continue
		}
		m.Header.Set(batchCommitHeader, "1")
		var err error
		if resp, err = nc.RequestMsgWithContext(ctx, m); err != nil {
			if errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrReconnectBufExceeded) {
				// No server took the commit (a stream leader being
				// elected), or the commit was never sent (the
				// connection is reconnecting and buffers nothing):
				// nothing was written.
				err = fmt.Errorf("%w: %w", ErrBatchNotCommitted, err)
			}
			return nil, fmt.Errorf("events: %s: %w", what, err)
		}
	}
	var ack batchAck
	if err := json.Unmarshal(resp.Data, &ack); err != nil {
		return nil, fmt.Errorf("events: %s: acknowledgement %q: %w", what, resp.Data, err)
	}
	if ack.Error != nil {
		switch ack.Error.ErrorCode {
		case jsAtomicDisabled, jsAtomicTooLarge:
			return nil, fmt.Errorf("events: %s: %w: %w", what, ErrBatchUnsupported, ack.Error)
		case jsAtomicIncomplete, jsAtomicInflight:
			return nil, fmt.Errorf("events: %s: %w: %w", what, ErrBatchNotCommitted, ack.Error)
		case jsAtomicDuplicate:
			return nil, fmt.Errorf("events: %s: %w: %w", what, ErrBatchDuplicate, ack.Error)
		}
		return nil, fmt.Errorf("events: %s: %w", what, mapJetStreamError(ack.Error))
	}
	if ack.Batch != id || ack.Count != len(msgs) || ack.Seq < uint64(len(msgs)) {
		return nil, fmt.Errorf("events: %s: acknowledgement for batch %q of %d at %d", what, ack.Batch, ack.Count, ack.Seq)
	}
	if stream != "" && ack.Stream != stream {
		return nil, fmt.Errorf("events: %s: stored in stream %q (sequences up to %d), not in %q; the subjects belong to another stream", what, ack.Stream, ack.Seq, stream)
	}
	seqs := make([]uint64, len(msgs))
	for i := range seqs {
		seqs[i] = ack.Seq - uint64(len(msgs)-1-i)
	}
	return seqs, nil
}
