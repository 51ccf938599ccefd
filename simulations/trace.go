package simulations

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"

	"understudy/events"
)

// tracer digests the run: every queue item processed (time, kind, node,
// generation), every revision written and every event's encoded bytes, as
// compact binary, into SHA-256. Same seed, same digest.
type tracer struct {
	h   hash.Hash
	buf []byte
}

const traceFlush = 16 << 10

func (t *tracer) init() {
	t.h = sha256.New()
	t.buf = make([]byte, 0, traceFlush+256)
}

func (t *tracer) item(it item) {
	t.buf = binary.LittleEndian.AppendUint64(t.buf, uint64(it.at))
	t.buf = append(t.buf, byte(it.kind), byte(it.node))
	t.buf = binary.LittleEndian.AppendUint64(t.buf, it.gen)
	t.maybeFlush()
}

func (t *tracer) u64(v uint64) {
	t.buf = binary.LittleEndian.AppendUint64(t.buf, v)
	t.maybeFlush()
}

func (t *tracer) bytes(b []byte) {
	t.buf = binary.LittleEndian.AppendUint32(t.buf, uint32(len(b)))
	t.buf = append(t.buf, b...)
	t.maybeFlush()
}

func (t *tracer) maybeFlush() {
	if len(t.buf) >= traceFlush {
		t.h.Write(t.buf)
		t.buf = t.buf[:0]
	}
}

func (t *tracer) sum() string {
	t.h.Write(t.buf)
	t.buf = t.buf[:0]
	return hex.EncodeToString(t.h.Sum(nil))
}

// describe renders an event for the human-readable trace: its type and
// the fields the timeline of a replay shows.
func describe(ev events.Event) string {
	if d := events.Describe(ev, "Pair", "Site", "Resource", "Rules"); d != "" {
		return ev.EventType() + " " + d
	}
	return ev.EventType()
}
