package runtime

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"gopkg.in/yaml.v3"
)

func validConfig(t *testing.T) Config {
	c := DefaultConfig()
	c.DataDir = t.TempDir()
	return c
}

func TestDefaultConfigIsValid(t *testing.T) {
	c := validConfig(t)
	s, err := c.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if !s.embedded || s.replicas != 1 || s.listenHost != "127.0.0.1" || s.listenPort != 4222 ||
		s.httpAddr != DefaultHTTPAddr || s.logLevel != slog.LevelInfo || s.logFormat != LogText {
		t.Errorf("resolved defaults: %+v", s)
	}
}

func TestConfigResolvesTypedValues(t *testing.T) {
	c := validConfig(t)
	c.NATS.Listen = "127.0.0.1:0"
	c.Log = LogConfig{Level: "debug", Format: "json"}
	s, err := c.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if s.listenPort != -1 {
		t.Errorf("listen port 0 resolved to %d, want -1 (any free port; nats-server reads 0 as 4222)", s.listenPort)
	}
	if s.logLevel != slog.LevelDebug || s.logFormat != LogJSON {
		t.Errorf("log: %s %s", s.logLevel, s.logFormat)
	}

	c = validConfig(t)
	c.NATS.URL = "nats://a:4222,nats://b:4222"
	if s, err = c.resolve(); err != nil {
		t.Fatal(err)
	}
	if s.embedded || s.replicas != DefaultExternalReplicas {
		t.Errorf("external NATS: embedded %v, replicas %d; want false, %d", s.embedded, s.replicas, DefaultExternalReplicas)
	}
}

func TestConfigValidationNamesFieldAndRule(t *testing.T) {
	dir := t.TempDir()
	ca, cert, key := writeTestCert(t, dir)
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	external := func(c *Config) { c.NATS.URL = "nats://127.0.0.1:4222" }

	cases := []struct {
		name  string
		edit  func(*Config)
		field string
		rule  string // a part of the rule
	}{
		{"replicas too many", func(c *Config) { external(c); c.Assets.Replicas = 7 }, "assets.replicas", "must be 1..5"},
		{"replicas negative", func(c *Config) { c.Assets.Replicas = -1 }, "assets.replicas", "must be 1..5"},
		{"replicas on embedded", func(c *Config) { c.Assets.Replicas = 3 }, "assets.replicas", "must be 1 with the embedded server"},
		{"listen not host:port", func(c *Config) { c.NATS.Listen = "4222" }, "nats.listen", "must be host:port"},
		{"listen port out of range", func(c *Config) { c.NATS.Listen = "127.0.0.1:70000" }, "nats.listen", "port 0..65535"},
		{"http not host:port", func(c *Config) { c.HTTP = "localhost" }, "http", "must be host:port"},
		{"http port -1", func(c *Config) { c.HTTP = "127.0.0.1:-1" }, "http", "port 0..65535"},
		{"no data dir", func(c *Config) { c.DataDir = "" }, "data_dir", "must be set"},
		{"url scheme", func(c *Config) { c.NATS.URL = "http://127.0.0.1:4222" }, "nats.url", "scheme"},
		{"url garbage", func(c *Config) { c.NATS.URL = "::" }, "nats.url", "must be a URL"},
		{"user without password", func(c *Config) { external(c); c.NATS.User = "a" }, "nats.password", "together with nats.user"},
		{"password without user", func(c *Config) { external(c); c.NATS.Password = "p" }, "nats.user", "together with nats.password"},
		{"creds and user", func(c *Config) { external(c); c.NATS.User, c.NATS.Password, c.NATS.Creds = "a", "p", key }, "nats.creds", "choose one"},
		{"creds missing", func(c *Config) { external(c); c.NATS.Creds = filepath.Join(dir, "nope.creds") }, "nats.creds", "readable file"},
		{"creds malformed", func(c *Config) { external(c); c.NATS.Creds = notPEM }, "nats.creds", "must hold a user JWT"},
		{"creds without seed", func(c *Config) { external(c); c.NATS.Creds = credsWithoutSeed(t, dir) }, "nats.creds", "must hold a user nkey seed"},
		{"tls cert without key", func(c *Config) { external(c); c.NATS.TLS.Cert = cert }, "nats.tls.key", "together with nats.tls.cert"},
		{"tls key without cert", func(c *Config) { external(c); c.NATS.TLS.Key = key }, "nats.tls.cert", "together with nats.tls.key"},
		{"tls cert not matching", func(c *Config) { external(c); c.NATS.TLS.Cert, c.NATS.TLS.Key = notPEM, key }, "nats.tls.cert", "PEM certificate"},
		{"tls ca not PEM", func(c *Config) { external(c); c.NATS.TLS.CA = notPEM }, "nats.tls.ca", "PEM certificate"},
		{"tls ca missing", func(c *Config) { external(c); c.NATS.TLS.CA = filepath.Join(dir, "nope.pem") }, "nats.tls.ca", "readable PEM file"},
		{"tls on embedded", func(c *Config) { c.NATS.TLS.CA = ca }, "nats.tls.ca", "only to an external NATS"},
		{"user on embedded", func(c *Config) { c.NATS.User = "a" }, "nats.user", "only to an external NATS"},
		{"log level", func(c *Config) { c.Log.Level = "verbose" }, "log.level", "debug, info, warn, error"},
		{"log level offset", func(c *Config) { c.Log.Level = "info+2" }, "log.level", "debug, info, warn, error"},
		{"log format", func(c *Config) { c.Log.Format = "xml" }, "log.format", "text or json"},
		{"bucket name", func(c *Config) { c.Assets.FailoverBucket = "a.b" }, "assets.failover_bucket", "JetStream name"},
		{"stream name empty", func(c *Config) { c.Assets.EventsStream = "" }, "assets.events_stream", "JetStream name"},
		{"bucket names equal", func(c *Config) { c.Assets.FleetBucket = c.Assets.FailoverBucket }, "assets.fleet_bucket", "must differ from assets.failover_bucket"},
		{"retry initial", func(c *Config) { c.NATS.Retry.Initial = 0 }, "nats.retry.initial", "positive"},
		{"retry max", func(c *Config) { c.NATS.Retry.Max = time.Millisecond }, "nats.retry.max", "at least nats.retry.initial"},
		{"preferred leader on embedded", func(c *Config) { c.Assets.PreferredLeader = "nats-w" }, "assets.preferred_leader", "only to a NATS cluster"},
		{"preferred leader with one replica", func(c *Config) { external(c); c.Assets.Replicas, c.Assets.PreferredLeader = 1, "nats-w" }, "assets.preferred_leader", "needs assets.replicas > 1"},
		{"preferred leader with a space", func(c *Config) { external(c); c.Assets.PreferredLeader = "nats w" }, "assets.preferred_leader", "NATS server name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.DataDir = dir
			tc.edit(&c)
			err := c.Validate()
			if err == nil {
				t.Fatal("accepted")
			}
			var found bool
			for _, e := range flatten(err) {
				var ce *ConfigError
				if !errors.As(e, &ce) {
					t.Errorf("error %v is not a *ConfigError", e)
					continue
				}
				if ce.Field == tc.field && strings.Contains(ce.Rule, tc.rule) {
					found = true
				}
			}
			if !found {
				t.Errorf("errors %q: want field %s with rule containing %q", err, tc.field, tc.rule)
			}
		})
	}
}

func TestConfigValidationReportsEveryError(t *testing.T) {
	c := validConfig(t)
	c.HTTP = "nope"
	c.Log.Format = "xml"
	c.Assets.Replicas = 9
	errs := flatten(c.Validate())
	if len(errs) != 3 {
		t.Fatalf("got %d errors (%v), want 3", len(errs), errs)
	}
	var ce *ConfigError
	if !errors.As(c.Validate(), &ce) {
		t.Fatal("errors.As finds no *ConfigError in the joined error")
	}
	if got := ce.Error(); !strings.Contains(got, ce.Field) || !strings.Contains(got, ce.Rule) || !strings.Contains(got, ce.Value) {
		t.Errorf("message %q does not say field, rule and value", got)
	}
}

func TestConfigAcceptsFullTLS(t *testing.T) {
	ca, cert, key := writeTestCert(t, t.TempDir())
	c := validConfig(t)
	c.NATS.URL = "tls://127.0.0.1:4222"
	c.NATS.TLS = TLSConfig{CA: ca, Cert: cert, Key: key, ServerName: "nats.example"}
	s, err := c.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if s.tls == nil || s.tls.RootCAs == nil || len(s.tls.Certificates) != 1 || s.tls.ServerName != "nats.example" || s.tls.InsecureSkipVerify {
		t.Errorf("tls config: %+v", s.tls)
	}
}

func TestConfigRedactsPasswordInURLError(t *testing.T) {
	c := validConfig(t)
	c.NATS.URL = "http://alice:s3cret@host:4222"
	err := c.Validate()
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("error %v: want a rejection without the password", err)
	}
}

func TestConfigYAMLNodeFile(t *testing.T) {
	c := DefaultConfig()
	doc := `
data_dir: /var/lib/understudy
nats:
  url: nats://n1:4222,nats://n2:4222
  creds: /etc/understudy/node.creds
  retry: {initial: 100ms, max: 5s}
assets:
  replicas: 5
http: 0.0.0.0:9464
log: {level: debug}
`
	if err := yaml.Unmarshal([]byte(doc), &c); err != nil {
		t.Fatal(err)
	}
	if c.DataDir != "/var/lib/understudy" || c.NATS.URL != "nats://n1:4222,nats://n2:4222" ||
		c.NATS.Retry.Initial != 100*time.Millisecond || c.NATS.Retry.Max != 5*time.Second ||
		c.Assets.Replicas != 5 || c.HTTP != "0.0.0.0:9464" || c.Log.Level != "debug" {
		t.Errorf("decoded: %+v", c)
	}
	// Absent keys keep their defaults.
	if c.Log.Format != "text" || c.Assets.FailoverBucket != DefaultFailoverBucket || c.NATS.Listen != DefaultNATSListen {
		t.Errorf("defaults lost: %+v", c)
	}
}

func TestDefaultDataDir(t *testing.T) {
	t.Setenv("XDG_STATE_HOME", "/state")
	if got := DefaultDataDir(); got != filepath.Join("/state", "understudy") {
		t.Errorf("with XDG_STATE_HOME: %q", got)
	}
	t.Setenv("XDG_STATE_HOME", "")
	t.Setenv("HOME", "/home/u")
	if got := DefaultDataDir(); got != filepath.Join("/home/u", ".local", "state", "understudy") {
		t.Errorf("without XDG_STATE_HOME: %q", got)
	}
	t.Setenv("XDG_STATE_HOME", "relative") // the XDG spec says to ignore it
	if got := DefaultDataDir(); got != filepath.Join("/home/u", ".local", "state", "understudy") {
		t.Errorf("with relative XDG_STATE_HOME: %q", got)
	}
}

func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

// writeTestCert writes a self-signed CA certificate that is also the client
// certificate, and its key; it returns the three paths (CA, cert, key).
func writeTestCert(t *testing.T, dir string) (string, string, string) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "understudy test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	cert := filepath.Join(dir, "cert.pem")
	key := filepath.Join(dir, "key.pem")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, cert, key
}

func TestConfigPreferredLeaderAndDetectionTime(t *testing.T) {
	c := validConfig(t)
	c.NATS.URL = "nats://a:4222,nats://b:4222,nats://w:4222"
	c.Assets.PreferredLeader = "nats-w"
	s, err := c.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if s.preferredLeader != "nats-w" || s.replicas != DefaultExternalReplicas {
		t.Errorf("preferred leader %q with replicas %d; want nats-w with %d", s.preferredLeader, s.replicas, DefaultExternalReplicas)
	}
	if s.deadAfter != DefaultDeadAfter {
		t.Errorf("detection time without pairs: %s, want %s", s.deadAfter, DefaultDeadAfter)
	}
}

// A node notices a dead NATS server within the smallest heartbeat_timeout
// of its pairs.
func TestConfigDetectionTimeIsSmallestHeartbeat(t *testing.T) {
	c := validConfig(t)
	c.Node = "site-a"
	for i, hb := range []time.Duration{700 * time.Millisecond, 300 * time.Millisecond} {
		r := fastRules(t, fmt.Sprintf("pair-%d", i))
		ft, st := r.FailureThreshold, r.SuccessThreshold
		pf := PairFile{Pair: r.Pair, Primary: r.Primary, Replica: r.Replica, HeartbeatTimeout: hb.String(),
			FailureThreshold: &ft, SuccessThreshold: &st, FailoverTimeout: "10s", FenceGrace: r.FenceGrace.String()}
		c.Pairs = append(c.Pairs, PairMember{PairFile: pf, Member: "site-a", Procedures: recordedProcedures()})
	}
	s, err := c.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if s.deadAfter != 300*time.Millisecond {
		t.Errorf("detection time %s, want the smallest heartbeat_timeout 300ms", s.deadAfter)
	}
}

// The agent remembers what it runs under the node's own data directory,
// unless agent.state_dir says where.
func TestConfigAgentStateDir(t *testing.T) {
	c := DefaultConfig()
	c.Node, c.DataDir = "site-a", "/var/lib/understudy-a"
	c.Agent = &AgentSection{}
	c.Libvirt.Driver = "/bin/true" // any executable: the agent needs one at load
	s, err := c.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if s.agent.StateDir != "/var/lib/understudy-a/agent/site-a" {
		t.Errorf("default state dir %q", s.agent.StateDir)
	}
	c.Agent.StateDir = "/srv/agent-state"
	if s, err = c.resolve(); err != nil || s.agent.StateDir != "/srv/agent-state" {
		t.Errorf("agent.state_dir: %v %+v", err, s.agent)
	}
	c.Agent.StateDir = "/"
	var ce *ConfigError
	if _, err := c.resolve(); !errors.As(err, &ce) || ce.Field != "agent.state_dir" {
		t.Errorf("state_dir /: %v", err)
	}
}

// testCreds writes a well-formed .creds file (a user JWT signed by an
// account key, and the user's seed) and returns its path.
func testCreds(t *testing.T, dir string, withSeed bool) string {
	t.Helper()
	akp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	ukp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	upub, _ := ukp.PublicKey()
	claims := jwt.NewUserClaims(upub)
	token, err := claims.Encode(akp)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := ukp.Seed()
	if !withSeed {
		seed = nil
	}
	var data []byte
	if withSeed {
		data, err = jwt.FormatUserConfig(token, seed)
		if err != nil {
			t.Fatal(err)
		}
	} else {
		data = []byte("-----BEGIN NATS USER JWT-----\n" + token + "\n------END NATS USER JWT------\n")
	}
	path := filepath.Join(dir, fmt.Sprintf("user-%v.creds", withSeed))
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func credsWithoutSeed(t *testing.T, dir string) string { return testCreds(t, dir, false) }

func TestCheckCredsAcceptsWellFormedCreds(t *testing.T) {
	if err := CheckCreds(testCreds(t, t.TempDir(), true)); err != nil {
		t.Errorf("well-formed creds: %v", err)
	}
}

// leadership: node or per-pair (default DefaultLeadership); node needs a
// node name and one heartbeat_timeout for all the node's pairs, each
// refusal naming the field and the rule.
func TestConfigLeadership(t *testing.T) {
	withPairs := func(node string, hbs ...time.Duration) Config {
		c := validConfig(t)
		c.Node = node
		for i, hb := range hbs {
			r := fastRules(t, fmt.Sprintf("pair-%d", i))
			ft, st := r.FailureThreshold, r.SuccessThreshold
			pf := PairFile{Pair: r.Pair, Primary: r.Primary, Replica: r.Replica, HeartbeatTimeout: hb.String(),
				FailureThreshold: &ft, SuccessThreshold: &st, FailoverTimeout: "10s", FenceGrace: r.FenceGrace.String()}
			c.Pairs = append(c.Pairs, PairMember{PairFile: pf, Member: "site-a", Procedures: recordedProcedures()})
		}
		return c
	}
	c := withPairs("site-a", 300*time.Millisecond)
	s, err := c.resolve()
	if err != nil || s.leadership != DefaultLeadership {
		t.Fatalf("without the key: %v, %v; want %v", s.leadership, err, DefaultLeadership)
	}
	for _, v := range []string{"node", "per-pair", "Node"} {
		c.Leadership = v
		if s, err := c.resolve(); err != nil || s.leadership.String() != strings.ToLower(v) {
			t.Errorf("leadership: %s resolved to %v, %v", v, s.leadership, err)
		}
	}
	refused := func(c Config, field, rule string) {
		t.Helper()
		var ce *ConfigError
		for _, e := range flatten(c.Validate()) {
			if errors.As(e, &ce) && ce.Field == field && strings.Contains(ce.Rule, rule) {
				return
			}
		}
		t.Errorf("want %s refused (%q); got %v", field, rule, c.Validate())
	}
	c.Leadership = "cluster"
	refused(c, "leadership", "must be node")
	c = withPairs("", 300*time.Millisecond)
	c.Pairs[0].Member = "site-a"
	c.Leadership = "node"
	refused(c, "node", "must be set with leadership: node")
	c = withPairs("site-a", 300*time.Millisecond, 300*time.Millisecond, 500*time.Millisecond)
	c.Leadership = "node"
	refused(c, "pairs[2].heartbeat_timeout", "pair pair-0 has 300ms, pair pair-2 has 500ms")
	c.Leadership = "per-pair"
	if err := c.Validate(); err != nil {
		t.Errorf("per-pair leadership with pairs of different heartbeat_timeout: %v", err)
	}
}

// In per-pair leadership the members' own writes tell the store's health:
// a write over half its heartbeat_timeout makes the node degraded, once
// (one warning per episode), and fast writes alone keep it healthy.
func TestStoreHealthOfMemberWrites(t *testing.T) {
	log, rec := newLogRecorder(t)
	h := newStoreHealth(log, nil)
	for range 10 {
		h.observeWrite(10*time.Millisecond, time.Second)
	}
	if s := h.snapshot(); s.Degraded || s.Worst != 10*time.Millisecond {
		t.Fatalf("fast writes: %+v", s)
	}
	for range 10 {
		h.observeWrite(600*time.Millisecond, time.Second)
	}
	if s := h.snapshot(); !s.Degraded || s.Worst != 600*time.Millisecond {
		t.Fatalf("slow writes: %+v", s)
	}
	if n := len(rec.matching("store writes are slow: heartbeats are at risk (overload, not failure); members fence only if writes keep missing heartbeat_timeout")); n != 1 {
		t.Errorf("%d warnings for one episode", n)
	}
}
