package mp

import (
	"errors"
	"math"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func enc(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Every width the library writes reads back, and every cut is ErrTruncated.
func TestReadsWhatTheLibraryWrites(t *testing.T) {
	for _, u := range []uint64{0, 127, 128, 255, 256, 65535, 65536, math.MaxUint32 + 1, math.MaxUint64} {
		signed := min(u, math.MaxInt64)
		for _, tc := range []struct {
			b    []byte
			want uint64
		}{{enc(t, u), u}, {enc(t, int64(signed)), signed}} {
			got, next, err := Uint(tc.b, 0)
			if err != nil || next != len(tc.b) || got != tc.want {
				t.Errorf("Uint(% x) = %d, %d, %v, want %d", tc.b, got, next, err, tc.want)
			}
			if _, _, err := Uint(tc.b[:len(tc.b)-1], 0); len(tc.b) > 1 && !errors.Is(err, ErrTruncated) {
				t.Errorf("Uint cut % x: %v", tc.b[:len(tc.b)-1], err)
			}
		}
	}
	for _, n := range []int64{-1, -32, -33, -128, -129, -32768, -32769, math.MinInt64, 5, math.MaxInt64} {
		b := enc(t, n)
		if got, next, err := Int(b, 0); err != nil || got != n || next != len(b) {
			t.Errorf("Int(% x) = %d, %d, %v, want %d", b, got, next, err, n)
		}
	}
	if _, _, err := Uint(enc(t, int64(-5)), 0); !errors.Is(err, ErrNotUint) {
		t.Errorf("Uint of a negative: %v", err)
	}
	if _, _, err := Int(enc(t, uint64(math.MaxUint64)), 0); !errors.Is(err, ErrNotInt) {
		t.Errorf("Int past int64: %v", err)
	}
	for _, n := range []int{0, 31, 32, 255, 256, 70000} {
		s := string(make([]byte, n))
		for _, b := range [][]byte{enc(t, s), enc(t, []byte(s))} {
			p, next, err := Bytes(b, 0)
			if err != nil || len(p) != n || next != len(b) {
				t.Errorf("Bytes of %d: %d, %d, %v", n, len(p), next, err)
			}
			if _, _, err := Bytes(b[:len(b)-1], 0); !errors.Is(err, ErrTruncated) {
				t.Errorf("Bytes cut of %d: %v", n, err)
			}
		}
	}
	for _, n := range []int{0, 15, 16, 70000} {
		m := make(map[int]bool, n)
		for i := range n {
			m[i] = true
		}
		b := enc(t, m)
		if got, _, err := MapLen(b, 0); err != nil || got != n {
			t.Errorf("MapLen of %d: %d, %v", n, got, err)
		}
	}
	for _, v := range []bool{true, false} {
		if got, next, err := Bool(enc(t, v), 0); err != nil || got != v || next != 1 {
			t.Errorf("Bool(%v): %v %d %v", v, got, next, err)
		}
	}
	for _, tc := range []struct {
		err error
		fn  func([]byte) error
	}{
		{ErrNotMap, func(b []byte) error { _, _, err := MapLen(b, 0); return err }},
		{ErrNotBytes, func(b []byte) error { _, _, err := Bytes(b, 0); return err }},
		{ErrNotBool, func(b []byte) error { _, _, err := Bool(b, 0); return err }},
	} {
		if err := tc.fn([]byte{0xc0}); !errors.Is(err, tc.err) {
			t.Errorf("nil read: %v, want %v", err, tc.err)
		}
		if err := tc.fn(nil); !errors.Is(err, ErrTruncated) {
			t.Errorf("empty read: %v", err)
		}
	}
}
