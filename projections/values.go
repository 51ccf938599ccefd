package projections

import (
	"encoding/binary"

	"understudy/actors/failover"
)

// Heartbeats are most of a pair's record, so the fold reads the two KV
// values it sees most (the leadership register and a member heartbeat)
// with the small decoders below: one pass over the msgpack map, no
// reflection, no allocation. Anything they do not recognise — another key,
// another type, a width they do not expect — falls back to the failover
// package's own decoders, which stay the definition of the wire form; the
// tests hold the two to the same results.

// mpReader walks a msgpack value.
type mpReader struct {
	b []byte
	i int
}

func (r *mpReader) byte() (byte, bool) {
	if r.i >= len(r.b) {
		return 0, false
	}
	c := r.b[r.i]
	r.i++
	return c, true
}

// mapLen reads a map header.
func (r *mpReader) mapLen() (int, bool) {
	c, ok := r.byte()
	switch {
	case !ok:
		return 0, false
	case c >= 0x80 && c <= 0x8f:
		return int(c & 0x0f), true
	case c == 0xde && r.i+2 <= len(r.b):
		n := int(binary.BigEndian.Uint16(r.b[r.i:]))
		r.i += 2
		return n, true
	}
	return 0, false
}

// str reads a str (any width) and returns its bytes, not copied.
func (r *mpReader) str() ([]byte, bool) {
	c, ok := r.byte()
	if !ok {
		return nil, false
	}
	var n int
	switch {
	case c >= 0xa0 && c <= 0xbf:
		n = int(c & 0x1f)
	case c == 0xd9 && r.i+1 <= len(r.b):
		n = int(r.b[r.i])
		r.i++
	case c == 0xda && r.i+2 <= len(r.b):
		n = int(binary.BigEndian.Uint16(r.b[r.i:]))
		r.i += 2
	default:
		return nil, false
	}
	if n > len(r.b)-r.i {
		return nil, false
	}
	s := r.b[r.i : r.i+n]
	r.i += n
	return s, true
}

// uint reads a non-negative integer of any width.
func (r *mpReader) uint() (uint64, bool) {
	c, ok := r.byte()
	if !ok {
		return 0, false
	}
	if c <= 0x7f {
		return uint64(c), true
	}
	var size int
	switch c {
	case 0xcc, 0xd0:
		size = 1
	case 0xcd, 0xd1:
		size = 2
	case 0xce, 0xd2:
		size = 4
	case 0xcf, 0xd3:
		size = 8
	default:
		return 0, false
	}
	if size > len(r.b)-r.i {
		return 0, false
	}
	p := r.b[r.i : r.i+size]
	r.i += size
	if c >= 0xd0 && p[0]&0x80 != 0 {
		return 0, false // negative
	}
	var u uint64
	for _, x := range p {
		u = u<<8 | uint64(x)
	}
	return u, true
}

func (r *mpReader) bool() (bool, bool) {
	c, ok := r.byte()
	switch {
	case !ok:
		return false, false
	case c == 0xc2:
		return false, true
	case c == 0xc3:
		return true, true
	}
	return false, false
}

// leaderValue is a register value with its site as an index into the
// fold's site table (no string per write).
type leaderValue struct {
	site, handoff   int32 // site indexes; -1: none
	term, beat      uint64
	fenced, planned bool
}

// decodeLeaderFast reads a register value; ok is false when the bytes are
// not in the shape it knows (the caller then uses failover.DecodeLeader).
func (f *Fold) decodeLeaderFast(b []byte) (v leaderValue, ok bool) {
	r := mpReader{b: b}
	n, ok := r.mapLen()
	if !ok {
		return v, false
	}
	v.site, v.handoff = -1, -1
	for range n {
		k, ok := r.str()
		if !ok || len(k) != 1 {
			return v, false
		}
		switch k[0] {
		case 's':
			s, ok := r.str()
			if !ok {
				return v, false
			}
			v.site = f.siteIndexBytes(s)
		case 'h':
			s, ok := r.str()
			if !ok {
				return v, false
			}
			v.handoff = f.siteIndexBytes(s)
		case 't':
			if v.term, ok = r.uint(); !ok {
				return v, false
			}
		case 'n':
			if v.beat, ok = r.uint(); !ok {
				return v, false
			}
		case 'f':
			if v.fenced, ok = r.bool(); !ok {
				return v, false
			}
		case 'p':
			if v.planned, ok = r.bool(); !ok {
				return v, false
			}
		default:
			return v, false
		}
	}
	return v, r.i == len(b)
}

// decodeLeader reads a register value, fast when it can.
func (f *Fold) decodeLeader(b []byte) (leaderValue, error) {
	if v, ok := f.decodeLeaderFast(b); ok {
		return v, nil
	}
	l, err := failover.DecodeLeader(b)
	if err != nil {
		return leaderValue{}, err
	}
	return leaderValue{site: f.siteIndex(l.Site), handoff: f.siteIndex(l.Handoff), term: l.Term, beat: l.Beat, fenced: l.Fenced, planned: l.Planned}, nil
}

// heartbeatValue is a member heartbeat.
type heartbeatValue struct {
	site  int32
	beat  uint64
	phase failover.Phase
	ready bool
}

func (f *Fold) decodeHeartbeatFast(b []byte) (v heartbeatValue, ok bool) {
	r := mpReader{b: b}
	n, ok := r.mapLen()
	if !ok {
		return v, false
	}
	v.site = -1
	for range n {
		k, ok := r.str()
		if !ok || len(k) != 1 {
			return v, false
		}
		switch k[0] {
		case 's':
			s, ok := r.str()
			if !ok {
				return v, false
			}
			v.site = f.siteIndexBytes(s)
		case 'n':
			if v.beat, ok = r.uint(); !ok {
				return v, false
			}
		case 'p':
			p, ok := r.uint()
			if !ok || p > 1<<16 {
				return v, false
			}
			v.phase = failover.Phase(p)
		case 'r':
			if v.ready, ok = r.bool(); !ok {
				return v, false
			}
		default:
			return v, false
		}
	}
	return v, r.i == len(b)
}

func (f *Fold) decodeHeartbeat(b []byte) (heartbeatValue, error) {
	if v, ok := f.decodeHeartbeatFast(b); ok {
		return v, nil
	}
	h, err := failover.DecodeHeartbeat(b)
	if err != nil {
		return heartbeatValue{}, err
	}
	return heartbeatValue{site: f.siteIndex(h.Site), beat: h.Beat, phase: h.Phase, ready: h.Ready}, nil
}
