package events_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"runtime"
	"testing"
	"time"

	"understudy/events"
)

// manyRecords is enough records for several read-ahead batches.
func manyRecords(n int) []events.Record {
	recs := make([]events.Record, n)
	for i := range recs {
		recs[i] = events.Record{Stream: "UNDERSTUDY_EVENTS", Subject: fmt.Sprintf("ev.failover.p.s%d", i%3), Sequence: uint64(i + 1),
			Time: exT0.Add(time.Duration(i) * time.Millisecond), Data: []byte(fmt.Sprintf("record %d", i))}
	}
	return recs
}

// ReadAhead yields what Next returns, in order, and the same error at the
// end; the progress offsets only grow and end at the reader's.
func TestReadAheadYieldsWhatNextReturns(t *testing.T) {
	recs := manyRecords(5000)
	data := writeExport(t, exHeader(), recs)
	for _, cut := range []int{len(data), len(data) * 2 / 3} {
		_, want, _, wantErr := readExport(data[:cut])
		r, err := events.NewExportReader(bytes.NewReader(data[:cut]))
		if err != nil {
			t.Fatal(err)
		}
		var got []events.Record
		var gotErr error
		var offsets []int64
		for rec, err := range events.ReadAhead(r, func(off int64) { offsets = append(offsets, off) }) {
			if err != nil {
				gotErr = err
				continue
			}
			got = append(got, rec)
		}
		if len(got) != len(want) {
			t.Fatalf("cut %d: %d records, Next gave %d", cut, len(got), len(want))
		}
		for i := range want {
			sameRecord(t, i, got[i], want[i])
		}
		if cut == len(data) {
			if gotErr != nil || !errors.Is(wantErr, io.EOF) {
				t.Errorf("intact file: error %v (Next: %v)", gotErr, wantErr)
			}
		} else if gotErr == nil || gotErr.Error() != wantErr.Error() {
			t.Errorf("cut %d: error %v, Next gave %v", cut, gotErr, wantErr)
		}
		for i := 1; i < len(offsets); i++ {
			if offsets[i] < offsets[i-1] {
				t.Errorf("offsets go back: %v", offsets)
			}
		}
		if len(offsets) < 4 || offsets[len(offsets)-1] != r.Offset() {
			t.Errorf("cut %d: %d progress calls, last %v, reader at %d", cut, len(offsets), offsets, r.Offset())
		}
	}
}

// Leaving the loop early stops the reader goroutine.
func TestReadAheadStopsWhenTheLoopStops(t *testing.T) {
	data := writeExport(t, exHeader(), manyRecords(20000))
	before := runtime.NumGoroutine()
	for range 20 {
		r, err := events.NewExportReader(bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, err := range events.ReadAhead(r, nil) {
			if err != nil {
				t.Fatal(err)
			}
			if n++; n == 10 {
				break
			}
		}
	}
	// A goroutine is counted until it has returned, a moment after it let
	// the loop go: allow it that moment, not 20 goroutines.
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if after := runtime.NumGoroutine(); after > before {
		t.Errorf("%d goroutines before, %d after 20 loops left early", before, after)
	}
}
