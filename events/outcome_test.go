package events_test

import (
	"errors"
	"testing"

	"understudy/events"
)

// The appender's rule for an append answer. Stream sequences are shared by
// every subject: the own first attempt of a retry may sit anywhere after the
// subject's last sequence.
func TestAppendAckConflict(t *testing.T) {
	const id = "ev.failover.p.site-a@8/3f9a"
	cases := []struct {
		name     string
		last     uint64
		msgID    string
		ack      events.Ack
		conflict bool
	}{
		{"stored", 7, id, events.Ack{Sequence: 8}, false},
		{"stored after other subjects", 7, id, events.Ack{Sequence: 42}, false},
		{"duplicate at last+1", 7, id, events.Ack{Sequence: 8, Duplicate: true}, false},
		{"duplicate of a buffered first attempt, other subjects between", 7, id, events.Ack{Sequence: 42, Duplicate: true}, false},
		{"duplicate at or before last: not a retry", 7, id, events.Ack{Sequence: 7, Duplicate: true}, true},
		{"duplicate of an id without nonce", 7, "ev.failover.p.site-a@8", events.Ack{Sequence: 9, Duplicate: true}, true},
		{"duplicate of an id with an empty nonce", 7, "ev.failover.p.site-a@8/", events.Ack{Sequence: 9, Duplicate: true}, true},
	}
	for _, tc := range cases {
		err := events.AppendAckConflict(tc.last, tc.msgID, tc.ack)
		if got := errors.Is(err, events.ErrConflict); got != tc.conflict || (err != nil) != tc.conflict {
			t.Errorf("%s: err %v, want conflict %v", tc.name, err, tc.conflict)
		}
	}
}

// The simulator's server answers through APIError and KVAPIError: 10071 is
// a lost CAS, 10164 (a proposal in flight) is not, however the KV client
// wraps it.
func TestAPIErrorIdentities(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"append 10071", events.APIError(10071, "wrong last sequence"), events.ErrConflict},
		{"append 10164", events.APIError(10164, "last sequence by subject mismatch"), events.ErrInFlight},
		{"kv update 10071", events.KVAPIError(false, 10071, "wrong last sequence"), events.ErrConflict},
		{"kv update 10164", events.KVAPIError(false, 10164, "last sequence by subject mismatch"), events.ErrInFlight},
		{"kv create 10071", events.KVAPIError(true, 10071, "wrong last sequence"), events.ErrConflict},
		{"kv create 10164", events.KVAPIError(true, 10164, "last sequence by subject mismatch"), events.ErrInFlight},
	} {
		if !errors.Is(tc.err, tc.want) {
			t.Errorf("%s: %v is not %v", tc.name, tc.err, tc.want)
		}
		if tc.want == events.ErrInFlight && errors.Is(tc.err, events.ErrConflict) {
			t.Errorf("%s: %v is a conflict too", tc.name, tc.err)
		}
	}
}
