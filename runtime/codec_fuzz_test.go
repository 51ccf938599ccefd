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
