package events

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// AppendAckConflict judges the answer to a conditional append that an
// appender sent expecting the subject's last sequence to be last, with a
// message id of its own. It returns an error wrapping ErrConflict when the
// answer proves that another process appends to the subject, nil when the
// append is this appender's own record. The runtime's appender and the
// simulator's model of it both decide through it, so the simulator finds
// what this rule gets wrong.
//
// A duplicate ack names the record stored under this message id — in the
// whole stream, not only on the subject: JetStream deduplicates ids stream
// wide, so the caller must first check that the record it names is on its
// subject under its id (the runtime appender reads it back); a message
// another identity stored on a subject of its own under the id does not
// hold the append. When the record is the appender's and the id carries the
// appender's nonce (subject@position/nonce/event, as the runtime appender
// writes it), no other process uses it: the record is this appender's own
// earlier attempt — a retry after a lost answer, or a
// publish the NATS client buffered while disconnected that landed before
// its retry. Its sequence is a stream sequence, shared by every subject, so
// it need not be last+1; it must only come after last, as the first
// attempt, sent with the same expectation, was stored after it. A
// duplicate at or before last, or of an id without a nonce (which a twin
// appending at the same position would share), cannot come from a retry.
func AppendAckConflict(last uint64, msgID string, ack Ack) error {
	switch {
	case !ack.Duplicate:
		return nil
	case ack.Sequence <= last:
		return fmt.Errorf("%w: message id %s already stored at sequence %d, not after the subject's last sequence %d", ErrConflict, msgID, ack.Sequence, last)
	case !hasNonce(msgID):
		return fmt.Errorf("%w: message id %s (no nonce: a twin's would be the same) already stored at sequence %d", ErrConflict, msgID, ack.Sequence)
	}
	return nil
}

// hasNonce reports whether a message id ends in an appender's nonce:
// subject@position/nonce, or subject@position/nonce/event.
func hasNonce(msgID string) bool {
	at := strings.LastIndexByte(msgID, '@')
	if at < 0 {
		return false
	}
	_, ok := appenderNonce(msgID[at+1:])
	return ok
}

// appenderNonce parses what follows "subject@" in an appender's message
// id: position/nonce (as appenders wrote it before ids had an event part)
// or position/nonce/event, the position in decimal.
func appenderNonce(rest string) (nonce string, ok bool) {
	pos, tail, found := strings.Cut(rest, "/")
	if !found || pos == "" || strings.IndexFunc(pos, func(r rune) bool { return r < '0' || r > '9' }) >= 0 {
		return "", false
	}
	nonce, event, hasEvent := strings.Cut(tail, "/")
	if nonce == "" || hasEvent && (event == "" || strings.IndexByte(event, '/') >= 0) {
		return "", false
	}
	return nonce, true
}

// AppenderMsgID is the message id an appender with nonce gives the
// append of one event it expects to land at position pos of subject (one
// after the subject's last sequence it knows): subject@pos/nonce/event.
// The nonce, the same for all of an appender's appends, tells its records
// from a twin's (AppendedBy); event is drawn at random for each event
// (and kept across that event's retries, which must deduplicate), so that
// nobody who has read the appender's records can tell its next id:
// JetStream deduplicates ids across the whole stream, and a message stored
// under that id on any other subject would make the append a "duplicate".
// An empty event gives subject@pos/nonce.
func AppenderMsgID(subject string, pos uint64, nonce, event string) string {
	id := subject + "@" + strconv.FormatUint(pos, 10) + "/" + nonce
	if event != "" {
		id += "/" + event
	}
	return id
}

// AppendedBy returns the nonce of the appender that stored rec, from its
// message id (not the id's event part); ok is false for a record no
// appender wrote on this subject (no message id, or one of another shape
// or subject): a foreign record, which an actor skips and never folds into
// its state.
func AppendedBy(rec Record) (nonce string, ok bool) {
	rest, found := strings.CutPrefix(rec.Headers["Nats-Msg-Id"], rec.Subject+"@")
	if !found {
		return "", false
	}
	return appenderNonce(rest)
}

// HexPrefix shows a value that does not decode in a report: its length
// and its first bytes in hex.
func HexPrefix(b []byte) string {
	const n = 16
	if len(b) <= n {
		return fmt.Sprintf("%d bytes %x", len(b), b)
	}
	return fmt.Sprintf("%d bytes %x…", len(b), b[:n])
}

// APIError is the error a JetStream server answers with numeric error code
// code, mapped to the events identities as every JetStream call here maps
// it (ErrConflict, ErrNotFound, ...). The simulator's server answers
// through it, so a simulated refusal is classified exactly as a real one.
func APIError(code int, description string) error {
	return mapJetStreamError(&jetstream.APIError{Code: 400, ErrorCode: jetstream.ErrorCode(code), Description: description})
}

// KVAPIError is the error a KV write gets when the server refuses it with
// numeric error code code, as nats.go's KV client hands it over — Create
// and Update wrap a wrong-last-sequence answer (10071, or 10164) with
// their own sentinels (ErrKeyExists, ErrKeyRevisionMismatch) — mapped as
// every KV call here maps it. create selects Create, otherwise Update.
// The simulator's server answers KV refusals through it, so the order in
// which the mapping looks at codes and sentinels is exercised too.
func KVAPIError(create bool, code int, description string) error {
	api := &jetstream.APIError{Code: 400, ErrorCode: jetstream.ErrorCode(code), Description: description}
	var err error = api
	wrongLast := code == int(jetstream.JSErrCodeStreamWrongLastSequence) || code == int(jetstream.JSErrCodeStreamWrongLastSequenceConstant)
	switch {
	case !wrongLast:
	case create && errors.Is(api, jetstream.ErrKeyExists):
		err = fmt.Errorf("%w: key exists", api)
	case create:
		err = fmt.Errorf("%w: %w", api, jetstream.ErrKeyExists)
	default:
		err = fmt.Errorf("%w: %w", api, jetstream.ErrKeyRevisionMismatch)
	}
	return mapJetStreamError(err)
}
