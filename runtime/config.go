package runtime

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"

	"understudy/actors"
	"understudy/actors/agent"
	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/actors/resources"
	"understudy/actors/resources/libvirt"
	"understudy/actors/resources/libvirt/rules"
	"understudy/events"
)

// Defaults of a node's configuration; [DefaultConfig] fills them in.
const (
	DefaultNATSListen     = "127.0.0.1:4222"
	DefaultHTTPAddr       = "127.0.0.1:9464"
	DefaultFailoverBucket = events.DefaultFailoverBucket
	DefaultFleetBucket    = events.DefaultFleetBucket
	DefaultEventsStream   = events.DefaultEventsStream

	// DefaultExternalReplicas is the replica count of the assets on an
	// external NATS cluster when none is configured.
	DefaultExternalReplicas = 3

	// MaxReplicas is the largest replica count JetStream accepts.
	MaxReplicas = 5

	DefaultRetryInitial = 250 * time.Millisecond
	DefaultRetryMax     = 30 * time.Second
)

// Config is a node's configuration as the operator writes it: CLI flags and
// the YAML node file both fill this one struct. Start from [DefaultConfig]
// (unmarshal a file onto it so absent keys keep their defaults) and call
// [Config.Validate] once, at load; [Serve] validates again and uses only the
// typed values validation produces, never these strings.
type Config struct {
	// DataDir holds the embedded server's JetStream store. Unused with NATS.URL.
	DataDir string       `yaml:"data_dir"`
	NATS    NATSConfig   `yaml:"nats"`
	Assets  AssetsConfig `yaml:"assets"`
	// HTTP is the host:port of /healthz and /metrics; port 0 picks a free one.
	HTTP string    `yaml:"http"`
	Log  LogConfig `yaml:"log"`
	// Pprof, when set, is the host:port of Go's profiler
	// (/debug/pprof/, net/http/pprof) on a listener of its own: for
	// finding where a node's CPU goes. Off by default; bind it to
	// loopback, never to the load balancers' network.
	Pprof string `yaml:"pprof"`

	// Node is this node's name: the site as which it runs pair members
	// whose entry names no member.
	Node string `yaml:"node"`
	// Pairs are the failover pair members this node hosts.
	Pairs []PairMember `yaml:"pairs"`
	// Leadership is how the node's pairs keep leadership: "node" (one
	// liveness record per node, heartbeated once per heartbeat_timeout
	// whatever the number of pairs; a register names its holder's node and
	// epoch) or "per-pair" (every member heartbeats its own pair's keys).
	// Empty: DefaultLeadership. docs/failover.md explains both.
	Leadership string `yaml:"leadership"`
	// Agent, when set, runs this node's agent: it converges to the
	// manifest at desired-state.<id> of the fleet bucket.
	Agent *AgentSection `yaml:"agent"`
	// Security, when set, names the deployment's identities and what each
	// may do (docs/security.md); understudy init writes it.
	Security *SecuritySection `yaml:"security"`
	// Libvirt says where understudy-libvirt is: the process that runs
	// every libvirt call of this node, for the agent and the pairs alike.
	Libvirt LibvirtSection `yaml:"libvirt"`
	// BaseDir resolves relative pair file paths: the node file's directory.
	BaseDir string `yaml:"-"`

	// Logger, when set, receives every log line and Log is only validated.
	// It is how tests and embedding programs capture the logs.
	Logger *slog.Logger `yaml:"-"`
	// LogOutput is where lines formatted per Log go when Logger is nil;
	// os.Stderr when nil.
	LogOutput io.Writer `yaml:"-"`
}

// NATSConfig chooses between the embedded server (URL empty) and an external
// NATS (URL set), and holds the external connection's credentials and TLS.
type NATSConfig struct {
	// Listen is the embedded server's client host:port; port 0 or -1 picks a
	// free one.
	Listen string `yaml:"listen"`

	// URL is one or more comma-separated nats:// or tls:// URLs of an
	// external NATS; when set, no server is embedded.
	URL      string `yaml:"url"`
	User     string `yaml:"user"`
	Password string `yaml:"password"`
	// Creds is a .creds file (user JWT and nkey seed); excludes User/Password.
	Creds string `yaml:"creds"`
	// NKey is a file holding this node's nkey seed (a user seed, "SU..."):
	// the node's NATS identity for every connection it makes (to its own
	// embedded server or an external NATS), and the key it signs its
	// register and heartbeat values with. understudy init writes it.
	// Excludes User/Password and Creds.
	NKey string    `yaml:"nkey"`
	TLS  TLSConfig `yaml:"tls"`

	// Server secures and clusters the embedded server (unused with URL).
	Server ServerSection `yaml:"server"`

	// Retry paces connection attempts while NATS is unreachable at start.
	Retry RetryConfig `yaml:"retry"`
}

// ServerSection is the embedded server's own side: its name, the TLS of
// its client port and its cluster with the other sites' servers.
type ServerSection struct {
	// Name is the server's name in the cluster and in JetStream placement
	// (default: the node's name).
	Name string `yaml:"name"`
	// TLS of the client port: the server presents Cert/Key and requires
	// every client to present a certificate signed by CA.
	TLS ServerTLS `yaml:"tls"`
	// Cluster, when set, makes the embedded server a member of a NATS
	// cluster with the other sites' servers (JetStream assets at R3).
	Cluster *ClusterSection `yaml:"cluster"`
}

// ServerTLS is a server side of TLS: its certificate and the CA its peers'
// (clients' or routes') certificates must be signed by.
type ServerTLS struct {
	CA   string `yaml:"ca"`
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

// ClusterSection makes the embedded server one member of a NATS cluster.
type ClusterSection struct {
	Name   string   `yaml:"name"`   // the cluster's name, the same on every site
	Listen string   `yaml:"listen"` // host:port of this server's route listener
	Routes []string `yaml:"routes"` // the other sites' route URLs (tls://host:port)
	// TLS of the routes: mutual, required when Listen is not loopback.
	TLS ServerTLS `yaml:"tls"`
}

// SecuritySection lists the identities of a deployment: the same in every
// node file (understudy init writes it). With it, the embedded server
// accepts only these identities, each with its own permissions; the
// members verify the signatures of register values; the agent runs only
// manifests signed by a ManifestKeys key.
type SecuritySection struct {
	// Nodes are the node identities by node name.
	Nodes map[string]NodeIdentity `yaml:"nodes"`
	// Operators may change rules, request switchovers, failovers and
	// pauses, and write desired state (public user nkeys, "U...").
	Operators []string `yaml:"operators"`
	// Readers may only read: status, export, replay (public user nkeys).
	Readers []string `yaml:"readers"`
	// Admins may read and change the assets' settings (a stream update),
	// which an operator may not: an update can republish into any
	// subject or shorten a stream's history to nothing (public user
	// nkeys). Kept offline, used for the rare change of replicas or limits.
	Admins []string `yaml:"admins"`
	// ManifestKeys are the public keys ("O..." operator nkeys) whose
	// signatures make a manifest runnable by this node's agent.
	ManifestKeys []string `yaml:"manifest_keys"`
}

// NodeIdentity is one node's NATS identity and what it may write.
type NodeIdentity struct {
	NKey string `yaml:"nkey"` // public user nkey ("U...")
	// Pairs are the pairs this node hosts a member of; it may write their
	// register and its sites' heartbeats of them, and nothing of others.
	Pairs []string `yaml:"pairs"`
	// Sites are the member sites it runs (default: the node's name).
	Sites []string `yaml:"sites"`
	// Agent is its agent's id (default: the node's name); "-" for none.
	Agent string `yaml:"agent"`
	// CertSHA256 pins the certificate its routes present: the hex SHA-256
	// of its SubjectPublicKeyInfo (CertSHA256). In a cluster the servers
	// accept as routes only the pinned certificates: another certificate
	// of the same CA (a removed node's, one issued by mistake) is no route.
	CertSHA256 string `yaml:"cert_sha256"`
}

// TLSConfig is the client side of TLS to an external NATS.
type TLSConfig struct {
	CA         string `yaml:"ca"`   // PEM bundle of the CAs to trust; system roots when empty
	Cert       string `yaml:"cert"` // client certificate (PEM), with Key
	Key        string `yaml:"key"`  // client private key (PEM), with Cert
	ServerName string `yaml:"server_name"`
	// Insecure skips verification of the server's certificate. For tests
	// only: it is logged as a warning.
	Insecure bool `yaml:"insecure"`
}

// RetryConfig is a capped exponential backoff: delays start at Initial,
// double per attempt up to Max, and are jittered.
type RetryConfig struct {
	Initial time.Duration `yaml:"initial"`
	Max     time.Duration `yaml:"max"`
}

// AssetsConfig names the JetStream assets and sets their replica count.
type AssetsConfig struct {
	// Replicas of every asset; 0 picks 1 with the embedded server and
	// DefaultExternalReplicas with an external NATS.
	Replicas       int    `yaml:"replicas"`
	FailoverBucket string `yaml:"failover_bucket"`
	FleetBucket    string `yaml:"fleet_bucket"`
	EventsStream   string `yaml:"events_stream"`
	// PreferredLeader is the name of the NATS server (server_name) that
	// should lead the assets' streams: the witness site's. The node moves
	// the stream leaders back to it whenever they are elsewhere and it is
	// a current replica, so that losing a pair's site never waits for a
	// JetStream leader election. Only with nats.url and replicas > 1.
	PreferredLeader string `yaml:"preferred_leader"`
}

// LogConfig sets the log level (debug, info, warn, error) and format (text, json).
type LogConfig struct {
	Level  string `yaml:"level"`
	Format string `yaml:"format"`
}

// DefaultConfig returns a configuration for an embedded single node with the
// default data directory ([DefaultDataDir]).
func DefaultConfig() Config {
	return Config{
		DataDir: DefaultDataDir(),
		NATS: NATSConfig{
			Listen: DefaultNATSListen,
			Retry:  RetryConfig{Initial: DefaultRetryInitial, Max: DefaultRetryMax},
		},
		Assets: AssetsConfig{
			FailoverBucket: DefaultFailoverBucket,
			FleetBucket:    DefaultFleetBucket,
			EventsStream:   DefaultEventsStream,
		},
		HTTP: DefaultHTTPAddr,
		Log:  LogConfig{Level: "info", Format: "text"},
	}
}

// DefaultDataDir is $XDG_STATE_HOME/understudy, or ~/.local/state/understudy
// when XDG_STATE_HOME is unset; "" when neither can be determined.
func DefaultDataDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "understudy")
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		return ""
	}
	return filepath.Join(home, ".local", "state", "understudy")
}

// ConfigError is the module's one configuration error type: Field is the
// value's path in the YAML node file (the CLI maps it to its flag).
type ConfigError = actors.ConfigError

// LogFormat is the encoding of log lines.
type LogFormat int

const (
	LogText LogFormat = iota + 1 // logfmt-style key=value
	LogJSON                      // one JSON object per line
)

func (f LogFormat) String() string {
	switch f {
	case LogText:
		return "text"
	case LogJSON:
		return "json"
	}
	return "LogFormat(" + strconv.Itoa(int(f)) + ")"
}

// Leadership is how a node's pairs keep leadership (the node file's
// leadership): failover.Leadership.
type Leadership = failover.Leadership

const (
	LeadershipPerPair = failover.LeadershipPerPair
	LeadershipNode    = failover.LeadershipNode
)

// DefaultLeadership is the leadership of a node file without the key.
const DefaultLeadership = LeadershipPerPair

// ParseLeadership reads the node file's leadership ("" is
// DefaultLeadership).
func ParseLeadership(s string) (Leadership, error) {
	if strings.TrimSpace(s) == "" {
		return DefaultLeadership, nil
	}
	return failover.ParseLeadership(s)
}

// settings are a Config's typed values, produced only by Config.resolve.
type settings struct {
	embedded bool

	dataDir    string
	listenHost string
	listenPort int // -1: any free port

	urls        string // as given, comma-separated; for nats.Connect
	user        string
	password    string
	creds       string
	tls         *tls.Config // nil: no TLS options given
	tlsInsecure bool
	retry       RetryConfig

	replicas        int
	failoverBucket  string
	fleetBucket     string
	eventsStream    string
	preferredLeader string // "": leaders stay where JetStream puts them

	// deadAfter is how soon a silent NATS server is given up: the
	// smallest heartbeat_timeout of the members, else DefaultDeadAfter.
	deadAfter time.Duration

	httpAddr  string
	pprofAddr string
	logLevel  slog.Level
	logFormat LogFormat

	// node is this node's name (Config.Node).
	node string
	// nkeyFile is the node's nkey seed file (nats.nkey), checked at load
	// to hold a user seed; "" when none is configured.
	nkeyFile string
	// nkeyPublic is the public key of nkeyFile's seed.
	nkeyPublic string
	// server is the embedded server's name, TLS and cluster.
	server serverSettings
	// security is the deployment's identities (Config.Security), checked
	// at load; nil when the deployment runs without (loopback development).
	// Kept, not copied: read only.
	security *SecuritySection

	members []MemberConfig
	// leadership is the node file's leadership (never zero).
	leadership Leadership
	agent      *AgentConfig
	// libvirtDriver is where understudy-libvirt is, for the agent's kinds
	// and the members' libvirt steps alike: resolved at load (libvirt.driver,
	// else FindDriver) when the agent or a libvirt step may need it, else
	// zero (looked up at the first start, if any).
	libvirtDriver libvirt.DriverConfig
}

// LibvirtSection is the node file's libvirt section.
type LibvirtSection struct {
	// Driver is the understudy-libvirt executable (an absolute path),
	// which runs every libvirt call of this node: the agent's vm and
	// network kinds, and the libvirt steps of its pairs' procedures.
	// Default: next to understudy, else in PATH. When the node runs an
	// agent or a libvirt step, it must be found at load.
	Driver string `yaml:"driver"`
}

// AgentSection is the node file's agent section.
type AgentSection struct {
	ID              string `yaml:"id"`               // default: node
	ObserveInterval string `yaml:"observe_interval"` // default 30s
	CallTimeout     string `yaml:"call_timeout"`     // default 15m: bounds each observe, reconcile, delete
	AllowShellJobs  bool   `yaml:"allow_shell_jobs"` // default false
	LibvirtURI      string `yaml:"libvirt_uri"`      // default qemu:///system
	// LibvirtDriver is refused: the setting moved to the node-wide
	// libvirt.driver (the pairs' libvirt steps use it too). Read only to
	// say so.
	LibvirtDriver string `yaml:"libvirt_driver"`
	// Container configures podman for the container kind (podman's own
	// defaults when absent).
	Container *ContainerSection `yaml:"container"`
	// StateDir is where the agent remembers what it runs across its own
	// crashes (default: data_dir/agent/<id>, this node's own).
	StateDir string `yaml:"state_dir"`
}

// ContainerSection is the node file's agent.container: how the agent runs
// podman. On machines without CAP_SYS_RESOURCE and with hybrid cgroups,
// podman's default runtime cannot start containers; runtime: runc with
// ulimits [nofile=1024:1024, nproc=1024:1024] can (docs/agents.md).
type ContainerSection struct {
	Podman     string            `yaml:"podman"`      // the binary; default podman in PATH
	GlobalArgs []string          `yaml:"global_args"` // before every subcommand (--root, --storage-driver, ...)
	Runtime    string            `yaml:"runtime"`     // OCI runtime: runc, crun or a path
	Cgroups    string            `yaml:"cgroups"`     // podman run --cgroups
	Ulimits    []string          `yaml:"ulimits"`     // podman run --ulimit, every container
	Env        map[string]string `yaml:"env"`         // added to podman's environment
}

// Validate checks every value and returns all the broken rules at once, as
// *ConfigError values joined with errors.Join (use errors.As to get one).
// It reads the TLS and credentials files, so it reports missing or malformed
// ones too.
func (c Config) Validate() error {
	_, err := c.resolve()
	return err
}

var (
	// bucket and stream names as JetStream accepts them.
	assetNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	// NATS server names: nats-server refuses spaces in server_name.
	serverNameRE = regexp.MustCompile(`^\S+$`)
)

func (c Config) resolve() (settings, error) {
	var errs []error
	bad := func(field, rule, value string) {
		errs = append(errs, &ConfigError{Field: field, Rule: rule, Value: value})
	}
	s := settings{
		embedded:       strings.TrimSpace(c.NATS.URL) == "",
		urls:           strings.TrimSpace(c.NATS.URL),
		user:           c.NATS.User,
		password:       c.NATS.Password,
		creds:          c.NATS.Creds,
		retry:          c.NATS.Retry,
		failoverBucket: c.Assets.FailoverBucket,
		fleetBucket:    c.Assets.FleetBucket,
		eventsStream:   c.Assets.EventsStream,
		node:           c.Node,
		nkeyFile:       c.NATS.NKey,
		security:       c.Security,
	}

	if s.embedded {
		if c.DataDir == "" {
			bad("data_dir", "must be set with the embedded server (--data-dir)", c.DataDir)
		} else if abs, err := filepath.Abs(c.DataDir); err != nil {
			bad("data_dir", "must be a usable path: "+err.Error(), c.DataDir)
		} else {
			s.dataDir = abs
		}
		host, port, err := splitListen(c.NATS.Listen, true)
		if err != nil {
			bad("nats.listen", err.Error(), c.NATS.Listen)
		}
		s.listenHost, s.listenPort = host, port
		if port == 0 {
			// nats-server reads port 0 as its default 4222; we mean "any".
			s.listenPort = -1
		}
		for _, f := range []struct{ field, v string }{
			{"nats.user", c.NATS.User}, {"nats.password", c.NATS.Password}, {"nats.creds", c.NATS.Creds},
		} {
			if f.v != "" {
				bad(f.field, "applies only to an external NATS: set nats.url (--nats-url) too; the embedded server authenticates with nats.nkey and the security section", f.v)
			}
		}
		srv, clientTLS, serr := resolveServer(c, host, err == nil)
		errs = append(errs, serr...)
		s.server, s.tls = srv, clientTLS
	} else {
		if c.NATS.Server.Name != "" || c.NATS.Server.TLS != (ServerTLS{}) || c.NATS.Server.Cluster != nil {
			bad("nats.server", "applies only to the embedded server: unset nats.url (--nats-url), or configure the external NATS servers themselves", "")
		}
		for _, u := range strings.Split(s.urls, ",") {
			if err := checkNATSURL(strings.TrimSpace(u)); err != nil {
				bad("nats.url", err.Error(), RedactURLs(u))
			}
		}
		if (c.NATS.User == "") != (c.NATS.Password == "") {
			if c.NATS.User == "" {
				bad("nats.user", "must be set together with nats.password", "")
			} else {
				bad("nats.password", "must be set together with nats.user", "")
			}
		}
		if c.NATS.NKey != "" && (c.NATS.User != "" || c.NATS.Creds != "") {
			bad("nats.nkey", "excludes nats.user/nats.password and nats.creds: choose one way to authenticate", c.NATS.NKey)
		}
		if c.NATS.Creds != "" {
			if c.NATS.User != "" {
				bad("nats.creds", "excludes nats.user/nats.password: choose one way to authenticate", c.NATS.Creds)
			}
			if err := readableFile(c.NATS.Creds); err != nil {
				bad("nats.creds", "must be a readable file: "+err.Error(), c.NATS.Creds)
			} else if err := CheckCreds(c.NATS.Creds); err != nil {
				bad("nats.creds", err.Error(), c.NATS.Creds)
			}
		}
		tc, tlsErrs := c.NATS.TLS.resolve()
		errs = append(errs, tlsErrs...)
		s.tls, s.tlsInsecure = tc, c.NATS.TLS.Insecure
	}

	pub, nerrs := resolveNKey(c.NATS.NKey)
	errs = append(errs, nerrs...)
	s.nkeyPublic = pub

	if s.retry.Initial <= 0 {
		bad("nats.retry.initial", "must be a positive duration", s.retry.Initial.String())
	}
	if s.retry.Max < s.retry.Initial {
		bad("nats.retry.max", "must be at least nats.retry.initial ("+s.retry.Initial.String()+")", s.retry.Max.String())
	}

	clustered := !s.embedded || s.server.cluster != nil
	switch r := c.Assets.Replicas; {
	case r == 0 && !clustered:
		s.replicas = 1
	case r == 0:
		s.replicas = DefaultExternalReplicas
	case r < 1 || r > MaxReplicas:
		bad("assets.replicas", fmt.Sprintf("must be 1..%d (0 picks 1 with a single embedded server, %d in a cluster)", MaxReplicas, DefaultExternalReplicas), strconv.Itoa(r))
	case r > 1 && !clustered:
		bad("assets.replicas", "must be 1 with the embedded server alone, which holds one copy: make it a cluster member (nats.server.cluster), or join a NATS cluster with nats.url (--nats-url), for more", strconv.Itoa(r))
	default:
		s.replicas = r
	}
	names := map[string]string{}
	for _, a := range []struct{ field, name string }{
		{"assets.failover_bucket", s.failoverBucket},
		{"assets.fleet_bucket", s.fleetBucket},
		{"assets.events_stream", s.eventsStream},
	} {
		if !assetNameRE.MatchString(a.name) {
			bad(a.field, "must be a JetStream name: letters, digits, '_' and '-' only", a.name)
		} else if other, dup := names[a.name]; dup {
			bad(a.field, "must differ from "+other, a.name)
		}
		names[a.name] = a.field
	}

	if a := c.Agent; a != nil {
		ac := AgentConfig{ID: a.ID, AllowShellJobs: a.AllowShellJobs, LibvirtURI: rules.DefaultURI}
		if a.LibvirtURI != "" {
			if rule := rules.URI(a.LibvirtURI); rule != "" {
				bad("agent.libvirt_uri", rule, a.LibvirtURI)
			}
			ac.LibvirtURI = a.LibvirtURI
		}
		if a.LibvirtDriver != "" {
			bad("agent.libvirt_driver", "moved to libvirt.driver, which the node's libvirt fence steps use too: write libvirt: {driver: "+a.LibvirtDriver+"} at the top of the node file", a.LibvirtDriver)
		}
		if ac.ID == "" {
			ac.ID = c.Node
		}
		if rule := agent.CheckID(ac.ID); rule != "" {
			bad("agent.id", rule+" (default: node)", ac.ID)
		}
		switch dir := a.StateDir; {
		case dir != "":
			if abs, err := filepath.Abs(dir); err != nil || dir == "/" {
				bad("agent.state_dir", "must be a usable directory path other than /", dir)
			} else {
				ac.StateDir = abs
			}
		case c.DataDir != "":
			if abs, err := filepath.Abs(c.DataDir); err == nil {
				ac.StateDir = filepath.Join(abs, "agent", ac.ID)
			}
		}
		if a.ObserveInterval != "" {
			d, err := time.ParseDuration(a.ObserveInterval)
			if err != nil || d < 100*time.Millisecond || d > 24*time.Hour {
				bad("agent.observe_interval", "must be a duration from 100ms to 24h", a.ObserveInterval)
			}
			ac.ObserveInterval = d
		}
		if a.CallTimeout != "" {
			d, err := time.ParseDuration(a.CallTimeout)
			if err != nil || d < time.Second || d > 24*time.Hour {
				bad("agent.call_timeout", "must be a duration from 1s to 24h", a.CallTimeout)
			}
			ac.CallTimeout = d
		}
		if cs := a.Container; cs != nil {
			pc := resources.PodmanConfig{Binary: cs.Podman, GlobalArgs: cs.GlobalArgs, Runtime: cs.Runtime, Cgroups: cs.Cgroups, Ulimits: cs.Ulimits}
			for _, k := range slices.Sorted(maps.Keys(cs.Env)) {
				pc.Env = append(pc.Env, k+"="+cs.Env[k])
			}
			if err := pc.Validate(); err != nil {
				var ce *ConfigError
				if errors.As(err, &ce) {
					bad("agent.container."+ce.Field, ce.Rule, ce.Value)
				} else {
					bad("agent.container", err.Error(), "")
				}
			}
			ac.Podman = pc
		}
		if sec := c.Security; sec != nil {
			// Each key is checked with the security section; a secured
			// deployment whose agent ran unsigned manifests would let any
			// writer of desired-state run code on the node.
			if len(sec.ManifestKeys) == 0 {
				bad("security.manifest_keys", "required with an agent section: the agent runs only manifests signed by one of these keys (understudy init makes one; docs/agents.md, Signed manifests)", "")
			}
			ac.ManifestKeys = slices.Clone(sec.ManifestKeys)
		}
		s.agent = &ac
	}

	if pl := c.Assets.PreferredLeader; pl != "" {
		switch {
		case !clustered:
			bad("assets.preferred_leader", "applies only to a NATS cluster: set nats.server.cluster, or nats.url (--nats-url)", pl)
		case !serverNameRE.MatchString(pl):
			bad("assets.preferred_leader", "must be a NATS server name (the server_name of a server of the cluster), without spaces", pl)
		case s.replicas == 1:
			bad("assets.preferred_leader", "needs assets.replicas > 1: a stream with one replica has no leader to move", pl)
		}
		s.preferredLeader = pl
	}

	members, perrs := resolvePairs(c.Node, c.Pairs, c.BaseDir)
	errs = append(errs, perrs...)
	s.members = members
	if l, err := ParseLeadership(c.Leadership); err != nil {
		errs = append(errs, err)
	} else {
		s.leadership = l
		if l == LeadershipNode {
			errs = append(errs, checkNodeLeadership(c.Node, members)...)
		}
	}
	s.deadAfter = DefaultDeadAfter
	for i, m := range members {
		if h := m.Rules.HeartbeatTimeout; h > 0 && (i == 0 || h < s.deadAfter) {
			s.deadAfter = h
		}
	}

	// understudy-libvirt: checked at load wherever it can be needed, so
	// that a missing one is not found out by the first fence.
	switch {
	case c.Libvirt.Driver != "":
		if rule := executableRule(c.Libvirt.Driver); rule != "" {
			bad("libvirt.driver", rule, c.Libvirt.Driver)
		}
		s.libvirtDriver.Path = c.Libvirt.Driver
	case c.Agent != nil || usesLibvirt(members):
		p, err := libvirt.FindDriver()
		if err != nil {
			bad("libvirt.driver", err.Error(), "")
		}
		s.libvirtDriver.Path = p
	}
	if s.agent != nil {
		s.agent.LibvirtDriver = s.libvirtDriver
	}

	agentID := ""
	if s.agent != nil {
		agentID = s.agent.ID
	}
	errs = append(errs, resolveSecurity(c, s.nkeyPublic, members, agentID)...)

	if _, _, err := splitListen(c.HTTP, false); err != nil {
		bad("http", err.Error(), c.HTTP)
	}
	s.httpAddr = c.HTTP
	if c.Pprof != "" {
		if _, _, err := splitListen(c.Pprof, false); err != nil {
			bad("pprof", err.Error(), c.Pprof)
		}
		s.pprofAddr = c.Pprof
	}

	if err := s.logLevel.UnmarshalText([]byte(c.Log.Level)); err != nil || !isNamedLevel(c.Log.Level) {
		bad("log.level", "must be one of debug, info, warn, error", c.Log.Level)
	}
	switch strings.ToLower(c.Log.Format) {
	case "text":
		s.logFormat = LogText
	case "json":
		s.logFormat = LogJSON
	default:
		bad("log.format", "must be text or json", c.Log.Format)
	}

	if len(errs) > 0 {
		return settings{}, errors.Join(errs...)
	}
	return s, nil
}

// checkNodeLeadership checks what leadership: node needs of a node file:
// a node name that can name its liveness record, and one heartbeat_timeout
// for all its pairs (one liveness write per heartbeat serves them all).
func checkNodeLeadership(node string, members []MemberConfig) []error {
	var errs []error
	if err := failover.CheckName(node); err != nil {
		errs = append(errs, &ConfigError{Field: "node", Rule: "must be set with leadership: node, and " + err.Error() + ": it names the node's liveness record (" + failover.LivenessKey("<node>") + ")", Value: node})
	}
	if err := checkOneHeartbeat(members, func(i int) string { return "pairs[" + strconv.Itoa(i) + "].heartbeat_timeout" }); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// checkOneHeartbeat refuses pairs whose heartbeat_timeout differ: with
// leadership: node, the node's one liveness write per heartbeat is every
// pair's heartbeat. The error names the field and the pairs that differ;
// field(i) is the field of members[i].
func checkOneHeartbeat(members []MemberConfig, field func(i int) string) error {
	if len(members) == 0 {
		return nil
	}
	first := members[0].Rules
	for i, m := range members[1:] {
		if m.Rules.HeartbeatTimeout != first.HeartbeatTimeout {
			return heartbeatMismatch(field(i+1), first, m.Rules)
		}
	}
	return nil
}

func heartbeatMismatch(field string, a, b failover.Rules) error {
	return &ConfigError{Field: field,
		Rule: fmt.Sprintf("must be the same for every pair of a node with leadership: node (the node's one liveness write per heartbeat is all its pairs' heartbeat): pair %s has %s, pair %s has %s",
			a.Pair, a.HeartbeatTimeout, b.Pair, b.HeartbeatTimeout),
		Value: b.HeartbeatTimeout.String()}
}

func isNamedLevel(s string) bool {
	switch strings.ToLower(s) {
	case "debug", "info", "warn", "error":
		return true
	}
	return false
}

// splitListen parses host:port. Port -1 is accepted only when allowRandom.
func splitListen(addr string, allowRandom bool) (string, int, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, errors.New("must be host:port, e.g. 127.0.0.1:4222")
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port > 65535 || port < -1 || (port == -1 && !allowRandom) {
		if allowRandom {
			return "", 0, errors.New("must be host:port with port 0..65535 (0 or -1: any free port)")
		}
		return "", 0, errors.New("must be host:port with port 0..65535 (0: any free port)")
	}
	return host, port, nil
}

func checkNATSURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return errors.New("must be a URL like nats://host:4222 (comma-separate several)")
	}
	switch u.Scheme {
	case "nats", "tls", "ws", "wss":
		return nil
	}
	return errors.New("must use the scheme nats, tls, ws or wss")
}

// CheckCreds parses a NATS .creds file as the client will at connect: a
// user JWT and a user nkey seed, each between its BEGIN/END lines.
func CheckCreds(path string) error {
	data, err := readBounded(path, 64<<10)
	if err != nil {
		return fmt.Errorf("must be a readable file of at most 64 KiB: %v", err)
	}
	token, err := jwt.ParseDecoratedJWT(data)
	if err == nil {
		_, err = jwt.DecodeUserClaims(token)
	}
	if err != nil {
		return fmt.Errorf("must hold a user JWT (-----BEGIN NATS USER JWT-----): %v", err)
	}
	kp, err := jwt.ParseDecoratedUserNKey(data)
	if err != nil {
		return fmt.Errorf("must hold a user nkey seed (-----BEGIN USER NKEY SEED-----): %v", err)
	}
	kp.Wipe()
	return nil
}

func readableFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	return f.Close()
}

func (t TLSConfig) resolve() (*tls.Config, []error) {
	if t == (TLSConfig{}) {
		return nil, nil
	}
	var errs []error
	bad := func(field, rule, value string) {
		errs = append(errs, &ConfigError{Field: field, Rule: rule, Value: value})
	}
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.Insecure, // opt-in; Serve logs it as a warning
	}
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		pool := x509.NewCertPool()
		switch {
		case err != nil:
			bad("nats.tls.ca", "must be a readable PEM file: "+err.Error(), t.CA)
		case !pool.AppendCertsFromPEM(pem):
			bad("nats.tls.ca", "must contain at least one PEM certificate", t.CA)
		default:
			tc.RootCAs = pool
		}
	}
	switch {
	case t.Cert != "" && t.Key == "":
		bad("nats.tls.key", "must be set together with nats.tls.cert", "")
	case t.Key != "" && t.Cert == "":
		bad("nats.tls.cert", "must be set together with nats.tls.key", "")
	case t.Cert != "":
		pair, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			bad("nats.tls.cert", "must be a PEM certificate matching nats.tls.key: "+err.Error(), t.Cert)
		} else {
			tc.Certificates = []tls.Certificate{pair}
		}
	}
	return tc, errs
}

// RedactURLs hides passwords in a comma-separated URL list, for logs and
// errors: user:xxxxx@ where a URL parses, and everything between the
// scheme and the last @ where it does not.
func RedactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil {
			parts[i] = u.Redacted()
			continue
		}
		if at := strings.LastIndex(p, "@"); at >= 0 {
			if scheme := strings.Index(p, "://"); scheme >= 0 && scheme < at {
				parts[i] = p[:scheme+3] + "xxxxx" + p[at:]
			}
		}
	}
	return strings.Join(parts, ",")
}

// LoadConfigFile reads a YAML node file onto DefaultConfig (absent keys
// keep their defaults; unknown keys are refused). Validate the result.
func LoadConfigFile(path string) (Config, error) {
	c := DefaultConfig()
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("node file: %w", err)
	}
	if err := decodeStrict(data, &c); err != nil {
		return c, fmt.Errorf("node file %s: %w", path, err)
	}
	abs, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return c, fmt.Errorf("node file %s: %w", path, err)
	}
	c.BaseDir = abs
	return c, nil
}

// usesLibvirt reports whether a step of the members' procedures runs
// through libvirt (libvirt-destroy, libvirt-link-down).
func usesLibvirt(members []MemberConfig) bool {
	for _, m := range members {
		p := m.Procedures
		for _, chain := range []procedure.ChainSpec{p.Fence, p.Promote, p.Demote, p.Check} {
			for _, step := range chain.Steps {
				if step.Libvirt != nil || step.Driver == procedure.DriverLibvirtDestroy || step.Driver == procedure.DriverLibvirtLinkDown {
					return true
				}
			}
		}
	}
	return false
}

// executableRule returns the rule the path of an executable breaks: an
// absolute path (the node's working directory is nobody's business) to a
// regular file with execute permission.
func executableRule(path string) string {
	if !filepath.IsAbs(path) {
		return "must be an absolute path to the understudy-libvirt executable"
	}
	st, err := os.Stat(path)
	switch {
	case err != nil:
		return "must be the understudy-libvirt executable: " + err.Error()
	case !st.Mode().IsRegular():
		return "must be the understudy-libvirt executable, not a directory or a device"
	case st.Mode().Perm()&0o111 == 0:
		return "must be executable (chmod +x)"
	}
	return ""
}
