package simulations

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"understudy/events"
)

// appender is the runtime's event appender: one append in flight per
// subject, expected last subject sequence and a message id per event
// (events.AppenderMsgID), retried after a timeout. Its queue dies with the
// process.
type appender struct {
	subject  string
	queue    [][]byte
	born     []time.Duration // the node's local clock when each queued event was produced
	marks    []int32         // 1 + the index of the outage a queued serving_started ends (0: none)
	ids      []string        // the random part of each queued event's message id ("": not drawn yet)
	inflight bool
	waiting  bool          // a failed attempt's backoff runs
	backoff  time.Duration // the next backoff (0: the first)
	attempt  uint64
	deadline time.Duration // the attempt's: its context ends appendTimeout after it was sent
	issued   uint64        // the latest attempt its node's gate issued (appendbatch.go)
	last     uint64
	known    bool
	stopped  bool
}

func (s *sim) appendEvent(n *node, stream int, ev events.Event) {
	data, err := s.codec.Encode(ev)
	if err != nil {
		panic(fmt.Sprintf("simulator: encode %s: %v", ev.EventType(), err))
	}
	s.tr.bytes(data)
	if s.tw != nil {
		s.tracef(n.site, "%s", describe(ev))
	}
	a := &n.apps[stream]
	a.queue = append(a.queue, data)
	a.born = append(a.born, n.clk.local(s.now))
	a.marks = append(a.marks, s.markEvent(n, stream, ev))
	a.ids = append(a.ids, "")
	s.pump(n, stream)
}

// pump sends the head of an appender's queue, one append in flight at a
// time, as the runtime's appender does.
func (s *sim) pump(n *node, stream int) {
	a := &n.apps[stream]
	if a.inflight || a.waiting || len(a.queue) == 0 || !n.alive || a.stopped {
		return
	}
	s.attempts++
	a.inflight, a.attempt, a.deadline = true, s.attempts, s.now+appendTimeout
	if a.ids[0] == "" {
		// Drawn before the event's first attempt and kept across its
		// retries, as the runtime's appender does.
		a.ids[0] = hex.EncodeToString(binary.BigEndian.AppendUint64(nil, n.idRNG.Uint64()))
	}
	id := n.nonce // the server completes it once it has looked the last sequence up
	if a.known {
		id = msgID(a.subject, a.last, n.nonce, a.ids[0])
	}
	ref := s.alloc(msg{kind: mAppend, inc: n.inc, stream: int8(stream), data: a.queue[0], last: a.last, known: a.known, attempt: a.attempt,
		queued: n.clk.local(s.now) - a.born[0], mark: a.marks[0], id: id, event: a.ids[0], pair: s.pi, alone: s.appendUncertain(n.machine, a.subject)})
	s.issue(n.machine, gateAppends, ref, s.now+appendTimeout)
	s.push(item{at: s.now + appendTimeout, kind: evAppendTimeout, node: int8(n.idx), ref: s.appRef(stream), gen: a.attempt})
}

// retryLater schedules the next attempt of an appender after its
// backoff (the runtime's: 100ms, doubling up to 5s, reset by a success).
func (s *sim) retryLater(n *node, stream int) {
	a := &n.apps[stream]
	if a.backoff == 0 {
		a.backoff = appendBackoff
	}
	a.waiting = true
	s.push(item{at: s.now + a.backoff, kind: evAppendRetry, node: int8(n.idx), ref: s.appRef(stream), gen: a.attempt})
	a.backoff = min(2*a.backoff, appendTimeout)
}

// appenderTimer handles an appender's timer: its attempt timed out
// (evAppendTimeout) or the backoff after a failed one ended
// (evAppendRetry). gen is the attempt it was set for.
func (s *sim) appenderTimer(n *node, stream int, it item) {
	a := &n.apps[stream]
	switch {
	case !n.alive || a.attempt != it.gen:
	case it.kind == evAppendTimeout && a.inflight:
		// The runtime's attempt ends with its context: a failed
		// attempt, retried after the backoff.
		a.inflight = false
		s.count(cAppendRetried)
		if a.issued == a.attempt {
			s.markAppendUncertain(n.machine, a.subject) // appendbatch.go
		}
		s.retryLater(n, stream)
	case it.kind == evAppendRetry && a.waiting:
		a.waiting = false
		s.pump(n, stream)
	}
}

// appRef is the ref of an appender's queue items: its stream and pair.
func (s *sim) appRef(stream int) int32 { return int32(stream) | s.pi<<1 }

// msgID is the runtime appender's message id for the append of an event
// after sequence last: subject@position/nonce/event.
func msgID(subject string, last uint64, nonce, event string) string {
	return events.AppenderMsgID(subject, last+1, nonce, event)
}

// appendAcked handles the answer to an appender's attempt (message ref).
func (s *sim) appendAcked(n *node, ref int32) {
	m := &s.msgs[ref]
	stream, attempt := int(m.stream), m.attempt
	last, id, code := m.last, m.id, m.code
	ack := events.Ack{Sequence: m.seq, Duplicate: m.dup}
	retried := m.retried
	s.release(ref)
	a := &n.apps[stream]
	if !a.inflight || a.attempt != attempt {
		return
	}
	a.inflight = false
	// The runtime's appender, step by step: the client maps the
	// refusal (the retry of an append that landed past the dedup window
	// is refused with 10071, and the client reads the subject's record
	// after last to recognise its first attempt, JetStreamLog.findRetried:
	// the server's MemoryLog answers the duplicate the read finds, and the
	// read may fail, when the client answers the 10071); the answer is
	// judged by events.AppendAckConflict.
	if retried && !s.storeRead(n.machine, a.deadline) {
		s.count(cRetryUnrecognised)
		s.tracef(n.site, "the retry of %s landed at seq %d more than %v ago; the client's read of it failed: 10071", id, ack.Sequence, dedupWindow)
		code, ack = codeWrongLast, events.Ack{}
	}
	if code != 0 {
		err := events.APIError(int(code), descOf(code))
		if !errors.Is(err, events.ErrConflict) {
			s.retryLater(n, stream)
			return
		}
		s.appendConflict(n, stream, last, err)
		return
	}
	if ack.Duplicate && !s.ownDuplicate(n, stream, id, ack) {
		return
	}
	if err := events.AppendAckConflict(last, id, ack); err != nil {
		s.appendConflict(n, stream, last, err)
		return
	}
	if ack.Duplicate {
		s.count(cDuplicateAck)
	}
	s.appended(n, stream, ack.Sequence)
}

// appended: the head event of an appender's queue is stored at seq; the
// next is sent.
func (s *sim) appended(n *node, stream int, seq uint64) {
	a := &n.apps[stream]
	a.last, a.known, a.backoff = seq, true, 0
	a.queue[0] = nil
	a.queue, a.born, a.marks, a.ids = a.queue[1:], a.born[1:], a.marks[1:], a.ids[1:]
	s.pump(n, stream)
}

// ownDuplicate is the runtime appender's check of a duplicate ack: it
// reads the record the ack names, which counts only when it is on the
// appender's subject under its id (JetStream deduplicates ids across the
// whole stream: a message another identity stored under it on a subject
// of its own would swallow the event). When the record cannot be read the
// attempt is retried; when it is another's, or gone, the event is
// appended again under a new id. It reports whether the record is its
// own; when not, the next attempt is scheduled.
func (s *sim) ownDuplicate(n *node, stream int, id string, ack events.Ack) bool {
	a := &n.apps[stream]
	if !s.reachable(n.machine) {
		s.retryLater(n, stream)
		return false
	}
	rec, found := s.server.recordAt(ack.Sequence)
	if found && rec.Subject == a.subject && rec.Headers["Nats-Msg-Id"] == id {
		return true
	}
	s.count(cAppendIDTaken)
	s.tracef(n.site, "the duplicate ack of %s names seq %d (on %q), not its own record: appended again under a new id", id, ack.Sequence, rec.Subject)
	a.ids[0] = ""
	s.retryLater(n, stream)
	return false
}

// appendConflict: an attempt met a conflict (10071, or a duplicate ack
// events.AppendAckConflict refuses). As the runtime's appender does
// (resolveConflict), it reads the subject's records after last, one
// message get each, before it concludes anything: its own record (its
// nonce) means its attempt at the head event landed there; only records
// no appender wrote are skipped and the event appended after them; a
// read that fails decides nothing and the attempt is retried. Another
// appender's record, or none, is a real conflict: the runtime's member
// then fences its resource (if it served or held the register) and stops
// for good; the node's process keeps running, and only a restart of the
// process brings a member back. So does the model: the resource stops
// serving at once and the member is gone (halted) until the process
// restarts (a crash or power cut that ends).
func (s *sim) appendConflict(n *node, stream int, last uint64, err error) {
	a := &n.apps[stream]
	verdict, seq, read := s.resolveConflict(n, stream, last)
	switch {
	case !read:
		s.count(cConflictUnread)
		s.tracef(n.site, "event append conflict on %s: %v; the records after seq %d could not be read: retried", a.subject, err, last)
		s.retryLater(n, stream)
		return
	case verdict == verdictForeign:
		s.count(cConflictForeign)
		s.tracef(n.site, "event append conflict on %s: only foreign records after seq %d, skipped to %d", a.subject, last, seq)
		a.last, a.known = seq, true
		s.pump(n, stream)
		return
	case verdict == verdictLanded:
		s.count(cConflictOwnLanded)
		s.tracef(n.site, "event append conflict on %s: its own attempt landed at seq %d", a.subject, seq)
		s.appended(n, stream, seq)
		return
	}
	s.count(cAppendConflict)
	s.tracef(n.site, "event append conflict on %s: %v; member stops for good", a.subject, err)
	s.inv.memberStopped(s, n, a.subject, last, err)
	s.halt(n)
}

// conflictVerdict is what the records after an appender's last sequence
// say of a conflict (the runtime's, runtime/appender.go).
type conflictVerdict int

const (
	verdictTwin    conflictVerdict = iota + 1 // another appender's record, or none: a real conflict
	verdictForeign                            // only records no appender wrote: skipped
	verdictLanded                             // its own attempt at the head event landed
)

// resolveConflict reads the records on an appender's subject after last,
// one message get each (storeRead: each may fail, with a deadline of its
// own), as the runtime's resolveConflict does. seq is the own record's
// sequence (verdictLanded) or the last foreign record's (verdictForeign);
// read false: a read failed and nothing is decided.
func (s *sim) resolveConflict(n *node, stream int, last uint64) (verdict conflictVerdict, seq uint64, read bool) {
	a := &n.apps[stream]
	by := s.now + appendTimeout
	var recs []events.Record
	s.server.recordsAfter(a.subject, last, func(rec events.Record) { recs = append(recs, rec) })
	for i, rec := range recs {
		if i > maxForeign || !s.storeRead(n.machine, by) {
			return verdictTwin, 0, false
		}
		if nonce, ok := events.AppendedBy(rec); ok {
			if nonce != n.nonce {
				return verdictTwin, 0, true
			}
			return verdictLanded, rec.Sequence, true
		}
		seq = rec.Sequence
	}
	// The get that finds no further record.
	if !s.storeRead(n.machine, by) {
		return verdictTwin, 0, false
	}
	if seq == 0 {
		return verdictTwin, 0, true
	}
	return verdictForeign, seq, true
}

// maxForeign bounds the foreign records an appender reads past (the
// runtime's: more is undecided).
const maxForeign = 1000

func descOf(code int32) string {
	if code == codeInFlight {
		return descInFlight
	}
	return descWrongLast
}
