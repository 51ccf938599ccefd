package events

import (
	"encoding/json"
	"testing"
	"time"
)

// benchEvent is a typical failover fact: who, where, which term and
// revision, a server timestamp, a duration and a few labels.
func benchEvent() *testHeartbeat {
	return &testHeartbeat{
		Pair:     "pg-main",
		Site:     "basement",
		Term:     42,
		Revision: 1_234_567,
		At:       time.Date(2025, 3, 14, 3, 12, 7, 123_456_789, time.UTC),
		Timeout:  time.Second,
		Labels:   map[string]string{"zone": "eu-west", "role": "primary", "host": "pg-1"},
	}
}

// jsonEnvelope is the JSON counterpart of envelope, as a reference point.
type jsonEnvelope struct {
	Type    string          `json:"t"`
	Version uint16          `json:"v"`
	Body    json.RawMessage `json:"b"`
}

func BenchmarkCodec(b *testing.B) {
	reg := testRegistry(b)
	ev := benchEvent()
	data, err := reg.Encode(ev)
	if err != nil {
		b.Fatal(err)
	}
	body, err := json.Marshal(ev)
	if err != nil {
		b.Fatal(err)
	}
	jsonData, err := json.Marshal(&jsonEnvelope{Type: ev.EventType(), Version: 1, Body: body})
	if err != nil {
		b.Fatal(err)
	}

	b.Run("msgpack-encode", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, err := reg.Encode(ev); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("msgpack-decode", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, err := reg.Decode("ev.pair.pg-main", 1, data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json-encode", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(jsonData)))
		for b.Loop() {
			body, err := json.Marshal(ev)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := json.Marshal(&jsonEnvelope{Type: ev.EventType(), Version: 1, Body: body}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json-decode", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(jsonData)))
		for b.Loop() {
			var env jsonEnvelope
			if err := json.Unmarshal(jsonData, &env); err != nil {
				b.Fatal(err)
			}
			var out testHeartbeat
			if err := json.Unmarshal(env.Body, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
}
