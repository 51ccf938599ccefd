package simulations

import (
	"strconv"
	"strings"
	"time"

	"understudy/actors/failover"
	"understudy/events"
)

// The forger (FaultForge): an attacker's client that writes values of the
// pair's keys no member wrote, straight to the server (it is not one of
// the nodes: no link of theirs carries it). The deployment is secured, so
// the model verifies register values as the runtime does
// (runtime.ValueTrust): a value the forger writes unsigned reaches the
// members as failover.LeaderEntry.Forged, with the latest genuine entry of
// the key's history before it; one it writes with a peer's node key (By)
// verifies, and only what it says can give it away. One it replays
// (ForgeReplay) is a member's own value, signature and all: only that it
// is an older one can give it away. Heartbeats are not signed: the forger
// writes them under a key it may write. A message-id forger (ForgeMsgID)
// writes no key: it publishes on the events stream, under a member's next
// message id (forgeMsgID).

// forgeStart runs fault i, a FaultForge, at its start: one write and,
// but for a handoff, one every heartbeat_timeout until the fault ends.
func (s *sim) forgeStart(i int) {
	s.forgeWrite(i)
	f := s.faults[i]
	if f.Forge == ForgeHandoff {
		return
	}
	if next := s.now + s.rules.HeartbeatTimeout; next <= f.At+f.For {
		s.push(item{at: next, kind: evForge, ref: int32(i)})
	}
}

// forgeWrite writes fault i's forged value once. A write that finds NATS
// down, or the stream leader without its quorum, is lost.
func (s *sim) forgeWrite(i int) {
	f := s.faults[i]
	a := &s.aux[i]
	if f.Forge == ForgeReplay && !a.on {
		// What it replays is what it could read when it began.
		a.on, a.replay = true, s.writtenBy(f.Site, replayDepth)
	}
	if s.server.down || s.cl.cut {
		s.tracef("forger", "forged %s lost: NATS is unavailable", f.Forge)
		return
	}
	switch f.Forge {
	case ForgeReplay:
		s.forgeReplay(f, a)
		return
	case ForgeMsgID:
		s.forgeMsgID(f)
		return
	}
	s.count(cForgedWritten)
	if f.Forge == ForgeReady {
		a.fbeat++
		hb := failover.Heartbeat{Site: f.Site, Beat: a.fbeat, Phase: failover.PhaseFollower, Ready: true}
		key := failover.HeartbeatKey(s.rules.Pair, f.Key)
		rev, ts := s.server.put(s.now, key, failover.EncodeHeartbeat(hb))
		s.tr.u64(rev)
		s.tracef("forger", "writes %s = ready heartbeat claiming %s (rev %d)", key, f.Site, rev)
		s.fanOut(rev, failover.HeartbeatObserved{Rev: rev, Time: ts, Site: f.Key, Value: hb})
		return
	}
	if h := s.reg.Site; f.By != "" && ((f.Forge == ForgeHandoff && f.By == h) || (f.Forge == ForgeBeats && f.By == f.Site)) {
		// With a site's own node key, its own values: what the holder may
		// write itself (its release, its beats) nothing can tell from its
		// own. A node whose key is stolen is that node.
		s.tracef("forger", "forged %s signed by %s skipped: %s may write it itself", f.Forge, f.By, f.By)
		return
	}
	var l failover.Leader
	switch f.Forge {
	case ForgeHandoff:
		l = failover.Leader{Term: s.reg.Term, Handoff: f.Site}
	case ForgeBeats:
		if !a.on {
			// The site's latest term and beat in the register, as its own
			// writes left them.
			h := s.heldBy[s.nodeBySite(f.Site).idx]
			a.on, a.fterm, a.fbeat = true, h.term, h.beat
		}
		a.fbeat++
		l = failover.Leader{Site: f.Site, Term: a.fterm, Beat: a.fbeat}
	}
	l.By = f.By
	key := failover.LeaderKey(s.rules.Pair)
	rev, ts := s.server.put(s.now, key, failover.EncodeLeader(l))
	forged := f.By == ""
	if forged {
		s.forged[rev] = true
	}
	s.top = regView{l: l, rev: rev, ts: ts, known: true, forged: forged}
	s.refreshViews()
	s.tr.u64(rev)
	how := "unsigned"
	if !forged {
		how = "signed with " + f.By + "'s node key"
	}
	s.tracef("forger", "writes %s = %v, %s (rev %d)", key, l, how, rev)
	s.fanOut(rev, failover.LeaderObserved{Entry: s.leaderEntry(rev, ts, l, forged)})
}

// replayDepth is how many of a site's latest register values a replaying
// forger cycles through: its latest beats, or a release and the beats
// before it.
const replayDepth = 3

// forgeReplay writes the next of the values a replaying forger replays,
// as they were stored: their signatures verify (the entry is not Forged).
func (s *sim) forgeReplay(f Fault, a *faultAux) {
	if len(a.replay) == 0 {
		s.tracef("forger", "nothing of %s's to replay: it wrote no register value before %s", f.Site, f.At)
		return
	}
	s.count(cForgedWritten)
	l := a.replay[a.replays%len(a.replay)]
	a.replays++
	key := failover.LeaderKey(s.rules.Pair)
	rev, ts := s.server.put(s.now, key, failover.EncodeLeader(l))
	s.replayed[rev] = true
	s.top = regView{l: l, rev: rev, ts: ts, known: true}
	s.refreshViews()
	s.tr.u64(rev)
	s.tracef("forger", "replays %s = %v, an older value %s wrote, its signature and all (rev %d)", key, l, f.Site, rev)
	s.fanOut(rev, failover.LeaderObserved{Entry: s.leaderEntry(rev, ts, l, false)})
}

// forgerSubject is the subject a message-id forger publishes on: one of
// the events stream's that its own identity may write (a node may write
// its agent's trail, ev.agent.<agent>.>), which no member and no replay of
// the pair reads.
const forgerSubject = "ev.agent.forger.trail"

// forgedData is what a message-id forger publishes: only its id matters.
var forgedData = []byte("forged")

// forgeMsgID publishes, on forgerSubject, a message under the id f.Site's
// member would give its next event as its latest record tells (nextMsgID).
// While the id is in the stream's dedup window the member's append under
// it is answered "duplicate" and not stored (events/memory.go, as
// JetStream does, across subjects).
func (s *sim) forgeMsgID(f Fault) {
	sub := failover.Subject(s.rules.Pair, f.Site)
	rec, ok := s.server.lastRecord(sub)
	if !ok {
		s.tracef("forger", "no record on %s to read an id from", sub)
		return
	}
	id, ok := nextMsgID(rec)
	if !ok {
		s.tracef("forger", "%s's latest record (seq %d) carries no appender's id", sub, rec.Sequence)
		return
	}
	ack := s.server.publish(s.now, forgerSubject, forgedData, id)
	s.tr.u64(ack.Sequence)
	if ack.Duplicate {
		return // taken already, by its own earlier message or the member's append
	}
	s.count(cForgedWritten)
	s.tracef("forger", "publishes on %s under %s, the id of %s's next event (seq %d)", forgerSubject, id, f.Site, ack.Sequence)
}

// nextMsgID is the message id an appender that wrote rec, the latest
// record on its subject, gives its next event if the id's tail repeats:
// subject@position/tail with position rec.Sequence + 1 (the appender
// expects the subject's last sequence) and rec's tail. Without an event
// part that is exactly the next id (subject@position/nonce); with one
// (events.AppenderMsgID) it is a guess that misses. ok is false when rec
// carries no appender's id.
func nextMsgID(rec events.Record) (string, bool) {
	if _, ok := events.AppendedBy(rec); !ok {
		return "", false
	}
	rest := strings.TrimPrefix(rec.Headers["Nats-Msg-Id"], rec.Subject+"@")
	_, tail, _ := strings.Cut(rest, "/")
	return rec.Subject + "@" + strconv.FormatUint(rec.Sequence+1, 10) + "/" + tail, true
}

// writtenBy is the latest n distinct register values site wrote, from the
// key's history as the server holds it now, newest first (what a forger
// who reads the history can replay; not what forgers wrote, unsigned or
// replayed).
func (s *sim) writtenBy(site string, n int) []failover.Leader {
	hist, err := s.server.kv.History(bg, failover.LeaderKey(s.rules.Pair))
	if err != nil {
		return nil
	}
	var out []failover.Leader
	seen := map[string]bool{}
	for i := len(hist) - 1; i >= 0 && len(out) < n; i-- {
		e := hist[i]
		if e.Op != events.OpPut || s.forged[e.Revision] || s.replayed[e.Revision] {
			continue
		}
		l, err := failover.DecodeLeader(e.Value)
		if err != nil || l.By != site || seen[string(e.Value)] {
			continue
		}
		seen[string(e.Value)] = true
		out = append(out, l)
	}
	return out
}

// leaderEntry is a register revision as a member receives it: with the
// latest genuine holder's write before it from the key's history, as the
// runtime reads it, when failover.WantsGenuine.
func (s *sim) leaderEntry(rev uint64, ts time.Time, l failover.Leader, forged bool) failover.LeaderEntry {
	e := failover.LeaderEntry{Rev: rev, Time: ts, Value: l, Forged: forged}
	if failover.WantsGenuine(e) {
		e.Genuine = s.genuineBefore(rev, true)
	}
	return e
}

// genuineBefore is the latest entry of the register's history below rev
// that the forger did not write unsigned and, with own, is not written for
// another holder (nil: none).
func (s *sim) genuineBefore(rev uint64, own bool) *failover.LeaderEntry {
	hist, err := s.server.kv.History(bg, failover.LeaderKey(s.rules.Pair))
	if err != nil {
		return nil
	}
	for i := len(hist) - 1; i >= 0; i-- {
		e := hist[i]
		if e.Revision >= rev || e.Op != events.OpPut || s.forged[e.Revision] {
			continue
		}
		le, err := failover.LeaderEntryOf(e, 0)
		if err != nil || (own && le.Value.ForAnother()) {
			continue
		}
		return &le
	}
	return nil
}

// forgetForged drops the forged and replayed revisions a NATS power cut
// lost: the server hands their numbers out again.
func (s *sim) forgetForged(kept uint64) {
	for rev := range s.forged {
		if rev > kept {
			delete(s.forged, rev)
		}
	}
	for rev := range s.replayed {
		if rev > kept {
			delete(s.replayed, rev)
		}
	}
}
