package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"understudy/events"
)

// appender appends one actor's events to its subject, in order, with
// per-subject optimistic concurrency and a message id per event, from a
// goroutine of its own: an actor never blocks on NATS (a member must keep
// counting heartbeat timeouts while NATS is down). Events queue while NATS
// is unreachable and are retried — so is an append the stream leader could
// not decide yet (10164, events.ErrInFlight: an earlier attempt is still
// being proposed) — and a duplicate ack of its own earlier attempt (its
// message id carries this appender's nonce) is its own record, whatever
// stream sequence it names — once the record it names has been read back
// and found on this subject under this id (ownDuplicate: JetStream
// deduplicates ids across the whole stream, so a message another identity
// stored on its own subject under the id would otherwise swallow the
// event); a conflict means another process writes this
// subject — this process is a zombie or has a twin — and is reported
// through onConflict, after which the appender stops (events.AppendAckConflict
// decides). On a host's log (boundedLog) its appends wait for a turn in
// the host's gate, which sends them alone or batched with other members'
// (gate_appends.go).
type appender struct {
	log        events.Log
	subject    string
	logger     *slog.Logger
	onConflict func(error)
	onAppended func(events.Event, events.Ack)

	mu      sync.Mutex
	queue   []queuedEvent // unbounded: events are facts and must not be dropped
	wake    chan struct{} // size 1: a pending wake-up is enough
	stopped chan struct{}
	done    chan struct{}
	lastSeq uint64
	known   bool // lastSeq was read from the log (by replay or LastSequence)
	// nonce makes this appender's message ids its own: a retry of its own
	// append is deduplicated, while a twin process appending at the same
	// position gets a different id, so the server checks the expected
	// sequence and reports the conflict instead of a "duplicate".
	nonce string
	// eventID draws the random part of an event's message id; only the
	// run goroutine calls it. A test replaces it to reuse a known id.
	eventID func() string
}

// queuedEvent is an event waiting to be appended, with when it was queued
// (monotonic clock reading).
type queuedEvent struct {
	ev   events.Event
	born time.Time
	// id is the random part of the event's message id, drawn before its
	// first attempt and kept across its retries, so that a retry is
	// deduplicated against an earlier attempt that landed; "" until then,
	// and again when a message on another subject took the id.
	id string
}

// minQueued is the wait below which no events.HeaderQueued is stored: a
// send straight from the queue's head is not worth a header.
const minQueued = time.Millisecond

func newAppender(log events.Log, subject string, logger *slog.Logger) *appender {
	return &appender{
		log: log, subject: subject, logger: logger, nonce: randomHex(), eventID: randomHex,
		wake: make(chan struct{}, 1), stopped: make(chan struct{}), done: make(chan struct{}),
	}
}

// randomHex returns 64 random bits in hex: an appender's nonce, or the
// part of an event's message id nobody can guess before it is published.
func randomHex() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// errIDTaken reports an append not stored because a message on another
// subject already carries its message id; the event is appended again
// under a new one.
var errIDTaken = errors.New("message id taken by a message on another subject")

// ownDuplicate reports whether the record a duplicate ack names is this
// appender's earlier attempt at the append with msgID: the stream's record
// at ack.Sequence, on this subject, under msgID. Anything else — a message
// on another subject under the id (whoever may publish on any subject of
// the stream and has read this subject's records can try to take an id),
// or no record left at that sequence — means the append was not stored;
// that is logged here, once. An error means the record could not be read.
func (a *appender) ownDuplicate(ctx context.Context, msgID string, ack events.Ack) (bool, error) {
	rec, err := a.log.Record(ctx, ack.Sequence)
	found := err == nil
	if err != nil && !errors.Is(err, events.ErrNotFound) {
		return false, err
	}
	if found && rec.Subject == a.subject && rec.Headers["Nats-Msg-Id"] == msgID {
		return true, nil
	}
	if found {
		a.logger.Warn("a message on another subject carried this appender's message id; its event was not stored and is appended again under a new id",
			"subject", a.subject, "msg_id", msgID, "seq", ack.Sequence, "other_subject", rec.Subject,
			"other_msg_id", rec.Headers["Nats-Msg-Id"], "data", events.HexPrefix(rec.Data))
	} else {
		a.logger.Warn("the record a duplicate ack named is gone; the event was not stored and is appended again under a new id",
			"subject", a.subject, "msg_id", msgID, "seq", ack.Sequence)
	}
	return false, nil
}

// setLast records the subject's last sequence as found by a replay.
func (a *appender) setLast(seq uint64) {
	a.mu.Lock()
	a.lastSeq, a.known = seq, true
	a.mu.Unlock()
}

func (a *appender) start() { go a.run() }

// add queues events; it never blocks.
func (a *appender) add(evs ...events.Event) {
	if len(evs) == 0 {
		return
	}
	now := time.Now()
	a.mu.Lock()
	for _, ev := range evs {
		a.queue = append(a.queue, queuedEvent{ev: ev, born: now})
	}
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// maxForeign bounds how many records after its last sequence an appender
// reads to tell foreign records from another appender's.
const maxForeign = 1000

// conflictVerdict is what the records after an appender's last sequence
// say of a conflict (resolveConflict).
type conflictVerdict int

const (
	// verdictTwin: another appender's record (a twin or a zombie of this
	// actor), or a conflict no record explains: the conflict is real.
	verdictTwin conflictVerdict = iota
	// verdictForeign: only records no appender wrote (a tool, a typo, an
	// attacker's publish): skipped; the next append goes after them.
	verdictForeign
	// verdictLanded: this appender's own attempt at its head event was
	// stored (an attempt whose answer was lost, retried after its
	// duplicate could not be recognised): the append succeeded there.
	verdictLanded
)

// resolveConflict reads the subject's records after last, one direct get
// each (no consumer: a conflict comes when the store is slow). Foreign
// records before an own or another appender's record are reported once
// and passed over; with verdictLanded, seq is the own record's sequence.
// An error means the records could not be read: nothing is decided.
func (a *appender) resolveConflict(ctx context.Context, last uint64) (verdict conflictVerdict, seq uint64, err error) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var foreign []events.Record
	from := last + 1
	for {
		rec, err := a.log.RecordOn(rctx, a.subject, from)
		if errors.Is(err, events.ErrNotFound) {
			break
		}
		if err != nil {
			if len(foreign) > 0 {
				// Those read are foreign: passed over, so that the next
				// attempt reads on from after them.
				a.skip(foreign)
				return verdictForeign, 0, nil
			}
			return verdictTwin, 0, err
		}
		if nonce, ok := events.AppendedBy(rec); ok {
			if nonce != a.nonce {
				return verdictTwin, 0, nil
			}
			a.skip(foreign)
			return verdictLanded, rec.Sequence, nil
		}
		foreign = append(foreign, rec)
		if len(foreign) > maxForeign {
			// A flood no appender wrote: the subject is not this actor's
			// to write any more; conclude, as for a twin.
			a.logger.Error("more foreign records on an actor's subject than it passes over; taken for a conflict",
				"subject", a.subject, "after_seq", last, "limit", maxForeign)
			return verdictTwin, 0, nil
		}
		from = rec.Sequence + 1
	}
	if len(foreign) == 0 {
		return verdictTwin, 0, nil
	}
	a.skip(foreign)
	return verdictForeign, 0, nil
}

// skip reports foreign records once and moves the expected sequence past
// them: nothing of them reaches the actor.
func (a *appender) skip(foreign []events.Record) {
	if len(foreign) == 0 {
		return
	}
	for _, rec := range foreign {
		a.logger.Warn("foreign record on an actor's subject: skipped, never folded into its state",
			"subject", rec.Subject, "seq", rec.Sequence, "msg_id", rec.Headers["Nats-Msg-Id"], "data", events.HexPrefix(rec.Data))
	}
	a.mu.Lock()
	a.lastSeq = max(a.lastSeq, foreign[len(foreign)-1].Sequence)
	a.mu.Unlock()
}

// stop ends the goroutine; queued events not yet appended are logged as lost.
func (a *appender) stop() {
	select {
	case <-a.stopped:
	default:
		close(a.stopped)
	}
	<-a.done
}

// flush waits until the queue is empty or ctx ends.
func (a *appender) flush(ctx context.Context) error {
	for {
		a.mu.Lock()
		n := len(a.queue)
		a.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("appender %s: %d events not yet appended: %w", a.subject, n, ctx.Err())
		case <-a.done:
			return fmt.Errorf("appender %s stopped with %d events queued", a.subject, n)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func (a *appender) run() {
	defer close(a.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-a.stopped
		cancel()
	}()
	backoff := 100 * time.Millisecond
	for {
		a.mu.Lock()
		var ev events.Event
		var born time.Time
		var id string
		if len(a.queue) > 0 {
			if a.queue[0].id == "" {
				a.queue[0].id = a.eventID()
			}
			ev, born, id = a.queue[0].ev, a.queue[0].born, a.queue[0].id
		}
		known, last := a.known, a.lastSeq
		a.mu.Unlock()
		if ev == nil {
			select {
			case <-a.wake:
				continue
			case <-a.stopped:
				return
			}
		}
		err := func() error {
			log := a.log
			var queued *storeGate // the gate that queues and batches this appender's sends
			var batcher events.LogBatcher
			if g, ok := a.log.(boundedLog); ok {
				if b, ok := g.Log.(events.LogBatcher); ok {
					queued, batcher, log = g.gate, b, b
				} else {
					// Its turn is awaited without a deadline (until the
					// appender stops): the 5 s below is the store's to
					// answer in, and an append that only waited for its
					// turn is no failure to retry and report.
					release, err := g.gate.appendTurn(ctx)
					if err != nil {
						return err
					}
					defer release()
					log = g.Log
				}
			}
			actx, acancel := context.WithTimeout(ctx, appendTimeout)
			defer acancel()
			if !known {
				seq, err := log.LastSequence(actx, a.subject)
				if err != nil {
					return err
				}
				a.mu.Lock()
				a.lastSeq, a.known, last = seq, true, seq
				a.mu.Unlock()
			}
			opts := events.Expect(last)
			opts.MsgID = events.AppenderMsgID(a.subject, last+1, a.nonce, id)
			var ack events.Ack
			var err error
			if queued != nil {
				// Queued for its turn (no deadline but the appender's
				// stop), then sent with the gate's own, alone or batched;
				// dated when it is sent.
				data, eerr := log.Codec().Encode(ev)
				if eerr != nil {
					return eerr
				}
				ack, err = queued.appendQueued(ctx, batcher, events.LogAppend{Subject: a.subject, Data: data, Opts: opts}, born)
			} else {
				if w := time.Since(born); w >= minQueued {
					// It waited (behind others, or retried while NATS was out of
					// reach): the record dates it when it happened.
					opts.Headers = map[string]string{events.HeaderQueued: strconv.FormatInt(int64(w), 10)}
				}
				ack, err = log.Append(actx, a.subject, ev, opts)
			}
			if err != nil {
				return err
			}
			if ack.Duplicate {
				own, err := a.ownDuplicate(actx, opts.MsgID, ack)
				if err != nil {
					return fmt.Errorf("duplicate ack at sequence %d not checked (its record could not be read): %w", ack.Sequence, err)
				}
				if !own {
					a.mu.Lock()
					a.queue[0].id = "" // the next attempt draws a new one
					a.mu.Unlock()
					return errIDTaken
				}
			}
			if err := events.AppendAckConflict(last, opts.MsgID, ack); err != nil {
				return err
			}
			a.mu.Lock()
			a.lastSeq = ack.Sequence
			a.queue = a.queue[1:]
			a.mu.Unlock()
			if a.onAppended != nil {
				a.onAppended(ev, ack)
			}
			return nil
		}()
		switch {
		case err == nil:
			backoff = 100 * time.Millisecond
		case errors.Is(err, events.ErrConflict):
			verdict, seq, rerr := a.resolveConflict(ctx, last)
			switch {
			case rerr != nil && ctx.Err() == nil:
				// Undecided: a twin would show in its records, which the
				// store could not serve now. Retried, never concluded.
				a.logger.Warn("event append conflict not resolved: the subject's records could not be read; retrying",
					"subject", a.subject, "expected_last_seq", last, "retry_in", backoff, "err", err, "read_err", rerr)
				select {
				case <-time.After(backoff):
				case <-a.stopped:
					return
				}
				backoff = min(backoff*2, 5*time.Second)
				continue
			case verdict == verdictForeign:
				continue // only foreign records moved the subject: append after them
			case verdict == verdictLanded:
				a.mu.Lock()
				a.lastSeq = seq
				a.queue = a.queue[1:]
				a.mu.Unlock()
				backoff = 100 * time.Millisecond
				if a.onAppended != nil {
					a.onAppended(ev, events.Ack{Sequence: seq, Duplicate: true})
				}
				continue
			case ctx.Err() != nil:
				return
			}
			a.mu.Lock()
			lost := len(a.queue)
			a.mu.Unlock()
			a.logger.Error("another process appends to this actor's subject: stopping its appender",
				"subject", a.subject, "expected_last_seq", last, "queued", lost, "err", err)
			if a.onConflict != nil {
				a.onConflict(err)
			}
			return
		case ctx.Err() != nil:
			return
		default:
			if !errors.Is(err, errIDTaken) { // ownDuplicate logged it
				a.logger.Warn("event append failed, retrying", "subject", a.subject, "type", ev.EventType(), "retry_in", backoff, "err", err)
			}
			select {
			case <-time.After(backoff):
			case <-a.stopped:
				return
			}
			backoff = min(backoff*2, 5*time.Second)
		}
	}
}
