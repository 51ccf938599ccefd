package events

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"understudy/events/mp"
)

// Errors of the codec with stable identities (ErrCorrupt is in store.go).
var (
	// ErrUnregistered reports an Encode of an event whose type name is not
	// registered, or is registered as another Go type. Register it at init.
	ErrUnregistered = errors.New("events: event type not registered")

	// ErrInvalidRegistration reports a Register or RegisterUpcast call that
	// breaks the registry's rules; the message says which.
	ErrInvalidRegistration = errors.New("events: invalid event registration")
)

// Event is a fact an actor records. Its type name is stable across releases:
// it is what identifies the event in stored data.
type Event interface {
	EventType() string
}

// envelope is the stored form of every event: type name, schema version and
// the msgpack body, with short explicit tags. Encode and Decode write and
// read this layout by hand (see appendEnvelopeHeader and parseEnvelope); the
// struct is the reference the tests hold them to.
type envelope struct {
	Type    string             `msgpack:"t"`
	Version uint16             `msgpack:"v"`
	Body    msgpack.RawMessage `msgpack:"b"`
}

// Unknown is an event whose type this build does not know, or whose version
// is newer than registered or lacks an upcaster. It keeps the stored bytes
// so it can be reported, counted and re-appended, never dropped.
type Unknown struct {
	Type    string
	Version uint16
	Body    []byte // msgpack body as stored; a sub-slice of Raw
	Raw     []byte // the whole envelope as stored (a copy, not the caller's buffer)
}

// EventType implements Event.
func (u *Unknown) EventType() string { return u.Type }

// DecodeError reports bytes that are not a valid envelope or body. It wraps
// ErrCorrupt and names where the bytes came from.
type DecodeError struct {
	Subject  string
	Sequence uint64
	Type     string // event type, when the envelope itself was readable
	Err      error
}

func (e *DecodeError) Error() string {
	where := fmt.Sprintf("subject %q sequence %d", e.Subject, e.Sequence)
	if e.Type != "" {
		return fmt.Sprintf("events: corrupt %s event at %s: %v", e.Type, where, e.Err)
	}
	return fmt.Sprintf("events: corrupt envelope at %s: %v", where, e.Err)
}

func (e *DecodeError) Unwrap() []error { return []error{ErrCorrupt, e.Err} }

// Upcaster rewrites the msgpack body of an older schema version into the
// body of the next version (typically UnmarshalValue into the old struct,
// MarshalValue of the new one). It must not keep or modify body, and may be
// called concurrently.
type Upcaster func(body []byte) ([]byte, error)

type registration struct {
	version uint16
	typ     reflect.Type // the struct type; events are stored as *T
	header  []byte       // the envelope up to the body, precomputed
	hasTime bool         // bodies can hold time.Time values to normalise to UTC
	canon   bool         // bodies can hold maps msgpack does not sort
	upcast  map[uint16]Upcaster
}

// Registry maps event type names to Go types and schema versions. It is safe
// for concurrent use; registration normally happens at init. The zero value
// is an empty registry.
type Registry struct {
	mu     sync.RWMutex
	byName map[string]*registration
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{byName: map[string]*registration{}} }

// Register records that events named name are stored at schema version
// version as the struct that proto points to (proto must be a non-nil
// pointer to a struct implementing Event with EventType() == name).
// Registering the same name, type and version again is a no-op; a different
// type or version for a registered name is refused.
func (r *Registry) Register(proto Event, version uint16) error {
	if proto == nil {
		return fmt.Errorf("%w: Register: nil prototype", ErrInvalidRegistration)
	}
	t := reflect.TypeOf(proto)
	if t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("%w: Register %T: prototype must be a pointer to a struct", ErrInvalidRegistration, proto)
	}
	if reflect.ValueOf(proto).IsNil() {
		return fmt.Errorf("%w: Register %T: nil prototype", ErrInvalidRegistration, proto)
	}
	name := proto.EventType()
	if name == "" {
		return fmt.Errorf("%w: Register %T: empty event type name", ErrInvalidRegistration, proto)
	}
	if version == 0 {
		return fmt.Errorf("%w: Register %s: version must be >= 1", ErrInvalidRegistration, name)
	}
	facts := factsOf(t.Elem())
	reg := &registration{
		version: version,
		typ:     t.Elem(),
		header:  appendEnvelopeHeader(nil, name, version),
		hasTime: facts.hasTime,
		canon:   facts.canon,
		upcast:  map[uint16]Upcaster{},
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.byName[name]; ok {
		if old.typ != reg.typ {
			return fmt.Errorf("%w: Register %s as %v: already registered as %v", ErrInvalidRegistration, name, reg.typ, old.typ)
		}
		if old.version != version {
			return fmt.Errorf("%w: Register %s at version %d: already registered at version %d", ErrInvalidRegistration, name, version, old.version)
		}
		return nil // same registration again: keep its upcasters
	}
	if r.byName == nil {
		r.byName = map[string]*registration{}
	}
	r.byName[name] = reg
	return nil
}

// MustRegister is Register that panics; for package init.
func (r *Registry) MustRegister(proto Event, version uint16) {
	if err := r.Register(proto, version); err != nil {
		panic(err)
	}
}

// RegisterUpcast installs fn to turn bodies of version from into version
// from+1 for the named event type, which must already be registered.
func (r *Registry) RegisterUpcast(name string, from uint16, fn Upcaster) error {
	if fn == nil {
		return fmt.Errorf("%w: RegisterUpcast %s: nil upcaster", ErrInvalidRegistration, name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	reg, ok := r.byName[name]
	if !ok {
		return fmt.Errorf("%w: RegisterUpcast %s: type not registered", ErrInvalidRegistration, name)
	}
	if from == 0 || from >= reg.version {
		return fmt.Errorf("%w: RegisterUpcast %s: from version %d must be in [1, %d)", ErrInvalidRegistration, name, from, reg.version)
	}
	reg.upcast[from] = fn
	return nil
}

// encoder is a pooled msgpack encoder writing into its own buffer, so an
// Encode costs one allocation for the result plus what msgpack needs.
type encoder struct {
	buf bytes.Buffer
	enc *msgpack.Encoder
}

// maxPooledBuffer keeps one huge event from pinning its buffer in the pool.
const maxPooledBuffer = 64 << 10

var encoders = sync.Pool{New: func() any {
	e := &encoder{}
	e.enc = msgpack.NewEncoder(&e.buf)
	e.enc.SetSortMapKeys(true) // same event, same bytes: the simulator digests them
	return e
}}

// Encode returns the envelope bytes of ev. An *Unknown is returned as its
// stored bytes, unchanged (the slice is u.Raw itself). Map entries are
// written in a deterministic order, so equal events encode to equal bytes.
func (r *Registry) Encode(ev Event) ([]byte, error) {
	if u, ok := ev.(*Unknown); ok {
		if u == nil || len(u.Raw) == 0 {
			return nil, fmt.Errorf("%w: encode unknown event: no stored bytes to re-encode", ErrUnregistered)
		}
		return u.Raw, nil
	}
	if ev == nil {
		return nil, fmt.Errorf("%w: encode nil event", ErrUnregistered)
	}
	t := reflect.TypeOf(ev)
	if t.Kind() == reflect.Pointer {
		if reflect.ValueOf(ev).IsNil() {
			return nil, fmt.Errorf("%w: encode nil %T", ErrUnregistered, ev)
		}
		t = t.Elem()
	}
	name := ev.EventType()
	r.mu.RLock()
	reg, ok := r.byName[name]
	r.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w: encode %T: event type %q is not registered", ErrUnregistered, ev, name)
	}
	if reg.typ != t {
		return nil, fmt.Errorf("%w: encode %T: event type %q is registered as %v", ErrUnregistered, ev, name, reg.typ)
	}

	out, err := marshal(reg.header, ev, reg.canon)
	if err != nil {
		return nil, fmt.Errorf("events: encode %s: %w", name, err)
	}
	return out, nil
}

// marshal returns prefix followed by the msgpack encoding of v, with map
// entries sorted when canon says msgpack may not have sorted them.
func marshal(prefix []byte, v any, canon bool) ([]byte, error) {
	e := encoders.Get().(*encoder)
	defer func() {
		if e.buf.Cap() <= maxPooledBuffer {
			encoders.Put(e)
		}
	}()
	e.buf.Reset()
	e.buf.Write(prefix)
	if err := e.enc.Encode(v); err != nil {
		return nil, err
	}
	src := e.buf.Bytes()
	if !canon {
		return bytes.Clone(src), nil
	}
	out := make([]byte, len(prefix), len(src))
	copy(out, src)
	out, end, err := appendCanonical(out, src, len(prefix))
	if err != nil || end != len(src) {
		return nil, fmt.Errorf("msgpack wrote an unreadable value (%v)", err)
	}
	return out, nil
}

// decoder is a pooled msgpack decoder over a reusable reader: unlike
// msgpack.Unmarshal it allocates no reader per call.
type decoder struct {
	r   bytes.Reader
	dec *msgpack.Decoder
}

var decoders = sync.Pool{New: func() any {
	d := &decoder{}
	d.dec = msgpack.NewDecoder(&d.r)
	return d
}}

func unmarshal(data []byte, v any) error {
	d := decoders.Get().(*decoder)
	d.r.Reset(data)
	d.dec.Reset(&d.r)
	err := d.dec.Decode(v)
	d.r.Reset(nil)
	decoders.Put(d)
	return err
}

// MarshalValue encodes v as msgpack the way Encode writes event bodies
// (struct tags honoured, map entries in a deterministic order), for data
// stored outside the envelope such as KV values. It does not keep v.
func MarshalValue(v any) ([]byte, error) {
	canon := v != nil && factsOf(reflect.TypeOf(v)).canon
	out, err := marshal(nil, v, canon)
	if err != nil {
		return nil, fmt.Errorf("events: marshal %T: %w", v, err)
	}
	return out, nil
}

// UnmarshalValue decodes msgpack data into v, a non-nil pointer, with the
// care Decode takes: data must be exactly one well-formed value of bounded
// nesting, times come out in UTC, and bad bytes give an error wrapping
// ErrCorrupt rather than a panic. It does not keep data.
func UnmarshalValue(data []byte, v any) (err error) {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return fmt.Errorf("events: unmarshal into %T: need a non-nil pointer", v)
	}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: decoder panic: %v", ErrCorrupt, p)
		}
	}()
	end, err := valueEnd(data, 0)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if end != len(data) {
		return fmt.Errorf("%w: %w: %d of %d bytes read", ErrCorrupt, errTrailing, end, len(data))
	}
	if err := unmarshal(data, v); err != nil {
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if factsOf(rv.Type().Elem()).hasTime {
		toUTC(rv.Elem())
	}
	return nil
}

// Decode turns stored bytes into an event. Bytes of a type or version this
// registry does not know decode to *Unknown (not an error). Bytes that are not
// a valid envelope, or a body that does not fit its registered type, give a
// *DecodeError naming subject and seq. Decode never panics, does not keep
// data, and returns times in UTC.
func (r *Registry) Decode(subject string, seq uint64, data []byte) (ev Event, err error) {
	var env parsedEnvelope
	corrupt := func(err error) error {
		return &DecodeError{Subject: subject, Sequence: seq, Type: string(env.typ), Err: err}
	}
	defer func() {
		if p := recover(); p != nil {
			ev, err = nil, corrupt(fmt.Errorf("decoder panic: %v", p))
		}
	}()
	if env, err = parseEnvelope(data); err != nil {
		env.typ = nil // the envelope was not readable: name no type
		return nil, corrupt(err)
	}

	r.mu.RLock()
	reg, ok := r.byName[string(env.typ)]
	var chain []Upcaster
	if ok && env.version < reg.version {
		for v := env.version; v < reg.version; v++ {
			up, ok := reg.upcast[v]
			if !ok {
				break
			}
			chain = append(chain, up)
		}
	}
	r.mu.RUnlock()
	if !ok || env.version > reg.version || len(chain) < int(reg.version-env.version) {
		u := &Unknown{Type: string(env.typ), Version: env.version, Raw: bytes.Clone(data)}
		if env.bodyEnd > env.bodyStart {
			u.Body = u.Raw[env.bodyStart:env.bodyEnd:env.bodyEnd]
		}
		return u, nil
	}
	if env.bodyStart == env.bodyEnd {
		return nil, corrupt(errNoBody)
	}

	body := data[env.bodyStart:env.bodyEnd:env.bodyEnd]
	for i, up := range chain {
		from := int(env.version) + i
		if body, err = up(body); err != nil {
			return nil, corrupt(fmt.Errorf("upcast from version %d: %w", from, err))
		}
		if end, err := valueEnd(body, 0); err != nil || end != len(body) {
			return nil, corrupt(fmt.Errorf("upcast from version %d: result is not one msgpack value", from))
		}
	}
	ptr := reflect.New(reg.typ)
	if err := unmarshal(body, ptr.Interface()); err != nil {
		return nil, corrupt(err)
	}
	if reg.hasTime {
		toUTC(ptr.Elem())
	}
	return ptr.Interface().(Event), nil
}

// DecodeRecord decodes rec.Data, naming rec's subject and sequence on error.
func (r *Registry) DecodeRecord(rec Record) (Event, error) {
	return r.Decode(rec.Subject, rec.Sequence, rec.Data)
}

// --- envelope layout ---------------------------------------------------------

// appendEnvelopeHeader appends what msgpack writes for envelope{name,
// version, body} up to the body itself: a 3-entry map, keys t, v, b.
func appendEnvelopeHeader(dst []byte, name string, version uint16) []byte {
	dst = append(dst, 0x83, 0xa1, 't')
	dst = appendString(dst, name)
	dst = append(dst, 0xa1, 'v', 0xcd, byte(version>>8), byte(version))
	return append(dst, 0xa1, 'b')
}

// appendString appends s as msgpack writes it (the shortest str format).
func appendString(dst []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		dst = append(dst, 0xa0|byte(n))
	case n < 256:
		dst = append(dst, 0xd9, byte(n))
	case n < 1<<16:
		dst = append(dst, 0xda, byte(n>>8), byte(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, 0xdb), uint32(n))
	}
	return append(dst, s...)
}

// Reasons an envelope is corrupt; DecodeError.Err carries them.
var (
	errTruncated  = mp.ErrTruncated
	errReserved   = errors.New("reserved msgpack code 0xc1")
	errTooDeep    = fmt.Errorf("msgpack nested deeper than %d levels", maxDepth)
	errNotMap     = errors.New("envelope is not a msgpack map")
	errKeyNotStr  = errors.New("envelope key is not a string")
	errDupKey     = errors.New("envelope has a duplicate key")
	errNoType     = errors.New("envelope has no event type")
	errTypeNotStr = errors.New("envelope event type is not a string")
	errNoVersion  = errors.New("envelope has no schema version")
	errBadVersion = errors.New("envelope schema version is not an integer in [1, 65535]")
	errNoBody     = errors.New("envelope has no body")
	errTrailing   = errors.New("trailing bytes after the value")
)

// maxDepth bounds the nesting of stored msgpack: deeper input is corrupt
// rather than a reason for msgpack's recursive decoder to exhaust the stack.
const maxDepth = 100

type parsedEnvelope struct {
	typ                []byte // a sub-slice of the input; never empty when parsed
	version            uint16
	bodyStart, bodyEnd int // data[bodyStart:bodyEnd] is the body; empty when absent
}

// parseEnvelope checks that data is exactly one well-formed msgpack map
// (bounded nesting, no declared length beyond the input, no trailing bytes)
// holding the envelope keys, so that msgpack only ever sees sane input.
// Keys other than t, v and b are skipped for forward compatibility.
func parseEnvelope(data []byte) (parsedEnvelope, error) {
	var env parsedEnvelope
	hdr, _, children, err := msgpackHead(data, 0)
	if err != nil {
		return env, err
	}
	if c := data[0]; !(c >= 0x80 && c <= 0x8f) && c != 0xde && c != 0xdf {
		return env, errNotMap
	}
	var haveType, haveVersion, haveBody bool
	i := hdr
	for range children / 2 {
		keyEnd, err := valueEnd(data, i)
		if err != nil {
			return env, err
		}
		key, ok := stringAt(data, i, keyEnd)
		if !ok {
			return env, errKeyNotStr
		}
		valStart := keyEnd
		i, err = valueEnd(data, valStart)
		if err != nil {
			return env, err
		}
		if len(key) != 1 {
			continue
		}
		switch key[0] {
		case 't':
			if haveType {
				return env, errDupKey
			}
			haveType = true
			if data[valStart] == 0xc0 {
				return env, errNoType
			}
			s, ok := stringAt(data, valStart, i)
			if !ok {
				return env, errTypeNotStr
			}
			env.typ = s
		case 'v':
			if haveVersion {
				return env, errDupKey
			}
			haveVersion = true
			v, ok := uintAt(data, valStart, i)
			if !ok || v == 0 || v > 0xffff {
				return env, errBadVersion
			}
			env.version = uint16(v)
		case 'b':
			if haveBody {
				return env, errDupKey
			}
			haveBody = true
			env.bodyStart, env.bodyEnd = valStart, i
		}
	}
	if i != len(data) {
		return env, fmt.Errorf("%w: %d of %d bytes read", errTrailing, i, len(data))
	}
	if len(env.typ) == 0 {
		return env, errNoType
	}
	if !haveVersion {
		return env, errNoVersion
	}
	return env, nil
}

// stringAt returns the bytes of the msgpack string spanning data[i:end].
func stringAt(data []byte, i, end int) ([]byte, bool) {
	c := data[i]
	switch {
	case c >= 0xa0 && c <= 0xbf:
		i++
	case c == 0xd9:
		i += 2
	case c == 0xda:
		i += 3
	case c == 0xdb:
		i += 5
	default:
		return nil, false
	}
	return data[i:end], true
}

// uintAt returns the non-negative integer spanning data[i:end].
func uintAt(data []byte, i, end int) (uint64, bool) {
	c, p := data[i], data[i+1:end]
	switch {
	case c <= 0x7f:
		return uint64(c), true
	case c >= 0xcc && c <= 0xcf: // uint 8..64
		return mp.BeUint(p), true
	case c >= 0xd0 && c <= 0xd3: // int 8..64, sign bit first
		if p[0]&0x80 != 0 {
			return 0, false
		}
		return mp.BeUint(p), true
	}
	return 0, false
}

// msgpackHead reads the header of the msgpack item at b[i]: its size, how
// many payload bytes follow it, and how many nested items follow those.
func msgpackHead(b []byte, i int) (hdr int, payload, children uint64, err error) {
	if i >= len(b) {
		return 0, 0, 0, errTruncated
	}
	c := b[i]
	switch {
	case c <= 0x7f || c >= 0xe0: // fixint
		return 1, 0, 0, nil
	case c <= 0x8f: // fixmap
		return 1, 0, 2 * uint64(c&0x0f), nil
	case c <= 0x9f: // fixarray
		return 1, 0, uint64(c & 0x0f), nil
	case c <= 0xbf: // fixstr
		return 1, uint64(c & 0x1f), 0, nil
	}
	// lenAt reads an n-byte big-endian length after the code.
	lenAt := func(n int) (uint64, error) {
		if n > len(b)-i-1 {
			return 0, errTruncated
		}
		return mp.BeUint(b[i+1 : i+1+n]), nil
	}
	var n uint64
	switch c {
	case 0xc0, 0xc2, 0xc3: // nil, false, true
		return 1, 0, 0, nil
	case 0xc1:
		return 0, 0, 0, errReserved
	case 0xc4, 0xd9: // bin8, str8
		n, err = lenAt(1)
		return 2, n, 0, err
	case 0xc5, 0xda: // bin16, str16
		n, err = lenAt(2)
		return 3, n, 0, err
	case 0xc6, 0xdb: // bin32, str32
		n, err = lenAt(4)
		return 5, n, 0, err
	case 0xc7: // ext8: length, then type byte and data
		n, err = lenAt(1)
		return 2, n + 1, 0, err
	case 0xc8:
		n, err = lenAt(2)
		return 3, n + 1, 0, err
	case 0xc9:
		n, err = lenAt(4)
		return 5, n + 1, 0, err
	case 0xca, 0xce, 0xd2: // float32, uint32, int32
		return 1, 4, 0, nil
	case 0xcb, 0xcf, 0xd3: // float64, uint64, int64
		return 1, 8, 0, nil
	case 0xcc, 0xd0:
		return 1, 1, 0, nil
	case 0xcd, 0xd1:
		return 1, 2, 0, nil
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1..16 plus the type byte
		return 1, 1 + 1<<(c-0xd4), 0, nil
	case 0xdc: // array16
		n, err = lenAt(2)
		return 3, 0, n, err
	case 0xdd:
		n, err = lenAt(4)
		return 5, 0, n, err
	case 0xde: // map16
		n, err = lenAt(2)
		return 3, 0, 2 * n, err
	default: // 0xdf map32
		n, err = lenAt(4)
		return 5, 0, 2 * n, err
	}
}

// valueEnd returns the end of the well-formed msgpack value at b[i:]. It
// walks without recursion and refuses any declared length or element count
// the remaining input cannot hold, so hostile input costs O(len(b)).
func valueEnd(b []byte, i int) (int, error) {
	var stack [maxDepth]uint64 // items still to read in each open container
	depth := 0
	pending := uint64(1)
	for {
		for pending == 0 {
			if depth == 0 {
				return i, nil
			}
			depth--
			pending = stack[depth]
		}
		pending--
		hdr, payload, children, err := msgpackHead(b, i)
		if err != nil {
			return 0, err
		}
		i += hdr
		if i > len(b) || payload > uint64(len(b)-i) {
			return 0, errTruncated
		}
		i += int(payload)
		if children > 0 {
			if children > uint64(len(b)-i) { // every item takes at least a byte
				return 0, errTruncated
			}
			if depth == maxDepth {
				return 0, errTooDeep
			}
			stack[depth] = pending
			depth++
			pending = children
		}
	}
}

// --- deterministic maps ------------------------------------------------------

// appendCanonical appends the msgpack value at src[i:] to dst with the
// entries of every map sorted by their encoded keys, and returns where the
// value ends in src. msgpack sorts only maps of string to string, bool or
// interface; this covers the rest so equal events give equal bytes.
func appendCanonical(dst, src []byte, i int) ([]byte, int, error) {
	start := i
	hdr, payload, children, err := msgpackHead(src, start)
	if err != nil {
		return dst, 0, err
	}
	end := start + hdr + int(payload)
	if end > len(src) || end < start {
		return dst, 0, errTruncated
	}
	dst = append(dst, src[start:end]...)
	if children == 0 {
		return dst, end, nil
	}
	i = end
	if c := src[start]; (c >= 0x90 && c <= 0x9f) || c == 0xdc || c == 0xdd { // array
		for range children {
			if dst, i, err = appendCanonical(dst, src, i); err != nil {
				return dst, 0, err
			}
		}
		return dst, i, nil
	}
	type entry struct{ key, val, end int } // offsets in tmp
	var tmp []byte
	entries := make([]entry, 0, min(children/2, uint64(len(src)-i)))
	for range children / 2 {
		e := entry{key: len(tmp)}
		if tmp, i, err = appendCanonical(tmp, src, i); err != nil {
			return dst, 0, err
		}
		e.val = len(tmp)
		if tmp, i, err = appendCanonical(tmp, src, i); err != nil {
			return dst, 0, err
		}
		e.end = len(tmp)
		entries = append(entries, e)
	}
	slices.SortStableFunc(entries, func(a, b entry) int {
		return bytes.Compare(tmp[a.key:a.val], tmp[b.key:b.val])
	})
	for _, e := range entries {
		dst = append(dst, tmp[e.key:e.end]...)
	}
	return dst, i, nil
}

// --- type analysis and UTC normalisation -------------------------------------

var (
	timeType   = reflect.TypeFor[time.Time]()
	stringType = reflect.TypeFor[string]()
	boolType   = reflect.TypeFor[bool]()

	customEncoderType = reflect.TypeFor[msgpack.CustomEncoder]()
	marshalerType     = reflect.TypeFor[msgpack.Marshaler]()
)

// reaches reports whether a value of type t can contain (or be) a value
// whose type satisfies leaf.
func reaches(t reflect.Type, leaf func(reflect.Type) bool) bool {
	seen := map[reflect.Type]bool{}
	var walk func(t reflect.Type) bool
	walk = func(t reflect.Type) bool {
		if leaf(t) {
			return true
		}
		if seen[t] {
			return false // already being explored further up
		}
		seen[t] = true
		switch t.Kind() {
		case reflect.Pointer, reflect.Slice, reflect.Array:
			return walk(t.Elem())
		case reflect.Map:
			return walk(t.Key()) || walk(t.Elem())
		case reflect.Struct:
			for i := range t.NumField() {
				if walk(t.Field(i).Type) {
					return true
				}
			}
		}
		return false
	}
	return walk(t)
}

// mayHoldTime: a time.Time, or an interface that may hold one.
func mayHoldTime(t reflect.Type) bool {
	return t == timeType || t.Kind() == reflect.Interface
}

// mayEncodeUnsorted: a map msgpack writes in Go's random order, or a value
// whose encoding msgpack does not control.
func mayEncodeUnsorted(t reflect.Type) bool {
	switch {
	case t.Kind() == reflect.Interface:
		return true
	case t.Kind() == reflect.Map:
		return t.Key() != stringType || (t.Elem() != stringType && t.Elem() != boolType)
	}
	for _, it := range []reflect.Type{customEncoderType, marshalerType} {
		if t.Implements(it) || (t.Kind() != reflect.Pointer && reflect.PointerTo(t).Implements(it)) {
			return true
		}
	}
	return false
}

// typeFacts is what the codec needs to know about a Go type, computed once.
type typeFacts struct {
	hasTime bool // may hold a time.Time to normalise to UTC
	canon   bool // may hold a map msgpack writes unsorted
}

var typeFactsCache sync.Map // reflect.Type -> typeFacts

func factsOf(t reflect.Type) typeFacts {
	if f, ok := typeFactsCache.Load(t); ok {
		return f.(typeFacts)
	}
	f := typeFacts{hasTime: reaches(t, mayHoldTime), canon: reaches(t, mayEncodeUnsorted)}
	typeFactsCache.Store(t, f)
	return f
}

func holdsTime(t reflect.Type) bool { return factsOf(t).hasTime }

// toUTC rewrites in place every settable time.Time reachable from v as UTC:
// msgpack decodes times in the local zone, and stored facts are compared
// across sites.
func toUTC(v reflect.Value) {
	t := v.Type()
	if t == timeType {
		if v.CanSet() {
			p := v.Addr().Interface().(*time.Time)
			*p = p.UTC()
		}
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() && holdsTime(t.Elem()) {
			toUTC(v.Elem())
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Field(i); holdsTime(f.Type()) {
				toUTC(f)
			}
		}
	case reflect.Slice, reflect.Array:
		if holdsTime(t.Elem()) {
			for i := range v.Len() {
				toUTC(v.Index(i))
			}
		}
	case reflect.Map:
		toUTCMap(v)
	case reflect.Interface:
		if v.IsNil() || !v.CanSet() {
			return
		}
		e := v.Elem()
		if !holdsTime(e.Type()) {
			return
		}
		c := reflect.New(e.Type()).Elem()
		c.Set(e)
		toUTC(c)
		v.Set(c)
	}
}

// toUTCMap normalises a map's values in place, and rebuilds the map when
// its keys hold times (UTC keys of one instant would otherwise collide).
func toUTCMap(v reflect.Value) {
	t := v.Type()
	keys, vals := holdsTime(t.Key()), holdsTime(t.Elem())
	if v.IsNil() || v.Len() == 0 || !v.CanInterface() || (!keys && !vals) {
		return
	}
	copyUTC := func(x reflect.Value, typ reflect.Type) reflect.Value {
		c := reflect.New(typ).Elem()
		c.Set(x)
		toUTC(c)
		return c
	}
	if !keys {
		for it := v.MapRange(); it.Next(); {
			v.SetMapIndex(it.Key(), copyUTC(it.Value(), t.Elem()))
		}
		return
	}
	if !v.CanSet() {
		return
	}
	m := reflect.MakeMapWithSize(t, v.Len())
	for it := v.MapRange(); it.Next(); {
		val := it.Value()
		if vals {
			val = copyUTC(val, t.Elem())
		}
		m.SetMapIndex(copyUTC(it.Key(), t.Key()), val)
	}
	v.Set(m)
}
