package runtime

import (
	"strings"
	"testing"
	"time"

	"understudy/actors/capability"
	"understudy/actors/failover"
)

func TestEndpointJudgement(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	leader := MemberSnapshot{Pair: "pg", Site: "a", Phase: failover.PhaseLeader, Checked: true, CheckOK: true, CheckedAt: now.Add(-time.Second),
		HeartbeatTimeout: time.Second, Status: capability.Status{Role: capability.RolePrimary, Flush: 5000, Positions: true}}
	standby := MemberSnapshot{Pair: "pg", Site: "b", Phase: failover.PhaseFollower, Checked: true, CheckOK: true, CheckedAt: now.Add(-time.Second),
		HeartbeatTimeout: time.Second, LeaderFlush: 5000, Status: capability.Status{Role: capability.RoleStandby, Receive: 4900, Replay: 4000, Streaming: true, Positions: true}}
	lim := func(n uint64) *uint64 { return &n }
	for _, tc := range []struct {
		name string
		kind endpointKind
		s    MemberSnapshot
		lag  *uint64
		ok   bool
		why  string
	}{
		{"leader is primary", endpointPrimary, leader, nil, true, ""},
		{"standby is not primary", endpointPrimary, standby, nil, false, "does not serve"},
		{"standby is replica", endpointReplica, standby, nil, true, ""},
		{"replay lag within", endpointReplica, standby, lim(1000), true, ""},
		{"replay lag over", endpointReplica, standby, lim(999), false, "lag 1000 bytes is over the limit of 999"},
		{"leader is not replica", endpointReplica, leader, nil, false, "not a follower"},
		{"stale check", endpointPrimary, func() MemberSnapshot { s := leader; s.CheckedAt = now.Add(-10 * time.Second); return s }(), nil, false, "old"},
		{"no check yet", endpointHealth, func() MemberSnapshot { s := leader; s.Checked = false; return s }(), nil, false, "no check"},
		{"serving but database down", endpointPrimary, func() MemberSnapshot {
			s := leader
			s.CheckOK, s.CheckErr, s.Status.Role = false, "connection refused", capability.RoleDown
			return s
		}(), nil, false, "connection refused"},
		{"standby not streaming", endpointReplica, func() MemberSnapshot { s := standby; s.Status.Streaming, s.CheckOK = false, false; return s }(), nil, false, "not a streaming standby"},
		{"health of a standby", endpointHealth, standby, nil, true, ""},
	} {
		e := judge(tc.kind, tc.s, tc.lag, now)
		if e.OK != tc.ok || !strings.Contains(e.Reason, tc.why) {
			t.Errorf("%s: ok %v reason %q, want ok %v and a reason with %q", tc.name, e.OK, e.Reason, tc.ok, tc.why)
		}
	}
}
