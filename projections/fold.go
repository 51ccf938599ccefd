package projections

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/events"
)

// DefaultBucket is the failover KV bucket understudy provisions.
const DefaultBucket = events.DefaultFailoverBucket

// expectHeader is the header JetStream stores with a conditional write: the
// subject's previous sequence. Every event (the appenders write by
// expected sequence) and every register write (CAS) carries it, so a
// missing record between two that were read shows as a broken link.
const expectHeader = events.HeaderExpectedLastSubjectSeq

// Options configure a Fold.
type Options struct {
	// Pair is the pair to fold; records of other pairs are counted as
	// foreign and skipped. Required.
	Pair string
	// Bucket is the failover KV bucket; DefaultBucket when empty.
	Bucket string
	// Codec decodes events; nil: the failover and procedure event types.
	Codec *events.Registry
	// From and To bound the report (zero: the extent of the record). Records
	// outside still set the state at From (who served when the window
	// opened) but are not counted in heartbeat statistics or availability.
	// To is kept even after the last record: give it only when the record
	// was read up to it (an export's header To).
	From, To time.Time
	// Source says where the records came from (shown in reports).
	Source string
}

// Fold folds a pair's records (KV history and events) into the audit read
// models. Add records in any order; Report computes the views. Adding the
// same (stream, sequence) twice folds it once. Not safe for concurrent use.
type Fold struct {
	opts     Options
	codec    *events.Registry
	kvStream string
	kvPrefix string // "$KV.<bucket>.<pair>."
	kvRoot   string // "$KV.<bucket>.": the nodes' liveness keys are under it
	evFail   string // "ev.failover.<pair>."
	evProc   string // "ev.procedure.<pair>."

	sites    []string
	nodes    []string // node leadership: the nodes named by registers and liveness records
	nodeIdx  map[string]int32
	streams  map[string]*streamSeen
	lastName string
	last     *streamSeen
	subjects map[string]*subjectInfo

	reg         series[regWrite]
	lives       []liveWrite // node leadership: the nodes' liveness writes, in stream order
	hbs         series[hbWrite]
	configs     []kvWrite
	switchovers []kvWrite // and the operator's other requests: pause, failover
	markers     []kvWrite // delete and purge markers of the pair's keys
	evs         []eventRec

	counts    RecordCounts
	unknown   map[string]int
	unknownEx []RecordRef
	corrupt   []Corrupt
	gaps      []Gap
	truncated []Gap
	backdated bool  // some event carries events.HeaderQueued
	first     int64 // extent of the record (Unix ns); 0: none yet
	lastT     int64
	partial   *Partial
}

// Maximum number of examples kept of each kind of problem (counts are exact).
const maxExamples = 100

// NewFold returns an empty fold. It fails when opts.Pair is empty.
func NewFold(opts Options) (*Fold, error) {
	if opts.Pair == "" {
		return nil, errors.New("projections: a pair to fold is required")
	}
	if opts.Bucket == "" {
		opts.Bucket = DefaultBucket
	}
	codec := opts.Codec
	if codec == nil {
		codec = events.NewRegistry()
		if err := failover.RegisterEvents(codec); err != nil {
			return nil, err
		}
		if err := procedure.RegisterEvents(codec); err != nil {
			return nil, err
		}
	}
	return &Fold{
		opts:     opts,
		codec:    codec,
		kvStream: events.KVStream(opts.Bucket),
		kvPrefix: "$KV." + opts.Bucket + "." + opts.Pair + ".",
		kvRoot:   "$KV." + opts.Bucket + ".",
		evFail:   failover.NamesOf(opts.Pair).MemberPrefix(),
		evProc:   failover.NamesOf(opts.Pair).ProcedurePrefix(),
		streams:  map[string]*streamSeen{},
		subjects: map[string]*subjectInfo{},
		unknown:  map[string]int{},
	}, nil
}

// Pair is the pair folded.
func (f *Fold) Pair() string { return f.opts.Pair }

// Count is the number of records given to Add.
func (f *Fold) Count() int { return f.counts.Read }

// SetPartial marks the fold as made from an incomplete record (an export
// file that ended in an error): every report says so, with err.
func (f *Fold) SetPartial(err error, offset int64) {
	f.partial = &Partial{Error: err.Error(), Offset: offset, Recovered: f.counts.Read}
}

// What a subject holds.
type subjectKind uint8

const (
	kindForeign subjectKind = iota + 1
	kindLeader
	kindHeartbeat
	kindConfig
	kindSwitchover
	kindOtherKey
	kindLiveness // a node's liveness record (node leadership); the last of the bucket's kinds
	kindFailoverEvent
	kindProcedureEvent
)

type subjectInfo struct {
	kind    subjectKind
	stream  string
	key     string // KV key
	site    int32
	lastSeq uint64 // highest sequence read on the subject
	minSeq  uint64 // lowest
}

// regWrite is one write of the leadership register.
type regWrite struct {
	t   int64
	rev uint64
	v   leaderValue
}

// liveWrite is one write of a node's liveness record: its own beat, or
// (own false) another node's raise of its epoch.
type liveWrite struct {
	t     int64
	rev   uint64
	node  int32
	epoch uint64
	own   bool
}

// hbWrite is one member heartbeat.
type hbWrite struct {
	t     int64
	rev   uint64
	beat  uint64
	site  int32
	phase failover.Phase
	ready bool
}

// kvWrite is any other KV write of the pair kept whole (rare).
type kvWrite struct {
	t     int64
	rev   uint64
	key   string
	op    events.Op
	value []byte
}

// eventRec is one decoded event. t is when it happened: the server
// timestamp less the time it waited on its node (events.HeaderQueued);
// landed is the server timestamp itself, for what must be conservative.
type eventRec struct {
	t       time.Time
	landed  time.Time
	stream  string
	subject string
	seq     uint64
	site    int32
	proc    bool
	ev      events.Event
}

// Add folds one record. rec.Data is kept only for the rare KV writes that
// are neither heartbeats nor register writes.
func (f *Fold) Add(rec events.Record) {
	f.counts.Read++
	ss := f.last
	if rec.Stream != f.lastName || ss == nil {
		ss = f.streams[rec.Stream]
		if ss == nil {
			ss = &streamSeen{pages: map[uint64]*seqPage{}}
			f.streams[rec.Stream] = ss
		}
		f.lastName, f.last = rec.Stream, ss
	}
	if !ss.mark(rec.Sequence) {
		f.counts.Duplicates++
		return
	}
	si := f.subjects[rec.Subject]
	if si == nil || si.stream != rec.Stream {
		si = f.classify(rec.Stream, rec.Subject)
	}
	if si.kind == kindForeign {
		f.counts.Foreign++
		return
	}
	t := rec.Time.UnixNano()
	if f.first == 0 || t < f.first {
		f.first = t
	}
	if t > f.lastT {
		f.lastT = t
	}
	if len(rec.Headers) > 0 {
		if v, ok := rec.Headers[expectHeader]; ok {
			f.link(si, rec, v)
		}
	}
	if rec.Sequence > si.lastSeq {
		si.lastSeq = rec.Sequence
	}
	if si.minSeq == 0 || rec.Sequence < si.minSeq {
		si.minSeq = rec.Sequence
	}
	op := events.OpPut
	if si.kind <= kindLiveness && len(rec.Headers) > 0 { // the bucket's keys
		if _, e, ok := events.EntryFromRecord(rec); ok {
			op = e.Op
		}
	}
	if op != events.OpPut && (si.kind == kindLeader || si.kind == kindHeartbeat || si.kind == kindLiveness) {
		// A delete or purge marker of a key whose values the fold reads.
		f.markers = append(f.markers, kvWrite{t: t, rev: rec.Sequence, key: si.key, op: op})
		f.counts.KV++
		return
	}
	switch si.kind {
	case kindLeader:
		v, err := f.decodeLeader(rec.Data)
		if err != nil {
			f.addCorrupt(rec, err)
			return
		}
		f.reg.add(regWrite{t: t, rev: rec.Sequence, v: v})
		f.counts.Register++
	case kindHeartbeat:
		v, err := f.decodeHeartbeat(rec.Data)
		if err != nil {
			f.addCorrupt(rec, err)
			return
		}
		site := si.site // the key names the site; the value should agree
		if v.site >= 0 && int32(v.site) != site {
			f.addCorrupt(rec, fmt.Errorf("heartbeat of site %q under the key of %q", f.sites[v.site], f.sites[site]))
			return
		}
		f.hbs.add(hbWrite{t: t, rev: rec.Sequence, beat: v.beat, site: site, phase: v.phase, ready: v.ready})
		f.counts.Heartbeats++
	case kindLiveness:
		l, err := failover.DecodeLiveness(rec.Data)
		if err != nil {
			f.addCorrupt(rec, err)
			return
		}
		if f.nodes[si.site] != l.Node {
			f.addCorrupt(rec, fmt.Errorf("liveness record of node %q under the key of %q", l.Node, f.nodes[si.site]))
			return
		}
		f.lives = append(f.lives, liveWrite{t: t, rev: rec.Sequence, node: si.site, epoch: l.Epoch, own: l.Own()})
		f.counts.Liveness++
	case kindConfig, kindSwitchover, kindOtherKey:
		w := kvWrite{t: t, rev: rec.Sequence, key: si.key, op: op, value: bytes.Clone(rec.Data)}
		switch si.kind {
		case kindConfig:
			f.configs = append(f.configs, w)
		case kindSwitchover:
			f.switchovers = append(f.switchovers, w)
		default:
			f.counts.UnknownKeys++
			f.addUnknown("kv:"+si.key, rec)
		}
		f.counts.KV++
	case kindFailoverEvent, kindProcedureEvent:
		ev, err := f.codec.DecodeRecord(rec)
		if err != nil {
			f.addCorrupt(rec, err)
			return
		}
		if u, ok := ev.(*events.Unknown); ok {
			f.addUnknown(fmt.Sprintf("%s v%d", u.Type, u.Version), rec)
			return
		}
		landed := rec.Time.UTC()
		if _, ok := rec.Headers[events.HeaderQueued]; ok {
			f.backdated = true
		}
		f.evs = append(f.evs, eventRec{t: landed.Add(-rec.Queued()), landed: landed, stream: rec.Stream, subject: rec.Subject, seq: rec.Sequence,
			site: si.site, proc: si.kind == kindProcedureEvent, ev: ev})
		f.counts.Events++
	}
}

// classify finds what a subject holds, once per subject.
func (f *Fold) classify(stream, subject string) *subjectInfo {
	si := &subjectInfo{kind: kindForeign, stream: stream, site: -1}
	switch {
	case stream == f.kvStream && strings.HasPrefix(subject, f.kvPrefix):
		rest := subject[len(f.kvPrefix):]
		si.key = f.opts.Pair + "." + rest
		switch {
		case rest == "leader":
			si.kind = kindLeader
		case rest == "config":
			si.kind = kindConfig
		case rest == "switchover", rest == "pause", rest == "failover":
			si.kind = kindSwitchover // an operator's request, by key
		case strings.HasPrefix(rest, "hb.") && len(rest) > 3 && !strings.Contains(rest[3:], "."):
			si.kind, si.site = kindHeartbeat, int32(f.siteIndex(rest[3:]))
		default:
			si.kind = kindOtherKey
		}
	case stream == f.kvStream && strings.HasPrefix(subject, f.kvRoot):
		if node := failover.LivenessNode(subject[len(f.kvRoot):]); node != "" {
			si.kind, si.key, si.site = kindLiveness, subject[len(f.kvRoot):], f.nodeIndex(node)
		}
	case strings.HasPrefix(subject, f.evFail) && !strings.Contains(subject[len(f.evFail):], "."):
		si.kind, si.site = kindFailoverEvent, int32(f.siteIndex(subject[len(f.evFail):]))
	case strings.HasPrefix(subject, f.evProc) && !strings.Contains(subject[len(f.evProc):], "."):
		si.kind, si.site = kindProcedureEvent, int32(f.siteIndex(subject[len(f.evProc):]))
	}
	f.subjects[subject] = si
	return si
}

// link checks the record's link to the subject's previous record.
func (f *Fold) link(si *subjectInfo, rec events.Record, header string) {
	prev, err := strconv.ParseUint(header, 10, 64)
	if err != nil || prev == 0 {
		return
	}
	switch {
	case si.lastSeq == 0:
		// The first record of the subject in this record set links to one
		// before it: history starts there (a window, or retention).
		if len(f.truncated) < maxExamples {
			f.truncated = append(f.truncated, Gap{Stream: rec.Stream, Subject: rec.Subject, Before: rec.Sequence, MissingSeq: prev})
		}
		f.counts.TruncatedSubjects++
	case prev > si.lastSeq && prev < rec.Sequence:
		f.counts.Gaps++
		if len(f.gaps) < maxExamples {
			f.gaps = append(f.gaps, Gap{Stream: rec.Stream, Subject: rec.Subject, After: si.lastSeq, Before: rec.Sequence, MissingSeq: prev})
		}
	}
}

func (f *Fold) addCorrupt(rec events.Record, err error) {
	f.counts.Corrupt++
	if len(f.corrupt) < maxExamples {
		f.corrupt = append(f.corrupt, Corrupt{Subject: rec.Subject, Sequence: rec.Sequence, Time: rec.Time.UTC(), Error: err.Error()})
	}
}

func (f *Fold) addUnknown(what string, rec events.Record) {
	f.counts.Unknown++
	f.unknown[what]++
	if len(f.unknownEx) < maxExamples {
		f.unknownEx = append(f.unknownEx, RecordRef{Subject: rec.Subject, Sequence: rec.Sequence, Time: rec.Time.UTC(), Type: what})
	}
}

// siteIndex interns a site name; "" is -1.
func (f *Fold) siteIndex(s string) int32 {
	if s == "" {
		return -1
	}
	for i, n := range f.sites {
		if n == s {
			return int32(i)
		}
	}
	f.sites = append(f.sites, s)
	return int32(len(f.sites) - 1)
}

// nodeIndex interns a node name; "" is -1.
func (f *Fold) nodeIndex(s string) int32 {
	if s == "" {
		return -1
	}
	if i, ok := f.nodeIdx[s]; ok {
		return i
	}
	if f.nodeIdx == nil {
		f.nodeIdx = map[string]int32{}
	}
	f.nodes = append(f.nodes, s)
	f.nodeIdx[s] = int32(len(f.nodes) - 1)
	return int32(len(f.nodes) - 1)
}

func (f *Fold) nodeIndexBytes(b []byte) int32 {
	if len(b) == 0 {
		return -1
	}
	if i, ok := f.nodeIdx[string(b)]; ok { // no allocation for the lookup
		return i
	}
	return f.nodeIndex(string(b))
}

func (f *Fold) siteIndexBytes(b []byte) int32 {
	if len(b) == 0 {
		return -1
	}
	for i, n := range f.sites {
		if n == string(b) { // no allocation: compared in place
			return int32(i)
		}
	}
	return f.siteIndex(string(b))
}

// --- idempotency: which (stream, sequence) were folded ----------------------

// seqPage is a bitmap of 65,536 consecutive sequences.
type seqPage [1024]uint64

type streamSeen struct {
	pages    map[uint64]*seqPage
	lastNo   uint64
	lastPage *seqPage
}

// mark records seq and reports whether it is new.
func (s *streamSeen) mark(seq uint64) bool {
	no := seq >> 16
	p := s.lastPage
	if p == nil || no != s.lastNo {
		p = s.pages[no]
		if p == nil {
			p = new(seqPage)
			s.pages[no] = p
		}
		s.lastNo, s.lastPage = no, p
	}
	w, bit := (seq>>6)&1023, uint64(1)<<(seq&63)
	if p[w]&bit != 0 {
		return false
	}
	p[w] |= bit
	return true
}

// series holds the millions of writes of a long history: appended in
// fixed-size chunks (no regrowth, no copy), made one slice when read.
type series[T any] struct {
	flat   []T   // what all returned last
	chunks [][]T // full chunks added since
	tail   []T   // the chunk being filled
}

// seriesChunk is the length of a series' chunks.
const seriesChunk = 8192

func (s *series[T]) add(x T) {
	if len(s.tail) == cap(s.tail) {
		if len(s.tail) > 0 {
			s.chunks = append(s.chunks, s.tail)
		}
		s.tail = make([]T, 0, seriesChunk)
	}
	s.tail = append(s.tail, x)
}

// all returns every write added, in the order added. The slice is the
// series' own until the next add: read only.
func (s *series[T]) all() []T {
	if len(s.chunks) == 0 && len(s.tail) == 0 {
		return s.flat
	}
	n := len(s.flat) + len(s.tail)
	for _, c := range s.chunks {
		n += len(c)
	}
	flat := make([]T, 0, n)
	flat = append(flat, s.flat...)
	for _, c := range s.chunks {
		flat = append(flat, c...)
	}
	s.flat, s.chunks, s.tail = append(flat, s.tail...), nil, nil
	return s.flat
}
