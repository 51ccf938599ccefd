package events_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"testing"

	"understudy/events"
)

var updateExportCorpus = flag.Bool("update-export-corpus", false, "rewrite testdata/fuzz/FuzzExportReader from exportSeeds")

// FuzzExportReader: the reader never panics; every error is an
// *ExportError wrapping ErrCorrupt that counts exactly the records
// returned; it never returns a record whose frame is not intact, nor reads
// a file as complete unless its trailer holds. The input is read twice: as
// given, and resealed (frame checksums and trailer recomputed) so that
// mutations reach the body decoder. A file read as complete is written
// again, and the copy reads back the same.
func FuzzExportReader(f *testing.F) {
	for _, s := range exportSeeds(f) {
		f.Add(s.data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkExportRead(t, data)
		checkExportRead(t, exReseal(data))
	})
}

func checkExportRead(t *testing.T, data []byte) {
	input := bytes.Clone(data)
	h, recs, r, err := readExport(data)
	if !bytes.Equal(data, input) {
		t.Fatal("the reader modified its input")
	}
	intact := exIntactRecords(data)
	if len(recs) > intact {
		t.Fatalf("%d records returned, only %d frames intact", len(recs), intact)
	}
	if err != io.EOF {
		ee := exportErr(t, err, nil)
		if ee.Recovered != len(recs) || ee.Offset < 0 || ee.Offset > int64(len(data)) {
			t.Fatalf("error %v: %d recovered, %d returned, offset of %d bytes", err, ee.Recovered, len(recs), len(data))
		}
		if r != nil && r.Offset() != ee.Offset {
			t.Fatalf("Offset() = %d, error at %d", r.Offset(), ee.Offset)
		}
		return
	}
	if r.Offset() != int64(len(data)) {
		t.Fatalf("read as complete at %d of %d bytes", r.Offset(), len(data))
	}
	if len(recs) != intact {
		t.Fatalf("read as complete with %d records of %d frames", len(recs), intact)
	}
	// What was read writes and reads back the same, byte for byte on the
	// second write.
	again := writeExport(t, h, recs)
	h2, recs2, _, err := readExport(again)
	if err != io.EOF || len(recs2) != len(recs) {
		t.Fatalf("rewritten file: %d records, %v", len(recs2), err)
	}
	for i := range recs {
		sameRecord(t, i, recs2[i], recs[i])
	}
	if !bytes.Equal(writeExport(t, h2, recs2), again) {
		t.Fatal("writing what was read is not a fixed point")
	}
}

// exIntactRecords counts the record frames, from the start, whose
// checksums hold behind an intact magic line and header frame.
func exIntactRecords(data []byte) int {
	if !bytes.HasPrefix(data, []byte("understudy-export v1\n")) {
		return 0
	}
	n := 0
	for i, first := len("understudy-export v1\n"), true; len(data)-i >= 13; first = false {
		size := int(binary.BigEndian.Uint32(data[i+1:]))
		if crc32.Checksum(data[i:i+9], exCastagnoli) != binary.BigEndian.Uint32(data[i+9:]) ||
			size > len(data)-i-13 ||
			crc32.Checksum(data[i+13:i+13+size], exCastagnoli) != binary.BigEndian.Uint32(data[i+5:]) ||
			first != (data[i] == 'H') {
			break
		}
		if data[i] == 'R' {
			n++
		}
		i += 13 + size
	}
	return n
}

// exReseal recomputes every frame's checksums and the trailer's count and
// whole-file CRC, leaving the rest (magic, bodies, a cut at the end) alone.
func exReseal(data []byte) []byte {
	nl := bytes.IndexByte(data, '\n')
	if nl < 0 {
		return data
	}
	out := bytes.Clone(data[:nl+1])
	records := 0
	i := nl + 1
	for len(data)-i >= 13 {
		size := int(binary.BigEndian.Uint32(data[i+1:]))
		if size > len(data)-i-13 {
			break
		}
		kind, body := data[i], data[i+13:i+13+size]
		i += 13 + size
		if kind == 'T' {
			out = exTrailer(out, records)
			continue
		}
		if kind == 'R' {
			records++
		}
		out = append(out, exFrameBytes(kind, body)...)
	}
	return append(out, data[i:]...)
}

// exportSeed is one committed seed of FuzzExportReader and how it reads.
type exportSeed struct {
	name string
	data []byte
	want string // "ok <records>" or the reason of the error
}

func exportSeeds(tb testing.TB) []exportSeed {
	full := writeExport(tb, exHeader(), exRecords())
	small := writeExport(tb, events.ExportHeader{Pair: "pg-main"}, exRecords()[:3])
	flipped := bytes.Clone(small)
	flipped[len(flipped)/2] ^= 0x10
	unknownKey := exTrailer(append(bytes.Clone(small[:bytes.IndexByte(small, '\n')+1]),
		exFrameBytes('H', []byte{0x81, 0xa1, 'z', 0x91, 0xc0})...), 0)
	return []exportSeed{
		{"empty-export", writeExport(tb, events.ExportHeader{}, nil), "ok 0"},
		{"small-export", small, "ok 3"},
		{"full-export", full, fmt.Sprintf("ok %d", len(exRecords()))},
		{"header-unknown-key", unknownKey, "ok 0"},
		{"truncated", small[:len(small)-7], "truncated"},
		{"missing-trailer", small[:len(small)-24], "truncated"},
		{"bit-flip", flipped, "bad checksum"},
		{"future-version", append([]byte("understudy-export v2\n"), small[21:]...), "unsupported version"},
		{"bad-magic", []byte("PK\x03\x04 not an export"), "bad magic"},
		{"trailing-bytes", append(bytes.Clone(small), '\n'), "malformed"},
	}
}

// TestExportFuzzSeedCorpus keeps the committed seeds meaningful: each reads
// as its name says, and each file still holds what the writer writes today,
// so a change of the format shows up here. Regenerate with
// go test ./events -run TestExportFuzzSeedCorpus -update-export-corpus.
func TestExportFuzzSeedCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzExportReader")
	for _, s := range exportSeeds(t) {
		_, recs, _, err := readExport(s.data)
		got := fmt.Sprintf("ok %d", len(recs))
		if err != io.EOF {
			var ee *events.ExportError
			if !errors.As(err, &ee) {
				t.Fatalf("seed %s: %v", s.name, err)
			}
			got = ee.Err.Error()
		}
		if !bytes.HasPrefix([]byte(got), []byte(s.want)) {
			t.Errorf("seed %s reads as %q, want %q", s.name, got, s.want)
		}

		file := fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", s.data)
		path := filepath.Join(dir, s.name)
		if *updateExportCorpus {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, file, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		stored, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("seed %s: %v (regenerate with -update-export-corpus)", s.name, err)
		}
		if !bytes.Equal(stored, file) {
			t.Errorf("seed %s: stored file differs from what the writer writes now:\n%s\nwant\n%s", s.name, stored, file)
		}
	}
}
