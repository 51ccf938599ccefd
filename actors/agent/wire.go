package agent

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// decodeBounded decodes an untrusted msgpack value into a T: it is checked
// against lim first (CheckWire), and a decoder panic is an error. what
// names the value in errors.
func decodeBounded[T any](b []byte, lim WireLimits, what string) (v T, err error) {
	var zero T
	if err := CheckWire(b, lim); err != nil {
		return zero, fmt.Errorf("%s: %w", what, err)
	}
	defer func() {
		if p := recover(); p != nil {
			v, err = zero, fmt.Errorf("%s: msgpack decoder panic: %v", what, p)
		}
	}()
	if err := msgpack.Unmarshal(b, &v); err != nil {
		return zero, fmt.Errorf("%s: %w", what, err)
	}
	return v, nil
}

// WireLimits bound a msgpack value read from the fleet bucket before it is
// decoded: anything in NATS is untrusted, and msgpack decodes nesting by
// recursion (a deep value overflows the stack, a fatal error no recover
// catches) and gives every map and list a Go allocation of its own (a
// small value can cost a hundred times its size in memory).
type WireLimits struct {
	Bytes  int // the whole value
	Depth  int // maps and lists inside one another
	Values int // every map, list and scalar, keys included
	// Timestamps admits msgpack's timestamp extension (type -1), which a
	// status holds; every other extension type is refused.
	Timestamps bool
}

// Limits of a stored manifest and of a stored status.
var (
	ManifestLimits = WireLimits{Bytes: 1 << 20, Depth: 32, Values: 1 << 16}
	StatusLimits   = WireLimits{Bytes: 4 << 20, Depth: 32, Values: 1 << 18, Timestamps: true}
)

// WireError says which rule a stored value breaks, and where.
type WireError struct {
	Offset int // byte offset of the offending value
	Rule   string
}

func (e *WireError) Error() string {
	return fmt.Sprintf("msgpack at byte %d: %s", e.Offset, e.Rule)
}

var errWireTruncated = errors.New("truncated")

// CheckWire walks b as exactly one msgpack value without decoding it and
// returns a *WireError for the first rule it breaks: longer than
// lim.Bytes, nested deeper than lim.Depth, more than lim.Values values, a
// declared length beyond the input, bytes after the value, an extension
// type or a reserved byte (a manifest uses neither), or a map key that is
// not a string. It allocates nothing and recurses at most lim.Depth deep.
func CheckWire(b []byte, lim WireLimits) error {
	if len(b) > lim.Bytes {
		return &WireError{0, fmt.Sprintf("%d bytes, more than the %d allowed", len(b), lim.Bytes)}
	}
	w := wireWalk{b: b, lim: lim}
	if err := w.value(0, false); err != nil {
		return err
	}
	if w.i != len(b) {
		return &WireError{w.i, fmt.Sprintf("%d bytes after the value", len(b)-w.i)}
	}
	return nil
}

type wireWalk struct {
	b      []byte
	i      int
	values int
	lim    WireLimits
}

func (w *wireWalk) need(n uint64) error {
	if n > uint64(len(w.b)-w.i) {
		return &WireError{w.i, fmt.Sprintf("declares %d bytes, %d remain (%v)", n, len(w.b)-w.i, errWireTruncated)}
	}
	return nil
}

func (w *wireWalk) uint(n int) (uint64, error) {
	if err := w.need(uint64(n)); err != nil {
		return 0, err
	}
	var v uint64
	switch n {
	case 1:
		v = uint64(w.b[w.i])
	case 2:
		v = uint64(binary.BigEndian.Uint16(w.b[w.i:]))
	case 4:
		v = uint64(binary.BigEndian.Uint32(w.b[w.i:]))
	}
	w.i += n
	return v, nil
}

// value reads one value at depth (0: the top); key: it is a map key.
func (w *wireWalk) value(depth int, key bool) error {
	at := w.i
	if w.values++; w.values > w.lim.Values {
		return &WireError{at, fmt.Sprintf("more than %d values", w.lim.Values)}
	}
	if err := w.need(1); err != nil {
		return err
	}
	c := w.b[w.i]
	w.i++
	isStr := false
	var skip uint64         // payload bytes
	var items uint64        // child values
	var lenBytes, fixed int // length field size; fixed payload size
	switch {
	case c <= 0x7f || c >= 0xe0: // fixint
	case c >= 0x80 && c <= 0x8f:
		items = 2 * uint64(c&0x0f)
	case c >= 0x90 && c <= 0x9f:
		items = uint64(c & 0x0f)
	case c >= 0xa0 && c <= 0xbf:
		skip, isStr = uint64(c&0x1f), true
	default:
		switch c {
		case 0xc0, 0xc2, 0xc3: // nil, false, true
		case 0xc4, 0xd9:
			lenBytes = 1
		case 0xc5, 0xda:
			lenBytes = 2
		case 0xc6, 0xdb:
			lenBytes = 4
		case 0xca:
			fixed = 4
		case 0xcb:
			fixed = 8
		case 0xcc, 0xd0:
			fixed = 1
		case 0xcd, 0xd1:
			fixed = 2
		case 0xce, 0xd2:
			fixed = 4
		case 0xcf, 0xd3:
			fixed = 8
		case 0xdc, 0xde:
			n, err := w.uint(2)
			if err != nil {
				return err
			}
			items = n
			if c == 0xde {
				items *= 2
			}
		case 0xdd, 0xdf:
			n, err := w.uint(4)
			if err != nil {
				return err
			}
			items = n
			if c == 0xdf {
				items *= 2
			}
		case 0xc1:
			return &WireError{at, "byte 0xc1 is reserved: not msgpack"}
		case 0xd6, 0xd7, 0xc7: // timestamp 32, 64, 96
			if w.lim.Timestamps {
				size := map[byte]uint64{0xd6: 4, 0xd7: 8, 0xc7: 12}[c]
				if c == 0xc7 {
					n, err := w.uint(1)
					if err != nil {
						return err
					}
					if n != 12 {
						return &WireError{at, "extension other than a timestamp"}
					}
				}
				t, err := w.uint(1)
				if err != nil {
					return err
				}
				if t != 0xff {
					return &WireError{at, fmt.Sprintf("extension type %d: only timestamps (-1)", int8(t))}
				}
				fixed = int(size)
				break
			}
			fallthrough
		default: // 0xc7-0xc9, 0xd4-0xd8
			return &WireError{at, fmt.Sprintf("extension type (0x%02x): a manifest holds maps, lists, strings, numbers and booleans only", c)}
		}
		isStr = c >= 0xd9 && c <= 0xdb
		if lenBytes > 0 {
			n, err := w.uint(lenBytes)
			if err != nil {
				return err
			}
			skip = n
		}
		skip += uint64(fixed)
	}
	if key && !isStr {
		return &WireError{at, "map key is not a string"}
	}
	if err := w.need(skip); err != nil {
		return err
	}
	w.i += int(skip)
	if items == 0 {
		return nil
	}
	if depth+1 > w.lim.Depth {
		return &WireError{at, fmt.Sprintf("nested deeper than %d levels", w.lim.Depth)}
	}
	if err := w.need(items); err != nil { // every value takes a byte at least
		return err
	}
	isMap := c&0xf0 == 0x80 || c == 0xde || c == 0xdf
	for k := uint64(0); k < items; k++ {
		if err := w.value(depth+1, isMap && k%2 == 0); err != nil {
			return err
		}
	}
	return nil
}
