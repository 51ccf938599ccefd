package runtime

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"understudy/actors/capability"
	"understudy/actors/failover"
)

// The endpoints load balancers and clients use to find a pair's database
// on this node, as Patroni's REST API offers them:
//
//	GET /primary[?pair=P]          200 when this node's member of P serves and its database accepts writes
//	GET /replica[?pair=P][&lag=N]  200 when it follows and its database is a streaming standby (replayed within N bytes)
//	GET /health[?pair=P]           200 when its database is healthy in the member's role
//
// With one pair on the node, pair may be omitted. The body says why, as
// JSON, either way. A check older than checkFresh counts as none: a
// member that stopped checking says nothing about its database now.

// EndpointStatus is the body of /primary, /replica and /health.
type EndpointStatus struct {
	Pair     string `json:"pair,omitempty"`
	Site     string `json:"site,omitempty"`
	Phase    string `json:"phase,omitempty"`
	Term     uint64 `json:"term,omitempty"`
	Role     string `json:"role,omitempty"`
	Timeline uint32 `json:"timeline,omitempty"`
	Flush    string `json:"flush_lsn,omitempty"`
	Receive  string `json:"receive_lsn,omitempty"`
	Replay   string `json:"replay_lsn,omitempty"`
	// LagBytes: a standby's replayed position behind the leader's latest
	// published flush position.
	LagBytes  *uint64   `json:"lag_bytes,omitempty"`
	Streaming bool      `json:"streaming,omitempty"`
	CheckedAt time.Time `json:"checked_at,omitzero"`
	OK        bool      `json:"ok"`
	Reason    string    `json:"reason,omitempty"`
}

// checkFresh is how old the latest check may be for an endpoint to trust
// it: three heartbeats, and at least 3 s (a check may take 2 s).
func checkFresh(hb time.Duration) time.Duration { return max(3*hb, 3*time.Second) }

type endpointKind int

const (
	endpointPrimary endpointKind = iota + 1
	endpointReplica
	endpointHealth
)

// judge decides an endpoint for one member's snapshot at now.
func judge(kind endpointKind, s MemberSnapshot, lagLimit *uint64, now time.Time) EndpointStatus {
	st := s.Status
	e := EndpointStatus{Pair: s.Pair, Site: s.Site, Phase: s.Phase.String(), Term: s.Term, Timeline: st.Timeline,
		Streaming: st.Streaming, CheckedAt: s.CheckedAt}
	if st.Role != 0 {
		e.Role = st.Role.String()
	}
	if st.Flush != 0 {
		e.Flush = st.Flush.String()
	}
	if st.Receive != 0 {
		e.Receive = st.Receive.String()
	}
	if st.Replay != 0 {
		e.Replay = st.Replay.String()
	}
	if st.Role == capability.RoleStandby && s.LeaderFlush != 0 {
		lag := capability.Lag(s.LeaderFlush, st.Replay)
		e.LagBytes = &lag
	}
	fail := func(format string, args ...any) EndpointStatus {
		e.Reason = fmt.Sprintf(format, args...)
		return e
	}
	serving := s.Phase == failover.PhaseLeader
	switch {
	case !s.Checked:
		return fail("no check of the database has reported yet")
	case now.Sub(s.CheckedAt) > checkFresh(s.HeartbeatTimeout):
		return fail("the latest check of the database is %v old (more than %v)", now.Sub(s.CheckedAt).Round(time.Millisecond), checkFresh(s.HeartbeatTimeout))
	}
	switch kind {
	case endpointPrimary:
		switch {
		case !serving:
			return fail("the member does not serve (phase %s)", s.Phase)
		case !s.CheckOK || st.Role != capability.RolePrimary:
			return fail("the database does not accept writes: %s", s.CheckErr)
		}
	case endpointReplica:
		switch {
		case serving || s.Phase != failover.PhaseFollower:
			return fail("the member is not a follower (phase %s)", s.Phase)
		case !s.CheckOK || st.Role != capability.RoleStandby || !st.Streaming:
			return fail("the database is not a streaming standby: %s", s.CheckErr)
		case lagLimit != nil && (e.LagBytes == nil || *e.LagBytes > *lagLimit):
			if e.LagBytes == nil {
				return fail("its lag is unknown (the leader has published no position), over the limit of %d bytes", *lagLimit)
			}
			return fail("lag %d bytes is over the limit of %d bytes", *e.LagBytes, *lagLimit)
		}
	case endpointHealth:
		if !s.CheckOK {
			return fail("the database is not healthy in the member's role: %s", s.CheckErr)
		}
	}
	e.OK = true
	return e
}

// endpoint serves /primary, /replica or /health.
func (n *node) endpoint(kind endpointKind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		reply := func(code int, body any) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(body)
		}
		var lagLimit *uint64
		if v := r.URL.Query().Get("lag"); v != "" {
			if kind != endpointReplica {
				reply(http.StatusBadRequest, EndpointStatus{Reason: "lag applies to /replica only"})
				return
			}
			l, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				reply(http.StatusBadRequest, EndpointStatus{Reason: "lag: must be a number of bytes, got " + strconv.Quote(v)})
				return
			}
			lagLimit = &l
		}
		host := n.host.Load()
		if host == nil {
			reply(http.StatusServiceUnavailable, EndpointStatus{Reason: "the node's members have not started"})
			return
		}
		snaps := host.Snapshots()
		pair := r.URL.Query().Get("pair")
		var pick *MemberSnapshot
		for i := range snaps {
			if pair == "" || snaps[i].Pair == pair {
				if pick != nil && pair == "" {
					reply(http.StatusBadRequest, EndpointStatus{Reason: "this node hosts several pairs: name one with ?pair="})
					return
				}
				pick = &snaps[i]
			}
		}
		if pick == nil {
			reply(http.StatusNotFound, EndpointStatus{Pair: pair, Reason: "no member of that pair runs on this node"})
			return
		}
		e := judge(kind, *pick, lagLimit, time.Now())
		code := http.StatusOK
		if !e.OK {
			code = http.StatusServiceUnavailable
		}
		reply(code, e)
	}
}
