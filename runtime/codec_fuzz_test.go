package runtime

import (
	"bytes"
	"testing"

	"understudy/actors/agent"
	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/events"
)

// FuzzDecodeEvent: whatever bytes are on an event subject, the registry of
// every event understudy records decodes them to a known event, an
// Unknown, or a corrupt error naming subject and sequence — never a panic
// — and never keeps the caller's bytes.
func FuzzDecodeEvent(f *testing.F) {
	reg := Codec()
	for _, ev := range []events.Event{
		&failover.Started{Pair: "pg", Site: "a", Rules: failover.DefaultRules("pg", "a", "b")},
		&failover.Promoted{Seq: 2, Term: 3, Rev: 9}, &failover.LeadershipLost{Term: 2, Holder: failover.Leader{Site: "b", Term: 3}},
		&failover.MemberStopped{Reason: "twin", Stops: 1}, &failover.ConfigRejected{Rev: 4, Field: "f", Rule: "r"},
		&procedure.StepFinished{}, &agent.PhaseChanged{}, &agent.Ran{},
	} {
		b, err := reg.Encode(ev)
		if err != nil {
			f.Fatalf("%T: %v", ev, err)
		}
		f.Add(b)
	}
	f.Add([]byte("not msgpack"))
	f.Fuzz(func(t *testing.T, data []byte) {
		in := bytes.Clone(data)
		ev, err := reg.Decode("ev.failover.pg.a", 7, data)
		if !bytes.Equal(in, data) {
			t.Fatal("Decode modified its input")
		}
		if (ev == nil) == (err == nil) {
			t.Fatalf("event %v and error %v", ev, err)
		}
		if ev != nil {
			if _, err := reg.Encode(ev); err != nil {
				if _, unknown := ev.(*events.Unknown); !unknown {
					t.Fatalf("a decoded %s does not encode: %v", ev.EventType(), err)
				}
			}
		}
	})
}

// FuzzLivenessEntry: whatever bytes are in a node's liveness record, the
// node's watch and its liveness writer take them as a genuine value or as
// Forged with why — never a panic — with a trust and without.
func FuzzLivenessEntry(f *testing.F) {
	_, trust, _ := trustedPair(f, "pg")
	for _, l := range []failover.Liveness{{Node: "node-a", Epoch: 2, Beat: 5, By: "node-a"}, {Node: "node-b", Epoch: 3, By: "node-a", Prev: 9}} {
		f.Add(failover.EncodeLiveness(l))
		if v, err := trust.SignLiveness(l); err == nil {
			f.Add(v)
		}
	}
	f.Add([]byte("not msgpack"))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, tr := range []*ValueTrust{nil, trust} {
			le, why := livenessEntryOf("node-a", events.Entry{Key: failover.LivenessKey("node-a"), Revision: 4, Op: events.OpPut, Value: data}, tr)
			if le.Forged != (why != nil) {
				t.Fatalf("forged %v, why %v", le.Forged, why)
			}
			_ = le.Value.String()
		}
	})
}
