package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"understudy/actors/failover"
	"understudy/events"
)

// A register value that does not decode does not make status fail: it is
// shown as held by nobody, with why, and with the highest term of the
// key's history (the term the members replace it above).
func TestStatusShowsACorruptRegister(t *testing.T) {
	ctx := context.Background()
	kv := events.NewMemoryKV("understudy_failover", events.NewManualClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)))
	for _, v := range [][]byte{failover.EncodeLeader(failover.Leader{Site: "site-a", Term: 4, Beat: 9}), []byte("not a register \xc1")} {
		if _, err := kv.Put(ctx, failover.LeaderKey("pg"), v); err != nil {
			t.Fatal(err)
		}
	}
	st, err := pairStatus(ctx, kv, "pg", time.Date(2026, 3, 1, 12, 0, 1, 0, time.UTC))
	if err != nil {
		t.Fatalf("status of a pair with a corrupt register: %v", err)
	}
	if st.Leader != "" || st.Term != 4 || !strings.Contains(st.Corrupt, "corrupt leader register value (revision 2") {
		t.Errorf("status %+v", st)
	}
	var out bytes.Buffer
	printStatus(&out, st)
	if !strings.Contains(out.String(), "leader   none (corrupt leader register value (revision 2") || !strings.Contains(out.String(), "the members replace it") {
		t.Errorf("printed:\n%s", out.String())
	}
}
