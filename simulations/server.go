package simulations

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/events"
)

// Names of the simulated JetStream assets, as the runtime provisions them.
const (
	DefaultBucket = events.DefaultFailoverBucket
	DefaultStream = events.DefaultEventsStream
)

// FsyncMode is when the simulated server makes acknowledged writes durable.
type FsyncMode int

const (
	// FsyncAlways syncs every write before acknowledging it (what understudy
	// provisions for everything that decides leadership).
	FsyncAlways FsyncMode = iota + 1
	// FsyncInterval syncs every FsyncInterval (nats-server's default file
	// store behaviour): a power cut loses what was acknowledged since.
	FsyncInterval
)

func (m FsyncMode) String() string {
	switch m {
	case FsyncAlways:
		return "always"
	case FsyncInterval:
		return "interval"
	}
	return "unset"
}

// ParseFsync reads "always" or "interval".
func ParseFsync(s string) (FsyncMode, error) {
	switch s {
	case "always":
		return FsyncAlways, nil
	case "interval":
		return FsyncInterval, nil
	}
	return 0, fmt.Errorf("fsync must be always or interval, got %q", s)
}

// DefaultFsyncInterval is nats-server's default sync interval.
const DefaultFsyncInterval = 2 * time.Minute

// ServerOptions configure a simulated JetStream server.
type ServerOptions struct {
	Bucket string // KV bucket; default DefaultBucket
	Stream string // event stream; default DefaultStream
	// Codec encodes events; nil: a registry with the failover and procedure events.
	Codec         *events.Registry
	Fsync         FsyncMode     // default FsyncAlways
	FsyncInterval time.Duration // default DefaultFsyncInterval
	Start         time.Time     // the server clock at virtual time 0; default Epoch
}

// Server is the simulated JetStream server: one KV bucket (history 64) and
// one event stream, built on events.MemoryKV and events.MemoryLog with
// timestamps from the server's own (virtual) clock, so they have the
// semantics the conformance suite pins down. On top it models availability
// (the server can be down), durability (fsync always or interval: a power
// cut loses what was acknowledged but not yet synced) and clock bumps.
//
// Outside a simulation (tests, the conformance suite) it is an ordinary
// in-memory store whose clock moves with Advance; KV and Log are then safe
// for concurrent use.
type Server struct {
	opts  ServerOptions
	clock serverClock
	kv    *events.MemoryKV
	log   *events.MemoryLog

	down      bool
	offset    time.Duration // server clock minus virtual time (clock bumps)
	vnow      time.Duration // virtual time of the last operation
	logSeq    uint64        // last stream sequence
	syncedRev uint64        // with FsyncInterval: what a power cut keeps
	syncedSeq uint64
	nextSync  time.Duration
	journal   []events.Entry // every KV write in revision order, when kept
	keep      bool
	// The stream's records by subject, as the simulator appended them
	// (appendEvent, publish): reading a subject of the MemoryLog scans the
	// whole stream, and a node's restart replays one subject per pair.
	// subjects holds each record's subject by sequence; mirrorOff: the
	// stream holds records the mirror missed (appended through Log), so
	// reads go to the MemoryLog.
	subjects  []string
	bySubject map[string][]events.Record
	mirrorOff bool
	hdr       map[string]string // reused for HeaderQueued (AppendRaw reads it, keeps nothing)
	// published: the message ids publish stored (a client that is not an
	// appender), kept for good: appendable's check of a batch.
	published map[string]struct{}
}

// NewServer returns a running server with empty stores.
func NewServer(o ServerOptions) *Server {
	if o.Bucket == "" {
		o.Bucket = DefaultBucket
	}
	if o.Stream == "" {
		o.Stream = DefaultStream
	}
	if o.Codec == nil {
		o.Codec = NewCodec()
	}
	if o.Fsync == 0 {
		o.Fsync = FsyncAlways
	}
	if o.FsyncInterval <= 0 {
		o.FsyncInterval = DefaultFsyncInterval
	}
	if o.Start.IsZero() {
		o.Start = Epoch
	}
	s := &Server{opts: o, keep: o.Fsync == FsyncInterval}
	s.clock.set(o.Start)
	s.offset = 0
	s.kv = events.NewMemoryKV(o.Bucket, &s.clock, events.MemoryHistory(events.HistoryLimit))
	s.log = events.NewMemoryLog(o.Stream, &s.clock, o.Codec, events.MemoryDedupWindow(dedupWindow))
	s.nextSync = o.FsyncInterval
	return s
}

// NewCodec returns a registry with every event type the simulator hosts.
func NewCodec() *events.Registry {
	reg := events.NewRegistry()
	if err := failover.RegisterEvents(reg); err != nil {
		panic(err)
	}
	if err := procedure.RegisterEvents(reg); err != nil {
		panic(err)
	}
	return reg
}

// KV is the server's bucket; it takes atomic batches.
func (s *Server) KV() events.KVBatcher { return s.kv }

// Log is the server's event stream.
func (s *Server) Log() events.Log { return s.log }

// Now is the server clock's reading.
func (s *Server) Now() time.Time { return s.clock.Now() }

// Advance moves virtual time, and with it the server clock, forward by d.
// It is for use outside a simulation (the conformance suite).
func (s *Server) Advance(d time.Duration) { s.at(s.vnow + d) }

// at sets virtual time t before an operation, and syncs first when an
// fsync interval has passed.
func (s *Server) at(t time.Duration) {
	s.vnow = t
	s.clock.set(s.opts.Start.Add(t + s.offset))
	if s.opts.Fsync == FsyncInterval && t >= s.nextSync {
		s.syncedRev, s.syncedSeq = s.kv.Revision(), s.logSeq
		s.nextSync = (t/s.opts.FsyncInterval + 1) * s.opts.FsyncInterval
	}
}

// keepJournal makes the server remember every KV write (for an export).
func (s *Server) keepJournal() { s.keep = true }

var bg = context.Background()

// writeResult is what the server answers to a member's write.
type writeResult struct {
	ok       bool
	conflict bool
	rev      uint64
	ts       time.Time
	current  events.Entry // the key's latest entry after a conflict (Revision 0: none)
}

// write performs a member's KV write at virtual time t.
func (s *Server) write(t time.Duration, w *failover.Write) writeResult {
	s.at(t)
	var rev uint64
	var err error
	switch {
	case w.Put:
		rev, err = s.kv.Put(bg, w.Key, w.Value)
	case w.ExpectRev == 0:
		rev, err = s.kv.Create(bg, w.Key, w.Value)
	default:
		rev, err = s.kv.Update(bg, w.Key, w.Value, w.ExpectRev)
	}
	if err != nil {
		if !errors.Is(err, events.ErrConflict) {
			panic(fmt.Sprintf("simulated server: write %s: %v", w.Key, err))
		}
		r := writeResult{conflict: true}
		if e, gerr := s.kv.Get(bg, w.Key); gerr == nil {
			r.current = e
		}
		return r
	}
	ts := s.clock.Now()
	if s.keep {
		s.journal = append(s.journal, events.Entry{Bucket: s.opts.Bucket, Key: w.Key, Value: w.Value, Revision: rev, Time: ts, Op: events.OpPut})
	}
	return writeResult{ok: true, rev: rev, ts: ts}
}

// writeBatch performs members' KV writes at virtual time t as one atomic
// batch (events.KVBatcher): all land, at consecutive revisions in order
// and with one timestamp, or none does (ok false: an expectation failed).
func (s *Server) writeBatch(t time.Duration, ws []*failover.Write) (revs []uint64, ts time.Time, ok bool) {
	s.at(t)
	kw := make([]events.KVWrite, len(ws))
	for i, w := range ws {
		kw[i] = events.KVWrite{Key: w.Key, Value: w.Value, Put: w.Put, Revision: w.ExpectRev}
	}
	revs, err := s.kv.WriteBatch(bg, kw)
	if err != nil {
		if !errors.Is(err, events.ErrConflict) {
			panic(fmt.Sprintf("simulated server: batch of %d: %v", len(ws), err))
		}
		return nil, time.Time{}, false
	}
	ts = s.clock.Now()
	if s.keep {
		for i, w := range ws {
			s.journal = append(s.journal, events.Entry{Bucket: s.opts.Bucket, Key: w.Key, Value: w.Value, Revision: revs[i], Time: ts, Op: events.OpPut})
		}
	}
	return revs, ts, true
}

// put is an operator's unconditional write (a switchover request).
func (s *Server) put(t time.Duration, key string, value []byte) (uint64, time.Time) {
	w := failover.Write{Key: key, Value: value, Put: true}
	r := s.write(t, &w)
	return r.rev, r.ts
}

// dedupWindow is the event stream's duplicate window (JetStream's
// default).
const dedupWindow = 2 * time.Minute

// appendResult answers an event append.
type appendResult struct {
	seq       uint64
	duplicate bool
	// retried: the duplicate is a retry of an append that landed longer
	// than the dedup window ago. The server refused it (10071); the
	// client recognised its own first attempt by reading it back
	// (JetStreamLog.findRetried), a read that may fail (world.storeRead).
	retried bool
	code    int32  // a JetStream error code (0: stored)
	last    uint64 // the expectation the append carried
	id      string // its message id
}

// appendEvent stores one encoded event with the runtime appender's options:
// expected last subject sequence (looked up first when unknown; id is then
// the appender's nonce, and the message id is completed here with the
// event's part), the message id, and how long the event waited on its node
// (events.HeaderQueued, when it did). A refusal is answered with its
// JetStream error code.
func (s *Server) appendEvent(t time.Duration, subject string, data []byte, last uint64, known bool, queued time.Duration, id, event string) appendResult {
	s.at(t)
	if !known {
		last, _ = s.log.LastSequence(bg, subject)
		id = msgID(subject, last, id, event)
	}
	opts := events.Expect(last)
	opts.MsgID = id
	if queued > 0 {
		if s.hdr == nil {
			s.hdr = make(map[string]string, 1)
		}
		s.hdr[events.HeaderQueued] = strconv.FormatInt(int64(queued), 10)
		opts.Headers = s.hdr
	}
	ack, err := s.log.AppendRaw(bg, subject, data, opts)
	if err != nil {
		if errors.Is(err, events.ErrConflict) {
			return appendResult{code: codeWrongLast, last: last, id: id}
		}
		panic(fmt.Sprintf("simulated server: append %s: %v", subject, err))
	}
	s.logSeq = max(s.logSeq, ack.Sequence)
	s.mirror(ack)
	return appendResult{seq: ack.Sequence, duplicate: ack.Duplicate, retried: ack.Duplicate && s.pastDedup(ack.Sequence), last: last, id: id}
}

// appendable reports whether appendEvent would store an append (its
// arguments as appendEvent takes them) as a new record now: its expected
// subject sequence holds and its message id is not one the stream may
// hold. The atomic batch's check (events.LogBatcher); published ids are
// kept past the dedup window, so it may refuse one JetStream would take,
// never the reverse.
func (s *Server) appendable(subject string, last uint64, known bool, id, event string) bool {
	cur, _ := s.log.LastSequence(bg, subject)
	if !known {
		last, id = cur, msgID(subject, cur, id, event)
	}
	if cur != last {
		return false
	}
	_, taken := s.published[id]
	return !taken
}

// pastDedup reports whether the record at seq was stored a dedup window or
// more ago: a duplicate ack naming it did not come from the window (an id
// is remembered with its record's time) but from MemoryLog's recognition
// of a retry, which stands for the client's (findRetried).
func (s *Server) pastDedup(seq uint64) bool {
	rec, ok := s.recordAt(seq)
	return ok && s.clock.Now().Sub(rec.Time) >= dedupWindow
}

// publish stores a message under message id id, with no expectation (a
// client that is not an appender: the message-id forger).
func (s *Server) publish(t time.Duration, subject string, data []byte, id string) events.Ack {
	s.at(t)
	ack, err := s.log.AppendRaw(bg, subject, data, events.AppendOptions{MsgID: id})
	if err != nil {
		panic(fmt.Sprintf("simulated server: publish %s: %v", subject, err))
	}
	if s.published == nil {
		s.published = map[string]struct{}{}
	}
	s.published[id] = struct{}{}
	s.logSeq = max(s.logSeq, ack.Sequence)
	s.mirror(ack)
	return ack
}

// mirror adds the record an append just stored (the stream's last: a
// read of one record) to the records by subject.
func (s *Server) mirror(ack events.Ack) {
	if ack.Duplicate || s.mirrorOff {
		return
	}
	if ack.Sequence != uint64(len(s.subjects))+1 {
		s.mirrorOff = true
		return
	}
	for rec, err := range s.log.Read(bg, events.ReadOptions{FromSeq: ack.Sequence}) {
		if err != nil || rec.Sequence != ack.Sequence {
			s.mirrorOff = true
			return
		}
		s.keepRecord(rec)
		return
	}
	s.mirrorOff = true
}

func (s *Server) keepRecord(rec events.Record) {
	if s.bySubject == nil {
		s.bySubject = map[string][]events.Record{}
	}
	s.subjects = append(s.subjects, rec.Subject)
	s.bySubject[rec.Subject] = append(s.bySubject[rec.Subject], rec)
}

// mirrored reports whether the records by subject hold the whole stream.
func (s *Server) mirrored() bool { return !s.mirrorOff && uint64(len(s.subjects)) == s.logSeq }

// lastRecord is a subject's latest record (ok false: none).
func (s *Server) lastRecord(subject string) (events.Record, bool) {
	if s.mirrored() {
		recs := s.bySubject[subject]
		if len(recs) == 0 {
			return events.Record{}, false
		}
		return recs[len(recs)-1], true
	}
	last, err := s.log.LastSequence(bg, subject)
	if err != nil || last == 0 {
		return events.Record{}, false
	}
	return s.recordAt(last)
}

// recordAt is the stream's record at sequence seq (ok false: none).
func (s *Server) recordAt(seq uint64) (events.Record, bool) {
	if s.mirrored() {
		if seq == 0 || seq > uint64(len(s.subjects)) {
			return events.Record{}, false
		}
		recs := s.bySubject[s.subjects[seq-1]]
		i := sort.Search(len(recs), func(i int) bool { return recs[i].Sequence >= seq })
		return recs[i], true
	}
	for rec, err := range s.log.Read(bg, events.ReadOptions{FromSeq: seq}) {
		return rec, err == nil && rec.Sequence == seq
	}
	return events.Record{}, false
}

// recordsAfter calls fn with every record on subject after sequence last
// (the checkers' ground truth).
func (s *Server) recordsAfter(subject string, last uint64, fn func(rec events.Record)) {
	if s.mirrored() {
		recs := s.bySubject[subject]
		i := sort.Search(len(recs), func(i int) bool { return recs[i].Sequence > last })
		for _, rec := range recs[i:] {
			fn(rec)
		}
		return
	}
	for rec, err := range s.log.Read(bg, events.ReadOptions{Subject: subject, FromSeq: last + 1}) {
		if err != nil {
			return
		}
		fn(rec)
	}
}

// records returns a subject's records in order (a restart's replay); the
// caller must not modify them.
func (s *Server) records(subject string) []events.Record {
	if s.mirrored() {
		return s.bySubject[subject]
	}
	var out []events.Record
	for rec, err := range s.log.Read(bg, events.ReadOptions{Subject: subject}) {
		if err != nil {
			break
		}
		out = append(out, rec)
	}
	return out
}

// stop takes the server down. With powerLoss and FsyncInterval, whatever
// was acknowledged since the last sync is lost; it returns how many KV
// writes and events were.
func (s *Server) stop(t time.Duration, powerLoss bool) (lostKV, lostEvents int) {
	s.at(t)
	s.down = true
	if !powerLoss || s.opts.Fsync != FsyncInterval {
		return 0, 0
	}
	lostKV = int(s.kv.Revision() - s.syncedRev)
	lostEvents = int(s.logSeq - s.syncedSeq)
	if lostKV == 0 && lostEvents == 0 {
		return 0, 0
	}
	s.rollback()
	return lostKV, lostEvents
}

// rollback rebuilds both stores from what was synced: the KV from the
// journal (revisions are assigned in the same order, so they come out the
// same), the log from its own records.
func (s *Server) rollback() {
	now := s.clock.Now()
	kv := events.NewMemoryKV(s.opts.Bucket, &s.clock, events.MemoryHistory(events.HistoryLimit))
	for _, e := range s.journal[:s.syncedRev] {
		s.clock.set(e.Time)
		if _, err := kv.Put(bg, e.Key, e.Value); err != nil {
			panic(fmt.Sprintf("simulated server: rebuild %s: %v", e.Key, err))
		}
	}
	s.journal = s.journal[:s.syncedRev]
	log := events.NewMemoryLog(s.opts.Stream, &s.clock, s.opts.Codec, events.MemoryDedupWindow(dedupWindow))
	for rec, err := range s.log.Read(bg, events.ReadOptions{}) {
		if err != nil || rec.Sequence > s.syncedSeq {
			break
		}
		s.clock.set(rec.Time)
		opts := events.AppendOptions{MsgID: rec.Headers["Nats-Msg-Id"]}
		if v, ok := rec.Headers[events.HeaderExpectedLastSubjectSeq]; ok {
			opts.Headers = map[string]string{events.HeaderExpectedLastSubjectSeq: v}
			if q, ok := rec.Headers[events.HeaderQueued]; ok {
				opts.Headers[events.HeaderQueued] = q
			}
		}
		if _, err := log.AppendRaw(bg, rec.Subject, rec.Data, opts); err != nil {
			panic(fmt.Sprintf("simulated server: rebuild %s: %v", rec.Subject, err))
		}
	}
	s.clock.set(now)
	s.kv, s.log, s.logSeq = kv, log, s.syncedSeq
	s.subjects, s.bySubject, s.mirrorOff = nil, nil, false
	for rec, err := range s.log.Read(bg, events.ReadOptions{}) {
		if err != nil {
			s.mirrorOff = true
			break
		}
		s.keepRecord(rec)
	}
}

// start brings the server back.
func (s *Server) start(t time.Duration) {
	s.at(t)
	s.down = false
}
