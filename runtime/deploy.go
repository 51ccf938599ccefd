package runtime

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nkeys"
	"gopkg.in/yaml.v3"

	"understudy/actors/agent"
	"understudy/actors/failover"
	"understudy/actors/procedure"
)

// Defaults of a deployment made by [Deploy] (understudy init).
const (
	DefaultDeployCluster     = "understudy"
	DefaultDeployClientPort  = 4222
	DefaultDeployClusterPort = 6222
	// DefaultDeployDataDir is every node's data_dir when the spec names
	// an install directory and no data directory.
	DefaultDeployDataDir = "/var/lib/understudy"

	// CAValidity and CertValidity bound the deployment's certificates:
	// the CA outlives many rotations of the node certificates it signs.
	CAValidity   = 10 * 365 * 24 * time.Hour
	CertValidity = 2 * 365 * 24 * time.Hour

	// NodePlaceholder in DeploySpec.InstallDir and DataDir stands for
	// the node's name, for several nodes on one machine.
	NodePlaceholder = "{node}"
)

// The files Deploy writes, by name inside their directory.
const (
	DeployNodeFile     = "node.yaml"
	DeployCAFile       = "ca.pem"
	DeployCAKeyFile    = "ca-key.pem"
	DeployCertFile     = "cert.pem"
	DeployKeyFile      = "key.pem"
	DeployNKeyFile     = "nats.nkey"
	DeployOperatorSeed = "operator.nk"
	DeployReaderSeed   = "reader.nk"
	DeployAdminSeed    = "admin.nk"
	DeploySigningSeed  = "manifest-signing.nk"
	DeployEnvFile      = "env"
)

// DeploySpec describes a deployment for [Deploy]: its nodes (sites and
// witnesses) and its pairs.
type DeploySpec struct {
	// Dir receives everything: the CA (ca/), one directory per node, the
	// operator's (operator/), the admin's (admin/) and the reader's
	// (reader/) files.
	Dir string
	// Cluster is the NATS cluster's name (default DefaultDeployCluster).
	Cluster string
	Nodes   []DeployNode
	Pairs   []DeployPair
	// InstallDir is where each node's directory is copied on its machine
	// (e.g. /etc/understudy): the node file names its files there, by
	// absolute path. NodePlaceholder is replaced by the node's name.
	// Empty: the files are used where Deploy writes them (<Dir>/<node>).
	InstallDir string
	// DataDir is every node's data_dir (NodePlaceholder is replaced).
	// Empty: <Dir>/<node>/data without InstallDir, else
	// DefaultDeployDataDir.
	DataDir string
	// Agents gives every node that is not a witness an agent section
	// (the agent needs understudy-libvirt installed on the node).
	Agents bool
	// Loopback adds localhost, 127.0.0.1 and ::1 to every node's
	// certificate: for deployments on one machine, and for clients that
	// reach a node's server on its loopback address.
	Loopback bool
	// Now is the certificates' start (default time.Now); for tests.
	Now time.Time
}

// DeployNode is one node of a deployment.
type DeployNode struct {
	Name string
	// Host is the IP address or DNS name at which the other nodes and
	// the operator reach this node: it is the certificate's name.
	Host        string
	ClientPort  int // default DefaultDeployClientPort
	ClusterPort int // default DefaultDeployClusterPort
	// HTTP is the node's /healthz, /metrics host:port (default
	// DefaultHTTPAddr).
	HTTP string
	// Witness nodes run no pair member and no agent: they only hold a
	// replica of the NATS cluster's JetStream assets.
	Witness bool
	// DataDir overrides DeploySpec.DataDir for this node.
	DataDir string
}

// DeployPair is one failover pair: each member runs on the node of its name.
type DeployPair struct {
	Name    string
	Primary string // the preferred primary's node
	Replica string
}

// DeployResult says what Deploy wrote and what goes where.
type DeployResult struct {
	Dir     string         `json:"dir"`
	Cluster string         `json:"cluster"`
	CA      string         `json:"ca"` // the CA certificate; its key stays in Dir/ca
	Nodes   []DeployedNode `json:"nodes"`
	// Operator may change rules, request switchovers and write desired
	// state; its directory also holds the manifest signing key.
	Operator DeployedIdentity `json:"operator"`
	// Admin may change the assets' settings (a stream update), which is a
	// write of anything: its directory is to be kept offline.
	Admin  DeployedIdentity `json:"admin"`
	Reader DeployedIdentity `json:"reader"`
	// ManifestKey is the public key ("O...") manifests must be signed with.
	ManifestKey string `json:"manifest_key"`
	// URLs are the nodes' client URLs, comma-separated, for the CLI.
	URLs string `json:"urls"`
	// Created are the files written for the first time, Updated the node
	// files rewritten because the deployment changed (the previous one is
	// kept as node.yaml.prev), Kept the existing files reused.
	Created  []string `json:"created"`
	Updated  []string `json:"updated"`
	Kept     []string `json:"kept"`
	Warnings []string `json:"warnings"`
}

// DeployedNode is one node's directory and how to start it.
type DeployedNode struct {
	Name    string `json:"name"`
	Host    string `json:"host"`
	Witness bool   `json:"witness"`
	NKey    string `json:"nkey"` // public user nkey
	// Dir is the node's directory in DeploySpec.Dir, to copy to
	// InstallDir on the node's machine.
	Dir        string   `json:"dir"`
	InstallDir string   `json:"install_dir"`
	NodeFile   string   `json:"node_file"` // at InstallDir
	Files      []string `json:"files"`     // relative to Dir
	Pairs      []string `json:"pairs"`
	Serve      string   `json:"serve"` // the command that starts it
}

// DeployedIdentity is the operator's, the admin's or the reader's directory.
type DeployedIdentity struct {
	Dir  string `json:"dir"`
	NKey string `json:"nkey"` // public user nkey
	Env  string `json:"env"`  // the file to source: UNDERSTUDY_NATS_* for the CLI
}

// Deploy creates in spec.Dir what a secured deployment needs: a CA, a
// server and client certificate per node, the NATS identities (node,
// operator, admin and reader user nkeys), a manifest signing key, and one
// directory per node with its node file and exactly the files it needs.
// Every node file pins every node's certificate (cert_sha256): the routes
// of a node left out of the spec are refused once the others run the new
// files.
// Files are written 0600, directories 0700.
//
// It is idempotent: existing keys and certificates are reused, only the
// missing ones are created (add a node by running it again with one more
// node); a key is never overwritten. Node files are rewritten when the
// deployment changed, keeping the previous one as node.yaml.prev. An
// existing file that does not fit (a certificate for another host, a key
// of the wrong type) is an error naming the file: remove it to have it
// created again. Errors in the spec are *ConfigError values.
func Deploy(spec DeploySpec) (DeployResult, error) {
	if err := spec.check(); err != nil {
		return DeployResult{}, err
	}
	d, err := newDeployer(spec)
	if err != nil {
		return DeployResult{}, err
	}
	if err := d.run(); err != nil {
		return DeployResult{}, err
	}
	return d.res, nil
}

// nodeNameRule is what a node name must be: a site name (a NATS subject
// token) and an agent id at once.
func nodeNameRule(name string) string {
	if err := failover.CheckName(name); err != nil {
		return err.Error()
	}
	if rule := agent.CheckID(name); rule != "" {
		return rule
	}
	switch name {
	case "ca", "operator", "admin", "reader":
		return "must not be ca, operator, admin or reader: those directories hold the deployment's other files"
	}
	return ""
}

func (s *DeploySpec) check() error {
	var errs []error
	bad := func(field, rule, value string) {
		errs = append(errs, &ConfigError{Field: field, Rule: rule, Value: value})
	}
	s.Nodes = slices.Clone(s.Nodes) // defaults are filled in below
	if s.Dir == "" {
		bad("dir", "must be set: the directory that receives the deployment", "")
	}
	if s.Cluster == "" {
		s.Cluster = DefaultDeployCluster
	}
	if !serverNameRE.MatchString(s.Cluster) || strings.ContainsAny(s.Cluster, ".*>") {
		bad("cluster", "must be a NATS cluster name: no spaces, '.', '*' or '>'", s.Cluster)
	}
	if s.Now.IsZero() {
		s.Now = time.Now()
	}
	for _, p := range []struct{ field, v string }{{"install_dir", s.InstallDir}, {"data_dir", s.DataDir}} {
		if p.v != "" && !filepath.IsAbs(p.v) {
			bad(p.field, "must be an absolute path (it is written into the node files)", p.v)
		}
	}
	nodes := map[string]*DeployNode{}
	type endpoint struct{ host, port string }
	used := map[endpoint]string{}
	switch n := len(s.Nodes); {
	case n == 0:
		bad("nodes", "must name at least one node", "")
	case n == 2:
		bad("nodes", "must be one, or three or more: a NATS cluster of two loses its quorum with either node; add a witness node on a third site", strconv.Itoa(n))
	}
	for i := range s.Nodes {
		n := &s.Nodes[i]
		field := "nodes[" + strconv.Itoa(i) + "]"
		if rule := nodeNameRule(n.Name); rule != "" {
			bad(field+".name", rule, n.Name)
			continue
		}
		if nodes[n.Name] != nil {
			bad(field+".name", "must be unique", n.Name)
			continue
		}
		nodes[n.Name] = n
		if n.Host == "" || strings.ContainsAny(n.Host, " /:[]") && net.ParseIP(n.Host) == nil {
			bad(field+".host", "must be an IP address or a DNS name", n.Host)
		}
		if n.ClientPort == 0 {
			n.ClientPort = DefaultDeployClientPort
		}
		if n.ClusterPort == 0 {
			n.ClusterPort = DefaultDeployClusterPort
		}
		if n.HTTP == "" {
			n.HTTP = DefaultHTTPAddr
		}
		for _, p := range []struct {
			field string
			port  int
		}{{".client_port", n.ClientPort}, {".cluster_port", n.ClusterPort}} {
			if p.port < 1 || p.port > 65535 {
				bad(field+p.field, "must be a port 1..65535", strconv.Itoa(p.port))
			}
		}
		if _, _, err := splitListen(n.HTTP, false); err != nil {
			bad(field+".http", err.Error(), n.HTTP)
		}
		if n.DataDir != "" && !filepath.IsAbs(n.DataDir) {
			bad(field+".data_dir", "must be an absolute path", n.DataDir)
		}
		httpHost, httpPort, _ := net.SplitHostPort(n.HTTP)
		for _, e := range []struct {
			ep         endpoint
			what, addr string
		}{
			{endpoint{n.Host, strconv.Itoa(n.ClientPort)}, "client port", net.JoinHostPort(n.Host, strconv.Itoa(n.ClientPort))},
			{endpoint{n.Host, strconv.Itoa(n.ClusterPort)}, "cluster port", net.JoinHostPort(n.Host, strconv.Itoa(n.ClusterPort))},
			{endpoint{hostOfHTTP(httpHost, n.Host), httpPort}, "http", n.HTTP},
		} {
			if other, dup := used[e.ep]; dup {
				bad(field, "its "+e.what+" "+e.addr+" is already the "+other+": give each node on one machine its own ports", n.Name)
			}
			used[e.ep] = e.what + " of " + n.Name
		}
	}
	pairs := map[string]bool{}
	for i, p := range s.Pairs {
		field := "pairs[" + strconv.Itoa(i) + "]"
		if err := failover.DefaultRules(p.Name, p.Primary, p.Replica).Validate(); err != nil {
			var ce *ConfigError
			if errors.As(err, &ce) {
				bad(field+"."+ce.Field, ce.Rule, ce.Value)
			} else {
				bad(field, err.Error(), p.Name)
			}
			continue
		}
		if pairs[p.Name] {
			bad(field+".name", "must be unique", p.Name)
		}
		pairs[p.Name] = true
		for _, m := range []struct{ field, node string }{{".primary", p.Primary}, {".replica", p.Replica}} {
			switch n := nodes[m.node]; {
			case n == nil:
				bad(field+m.field, "must name a node of the deployment", m.node)
			case n.Witness:
				bad(field+m.field, "must name a node that is not a witness: a witness runs no pair member", m.node)
			}
		}
	}
	return errors.Join(errs...)
}

// hostOfHTTP is the host an HTTP listener occupies, for the check that no
// two nodes on one machine share a port: a wildcard or loopback listener
// is on the node's host.
func hostOfHTTP(httpHost, nodeHost string) string {
	if ip := net.ParseIP(nodeHost); nodeHost == "localhost" || ip != nil && ip.IsLoopback() {
		nodeHost = "loopback" // nodes on one machine share its loopback ports
	}
	if ip := net.ParseIP(httpHost); httpHost == "" || httpHost == "localhost" || ip != nil && (ip.IsLoopback() || ip.IsUnspecified()) {
		return nodeHost
	}
	return httpHost
}

type deployer struct {
	spec   DeploySpec
	dir    string // absolute
	res    DeployResult
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	caPEM  []byte
}

func newDeployer(spec DeploySpec) (*deployer, error) {
	dir, err := filepath.Abs(spec.Dir)
	if err != nil {
		return nil, &ConfigError{Field: "dir", Rule: "must be a usable path: " + err.Error(), Value: spec.Dir}
	}
	if err := mkdirPrivate(dir); err != nil {
		return nil, err
	}
	return &deployer{spec: spec, dir: dir, res: DeployResult{Dir: dir, Cluster: spec.Cluster}}, nil
}

func (d *deployer) run() error {
	if err := d.loadOrCreateCA(); err != nil {
		return err
	}
	operator, err := d.seed(filepath.Join("operator", DeployOperatorSeed), nkeys.PrefixByteUser)
	if err != nil {
		return err
	}
	reader, err := d.seed(filepath.Join("reader", DeployReaderSeed), nkeys.PrefixByteUser)
	if err != nil {
		return err
	}
	admin, err := d.seed(filepath.Join("admin", DeployAdminSeed), nkeys.PrefixByteUser)
	if err != nil {
		return err
	}
	signing, err := d.seed(filepath.Join("operator", DeploySigningSeed), nkeys.PrefixByteOperator)
	if err != nil {
		return err
	}
	d.res.ManifestKey = signing
	d.res.Operator.NKey, d.res.Reader.NKey, d.res.Admin.NKey = operator, reader, admin

	sec := &SecuritySection{Nodes: map[string]NodeIdentity{}, Operators: []string{operator}, Readers: []string{reader}, Admins: []string{admin}, ManifestKeys: []string{signing}}
	var urls []string
	for _, n := range d.spec.Nodes {
		pub, err := d.seed(filepath.Join(n.Name, DeployNKeyFile), nkeys.PrefixByteUser)
		if err != nil {
			return err
		}
		pin, err := d.cert(n.Name, n.Name, n.Host, true)
		if err != nil {
			return err
		}
		id := NodeIdentity{NKey: pub, Pairs: d.pairsOf(n.Name), Agent: "-", CertSHA256: pin}
		if !n.Witness {
			id.Agent = n.Name
		}
		sec.Nodes[n.Name] = id
		urls = append(urls, "tls://"+net.JoinHostPort(n.Host, strconv.Itoa(n.ClientPort)))
		if err := d.copyCA(n.Name); err != nil {
			return err
		}
	}
	d.res.URLs = strings.Join(urls, ",")

	for _, n := range d.spec.Nodes {
		if err := d.node(n, sec); err != nil {
			return err
		}
	}
	for _, who := range []string{"operator", "admin", "reader"} {
		if err := d.identity(who); err != nil {
			return err
		}
	}
	d.warnStrays()
	return nil
}

func (d *deployer) pairsOf(node string) []string {
	var out []string
	for _, p := range d.spec.Pairs {
		if p.Primary == node || p.Replica == node {
			out = append(out, p.Name)
		}
	}
	return out
}

// installDir is where node's files are on its machine.
func (d *deployer) installDir(node string) string {
	if d.spec.InstallDir == "" {
		return filepath.Join(d.dir, node)
	}
	return filepath.Clean(strings.ReplaceAll(d.spec.InstallDir, NodePlaceholder, node))
}

func (d *deployer) dataDir(n DeployNode) string {
	switch {
	case n.DataDir != "":
		return n.DataDir
	case d.spec.DataDir != "":
		return filepath.Clean(strings.ReplaceAll(d.spec.DataDir, NodePlaceholder, n.Name))
	case d.spec.InstallDir == "":
		return filepath.Join(d.dir, n.Name, "data")
	}
	return DefaultDeployDataDir
}

// node writes a node's node file, pair files and hooks.
func (d *deployer) node(n DeployNode, sec *SecuritySection) error {
	inst := d.installDir(n.Name)
	in := func(name string) string { return filepath.Join(inst, name) }
	serverTLS := ServerTLS{CA: in(DeployCAFile), Cert: in(DeployCertFile), Key: in(DeployKeyFile)}
	c := Config{
		Node:    n.Name,
		DataDir: d.dataDir(n),
		NATS: NATSConfig{
			Listen: net.JoinHostPort(listenHost(n.Host), strconv.Itoa(n.ClientPort)),
			NKey:   in(DeployNKeyFile),
			Server: ServerSection{Name: n.Name, TLS: serverTLS},
		},
		HTTP:     n.HTTP,
		Security: sec,
	}
	if len(d.spec.Nodes) > 1 {
		// The routes' TLS is left out: it defaults to nats.server.tls.
		cl := &ClusterSection{Name: d.spec.Cluster, Listen: net.JoinHostPort(listenHost(n.Host), strconv.Itoa(n.ClusterPort))}
		for _, o := range d.spec.Nodes {
			if o.Name != n.Name {
				cl.Routes = append(cl.Routes, "tls://"+net.JoinHostPort(o.Host, strconv.Itoa(o.ClusterPort)))
			}
		}
		c.NATS.Server.Cluster = cl
		// The stream leaders stay on the (first) witness, so that losing a
		// pair's site never waits for a JetStream leader election.
		if i := slices.IndexFunc(d.spec.Nodes, func(n DeployNode) bool { return n.Witness }); i >= 0 {
			c.Assets.PreferredLeader = d.spec.Nodes[i].Name
		}
	}
	if d.spec.Agents && !n.Witness {
		c.Agent = &AgentSection{ID: n.Name}
	}
	files := []string{DeployNodeFile, DeployCAFile, DeployCertFile, DeployKeyFile, DeployNKeyFile}
	var pairs []string
	for _, p := range d.spec.Pairs {
		if p.Primary != n.Name && p.Replica != n.Name {
			continue
		}
		pairs = append(pairs, p.Name)
		rel := filepath.Join("pairs", p.Name+".yaml")
		if err := d.pairFile(filepath.Join(n.Name, rel), p); err != nil {
			return err
		}
		rules, err := LoadPairFile(filepath.Join(d.dir, n.Name, rel), false)
		if err != nil {
			return err
		}
		procs := procedure.Spec{}
		for _, h := range []struct {
			chain   *procedure.ChainSpec
			name    string
			timeout time.Duration
		}{
			// The fence chain must fit in fence_grace (its worst case is
			// checked at load); the others take the default step timeout.
			{&procs.Fence, "fence", rules.FenceGrace},
			{&procs.Promote, "promote", procedure.DefaultStepTimeout},
			{&procs.Demote, "demote", procedure.DefaultStepTimeout},
		} {
			hook := filepath.Join("hooks", p.Name, h.name)
			if err := d.hook(filepath.Join(n.Name, hook), p.Name, h.name); err != nil {
				return err
			}
			files = append(files, hook)
			h.chain.Steps = []procedure.StepSpec{{Name: h.name, Driver: "exec", Timeout: h.timeout, Exec: &procedure.ExecSpec{Command: in(hook)}}}
		}
		c.Pairs = append(c.Pairs, PairMember{File: rel, Procedures: procs})
		files = append(files, rel)
	}
	where := "Install this directory as " + inst + " on the node's machine."
	if d.spec.InstallDir == "" {
		where = "Its paths are this directory's: run init with --install-dir for another place."
	}
	body, err := MarshalNodeFile(c, "Node "+n.Name+" of the NATS cluster "+d.spec.Cluster+", written by understudy init.\n"+where+"\n"+
		"Re-running init rewrites this file (the previous one is kept as node.yaml.prev);\n"+
		"it never rewrites the pair files and hooks: edit those.")
	if err != nil {
		return err
	}
	if err := d.rewrite(filepath.Join(n.Name, DeployNodeFile), body); err != nil {
		return err
	}
	slices.Sort(files)
	d.res.Nodes = append(d.res.Nodes, DeployedNode{
		Name: n.Name, Host: n.Host, Witness: n.Witness, NKey: sec.Nodes[n.Name].NKey,
		Dir: filepath.Join(d.dir, n.Name), InstallDir: inst, NodeFile: in(DeployNodeFile),
		Files: files, Pairs: pairs,
		Serve: "understudy serve --config " + in(DeployNodeFile),
	})
	return nil
}

// listenHost is the address a node listens on: its host when that is an
// IP address, every address when it is a DNS name (which may resolve to
// several).
func listenHost(host string) string {
	if net.ParseIP(host) != nil {
		return host
	}
	return "0.0.0.0"
}

// pairFile writes a pair file with the default rules, unless one exists:
// then it must be the same pair with the same members.
func (d *deployer) pairFile(rel string, p DeployPair) error {
	path := filepath.Join(d.dir, rel)
	if _, err := os.Stat(path); err == nil {
		rules, err := LoadPairFile(path, false)
		if err != nil {
			return fmt.Errorf("deploy: %w (edit it, or remove it to have it written again)", err)
		}
		if rules.Pair != p.Name || rules.Primary != p.Primary || rules.Replica != p.Replica {
			return fmt.Errorf("deploy: %s is pair %s with primary %s and replica %s, not %s with %s and %s: fix the pair file or the spec (remove the file to have it written again)",
				path, rules.Pair, rules.Primary, rules.Replica, p.Name, p.Primary, p.Replica)
		}
		d.res.Kept = append(d.res.Kept, path)
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("deploy: %w", err)
	}
	body, err := yaml.Marshal(PairFileOf(failover.DefaultRules(p.Name, p.Primary, p.Replica)))
	if err != nil {
		return err
	}
	head := "# Pair " + p.Name + ": its rules (docs/failover.md). understudy init wrote the\n" +
		"# defaults and never rewrites this file. Both members' pair files must agree.\n"
	return d.create(rel, append([]byte(head), body...), 0o600)
}

// hook writes a placeholder procedure, unless one exists.
func (d *deployer) hook(rel, pair, chain string) error {
	what := map[string]string{
		"fence":   "make sure this site's copy of the workload stops serving (stop it, cut its network)",
		"promote": "make this site's copy of the workload the primary",
		"demote":  "make this site's copy of the workload a replica",
	}[chain]
	body := "#!/bin/sh\n" +
		"# The " + chain + " procedure of this site's member of pair " + pair + ":\n" +
		"# " + what + ".\n" +
		"# understudy init wrote this placeholder, which does nothing, and never\n" +
		"# rewrites it: replace it with the workload's own procedure (docs/failover.md).\n" +
		"echo \"understudy: pair " + pair + ": " + chain + " is a placeholder (" + "$0" + ")\" >&2\n" +
		"exit 0\n"
	if _, err := os.Stat(filepath.Join(d.dir, rel)); err == nil {
		d.res.Kept = append(d.res.Kept, filepath.Join(d.dir, rel))
		return nil
	}
	return d.create(rel, []byte(body), 0o700)
}

// identity writes the operator's, the admin's or the reader's directory:
// the CA, a client certificate and an env file for the CLI.
func (d *deployer) identity(who string) error {
	if _, err := d.cert(who, who, "", false); err != nil {
		return err
	}
	if err := d.copyCA(who); err != nil {
		return err
	}
	dir := filepath.Join(d.dir, who)
	seed := DeployOperatorSeed
	id := &d.res.Operator
	switch who {
	case "reader":
		seed, id = DeployReaderSeed, &d.res.Reader
	case "admin":
		seed, id = DeployAdminSeed, &d.res.Admin
	}
	var env strings.Builder
	fmt.Fprintf(&env, "# The %s's connection to the %s cluster, for the understudy CLI:\n# . %s\n", who, d.spec.Cluster, filepath.Join(dir, DeployEnvFile))
	for _, kv := range [][2]string{
		{"UNDERSTUDY_NATS_URL", d.res.URLs},
		{"UNDERSTUDY_NATS_TLS_CA", filepath.Join(dir, DeployCAFile)},
		{"UNDERSTUDY_NATS_TLS_CERT", filepath.Join(dir, DeployCertFile)},
		{"UNDERSTUDY_NATS_TLS_KEY", filepath.Join(dir, DeployKeyFile)},
		{"UNDERSTUDY_NATS_NKEY", filepath.Join(dir, seed)},
	} {
		fmt.Fprintf(&env, "export %s=%s\n", kv[0], shellQuote(kv[1]))
	}
	if who == "operator" {
		fmt.Fprintf(&env, "export UNDERSTUDY_SIGN_KEY=%s\n", shellQuote(filepath.Join(dir, DeploySigningSeed)))
	}
	if err := d.rewrite(filepath.Join(who, DeployEnvFile), []byte(env.String())); err != nil {
		return err
	}
	id.Dir, id.Env = dir, filepath.Join(dir, DeployEnvFile)
	return nil
}

func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:,=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// warnStrays reports node directories of an earlier run that the spec no
// longer names: left alone, but no longer trusted by the other nodes.
func (d *deployer) warnStrays() {
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || name == "ca" || name == "operator" || name == "admin" || name == "reader" {
			continue
		}
		if slices.ContainsFunc(d.spec.Nodes, func(n DeployNode) bool { return n.Name == name }) {
			continue
		}
		if _, err := os.Stat(filepath.Join(d.dir, name, DeployNodeFile)); err == nil {
			d.res.Warnings = append(d.res.Warnings, fmt.Sprintf("%s: node %s is not in this deployment any more: left as it was; the other nodes' files no longer trust it (its nkey nor its certificate as a route) once they run them", filepath.Join(d.dir, name), name))
		}
	}
}

// --- keys and certificates ---

// seed returns the public key of the nkey seed at rel, creating it when
// absent. An existing file must hold a seed of the wanted type.
func (d *deployer) seed(rel string, prefix nkeys.PrefixByte) (string, error) {
	path := filepath.Join(d.dir, rel)
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		kp, err := nkeys.FromSeed(bytes.TrimSpace(data))
		if err != nil {
			return "", fmt.Errorf("deploy: %s exists but is not an nkey seed (%v): move it away to have a new key created", path, err)
		}
		defer kp.Wipe()
		pub, err := kp.PublicKey()
		if err != nil {
			return "", err
		}
		if !nkeys.IsValidPublicKey(pub) || nkeys.Prefix(pub) != prefix {
			return "", fmt.Errorf("deploy: %s holds a %s key, not a %s key: move it away to have a new key created", path, nkeys.Prefix(pub), prefix)
		}
		d.res.Kept = append(d.res.Kept, path)
		return pub, nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("deploy: %w", err)
	}
	var kp nkeys.KeyPair
	if prefix == nkeys.PrefixByteOperator {
		kp, err = nkeys.CreateOperator()
	} else {
		kp, err = nkeys.CreateUser()
	}
	if err != nil {
		return "", fmt.Errorf("deploy: create an nkey: %w", err)
	}
	defer kp.Wipe()
	seed, err := kp.Seed()
	if err != nil {
		return "", err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return "", err
	}
	if err := d.create(rel, append(seed, '\n'), 0o600); err != nil {
		return "", err
	}
	return pub, nil
}

func (d *deployer) loadOrCreateCA() error {
	certPath := filepath.Join(d.dir, "ca", DeployCAFile)
	keyPath := filepath.Join(d.dir, "ca", DeployCAKeyFile)
	_, certErr := os.Stat(certPath)
	_, keyErr := os.Stat(keyPath)
	switch {
	case certErr == nil && keyErr == nil:
		pair, err := tls.LoadX509KeyPair(certPath, keyPath)
		if err != nil {
			return fmt.Errorf("deploy: the CA in %s: %w", filepath.Dir(certPath), err)
		}
		key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
		if !ok {
			return fmt.Errorf("deploy: the CA key %s is not an ECDSA key", keyPath)
		}
		cert, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			return fmt.Errorf("deploy: the CA %s: %w", certPath, err)
		}
		if !cert.IsCA {
			return fmt.Errorf("deploy: %s is not a CA certificate", certPath)
		}
		if d.spec.Now.After(cert.NotAfter) {
			return fmt.Errorf("deploy: the CA %s expired on %s: rotate it (docs/security.md)", certPath, cert.NotAfter.Format(time.DateOnly))
		}
		d.caCert, d.caKey, d.caPEM = cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
		d.res.Kept = append(d.res.Kept, certPath, keyPath)
	case errors.Is(certErr, fs.ErrNotExist) && errors.Is(keyErr, fs.ErrNotExist):
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return fmt.Errorf("deploy: CA key: %w", err)
		}
		tmpl := &x509.Certificate{
			SerialNumber:          randomSerial(),
			Subject:               pkix.Name{CommonName: d.spec.Cluster + " understudy CA", Organization: []string{"understudy"}},
			NotBefore:             d.spec.Now.Add(-time.Hour),
			NotAfter:              d.spec.Now.Add(CAValidity),
			IsCA:                  true,
			BasicConstraintsValid: true,
			MaxPathLenZero:        true,
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			return fmt.Errorf("deploy: CA certificate: %w", err)
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return err
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return err
		}
		d.caCert, d.caKey = cert, key
		d.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		if err := d.create(filepath.Join("ca", DeployCAKeyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
			return err
		}
		if err := d.create(filepath.Join("ca", DeployCAFile), d.caPEM, 0o600); err != nil {
			return err
		}
	default:
		return fmt.Errorf("deploy: %s holds only half of the CA (ca.pem and ca-key.pem go together): restore the other file, or remove the directory to create a new CA (and new certificates for every node)", filepath.Dir(certPath))
	}
	d.res.CA = certPath
	return nil
}

// copyCA gives a directory its copy of the CA certificate.
func (d *deployer) copyCA(who string) error {
	rel := filepath.Join(who, DeployCAFile)
	path := filepath.Join(d.dir, rel)
	have, err := os.ReadFile(path)
	switch {
	case err == nil && bytes.Equal(have, d.caPEM):
		d.res.Kept = append(d.res.Kept, path)
		return nil
	case err == nil:
		return fmt.Errorf("deploy: %s is not the CA of %s: the CA changed since it was written; remove it (and the certificates next to it) to have them written again", path, filepath.Join(d.dir, "ca"))
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("deploy: %w", err)
	}
	return d.create(rel, d.caPEM, 0o600)
}

func randomSerial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic("crypto/rand failed: " + err.Error()) // it does not, on supported platforms
	}
	return n.Add(n, big.NewInt(1))
}

// cert makes sure dir/cert.pem and key.pem hold a certificate signed by
// the CA for cn: a server and client one for host when server, a client
// one otherwise. An existing certificate that does not fit is an error.
// It returns the certificate's pin (CertSHA256).
func (d *deployer) cert(who, cn, host string, server bool) (string, error) {
	certRel, keyRel := filepath.Join(who, DeployCertFile), filepath.Join(who, DeployKeyFile)
	certPath, keyPath := filepath.Join(d.dir, certRel), filepath.Join(d.dir, keyRel)
	_, certErr := os.Stat(certPath)
	_, keyErr := os.Stat(keyPath)
	if certErr == nil && keyErr == nil {
		cert, err := d.checkCert(certPath, keyPath, host, server)
		if err != nil {
			return "", fmt.Errorf("deploy: %s: %w: remove %s and %s to have them issued again", certPath, err, DeployCertFile, DeployKeyFile)
		}
		d.res.Kept = append(d.res.Kept, certPath, keyPath)
		return CertSHA256(cert), nil
	}
	if certErr == nil || keyErr == nil {
		return "", fmt.Errorf("deploy: %s holds only one of %s and %s: remove it to have both issued", filepath.Join(d.dir, who), DeployCertFile, DeployKeyFile)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", fmt.Errorf("deploy: key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: randomSerial(),
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"understudy " + d.spec.Cluster}},
		NotBefore:    d.spec.Now.Add(-time.Hour),
		NotAfter:     d.spec.Now.Add(CertValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if tmpl.NotAfter.After(d.caCert.NotAfter) {
		tmpl.NotAfter = d.caCert.NotAfter
	}
	if server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		addSAN(tmpl, host)
		if d.spec.Loopback {
			addSAN(tmpl, "localhost")
			addSAN(tmpl, "127.0.0.1")
			addSAN(tmpl, "::1")
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, d.caCert, &key.PublicKey, d.caKey)
	if err != nil {
		return "", fmt.Errorf("deploy: certificate for %s: %w", cn, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return "", err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", err
	}
	if err := d.create(keyRel, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return "", err
	}
	return CertSHA256(cert), d.create(certRel, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
}

func addSAN(c *x509.Certificate, host string) {
	if ip := net.ParseIP(host); ip != nil {
		if !slices.ContainsFunc(c.IPAddresses, ip.Equal) {
			c.IPAddresses = append(c.IPAddresses, ip)
		}
		return
	}
	if !slices.Contains(c.DNSNames, host) {
		c.DNSNames = append(c.DNSNames, host)
	}
}

// checkCert says why an existing certificate does not fit, if it does not,
// and returns it when it does.
func (d *deployer) checkCert(certPath, keyPath, host string, server bool) (*x509.Certificate, error) {
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AddCert(d.caCert)
	usage := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if server {
		usage = append(usage, x509.ExtKeyUsageServerAuth)
	}
	for _, u := range usage {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: d.spec.Now, KeyUsages: []x509.ExtKeyUsage{u}}); err != nil {
			return nil, fmt.Errorf("not a valid certificate of the CA for this use: %w", err)
		}
	}
	if server {
		names := []string{host}
		if d.spec.Loopback {
			names = append(names, "localhost", "127.0.0.1")
		}
		for _, h := range names {
			if err := cert.VerifyHostname(h); err != nil {
				return nil, fmt.Errorf("not for host %s (%v)", h, err)
			}
		}
	}
	if left := cert.NotAfter.Sub(d.spec.Now); left < 30*24*time.Hour {
		d.res.Warnings = append(d.res.Warnings, fmt.Sprintf("%s expires on %s: remove it and its key, run init again and install the new ones (docs/security.md)", certPath, cert.NotAfter.Format(time.DateOnly)))
	}
	return cert, nil
}

// --- files ---

func mkdirPrivate(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("deploy: %w", err)
	}
	return nil
}

// create writes a new file (never replacing one) with perm.
func (d *deployer) create(rel string, data []byte, perm os.FileMode) error {
	path := filepath.Join(d.dir, rel)
	if err := mkdirPrivate(filepath.Dir(path)); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("deploy: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("deploy: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("deploy: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("deploy: %w", err)
	}
	d.res.Created = append(d.res.Created, path)
	return nil
}

// rewrite writes a generated file that holds no key (a node file, an env
// file): created when absent, replaced when its content changed, the
// previous content kept as <name>.prev.
func (d *deployer) rewrite(rel string, data []byte) error {
	path := filepath.Join(d.dir, rel)
	have, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return d.create(rel, data, 0o600)
	case err != nil:
		return fmt.Errorf("deploy: %w", err)
	case bytes.Equal(have, data):
		d.res.Kept = append(d.res.Kept, path)
		return nil
	}
	tmp := path + ".tmp"
	os.Remove(tmp)
	if err := d.create(rel+".tmp", data, 0o600); err != nil {
		return err
	}
	d.res.Created = d.res.Created[:len(d.res.Created)-1]
	if err := os.Rename(path, path+".prev"); err != nil {
		return fmt.Errorf("deploy: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("deploy: %w", err)
	}
	d.res.Updated = append(d.res.Updated, path)
	return nil
}

// MarshalNodeFile renders a node configuration as a node file: only the
// keys that are set (absent keys take their defaults at load), with head
// as the file's leading comment.
func MarshalNodeFile(c Config, head string) ([]byte, error) {
	var doc yaml.Node
	if err := doc.Encode(c); err != nil {
		return nil, fmt.Errorf("node file: %w", err)
	}
	pruneZero(&doc)
	doc.HeadComment = head
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("node file: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// pruneZero removes from a mapping the keys whose values are zero (empty
// string, false, 0, 0s, null) or empty collections, recursively; it
// reports whether n itself is now empty.
func pruneZero(n *yaml.Node) bool {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			pruneZero(c)
		}
		return false
	case yaml.MappingNode:
		kept := n.Content[:0]
		for i := 0; i+1 < len(n.Content); i += 2 {
			if !pruneZero(n.Content[i+1]) {
				kept = append(kept, n.Content[i], n.Content[i+1])
			}
		}
		n.Content = kept
		return len(n.Content) == 0
	case yaml.SequenceNode:
		for _, c := range n.Content {
			pruneZero(c)
		}
		return len(n.Content) == 0
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!null":
			return true
		case "!!str":
			// "0s": a zero time.Duration, which yaml.v3 writes as a string.
			return n.Value == "" || n.Value == "0s"
		case "!!bool":
			return n.Value == "false"
		case "!!int", "!!float":
			return n.Value == "0"
		}
	}
	return false
}
