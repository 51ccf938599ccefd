package mp

import (
	"encoding/binary"
	"errors"
)

// Why a value could not be read.
var (
	ErrTruncated = errors.New("truncated msgpack")
	ErrNotMap    = errors.New("not a msgpack map")
	ErrNotBytes  = errors.New("not a msgpack str or bin")
	ErrNotUint   = errors.New("not a non-negative msgpack integer")
	ErrNotInt    = errors.New("not a msgpack integer in the int64 range")
	ErrNotBool   = errors.New("not a msgpack bool")
)

// MapLen reads a map header: the number of entries that follow.
func MapLen(b []byte, i int) (n, next int, err error) {
	if i >= len(b) {
		return 0, 0, ErrTruncated
	}
	c := b[i]
	switch {
	case c >= 0x80 && c <= 0x8f:
		n, next = int(c&0x0f), i+1
	case c == 0xde && i+3 <= len(b):
		n, next = int(binary.BigEndian.Uint16(b[i+1:])), i+3
	case c == 0xdf && i+5 <= len(b):
		n, next = int(binary.BigEndian.Uint32(b[i+1:])), i+5
	case c == 0xde || c == 0xdf:
		return 0, 0, ErrTruncated
	default:
		return 0, 0, ErrNotMap
	}
	if n > (len(b)-next)/2 { // every entry takes at least two bytes
		return 0, 0, ErrTruncated
	}
	return n, next, nil
}

// Bytes returns the payload of a str or bin, not copied.
func Bytes(b []byte, i int) (p []byte, next int, err error) {
	if i >= len(b) {
		return nil, 0, ErrTruncated
	}
	c := b[i]
	var n, hdr int
	switch {
	case c >= 0xa0 && c <= 0xbf:
		n, hdr = int(c&0x1f), 1
	case (c == 0xd9 || c == 0xc4) && i+2 <= len(b):
		n, hdr = int(b[i+1]), 2
	case (c == 0xda || c == 0xc5) && i+3 <= len(b):
		n, hdr = int(binary.BigEndian.Uint16(b[i+1:])), 3
	case (c == 0xdb || c == 0xc6) && i+5 <= len(b):
		n, hdr = int(binary.BigEndian.Uint32(b[i+1:])), 5
	case c == 0xd9 || c == 0xc4 || c == 0xda || c == 0xc5 || c == 0xdb || c == 0xc6:
		return nil, 0, ErrTruncated
	default:
		return nil, 0, ErrNotBytes
	}
	start := i + hdr
	if n > len(b)-start {
		return nil, 0, ErrTruncated
	}
	return b[start : start+n], start + n, nil
}

// Uint reads a non-negative integer of any width, signed or not.
func Uint(b []byte, i int) (uint64, int, error) {
	if i >= len(b) {
		return 0, 0, ErrTruncated
	}
	c := b[i]
	if c <= 0x7f {
		return uint64(c), i + 1, nil
	}
	size := intSize(c)
	if size == 0 {
		return 0, 0, ErrNotUint
	}
	if size > len(b)-i-1 {
		return 0, 0, ErrTruncated
	}
	p := b[i+1 : i+1+size]
	if c >= 0xd0 && p[0]&0x80 != 0 { // a negative signed integer
		return 0, 0, ErrNotUint
	}
	return BeUint(p), i + 1 + size, nil
}

// Int reads an integer of any width that fits an int64.
func Int(b []byte, i int) (int64, int, error) {
	if i >= len(b) {
		return 0, 0, ErrTruncated
	}
	c := b[i]
	switch {
	case c <= 0x7f:
		return int64(c), i + 1, nil
	case c >= 0xe0:
		return int64(int8(c)), i + 1, nil
	}
	size := intSize(c)
	if size == 0 {
		return 0, 0, ErrNotInt
	}
	if size > len(b)-i-1 {
		return 0, 0, ErrTruncated
	}
	u := BeUint(b[i+1 : i+1+size])
	if c >= 0xd0 { // signed: sign-extend
		shift := 64 - 8*size
		return int64(u<<shift) >> shift, i + 1 + size, nil
	}
	if u > 1<<63-1 {
		return 0, 0, ErrNotInt
	}
	return int64(u), i + 1 + size, nil
}

// Bool reads true or false.
func Bool(b []byte, i int) (bool, int, error) {
	switch {
	case i >= len(b):
		return false, 0, ErrTruncated
	case b[i] == 0xc2:
		return false, i + 1, nil
	case b[i] == 0xc3:
		return true, i + 1, nil
	}
	return false, 0, ErrNotBool
}

// intSize is the payload size of the uint/int 8..64 codes (0: not one).
func intSize(c byte) int {
	switch c {
	case 0xcc, 0xd0:
		return 1
	case 0xcd, 0xd1:
		return 2
	case 0xce, 0xd2:
		return 4
	case 0xcf, 0xd3:
		return 8
	}
	return 0
}

// BeUint is the big-endian unsigned integer in p (at most 8 bytes).
func BeUint(p []byte) uint64 {
	var v uint64
	for _, x := range p {
		v = v<<8 | uint64(x)
	}
	return v
}
