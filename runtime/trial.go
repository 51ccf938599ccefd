package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/events"
)

// TrialMode is the fault a failover trial injects.
type TrialMode int

const (
	// TrialPowerCut kills the primary dead: its link stalls and its process stops.
	TrialPowerCut TrialMode = iota + 1
	// TrialReplicaCut cuts only the replica off NATS for a while, then heals.
	TrialReplicaCut
)

func (m TrialMode) String() string {
	switch m {
	case TrialPowerCut:
		return "power-cut"
	case TrialReplicaCut:
		return "replica-cut"
	}
	return "unset"
}

// TrialOptions configure one failover trial on a running NATS.
type TrialOptions struct {
	Rules failover.Rules
	Mode  TrialMode
	// FaultAfter is when the fault starts, counted from the primary serving.
	FaultAfter time.Duration
	// Window is how long the replica stays cut off (TrialReplicaCut), or
	// the longest wait for the replica to serve (TrialPowerCut).
	Window time.Duration
	// Stream and Bucket name the provisioned assets.
	Stream, Bucket string
	Logger         *slog.Logger
	// Observe receives every recorded transition of both members.
	Observe func(Transition)
	// OnFault, when set, is called as the fault begins.
	OnFault func()
}

// TrialSummary is what a trial measured. Times are JetStream server
// timestamps unless named otherwise; durations are in milliseconds.
type TrialSummary struct {
	Pair                 string     `json:"pair"`
	Mode                 string     `json:"mode"`
	Primary              string     `json:"primary"`
	Replica              string     `json:"replica"`
	Promoted             string     `json:"promoted"` // the site that took over ("" if none)
	Promotions           int        `json:"promotions"`
	FaultAt              time.Time  `json:"fault_at"` // local wall time the fault began
	LastPrimaryHeartbeat time.Time  `json:"last_primary_heartbeat"`
	PrimaryFencedAt      *time.Time `json:"primary_fenced_at"`
	// PrimaryFenceDeadline is when the rules have a primary that is still
	// running fenced at the latest: its last heartbeat + (failure_threshold
	// + 1) × heartbeat_timeout + fence_grace. After a power cut nothing is
	// left to fence; this is the moment the replica's promotion relies on.
	PrimaryFenceDeadline *time.Time `json:"primary_fence_deadline"`
	PromotionAttemptAt   *time.Time `json:"promotion_attempt_at"`
	PromotedAt           *time.Time `json:"promoted_at"`
	ServingAt            *time.Time `json:"serving_at"`
	FailoverMS           float64    `json:"failover_ms"`  // last primary heartbeat → register won by the replica
	DetectionMS          float64    `json:"detection_ms"` // last primary heartbeat → promotion attempt
	ServingMS            float64    `json:"serving_ms"`   // last primary heartbeat → replica serving
	FailoverTimeoutMS    float64    `json:"failover_timeout_ms"`
	HeartbeatTimeoutMS   float64    `json:"heartbeat_timeout_ms"`
	// Unreadable lists the records the summary could not decode (subject
	// or key, sequence or revision, error): reported, never skipped silently.
	Unreadable []string `json:"unreadable,omitempty"`
}

// trialProcedures stand in for a database: every chain succeeds at once.
// The fence step's timeout is fence_grace, the most the rules allow.
func trialProcedures(r failover.Rules) procedure.Spec {
	step := func(timeout time.Duration) procedure.ChainSpec {
		return procedure.ChainSpec{Steps: []procedure.StepSpec{{Name: "noop", Driver: "exec", Timeout: timeout, Exec: &procedure.ExecSpec{Command: "true"}}}}
	}
	fence := r.FenceGrace
	if fence <= 0 {
		fence = time.Millisecond
	}
	return procedure.Spec{Fence: step(fence), Promote: step(5 * time.Second), Demote: step(5 * time.Second)}
}

type trialSite struct {
	site  string
	proxy *FaultProxy
	nc    *nats.Conn
	host  *Host
}

// RunTrial runs one failover trial of a fresh pair (opts.Rules.Pair should
// be unique on the server) against the NATS server at serverAddr
// (host:port): two members, each behind its own FaultProxy and NATS
// connection, as two nodes would be. It returns what the record says.
func RunTrial(ctx context.Context, serverAddr string, opts TrialOptions) (TrialSummary, error) {
	r := opts.Rules
	sum := TrialSummary{Pair: r.Pair, Mode: opts.Mode.String(), Primary: r.Primary, Replica: r.Replica,
		FailoverTimeoutMS: ms(r.FailoverTimeout), HeartbeatTimeoutMS: ms(r.HeartbeatTimeout)}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}

	// An observer connection straight to the server, for the record.
	onc, err := nats.Connect("nats://"+serverAddr, nats.Name("understudy-trial-observer"))
	if err != nil {
		return sum, fmt.Errorf("trial: connect: %w", err)
	}
	defer onc.Close()
	ojs, err := jetstream.New(onc)
	if err != nil {
		return sum, err
	}
	kv, err := events.NewJetStreamKV(ctx, ojs, opts.Bucket)
	if err != nil {
		return sum, err
	}
	if _, err := kv.Put(ctx, failover.ConfigKey(r.Pair), failover.EncodeRules(r)); err != nil {
		return sum, fmt.Errorf("trial: write rules: %w", err)
	}

	var mu sync.Mutex
	var serving = map[string]chan struct{}{r.Primary: make(chan struct{}), r.Replica: make(chan struct{})}
	observe := func(t Transition) {
		if _, ok := t.Event.(*failover.ServingStarted); ok {
			mu.Lock()
			if ch := serving[t.Site]; ch != nil {
				close(ch)
				serving[t.Site] = nil
			}
			mu.Unlock()
		}
		if opts.Observe != nil {
			opts.Observe(t)
		}
	}
	mu.Lock()
	primaryUp, replicaUp := serving[r.Primary], serving[r.Replica]
	mu.Unlock()

	sites := map[string]*trialSite{}
	defer func() {
		for _, s := range sites {
			if s.host != nil {
				s.host.Stop(context.Background())
			}
			s.nc.Close()
			s.proxy.Close()
		}
	}()
	for _, site := range []string{r.Primary, r.Replica} {
		p, err := NewFaultProxy(serverAddr)
		if err != nil {
			return sum, err
		}
		nc, err := nats.Connect(p.URL(), nats.Name("understudy-"+site), nats.MaxReconnects(-1))
		if err != nil {
			p.Close()
			return sum, fmt.Errorf("trial: connect %s: %w", site, err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			return sum, err
		}
		s := &trialSite{site: site, proxy: p, nc: nc}
		sites[site] = s
		s.host, err = StartHost(ctx, js, opts.Stream, opts.Bucket,
			[]MemberConfig{{Rules: r, Site: site, Procedures: trialProcedures(r)}},
			HostOptions{Logger: logger.With("node", site), Observe: observe})
		if err != nil {
			return sum, err
		}
	}

	wait := func(ch <-chan struct{}, d time.Duration) bool {
		select {
		case <-ch:
			return true
		case <-time.After(d):
			return false
		case <-ctx.Done():
			return false
		}
	}
	if !wait(primaryUp, 10*r.HeartbeatTimeout+r.FailoverTimeout) {
		return sum, errors.New("trial: the primary did not start serving")
	}
	select {
	case <-time.After(opts.FaultAfter):
	case <-ctx.Done():
		return sum, ctx.Err()
	}

	sum.FaultAt = time.Now().UTC()
	if opts.OnFault != nil {
		opts.OnFault()
	}
	switch opts.Mode {
	case TrialPowerCut:
		pa := sites[r.Primary]
		pa.proxy.SetBlocked(true)
		go pa.host.Stop(context.Background()) // the process dies; nothing it sends gets out
		pa.host = nil
		wait(replicaUp, opts.Window)
	case TrialReplicaCut:
		rb := sites[r.Replica]
		rb.proxy.SetBlocked(true)
		select {
		case <-time.After(opts.Window):
		case <-ctx.Done():
		}
		rb.proxy.SetBlocked(false)
		// Let whatever was held land, and the replica react to it.
		time.Sleep(3 * r.HeartbeatTimeout)
	}
	return sum, collectTrial(ctx, ojs, kv, opts, &sum)
}

// collectTrial reads the pair's record: the register's history and both
// members' events.
func collectTrial(ctx context.Context, js jetstream.JetStream, kv events.KV, opts TrialOptions, sum *TrialSummary) error {
	r := opts.Rules
	hist, err := kv.History(ctx, failover.LeaderKey(r.Pair))
	if err != nil {
		return fmt.Errorf("trial: register history: %w", err)
	}
	var lastPrimary time.Time
	for _, e := range hist {
		l, err := failover.DecodeLeader(e.Value)
		if err != nil {
			if e.Op == events.OpPut {
				sum.Unreadable = append(sum.Unreadable, fmt.Sprintf("%s revision %d: %v", failover.LeaderKey(r.Pair), e.Revision, err))
			}
			continue
		}
		if l.Site == r.Primary && sum.PromotedAt == nil {
			lastPrimary = e.Time
		}
		if l.Site == r.Replica && l.Beat == 0 {
			sum.Promotions++
			if sum.PromotedAt == nil {
				t := e.Time
				sum.PromotedAt, sum.Promoted = &t, r.Replica
			}
		}
	}
	sum.LastPrimaryHeartbeat = lastPrimary
	if !lastPrimary.IsZero() {
		d := lastPrimary.Add(r.MinFailoverTimeout())
		sum.PrimaryFenceDeadline = &d
	}
	evlog, err := events.NewJetStreamLog(js, opts.Stream, Codec())
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// A member appends its events in the order it produced them; dated by
	// when they landed less their wait on the node, two close ones can
	// invert as their appends' latency differs. The replay keeps each
	// subject's times non-decreasing in sequence order
	// (projections.keepSubjectOrder); so does the trial, or the two
	// disagree by that inversion.
	latest := map[string]time.Time{}
	names := failover.NamesOf(r.Pair)
	for rec, err := range evlog.Read(rctx, events.ReadOptions{Subject: names.Members()}) {
		if err != nil {
			return fmt.Errorf("trial: read events: %w", err)
		}
		ev, err := evlog.Codec().DecodeRecord(rec)
		if err != nil {
			sum.Unreadable = append(sum.Unreadable, fmt.Sprintf("%s sequence %d: %v", rec.Subject, rec.Sequence, err))
			continue
		}
		// Dated as the replay dates them: when they happened on the node.
		t := rec.Occurred()
		if last := latest[rec.Subject]; t.Before(last) {
			t = last
		}
		latest[rec.Subject] = t
		site, _ := names.MemberSite(rec.Subject)
		switch ev.(type) {
		case *failover.Fenced:
			if site == r.Primary && !t.Before(sum.FaultAt) && sum.PrimaryFencedAt == nil {
				sum.PrimaryFencedAt = &t
			}
		case *failover.AcquireAttempted:
			if site == r.Replica && sum.PromotionAttemptAt == nil && !lastPrimary.IsZero() && t.After(lastPrimary) {
				sum.PromotionAttemptAt = &t
			}
		case *failover.ServingStarted:
			if site == r.Replica && sum.ServingAt == nil {
				sum.ServingAt = &t
			}
		}
	}
	if !lastPrimary.IsZero() {
		if sum.PromotedAt != nil {
			sum.FailoverMS = ms(sum.PromotedAt.Sub(lastPrimary))
		}
		if sum.PromotionAttemptAt != nil {
			sum.DetectionMS = ms(sum.PromotionAttemptAt.Sub(lastPrimary))
		}
		if sum.ServingAt != nil {
			sum.ServingMS = ms(sum.ServingAt.Sub(lastPrimary))
		}
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Percentile returns the p-th percentile (0..100, nearest rank) of xs.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(float64(len(s)-1)*p/100 + 0.5)
	return s[min(max(i, 0), len(s)-1)]
}
