package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"understudy/actors/capability"
	"understudy/actors/failover"
	"understudy/events"
	"understudy/runtime"
)

// natsFlags are the connection flags of every command that talks to a
// running NATS (as opposed to serve, which may embed one): the same
// credentials and TLS options as serve, each with its UNDERSTUDY_NATS_*
// variable (cliEnv). The password is read only from the environment.
type natsFlags struct {
	url    string
	bucket string

	creds, nkey, user                     string
	tlsCA, tlsCert, tlsKey, tlsServerName string
}

func (f *natsFlags) add(cmd *cobra.Command) {
	f.addURL(cmd)
	cmd.Flags().StringVar(&f.bucket, "bucket", runtime.DefaultFailoverBucket, "failover KV bucket")
}

// addFleet registers the flags of the fleet commands (the fleet bucket).
func (f *natsFlags) addFleet(cmd *cobra.Command) {
	f.addURL(cmd)
	cmd.Flags().StringVar(&f.bucket, "fleet-bucket", runtime.DefaultFleetBucket, "fleet KV bucket")
}

// cliEnv names the variable of each connection flag: the same names serve
// reads, so that one sourced env file (understudy init writes one for the
// operator and one for the reader) serves every command.
var cliEnv = map[string]string{
	"nats-url":             "UNDERSTUDY_NATS_URL",
	"nats-creds":           "UNDERSTUDY_NATS_CREDS",
	"nats-nkey":            "UNDERSTUDY_NATS_NKEY",
	"nats-user":            "UNDERSTUDY_NATS_USER",
	"nats-tls-ca":          "UNDERSTUDY_NATS_TLS_CA",
	"nats-tls-cert":        "UNDERSTUDY_NATS_TLS_CERT",
	"nats-tls-key":         "UNDERSTUDY_NATS_TLS_KEY",
	"nats-tls-server-name": "UNDERSTUDY_NATS_TLS_SERVER_NAME",
}

// cliPasswordEnv holds the password of --nats-user: never a flag, which
// every user of the machine could read in ps.
const cliPasswordEnv = "UNDERSTUDY_NATS_PASSWORD"

func (f *natsFlags) addURL(cmd *cobra.Command) {
	fl := cmd.Flags()
	str := func(into *string, name, def, usage string) {
		fl.StringVar(into, name, envOr(cliEnv[name], def), usage+" ($"+cliEnv[name]+")")
	}
	str(&f.url, "nats-url", "nats://127.0.0.1:4222", "NATS URL(s), comma-separated; tls:// for TLS")
	str(&f.nkey, "nats-nkey", "", "file of the user nkey seed (SU...) to authenticate with, e.g. operator/operator.nk of understudy init")
	str(&f.creds, "nats-creds", "", "credentials file (user JWT and nkey seed) to authenticate with")
	str(&f.user, "nats-user", "", "user name to authenticate with; the password is read from $"+cliPasswordEnv+" only")
	str(&f.tlsCA, "nats-tls-ca", "", "PEM file of the CA(s) that sign the NATS servers' certificates, instead of the system's")
	str(&f.tlsCert, "nats-tls-cert", "", "client certificate (PEM) for servers that require one, with --nats-tls-key")
	str(&f.tlsKey, "nats-tls-key", "", "client private key (PEM), with --nats-tls-cert")
	str(&f.tlsServerName, "nats-tls-server-name", "", "name expected in the servers' certificates, instead of each URL's host")
}

// option names a connection flag with its variable, for errors.
func option(flag string) string {
	if env := cliEnv[flag]; env != "" {
		return "--" + flag + " ($" + env + ")"
	}
	return "--" + flag
}

// connectOptions checks the connection flags into runtime's options: the
// credentials (one way at most), and TLS from a private CA and a client
// certificate when given. Errors name the flag and its variable.
func (f *natsFlags) connectOptions() (runtime.ConnectOptions, error) {
	o := runtime.ConnectOptions{URL: f.url, User: f.user, Password: os.Getenv(cliPasswordEnv), Creds: f.creds, NKey: f.nkey, Name: "understudy-cli"}
	var errs []error
	bad := func(flag, value, rule string) {
		if value != "" {
			value = " " + value
		}
		errs = append(errs, fmt.Errorf("%s%s: %s", option(flag), value, rule))
	}
	var ways []string
	for _, w := range []struct{ flag, v string }{{"nats-nkey", f.nkey}, {"nats-creds", f.creds}, {"nats-user", f.user}} {
		if w.v != "" {
			ways = append(ways, option(w.flag))
		}
	}
	if len(ways) > 1 {
		errs = append(errs, fmt.Errorf("%s: give one way to authenticate, not several", strings.Join(ways, ", ")))
	}
	if f.user == "" && o.Password != "" {
		bad("nats-user", "", "must be set with $"+cliPasswordEnv)
	}
	if f.nkey != "" {
		if kp, err := runtime.LoadUserKey(f.nkey); err != nil {
			bad("nats-nkey", f.nkey, "must be a file holding a user nkey seed (SU...): "+err.Error())
		} else {
			kp.Wipe()
		}
	}
	if f.creds != "" {
		if err := runtime.CheckCreds(f.creds); err != nil {
			bad("nats-creds", f.creds, err.Error())
		}
	}
	if f.tlsCA != "" || f.tlsCert != "" || f.tlsKey != "" || f.tlsServerName != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.tlsServerName}
		if f.tlsCA != "" {
			pool := x509.NewCertPool()
			if pem, err := os.ReadFile(f.tlsCA); err != nil {
				bad("nats-tls-ca", f.tlsCA, "must be a readable PEM file: "+err.Error())
			} else if !pool.AppendCertsFromPEM(pem) {
				bad("nats-tls-ca", f.tlsCA, "must contain at least one PEM certificate")
			} else {
				tc.RootCAs = pool
			}
		}
		switch {
		case f.tlsCert != "" && f.tlsKey == "":
			bad("nats-tls-key", "", "must be set with "+option("nats-tls-cert"))
		case f.tlsKey != "" && f.tlsCert == "":
			bad("nats-tls-cert", "", "must be set with "+option("nats-tls-key"))
		case f.tlsCert != "":
			if pair, err := tls.LoadX509KeyPair(f.tlsCert, f.tlsKey); err != nil {
				bad("nats-tls-cert", f.tlsCert, "must be a PEM certificate matching "+option("nats-tls-key")+": "+err.Error())
			} else {
				tc.Certificates = []tls.Certificate{pair}
			}
		}
		o.TLS = tc
	}
	return o, errors.Join(errs...)
}

// dial is the CLI's one way to connect to NATS: every command's
// connection goes through it, with the options of connectOptions.
func (f *natsFlags) dial() (*nats.Conn, error) {
	o, err := f.connectOptions()
	if err != nil {
		return nil, err
	}
	auth, err := runtime.AuthOptions(o)
	if err != nil {
		return nil, err
	}
	opts := append([]nats.Option{nats.Name(o.Name), nats.Timeout(3 * time.Second)}, auth...)
	nc, err := nats.Connect(f.url, opts...)
	if err == nil {
		return nc, nil
	}
	at := runtime.RedactURLs(f.url)
	var unknownCA x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	msg := err.Error()
	switch {
	case runtime.IsAuthError(err):
		who := "no identity was given: set " + option("nats-nkey") + ", " + option("nats-creds") + " or " + option("nats-user")
		if len(o.User+o.Creds+o.NKey) > 0 {
			who = "check " + strings.Join(slices.DeleteFunc([]string{ifSet(f.nkey, "nats-nkey"), ifSet(f.creds, "nats-creds"), ifSet(f.user, "nats-user")}, func(s string) bool { return s == "" }), ", ")
		}
		return nil, fmt.Errorf("connect to NATS at %s: %w: the server refused the credentials; %s", at, err, who)
	case errors.As(err, &unknownCA) || strings.Contains(msg, "certificate signed by unknown authority"):
		return nil, fmt.Errorf("connect to NATS at %s: %w: the server's certificate is not signed by a CA this command trusts: give its CA with %s", at, err, option("nats-tls-ca"))
	case errors.As(err, &hostErr) || strings.Contains(msg, "certificate is valid for"):
		return nil, fmt.Errorf("connect to NATS at %s: %w: connect by a name the certificate holds, or give it with %s", at, err, option("nats-tls-server-name"))
	case o.TLS == nil && strings.Contains(msg, "secure connection required"):
		return nil, fmt.Errorf("connect to NATS at %s: %w: the server requires TLS: use a tls:// URL and give the CA with %s and a client certificate with %s and %s", at, err, option("nats-tls-ca"), option("nats-tls-cert"), option("nats-tls-key"))
	case (o.TLS == nil || len(o.TLS.Certificates) == 0) && strings.Contains(strings.ToLower(msg), "tls"):
		// A server that requires a client certificate closes the
		// connection after the handshake: nats.go says only that.
		return nil, fmt.Errorf("connect to NATS at %s: %w: the server requires a client certificate: give %s and %s", at, err, option("nats-tls-cert"), option("nats-tls-key"))
	}
	return nil, fmt.Errorf("connect to NATS at %s: %w (is a node running? start one with 'understudy serve')", at, err)
}

func ifSet(v, flag string) string {
	if v == "" {
		return ""
	}
	return option(flag)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// pairTarget is the opening of the commands that move a pair to a site
// (switchover, failover): both flags given, connected, and to a member of
// the pair by its rules. The caller closes the connection.
func (f *natsFlags) pairTarget(ctx context.Context, cmd *cobra.Command, pair, to string) (*nats.Conn, events.KV, error) {
	if pair == "" || to == "" {
		return nil, nil, &usageError{cmd: cmd.CommandPath(), err: errors.New("--pair and --to are required")}
	}
	nc, kv, err := f.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	rules, _, err := readRules(ctx, kv, pair)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	if !rules.Has(to) {
		nc.Close()
		return nil, nil, &usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--to %s: not a member of pair %s (%s, %s)", to, pair, rules.Primary, rules.Replica)}
	}
	return nc, kv, nil
}

func (f *natsFlags) connect(ctx context.Context) (*nats.Conn, events.KV, error) {
	nc, err := f.dial()
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	kv, err := events.NewJetStreamKV(ctx, js, f.bucket)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("open bucket %s: %w", f.bucket, err)
	}
	return nc, kv, nil
}

// readRules reads the pair's rules in force from <pair>.config. A pair of
// a secured deployment has none until an operator writes them: its members
// then run their pair files' rules, which they publish under
// <pair>.rules.<site>, and the first of those that decodes is returned (the
// entry's Key says which).
func readRules(ctx context.Context, kv events.KV, pair string) (failover.Rules, events.Entry, error) {
	return readRulesFor(ctx, kv, pair)
}

// readRulesFor is readRules that first reads the published rules of the
// sites named (those the register names, when known) directly, before it
// watches every <pair>.rules.<site>.
func readRulesFor(ctx context.Context, kv events.KV, pair string, sites ...string) (failover.Rules, events.Entry, error) {
	e, err := kv.Get(ctx, failover.ConfigKey(pair))
	if errors.Is(err, events.ErrNotFound) {
		for _, site := range sites {
			if site == "" {
				continue
			}
			if pe, err := kv.Get(ctx, failover.RulesKey(pair, site)); err == nil {
				if r, err := failover.DecodeRules(pe.Value); err == nil && r.Pair == pair {
					return r, pe, nil
				}
			}
		}
		if r, pe, ok := publishedRules(ctx, kv, pair); ok {
			return r, pe, nil
		}
	}
	if err != nil {
		return failover.Rules{}, e, fmt.Errorf("pair %s: no rules in %s: %w", pair, failover.ConfigKey(pair), err)
	}
	r, err := failover.DecodeRules(e.Value)
	if err != nil {
		return failover.Rules{}, e, fmt.Errorf("pair %s: %s revision %d: %w", pair, failover.ConfigKey(pair), e.Revision, err)
	}
	return r, e, nil
}

// publishedRules is the first decodable <pair>.rules.<site>, by key.
func publishedRules(ctx context.Context, kv events.KV, pair string) (failover.Rules, events.Entry, bool) {
	w, err := kv.Watch(ctx, failover.RulesKey(pair, "*"), events.WatchOptions{})
	if err != nil {
		return failover.Rules{}, events.Entry{}, false
	}
	defer w.Stop()
	var found []events.Entry
	for e := range w.Updates() {
		if e.Revision == 0 {
			break
		}
		if e.Op == events.OpPut {
			found = append(found, e)
		}
	}
	slices.SortFunc(found, func(a, b events.Entry) int { return strings.Compare(a.Key, b.Key) })
	for _, e := range found {
		if r, err := failover.DecodeRules(e.Value); err == nil && r.Pair == pair {
			return r, e, true
		}
	}
	return failover.Rules{}, events.Entry{}, false
}

// watchSwitchoverRejection tails the pair's member events from the
// request's time and delivers the leader's refusal of req, if it comes.
// Without access to the event stream it delivers nothing (the register
// watch then decides).
func watchSwitchoverRejection(ctx context.Context, nc *nats.Conn, pair string, req failover.Switchover) <-chan *failover.SwitchoverRejected {
	out := make(chan *failover.SwitchoverRejected, 1)
	js, err := jetstream.New(nc)
	if err != nil {
		return out
	}
	evlog, err := events.NewJetStreamLog(js, runtime.DefaultEventsStream, runtime.Codec())
	if err != nil {
		return out
	}
	go func() {
		opts := events.ReadOptions{Subject: failover.NamesOf(pair).Members(), FromTime: req.Requested.Add(-time.Second), Follow: true}
		for rec, err := range evlog.Read(ctx, opts) {
			if err != nil {
				return
			}
			ev, err := evlog.Codec().DecodeRecord(rec)
			if r, ok := ev.(*failover.SwitchoverRejected); err == nil && ok && r.ID == req.ID {
				out <- r
				return
			}
		}
	}()
	return out
}

// PairStatus is one pair as `understudy status --json` prints it. Ages
// are measured against the server's clock (serverTime).
type PairStatus struct {
	Pair    string `json:"pair"`
	Leader  string `json:"leader"` // "" when nobody holds the register
	Term    uint64 `json:"term"`
	Fenced  bool   `json:"fenced"`
	Handoff string `json:"handoff,omitempty"`
	// Corrupt says why the register's value does not decode; the members
	// treat such a register as held by nobody and replace it (Term is then
	// the highest term of its history).
	Corrupt   string  `json:"corrupt,omitempty"`
	LeaderAge float64 `json:"leader_write_age_s"`
	// Lease (leadership: node): the holder's node and epoch as the
	// register names them, and that node's liveness now.
	Lease      *LeaseStatus          `json:"lease,omitempty"`
	Heartbeats map[string]SiteStatus `json:"heartbeats"`
	Rules      *RulesStatus          `json:"rules,omitempty"`
	Pause      *PauseStatus          `json:"pause,omitempty"` // operator.go
	ServerTime time.Time             `json:"server_time"`
}

// LeaseStatus is a register holder's lease with leadership: node: the
// node and epoch the register names, and that node's liveness record.
type LeaseStatus struct {
	Node  string `json:"node"`
	Epoch uint64 `json:"epoch"`
	// Live is the node's liveness record (nil: it has none, or it cannot
	// be read); Current says whether the lease holds: the record is in the
	// lease's epoch, written by the node itself.
	Live    *NodeLiveStatus `json:"liveness,omitempty"`
	Current bool            `json:"current"`
}

// NodeLiveStatus is a node's liveness record (_live.<node>).
type NodeLiveStatus struct {
	Node  string `json:"node"`
	Epoch uint64 `json:"epoch"`
	Beat  uint64 `json:"beat"`
	// By is who wrote the latest value: the node itself (a beat), or
	// another node that raised its epoch to take its pairs over.
	By  string  `json:"by"`
	Age float64 `json:"age_s"` // of the latest write, by the server's clock
	Rev uint64  `json:"rev"`
	// Error says why the record does not decode.
	Error string `json:"error,omitempty"`
}

// SiteStatus is a member's own heartbeat. The holder of the register
// beats through the register instead: its entry then has Source
// "register" and the register write's age; with leadership: node it
// beats through its node's liveness record (Source "liveness").
type SiteStatus struct {
	Phase  string  `json:"phase"`
	Ready  bool    `json:"ready"`
	Age    float64 `json:"age_s"`
	Source string  `json:"source"` // "heartbeat" (<pair>.hb.<site>) or "register" (<pair>.leader)
	// RulesRev is the <pair>.config revision whose rules the member
	// applies (0: its pair file's); RejectedRev the latest it refused.
	RulesRev    uint64 `json:"rules_rev"`
	RejectedRev uint64 `json:"rejected_rev,omitempty"`
	// Node (leadership: node) is the member's node, whose liveness record
	// repeats this heartbeat (which is written only when it changes);
	// NodeAge the age of that record's latest write.
	Node    string   `json:"node,omitempty"`
	NodeAge *float64 `json:"node_beat_age_s,omitempty"`
	// DB is the member's database as its latest check found it (nil: the
	// workload reports no positions).
	DB *DBStatus `json:"db,omitempty"`
}

// DBStatus is a member's database in status: role and timeline; the
// leader's flushed position and whether its commits wait for the other
// member (from the register); a standby's received and replayed positions,
// whether it streams, and its lag behind the leader's published flush.
type DBStatus struct {
	Role        string  `json:"role"`
	Timeline    uint32  `json:"timeline,omitempty"`
	Flush       string  `json:"flush_lsn,omitempty"`
	Synchronous *bool   `json:"synchronous,omitempty"`
	Receive     string  `json:"receive_lsn,omitempty"`
	Replay      string  `json:"replay_lsn,omitempty"`
	Streaming   bool    `json:"streaming,omitempty"`
	LagBytes    *uint64 `json:"lag_bytes,omitempty"`
	Rejoined    string  `json:"following,omitempty"`
}

// RulesStatus are the rules in <pair>.config, at revision Rev.
type RulesStatus struct {
	// Rev is the revision of <pair>.config; 0 when the pair has none yet
	// and the rules shown are its members' pair file's (Key says where
	// they were published).
	Rev uint64 `json:"rev"`
	Key string `json:"key"`
	rulesJSON
}

func newStatusCmd(stdout io.Writer) *cobra.Command {
	var nf natsFlags
	var pair string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show each pair's leader, term, heartbeat ages (server time) and rules",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			nc, kv, err := nf.connect(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			pairs, err := pairsIn(ctx, nc, nf.bucket, pair)
			if err != nil {
				return err
			}
			if len(pairs) == 0 {
				if pair != "" {
					return fmt.Errorf("pair %q has no leadership register in bucket %s", pair, nf.bucket)
				}
				return fmt.Errorf("no pair in bucket %s yet", nf.bucket)
			}
			now, err := serverTime(ctx, nc, nf.bucket)
			if err != nil {
				return err
			}
			var out []PairStatus
			lives := map[string]*NodeLiveStatus{} // each node's record read once
			for _, p := range pairs {
				st, err := pairStatusWith(ctx, kv, p, now, lives)
				if err != nil {
					return err
				}
				out = append(out, st)
			}
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			for _, st := range out {
				printStatus(stdout, st)
			}
			return nil
		},
	}
	nf.add(cmd)
	cmd.Flags().StringVar(&pair, "pair", "", "show only this pair")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// serverTime is the NATS server's current time, read from the bucket's
// stream info (a read: status needs no write permission), so ages do not
// depend on this machine's clock.
func serverTime(ctx context.Context, nc *nats.Conn, bucket string) (time.Time, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return time.Time{}, err
	}
	st, err := js.Stream(ctx, events.KVStream(bucket))
	if err != nil {
		return time.Time{}, fmt.Errorf("bucket %s: %w", bucket, err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("bucket %s: stream info: %w", bucket, err)
	}
	if info.TimeStamp.IsZero() {
		return time.Time{}, fmt.Errorf("bucket %s: the server's stream info carries no timestamp (NATS server older than 2.10?)", bucket)
	}
	return info.TimeStamp.UTC(), nil
}

// getAttempt bounds one direct read of a key: a direct get that reaches
// a stream while its leadership moves goes unanswered, and nats.go would
// wait its whole default timeout (5 s) for it.
const getAttempt = 1500 * time.Millisecond

// retryGet runs get with a getAttempt deadline each time until it succeeds,
// fails otherwise than by timing out, or ctx is done.
func retryGet(ctx context.Context, get func(ctx context.Context) error) error {
	for {
		actx, cancel := context.WithTimeout(ctx, getAttempt)
		err := get(actx)
		cancel()
		timedOut := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
		if err == nil || !timedOut || ctx.Err() != nil {
			return err
		}
	}
}

// retryingKV is a KV whose Get retries reads that time out (retryGet).
type retryingKV struct{ events.KV }

func (k retryingKV) Get(ctx context.Context, key string) (events.Entry, error) {
	var e events.Entry
	err := retryGet(ctx, func(ctx context.Context) error {
		var err error
		e, err = k.KV.Get(ctx, key)
		return err
	})
	return e, err
}

// pairsIn lists the pairs with a leadership register (or only want).
func pairsIn(ctx context.Context, nc *nats.Conn, bucket, want string) ([]string, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, err
	}
	if want != "" {
		// One pair: read its keys directly rather than list the bucket
		// (a listing is a consumer, which needs the meta leader).
		for _, key := range []string{failover.LeaderKey(want), failover.ConfigKey(want)} {
			err := retryGet(ctx, func(ctx context.Context) error { _, err := kv.Get(ctx, key); return err })
			if err == nil {
				return []string{want}, nil
			}
		}
	}
	lister, err := kv.ListKeysFiltered(ctx, "*.leader", "*.config", "*.rules.*")
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for k := range lister.Keys() {
		p := k[:strings.LastIndexByte(k, '.')]
		if q, ok := strings.CutSuffix(p, ".rules"); ok {
			p = q
		}
		if want == "" || p == want {
			seen[p] = true
		}
	}
	names := make([]string, 0, len(seen))
	for p := range seen {
		names = append(names, p)
	}
	slices.Sort(names)
	return names, nil
}

func pairStatus(ctx context.Context, kv events.KV, pair string, now time.Time) (PairStatus, error) {
	return pairStatusWith(ctx, kv, pair, now, map[string]*NodeLiveStatus{})
}

// nodeLive reads node's liveness record directly (a read, never a listing
// or a watch: status answers at once whatever the bucket holds), once per
// status run (lives keeps what was read; nil for a record that is absent).
func nodeLive(ctx context.Context, kv events.KV, node string, now time.Time, lives map[string]*NodeLiveStatus) *NodeLiveStatus {
	if l, ok := lives[node]; ok {
		return l
	}
	var out *NodeLiveStatus
	if e, err := kv.Get(ctx, failover.LivenessKey(node)); err == nil {
		out = &NodeLiveStatus{Node: node, Rev: e.Revision, Age: now.Sub(e.Time).Seconds()}
		if l, err := failover.DecodeLiveness(e.Value); err != nil {
			out.Error = err.Error()
		} else {
			out.Epoch, out.Beat, out.By = l.Epoch, l.Beat, l.By
			if out.By == "" {
				out.By = node
			}
		}
	}
	lives[node] = out
	return out
}

func pairStatusWith(ctx context.Context, kv events.KV, pair string, now time.Time, lives map[string]*NodeLiveStatus) (PairStatus, error) {
	kv = retryingKV{kv}
	st := PairStatus{Pair: pair, Heartbeats: map[string]SiteStatus{}, ServerTime: now}
	var leaderValue failover.Leader
	if e, err := kv.Get(ctx, failover.LeaderKey(pair)); err == nil {
		le, err := failover.LeaderEntryOf(e, 0)
		if err != nil {
			hist, _ := kv.History(ctx, e.Key)
			le, _ = failover.LeaderEntryOf(e, failover.HighestTerm(hist))
			st.Corrupt = err.Error()
		}
		l := le.Value
		st.Leader, st.Term, st.Fenced, st.Handoff = l.Site, l.Term, l.Fenced, l.Handoff
		st.LeaderAge = now.Sub(e.Time).Seconds()
		leaderValue = l
		if l.Node != "" && l.Site != "" {
			ls := &LeaseStatus{Node: l.Node, Epoch: l.Epoch, Live: nodeLive(ctx, kv, l.Node, now, lives)}
			ls.Current = ls.Live != nil && ls.Live.Error == "" && ls.Live.Epoch == l.Epoch && ls.Live.By == l.Node
			st.Lease = ls
		}
	} else if !errors.Is(err, events.ErrNotFound) {
		return st, err
	}
	var members []string
	if r, e, err := readRulesFor(ctx, kv, pair, leaderValue.Site, leaderValue.By, leaderValue.Handoff); err == nil {
		rs := &RulesStatus{Rev: e.Revision, Key: e.Key, rulesJSON: rulesOf(r)}
		if e.Key != failover.ConfigKey(pair) {
			rs.Rev = 0 // the pair file's rules, which members report as revision 0
		}
		st.Rules = rs
		members = []string{r.Primary, r.Replica}
	}
	// Members' own heartbeats, whether or not the rules are known: with
	// the rules, the two members' keys are read directly (no consumer,
	// which needs the JetStream meta leader and waits for its election
	// after a site's loss); without, every heartbeat key is watched.
	var hbs []events.Entry
	if members != nil {
		for _, site := range members {
			e, err := kv.Get(ctx, failover.HeartbeatKey(pair, site))
			switch {
			case err == nil:
				hbs = append(hbs, e)
			case !errors.Is(err, events.ErrNotFound):
				return st, err
			}
		}
	} else {
		w, err := kv.Watch(ctx, pair+".hb.*", events.WatchOptions{})
		if err != nil {
			return st, err
		}
		for e := range w.Updates() {
			if e.Revision == 0 {
				break
			}
			hbs = append(hbs, e)
		}
		w.Stop()
	}
	for _, e := range hbs {
		if e.Op != events.OpPut {
			continue
		}
		if h, err := failover.DecodeHeartbeat(e.Value); err == nil {
			ss := SiteStatus{Phase: h.Phase.String(), Ready: h.Ready, Age: now.Sub(e.Time).Seconds(),
				Source: "heartbeat", RulesRev: h.RulesRev, RejectedRev: h.RejectedRev, Node: h.Node}
			if h.Node != "" {
				if l := nodeLive(ctx, kv, h.Node, now, lives); l != nil {
					ss.NodeAge = &l.Age
				}
			}
			if h.Role != 0 {
				ss.DB = &DBStatus{Role: h.Role.String(), Timeline: h.Timeline, Streaming: h.Streaming, Rejoined: h.Rejoined}
				if h.Receive != 0 {
					ss.DB.Receive = h.Receive.String()
				}
				if h.Replay != 0 {
					ss.DB.Replay = h.Replay.String()
				}
			}
			// The key names the site, never the value (NATS permissions guard keys).
			if site := failover.HeartbeatSite(pair, e.Key); site != "" {
				st.Heartbeats[site] = ss
			}
		}
	}
	if st.Leader != "" {
		// The holder's own heartbeat key stops when it leads: its
		// heartbeat is the register.
		h := st.Heartbeats[st.Leader]
		h.Phase, h.Ready, h.Age, h.Source = "leader", false, st.LeaderAge, "register"
		if ls := st.Lease; ls != nil {
			h.Source, h.Node, h.NodeAge = "liveness", ls.Node, nil
			if ls.Live != nil {
				h.Age, h.NodeAge = ls.Live.Age, &ls.Live.Age
			}
		}
		if st.Fenced {
			h.Phase = "leader (fenced)"
		}
		if l := leaderValue; l.Flush != 0 {
			sync := l.Sync
			h.DB = &DBStatus{Role: "primary", Timeline: l.Timeline, Flush: l.Flush.String(), Synchronous: &sync}
		} else {
			h.DB = nil // its own last heartbeat's, from before it led
		}
		st.Heartbeats[st.Leader] = h
		// A standby's lag behind what the leader last published.
		for s, f := range st.Heartbeats {
			if s == st.Leader || f.DB == nil || leaderValue.Flush == 0 {
				continue
			}
			pos, _ := capability.ParseLSN(f.DB.Receive)
			lag := capability.Lag(leaderValue.Flush, pos)
			f.DB.LagBytes = &lag
		}
	}
	st.Pause = pauseStatus(ctx, kv, pair)
	return st, nil
}

func printStatus(w io.Writer, st PairStatus) {
	leader := st.Leader
	switch {
	case st.Corrupt != "":
		leader = "none (" + st.Corrupt + "; the members replace it)"
	case leader == "" && st.Handoff != "":
		leader = "none (handing off to " + st.Handoff + ")"
	case leader == "":
		leader = "none"
	case st.Fenced:
		leader += " (fenced)"
	}
	fmt.Fprintf(w, "pair %s\n  leader   %s, term %d, last register write %.1fs ago\n", st.Pair, leader, st.Term, st.LeaderAge)
	if ls := st.Lease; ls != nil {
		fmt.Fprintf(w, "  lease    node %s, epoch %d: %s\n", ls.Node, ls.Epoch, describeLease(ls))
	}
	printPause(w, st.Pause)
	sites := make([]string, 0, len(st.Heartbeats))
	for s := range st.Heartbeats {
		sites = append(sites, s)
	}
	slices.Sort(sites)
	for _, s := range sites {
		h := st.Heartbeats[s]
		rules := ""
		if r := st.Rules; r != nil && h.Source == "heartbeat" {
			switch {
			case h.RejectedRev == r.Rev:
				rules = fmt.Sprintf(", REFUSED rules rev %d (applies rev %d)", r.Rev, h.RulesRev)
			case h.RulesRev != r.Rev && h.Source == "heartbeat":
				rules = fmt.Sprintf(", applies rules rev %d (not yet %d)", h.RulesRev, r.Rev)
			}
		}
		switch {
		case h.Source == "liveness" && h.NodeAge != nil:
			fmt.Fprintf(w, "  %-8s %s, beats through node %s's liveness (%.1fs ago)%s\n", s, h.Phase, h.Node, *h.NodeAge, rules)
		case h.Source == "liveness":
			fmt.Fprintf(w, "  %-8s %s, beats through node %s's liveness (no record)%s\n", s, h.Phase, h.Node, rules)
		case h.Source == "register":
			fmt.Fprintf(w, "  %-8s %s, beats through the register (%.1fs ago)%s\n", s, h.Phase, h.Age, rules)
		case h.Node != "":
			node := fmt.Sprintf("node %s has no liveness record", h.Node)
			if h.NodeAge != nil {
				node = fmt.Sprintf("node %s beat %.1fs ago", h.Node, *h.NodeAge)
			}
			fmt.Fprintf(w, "  %-8s phase %s, ready %v (heartbeat written %.1fs ago, on change); %s%s\n", s, h.Phase, h.Ready, h.Age, node, rules)
		default:
			fmt.Fprintf(w, "  %-8s own heartbeat %.1fs ago, phase %s, ready %v%s\n", s, h.Age, h.Phase, h.Ready, rules)
		}
		if d := h.DB; d != nil {
			fmt.Fprintf(w, "  %-8s database %s%s\n", "", d.Role, describeDB(d))
		}
	}
	if r := st.Rules; r != nil {
		if r.Rev == 0 {
			fmt.Fprintf(w, "  rules    the members' pair file (%s; no %s written by an operator)\n", r.Key, failover.ConfigKey(st.Pair))
		}
		fmt.Fprintf(w, "  rules    rev %d: primary %s, replica %s, heartbeat_timeout %gs, failure_threshold %d, success_threshold %d, failover_timeout %gs, fence_grace %gs, failback %s\n",
			r.Rev, r.Primary, r.Replica, r.HeartbeatTimeout, r.FailureThreshold, r.SuccessThreshold, r.FailoverTimeout, r.FenceGrace, r.Failback)
	}
}

// describeLease says whether a lease holds, from its node's liveness.
func describeLease(ls *LeaseStatus) string {
	l := ls.Live
	switch {
	case l == nil:
		return fmt.Sprintf("node %s has no liveness record (not readable, or deleted)", ls.Node)
	case l.Error != "":
		return fmt.Sprintf("node %s's liveness record does not decode: %s", ls.Node, l.Error)
	case ls.Current:
		return fmt.Sprintf("current; node %s beat %.1fs ago (beat %d)", ls.Node, l.Age, l.Beat)
	case l.Epoch > ls.Epoch && l.By != ls.Node:
		return fmt.Sprintf("OVER: node %s's epoch was raised to %d by %s %.1fs ago (its pairs are taken over)", ls.Node, l.Epoch, l.By, l.Age)
	case l.Epoch > ls.Epoch:
		return fmt.Sprintf("OVER: node %s beats in epoch %d now (%.1fs ago); the holder fences", ls.Node, l.Epoch, l.Age)
	}
	return fmt.Sprintf("node %s's record says epoch %d, written by %s %.1fs ago", ls.Node, l.Epoch, l.By, l.Age)
}

// describeDB is the rest of a database line of status.
func describeDB(d *DBStatus) string {
	var b strings.Builder
	if d.Timeline != 0 {
		fmt.Fprintf(&b, ", timeline %d", d.Timeline)
	}
	if d.Flush != "" {
		fmt.Fprintf(&b, ", flushed %s", d.Flush)
	}
	if d.Synchronous != nil {
		if *d.Synchronous {
			b.WriteString(", commits wait for the replica (synchronous)")
		} else {
			b.WriteString(", asynchronous")
		}
	}
	if d.Receive != "" {
		fmt.Fprintf(&b, ", received %s", d.Receive)
	}
	if d.Replay != "" {
		fmt.Fprintf(&b, ", replayed %s", d.Replay)
	}
	if d.Role == "standby" {
		if d.Streaming {
			b.WriteString(", streaming")
		} else {
			b.WriteString(", NOT streaming")
		}
		if d.Rejoined != "" {
			fmt.Fprintf(&b, " (follows %s)", d.Rejoined)
		}
	}
	if d.LagBytes != nil {
		fmt.Fprintf(&b, ", lag %s", humanize.IBytes(*d.LagBytes))
	}
	return b.String()
}

func newSwitchoverCmd(stdout io.Writer) *cobra.Command {
	var nf natsFlags
	var pair, to string
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "switchover --pair P --to SITE",
		Short: "Move leadership of a pair to SITE through the clean-demotion handshake",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), wait+10*time.Second)
			defer cancel()
			nc, kv, err := nf.pairTarget(ctx, cmd, pair, to)
			if err != nil {
				return err
			}
			defer nc.Close()
			if e, err := kv.Get(ctx, failover.LeaderKey(pair)); err == nil {
				if l, err := failover.DecodeLeader(e.Value); err == nil && l.Site == to && !l.Fenced {
					fmt.Fprintf(stdout, "%s already leads pair %s (term %d)\n", to, pair, l.Term)
					return nil
				}
			}
			var idb [8]byte
			_, _ = rand.Read(idb[:])
			req := failover.Switchover{ID: hex.EncodeToString(idb[:]), To: to, Requested: time.Now().UTC()}
			if _, err := kv.Put(ctx, failover.SwitchoverKey(pair), failover.EncodeSwitchover(req)); err != nil {
				return fmt.Errorf("write switchover request: %w", err)
			}
			fmt.Fprintf(stdout, "switchover %s requested: pair %s to %s; waiting up to %v\n", req.ID, pair, to, wait)
			w, err := kv.Watch(ctx, failover.LeaderKey(pair), events.WatchOptions{})
			if err != nil {
				return err
			}
			defer w.Stop()
			rejected := watchSwitchoverRejection(ctx, nc, pair, req)
			deadline := time.After(wait)
			for {
				select {
				case r := <-rejected:
					return fmt.Errorf("switchover %s refused by the leader: %s (it keeps leading pair %s)", req.ID, r.Reason, pair)
				case e, ok := <-w.Updates():
					if !ok {
						return errors.New("watch of the leadership register ended")
					}
					if e.Revision == 0 {
						continue
					}
					l, err := failover.DecodeLeader(e.Value)
					if err != nil {
						continue
					}
					if l.Site == to && !l.Fenced {
						fmt.Fprintf(stdout, "%s now holds the register of pair %s (term %d)\n", to, pair, l.Term)
						return nil
					}
				case <-deadline:
					return fmt.Errorf("%s does not hold the register of pair %s after %v; is a leader serving? see 'understudy status --pair %s'", to, pair, wait, pair)
				}
			}
		},
	}
	nf.add(cmd)
	cmd.Flags().StringVar(&pair, "pair", "", "the pair")
	cmd.Flags().StringVar(&to, "to", "", "the site that should lead")
	cmd.Flags().DurationVar(&wait, "wait", 30*time.Second, "how long to wait for the new leader")
	return cmd
}
