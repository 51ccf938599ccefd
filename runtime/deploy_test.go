package runtime

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"understudy/actors/failover"
)

// threeSites is the deployment of docs/security.md on loopback: two pair
// sites and a witness, each with its own ports.
func threeSites(dir string) DeploySpec {
	return DeploySpec{
		Dir: dir,
		Nodes: []DeployNode{
			{Name: "site-a", Host: "127.0.0.1", ClientPort: 14222, ClusterPort: 16222, HTTP: "127.0.0.1:19464"},
			{Name: "site-b", Host: "127.0.0.1", ClientPort: 14223, ClusterPort: 16223, HTTP: "127.0.0.1:19465"},
			{Name: "witness", Host: "127.0.0.1", ClientPort: 14224, ClusterPort: 16224, HTTP: "127.0.0.1:19466", Witness: true},
		},
		Pairs: []DeployPair{{Name: "pg-main", Primary: "site-a", Replica: "site-b"}},
	}
}

func TestDeployThreeSites(t *testing.T) {
	dir := t.TempDir()
	res, err := Deploy(threeSites(dir))
	if err != nil {
		t.Fatalf("Deploy: %v", err)
	}
	if len(res.Updated) != 0 || len(res.Kept) != 0 || len(res.Warnings) != 0 {
		t.Errorf("a first run only creates: updated %v kept %v warnings %v", res.Updated, res.Kept, res.Warnings)
	}
	if res.URLs != "tls://127.0.0.1:14222,tls://127.0.0.1:14223,tls://127.0.0.1:14224" {
		t.Errorf("URLs %q", res.URLs)
	}

	// Every file private, every directory too.
	err = filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		st, err := e.Info()
		if err != nil {
			return err
		}
		want := fs.FileMode(0o600)
		switch {
		case path == dir:
			return nil // the caller's directory
		case e.IsDir():
			want = fs.ModeDir | 0o700
		case strings.Contains(path, string(filepath.Separator)+"hooks"+string(filepath.Separator)):
			want = 0o700
		}
		if st.Mode() != want {
			t.Errorf("%s: mode %v, want %v", path, st.Mode(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// Each node's directory holds exactly what the node needs.
	for _, n := range res.Nodes {
		var got []string
		err := filepath.WalkDir(n.Dir, func(path string, e fs.DirEntry, err error) error {
			if err == nil && !e.IsDir() {
				rel, _ := filepath.Rel(n.Dir, path)
				got = append(got, rel)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, n.Files) {
			t.Errorf("%s holds %v, the result lists %v", n.Name, got, n.Files)
		}
		want := []string{"ca.pem", "cert.pem", "key.pem", "nats.nkey", "node.yaml"}
		if !n.Witness {
			want = append(want, "hooks/pg-main/demote", "hooks/pg-main/fence", "hooks/pg-main/promote", "pairs/pg-main.yaml")
			slices.Sort(want)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s holds %v, want %v", n.Name, got, want)
		}
		if strings.Contains(strings.Join(got, " "), "ca-key") || strings.Contains(strings.Join(got, " "), ".nk ") {
			t.Errorf("%s holds a key it must not: %v", n.Name, got)
		}
		if n.Serve != "understudy serve --config "+filepath.Join(dir, n.Name, "node.yaml") {
			t.Errorf("serve command %q", n.Serve)
		}
	}

	// The node files load, validate and say what the spec said.
	for _, n := range res.Nodes {
		c, err := LoadConfigFile(n.NodeFile)
		if err != nil {
			t.Fatalf("%s: %v", n.Name, err)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("%s: Validate: %v", n.Name, err)
		}
		if c.Node != n.Name || c.NATS.Server.Name != n.Name || c.NATS.NKey != filepath.Join(n.Dir, "nats.nkey") {
			t.Errorf("%s: node %q server %q nkey %q", n.Name, c.Node, c.NATS.Server.Name, c.NATS.NKey)
		}
		cl := c.NATS.Server.Cluster
		if cl == nil || cl.Name != DefaultDeployCluster || len(cl.Routes) != 2 || cl.TLS != (ServerTLS{}) || c.NATS.Server.TLS.CA == "" {
			t.Errorf("%s: cluster %+v", n.Name, cl)
		}
		if c.Assets.PreferredLeader != "witness" {
			t.Errorf("%s: preferred_leader %q, want the witness", n.Name, c.Assets.PreferredLeader)
		}
		if c.DataDir != filepath.Join(n.Dir, "data") {
			t.Errorf("%s: data_dir %q", n.Name, c.DataDir)
		}
		sec := c.Security
		if sec == nil || len(sec.Nodes) != 3 || sec.Operators[0] != res.Operator.NKey || sec.Readers[0] != res.Reader.NKey ||
			len(sec.Admins) != 1 || sec.Admins[0] != res.Admin.NKey || sec.ManifestKeys[0] != res.ManifestKey {
			t.Fatalf("%s: security %+v", n.Name, sec)
		}
		// Every node's certificate is pinned, by its key's SHA-256.
		for _, o := range res.Nodes {
			if got, want := sec.Nodes[o.Name].CertSHA256, pinOfFile(t, filepath.Join(o.Dir, "cert.pem")); got != want {
				t.Errorf("%s: the pin of %s is %q, its certificate's %q", n.Name, o.Name, got, want)
			}
		}
		if !nkeys.IsValidPublicOperatorKey(res.ManifestKey) || !nkeys.IsValidPublicUserKey(res.Operator.NKey) {
			t.Errorf("manifest key %q operator %q", res.ManifestKey, res.Operator.NKey)
		}
		id := sec.Nodes[n.Name]
		if n.Witness {
			if len(c.Pairs) != 0 || c.Agent != nil || len(id.Pairs) != 0 || id.Agent != "-" {
				t.Errorf("witness runs pairs %v agent %v identity %+v", c.Pairs, c.Agent, id)
			}
		} else if len(c.Pairs) != 1 || c.Pairs[0].File != "pairs/pg-main.yaml" || !slices.Equal(id.Pairs, []string{"pg-main"}) || id.Agent != n.Name {
			t.Errorf("%s: pairs %+v identity %+v", n.Name, c.Pairs, id)
		}
		seed, err := os.ReadFile(c.NATS.NKey)
		if err != nil {
			t.Fatal(err)
		}
		kp, err := nkeys.FromSeed(bytes.TrimSpace(seed))
		if err != nil {
			t.Fatal(err)
		}
		if pub, _ := kp.PublicKey(); pub != id.NKey || pub != n.NKey {
			t.Errorf("%s: the seed's public key %s, the node file says %s", n.Name, pub, id.NKey)
		}
	}

	// The admin's directory is like the reader's, with its own key.
	if res.Admin.Dir != filepath.Join(dir, "admin") || !nkeys.IsValidPublicUserKey(res.Admin.NKey) {
		t.Errorf("admin %+v", res.Admin)
	}
	for _, f := range []string{"admin.nk", "ca.pem", "cert.pem", "key.pem", "env"} {
		if _, err := os.Stat(filepath.Join(dir, "admin", f)); err != nil {
			t.Errorf("admin: %v", err)
		}
	}
	if env, err := os.ReadFile(res.Admin.Env); err != nil || !strings.Contains(string(env), "export UNDERSTUDY_NATS_NKEY="+filepath.Join(dir, "admin", "admin.nk")+"\n") {
		t.Errorf("admin env: %v\n%s", err, env)
	}

	// The operator's env names its files.
	env, err := os.ReadFile(res.Operator.Env)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"export UNDERSTUDY_NATS_URL=tls://127.0.0.1:14222,tls://127.0.0.1:14223,tls://127.0.0.1:14224\n",
		"export UNDERSTUDY_NATS_TLS_CA=" + filepath.Join(dir, "operator", "ca.pem") + "\n",
		"export UNDERSTUDY_NATS_NKEY=" + filepath.Join(dir, "operator", "operator.nk") + "\n",
		"export UNDERSTUDY_SIGN_KEY=" + filepath.Join(dir, "operator", "manifest-signing.nk") + "\n",
	} {
		if !strings.Contains(string(env), want) {
			t.Errorf("operator env lacks %q:\n%s", want, env)
		}
	}
}

// TestDeployCertificatesHandshake: a node's certificate serves and
// authenticates mutual TLS against another node and the operator, and a
// certificate of another CA is refused.
func TestDeployCertificatesHandshake(t *testing.T) {
	dir := t.TempDir()
	if _, err := Deploy(threeSites(dir)); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(filepath.Join(dir, "ca", "ca.pem"))
	if err != nil || !pool.AppendCertsFromPEM(ca) {
		t.Fatalf("CA: %v", err)
	}
	load := func(who string) tls.Certificate {
		c, err := tls.LoadX509KeyPair(filepath.Join(dir, who, "cert.pem"), filepath.Join(dir, who, "key.pem"))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// The server writes one byte once it accepts the client: with TLS 1.3
	// the client's handshake ends before the server has checked its
	// certificate, so only a read tells the client it was refused.
	handshake := func(server, client tls.Certificate, clientPool *x509.CertPool) error {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		deadline := time.Now().Add(10 * time.Second)
		a.SetDeadline(deadline)
		b.SetDeadline(deadline)
		srv := tls.Server(a, &tls.Config{Certificates: []tls.Certificate{server}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert})
		done := make(chan error, 1)
		go func() {
			err := srv.Handshake()
			if err == nil {
				_, err = srv.Write([]byte{1})
			}
			a.Close()
			done <- err
		}()
		cl := tls.Client(b, &tls.Config{Certificates: []tls.Certificate{client}, RootCAs: clientPool, ServerName: "127.0.0.1"})
		cerr := cl.Handshake()
		if cerr == nil {
			_, cerr = cl.Read(make([]byte, 1))
		}
		b.Close()
		return errors.Join(cerr, <-done)
	}
	for _, client := range []string{"site-b", "witness", "operator", "reader"} {
		if err := handshake(load("site-a"), load(client), pool); err != nil {
			t.Errorf("site-a serving %s: %v", client, err)
		}
	}
	if err := handshake(load("operator"), load("site-a"), pool); err == nil {
		t.Errorf("the operator's client certificate served TLS")
	}
	other := t.TempDir()
	if _, err := Deploy(threeSites(other)); err != nil {
		t.Fatal(err)
	}
	stranger, err := tls.LoadX509KeyPair(filepath.Join(other, "site-a", "cert.pem"), filepath.Join(other, "site-a", "key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(load("site-a"), stranger, pool); err == nil {
		t.Errorf("a certificate of another CA was accepted")
	}
}

func TestDeployRerunKeepsKeysAndAddsANode(t *testing.T) {
	dir := t.TempDir()
	spec := threeSites(dir)
	first, err := Deploy(spec)
	if err != nil {
		t.Fatal(err)
	}
	snapshot := func() map[string][]byte {
		m := map[string][]byte{}
		filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
			if err == nil && !e.IsDir() {
				m[path], _ = os.ReadFile(path)
			}
			return err
		})
		return m
	}
	before := snapshot()

	again, err := Deploy(spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Created) != 0 || len(again.Updated) != 0 {
		t.Errorf("a second run changed files: created %v updated %v", again.Created, again.Updated)
	}
	after := snapshot()
	for path, b := range before {
		if !bytes.Equal(after[path], b) {
			t.Errorf("%s changed on a second run", path)
		}
	}

	// One more site: only its files are new; the others' node files are
	// rewritten to trust and route to it, their keys untouched.
	spec.Nodes = append(spec.Nodes, DeployNode{Name: "site-c", Host: "127.0.0.1", ClientPort: 14225, ClusterPort: 16225, HTTP: "127.0.0.1:19467"})
	grown, err := Deploy(spec)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range grown.Created {
		if !strings.HasPrefix(p, filepath.Join(dir, "site-c")+string(filepath.Separator)) {
			t.Errorf("adding site-c created %s", p)
		}
	}
	wantUpdated := []string{
		filepath.Join(dir, "admin", "env"), filepath.Join(dir, "operator", "env"), filepath.Join(dir, "reader", "env"),
		filepath.Join(dir, "site-a", "node.yaml"), filepath.Join(dir, "site-b", "node.yaml"), filepath.Join(dir, "witness", "node.yaml"),
	}
	slices.Sort(grown.Updated)
	if !slices.Equal(grown.Updated, wantUpdated) {
		t.Errorf("updated %v, want %v", grown.Updated, wantUpdated)
	}
	for path, b := range before {
		if strings.HasSuffix(path, ".pem") || strings.HasSuffix(path, ".nk") || strings.HasSuffix(path, ".nkey") {
			if !bytes.Equal(after[path], b) {
				t.Errorf("key or certificate %s changed", path)
			}
		}
	}
	prev, err := os.ReadFile(filepath.Join(dir, "site-a", "node.yaml.prev"))
	if err != nil || !bytes.Equal(prev, before[filepath.Join(dir, "site-a", "node.yaml")]) {
		t.Errorf("the previous node file was not kept: %v", err)
	}
	c, err := LoadConfigFile(filepath.Join(dir, "site-a", "node.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.NATS.Server.Cluster.Routes) != 3 || c.Security.Nodes["site-c"].NKey != grown.Nodes[3].NKey {
		t.Errorf("site-a after adding site-c: routes %v nodes %v", c.NATS.Server.Cluster.Routes, c.Security.Nodes)
	}
	if c.Security.Operators[0] != first.Operator.NKey {
		t.Errorf("the operator's key changed")
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}

	// Removing site-c again revokes it: the others' node files no longer
	// know its nkey nor pin its certificate, so its routes are refused.
	spec.Nodes = spec.Nodes[:3]
	shrunk, err := Deploy(spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(shrunk.Warnings) != 1 || !strings.Contains(shrunk.Warnings[0], "node site-c is not in this deployment any more") {
		t.Errorf("warnings %v", shrunk.Warnings)
	}
	c, err = LoadConfigFile(filepath.Join(dir, "site-a", "node.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cPin := pinOfFile(t, filepath.Join(dir, "site-c", "cert.pem"))
	for name, id := range c.Security.Nodes {
		if name == "site-c" || id.CertSHA256 == cPin {
			t.Errorf("site-a still trusts site-c: %s %+v", name, id)
		}
	}
	s, err := c.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if len(s.server.cluster.pinned) != 3 || slices.Contains(s.server.cluster.pinned, cPin) {
		t.Errorf("site-a pins %v (site-c's is %s)", s.server.cluster.pinned, cPin)
	}
}

// pinOfFile is the CertSHA256 of the PEM certificate in file.
func pinOfFile(t *testing.T, file string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(data)
	if b == nil {
		t.Fatalf("%s: no PEM", file)
	}
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return CertSHA256(cert)
}

func TestDeployNeverOverwritesAKey(t *testing.T) {
	for _, tc := range []struct {
		name   string
		breakF func(t *testing.T, dir string)
		spec   func(s *DeploySpec)
		want   string
	}{
		{
			name: "not a seed",
			breakF: func(t *testing.T, dir string) {
				os.WriteFile(filepath.Join(dir, "site-a", "nats.nkey"), []byte("hello\n"), 0o600)
			},
			want: "site-a/nats.nkey exists but is not an nkey seed",
		},
		{
			name: "a seed of the wrong type",
			breakF: func(t *testing.T, dir string) {
				kp, _ := nkeys.CreateAccount()
				seed, _ := kp.Seed()
				os.WriteFile(filepath.Join(dir, "operator", "manifest-signing.nk"), seed, 0o600)
			},
			want: "operator/manifest-signing.nk holds a",
		},
		{
			name:   "the host changed",
			breakF: func(*testing.T, string) {},
			spec:   func(s *DeploySpec) { s.Nodes[1].Host = "10.0.0.2" },
			want:   "site-b/cert.pem: not for host 10.0.0.2",
		},
		{
			name: "half a CA",
			breakF: func(t *testing.T, dir string) {
				os.Remove(filepath.Join(dir, "ca", "ca-key.pem"))
			},
			want: "holds only half of the CA",
		},
		{
			name: "a pair file for other members",
			breakF: func(t *testing.T, dir string) {
				os.WriteFile(filepath.Join(dir, "site-a", "pairs", "pg-main.yaml"), []byte("pair: pg-main\nprimary: site-b\nreplica: site-a\n"), 0o600)
			},
			want: "is pair pg-main with primary site-b and replica site-a",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			spec := threeSites(dir)
			if _, err := Deploy(spec); err != nil {
				t.Fatal(err)
			}
			tc.breakF(t, dir)
			var before []byte
			if tc.spec != nil {
				tc.spec(&spec)
				before, _ = os.ReadFile(filepath.Join(dir, "site-b", "cert.pem"))
			}
			_, err := Deploy(spec)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one saying %q", err, tc.want)
			}
			if before != nil {
				if after, _ := os.ReadFile(filepath.Join(dir, "site-b", "cert.pem")); !bytes.Equal(before, after) {
					t.Errorf("the certificate was replaced")
				}
			}
		})
	}
}

func TestDeploySpecErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(s *DeploySpec)
		want string
	}{
		{"two nodes", func(s *DeploySpec) { s.Nodes = s.Nodes[:2] }, "nodes = 2: must be one, or three or more"},
		{"a witness in a pair", func(s *DeploySpec) { s.Pairs[0].Replica = "witness" }, "pairs[0].replica = witness: must name a node that is not a witness"},
		{"an unknown node", func(s *DeploySpec) { s.Pairs[0].Primary = "site-z" }, "pairs[0].primary = site-z: must name a node"},
		{"a bad name", func(s *DeploySpec) { s.Nodes[0].Name = "Site A" }, "nodes[0].name"},
		{"a reserved name", func(s *DeploySpec) { s.Nodes[0].Name = "operator" }, "must not be ca, operator, admin or reader"},
		{"the admin's directory", func(s *DeploySpec) { s.Nodes[0].Name = "admin" }, "must not be ca, operator, admin or reader"},
		{"a shared port", func(s *DeploySpec) { s.Nodes[1].ClientPort = 16222 }, "its client port 127.0.0.1:16222 is already the cluster port of site-a"},
		{"a shared http port", func(s *DeploySpec) { s.Nodes[1].HTTP = ""; s.Nodes[2].HTTP = "" }, "its http 127.0.0.1:9464"},
		{"a relative install dir", func(s *DeploySpec) { s.InstallDir = "etc" }, "install_dir = etc: must be an absolute path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := threeSites(t.TempDir())
			tc.edit(&spec)
			_, err := Deploy(spec)
			var ce *ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want a ConfigError saying %q", err, tc.want)
			}
		})
	}
}

func TestDeployInstallDir(t *testing.T) {
	dir := t.TempDir()
	spec := threeSites(dir)
	spec.InstallDir = "/etc/understudy/{node}"
	spec.DataDir = "/var/lib/understudy/{node}"
	spec.Agents = true
	res, err := Deploy(spec)
	if err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfigFile(filepath.Join(dir, "site-b", "node.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if c.NATS.NKey != "/etc/understudy/site-b/nats.nkey" || c.NATS.Server.TLS.CA != "/etc/understudy/site-b/ca.pem" ||
		c.DataDir != "/var/lib/understudy/site-b" || c.Agent == nil || c.Agent.ID != "site-b" ||
		c.Pairs[0].Procedures.Fence.Steps[0].Exec.Command != "/etc/understudy/site-b/hooks/pg-main/fence" ||
		c.Pairs[0].Procedures.Fence.Steps[0].Timeout != 2*time.Second {
		t.Errorf("site-b's node file: %+v", c)
	}
	if res.Nodes[1].Serve != "understudy serve --config /etc/understudy/site-b/node.yaml" {
		t.Errorf("serve %q", res.Nodes[1].Serve)
	}
	if w, _ := LoadConfigFile(filepath.Join(dir, "witness", "node.yaml")); w.Agent != nil {
		t.Errorf("the witness runs an agent")
	}
}

// The three node files of understudy init are a complete deployment: three
// serve runs on loopback form the NATS cluster over mutual TLS with their
// own identities, provision the assets, the pair's preferred primary takes
// leadership through its hooks, and the operator's files connect.
func TestDeployedThreeSitesServe(t *testing.T) {
	dir := t.TempDir()
	spec := threeSites(dir)
	for i := range spec.Nodes {
		n := &spec.Nodes[i]
		n.ClientPort, n.ClusterPort, n.HTTP = freePort(t), freePort(t), "127.0.0.1:"+strconv.Itoa(freePort(t))
	}
	res, err := Deploy(spec)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var done []chan error
	for _, n := range res.Nodes {
		c, err := LoadConfigFile(n.NodeFile)
		if err != nil {
			t.Fatal(err)
		}
		c.LogOutput = io.Discard
		ch := make(chan error, 1)
		done = append(done, ch)
		go func() { ch <- Serve(ctx, c) }()
	}
	t.Cleanup(func() {
		cancel()
		for i, ch := range done {
			if err := <-ch; err != nil {
				t.Errorf("%s: serve: %v", res.Nodes[i].Name, err)
			}
		}
	})
	for _, n := range spec.Nodes {
		eventually(t, n.Name+" healthy", 60*time.Second, func() error {
			resp, err := http.Get("http://" + n.HTTP + "/healthz")
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return errors.New(resp.Status)
			}
			return nil
		})
	}

	// The operator, with its files only.
	op := func(name string) string { return filepath.Join(res.Operator.Dir, name) }
	pair, err := tls.LoadX509KeyPair(op("cert.pem"), op("key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if ca, err := os.ReadFile(op("ca.pem")); err != nil || !pool.AppendCertsFromPEM(ca) {
		t.Fatalf("CA: %v", err)
	}
	auth, err := AuthOptions(ConnectOptions{NKey: op("operator.nk"), TLS: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{pair}}})
	if err != nil {
		t.Fatal(err)
	}
	violations := make(chan error, 16) // more than the refusals this test causes
	auth = append(auth, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case violations <- err:
		default:
		}
	}))
	nc, err := nats.Connect(res.URLs, auth...)
	if err != nil {
		t.Fatalf("the operator connects: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "site-a leads pg-main", 60*time.Second, func() error {
		kv, err := js.KeyValue(ctx, DefaultFailoverBucket)
		if err != nil {
			return err
		}
		st, err := kv.Status(ctx)
		if err != nil || st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Replicas != 3 {
			return fmt.Errorf("the failover bucket is not at R3: %v", err)
		}
		e, err := kv.Get(ctx, failover.LeaderKey("pg-main"))
		if err != nil {
			return err
		}
		l, err := failover.DecodeLeader(e.Value())
		if err != nil {
			return err
		}
		if l.Site != "site-a" || l.Fenced {
			return fmt.Errorf("leader %+v", l)
		}
		if leader := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Cluster.Leader; leader != "witness" {
			return fmt.Errorf("the failover bucket's leader is %s, not the witness", leader)
		}
		return nil
	})

	// Only the admin's files change an asset's settings.
	ad := func(name string) string { return filepath.Join(res.Admin.Dir, name) }
	apair, err := tls.LoadX509KeyPair(ad("cert.pem"), ad("key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	aauth, err := AuthOptions(ConnectOptions{NKey: ad("admin.nk"), TLS: &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{apair}}})
	if err != nil {
		t.Fatal(err)
	}
	anc, err := nats.Connect(res.URLs, aauth...)
	if err != nil {
		t.Fatalf("the admin connects: %v", err)
	}
	defer anc.Close()
	ajs, err := jetstream.New(anc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := ajs.Stream(ctx, "KV_"+DefaultFailoverBucket)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	if _, err := ajs.UpdateStream(ctx, cfg); err != nil {
		t.Errorf("the admin's stream update: %v", err)
	}
	uctx, ucancel := context.WithTimeout(ctx, time.Second)
	defer ucancel()
	if _, err := js.UpdateStream(uctx, cfg); err == nil {
		t.Errorf("the operator's stream update succeeded")
	}
	select {
	case err := <-violations:
		if !errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("the operator's stream update: %v, want a permission violation", err)
		}
	case <-time.After(refusedWait):
		t.Errorf("the operator's stream update: no permission violation")
	}
}
