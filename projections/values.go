package projections

import (
	"understudy/actors/failover"
	"understudy/events/mp"
)

// Heartbeats are most of a pair's record, so the fold reads the two KV
// values it sees most (the leadership register and a member heartbeat)
// with the small decoders below: one pass over the msgpack map, no
// reflection, no allocation. Anything they do not recognise — another key,
// another type, a width they do not expect — falls back to the failover
// package's own decoders, which stay the definition of the wire form; the
// tests hold the two to the same results.

// leaderValue is a register value with its site as an index into the
// fold's site table (no string per write).
type leaderValue struct {
	site, handoff   int32 // site indexes; -1: none
	node            int32 // node leadership: the holder's node (index), -1 none
	term, beat      uint64
	epoch           uint64 // node leadership: the epoch the lease lives in
	fenced, planned bool
	// forAnother: it names a holder and says another site wrote it
	// (failover.Leader.ForAnother): no member writes that.
	forAnother bool
}

// decodeLeaderFast reads a register value; ok is false when the bytes are
// not in the shape it knows (the caller then uses failover.DecodeLeader).
func (f *Fold) decodeLeaderFast(b []byte) (v leaderValue, ok bool) {
	n, i, err := mp.MapLen(b, 0)
	if err != nil {
		return v, false
	}
	v.site, v.handoff, v.node = -1, -1, -1
	var by []byte
	for range n {
		var k, s []byte
		if k, i, err = mp.Bytes(b, i); err != nil {
			return v, false
		}
		switch string(k) { // no allocation: compared in place
		case "by":
			by, i, err = mp.Bytes(b, i)
			if err != nil {
				return v, false
			}
			continue
		case "sg":
			if _, i, err = mp.Bytes(b, i); err != nil {
				return v, false
			}
			continue
		case "pv":
			if _, i, err = mp.Uint(b, i); err != nil {
				return v, false
			}
			continue
		case "rs": // a holder serving again after an unfencing: an unfenced write like another here
			if _, i, err = mp.Bool(b, i); err != nil {
				return v, false
			}
			continue
		case "nd":
			var s []byte
			if s, i, err = mp.Bytes(b, i); err != nil {
				return v, false
			}
			v.node = f.nodeIndexBytes(s)
			continue
		}
		if len(k) != 1 {
			return v, false
		}
		switch k[0] {
		case 's':
			s, i, err = mp.Bytes(b, i)
			v.site = f.siteIndexBytes(s)
		case 'h':
			s, i, err = mp.Bytes(b, i)
			v.handoff = f.siteIndexBytes(s)
		case 't':
			v.term, i, err = mp.Uint(b, i)
		case 'n':
			v.beat, i, err = mp.Uint(b, i)
		case 'f':
			v.fenced, i, err = mp.Bool(b, i)
		case 'p':
			v.planned, i, err = mp.Bool(b, i)
		case 'e':
			v.epoch, i, err = mp.Uint(b, i)
		default:
			return v, false
		}
		if err != nil {
			return v, false
		}
	}
	v.forAnother = len(by) > 0 && v.site >= 0 && f.sites[v.site] != string(by)
	return v, i == len(b)
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
	return leaderValue{site: f.siteIndex(l.Site), handoff: f.siteIndex(l.Handoff), node: f.nodeIndex(l.Node), term: l.Term, beat: l.Beat, epoch: l.Epoch,
		fenced: l.Fenced, planned: l.Planned, forAnother: l.ForAnother()}, nil
}

// heartbeatValue is a member heartbeat.
type heartbeatValue struct {
	site  int32
	beat  uint64
	phase failover.Phase
	ready bool
}

// decodeHeartbeatFast reads a member heartbeat like decodeLeaderFast.
// The rules revisions it carries (c, x) are read past: the fold does not
// use them.
func (f *Fold) decodeHeartbeatFast(b []byte) (v heartbeatValue, ok bool) {
	n, i, err := mp.MapLen(b, 0)
	if err != nil {
		return v, false
	}
	v.site = -1
	for range n {
		var k, s []byte
		var p uint64
		if k, i, err = mp.Bytes(b, i); err != nil || len(k) != 1 {
			return v, false
		}
		switch k[0] {
		case 's':
			s, i, err = mp.Bytes(b, i)
			v.site = f.siteIndexBytes(s)
		case 'n':
			v.beat, i, err = mp.Uint(b, i)
		case 'p':
			p, i, err = mp.Uint(b, i)
			if p > 1<<16 {
				return v, false
			}
			v.phase = failover.Phase(p)
		case 'r':
			v.ready, i, err = mp.Bool(b, i)
		case 'c', 'x':
			_, i, err = mp.Uint(b, i)
		default:
			return v, false
		}
		if err != nil {
			return v, false
		}
	}
	return v, i == len(b)
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
