package events

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"understudy/events/mp"
)

// ExportFormatVersion is the version of the export file format this build
// writes, and the newest it reads. docs/export-format.md specifies it.
const ExportFormatVersion = 1

// Reasons an export file is unreadable; ExportError.Err wraps exactly one.
var (
	// ErrExportMagic: the file does not start with the export magic line.
	ErrExportMagic = errors.New("bad magic")
	// ErrExportVersion: the file is of a format version this build cannot
	// read (a newer understudy wrote it).
	ErrExportVersion = errors.New("unsupported version")
	// ErrExportTruncated: the file ends early (cut inside a frame, or
	// before the trailer). What came before it is intact.
	ErrExportTruncated = errors.New("truncated")
	// ErrExportChecksum: a frame's CRC-32C, or the trailer's record count
	// or whole-file CRC-32C, does not match the bytes.
	ErrExportChecksum = errors.New("bad checksum")
	// ErrExportMalformed: the checksums hold but the content breaks the
	// format (frame order, msgpack body, field types, trailing bytes).
	ErrExportMalformed = errors.New("malformed")
)

// ErrUnexportable reports a header or record an export file cannot hold
// faithfully: a time outside int64 Unix nanoseconds (years 1678 to 2261),
// or a record larger than the frame limit.
var ErrUnexportable = errors.New("events: cannot be exported")

// ExportError reports an export file that cannot be read past Offset. It
// wraps ErrCorrupt and one of the ErrExport* reasons. The records returned
// before it (Recovered of them) passed their frame checksums.
type ExportError struct {
	Offset    int64 // byte offset of the start of the unreadable part
	Recovered int   // records returned before the problem
	Err       error // the reason (an ErrExport* sentinel) with its details
}

func (e *ExportError) Error() string {
	recs := "records"
	if e.Recovered == 1 {
		recs = "record"
	}
	what := "corrupt"
	if errors.Is(e.Err, ErrExportVersion) {
		what = "unreadable"
	}
	return fmt.Sprintf("events: export file %s at byte %d: %v; %d %s read intact before it",
		what, e.Offset, e.Err, e.Recovered, recs)
}

func (e *ExportError) Unwrap() []error { return []error{ErrCorrupt, e.Err} }

// ExportHeader describes an export file: where its records came from and
// which window was asked for.
type ExportHeader struct {
	Version  int               // ExportFormatVersion when written (the writer sets it)
	Created  time.Time         // UTC; zero is written as absent
	Source   string            // e.g. "nats://10.0.0.1:4222" or "simulate --scenario power-cut --seed 7"
	Pair     string            // pair name, "" for all
	From, To time.Time         // window asked for (zero = unbounded)
	Meta     map[string]string // free-form (rules, scenario); written sorted by key
}

// --- layout ------------------------------------------------------------------

// exportMagic starts every export file; the version number in decimal and a
// newline follow it.
const exportMagic = "understudy-export v"

// maxVersionDigits bounds the version number of the magic line.
const maxVersionDigits = 9

// Frame kinds.
const (
	frameHeader  byte = 'H'
	frameRecord  byte = 'R'
	frameTrailer byte = 'T'
)

// frameHeadSize is the fixed part of a frame: kind (1), body length (4),
// body CRC-32C (4), CRC-32C of the previous 9 bytes (4).
const frameHeadSize = 13

// maxFrameBody bounds a frame body: a NATS message is at most 64 MiB
// (max_payload), headers included; the rest is room for the record's other
// fields.
const maxFrameBody = 80 << 20

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// exportBufferSize is the bufio size of readers and writers: frames that fit
// are read with one Peek, without a copy.
const exportBufferSize = 64 << 10

// Keys of the msgpack maps. Short and stable: they are the format.
const (
	keyCreated = "c"
	keySource  = "s"
	keyPair    = "p"
	keyFrom    = "f"
	keyTo      = "t"
	keyMeta    = "m"

	keyStream   = "st"
	keySubject  = "su"
	keySequence = "sq"
	keyTime     = "ts"
	keyHeaders  = "h"
	keyData     = "d"

	keyCount = "n"
	keyCRC   = "c"
)

// --- writer ------------------------------------------------------------------

// ExportWriter writes an export file: the magic line and header at
// construction, one frame per Write, the trailer at Close. Equal headers and
// records give equal bytes. Not safe for concurrent use.
type ExportWriter struct {
	w      *bufio.Writer
	crc    uint32 // CRC-32C of every byte written so far
	count  int
	frame  []byte   // scratch: the frame being built, head first
	keys   []string // scratch: sorted map keys
	err    error    // sticky
	closed bool
}

// NewExportWriter writes the magic line and h to w (buffered: nothing may
// reach w before the first 64 KiB or Close). h.Version is ignored (the
// current version is written); h is read, not kept. It fails with
// ErrUnexportable when a time of h cannot be represented.
func NewExportWriter(w io.Writer, h ExportHeader) (*ExportWriter, error) {
	ew := &ExportWriter{w: bufio.NewWriterSize(w, exportBufferSize), frame: make([]byte, frameHeadSize, 512)}
	frame, err := ew.appendHeaderBody(ew.frame[:frameHeadSize], h)
	if err != nil {
		return nil, err
	}
	ew.frame = frame // keep the scratch buffer
	ew.write([]byte(exportMagic + strconv.Itoa(ExportFormatVersion) + "\n"))
	ew.writeFrame(frameHeader, frame)
	if ew.err != nil {
		return nil, ew.err
	}
	return ew, nil
}

// Write appends rec as one frame. KV entries go in as the records of the
// KV's stream (see KVRecord). Empty and nil Headers or Data are written
// alike (as absent); rec is read, not kept. After a failed write of the
// underlying writer every call returns that error.
func (w *ExportWriter) Write(rec Record) error {
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return fmt.Errorf("events: export writer: Write after Close: %w", fs.ErrClosed)
	}
	frame, err := w.appendRecordBody(w.frame[:frameHeadSize], rec)
	if err != nil {
		return err
	}
	w.writeFrame(frameRecord, frame)
	if cap(frame) <= 4<<20 { // one huge record does not pin its buffer
		w.frame = frame
	}
	if w.err == nil {
		w.count++
	}
	return w.err
}

// Count returns the number of records written.
func (w *ExportWriter) Count() int { return w.count }

// Close writes the trailer (record count and CRC-32C of every byte before
// it) and flushes. It does not close the underlying writer. A second Close
// returns the first one's result.
func (w *ExportWriter) Close() error {
	if w.closed {
		return w.err
	}
	w.closed = true
	if w.err != nil {
		return w.err
	}
	b := append(w.frame[:frameHeadSize], 0x82)
	b = appendString(b, keyCount)
	b = appendUint(b, uint64(w.count))
	b = appendString(b, keyCRC)
	b = appendUint(b, uint64(w.crc))
	w.writeFrame(frameTrailer, b)
	if w.err == nil {
		if err := w.w.Flush(); err != nil {
			w.err = fmt.Errorf("events: export writer: %w", err)
		}
	}
	return w.err
}

// writeFrame fills in the head of frame (its first frameHeadSize bytes,
// reserved) for the body that follows, and writes the whole frame.
func (w *ExportWriter) writeFrame(kind byte, frame []byte) {
	head, body := frame[:frameHeadSize], frame[frameHeadSize:]
	head[0] = kind
	binary.BigEndian.PutUint32(head[1:5], uint32(len(body)))
	binary.BigEndian.PutUint32(head[5:9], crc32.Checksum(body, castagnoli))
	binary.BigEndian.PutUint32(head[9:13], crc32.Checksum(head[:9], castagnoli))
	w.write(frame)
}

func (w *ExportWriter) write(p []byte) {
	if w.err != nil {
		return
	}
	if _, err := w.w.Write(p); err != nil {
		w.err = fmt.Errorf("events: export writer: %w", err)
		return
	}
	w.crc = crc32.Update(w.crc, castagnoli, p)
}

func (w *ExportWriter) appendHeaderBody(b []byte, h ExportHeader) ([]byte, error) {
	var created, from, to int64
	var err error
	if created, err = exportNanos("header Created", h.Created); err != nil {
		return nil, err
	}
	if from, err = exportNanos("header From", h.From); err != nil {
		return nil, err
	}
	if to, err = exportNanos("header To", h.To); err != nil {
		return nil, err
	}
	n := countTrue(!h.Created.IsZero(), h.Source != "", h.Pair != "", !h.From.IsZero(), !h.To.IsZero(), len(h.Meta) > 0)
	b = append(b, 0x80|byte(n))
	if !h.Created.IsZero() {
		b = appendInt(appendString(b, keyCreated), created)
	}
	if h.Source != "" {
		b = appendString(appendString(b, keySource), h.Source)
	}
	if h.Pair != "" {
		b = appendString(appendString(b, keyPair), h.Pair)
	}
	if !h.From.IsZero() {
		b = appendInt(appendString(b, keyFrom), from)
	}
	if !h.To.IsZero() {
		b = appendInt(appendString(b, keyTo), to)
	}
	if len(h.Meta) > 0 {
		b = w.appendStringMap(appendString(b, keyMeta), h.Meta)
	}
	return b, nil
}

func (w *ExportWriter) appendRecordBody(b []byte, rec Record) ([]byte, error) {
	ts, err := exportNanos("record Time", rec.Time)
	if err != nil {
		return nil, fmt.Errorf("%w (subject %q sequence %d)", err, rec.Subject, rec.Sequence)
	}
	n := countTrue(rec.Stream != "", rec.Subject != "", rec.Sequence != 0, !rec.Time.IsZero(), len(rec.Headers) > 0, len(rec.Data) > 0)
	b = append(b, 0x80|byte(n))
	// The keys (keyStream and the rest) as fixstr, spelled out.
	if rec.Stream != "" {
		b = appendString(append(b, 0xa2, 's', 't'), rec.Stream)
	}
	if rec.Subject != "" {
		b = appendString(append(b, 0xa2, 's', 'u'), rec.Subject)
	}
	if rec.Sequence != 0 {
		b = appendUint(append(b, 0xa2, 's', 'q'), rec.Sequence)
	}
	if !rec.Time.IsZero() {
		b = appendInt(append(b, 0xa2, 't', 's'), ts)
	}
	if len(rec.Headers) > 0 {
		b = w.appendStringMap(append(b, 0xa1, 'h'), rec.Headers)
	}
	if len(rec.Data) > 0 {
		b = appendBin(append(b, 0xa1, 'd'), rec.Data)
	}
	if len(b)-frameHeadSize > maxFrameBody {
		return nil, fmt.Errorf("%w: record of subject %q sequence %d takes %d bytes, over the %d-byte frame limit",
			ErrUnexportable, rec.Subject, rec.Sequence, len(b)-frameHeadSize, maxFrameBody)
	}
	return b, nil
}

// appendStringMap appends m with its keys in byte order.
func (w *ExportWriter) appendStringMap(b []byte, m map[string]string) []byte {
	b = appendMapHeader(b, len(m))
	w.keys = w.keys[:0]
	for k := range m {
		w.keys = append(w.keys, k)
	}
	slices.Sort(w.keys)
	for _, k := range w.keys {
		b = appendString(appendString(b, k), m[k])
	}
	clear(w.keys) // keep no strings of the caller
	return b
}

// exportNanos returns t as Unix nanoseconds, or ErrUnexportable when they
// cannot hold it. The zero time is 0 (and written as absent).
func exportNanos(what string, t time.Time) (int64, error) {
	if t.IsZero() {
		return 0, nil
	}
	n := t.UnixNano()
	if !time.Unix(0, n).Equal(t) {
		return 0, fmt.Errorf("%w: %s %v is outside the years 1678 to 2261", ErrUnexportable, what, t)
	}
	return n, nil
}

func countTrue(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

// --- msgpack writing (the shortest form of each value) -----------------------

func appendUint(b []byte, v uint64) []byte {
	switch {
	case v <= 0x7f:
		return append(b, byte(v))
	case v <= 0xff:
		return append(b, 0xcc, byte(v))
	case v <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(v))
	case v <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
}

func appendInt(b []byte, v int64) []byte {
	switch {
	case v >= 0:
		return appendUint(b, uint64(v))
	case v >= -32:
		return append(b, byte(v))
	case v >= -128:
		return append(b, 0xd0, byte(v))
	case v >= -32768:
		return binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(v))
	case v >= -(1 << 31):
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(v))
}

func appendBin(b []byte, p []byte) []byte {
	switch n := len(p); {
	case n < 256:
		b = append(b, 0xc4, byte(n))
	case n < 1<<16:
		b = binary.BigEndian.AppendUint16(append(b, 0xc5), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xc6), uint32(n))
	}
	return append(b, p...)
}

func appendMapHeader(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x80|byte(n))
	case n < 1<<16:
		return binary.BigEndian.AppendUint16(append(b, 0xde), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdf), uint32(n))
}

// --- reader ------------------------------------------------------------------

// ExportReader reads an export file as a stream, in constant memory (a
// 64 KiB buffer, plus the largest record for records bigger than that). Not
// safe for concurrent use.
type ExportReader struct {
	r      *bufio.Reader
	header ExportHeader
	off    int64  // bytes consumed and verified
	crc    uint32 // CRC-32C of bytes [0, off)
	n      int    // records returned
	err    error  // sticky: io.EOF, *ExportError, or an I/O error
	big    []byte // body of a frame larger than the buffer
	peeked int    // bytes of the current frame still in the buffer
	strs   map[string]string
	// slab: where the records' small values (Data, header values) are
	// copied, each byte written once and handed out once, so records share
	// an allocation but no bytes (with each other or with the buffer).
	slab []byte
}

// Slab sizes: values up to slabValueMax bytes are copied into slabs of
// slabSize bytes (one allocation for many records); larger ones are
// allocated alone, so a kept value pins little memory.
const (
	slabSize     = 16 << 10
	slabValueMax = 512
)

// internLimit bounds the strings a reader shares between records (streams,
// subjects, header names), so memory stays constant on any input.
const internLimit = 4096

// NewExportReader reads the magic line and the header of an export file.
// Bytes that are not the start of an export file give an *ExportError; a
// failing r gives its error, wrapped.
func NewExportReader(r io.Reader) (*ExportReader, error) {
	er := &ExportReader{r: bufio.NewReaderSize(r, exportBufferSize), strs: map[string]string{}}
	if err := er.readMagic(); err != nil {
		return nil, err
	}
	kind, head, body, err := er.frame()
	if errors.Is(err, io.EOF) {
		return nil, er.fail(fmt.Errorf("%w: the file ends after the magic line, before the header frame", ErrExportTruncated))
	}
	if err != nil {
		return nil, err
	}
	if kind != frameHeader {
		return nil, er.fail(fmt.Errorf("%w: the first frame is of kind %q, not the header %q", ErrExportMalformed, kind, frameHeader))
	}
	h, err := er.parseHeader(body)
	if err != nil {
		return nil, er.fail(fmt.Errorf("%w: header frame: %w", ErrExportMalformed, err))
	}
	h.Version = ExportFormatVersion
	er.header = h
	er.consume(head, body)
	return er, nil
}

// Header returns the file's header. Meta is a copy.
func (r *ExportReader) Header() ExportHeader {
	h := r.header
	h.Meta = maps.Clone(h.Meta)
	return h
}

// Offset returns the bytes consumed so far: after an error, the offset of
// the unreadable part; after io.EOF, the size of the file.
func (r *ExportReader) Offset() int64 { return r.off }

// Next returns the next record, with times in UTC, Headers and Data nil when
// empty, and nothing shared with the reader's buffers. After the last record
// it returns io.EOF — only when the trailer is intact (record count and
// whole-file checksum); otherwise an *ExportError. Errors are sticky.
//
// Each record is returned once its own frame checks out, but frames removed
// or reordered as a whole show only at the trailer: what was read is
// provisional until io.EOF.
func (r *ExportReader) Next() (Record, error) {
	if r.err != nil {
		return Record{}, r.err
	}
	kind, head, body, err := r.frame()
	if errors.Is(err, io.EOF) {
		return Record{}, r.fail(fmt.Errorf("%w: missing trailer: the file ends after a complete frame", ErrExportTruncated))
	}
	if err != nil {
		return Record{}, err
	}
	switch kind {
	case frameRecord:
		rec, err := r.parseRecord(body)
		if err != nil {
			return Record{}, r.fail(fmt.Errorf("%w: record frame: %w", ErrExportMalformed, err))
		}
		r.consume(head, body)
		r.n++
		return rec, nil
	case frameTrailer:
		return Record{}, r.trailer(head, body)
	}
	return Record{}, r.fail(fmt.Errorf("%w: a second header frame", ErrExportMalformed))
}

func (r *ExportReader) fail(reason error) error {
	r.err = &ExportError{Offset: r.off, Recovered: r.n, Err: reason}
	return r.err
}

func (r *ExportReader) ioError(err error) error {
	r.err = fmt.Errorf("events: reading export file at byte %d: %w", r.off, err)
	return r.err
}

func (r *ExportReader) readMagic() error {
	want := len(exportMagic) + maxVersionDigits + 1
	line, err := r.r.Peek(want)
	if err != nil && !errors.Is(err, io.EOF) {
		return r.ioError(err)
	}
	if k := min(len(line), len(exportMagic)); string(line[:k]) != exportMagic[:k] {
		return r.fail(fmt.Errorf("%w: the file starts with %q, not %q: not an understudy export file",
			ErrExportMagic, line[:min(len(line), len(exportMagic))], exportMagic))
	}
	if len(line) == 0 {
		return r.fail(fmt.Errorf("%w: the file is empty", ErrExportTruncated))
	}
	if len(line) < len(exportMagic) {
		return r.fail(fmt.Errorf("%w: the file ends inside the magic line %q", ErrExportTruncated, line))
	}
	rest := line[len(exportMagic):]
	d := 0
	for d < len(rest) && rest[d] >= '0' && rest[d] <= '9' {
		d++
	}
	if d == len(rest) && len(line) < want {
		return r.fail(fmt.Errorf("%w: the file ends inside the magic line %q", ErrExportTruncated, line))
	}
	if d == 0 || d > maxVersionDigits || rest[d] != '\n' || (rest[0] == '0' && d > 1) {
		return r.fail(fmt.Errorf("%w: the magic line %q is not %q, a version number and a newline",
			ErrExportMagic, line[:len(exportMagic)+min(d+1, len(rest))], exportMagic))
	}
	digits := rest[:d]
	v, _ := strconv.Atoi(string(digits))
	if v > ExportFormatVersion {
		return r.fail(fmt.Errorf("%w %d: this build reads versions up to %d; read the file with a newer understudy",
			ErrExportVersion, v, ExportFormatVersion))
	}
	if v < 1 {
		return r.fail(fmt.Errorf("%w %d: no understudy writes it", ErrExportVersion, v))
	}
	line = line[:len(exportMagic)+d+1]
	r.crc = crc32.Update(r.crc, castagnoli, line)
	r.off += int64(len(line))
	_, _ = r.r.Discard(len(line)) // peeked: cannot fail
	return nil
}

// frame reads and checks the next frame without consuming it (consume
// does). It returns io.EOF at a clean end of input; head and body are valid
// until the next read.
func (r *ExportReader) frame() (kind byte, head, body []byte, err error) {
	head, err = r.r.Peek(frameHeadSize)
	if len(head) < frameHeadSize {
		switch {
		case len(head) == 0 && errors.Is(err, io.EOF):
			return 0, nil, nil, io.EOF
		case errors.Is(err, io.EOF):
			return 0, nil, nil, r.fail(fmt.Errorf("%w frame: the file ends %d bytes into the %d-byte frame head",
				ErrExportTruncated, len(head), frameHeadSize))
		}
		return 0, nil, nil, r.ioError(err)
	}
	if got, want := crc32.Checksum(head[:9], castagnoli), binary.BigEndian.Uint32(head[9:13]); got != want {
		return 0, nil, nil, r.fail(fmt.Errorf("%w: frame head CRC-32C is %08x, stored %08x", ErrExportChecksum, got, want))
	}
	kind = head[0]
	n := int(binary.BigEndian.Uint32(head[1:5]))
	what := frameName(kind)
	if what == "" {
		return 0, nil, nil, r.fail(fmt.Errorf("%w: unknown frame kind %q", ErrExportMalformed, kind))
	}
	if n > maxFrameBody {
		return 0, nil, nil, r.fail(fmt.Errorf("%w: the %s frame declares %d body bytes, over the %d-byte limit",
			ErrExportMalformed, what, n, maxFrameBody))
	}
	short := func(have int) error {
		return r.fail(fmt.Errorf("%w %s: its frame declares %d body bytes, the file ends after %d of them",
			ErrExportTruncated, what, n, have))
	}
	if frameHeadSize+n <= r.r.Size() {
		buf, err := r.r.Peek(frameHeadSize + n)
		if len(buf) < frameHeadSize+n {
			if errors.Is(err, io.EOF) {
				return 0, nil, nil, short(len(buf) - frameHeadSize)
			}
			return 0, nil, nil, r.ioError(err)
		}
		head, body = buf[:frameHeadSize], buf[frameHeadSize:]
		r.peeked = len(buf)
	} else {
		// Larger than the buffer: copy the head out, then read the body
		// in steps, so memory follows the bytes present, not the length
		// declared.
		var h [frameHeadSize]byte
		copy(h[:], head)
		head = h[:]
		_, _ = r.r.Discard(frameHeadSize)
		r.big = r.big[:0]
		for len(r.big) < n {
			step := min(n-len(r.big), 1<<20)
			r.big = slices.Grow(r.big, step)
			m, err := io.ReadFull(r.r, r.big[len(r.big):len(r.big)+step])
			r.big = r.big[:len(r.big)+m]
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return 0, nil, nil, short(len(r.big))
			}
			if err != nil {
				return 0, nil, nil, r.ioError(err)
			}
		}
		body = r.big
		r.peeked = 0
	}
	if got, want := crc32.Checksum(body, castagnoli), binary.BigEndian.Uint32(head[5:9]); got != want {
		return 0, nil, nil, r.fail(fmt.Errorf("%w: the %s frame's body CRC-32C is %08x, stored %08x", ErrExportChecksum, what, got, want))
	}
	return kind, head, body, nil
}

func frameName(kind byte) string {
	switch kind {
	case frameHeader:
		return "header"
	case frameRecord:
		return "record"
	case frameTrailer:
		return "trailer"
	}
	return ""
}

// consume accounts for a checked frame and moves past it.
func (r *ExportReader) consume(head, body []byte) {
	r.crc = crc32.Update(r.crc, castagnoli, head)
	r.crc = crc32.Update(r.crc, castagnoli, body)
	r.off += int64(len(head) + len(body))
	_, _ = r.r.Discard(r.peeked) // peeked: cannot fail
	r.peeked = 0
	if cap(r.big) > 4<<20 {
		r.big = nil // one huge record does not pin its buffer
	}
}

func (r *ExportReader) trailer(head, body []byte) error {
	var count, sum uint64
	var haveCount, haveSum bool
	err := eachKey(body, func(key, b []byte, i int) (int, error) {
		var err error
		switch string(key) {
		case keyCount:
			if haveCount {
				return 0, errExportDupKey
			}
			haveCount = true
			count, i, err = mp.Uint(b, i)
		case keyCRC:
			if haveSum {
				return 0, errExportDupKey
			}
			haveSum = true
			sum, i, err = mp.Uint(b, i)
		default:
			i, err = valueEnd(b, i)
		}
		return i, err
	})
	switch {
	case err != nil:
		return r.fail(fmt.Errorf("%w: trailer frame: %w", ErrExportMalformed, err))
	case !haveCount || !haveSum:
		return r.fail(fmt.Errorf("%w: trailer frame lacks the record count %q or the checksum %q", ErrExportMalformed, keyCount, keyCRC))
	case count != uint64(r.n):
		return r.fail(fmt.Errorf("%w: the trailer counts %d records, the file holds %d", ErrExportChecksum, count, r.n))
	case sum != uint64(r.crc):
		return r.fail(fmt.Errorf("%w: the trailer's whole-file CRC-32C is %08x, the bytes before it give %08x (frames were removed, added or reordered)",
			ErrExportChecksum, sum, r.crc))
	}
	r.consume(head, body)
	extra, err := r.r.Peek(1)
	if len(extra) > 0 {
		return r.fail(fmt.Errorf("%w: bytes follow the trailer", ErrExportMalformed))
	}
	if !errors.Is(err, io.EOF) {
		return r.ioError(err)
	}
	r.err = io.EOF
	return r.err
}

func (r *ExportReader) parseHeader(body []byte) (ExportHeader, error) {
	var h ExportHeader
	var seen uint8
	err := eachKey(body, func(key, b []byte, i int) (int, error) {
		bit := uint8(0)
		var err error
		var nanos int64
		switch string(key) {
		case keyCreated:
			bit = 1 << 0
			nanos, i, err = mp.Int(b, i)
			h.Created = timeOf(nanos)
		case keySource:
			bit = 1 << 1
			var s []byte
			s, i, err = mp.Bytes(b, i)
			h.Source = string(s)
		case keyPair:
			bit = 1 << 2
			var s []byte
			s, i, err = mp.Bytes(b, i)
			h.Pair = string(s)
		case keyFrom:
			bit = 1 << 3
			nanos, i, err = mp.Int(b, i)
			h.From = timeOf(nanos)
		case keyTo:
			bit = 1 << 4
			nanos, i, err = mp.Int(b, i)
			h.To = timeOf(nanos)
		case keyMeta:
			bit = 1 << 5
			h.Meta, i, err = r.stringMap(b, i, false)
		default:
			return valueEnd(b, i)
		}
		if seen&bit != 0 {
			return 0, fmt.Errorf("%w %q", errExportDupKey, key)
		}
		seen |= bit
		if err != nil {
			return 0, fmt.Errorf("key %q: %w", key, err)
		}
		return i, nil
	})
	return h, err
}

func (r *ExportReader) parseRecord(body []byte) (Record, error) {
	var rec Record
	var seen uint8
	err := eachKey(body, func(key, b []byte, i int) (int, error) {
		bit := uint8(0)
		var err error
		var s []byte
		switch string(key) {
		case keyStream:
			bit = 1 << 0
			s, i, err = mp.Bytes(b, i)
			rec.Stream = r.intern(s)
		case keySubject:
			bit = 1 << 1
			s, i, err = mp.Bytes(b, i)
			rec.Subject = r.intern(s)
		case keySequence:
			bit = 1 << 2
			rec.Sequence, i, err = mp.Uint(b, i)
		case keyTime:
			bit = 1 << 3
			var nanos int64
			nanos, i, err = mp.Int(b, i)
			rec.Time = timeOf(nanos)
		case keyHeaders:
			bit = 1 << 4
			rec.Headers, i, err = r.stringMap(b, i, true)
		case keyData:
			bit = 1 << 5
			s, i, err = mp.Bytes(b, i)
			if len(s) > 0 {
				rec.Data = r.keep(s)
			}
		default:
			return valueEnd(b, i)
		}
		if seen&bit != 0 {
			return 0, fmt.Errorf("%w %q", errExportDupKey, key)
		}
		seen |= bit
		if err != nil {
			return 0, fmt.Errorf("key %q: %w", key, err)
		}
		return i, nil
	})
	return rec, err
}

// timeOf turns Unix nanoseconds into a UTC time. (An absent or nil time
// field is the zero time; 0 is the Unix epoch.)
func timeOf(nanos int64) time.Time {
	return time.Unix(0, nanos).UTC()
}

// intern returns b as a string shared with earlier records when it was
// seen before: streams, subjects and header names repeat.
func (r *ExportReader) intern(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if s, ok := r.strs[string(b)]; ok {
		return s
	}
	s := string(b)
	if len(r.strs) < internLimit {
		r.strs[s] = s
	}
	return s
}

// keep returns a copy of b (not empty), in the slab when it is small: the
// copy's capacity is its length, so appending to it reallocates rather
// than write over the next value.
func (r *ExportReader) keep(b []byte) []byte {
	if len(b) > slabValueMax {
		return bytes.Clone(b)
	}
	if cap(r.slab)-len(r.slab) < len(b) {
		r.slab = make([]byte, 0, slabSize)
	}
	i := len(r.slab)
	r.slab = append(r.slab, b...)
	return r.slab[i:len(r.slab):len(r.slab)]
}

// keepString returns b as a string, copied into the slab when it is
// small. The slab's bytes are never written again once handed out, so the
// string is immutable as a string must be.
func (r *ExportReader) keepString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if len(b) > slabValueMax {
		return string(b)
	}
	k := r.keep(b)
	return unsafe.String(&k[0], len(k))
}

// stringMap reads a msgpack map of strings at b[i:]; nil and empty give nil.
func (r *ExportReader) stringMap(b []byte, i int, internKeys bool) (map[string]string, int, error) {
	if i < len(b) && b[i] == 0xc0 {
		return nil, i + 1, nil
	}
	n, i, err := mp.MapLen(b, i)
	if err != nil || n == 0 {
		return nil, i, err
	}
	m := make(map[string]string, n)
	for range n {
		var k, v []byte
		if k, i, err = mp.Bytes(b, i); err != nil {
			return nil, 0, err
		}
		if v, i, err = mp.Bytes(b, i); err != nil {
			return nil, 0, err
		}
		key := string(k)
		if internKeys {
			key = r.intern(k)
		}
		m[key] = r.keepString(v)
	}
	if len(m) != n {
		return nil, 0, fmt.Errorf("%w in a string map", errExportDupKey)
	}
	return m, i, nil
}

// --- msgpack reading (any encoding of the right type) ------------------------

var (
	errExportNotMap = errors.New("frame body is not a msgpack map")
	errExportDupKey = errors.New("duplicate key")

	errExportKeyNotStr = errors.New("map key is not a msgpack str")
)

// eachKey walks the msgpack map that must fill body exactly, calling fn with
// each string key and the offset of its value; fn returns where the value
// ends. Nil values are skipped: a nil field reads as its zero value.
func eachKey(body []byte, fn func(key, b []byte, i int) (int, error)) error {
	n, i, err := mp.MapLen(body, 0)
	if err != nil {
		return errExportNotMap
	}
	for range n {
		var key []byte
		if key, i, err = mp.Bytes(body, i); err != nil {
			return errExportKeyNotStr
		}
		if i < len(body) && body[i] == 0xc0 {
			i++
			continue
		}
		if i, err = fn(key, body, i); err != nil {
			return err
		}
	}
	if i != len(body) {
		return fmt.Errorf("%w: %d of %d bytes read", errTrailing, i, len(body))
	}
	return nil
}

// --- KV records --------------------------------------------------------------

// NATS KV headers, as the server stores them on a KV stream's messages.
const (
	kvOperationHeader = "KV-Operation"
	kvMarkerHeader    = "Nats-Marker-Reason"
	kvRollupHeader    = "Nats-Rollup"
)

// KVRecord returns e as the record NATS stores for it on the bucket's
// stream: Stream "KV_<bucket>", Subject "$KV.<bucket>.<key>", Sequence the
// revision, Data the value, and for a delete or purge marker the headers
// nats.go publishes with it (KV-Operation DEL; KV-Operation PURGE with
// Nats-Rollup sub). An empty bucket means e.Bucket. e.Value is not copied.
func KVRecord(bucket string, e Entry) Record {
	if bucket == "" {
		bucket = e.Bucket
	}
	rec := Record{
		Stream:   KVStream(bucket),
		Subject:  "$KV." + bucket + "." + e.Key,
		Sequence: e.Revision,
		Time:     e.Time,
		Data:     e.Value,
	}
	switch e.Op {
	case OpDelete:
		rec.Headers = map[string]string{kvOperationHeader: "DEL"}
	case OpPurge:
		rec.Headers = map[string]string{kvOperationHeader: "PURGE", kvRollupHeader: "sub"}
	}
	return rec
}

// EntryFromRecord turns a record of a KV stream back into its entry, reading
// the operation as nats.go does (KV-Operation DEL or PURGE; else the
// server's Nats-Marker-Reason; else a put). ok is false when rec is not a
// KV record: its stream is not "KV_<bucket>" or its subject is not
// "$KV.<bucket>.<key>" of that bucket. Value is rec.Data, not copied; Time is
// UTC.
func EntryFromRecord(rec Record) (bucket string, e Entry, ok bool) {
	bucket, ok = strings.CutPrefix(rec.Stream, "KV_")
	if !ok || bucket == "" {
		return "", Entry{}, false
	}
	rest, ok := strings.CutPrefix(rec.Subject, "$KV.")
	if !ok {
		return "", Entry{}, false
	}
	key, ok := strings.CutPrefix(rest, bucket+".")
	if !ok || key == "" {
		return "", Entry{}, false
	}
	op := OpPut
	if kvop := rec.Headers[kvOperationHeader]; kvop != "" {
		switch kvop {
		case "DEL":
			op = OpDelete
		case "PURGE":
			op = OpPurge
		}
	} else {
		switch rec.Headers[kvMarkerHeader] {
		case "MaxAge", "Purge":
			op = OpPurge
		case "Remove":
			op = OpDelete
		}
	}
	return bucket, Entry{
		Bucket:   bucket,
		Key:      key,
		Value:    rec.Data,
		Revision: rec.Sequence,
		Time:     rec.Time.UTC(),
		Op:       op,
	}, true
}
