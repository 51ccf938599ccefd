package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"understudy/events"
)

// AssetKind tells a KV bucket from a plain stream.
type AssetKind int

const (
	KVBucket AssetKind = iota + 1
	Stream
)

func (k AssetKind) String() string {
	switch k {
	case KVBucket:
		return "kv"
	case Stream:
		return "stream"
	}
	return "AssetKind(" + strconv.Itoa(int(k)) + ")"
}

// Asset is the wanted shape of one JetStream asset. A KV bucket is a stream
// named KV_<Name> shaped by nats.go (subjects $KV.<Name>.>, discard new,
// duplicate window 2m or the TTL if shorter), except that rollups are
// refused: a Nats-Rollup header on any key a client may write would purge
// the whole bucket (every pair's register, rules and history), and NATS
// permissions cannot look at headers. understudy never purges a key.
type Asset struct {
	Kind AssetKind
	// Name is the bucket name (KVBucket) or the stream name (Stream).
	Name string
	// Subjects of a Stream; ignored for a KVBucket.
	Subjects []string
	Storage  jetstream.StorageType
	// Retention of a Stream; a KVBucket always uses limits.
	Retention jetstream.RetentionPolicy
	Replicas  int
	// History is the values kept per key of a KVBucket (1..64), or the
	// messages kept per subject of a Stream (-1: unlimited).
	History int64
	// MaxBytes caps the stored bytes; -1 (or 0): unlimited.
	MaxBytes int64
	// MaxAge expires messages (a KVBucket's TTL); 0: never.
	MaxAge time.Duration
	// Duplicates is a Stream's deduplication window for Nats-Msg-Id.
	Duplicates time.Duration
	// Discard is a Stream's policy when full; a KVBucket always discards new.
	Discard jetstream.DiscardPolicy
}

// StreamName is the name of the JetStream stream that holds the asset.
func (a Asset) StreamName() string {
	if a.Kind == KVBucket {
		return events.KVStream(a.Name)
	}
	return a.Name
}

func (a Asset) String() string { return a.Kind.String() + " " + a.Name }

// DefaultAssets are understudy's assets (DESIGN.md, "JetStream assets"):
// the failover register bucket (history 64, no TTL: data becomes stale, it
// never vanishes), the fleet bucket (history 16) and the event stream (ev.>,
// limits retention, 2m duplicate window), all on file storage with the
// given replicas. Only the names of names are used (its Replicas may be 0,
// "auto"; replicas is the resolved count).
func DefaultAssets(names AssetsConfig, replicas int) []Asset {
	return []Asset{
		{Kind: KVBucket, Name: names.FailoverBucket, Storage: jetstream.FileStorage, Replicas: replicas, History: 64, MaxBytes: -1},
		{Kind: KVBucket, Name: names.FleetBucket, Storage: jetstream.FileStorage, Replicas: replicas, History: 16, MaxBytes: -1},
		{
			Kind: Stream, Name: names.EventsStream, Subjects: []string{"ev.>"},
			Storage: jetstream.FileStorage, Retention: jetstream.LimitsPolicy, Replicas: replicas,
			History: -1, MaxBytes: -1, Duplicates: 2 * time.Minute, Discard: jetstream.DiscardOld,
		},
	}
}

// Outcome is what provisioning did to one asset.
type Outcome int

const (
	Created Outcome = iota + 1
	Updated
	Unchanged
)

func (o Outcome) String() string {
	switch o {
	case Created:
		return "created"
	case Updated:
		return "updated"
	case Unchanged:
		return "unchanged"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// Change is one setting of an asset that differs from the wanted one.
type Change struct {
	Field   string // e.g. "history", "storage", "replicas"
	Current string
	Wanted  string
	// Reason says why a refused change was not made and what to do instead;
	// empty for applied changes.
	Reason string
}

func (c Change) String() string {
	s := c.Field + ": " + c.Current + " -> " + c.Wanted
	if c.Reason != "" {
		s += " (" + c.Reason + ")"
	}
	return s
}

// AssetReport is the provisioning of one asset.
type AssetReport struct {
	Kind    AssetKind
	Name    string
	Outcome Outcome
	// Applied lists the settings updated (Outcome Updated).
	Applied []Change
	// Refused lists the settings that still differ because NATS cannot
	// change them in place, or understudy will not (see Change.Reason).
	// It may be non-empty with any Outcome but Created.
	Refused []Change
}

// Provisioned reports a provisioning run, one entry per asset in the order given.
type Provisioned struct {
	Assets []AssetReport
}

// Refused counts the refused changes over all assets.
func (p Provisioned) Refused() int {
	n := 0
	for _, a := range p.Assets {
		n += len(a.Refused)
	}
	return n
}

func (p Provisioned) String() string {
	var b strings.Builder
	for i, a := range p.Assets {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s %s %s", a.Kind, a.Name, a.Outcome)
		for _, c := range a.Applied {
			fmt.Fprintf(&b, ", %s", c)
		}
		for _, c := range a.Refused {
			fmt.Fprintf(&b, ", refused %s", c)
		}
	}
	return b.String()
}

// ProvisionError is the failure to create or update one asset.
type ProvisionError struct {
	Kind AssetKind
	Name string
	Err  error
}

func (e *ProvisionError) Error() string {
	return "runtime: provisioning " + e.Kind.String() + " " + e.Name + ": " + e.Err.Error()
}

func (e *ProvisionError) Unwrap() error { return e.Err }

// ErrReplicasUnsupported reports assets wanted with more than one replica on
// a NATS server that is not clustered. Use --replicas 1, or a NATS cluster.
var ErrReplicasUnsupported = errors.New("replicas > 1 need a clustered NATS: use --replicas 1 or join a NATS cluster")

// ErrInvalidAsset reports an Asset that cannot be provisioned as described
// (bad name, replicas or history); nothing was sent to NATS for it.
var ErrInvalidAsset = errors.New("invalid asset")

// JetStream API error codes (nats-server's generated constants).
const (
	codeReplicasNotSupported = 10074 // JSStreamReplicasNotSupportedErr
	codeClusterNotAvailable  = 10008 // JSClusterNotAvailErr: temporarily unavailable
	codeClusterNoPeers       = 10005 // JSClusterNoPeersErr: no suitable peers (yet) for the placement
	codeClusterNotLeader     = 10009 // JSClusterNotLeaderErr: the meta leader moved while answering
	codeStreamNotFound       = 10059 // JSStreamNotFoundErr: another node's create is not visible yet
)

// Provision makes the assets exist with the wanted settings. It is
// idempotent: a second run with the same assets changes nothing and reports
// every asset Unchanged. Settings NATS can update in place (history, limits,
// duplicate window, discard, subjects, replicas on a cluster) are updated.
// Settings it cannot (storage type, persist mode, replicas on a single
// server), or that understudy refuses to touch on existing data (retention,
// which could delete history), are left as they are, returned in the
// report's Refused lists, and logged as warnings naming field, current and
// wanted value. Provision stops at the first asset it fails to create or
// update and returns a *ProvisionError with the report so far.
//
// Several nodes may provision concurrently: exactly one reports an asset
// Created (its run is named in the stream metadata "understudy.created_by"),
// the others compare against it.
func Provision(ctx context.Context, js jetstream.JetStream, assets []Asset, log *slog.Logger) (Provisioned, error) {
	return provision(ctx, js, assets, true, log)
}

// ProvisionCreateOnly is Provision for an identity that may create the
// assets but not change them (a node under a security section: a stream
// update can also shorten its history to nothing): every change Provision
// would apply is reported Refused instead, for an admin to make.
func ProvisionCreateOnly(ctx context.Context, js jetstream.JetStream, assets []Asset, log *slog.Logger) (Provisioned, error) {
	return provision(ctx, js, assets, false, log)
}

// refusedToNodes is why a secured node leaves a change to an admin.
const refusedToNodes = "a node of a secured deployment creates the assets but may not change them: an admin changes the stream (nats stream edit, with the admin identity understudy init wrote; docs/operations.md)"

func provision(ctx context.Context, js jetstream.JetStream, assets []Asset, mayUpdate bool, log *slog.Logger) (Provisioned, error) {
	var p Provisioned
	for _, a := range assets {
		r, err := provisionOne(ctx, js, a, mayUpdate)
		if err != nil {
			return p, &ProvisionError{Kind: a.Kind, Name: a.Name, Err: err}
		}
		p.Assets = append(p.Assets, r)
		attrs := []any{"kind", a.Kind, "name", a.Name, "outcome", r.Outcome}
		for _, c := range r.Applied {
			log.Info("asset setting updated", slices.Concat(attrs, []any{"field", c.Field, "current", c.Current, "wanted", c.Wanted})...)
		}
		for _, c := range r.Refused {
			log.Warn("asset setting not changed", slices.Concat(attrs, []any{"field", c.Field, "current", c.Current, "wanted", c.Wanted, "reason", c.Reason})...)
		}
		log.Debug("asset provisioned", attrs...)
	}
	return p, nil
}

func provisionOne(ctx context.Context, js jetstream.JetStream, a Asset, mayUpdate bool) (AssetReport, error) {
	if err := a.check(); err != nil {
		return AssetReport{}, fmt.Errorf("%w: %w", ErrInvalidAsset, err)
	}
	r := AssetReport{Kind: a.Kind, Name: a.Name}
	atomic := atomicBatches(js)
	want := a.streamConfig(atomic)
	info, err := streamInfo(ctx, js, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		err = a.create(ctx, js, atomic)
		if err == nil {
			r.Outcome = Created
			return r, nil
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return r, replicasHint(err)
		}
		// Another node created it just now: compare.
		info, err = streamInfo(ctx, js, want.Name)
	}
	if err != nil {
		return r, err
	}

	cur := info.Config
	next := cur // the update: current config with the changeable settings applied
	for _, s := range settingsOf(a.Kind) {
		c, w := s.get(&cur), s.get(&want)
		if c == w {
			continue
		}
		ch := Change{Field: s.field, Current: c, Wanted: w}
		if s.refuse != "" || !mayUpdate {
			ch.Reason = s.refuse
			if ch.Reason == "" {
				ch.Reason = refusedToNodes
			}
			r.Refused = append(r.Refused, ch)
			continue
		}
		s.set(&next, &want)
		r.Applied = append(r.Applied, ch)
	}
	if len(r.Applied) == 0 {
		r.Outcome = Unchanged
		return r, nil
	}
	_, err = js.UpdateStream(ctx, next)
	if isAPIError(err, codeReplicasNotSupported) && next.Replicas != cur.Replicas {
		// A single server refuses replicas > 1: keep the rest of the update.
		next.Replicas = cur.Replicas
		i := slices.IndexFunc(r.Applied, func(c Change) bool { return c.Field == "replicas" })
		ch := r.Applied[i]
		ch.Reason = "the NATS server is not clustered, so it holds one replica: join a NATS cluster, or use --replicas 1"
		r.Applied = slices.Delete(r.Applied, i, i+1)
		r.Refused = append(r.Refused, ch)
		err = nil
		if len(r.Applied) > 0 {
			_, err = js.UpdateStream(ctx, next)
		}
	}
	if err != nil {
		return r, fmt.Errorf("updating %s: %w", changesString(r.Applied), err)
	}
	r.Outcome = Updated
	if len(r.Applied) == 0 {
		r.Outcome = Unchanged
	}
	return r, nil
}

func (a Asset) check() error {
	switch {
	case !assetNameRE.MatchString(a.Name):
		return fmt.Errorf("invalid name %q: letters, digits, '_' and '-' only", a.Name)
	case a.Replicas < 1 || a.Replicas > MaxReplicas:
		return fmt.Errorf("replicas %d: must be 1..%d", a.Replicas, MaxReplicas)
	case a.Kind == KVBucket && (a.History < 1 || a.History > jetstream.KeyValueMaxHistory):
		return fmt.Errorf("history %d: must be 1..%d", a.History, jetstream.KeyValueMaxHistory)
	case a.Kind == Stream && len(a.Subjects) == 0:
		return errors.New("a stream needs subjects")
	case a.Kind != KVBucket && a.Kind != Stream:
		return fmt.Errorf("unknown kind %v", a.Kind)
	}
	return nil
}

// atomicBatches reports whether js's server takes atomic batches (NATS
// 2.12 and later): an older one does not know allow_atomic, and would
// show it as a change at every start.
func atomicBatches(js jetstream.JetStream) bool {
	return versionAtLeast(js.Conn().ConnectedServerVersion(), 2, 12)
}

// versionAtLeast reports whether the server version v ("2.12.1", maybe
// with a "-beta" suffix) is at least major.minor.
func versionAtLeast(v string, major, minor int) bool {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(strings.SplitN(parts[1], "-", 2)[0])
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || (ma == major && mi >= minor)
}

// streamConfig is the stream the asset wants. For a KVBucket it is the one
// nats.go's CreateKeyValue makes, so that comparisons see no false changes,
// but for rollups (denied) and, when the server has them (atomic), atomic
// batches (allowed, as on a Stream).
func (a Asset) streamConfig(atomic bool) jetstream.StreamConfig {
	maxBytes := a.MaxBytes
	if maxBytes == 0 {
		maxBytes = -1
	}
	if a.Kind == KVBucket {
		dup := 2 * time.Minute
		if a.MaxAge > 0 && a.MaxAge < dup {
			dup = a.MaxAge
		}
		return jetstream.StreamConfig{
			Name:              a.StreamName(),
			Subjects:          []string{"$KV." + a.Name + ".>"},
			MaxMsgsPerSubject: a.History,
			MaxBytes:          maxBytes,
			MaxAge:            a.MaxAge,
			MaxMsgSize:        -1,
			MaxMsgs:           -1,
			MaxConsumers:      -1,
			Storage:           a.Storage,
			Replicas:          a.Replicas,
			AllowRollup:       false,
			DenyDelete:        true,
			AllowDirect:       true,
			// A node's register writes go in atomic batches when many wait
			// (a takeover of thousands of pairs): one disk sync per batch.
			AllowAtomicPublish: atomic,
			Duplicates:         dup,
			Discard:            jetstream.DiscardNew,
			Retention:          jetstream.LimitsPolicy,
		}
	}
	history := a.History
	if history == 0 {
		history = -1
	}
	return jetstream.StreamConfig{
		Name:              a.Name,
		Subjects:          slices.Clone(a.Subjects),
		Retention:         a.Retention,
		MaxMsgsPerSubject: history,
		MaxBytes:          maxBytes,
		MaxAge:            a.MaxAge,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		Storage:           a.Storage,
		Replicas:          a.Replicas,
		Duplicates:        a.Duplicates,
		Discard:           a.Discard,
		// A node's event appends go in atomic batches when many wait (a
		// takeover of thousands of pairs): one disk sync per batch.
		AllowAtomicPublish: atomic,
	}
}

// createdByKey is the stream metadata key naming the provisioning run that
// created an asset. Its value is unique per run, which is what tells a
// creation from a concurrent identical one: JetStream answers a create of
// an existing stream with success when the configurations are equal,
// metadata included, and with "name already in use" otherwise.
const createdByKey = "understudy.created_by"

// create creates the asset, or fails with jetstream.ErrStreamNameAlreadyInUse
// (possibly joined with other errors) when it exists.
func (a Asset) create(ctx context.Context, js jetstream.JetStream, atomic bool) error {
	host, _ := os.Hostname()
	meta := map[string]string{createdByKey: fmt.Sprintf("%s/%016x", host, rand.Uint64())}
	// A KV bucket is created as its stream (the shape CreateKeyValue
	// makes, which nats.go's KeyValue binds to), because CreateKeyValue
	// always allows rollups.
	cfg := a.streamConfig(atomic)
	cfg.Metadata = meta
	_, err := js.CreateStream(ctx, cfg)
	return err
}

// setting is one compared field of a stream configuration.
type setting struct {
	field string
	get   func(*jetstream.StreamConfig) string
	set   func(dst, src *jetstream.StreamConfig)
	// refuse, when set, is why a difference is reported and not applied.
	refuse string
}

func settingsOf(k AssetKind) []setting {
	history := "max_msgs_per_subject"
	if k == KVBucket {
		history = "history"
	}
	return []setting{
		{
			field:  "storage",
			get:    func(c *jetstream.StreamConfig) string { return c.Storage.String() },
			refuse: "NATS cannot change the storage type of an existing stream: back it up, delete it and provision again",
		},
		{
			field:  "persist_mode",
			get:    func(c *jetstream.StreamConfig) string { return c.PersistMode.String() },
			refuse: "NATS cannot change the persist mode of an existing stream: back it up, delete it and provision again",
		},
		{
			field:  "retention",
			get:    func(c *jetstream.StreamConfig) string { return c.Retention.String() },
			refuse: "understudy does not change retention of existing data (it could delete history): change it with the nats CLI if intended",
		},
		{
			field: "replicas",
			get:   func(c *jetstream.StreamConfig) string { return strconv.Itoa(max(c.Replicas, 1)) },
			set:   func(d, s *jetstream.StreamConfig) { d.Replicas = s.Replicas },
		},
		{
			field: "allow_rollup",
			get:   func(c *jetstream.StreamConfig) string { return strconv.FormatBool(c.AllowRollup) },
			set:   func(d, s *jetstream.StreamConfig) { d.AllowRollup = s.AllowRollup },
		},
		{
			field: "subjects",
			get:   func(c *jetstream.StreamConfig) string { return strings.Join(c.Subjects, ",") },
			set:   func(d, s *jetstream.StreamConfig) { d.Subjects = slices.Clone(s.Subjects) },
		},
		{
			field: history,
			get:   func(c *jetstream.StreamConfig) string { return limit(c.MaxMsgsPerSubject) },
			set:   func(d, s *jetstream.StreamConfig) { d.MaxMsgsPerSubject = s.MaxMsgsPerSubject },
		},
		{
			field: "max_bytes",
			get:   func(c *jetstream.StreamConfig) string { return limit(c.MaxBytes) },
			set:   func(d, s *jetstream.StreamConfig) { d.MaxBytes = s.MaxBytes },
		},
		{
			field: "max_age",
			get:   func(c *jetstream.StreamConfig) string { return c.MaxAge.String() },
			set:   func(d, s *jetstream.StreamConfig) { d.MaxAge = s.MaxAge },
		},
		{
			field: "duplicate_window",
			get:   func(c *jetstream.StreamConfig) string { return c.Duplicates.String() },
			set:   func(d, s *jetstream.StreamConfig) { d.Duplicates = s.Duplicates },
		},
		{
			field: "discard",
			get:   func(c *jetstream.StreamConfig) string { return c.Discard.String() },
			set:   func(d, s *jetstream.StreamConfig) { d.Discard = s.Discard },
		},
		{
			field: "allow_atomic",
			get:   func(c *jetstream.StreamConfig) string { return strconv.FormatBool(c.AllowAtomicPublish) },
			set:   func(d, s *jetstream.StreamConfig) { d.AllowAtomicPublish = s.AllowAtomicPublish },
		},
	}
}

// limit renders a JetStream limit, where 0 and negative values mean none.
func limit(n int64) string {
	if n <= 0 {
		return "unlimited"
	}
	return strconv.FormatInt(n, 10)
}

func streamInfo(ctx context.Context, js jetstream.JetStream, name string) (*jetstream.StreamInfo, error) {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	return s.CachedInfo(), nil
}

func changesString(cs []Change) string {
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = c.String()
	}
	return strings.Join(parts, ", ")
}

func replicasHint(err error) error {
	if isAPIError(err, codeReplicasNotSupported) {
		return fmt.Errorf("%w: %w", ErrReplicasUnsupported, err)
	}
	return err
}

func isAPIError(err error, code jetstream.ErrorCode) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == code
}

// retryableProvisionError tells a JetStream that is not ready yet (no
// answer, timeouts, cluster temporarily unavailable) from one that refused
// the assets.
func retryableProvisionError(err error) bool {
	if isAPIError(err, codeClusterNotAvailable) || isAPIError(err, codeClusterNotLeader) || isAPIError(err, codeStreamNotFound) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled) {
		// JetStream may still be starting on the server; an operator who
		// forgot to enable it sees the retry warnings.
		return true
	}
	var apiErr *jetstream.APIError
	return !errors.As(err, &apiErr) && !errors.Is(err, context.Canceled) && !errors.Is(err, ErrInvalidAsset)
}
