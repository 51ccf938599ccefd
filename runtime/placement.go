package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Pacing of the leader keeper.
const (
	// DefaultLeaderCheckInterval is how often the keeper looks at the
	// leaders: a leader that an election put elsewhere goes back to the
	// preferred server within about this long.
	DefaultLeaderCheckInterval = 3 * time.Second
	// DefaultLeaderMaxBackoff caps the wait after failed checks or moves.
	DefaultLeaderMaxBackoff = time.Minute
	minLeaderCheckInterval  = 100 * time.Millisecond
	// leaderSettle is how long a leader must have led before the keeper
	// moves it: raft hands leadership over only to a follower that takes
	// the transfer as a new entry, not during its catch-up after an
	// election; a transfer it ignores leaves the stream without a leader
	// until the next election (seconds without writes).
	leaderSettle = time.Second
	// maxPeerSilence is how recently the preferred server must have been
	// heard from by the leader.
	maxPeerSilence = 2 * time.Second
)

// LeaderKeeperConfig says which streams' leaders the keeper keeps where.
type LeaderKeeperConfig struct {
	// Preferred is the server_name of the NATS server that should lead.
	Preferred string
	// Streams are the stream names (a KV bucket's is KV_<bucket>),
	// checked in this order; the slice is copied.
	Streams []string
	// Interval between checks; zero means DefaultLeaderCheckInterval.
	// Each wait is jittered in [3/4, 1] of it so that the nodes of a
	// cluster do not all ask at once.
	Interval time.Duration
	// MaxBackoff caps the doubling wait after a failure; zero means
	// DefaultLeaderMaxBackoff.
	MaxBackoff time.Duration
	// Timeout bounds each JetStream request; zero means 2s.
	Timeout time.Duration
	// RejoinSettle is how long the preferred server must have been a
	// current replica without a break before a leader is moved to it;
	// zero means DefaultRejoinSettle, negative none (tests).
	RejoinSettle time.Duration
}

// DefaultRejoinSettle: a server back from a cut reports current before its
// raft log has settled; moving a leader to it at once was seen to leave a
// stream without one for 11s.
const DefaultRejoinSettle = 10 * time.Second

// LeaderKeeper keeps the leaders of JetStream streams on one preferred
// server. JetStream elects a stream's leader among its replicas by raft and
// does not prefer any server: a leader on a pair's site means that the loss
// of that site makes every write wait for an election (4–9 s in nats-server
// 2.15) before the surviving member's writes land. Stream configurations
// cannot name a preferred leader (nats-server refuses placement.preferred
// on a stream), so the keeper asks the current leader to step down in
// favour of the preferred server ($JS.API.STREAM.LEADER.STEPDOWN.<stream>
// with {"placement":{"preferred":...}}) whenever the preferred server is a
// current replica and does not lead.
//
// Several nodes may run keepers for the same streams: a step-down that
// another node already obtained is answered "already leader" and is not an
// error. The keeper never loops hot: one check per stream per interval,
// doubling waits up to MaxBackoff after failures.
type LeaderKeeper struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	cfg  LeaderKeeperConfig
	log  *slog.Logger
	stop context.CancelFunc
	done chan struct{}
}

// StartLeaderKeeper starts the keeper; it runs until ctx is done or Stop.
// nc and js must stay open while it runs.
func StartLeaderKeeper(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, cfg LeaderKeeperConfig, log *slog.Logger) *LeaderKeeper {
	cfg.Streams = append([]string(nil), cfg.Streams...)
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultLeaderCheckInterval
	}
	cfg.Interval = max(cfg.Interval, minLeaderCheckInterval)
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultLeaderMaxBackoff
	}
	cfg.MaxBackoff = max(cfg.MaxBackoff, cfg.Interval)
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	switch {
	case cfg.RejoinSettle == 0:
		cfg.RejoinSettle = DefaultRejoinSettle
	case cfg.RejoinSettle < 0:
		cfg.RejoinSettle = 0
	}
	ctx, stop := context.WithCancel(ctx)
	k := &LeaderKeeper{nc: nc, js: js, cfg: cfg, log: log.With("component", "leader-keeper", "preferred", cfg.Preferred), stop: stop, done: make(chan struct{})}
	go k.run(ctx)
	k.log.Info("keeping jetstream leaders on the preferred server", "streams", strings.Join(cfg.Streams, ","), "interval", cfg.Interval)
	return k
}

// Stop ends the keeper and waits for it. Safe to call more than once.
func (k *LeaderKeeper) Stop() {
	k.stop()
	<-k.done
}

// keptStream is the keeper's state of one stream.
type keptStream struct {
	name    string
	next    time.Time     // when to check it again
	backoff time.Duration // the wait after the last failure; 0 after a success
	note    string        // the last condition logged, so that it is logged once
	// leader as last seen, and since when it was seen (local clock).
	leader     string
	leaderSeen time.Time
	// currentSince: since when the preferred server has been seen a
	// current replica without a break (zero: it is not).
	currentSince time.Time
}

func (k *LeaderKeeper) run(ctx context.Context) {
	defer close(k.done)
	streams := make([]*keptStream, len(k.cfg.Streams))
	for i, name := range k.cfg.Streams {
		streams[i] = &keptStream{name: name}
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		next := now.Add(k.cfg.MaxBackoff)
		for _, s := range streams {
			if !now.Before(s.next) {
				k.check(ctx, s)
				if ctx.Err() != nil {
					return
				}
			}
			if s.next.Before(next) {
				next = s.next
			}
		}
		t.Reset(max(time.Until(next), minLeaderCheckInterval))
	}
}

// check looks at one stream's leader and asks for a move when it is not the
// preferred server and the preferred server can take over.
func (k *LeaderKeeper) check(ctx context.Context, s *keptStream) {
	leader, replicas, err := k.leader(ctx, s.name)
	if err != nil {
		k.failed(s, "jetstream leader check failed", err)
		return
	}
	if leader != s.leader {
		// Timed on the local clock: the server's leader_since may be skewed.
		s.leader, s.leaderSeen = leader, time.Now()
	}
	pref := k.cfg.Preferred
	switch {
	case replicas == nil:
		k.noted(s, "not clustered", slog.LevelWarn, "stream is not replicated; assets.preferred_leader has no effect on it", "stream", s.name)
		k.after(s, k.cfg.MaxBackoff)
		return
	case leader == "":
		k.noted(s, "leaderless", slog.LevelInfo, "stream has no leader (election in progress); checking again", "stream", s.name)
		k.after(s, k.interval())
		return
	case leader == pref:
		k.noted(s, "", slog.LevelInfo, "jetstream leader on the preferred server", "stream", s.name)
		s.backoff = 0
		k.after(s, k.interval())
		return
	}
	peer, known := replicas[pref]
	switch {
	case !known:
		k.noted(s, "not a replica", slog.LevelWarn, "preferred server is not a replica of the stream; the leader stays where it is", "stream", s.name, "leader", leader)
		k.after(s, k.interval())
		return
	case peer.Offline || !peer.Current || peer.Pending || peer.Lag > 0 || peer.Active > maxPeerSilence:
		s.currentSince = time.Time{}
		k.noted(s, "not current", slog.LevelInfo, "preferred server is not a current replica (unreachable or catching up); the leader stays where it is until it is", "stream", s.name, "leader", leader)
		k.after(s, k.interval())
		return
	case k.cfg.RejoinSettle > 0 && (s.currentSince.IsZero() || time.Since(s.currentSince) < k.cfg.RejoinSettle):
		// A server that has just come back reports current before its raft
		// log has settled; a leader handed to it then can leave the stream
		// without one for an election. It must stay current a while first.
		if s.currentSince.IsZero() {
			s.currentSince = time.Now()
		}
		k.after(s, k.cfg.RejoinSettle-time.Since(s.currentSince)+minLeaderCheckInterval)
		return
	case time.Since(s.leaderSeen) < leaderSettle:
		k.after(s, leaderSettle-time.Since(s.leaderSeen)+minLeaderCheckInterval)
		return
	}
	start := time.Now()
	if err := k.stepDown(ctx, s.name, pref); err != nil {
		k.failed(s, "jetstream leader move failed", err, "from", leader, "to", pref)
		return
	}
	s.note, s.backoff = "", 0
	k.log.Info("jetstream leader moved", "stream", s.name, "from", leader, "to", pref, "took", time.Since(start).Round(time.Millisecond))
	k.after(s, k.interval())
}

// leader returns the stream's leader and the replicas by server name (the
// leader excluded); replicas is nil for a stream that is not clustered.
func (k *LeaderKeeper) leader(ctx context.Context, stream string) (string, map[string]*jetstream.PeerInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, k.cfg.Timeout)
	defer cancel()
	st, err := k.js.Stream(ctx, stream)
	if err != nil {
		return "", nil, err
	}
	info := st.CachedInfo()
	ci := info.Cluster
	if ci == nil || info.Config.Replicas <= 1 {
		return "", nil, nil
	}
	replicas := make(map[string]*jetstream.PeerInfo, len(ci.Replicas))
	for _, p := range ci.Replicas {
		replicas[p.Name] = p
	}
	return ci.Leader, replicas, nil
}

// stepDownRequest is the body of $JS.API.STREAM.LEADER.STEPDOWN.<stream>
// (nats-server's JSApiLeaderStepdownRequest).
type stepDownRequest struct {
	Placement struct {
		Preferred string `json:"preferred"`
	} `json:"placement"`
}

// apiResponse is the part of a JetStream API answer the keeper reads.
type apiResponse struct {
	Success bool `json:"success"`
	Error   *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
}

// stepDown asks the stream's leader to hand over to preferred; preferred
// "" lets raft pick any current replica.
func (k *LeaderKeeper) stepDown(ctx context.Context, stream, preferred string) error {
	return stepDownStream(ctx, k.nc, stream, preferred, k.cfg.Timeout)
}

func stepDownStream(ctx context.Context, nc *nats.Conn, stream, preferred string, timeout time.Duration) error {
	var body []byte
	if preferred != "" {
		var req stepDownRequest
		req.Placement.Preferred = preferred
		body, _ = json.Marshal(req)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, body)
	if err != nil {
		return err
	}
	var resp apiResponse
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return fmt.Errorf("step-down answer %q: %w", msg.Data, err)
	}
	if resp.Error != nil {
		if preferred != "" && strings.Contains(resp.Error.Description, "is already leader") {
			return nil // another node's keeper got there first
		}
		return fmt.Errorf("nats error %d: %s", resp.Error.ErrCode, resp.Error.Description)
	}
	if !resp.Success {
		return errors.New("step-down not confirmed")
	}
	return nil
}

// failed logs a failed check or move and backs the stream off.
func (k *LeaderKeeper) failed(s *keptStream, msg string, err error, attrs ...any) {
	s.backoff = min(max(2*s.backoff, k.cfg.Interval), k.cfg.MaxBackoff)
	s.note = ""
	k.log.Warn(msg, append([]any{"stream", s.name, "error", err, "next_check", s.backoff}, attrs...)...)
	k.after(s, s.backoff)
}

// noted logs a condition once, when it starts; the condition "" (all
// well) is logged only when it ends another one.
func (k *LeaderKeeper) noted(s *keptStream, cond string, level slog.Level, msg string, attrs ...any) {
	if cond == s.note {
		return
	}
	if cond != "" || s.note != "" {
		k.log.Log(context.Background(), level, msg, attrs...)
	}
	s.note = cond
}

func (k *LeaderKeeper) after(s *keptStream, d time.Duration) {
	s.next = time.Now().Add(d)
}

// interval is the check interval jittered in [3/4, 1] of it.
func (k *LeaderKeeper) interval() time.Duration {
	q := k.cfg.Interval / 4
	return k.cfg.Interval - rand.N(q+1)
}
