package events_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"understudy/events"
)

// exT0 is not in UTC on purpose: the file holds UTC nanoseconds.
var exT0 = time.Date(2025, 3, 1, 3, 12, 0, 123456789, time.FixedZone("CET", 3600))

const exBucket = "understudy_failover"

func exHeader() events.ExportHeader {
	return events.ExportHeader{
		Created: exT0.Add(time.Hour),
		Source:  "simulate --scenario power-cut --seed 7",
		Pair:    "pg-main",
		From:    exT0,
		To:      exT0.Add(30 * time.Minute),
		Meta:    map[string]string{"scenario": "power-cut", "rules": "default", "seed": "7"},
	}
}

// exRecords is a small history: KV writes (a put, a delete marker, a purge
// marker), event records with and without headers, odd times and sizes.
func exRecords() []events.Record {
	kv := func(key string, rev uint64, op events.Op, value string) events.Record {
		e := events.Entry{Key: key, Revision: rev, Time: exT0.Add(time.Duration(rev) * time.Second), Op: op}
		if value != "" {
			e.Value = []byte(value)
		}
		return events.KVRecord(exBucket, e)
	}
	return []events.Record{
		kv("pg-main.leader", 1, events.OpPut, "\x83\xa1s\xa4shop"),
		{
			Stream: "UNDERSTUDY_EVENTS", Subject: "ev.failover.pg-main.basement", Sequence: 1,
			Time:    exT0.Add(1500 * time.Millisecond),
			Headers: map[string]string{"Nats-Msg-Id": "pg-main.basement.1", "Nats-Expected-Last-Subject-Sequence": "0"},
			Data:    []byte("\x83\xa1t\xa9test.noted\xa1v\x01\xa1b\x80"),
		},
		kv("pg-main.hb.basement", 2, events.OpPut, "hb"),
		kv("pg-main.leader", 3, events.OpDelete, ""),
		{Stream: "UNDERSTUDY_EVENTS", Subject: "ev.failover.pg-main.shop", Sequence: 2, Time: exT0.Add(4 * time.Second), Data: []byte{0}},
		kv("pg-main.switchover", 4, events.OpPurge, ""),
		{Stream: "UNDERSTUDY_EVENTS", Subject: "ev.x", Sequence: 1 << 40, Time: time.Unix(0, 0)},                          // the epoch, no data
		{Stream: "UNDERSTUDY_EVENTS", Subject: "ev.y", Sequence: 3, Time: time.Date(1969, 7, 20, 20, 17, 0, 1, time.UTC)}, // before 1970
		{Stream: "S", Subject: "empty.headers", Sequence: 5, Time: exT0, Headers: map[string]string{}, Data: []byte{}},
	}
}

// normal is rec as a reader returns it: UTC, empty maps and slices nil.
func normal(rec events.Record) events.Record {
	if !rec.Time.IsZero() {
		rec.Time = time.Unix(0, rec.Time.UnixNano()).UTC()
	}
	if len(rec.Headers) == 0 {
		rec.Headers = nil
	}
	if len(rec.Data) == 0 {
		rec.Data = nil
	}
	return rec
}

func sameRecord(t testing.TB, i int, got, want events.Record) {
	t.Helper()
	want = normal(want)
	if !got.Time.IsZero() && got.Time.Location() != time.UTC {
		t.Errorf("record %d: time %v is not UTC", i, got.Time)
	}
	if !got.Time.Equal(want.Time) {
		t.Errorf("record %d: time %v, want %v", i, got.Time, want.Time)
	}
	got.Time, want.Time = time.Time{}, time.Time{}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("record %d:\n got %#v\nwant %#v", i, got, want)
	}
}

func writeExport(t testing.TB, h events.ExportHeader, recs []events.Record) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := events.NewExportWriter(&buf, h)
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range recs {
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
	}
	if w.Count() != len(recs) {
		t.Fatalf("Count() = %d, want %d", w.Count(), len(recs))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// readExport reads data to the end: the records returned, and the error
// that ended the reading (io.EOF when the file is intact).
func readExport(data []byte) (events.ExportHeader, []events.Record, *events.ExportReader, error) {
	r, err := events.NewExportReader(bytes.NewReader(data))
	if err != nil {
		return events.ExportHeader{}, nil, nil, err
	}
	var recs []events.Record
	for {
		rec, err := r.Next()
		if err != nil {
			return r.Header(), recs, r, err
		}
		recs = append(recs, rec)
	}
}

// exportErr asserts err is an *ExportError wrapping ErrCorrupt and reason.
func exportErr(t testing.TB, err error, reason error) *events.ExportError {
	t.Helper()
	var ee *events.ExportError
	if !errors.As(err, &ee) {
		t.Fatalf("error %v (%T) is not an *ExportError", err, err)
	}
	if !errors.Is(err, events.ErrCorrupt) {
		t.Fatalf("error %v does not wrap ErrCorrupt", err)
	}
	if reason != nil && !errors.Is(err, reason) {
		t.Fatalf("error %v does not wrap %v", err, reason)
	}
	return ee
}

// --- the layout, walked as docs/export-format.md describes it ----------------

var exCastagnoli = crc32.MakeTable(crc32.Castagnoli)

type exFrame struct {
	start, end int
	kind       byte
	body       []byte
}

// exFrames splits an intact file into its magic line and frames, checking
// every CRC, independently of the reader.
func exFrames(t testing.TB, data []byte) (magicEnd int, frames []exFrame) {
	t.Helper()
	magicEnd = bytes.IndexByte(data, '\n') + 1
	for i := magicEnd; i < len(data); {
		if len(data)-i < 13 {
			t.Fatalf("frame head at %d cut short", i)
		}
		n := int(binary.BigEndian.Uint32(data[i+1:]))
		if crc32.Checksum(data[i:i+9], exCastagnoli) != binary.BigEndian.Uint32(data[i+9:]) {
			t.Fatalf("frame at %d: head CRC does not match", i)
		}
		body := data[i+13 : i+13+n]
		if crc32.Checksum(body, exCastagnoli) != binary.BigEndian.Uint32(data[i+5:]) {
			t.Fatalf("frame at %d: body CRC does not match", i)
		}
		frames = append(frames, exFrame{start: i, end: i + 13 + n, kind: data[i], body: body})
		i += 13 + n
	}
	return magicEnd, frames
}

// exFrameBytes builds one frame as the doc specifies.
func exFrameBytes(kind byte, body []byte) []byte {
	f := []byte{kind}
	f = binary.BigEndian.AppendUint32(f, uint32(len(body)))
	f = binary.BigEndian.AppendUint32(f, crc32.Checksum(body, exCastagnoli))
	f = binary.BigEndian.AppendUint32(f, crc32.Checksum(f, exCastagnoli))
	return append(f, body...)
}

// exTrailer is a trailer frame for the records and bytes before it.
func exTrailer(before []byte, records int) []byte {
	body, err := msgpack.Marshal(&struct {
		N uint64 `msgpack:"n"`
		C uint64 `msgpack:"c"`
	}{uint64(records), uint64(crc32.Checksum(before, exCastagnoli))})
	if err != nil {
		panic(err)
	}
	return append(before, exFrameBytes('T', body)...)
}

func TestExportLayout(t *testing.T) {
	h, recs := exHeader(), exRecords()
	data := writeExport(t, h, recs)
	magicEnd, frames := exFrames(t, data)
	if got := string(data[:magicEnd]); got != "understudy-export v1\n" {
		t.Fatalf("magic line %q", got)
	}
	if len(frames) != len(recs)+2 || frames[0].kind != 'H' || frames[len(frames)-1].kind != 'T' {
		t.Fatalf("frames %v: want H, %d R, T", frames, len(recs))
	}

	// The header: a map with keys in the documented order.
	var keys []string
	dec := msgpack.NewDecoder(bytes.NewReader(frames[0].body))
	n, err := dec.DecodeMapLen()
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		k, err := dec.DecodeString()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
		if err := dec.Skip(); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"c", "s", "p", "f", "t", "m"}; !reflect.DeepEqual(keys, want) {
		t.Errorf("header keys %v, want %v", keys, want)
	}
	var hdr struct {
		Created int64             `msgpack:"c"`
		Source  string            `msgpack:"s"`
		Pair    string            `msgpack:"p"`
		From    int64             `msgpack:"f"`
		To      int64             `msgpack:"t"`
		Meta    map[string]string `msgpack:"m"`
	}
	if err := msgpack.Unmarshal(frames[0].body, &hdr); err != nil {
		t.Fatal(err)
	}
	if hdr.Created != h.Created.UnixNano() || hdr.Source != h.Source || hdr.Pair != h.Pair ||
		hdr.From != h.From.UnixNano() || hdr.To != h.To.UnixNano() || !maps.Equal(hdr.Meta, h.Meta) {
		t.Errorf("header body decodes to %+v", hdr)
	}

	// Records: a map with short keys, zero values absent.
	type layoutRecord struct {
		Stream  string            `msgpack:"st"`
		Subject string            `msgpack:"su"`
		Seq     uint64            `msgpack:"sq"`
		TS      int64             `msgpack:"ts"`
		Headers map[string]string `msgpack:"h"`
		Data    []byte            `msgpack:"d"`
	}
	for i, rec := range recs {
		body := frames[i+1].body
		var lr layoutRecord
		if err := msgpack.Unmarshal(body, &lr); err != nil {
			t.Fatal(err)
		}
		var got events.Record
		got.Stream, got.Subject, got.Sequence, got.Headers, got.Data = lr.Stream, lr.Subject, lr.Seq, lr.Headers, lr.Data
		got.Time = time.Unix(0, lr.TS).UTC()
		sameRecord(t, i, got, rec)
		var m map[string]any
		if err := msgpack.Unmarshal(body, &m); err != nil {
			t.Fatal(err)
		}
		if _, ok := m["h"]; ok != (len(rec.Headers) > 0) {
			t.Errorf("record %d: key h present = %v with %d headers", i, ok, len(rec.Headers))
		}
		if _, ok := m["d"]; ok != (len(rec.Data) > 0) {
			t.Errorf("record %d: key d present = %v with %d data bytes", i, ok, len(rec.Data))
		}
		if d, ok := m["d"]; ok {
			if _, bin := d.([]byte); !bin {
				t.Errorf("record %d: data is %T, want msgpack bin", i, d)
			}
		}
	}

	// The trailer: record count and CRC-32C of every byte before it.
	tr := frames[len(frames)-1]
	var trailer struct {
		N uint64 `msgpack:"n"`
		C uint32 `msgpack:"c"`
	}
	if err := msgpack.Unmarshal(tr.body, &trailer); err != nil {
		t.Fatal(err)
	}
	if trailer.N != uint64(len(recs)) || trailer.C != crc32.Checksum(data[:tr.start], exCastagnoli) {
		t.Errorf("trailer %+v, want n=%d c=%08x", trailer, len(recs), crc32.Checksum(data[:tr.start], exCastagnoli))
	}
}

func TestExportRoundTrip(t *testing.T) {
	big := make([]byte, 200<<10) // larger than the reader's buffer
	for i := range big {
		big[i] = byte(i * 7)
	}
	recs := append(exRecords(), events.Record{Stream: "UNDERSTUDY_EVENTS", Subject: "ev.big", Sequence: 9, Time: exT0, Data: big})
	recs = append(recs, exRecords()[:2]...) // small ones after the big one
	many := map[string]string{}
	for i := range 40 { // a map16
		many[fmt.Sprintf("X-Header-%02d", i)] = strings.Repeat("v", i)
	}
	recs = append(recs, events.Record{Stream: "S", Subject: "many.headers", Sequence: 10, Time: exT0, Headers: many, Data: []byte("x")})
	recs = append(recs, events.Record{Stream: "S", Subject: "mid", Sequence: 11, Time: exT0, Data: big[:1000]}) // a bin16
	h := exHeader()
	for i := range 3000 { // a header frame larger than the reader's buffer
		h.Meta[fmt.Sprintf("meta-%04d", i)] = strings.Repeat("m", 20)
	}
	data := writeExport(t, h, recs)

	r, err := events.NewExportReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	magicEnd, frames := exFrames(t, data)
	if r.Offset() != int64(frames[0].end) || magicEnd != 21 {
		t.Errorf("Offset after the header = %d, want %d", r.Offset(), frames[0].end)
	}
	got := r.Header()
	if got.Version != events.ExportFormatVersion || got.Created.Location() != time.UTC || got.From.Location() != time.UTC {
		t.Errorf("header %+v: want version %d, UTC times", got, events.ExportFormatVersion)
	}
	if !got.Created.Equal(h.Created) || !got.From.Equal(h.From) || !got.To.Equal(h.To) ||
		got.Source != h.Source || got.Pair != h.Pair || !maps.Equal(got.Meta, h.Meta) {
		t.Errorf("header %+v, want %+v", got, h)
	}
	got.Meta["scenario"] = "changed"
	if r.Header().Meta["scenario"] != "power-cut" {
		t.Error("Header() shares its Meta map")
	}
	for i, want := range recs {
		rec, err := r.Next()
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		sameRecord(t, i, rec, want)
		if r.Offset() != int64(frames[i+1].end) {
			t.Errorf("Offset after record %d = %d, want %d", i, r.Offset(), frames[i+1].end)
		}
	}
	for range 2 {
		if _, err := r.Next(); err != io.EOF {
			t.Fatalf("after the last record: %v, want io.EOF", err)
		}
	}
	if r.Offset() != int64(len(data)) {
		t.Errorf("Offset at the end = %d, want %d", r.Offset(), len(data))
	}
}

func TestExportReturnsOwnedRecords(t *testing.T) {
	recs := exRecords()
	data := writeExport(t, exHeader(), recs)
	_, got, _, err := readExport(data)
	if err != io.EOF {
		t.Fatal(err)
	}
	clear(data) // records must not point into the reader's input or buffer
	for i := range recs {
		sameRecord(t, i, got[i], recs[i])
	}
}

func TestExportEmpty(t *testing.T) {
	for name, h := range map[string]events.ExportHeader{"zero-header": {}, "full-header": exHeader()} {
		t.Run(name, func(t *testing.T) {
			data := writeExport(t, h, nil)
			got, recs, r, err := readExport(data)
			if err != io.EOF || len(recs) != 0 {
				t.Fatalf("read %d records, %v; want none, io.EOF", len(recs), err)
			}
			if r.Offset() != int64(len(data)) {
				t.Errorf("Offset = %d, want %d", r.Offset(), len(data))
			}
			h.Version = events.ExportFormatVersion
			if !got.Created.Equal(h.Created) || !got.From.Equal(h.From) || !got.To.Equal(h.To) {
				t.Errorf("header times %+v, want %+v", got, h)
			}
			got.Created, got.From, got.To, h.Created, h.From, h.To = time.Time{}, time.Time{}, time.Time{}, time.Time{}, time.Time{}, time.Time{}
			if !reflect.DeepEqual(got, h) {
				t.Errorf("header %+v, want %+v", got, h)
			}
		})
	}
}

func TestExportKVRecord(t *testing.T) {
	at := exT0
	cases := []struct {
		entry   events.Entry
		headers map[string]string
	}{
		{events.Entry{Key: "pg-main.leader", Value: []byte("v"), Revision: 7, Time: at, Op: events.OpPut}, nil},
		{events.Entry{Key: "pg-main.hb.shop", Revision: 8, Time: at, Op: events.OpDelete}, map[string]string{"KV-Operation": "DEL"}},
		{events.Entry{Key: "pg-main.switchover", Revision: 9, Time: at, Op: events.OpPurge}, map[string]string{"KV-Operation": "PURGE", "Nats-Rollup": "sub"}},
	}
	for _, c := range cases {
		rec := events.KVRecord(exBucket, c.entry)
		want := events.Record{
			Stream: "KV_" + exBucket, Subject: "$KV." + exBucket + "." + c.entry.Key,
			Sequence: c.entry.Revision, Time: at, Headers: c.headers, Data: c.entry.Value,
		}
		if !reflect.DeepEqual(rec, want) {
			t.Errorf("KVRecord(%v) = %#v, want %#v", c.entry.Op, rec, want)
		}
		bucket, e, ok := events.EntryFromRecord(rec)
		c.entry.Bucket, c.entry.Time = exBucket, at.UTC()
		if !ok || bucket != exBucket || !reflect.DeepEqual(e, c.entry) {
			t.Errorf("EntryFromRecord(KVRecord(%v)) = %q, %#v, %v; want %#v", c.entry.Op, bucket, e, ok, c.entry)
		}
	}
	// An empty bucket argument takes the entry's.
	if rec := events.KVRecord("", events.Entry{Bucket: "b", Key: "k"}); rec.Stream != "KV_b" || rec.Subject != "$KV.b.k" {
		t.Errorf("KVRecord with the entry's bucket = %+v", rec)
	}
	// Markers the server writes itself.
	for reason, op := range map[string]events.Op{"MaxAge": events.OpPurge, "Purge": events.OpPurge, "Remove": events.OpDelete} {
		rec := events.Record{Stream: "KV_b", Subject: "$KV.b.k", Headers: map[string]string{"Nats-Marker-Reason": reason}}
		if _, e, ok := events.EntryFromRecord(rec); !ok || e.Op != op {
			t.Errorf("marker %s: op %v ok %v, want %v", reason, e.Op, ok, op)
		}
	}
	notKV := []events.Record{
		{Stream: "UNDERSTUDY_EVENTS", Subject: "ev.failover.pg-main.shop"},
		{Stream: "KV_", Subject: "$KV..k"},
		{Stream: "KV_a", Subject: "$KV.b.k"},
		{Stream: "KV_a", Subject: "$KV.a."},
		{Stream: "KV_a", Subject: "$KV.ab.k"},
		{Stream: "KV_a", Subject: "ev.a.k"},
		{Subject: "$KV.a.k"},
	}
	for _, rec := range notKV {
		if _, _, ok := events.EntryFromRecord(rec); ok {
			t.Errorf("EntryFromRecord(%+v) ok, want not a KV record", rec)
		}
	}
}

// The KV history of a bucket, exported and read back, gives the same
// entries, delete markers included.
func TestExportKVHistoryRoundTrip(t *testing.T) {
	ctx := t.Context()
	clock := events.NewManualClock(exT0)
	kv := events.NewMemoryKV(exBucket, clock)
	for i := range 3 {
		if _, err := kv.Put(ctx, "pg-main.leader", fmt.Appendf(nil, "term %d", i)); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Second)
	}
	if err := kv.Delete(ctx, "pg-main.leader"); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	if _, err := kv.Put(ctx, "pg-main.leader", []byte("term 3")); err != nil {
		t.Fatal(err)
	}
	hist, err := kv.History(ctx, "pg-main.leader")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w, err := events.NewExportWriter(&buf, events.ExportHeader{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range hist {
		if err := w.Write(events.KVRecord(exBucket, e)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	_, recs, _, err := readExport(buf.Bytes())
	if err != io.EOF {
		t.Fatal(err)
	}
	if len(recs) != len(hist) || len(hist) != 5 {
		t.Fatalf("read %d records of %d entries, want 5", len(recs), len(hist))
	}
	for i, rec := range recs {
		bucket, e, ok := events.EntryFromRecord(rec)
		want := hist[i]
		if len(want.Value) == 0 {
			want.Value = nil
		}
		if !ok || bucket != exBucket || !reflect.DeepEqual(e, want) {
			t.Errorf("entry %d: %q %#v %v, want %#v", i, bucket, e, ok, want)
		}
	}
	if recs[3].Headers["KV-Operation"] != "DEL" {
		t.Errorf("delete marker headers %v", recs[3].Headers)
	}
}

func TestExportDeterministic(t *testing.T) {
	recs := exRecords()
	a := writeExport(t, exHeader(), recs)
	// The same content through maps built in another order.
	h := exHeader()
	h.Meta = map[string]string{}
	for _, k := range []string{"seed", "rules", "scenario"} {
		h.Meta[k] = exHeader().Meta[k]
	}
	h.Version = 99 // ignored: the writer writes its own version
	h.Created = h.Created.In(time.FixedZone("X", -7*3600))
	recs2 := exRecords()
	recs2[1].Headers = map[string]string{"Nats-Expected-Last-Subject-Sequence": "0", "Nats-Msg-Id": "pg-main.basement.1"}
	for range 5 {
		if b := writeExport(t, h, recs2); !bytes.Equal(a, b) {
			t.Fatalf("equal header and records gave different bytes:\n%x\n%x", a, b)
		}
	}
	// Reading and writing again gives the file back.
	got, back, _, err := readExport(a)
	if err != io.EOF {
		t.Fatal(err)
	}
	if b := writeExport(t, got, back); !bytes.Equal(a, b) {
		t.Fatal("a file read and written again differs")
	}
}

// exBoundary is where the reader must report a file cut at byte cut: the
// start of the unit (magic line, frame) the cut falls into, and the number
// of records whole before it.
func exBoundary(magicEnd int, frames []exFrame, cut int) (offset, records int) {
	if cut < magicEnd {
		return 0, 0
	}
	offset = magicEnd
	for _, f := range frames {
		if f.end > cut {
			break
		}
		offset = f.end
		if f.kind == 'R' {
			records++
		}
	}
	return offset, records
}

func TestExportTruncatedAtEveryByte(t *testing.T) {
	recs := exRecords()
	data := writeExport(t, exHeader(), recs)
	magicEnd, frames := exFrames(t, data)
	for cut := range len(data) {
		_, got, r, err := readExport(data[:cut])
		ee := exportErr(t, err, events.ErrExportTruncated)
		offset, whole := exBoundary(magicEnd, frames, cut)
		if ee.Offset != int64(offset) || ee.Recovered != whole || len(got) != whole {
			t.Fatalf("cut at %d: error at %d with %d recovered, %d returned; want %d, %d (%v)",
				cut, ee.Offset, ee.Recovered, len(got), offset, whole, err)
		}
		if r != nil && r.Offset() != ee.Offset {
			t.Fatalf("cut at %d: Offset() = %d, error at %d", cut, r.Offset(), ee.Offset)
		}
		for i := range got {
			sameRecord(t, i, got[i], recs[i])
		}
		if r != nil {
			if _, again := r.Next(); again != err {
				t.Fatalf("cut at %d: Next after the error = %v, want the same error", cut, again)
			}
		}
	}
}

func TestExportBitFlips(t *testing.T) {
	recs := exRecords()[:5]
	data := writeExport(t, exHeader(), recs)
	magicEnd, frames := exFrames(t, data)
	for i := range data {
		for bit := range 8 {
			bad := bytes.Clone(data)
			bad[i] ^= 1 << bit
			_, got, _, err := readExport(bad)
			if err == io.EOF {
				t.Fatalf("flip of bit %d at byte %d: read as intact", bit, i)
			}
			ee := exportErr(t, err, nil)
			// Reported at the start of the magic line or frame holding the byte.
			offset, whole := exBoundary(magicEnd, frames, i)
			if ee.Offset != int64(offset) || ee.Recovered != len(got) || len(got) != whole {
				t.Fatalf("flip of bit %d at byte %d: error at %d, %d recovered, %d returned; want %d, %d (%v)",
					bit, i, ee.Offset, ee.Recovered, len(got), offset, whole, err)
			}
			for j := range got {
				sameRecord(t, j, got[j], recs[j])
			}
		}
	}
}

// Whole frames dropped, repeated or moved keep their own checksums; the
// trailer catches them.
func TestExportFramesRearranged(t *testing.T) {
	recs := exRecords()[:4]
	data := writeExport(t, exHeader(), recs)
	magicEnd, frames := exFrames(t, data)
	frame := func(i int) []byte { return data[frames[i].start:frames[i].end] }
	join := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	magic, tr := data[:magicEnd], frame(len(frames)-1)
	cases := []struct {
		name      string
		data      []byte
		reason    error
		recovered int
		msg       string
	}{
		{"record dropped", join(magic, frame(0), frame(1), frame(3), frame(4), tr), events.ErrExportChecksum, 3, "counts 4 records, the file holds 3"},
		{"records swapped", join(magic, frame(0), frame(2), frame(1), frame(3), frame(4), tr), events.ErrExportChecksum, 4, "whole-file CRC-32C"},
		{"record repeated and one dropped", join(magic, frame(0), frame(1), frame(1), frame(3), frame(4), tr), events.ErrExportChecksum, 4, "whole-file CRC-32C"},
		{"bytes after the trailer", join(data, []byte{0}), events.ErrExportMalformed, 4, "bytes follow the trailer"},
		{"two trailers", join(data, tr), events.ErrExportMalformed, 4, "bytes follow the trailer"},
		{"second header", join(magic, frame(0), frame(1), frame(0), frame(2)), events.ErrExportMalformed, 1, "second header"},
		{"no header", join(magic, frame(1), frame(2)), events.ErrExportMalformed, 0, "first frame"},
		{"trailer only", join(magic, tr), events.ErrExportMalformed, 0, "first frame"},
		{"unknown frame kind", join(magic, frame(0), exFrameBytes('X', []byte{0x80})), events.ErrExportMalformed, 0, "unknown frame kind"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, got, _, err := readExport(c.data)
			ee := exportErr(t, err, c.reason)
			if ee.Recovered != c.recovered || len(got) != c.recovered {
				t.Errorf("recovered %d, returned %d, want %d", ee.Recovered, len(got), c.recovered)
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Errorf("error %q does not say %q", err, c.msg)
			}
		})
	}
}

// Bodies with intact checksums but content that breaks the format.
func TestExportMalformedBodies(t *testing.T) {
	data := writeExport(t, events.ExportHeader{Source: "s"}, nil)
	magicEnd, frames := exFrames(t, data)
	head := data[:frames[0].end]
	withRecord := func(body []byte) []byte {
		return exTrailer(append(bytes.Clone(head), exFrameBytes('R', body)...), 1)
	}
	mp := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	bad := map[string][]byte{
		"not a map":       mp([]any{"st", "x"}),
		"int key":         mp(map[int]string{1: "x"}),
		"stream not str":  mp(map[string]any{"st": 1}),
		"seq negative":    mp(map[string]any{"sq": -1}),
		"seq is str":      mp(map[string]any{"sq": "1"}),
		"ts is float":     mp(map[string]any{"ts": 1.5}),
		"ts too large":    mp(map[string]any{"ts": uint64(1 << 63)}),
		"headers not map": mp(map[string]any{"h": "x"}),
		"header value":    mp(map[string]any{"h": map[string]int{"a": 1}}),
		"data is int":     mp(map[string]any{"d": 1}),
		"duplicate key":   {0x82, 0xa2, 's', 'q', 0x01, 0xa2, 's', 'q', 0x02},
		"duplicate hdr":   {0x81, 0xa1, 'h', 0x82, 0xa1, 'a', 0xa0, 0xa1, 'a', 0xa0},
		"trailing byte":   append(mp(map[string]any{"sq": 1}), 0),
		"cut msgpack":     mp(map[string]any{"su": "ev.x"})[:5],
		"huge map len":    {0xdf, 0xff, 0xff, 0xff, 0xff},
		"empty body":      {},
	}
	for name, body := range bad {
		t.Run(name, func(t *testing.T) {
			_, got, _, err := readExport(withRecord(body))
			ee := exportErr(t, err, events.ErrExportMalformed)
			if ee.Offset != int64(frames[0].end) || ee.Recovered != 0 || len(got) != 0 {
				t.Errorf("error at %d with %d recovered: %v", ee.Offset, ee.Recovered, err)
			}
		})
	}
	badHeader := exTrailer(append([]byte("understudy-export v1\n"), exFrameBytes('H', mp(map[string]any{"m": []int{1}}))...), 0)
	_, _, _, err := readExport(badHeader)
	if ee := exportErr(t, err, events.ErrExportMalformed); ee.Offset != int64(magicEnd) {
		t.Errorf("bad header reported at %d, want %d", ee.Offset, magicEnd)
	}

	// Any msgpack encoding of the right type is read, keys in any order;
	// unknown keys and nil values are skipped (see the versioning policy).
	lenient := mp(map[string]any{
		"ts": int64(-5), "sq": uint64(3), "future": []any{1, map[string]any{"x": nil}},
		"st": "S", "su": []byte("ev.x"), "d": "text", "h": map[string]string{"a": "b"}, "n": nil,
	})
	_, got, _, err := readExport(withRecord(lenient))
	want := events.Record{Stream: "S", Subject: "ev.x", Sequence: 3, Time: time.Unix(0, -5), Headers: map[string]string{"a": "b"}, Data: []byte("text")}
	if err != io.EOF || len(got) != 1 {
		t.Fatalf("lenient record: %d records, %v", len(got), err)
	}
	sameRecord(t, 0, got[0], want)
}

func TestExportBadMagic(t *testing.T) {
	data := writeExport(t, exHeader(), exRecords()[:1])
	body := data[len("understudy-export v1\n"):]
	cases := map[string]struct {
		data   []byte
		reason error
	}{
		"empty file":         {nil, events.ErrExportTruncated},
		"zip":                {[]byte("PK\x03\x04\x14\x00\x00\x00"), events.ErrExportMagic},
		"json":               {[]byte(`{"records": []}`), events.ErrExportMagic},
		"one wrong byte":     {[]byte("understudy-exp0rt v1\n"), events.ErrExportMagic},
		"no version":         {append([]byte("understudy-export v\n"), body...), events.ErrExportMagic},
		"leading zero":       {append([]byte("understudy-export v01\n"), body...), events.ErrExportMagic},
		"crlf":               {append([]byte("understudy-export v1\r\n"), body...), events.ErrExportMagic},
		"version too long":   {append([]byte("understudy-export v1234567890\n"), body...), events.ErrExportMagic},
		"short not a prefix": {[]byte("under"), events.ErrExportTruncated},
		"short other":        {[]byte("x"), events.ErrExportMagic},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			r, err := events.NewExportReader(bytes.NewReader(c.data))
			if r != nil {
				t.Fatal("a reader was returned with the error")
			}
			ee := exportErr(t, err, c.reason)
			if ee.Offset != 0 || ee.Recovered != 0 {
				t.Errorf("error at %d with %d recovered, want 0, 0", ee.Offset, ee.Recovered)
			}
		})
	}
}

func TestExportFutureVersion(t *testing.T) {
	data := writeExport(t, exHeader(), exRecords())
	for _, v := range []string{"2", "17", "999999999"} {
		future := append([]byte("understudy-export v"+v+"\n"), data[len("understudy-export v1\n"):]...)
		_, err := events.NewExportReader(bytes.NewReader(future))
		ee := exportErr(t, err, events.ErrExportVersion)
		msg := err.Error()
		if ee.Offset != 0 || !strings.Contains(msg, "unsupported version "+v) || !strings.Contains(msg, "newer understudy") {
			t.Errorf("version %s: %q at %d", v, msg, ee.Offset)
		}
	}
	_, err := events.NewExportReader(strings.NewReader("understudy-export v0\n"))
	exportErr(t, err, events.ErrExportVersion)
}

func TestExportErrorMessage(t *testing.T) {
	recs := exRecords()
	data := writeExport(t, exHeader(), recs)
	_, frames := exFrames(t, data)
	cut := frames[4].start + 20 // inside the fourth record
	_, _, _, err := readExport(data[:cut])
	msg := err.Error()
	for _, want := range []string{fmt.Sprintf("at byte %d", frames[4].start), "3 records read intact", "truncated record"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q does not say %q", msg, want)
		}
	}
	_, _, _, err = readExport(data[:frames[1].end])
	if msg := err.Error(); !strings.Contains(msg, "missing trailer") || !strings.Contains(msg, "1 record read intact") {
		t.Errorf("message %q", msg)
	}
	flipped := bytes.Clone(data)
	flipped[frames[2].end-1] ^= 0x40
	_, _, _, err = readExport(flipped)
	exportErr(t, err, events.ErrExportChecksum)
	if msg := err.Error(); !strings.Contains(msg, "bad checksum") || !strings.Contains(msg, fmt.Sprintf("byte %d", frames[2].start)) {
		t.Errorf("message %q", msg)
	}
}

type failingWriter struct{ n int }

var errDiskFull = errors.New("disk full")

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.n < len(p) {
		n := w.n
		w.n = 0
		return n, errDiskFull
	}
	w.n -= len(p)
	return len(p), nil
}

// closeTrap fails the test if Close is called: the writer must leave the
// underlying writer open.
type closeTrap struct {
	bytes.Buffer
	t *testing.T
}

func (c *closeTrap) Close() error {
	c.t.Error("ExportWriter closed the underlying writer")
	return nil
}

func TestExportWriterErrors(t *testing.T) {
	far := time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, err := events.NewExportWriter(io.Discard, events.ExportHeader{To: far}); !errors.Is(err, events.ErrUnexportable) {
		t.Errorf("header time %v: %v, want ErrUnexportable", far, err)
	}
	w, err := events.NewExportWriter(&closeTrap{t: t}, events.ExportHeader{})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(events.Record{Subject: "ev.x", Time: time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC)}); !errors.Is(err, events.ErrUnexportable) {
		t.Errorf("record time in 1600: %v, want ErrUnexportable", err)
	}
	if err := w.Write(events.Record{Subject: "ev.x", Time: exT0}); err != nil {
		t.Fatal(err)
	}
	if w.Count() != 1 {
		t.Errorf("Count = %d after one good and one refused record", w.Count())
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := w.Write(events.Record{}); !errors.Is(err, fs.ErrClosed) {
		t.Errorf("Write after Close: %v, want fs.ErrClosed", err)
	}

	// A failing underlying writer: the error comes back and stays.
	fw := &failingWriter{n: 100 << 10}
	w, err = events.NewExportWriter(fw, events.ExportHeader{})
	if err != nil {
		t.Fatal(err)
	}
	var werr error
	for i := 0; werr == nil && i < 1e5; i++ {
		werr = w.Write(events.Record{Subject: "ev.x", Sequence: uint64(i + 1), Data: make([]byte, 100)})
	}
	if !errors.Is(werr, errDiskFull) {
		t.Fatalf("Write on a full disk: %v", werr)
	}
	if err := w.Write(events.Record{}); !errors.Is(err, errDiskFull) {
		t.Errorf("next Write: %v, want the same error", err)
	}
	if err := w.Close(); !errors.Is(err, errDiskFull) {
		t.Errorf("Close: %v, want the same error", err)
	}
}

type failingReader struct {
	data []byte
	err  error
}

func (r *failingReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

// An I/O error is not corruption: it comes back wrapped, not as an
// *ExportError.
func TestExportReaderIOError(t *testing.T) {
	data := writeExport(t, exHeader(), exRecords())
	_, frames := exFrames(t, data)
	errNet := errors.New("connection reset")
	for _, cut := range []int{3, frames[0].end - 2, frames[2].start + 5, len(data) - 1, len(data)} {
		r, err := events.NewExportReader(&failingReader{data: data[:cut], err: errNet})
		for err == nil {
			_, err = r.Next()
		}
		var ee *events.ExportError
		if !errors.Is(err, errNet) || errors.As(err, &ee) || errors.Is(err, events.ErrCorrupt) {
			t.Errorf("cut at %d: %v, want the I/O error, not corruption", cut, err)
		}
	}
}

// Reading holds no more than the current record: a record without headers
// costs one allocation (its data), whatever was read before.
func TestExportReadAllocations(t *testing.T) {
	recs := exBenchRecords(20000, false)
	data := writeExport(t, events.ExportHeader{}, recs)
	r, err := events.NewExportReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	for range 1000 { // warm the string table
		if _, err := r.Next(); err != nil {
			t.Fatal(err)
		}
	}
	allocs := testing.AllocsPerRun(10000, func() {
		if _, err := r.Next(); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 1 {
		t.Errorf("%.1f allocations per record, want at most 1", allocs)
	}
}

// exBenchRecords is a pair's history: KV heartbeats and leader writes, and,
// when withEvents, every fourth record an event with its message id header.
func exBenchRecords(n int, withEvents bool) []events.Record {
	recs := make([]events.Record, n)
	data := bytes.Repeat([]byte{0xa5}, 48)
	sites := []string{"shop", "basement", "attic"}
	for i := range recs {
		site := sites[i%len(sites)]
		at := exT0.Add(time.Duration(i) * 100 * time.Millisecond)
		if withEvents && i%4 == 3 {
			recs[i] = events.Record{
				Stream: "UNDERSTUDY_EVENTS", Subject: "ev.failover.pg-main." + site, Sequence: uint64(i/4 + 1), Time: at,
				Headers: map[string]string{"Nats-Msg-Id": fmt.Sprintf("pg-main.%s.%d", site, i)},
				Data:    data[:40],
			}
			continue
		}
		recs[i] = events.KVRecord(exBucket, events.Entry{Key: "pg-main.hb." + site, Value: data, Revision: uint64(i + 1), Time: at, Op: events.OpPut})
	}
	return recs
}

const exBenchRecordsN = 100_000

func BenchmarkExportRead(b *testing.B) {
	for _, bc := range []struct {
		name   string
		events bool
	}{{"kv", false}, {"kv+events", true}} {
		b.Run(bc.name, func(b *testing.B) {
			data := writeExport(b, events.ExportHeader{Source: "bench"}, exBenchRecords(exBenchRecordsN, bc.events))
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				r, err := events.NewExportReader(bytes.NewReader(data))
				if err != nil {
					b.Fatal(err)
				}
				n := 0
				for {
					if _, err := r.Next(); err != nil {
						if err != io.EOF {
							b.Fatal(err)
						}
						break
					}
					n++
				}
				if n != exBenchRecordsN {
					b.Fatalf("read %d records", n)
				}
			}
			b.ReportMetric(float64(exBenchRecordsN)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
		})
	}
}

func BenchmarkExportWrite(b *testing.B) {
	for _, bc := range []struct {
		name   string
		events bool
	}{{"kv", false}, {"kv+events", true}} {
		b.Run(bc.name, func(b *testing.B) {
			recs := exBenchRecords(exBenchRecordsN, bc.events)
			var size int64
			b.ReportAllocs()
			for b.Loop() {
				cw := &countingWriter{}
				w, err := events.NewExportWriter(cw, events.ExportHeader{Source: "bench"})
				if err != nil {
					b.Fatal(err)
				}
				for _, rec := range recs {
					if err := w.Write(rec); err != nil {
						b.Fatal(err)
					}
				}
				if err := w.Close(); err != nil {
					b.Fatal(err)
				}
				size = cw.n
			}
			b.SetBytes(size)
			b.ReportMetric(float64(exBenchRecordsN)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
		})
	}
}

type countingWriter struct{ n int64 }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	return len(p), nil
}

// Every msgpack integer width, both signs, round-trips (times before 1970
// are negative nanoseconds).
func TestExportIntegerWidths(t *testing.T) {
	nanos := []int64{0, 1, -1, 127, 128, -32, -33, 255, 256, -128, -129, 65535, 65536, -32768, -32769,
		1<<32 - 1, 1 << 32, -1 << 31, -1<<31 - 1, 1<<63 - 1, -1 << 63}
	var recs []events.Record
	for i, n := range nanos {
		recs = append(recs, events.Record{Subject: "ev.x", Sequence: uint64(n) >> (i % 64), Time: time.Unix(0, n)})
	}
	_, got, _, err := readExport(writeExport(t, events.ExportHeader{From: time.Unix(0, -1<<63), To: time.Unix(0, 1<<63-1)}, recs))
	if err != io.EOF || len(got) != len(recs) {
		t.Fatalf("%d records, %v", len(got), err)
	}
	for i := range recs {
		sameRecord(t, i, got[i], recs[i])
	}
}
