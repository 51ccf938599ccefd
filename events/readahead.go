package events

import (
	"io"
	"iter"
	"sync"
)

// readAheadBatch is how many records ReadAhead reads before handing them
// over: large enough that the hand-over costs nothing per record, small
// enough that the two goroutines overlap from the start.
const readAheadBatch = 1024

// ReadAhead yields r's records in order while reading the next ones on a
// goroutine of its own, so that reading and checking frames (one core) and
// whatever the caller does with each record (the other) overlap. After the
// last record it yields the error that ended the read, if any (io.EOF is
// the normal end: nothing is yielded for it). progress, if not nil, is
// called on the caller's goroutine with r's offset after each batch.
//
// Breaking out of the loop stops the reader goroutine before the loop
// statement returns. r must not be used by anyone else during the loop.
func ReadAhead(r *ExportReader, progress func(offset int64)) iter.Seq2[Record, error] {
	return func(yield func(Record, error) bool) {
		type batch struct {
			recs   []Record
			offset int64
			err    error
		}
		// Two batches in flight: one being read, one being handed over.
		out := make(chan batch, 2)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer close(out)
			for {
				b := batch{recs: make([]Record, 0, readAheadBatch)}
				for len(b.recs) < readAheadBatch {
					rec, err := r.Next()
					if err != nil {
						if err != io.EOF {
							b.err = err
						}
						b.offset = r.Offset()
						select {
						case out <- b:
						case <-stop:
						}
						return
					}
					b.recs = append(b.recs, rec)
				}
				b.offset = r.Offset()
				select {
				case out <- b:
				case <-stop:
					return
				}
			}
		}()
		defer func() {
			close(stop)
			wg.Wait()
		}()
		for b := range out {
			for _, rec := range b.recs {
				if !yield(rec, nil) {
					return
				}
			}
			if progress != nil {
				progress(b.offset)
			}
			if b.err != nil {
				yield(Record{}, b.err)
				return
			}
		}
	}
}
