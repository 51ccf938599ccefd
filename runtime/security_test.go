package runtime

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"understudy/actors/agent"
	"understudy/actors/failover"
	"understudy/actors/resources"
	"understudy/events"
)

// testDeployment is a deployment's secrets made for a test: a CA, a
// certificate per node (server and client) and per person (client only),
// user nkeys for every identity, and the security section naming them.
type testDeployment struct {
	dir   string
	ca    string // CA certificate file
	pool  *x509.CertPool
	sec   *SecuritySection
	names AssetsConfig
	ids   map[string]*testIdentity // by node name, "operator", "admin", "reader", "stranger"
	// manifestKey signs manifests (security.manifest_keys).
	manifestKey *ManifestKey

	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

// testIdentity is one identity's files.
type testIdentity struct {
	seed, cert, key string
	pub             string
}

func newTestDeployment(t *testing.T, nodes map[string]NodeIdentity) *testDeployment {
	t.Helper()
	d := &testDeployment{dir: t.TempDir(), ids: map[string]*testIdentity{}, names: DefaultConfig().Assets}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	d.caCert, _ = x509.ParseCertificate(der)
	d.caKey = key
	d.ca = d.write(t, "ca.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	d.pool = x509.NewCertPool()
	d.pool.AddCert(d.caCert)

	d.sec = &SecuritySection{Nodes: map[string]NodeIdentity{}}
	for name, id := range nodes {
		ti := d.identity(t, name, true)
		id.NKey, id.CertSHA256 = ti.pub, certPin(t, ti.cert)
		d.sec.Nodes[name] = id
	}
	d.sec.Operators = []string{d.identity(t, "operator", false).pub}
	d.sec.Admins = []string{d.identity(t, "admin", false).pub}
	d.sec.Readers = []string{d.identity(t, "reader", false).pub}
	d.identity(t, "stranger", false) // a certificate of the CA, an nkey nobody listed
	mk, err := nkeys.CreateOperator()
	if err != nil {
		t.Fatal(err)
	}
	mseed, _ := mk.Seed()
	if d.manifestKey, err = ParseManifestKey(mseed); err != nil {
		t.Fatal(err)
	}
	d.sec.ManifestKeys = []string{d.manifestKey.Public()}
	return d
}

// certPin is the CertSHA256 of the certificate in file.
func certPin(t *testing.T, file string) string {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(file, strings.TrimSuffix(file, ".pem")+"-key.pem")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return CertSHA256(leaf)
}

func (d *testDeployment) write(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(d.dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// identity makes who's nkey and certificate: a node's is valid for both
// server and client authentication (and names loopback), a person's for
// client authentication only.
func (d *testDeployment) identity(t *testing.T, who string, node bool) *testIdentity {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	ti := &testIdentity{pub: pub, seed: d.write(t, who+".nk", seed)}
	ti.cert, ti.key = d.cert(t, who, node)
	d.ids[who] = ti
	return ti
}

func (d *testDeployment) cert(t *testing.T, who string, node bool) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: who},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if node {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, d.caCert, &key.PublicKey, d.caKey)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return d.write(t, who+".pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		d.write(t, who+"-key.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kd}))
}

// testSite is one node of a test cluster: its ports and node file.
type testSite struct {
	name        string
	clientPort  int
	clusterPort int
	cfg         Config
	serving     *serving
}

func (s *testSite) url() string { return "tls://127.0.0.1:" + strconv.Itoa(s.clientPort) }

// clusterConfigs are the node files of a three-site cluster on loopback
// ports, secured by d: every site routes to the two others.
func (d *testDeployment) clusterConfigs(t *testing.T, names []string, edit func(name string, c *Config)) []*testSite {
	t.Helper()
	sites := make([]*testSite, len(names))
	for i, n := range names {
		sites[i] = &testSite{name: n, clientPort: unusedPort(t), clusterPort: unusedPort(t)}
	}
	for _, s := range sites {
		id := d.ids[s.name]
		c := DefaultConfig()
		c.Node = s.name
		c.DataDir = t.TempDir()
		c.HTTP = "127.0.0.1:0"
		c.Log.Level = "info"
		c.NATS.Listen = "127.0.0.1:" + strconv.Itoa(s.clientPort)
		c.NATS.NKey = id.seed
		c.NATS.Server.TLS = ServerTLS{CA: d.ca, Cert: id.cert, Key: id.key}
		c.NATS.Server.Cluster = &ClusterSection{Name: "test", Listen: "127.0.0.1:" + strconv.Itoa(s.clusterPort)}
		for _, o := range sites {
			if o != s {
				c.NATS.Server.Cluster.Routes = append(c.NATS.Server.Cluster.Routes, "tls://127.0.0.1:"+strconv.Itoa(o.clusterPort))
			}
		}
		c.Security = d.sec
		if edit != nil {
			edit(s.name, &c)
		}
		s.cfg = c
	}
	return sites
}

// unusedPort returns a port on 127.0.0.1 where nothing listens, below the
// kernel's ephemeral range: the ports of a cluster must be known before
// its servers start, and one from the ephemeral range (freePort) may be
// handed to another test's listener or dial meanwhile.
func unusedPort(t *testing.T) int {
	t.Helper()
	for range 100 {
		port := 20000 + mrand.IntN(12000)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue
		}
		if err := ln.Close(); err != nil {
			t.Fatal(err)
		}
		return port
	}
	t.Fatal("no unused port in 20000..31999")
	return 0
}

// waitReady waits for a node's "ready" line, failing at once if Serve
// returned instead.
func (s *testSite) waitReady(t *testing.T, timeout time.Duration) {
	t.Helper()
	ready := make(chan struct{})
	go func() {
		defer close(ready)
		deadline := time.Now().Add(timeout)
		for len(s.serving.rec.matching("ready")) == 0 && time.Now().Before(deadline) {
			select {
			case <-s.serving.done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	<-ready
	select {
	case <-s.serving.done:
		t.Fatalf("%s: Serve returned before ready: %v", s.name, s.serving.err)
	default:
	}
	if len(s.serving.rec.matching("ready")) == 0 {
		t.Fatalf("%s: not ready within %s", s.name, timeout)
	}
}

// asyncErrors collects a connection's asynchronous errors: how nats.go
// reports the server's permission violations.
type asyncErrors struct {
	mu      sync.Mutex
	errs    []error
	changed chan struct{}
}

func (a *asyncErrors) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	a.mu.Lock()
	a.errs = append(a.errs, err)
	close(a.changed)
	a.changed = make(chan struct{})
	a.mu.Unlock()
}

// waitViolation waits for a permission violation naming subject.
func (a *asyncErrors) waitViolation(subject string, timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		a.mu.Lock()
		ch := a.changed
		for _, err := range a.errs {
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+subject+`"`) {
				a.mu.Unlock()
				return err
			}
		}
		a.mu.Unlock()
		select {
		case <-ch:
		case <-deadline:
			return nil
		}
	}
}

func (a *asyncErrors) all() []error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.errs)
}

// testClient is a connection as one identity.
type testClient struct {
	who  string
	nc   *nats.Conn
	js   jetstream.JetStream
	errs *asyncErrors
}

// connectAs connects to url as the identity who (its nkey and
// certificate), failing the test if the server refuses.
func (d *testDeployment) connectAs(t *testing.T, who, url string) *testClient {
	t.Helper()
	c, err := d.dial(who, url, true, true)
	if err != nil {
		t.Fatalf("connect as %s to %s: %v", who, url, err)
	}
	t.Cleanup(c.nc.Close)
	return c
}

func (d *testDeployment) dial(who, url string, withNKey, withCert bool) (*testClient, error) {
	id := d.ids[who]
	errs := &asyncErrors{changed: make(chan struct{})}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: d.pool}
	if withCert {
		pair, err := tls.LoadX509KeyPair(id.cert, id.key)
		if err != nil {
			return nil, err
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	opts := []nats.Option{nats.Name(who), nats.Secure(tc), nats.Timeout(2 * time.Second), nats.ErrorHandler(errs.handler),
		nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond), nats.CustomInboxPrefix(InboxPrefix(id.pub))}
	if withNKey {
		o, err := nats.NkeyOptionFromSeed(id.seed)
		if err != nil {
			return nil, err
		}
		opts = append(opts, o)
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(2*time.Second))
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &testClient{who: who, nc: nc, js: js, errs: errs}, nil
}

// refusedWait bounds the wait for a refusal: the server answers a
// forbidden publish with an error at once, and the publish, unanswered,
// times out.
const refusedWait = 2 * time.Second

// publishRefused publishes data on subject with JetStream and fails the
// test unless the server refused it as a permission violation.
func (c *testClient) publishRefused(t *testing.T, subject string) {
	t.Helper()
	// The server drops a forbidden message and says so at once; the
	// publish itself waits for an acknowledgement that never comes.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := c.js.Publish(ctx, subject, []byte("forged by "+c.who))
	if err == nil {
		t.Errorf("%s: publish to %s was stored, want it refused", c.who, subject)
		return
	}
	if v := c.errs.waitViolation(subject, refusedWait); v == nil {
		t.Errorf("%s: publish to %s failed with %v but the server reported no permission violation (async errors: %v)", c.who, subject, err, c.errs.all())
	}
}

// publishAllowed publishes on subject with JetStream and fails the test
// unless the stream stored it.
func (c *testClient) publishAllowed(t *testing.T, subject string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.js.Publish(ctx, subject, []byte("written by "+c.who)); err != nil {
		t.Errorf("%s: publish to %s: %v, want it stored", c.who, subject, err)
	}
}

// noViolations fails the test if c's server reported a permission
// violation to it.
func (c *testClient) noViolations(t *testing.T) {
	t.Helper()
	for _, err := range c.errs.all() {
		if errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("%s: %v", c.who, err)
		}
	}
}

// violationsLogged are the permission violations a node's server logged.
func violationsLogged(rec *logRecorder) []string {
	var out []string
	for _, l := range rec.all() {
		if strings.Contains(l.Msg, "Violation") || strings.Contains(strings.ToLower(l.Msg), "authentication error") {
			out = append(out, l.String())
		}
	}
	return out
}

// securedCluster is three Serve nodes clustered over mutual TLS with
// nkey identities: a and b host the pair pg (a preferred), w is a witness.
type securedCluster struct {
	d     *testDeployment
	sites []*testSite
	pair  string
}

func startSecuredCluster(t *testing.T) *securedCluster {
	t.Helper()
	const pair = "pg"
	d := newTestDeployment(t, map[string]NodeIdentity{
		// spare: a pair a may write but hosts no member of, for the
		// tests of what a node may write without disturbing pg.
		"a": {Pairs: []string{pair, "spare"}},
		"b": {Pairs: []string{pair}},
		"w": {Agent: "-"},
	})
	r := failover.DefaultRules(pair, "a", "b")
	r.HeartbeatTimeout, r.FailureThreshold, r.SuccessThreshold = 200*time.Millisecond, 2, 2
	r.FailoverTimeout, r.FenceGrace = time.Second, 300*time.Millisecond
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	ft, st := r.FailureThreshold, r.SuccessThreshold
	pf := PairFile{Pair: r.Pair, Primary: r.Primary, Replica: r.Replica, HeartbeatTimeout: r.HeartbeatTimeout.String(),
		FailureThreshold: &ft, SuccessThreshold: &st, FailoverTimeout: r.FailoverTimeout.String(), FenceGrace: r.FenceGrace.String()}
	sites := d.clusterConfigs(t, []string{"a", "b", "w"}, func(name string, c *Config) {
		if name != "w" {
			c.Pairs = []PairMember{{PairFile: pf, Procedures: recordedProcedures()}}
		}
		// The stream leaders on the witness, as docs/operations.md advises.
		c.Assets.PreferredLeader = "w"
		if name == "b" {
			c.Agent = &AgentSection{ID: "b", ObserveInterval: "200ms"}
			c.Libvirt.Driver = "/bin/true" // any executable: no libvirt resource runs
		}
	})
	sc := &securedCluster{d: d, sites: sites, pair: pair}
	for _, s := range sites {
		s.serving = startServe(t, s.cfg)
	}
	for _, s := range sites {
		s.waitReady(t, 60*time.Second)
	}
	return sc
}

// kvOf opens the failover bucket through c.
func (c *testClient) kv(t *testing.T, bucket string) jetstream.KeyValue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	kv, err := c.js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatalf("%s: bucket %s: %v", c.who, bucket, err)
	}
	return kv
}

// waitKey waits until key exists in kv.
func waitKey(t *testing.T, kv jetstream.KeyValue, key string, timeout time.Duration) jetstream.KeyValueEntry {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		e, err := kv.Get(ctx, key)
		cancel()
		if err == nil {
			return e
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %s: %v after %s", key, err, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Three nodes clustered over mutual TLS, each identity with its own
// permissions: the assets are R3, each identity can do its job and is
// refused by the server what it may not write, clients without an
// identity or a certificate are refused, and the cluster keeps its quorum
// when any one of its servers stops.
// waitCurrent waits until every asset has a leader and both its
// followers are current: the cluster is whole again.
func (sc *securedCluster) waitCurrent(t *testing.T) {
	t.Helper()
	c := sc.d.connectAs(t, "reader", sc.sites[0].url())
	defer c.nc.Close()
	names := sc.d.names
	deadline := time.Now().Add(30 * time.Second)
	for _, st := range []string{"KV_" + names.FailoverBucket, "KV_" + names.FleetBucket, names.EventsStream} {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			s, err := c.js.Stream(ctx, st)
			cancel()
			if err == nil {
				cl := s.CachedInfo().Cluster
				current := cl != nil && cl.Leader != "" && len(cl.Replicas) == 2
				for _, r := range cl.Replicas {
					current = current && r.Current && !r.Offline
				}
				if current {
					break
				}
				err = fmt.Errorf("cluster %+v", cl)
			}
			if time.Now().After(deadline) {
				t.Fatalf("stream %s not whole within 30s: %v", st, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// stopAll stops the three nodes at once: one after the other, the last
// ones would hand their members over without a quorum to write with.
func (sc *securedCluster) stopAll(t *testing.T) {
	for _, s := range sc.sites {
		s.serving.cancel()
	}
	for _, s := range sc.sites {
		select {
		case <-s.serving.done:
			if s.serving.err != nil {
				t.Errorf("%s: Serve: %v", s.name, s.serving.err)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("%s: Serve still running 20s after cancel", s.name)
		}
	}
}

func TestSecuredCluster(t *testing.T) {
	sc := startSecuredCluster(t)
	defer sc.stopAll(t)
	top := t // the servers restarted in a subtest outlive it
	d, a, b, w := sc.d, sc.sites[0], sc.sites[1], sc.sites[2]
	names := d.names
	ctx := context.Background()
	reader := d.connectAs(t, "reader", w.url())
	fkv := reader.kv(t, names.FailoverBucket)

	t.Run("assets are R3", func(t *testing.T) {
		for _, st := range []string{"KV_" + names.FailoverBucket, "KV_" + names.FleetBucket, names.EventsStream} {
			// A stream may be between leaders (an election on a loaded
			// machine takes seconds): ask again until one leads, 15 s at most.
			var info *jetstream.StreamInfo
			for deadline := time.Now().Add(15 * time.Second); ; {
				ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				s, err := reader.js.Stream(ctx, st)
				cancel()
				if err != nil {
					// No leader to answer yet (the lookup timed out): ask
					// again within the same 15 s.
					if time.Now().After(deadline) {
						t.Fatalf("stream %s: %v", st, err)
					}
					time.Sleep(250 * time.Millisecond)
					continue
				}
				info = s.CachedInfo()
				if (info.Cluster != nil && info.Cluster.Leader != "") || time.Now().After(deadline) {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if info.Config.Replicas != 3 || info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
				t.Errorf("stream %s: replicas %d, cluster %+v; want 3 replicas, a leader and two followers", st, info.Config.Replicas, info.Cluster)
			}
		}
	})

	t.Run("the nodes run without permission violations", func(t *testing.T) {
		waitKey(t, fkv, failover.LeaderKey(sc.pair), 20*time.Second)
		waitKey(t, fkv, failover.HeartbeatKey(sc.pair, "a"), 10*time.Second)
		waitKey(t, fkv, failover.HeartbeatKey(sc.pair, "b"), 10*time.Second)
		waitKey(t, fkv, failover.RulesKey(sc.pair, "a"), 10*time.Second)
		waitKey(t, fkv, failover.RulesKey(sc.pair, "b"), 10*time.Second)
		fleet := reader.kv(t, names.FleetBucket)
		waitKey(t, fleet, agent.PresenceKey("b"), 10*time.Second)
		waitKey(t, fleet, agent.ActualKey("b"), 10*time.Second)
		events, err := reader.js.Stream(ctx, names.EventsStream)
		if err != nil {
			t.Fatal(err)
		}
		// The members record their transitions.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			_, erra := events.GetLastMsgForSubject(ctx, failover.Subject(sc.pair, "a"))
			_, errb := events.GetLastMsgForSubject(ctx, failover.Subject(sc.pair, "b"))
			if erra == nil || errb == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no event of pg's members after 10s: %v, %v", erra, errb)
			}
		}
		time.Sleep(500 * time.Millisecond) // a few heartbeats more
		for _, s := range sc.sites {
			for _, v := range violationsLogged(s.serving.rec) {
				t.Errorf("%s: %s", s.name, v)
			}
		}
	})

	t.Run("each identity can do its job", func(t *testing.T) {
		node := d.connectAs(t, "a", b.url()) // any server enforces the same permissions
		for _, subj := range []string{
			"$KV." + names.FailoverBucket + ".spare.leader", "$KV." + names.FailoverBucket + ".spare.rules.a",
			"$KV." + names.FailoverBucket + ".spare.hb.a",
			"ev.failover.spare.a", "ev.host.spare.a", "ev.procedure.spare.a", "ev.agent.a.x",
			"$KV." + names.FleetBucket + ".actual-state.a", "$KV." + names.FleetBucket + ".presence.a",
		} {
			node.publishAllowed(t, subj)
		}
		op := d.connectAs(t, "operator", w.url())
		for _, subj := range []string{
			"$KV." + names.FailoverBucket + ".spare.config", "$KV." + names.FailoverBucket + ".spare.switchover",
			"$KV." + names.FailoverBucket + ".spare.pause", "$KV." + names.FailoverBucket + ".spare.failover",
			"$KV." + names.FleetBucket + ".desired-state.nobody",
		} {
			op.publishAllowed(t, subj)
		}
		// The admin changes the assets' settings (here: to the same).
		admin := d.connectAs(t, "admin", a.url())
		for _, name := range []string{"KV_" + names.FailoverBucket, "KV_" + names.FleetBucket, names.EventsStream} {
			if st, err := admin.js.Stream(ctx, name); err != nil {
				t.Error(err)
			} else if _, err := admin.js.UpdateStream(ctx, st.CachedInfo().Config); err != nil {
				t.Errorf("admin's update of %s: %v", name, err)
			}
		}
		admin.noViolations(t)
		// A device command to the node's agent, and its answer.
		sub, err := node.nc.Subscribe("device-commands.a.*", func(m *nats.Msg) { _ = m.Respond([]byte("pong")) })
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := node.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		// The subscription's interest reaches the operator's server over a
		// route some time after the flush: no responders until then.
		reply, err := op.nc.Request("device-commands.a.ping", nil, 5*time.Second)
		for deadline := time.Now().Add(10 * time.Second); errors.Is(err, nats.ErrNoResponders) && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
			reply, err = op.nc.Request("device-commands.a.ping", nil, 5*time.Second)
		}
		if err != nil || string(reply.Data) != "pong" {
			t.Errorf("operator's device command: %v", err)
		}
		// The node's agent answers the operator's command, and runs the
		// manifest the operator signed and stored.
		if _, err := op.nc.Request(agent.CommandSubject("b", "ping"), nil, 5*time.Second); err != nil {
			t.Errorf("agent b's ping: %v", err)
		}
		opFleet, err := events.NewJetStreamKV(ctx, op.js, names.FleetBucket)
		if err != nil {
			t.Fatal(err)
		}
		m, _, err := ApplyManifest(ctx, opFleet, agent.Manifest{Agent: "b"}, AgentRegistry(AgentConfig{}, resources.NewProcess()), ManifestWriter{Key: d.manifestKey})
		if err != nil {
			t.Fatalf("operator applies b's manifest: %v", err)
		}
		fleet := reader.kv(t, names.FleetBucket)
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			e := waitKey(t, fleet, agent.ActualKey("b"), time.Second)
			st, err := agent.DecodeStatus(e.Value())
			if err == nil && st.ObservedGeneration == m.Generation && st.ManifestSigner == d.manifestKey.Public() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("agent b's status 10s after the apply: %+v %v; want generation %d observed, signed by the manifest key", st, err, m.Generation)
			}
		}

		// Reading, as the reader and the operator: get, history, keys,
		// watch, the event log, export.
		for _, c := range []*testClient{reader, op, node} {
			kv := c.kv(t, names.FailoverBucket)
			if _, err := kv.Get(ctx, failover.LeaderKey(sc.pair)); err != nil {
				t.Errorf("%s: get: %v", c.who, err)
			}
			if _, err := kv.History(ctx, failover.LeaderKey(sc.pair)); err != nil {
				t.Errorf("%s: history: %v", c.who, err)
			}
			lister, err := kv.ListKeysFiltered(ctx, "*.leader", "*.config")
			if err != nil {
				t.Errorf("%s: list keys: %v", c.who, err)
			} else {
				n := 0
				for range lister.Keys() {
					n++
				}
				if n == 0 {
					t.Errorf("%s: no keys listed", c.who)
				}
			}
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			watch, err := kv.Watch(wctx, sc.pair+".>")
			if err != nil {
				t.Errorf("%s: watch: %v", c.who, err)
			} else {
				for e := range watch.Updates() {
					if e == nil {
						break // the initial values are in
					}
				}
				_ = watch.Stop()
			}
			cancel()
			evlog, err := events.NewJetStreamLog(c.js, names.EventsStream, Codec())
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			for _, err := range evlog.Read(rctx, events.ReadOptions{Subject: "ev.failover." + sc.pair + ".>"}) {
				if err != nil {
					t.Errorf("%s: reading events: %v", c.who, err)
					break
				}
				n++
			}
			cancel()
			if n == 0 {
				t.Errorf("%s: no events read", c.who)
			}
			ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if _, err := ExportPair(ectx, c.js, PairRecordOptions{Pair: sc.pair}, "test", io.Discard); err != nil {
				t.Errorf("%s: export: %v", c.who, err)
			}
			cancel()
			if _, err := c.js.AccountInfo(ctx); err != nil {
				t.Errorf("%s: account info: %v", c.who, err)
			}
		}
		for _, c := range []*testClient{reader, op, node} {
			c.noViolations(t)
		}
		for _, s := range sc.sites {
			for _, v := range violationsLogged(s.serving.rec) {
				t.Errorf("%s: %s", s.name, v)
			}
		}
	})

	t.Run("forbidden writes are refused", func(t *testing.T) {
		before := waitKey(t, fkv, failover.HeartbeatKey(sc.pair, "a"), time.Second)
		fb, fl := "$KV."+names.FailoverBucket+".", "$KV."+names.FleetBucket+"."
		refused := map[string][]string{
			"b": { // hosts pg at site b, runs agent b
				fb + "spare.leader", fb + "spare.config", fb + "spare.hb.b", // a pair it is not in
				fb + "pg.hb.a", fb + "pg.rules.a", // another member's heartbeat and published rules
				fb + "pg.config", // the rules in force are the operators'

				fb + "pg.switchover", fb + "pg.pause", fb + "pg.failover", // the operator's
				fl + "desired-state.b", fl + "desired-state.a", // any desired state
				fl + "actual-state.a", fl + "presence.a", "ev.agent.a.x", // another agent's
				"ev.failover.pg.a", "ev.procedure.pg.a", "ev.host.pg.a", // another member's events
				"device-commands.a.x",
				"$JS.API.STREAM.UPDATE.KV_" + names.FailoverBucket, // an update can shorten history to nothing
			},
			"w": { // a witness: no pair, no agent
				fb + "pg.leader", fb + "pg.hb.w", fb + "pg.config", fl + "actual-state.w", fl + "presence.w", "ev.agent.w.x",
			},
			"operator": {
				fb + "pg.leader", fb + "pg.hb.a", fl + "actual-state.a", fl + "presence.a", "ev.failover.pg.a",
				// An update can republish into any subject, or shrink the
				// limits and so purge: the admin's alone.
				"$JS.API.STREAM.UPDATE.KV_" + names.FailoverBucket, "$JS.API.STREAM.UPDATE.KV_" + names.FleetBucket,
				"$JS.API.STREAM.UPDATE." + names.EventsStream,
			},
			"admin": { // updates the assets, writes nothing
				fb + "pg.leader", fb + "pg.hb.a", fb + "pg.config", fb + "pg.switchover", fl + "desired-state.a",
				"ev.failover.pg.a", "device-commands.a.x",
			},
			"reader": {
				fb + "pg.leader", fb + "pg.hb.a", fb + "pg.config", fb + "pg.switchover", fb + "pg.pause",
				fl + "desired-state.a", fl + "actual-state.a", "ev.failover.pg.a", "device-commands.a.x",
			},
		}
		t.Run("by each identity", func(t *testing.T) {
			for _, who := range []string{"b", "w", "operator", "admin", "reader"} {
				t.Run(who, func(t *testing.T) {
					t.Parallel()
					refusedTo(t, d.connectAs(t, who, a.url()), refused[who], names)
				})
			}
		})
		after := waitKey(t, fkv, failover.HeartbeatKey(sc.pair, "a"), time.Second)
		if strings.Contains(string(after.Value()), "forged") {
			t.Errorf("pg.hb.a holds a forged value (revision %d, before %d)", after.Revision(), before.Revision())
		}
	})
	t.Run("clients without an identity or a certificate are refused", func(t *testing.T) {
		for _, c := range []struct {
			who           string
			nkey, cert    bool
			wantAuthError bool
		}{
			{"stranger", true, true, true}, // a certificate of the CA, an nkey nobody listed
			{"operator", false, true, true},
			{"operator", true, false, false},
		} {
			tc, err := d.dial(c.who, a.url(), c.nkey, c.cert)
			if err == nil {
				tc.nc.Close()
				t.Errorf("%s (nkey %v, certificate %v): connected, want refused", c.who, c.nkey, c.cert)
				continue
			}
			if IsAuthError(err) != c.wantAuthError {
				t.Errorf("%s (nkey %v, certificate %v): %v; want an authorization error: %v", c.who, c.nkey, c.cert, err, c.wantAuthError)
			}
		}
		if nc, err := nats.Connect("nats://127.0.0.1:"+strconv.Itoa(a.clientPort), nats.Timeout(2*time.Second)); err == nil {
			nc.Close()
			t.Error("a client without TLS connected")
		}
	})

	t.Run("a certificate of the CA that is not pinned is no route", func(t *testing.T) {
		// A node certificate of the deployment's CA, as a removed node's
		// or one issued by mistake would be, on a server of the attacker's
		// that accepts any client and dials the three routes.
		certFile, keyFile := d.cert(t, "rogue", true)
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		var routes []*url.URL
		for _, s := range sc.sites {
			routes = append(routes, &url.URL{Scheme: "tls", Host: "127.0.0.1:" + strconv.Itoa(s.clusterPort)})
		}
		rogue, err := StartEmbedded(EmbeddedConfig{
			DataDir: t.TempDir(), Host: "127.0.0.1", Port: -1, ServerName: "rogue",
			Cluster: &EmbeddedCluster{Name: "test", Host: "127.0.0.1", Port: -1, Routes: routes, TLS: routeTLS(pair, d.pool)},
		}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		defer rogue.Shutdown()
		// Had a route been accepted, the rogue's subscription would draw
		// the nodes' heartbeats and events to it.
		spy := connectTo(t, rogue.ClientURL())
		got, err := spy.SubscribeSync(">")
		if err != nil {
			t.Fatal(err)
		}
		if err := spy.Flush(); err != nil {
			t.Fatal(err)
		}
		refusedBy := map[string]bool{}
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if n := rogue.Server().NumRoutes(); n != 0 {
				t.Fatalf("the rogue server has %d routes", n)
			}
			for _, s := range sc.sites {
				for _, l := range s.serving.rec.all() {
					if strings.Contains(l.Msg, "certificate not pinned") {
						refusedBy[s.name] = true
					}
				}
			}
		}
		if len(refusedBy) != len(sc.sites) {
			t.Errorf("servers that refused the rogue's route for its unpinned certificate: %v, want all three", refusedBy)
		}
		for {
			m, err := got.NextMsg(10 * time.Millisecond)
			if err != nil {
				break
			}
			if strings.HasPrefix(m.Subject, "$KV.") || strings.HasPrefix(m.Subject, "ev.") {
				t.Fatalf("the rogue server received %s from the cluster", m.Subject)
			}
		}
	})

	t.Run("the cluster keeps its quorum when any one server stops", func(t *testing.T) {
		for i, down := range sc.sites {
			if err := down.serving.stop(t); err != nil {
				t.Fatalf("stopping %s: %v", down.name, err)
			}
			up := sc.sites[(i+1)%3]
			op := d.connectAs(t, "operator", up.url())
			// The stopped server may have led the meta group or the
			// stream: the two others elect another leader first.
			var kv jetstream.KeyValue
			start := time.Now()
			for {
				pctx, cancel := context.WithTimeout(ctx, time.Second)
				var err error
				if kv == nil {
					kv, err = op.js.KeyValue(pctx, names.FailoverBucket)
				}
				if err == nil {
					_, err = kv.Put(pctx, "quorum.config", []byte(down.name+" down"))
				}
				cancel()
				if err == nil {
					break
				}
				t.Logf("%s down: %v after %v", down.name, err, time.Since(start).Round(time.Millisecond))
				if time.Since(start) > 20*time.Second {
					t.Fatalf("%s down: no write through %s within 20s: %v", down.name, up.name, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			t.Logf("%s down: a write through %s after %v", down.name, up.name, time.Since(start).Round(time.Millisecond))
			if down == a {
				// a led pg and handed over at shutdown: b takes over.
				deadline := time.Now().Add(10 * time.Second)
				for {
					e := waitKey(t, kv, failover.LeaderKey(sc.pair), time.Second)
					if l, err := failover.DecodeLeader(e.Value()); err == nil && l.Site == "b" {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("b does not lead pg 10s after a stopped")
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
			op.nc.Close()
			down.serving = startServe(top, down.cfg)
			down.waitReady(t, 60*time.Second)
			sc.waitCurrent(t)
		}
		for _, s := range sc.sites {
			for _, v := range violationsLogged(s.serving.rec) {
				t.Errorf("%s after its restart: %s", s.name, v)
			}
		}
	})
}

// refusedTo checks that the server refuses c each of the subjects and the
// JetStream API calls that destroy history, and its subscriptions to
// other identities' inboxes and to an agent's commands.
func refusedTo(t *testing.T, c *testClient, subjects []string, names AssetsConfig) {
	for _, subj := range subjects {
		if strings.HasPrefix(subj, "$KV.") || strings.HasPrefix(subj, "ev.") {
			c.publishRefused(t, subj)
			continue
		}
		if err := c.nc.Publish(subj, []byte("forged")); err != nil {
			t.Fatal(err)
		}
		if c.errs.waitViolation(subj, refusedWait) == nil {
			t.Errorf("%s: publish to %s: no permission violation", c.who, subj)
		}
	}
	for _, api := range []string{
		"$JS.API.STREAM.PURGE.KV_" + names.FailoverBucket, "$JS.API.STREAM.DELETE." + names.EventsStream,
		"$JS.API.STREAM.MSG.DELETE.KV_" + names.FleetBucket,
	} {
		if _, err := c.nc.Request(api, []byte("{}"), 100*time.Millisecond); err == nil {
			t.Errorf("%s: %s answered", c.who, api)
		}
		if c.errs.waitViolation(api, refusedWait) == nil {
			t.Errorf("%s: %s: no permission violation", c.who, api)
		}
	}
	for _, subj := range []string{"_INBOX.>", "device-commands.a.*"} {
		if _, err := c.nc.SubscribeSync(subj); err != nil {
			t.Fatal(err)
		}
		_ = c.nc.Flush()
		if c.errs.waitViolation(subj, refusedWait) == nil {
			t.Errorf("%s: subscribing to %s: no permission violation", c.who, subj)
		}
	}
}

// securedNodeConfig is node a's file of a three-site deployment off
// loopback: TLS, its nkey, a cluster and the security section; it hosts
// pg's member a.
func securedNodeConfig(t *testing.T, d *testDeployment) Config {
	t.Helper()
	id := d.ids["a"]
	c := DefaultConfig()
	c.Node = "a"
	c.DataDir = t.TempDir()
	c.NATS.Listen = "10.0.0.1:4222"
	c.NATS.NKey = id.seed
	c.NATS.Server.TLS = ServerTLS{CA: d.ca, Cert: id.cert, Key: id.key}
	c.NATS.Server.Cluster = &ClusterSection{Name: "prod", Listen: "0.0.0.0:6222", Routes: []string{"tls://10.0.0.2:6222", "tls://10.0.0.3:6222"}}
	c.Security = d.sec
	c.Pairs = []PairMember{{PairFile: PairFile{Pair: "pg", Primary: "a", Replica: "b"}, Procedures: recordedProcedures()}}
	return c
}

func TestSecuredNodeConfigResolves(t *testing.T) {
	d := newTestDeployment(t, map[string]NodeIdentity{"a": {Pairs: []string{"pg"}}, "b": {Pairs: []string{"pg"}}, "w": {Agent: "-"}})
	c := securedNodeConfig(t, d)
	s, err := c.resolve()
	if err != nil {
		t.Fatal(err)
	}
	cl := s.server.cluster
	if s.replicas != 3 || s.server.name != "a" || s.nkeyPublic != d.ids["a"].pub || s.security != d.sec ||
		cl == nil || cl.name != "prod" || cl.host != "0.0.0.0" || cl.port != 6222 || len(cl.routes) != 2 || cl.tls == nil {
		t.Errorf("resolved: replicas %d, server %+v, cluster %+v, nkey %s", s.replicas, s.server, cl, s.nkeyPublic)
	}
	st := s.server.tls
	if st == nil || st.ClientAuth != tls.RequireAndVerifyClientCert || st.ClientCAs == nil || len(st.Certificates) != 1 {
		t.Errorf("client port TLS: %+v", st)
	}
	// The node's own connection presents its certificate and checks the
	// server's chain against the CA.
	if s.tls == nil || len(s.tls.Certificates) != 1 || s.tls.RootCAs == nil || s.tls.VerifyConnection == nil {
		t.Errorf("the node's client TLS: %+v", s.tls)
	}
	users := Permissions(s.security, c.Assets)
	if len(users) != 6 {
		t.Errorf("%d users, want 3 nodes, an operator, an admin and a reader", len(users))
	}
	// Every node's certificate is pinned as a route, and only those.
	var pins []string
	for _, n := range []string{"a", "b", "w"} {
		pins = append(pins, certPin(t, d.ids[n].cert))
	}
	if !slices.Equal(cl.pinned, pins) {
		t.Errorf("pinned route certificates %v, want %v", cl.pinned, pins)
	}

	// A witness: no pairs, no agent.
	c = securedNodeConfig(t, d)
	c.Node, c.Pairs, c.NATS.NKey = "w", nil, d.ids["w"].seed
	c.NATS.Server.TLS = ServerTLS{CA: d.ca, Cert: d.ids["w"].cert, Key: d.ids["w"].key}
	if _, err := c.resolve(); err != nil {
		t.Errorf("witness: %v", err)
	}
	// A single secured server has no routes to pin.
	c = securedNodeConfig(t, d)
	c.NATS.Listen, c.NATS.Server.Cluster = "127.0.0.1:4222", nil
	c.Security = &SecuritySection{Nodes: map[string]NodeIdentity{"a": {NKey: d.ids["a"].pub, Pairs: []string{"pg"}}}}
	if s, err := c.resolve(); err != nil || s.server.cluster != nil {
		t.Errorf("a single secured server without pins: %v", err)
	}
	// Loopback development: neither TLS nor security needed.
	c = DefaultConfig()
	c.DataDir = t.TempDir()
	c.Node = "dev"
	c.NATS.Server.Cluster = &ClusterSection{Name: "dev", Listen: "127.0.0.1:6222", Routes: []string{"nats://127.0.0.1:6223"}}
	if s, err := c.resolve(); err != nil || s.replicas != 3 {
		t.Errorf("loopback cluster without security: replicas %d, %v", s.replicas, err)
	}
}

func TestSecuredNodeConfigRefusals(t *testing.T) {
	d := newTestDeployment(t, map[string]NodeIdentity{"a": {Pairs: []string{"pg"}}, "b": {Pairs: []string{"pg"}}, "w": {Agent: "-"}})
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	op, _ := nkeys.CreateOperator()
	opSeed, _ := op.Seed()
	opPub, _ := op.PublicKey()
	operatorSeed := write("operator-seed.nk", string(opSeed))
	driver := write("understudy-libvirt", "#!/bin/sh\n")
	if err := os.Chmod(driver, 0o700); err != nil {
		t.Fatal(err)
	}
	withSec := func(c *Config, edit func(s *SecuritySection)) {
		s := *d.sec
		s.Nodes = map[string]NodeIdentity{}
		for k, v := range d.sec.Nodes {
			s.Nodes[k] = v
		}
		s.Operators = slices.Clone(s.Operators)
		s.Readers = slices.Clone(s.Readers)
		s.Admins = slices.Clone(s.Admins)
		s.ManifestKeys = slices.Clone(s.ManifestKeys)
		edit(&s)
		c.Security = &s
	}
	for _, tc := range []struct {
		name, field, rule string
		edit              func(c *Config)
	}{
		{"off loopback without TLS", "nats.listen", "nats.server.tls", func(c *Config) { c.NATS.Server.TLS = ServerTLS{}; c.NATS.Server.Cluster = nil }},
		{"off loopback without security", "nats.listen", "security section", func(c *Config) { c.Security = nil }},
		{"off loopback points at init", "nats.listen", "understudy init", func(c *Config) { c.Security = nil }},
		{"off loopback points at the docs", "nats.listen", "docs/security.md", func(c *Config) { c.Security = nil }},
		{"every interface without TLS", "nats.listen", "nats.server.tls", func(c *Config) {
			c.NATS.Listen, c.NATS.Server.TLS, c.NATS.Server.Cluster = ":4222", ServerTLS{}, nil
		}},
		{"cluster off loopback without TLS", "nats.server.cluster.listen", "nats.server.cluster.tls", func(c *Config) {
			c.NATS.Listen, c.NATS.Server.TLS = "127.0.0.1:4222", ServerTLS{}
		}},
		{"routes off loopback without TLS", "nats.server.cluster.listen", "nats.server.cluster.tls", func(c *Config) {
			c.NATS.Listen, c.NATS.Server.TLS = "127.0.0.1:4222", ServerTLS{}
			c.NATS.Server.Cluster.Listen = "127.0.0.1:6222"
		}},
		{"server TLS without its CA", "nats.server.tls.ca", "must be set", func(c *Config) { c.NATS.Server.TLS.CA = "" }},
		{"server CA not PEM", "nats.server.tls.ca", "PEM", func(c *Config) { c.NATS.Server.TLS.CA = write("bad.pem", "nope") }},
		{"server certificate of another key", "nats.server.tls.cert", "matching", func(c *Config) { c.NATS.Server.TLS.Key = d.ids["b"].key }},
		{"cluster TLS without its key", "nats.server.cluster.tls.key", "must be set", func(c *Config) {
			c.NATS.Server.Cluster.TLS = ServerTLS{CA: d.ca, Cert: d.ids["a"].cert}
		}},
		{"cluster without a name", "nats.server.cluster.name", "the same on every site", func(c *Config) { c.NATS.Server.Cluster.Name = "" }},
		{"cluster listen not host:port", "nats.server.cluster.listen", "host:port", func(c *Config) { c.NATS.Server.Cluster.Listen = "6222" }},
		{"route of another scheme", "nats.server.cluster.routes[1]", "scheme", func(c *Config) { c.NATS.Server.Cluster.Routes[1] = "http://10.0.0.3:6222" }},
		{"route without a port", "nats.server.cluster.routes[0]", "route URL", func(c *Config) { c.NATS.Server.Cluster.Routes[0] = "tls://10.0.0.2" }},
		{"route with credentials", "nats.server.cluster.routes[0]", "certificates", func(c *Config) { c.NATS.Server.Cluster.Routes[0] = "tls://u:p@10.0.0.2:6222" }},
		{"cluster member without a name", "nats.server.name", "every server has a name", func(c *Config) { c.Node, c.Security, c.Pairs = "", nil, nil }},
		{"server name with a space", "nats.server.name", "without spaces", func(c *Config) { c.NATS.Server.Name = "site a" }},
		{"nkey file missing", "nats.nkey", "readable", func(c *Config) { c.NATS.NKey = filepath.Join(dir, "nope.nk") }},
		{"nkey not a seed", "nats.nkey", "user nkey seed", func(c *Config) { c.NATS.NKey = write("garbage.nk", "hello") }},
		{"nkey of an operator", "nats.nkey", "not a user seed", func(c *Config) { c.NATS.NKey = operatorSeed }},
		{"nkey of another node", "nats.nkey", "is not security.nodes.a.nkey", func(c *Config) { c.NATS.NKey = d.ids["b"].seed }},
		{"no nkey with security", "nats.nkey", "must be set with a security section", func(c *Config) { c.NATS.NKey = "" }},
		{"nkey with a password", "nats.nkey", "excludes", func(c *Config) {
			c.NATS.URL, c.NATS.Server, c.NATS.User, c.NATS.Password = "tls://10.0.0.2:4222", ServerSection{}, "u", "p"
		}},
		{"server section with an external NATS", "nats.server", "only to the embedded server", func(c *Config) { c.NATS.URL = "tls://10.0.0.2:4222" }},
		{"no node with security", "node", "names this node's entry", func(c *Config) { c.Node, c.Pairs = "", nil }},
		{"no entry for the node", "security.nodes", "must have an entry for this node", func(c *Config) {
			withSec(c, func(s *SecuritySection) { delete(s.Nodes, "a") })
		}},
		{"node key not a user key", "security.nodes.b.nkey", "public user nkey", func(c *Config) {
			withSec(c, func(s *SecuritySection) { s.Nodes["b"] = NodeIdentity{NKey: "Ubogus", Pairs: []string{"pg"}} })
		}},
		{"operator key of an operator", "security.operators[0]", "public user nkey", func(c *Config) {
			withSec(c, func(s *SecuritySection) { s.Operators[0] = opPub })
		}},
		{"manifest key of a user", "security.manifest_keys[0]", "public operator nkey", func(c *Config) {
			withSec(c, func(s *SecuritySection) { s.ManifestKeys[0] = d.ids["operator"].pub })
		}},
		{"reader with the operator's key", "security.readers[0]", "key of its own", func(c *Config) {
			withSec(c, func(s *SecuritySection) { s.Readers[0] = s.Operators[0] })
		}},
		{"admin with the operator's key", "security.admins[0]", "key of its own", func(c *Config) {
			withSec(c, func(s *SecuritySection) { s.Admins[0] = s.Operators[0] })
		}},
		{"admin key of an operator", "security.admins[0]", "public user nkey", func(c *Config) {
			withSec(c, func(s *SecuritySection) { s.Admins[0] = opPub })
		}},
		{"a malformed certificate pin", "security.nodes.b.cert_sha256", "64 hex digits", func(c *Config) {
			withSec(c, func(s *SecuritySection) {
				id := s.Nodes["b"]
				id.CertSHA256 = "sha256:" + id.CertSHA256[7:]
				s.Nodes["b"] = id
			})
		}},
		{"a node without a certificate pin in a cluster", "security.nodes.b.cert_sha256", "must be set in a cluster", func(c *Config) {
			withSec(c, func(s *SecuritySection) {
				id := s.Nodes["b"]
				id.CertSHA256 = ""
				s.Nodes["b"] = id
			})
		}},
		{"the node's pin not its route certificate's", "security.nodes.a.cert_sha256", "must pin this node's route certificate", func(c *Config) {
			withSec(c, func(s *SecuritySection) {
				id := s.Nodes["a"]
				id.CertSHA256 = s.Nodes["b"].CertSHA256
				s.Nodes["a"] = id
			})
		}},
		{"security with routes on loopback without TLS", "nats.server.cluster.tls", "with a security section", func(c *Config) {
			c.NATS.Listen, c.NATS.Server.TLS = "127.0.0.1:4222", ServerTLS{}
			c.NATS.Server.Cluster.Listen = "127.0.0.1:6222"
			c.NATS.Server.Cluster.Routes = []string{"nats://127.0.0.1:6223", "nats://127.0.0.1:6224"}
		}},
		{"a node name that is no subject token", "security.nodes", "node names", func(c *Config) {
			withSec(c, func(s *SecuritySection) { s.Nodes["x.y"] = NodeIdentity{NKey: d.ids["stranger"].pub} })
		}},
		{"hosted pair not listed", "security.nodes.a.pairs", "would refuse its writes", func(c *Config) {
			withSec(c, func(s *SecuritySection) { s.Nodes["a"] = NodeIdentity{NKey: d.ids["a"].pub, Pairs: []string{"other"}} })
		}},
		{"member site not listed", "security.nodes.a.sites", "would refuse its heartbeats", func(c *Config) {
			withSec(c, func(s *SecuritySection) {
				s.Nodes["a"] = NodeIdentity{NKey: d.ids["a"].pub, Pairs: []string{"pg"}, Sites: []string{"elsewhere"}}
			})
		}},
		{"agent not the entry's", "security.nodes.a.agent", "would refuse its agent's writes", func(c *Config) {
			c.Agent, c.Libvirt.Driver = &AgentSection{ID: "a"}, driver
			withSec(c, func(s *SecuritySection) {
				s.Nodes["a"] = NodeIdentity{NKey: d.ids["a"].pub, Pairs: []string{"pg"}, Agent: "-"}
			})
		}},
		{"client TLS for the embedded server without its TLS", "nats.tls.ca", "only to an external NATS", func(c *Config) {
			c.NATS.Listen, c.NATS.Server, c.Security, c.Pairs = "127.0.0.1:4222", ServerSection{}, nil, nil
			c.NATS.TLS.CA = d.ca
		}},
		{"replicas > 1 on a single embedded server", "assets.replicas", "nats.server.cluster", func(c *Config) {
			c.NATS.Listen, c.NATS.Server.Cluster, c.Assets.Replicas = "127.0.0.1:4222", nil, 3
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := securedNodeConfig(t, d)
			c.NATS.Server.Cluster.Routes = slices.Clone(c.NATS.Server.Cluster.Routes)
			tc.edit(&c)
			err := c.Validate()
			for _, e := range flatten(err) {
				var ce *ConfigError
				if errors.As(e, &ce) && ce.Field == tc.field && strings.Contains(ce.Rule, tc.rule) {
					return
				}
			}
			t.Errorf("errors %v: want field %s with a rule containing %q", err, tc.field, tc.rule)
		})
	}
}

// A secured node creates the assets but leaves every change of their
// settings to an operator: it reports them refused, saying so.
func TestProvisionCreateOnlyLeavesChangesToAdmins(t *testing.T) {
	es := startEmbedded(t, slog.New(slog.DiscardHandler))
	js, err := jetstream.New(connectTo(t, es.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	assets := DefaultAssets(DefaultConfig().Assets, 1)
	p, err := ProvisionCreateOnly(ctx, js, assets, log)
	if err != nil || p.Assets[0].Outcome != Created {
		t.Fatalf("first run: %v %v", p, err)
	}
	assets[0].History = 32
	p, err = ProvisionCreateOnly(ctx, js, assets, log)
	if err != nil {
		t.Fatal(err)
	}
	r := p.Assets[0]
	if r.Outcome != Unchanged || len(r.Refused) != 1 || r.Refused[0].Field != "history" || !strings.Contains(r.Refused[0].Reason, "an admin changes the stream") {
		t.Errorf("report %+v", r)
	}
	st, err := js.Stream(ctx, assets[0].StreamName())
	if err != nil || st.CachedInfo().Config.MaxMsgsPerSubject != 64 {
		t.Errorf("history changed: %v", err)
	}
}
