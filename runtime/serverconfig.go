package runtime

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nkeys"

	"understudy/actors/agent"
	"understudy/actors/failover"
)

// The resolution of the node file's nats.nkey, nats.server and security
// sections: the node's identity, its embedded server's TLS and cluster,
// and the deployment's identities (docs/security.md).

// serverSettings are the embedded server's own typed values.
type serverSettings struct {
	name string
	// tls is the client port's: the server's certificate, and client
	// certificates required and verified against the CA. Nil without
	// nats.server.tls.
	tls     *tls.Config
	cluster *clusterSettings // nil: a single server
}

// clusterSettings make the embedded server a member of a NATS cluster.
type clusterSettings struct {
	name   string
	host   string
	port   int // -1: any free port
	routes []*url.URL
	tls    *tls.Config // mutual TLS of the routes; nil on loopback without TLS
	// pinned are the certificates (CertSHA256) accepted as routes: every
	// node's of the security section; nil without one.
	pinned []string
}

// certPinRE is a CertSHA256: 64 hex digits.
var certPinRE = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)

// CertSHA256 is the pin of a certificate as nats-server's pinned_certs
// (and security.nodes.<node>.cert_sha256) take it: the lower-case hex
// SHA-256 of its DER SubjectPublicKeyInfo. It pins the key, so a
// certificate issued again for the same key keeps its pin.
func CertSHA256(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return hex.EncodeToString(sum[:])
}

// nkeySeedLimit bounds the size of a seed file: a bare seed is 58 bytes,
// a decorated one a few hundred.
const nkeySeedLimit = 16 << 10

// LoadUserKey reads a user nkey seed ("SU...") from a file holding the
// bare seed or a decorated one (a .nk or .creds file). Wipe the returned
// key pair when done with it.
func LoadUserKey(path string) (nkeys.KeyPair, error) {
	data, err := readBounded(path, nkeySeedLimit)
	if err != nil {
		return nil, err
	}
	defer clear(data)
	kp, err := nkeys.ParseDecoratedNKey(data)
	if err != nil {
		return nil, fmt.Errorf("no nkey seed in the file: %w", err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		kp.Wipe()
		return nil, err
	}
	if !nkeys.IsValidPublicUserKey(pub) {
		kp.Wipe()
		return nil, fmt.Errorf("the seed is not a user seed (SU...): its public key %s is a %s key", pub, prefixName(pub))
	}
	return kp, nil
}

// prefixName names the kind of an nkey public key by its first letter.
func prefixName(pub string) string {
	switch nkeys.Prefix(pub) {
	case nkeys.PrefixByteUser:
		return "user"
	case nkeys.PrefixByteOperator:
		return "operator"
	case nkeys.PrefixByteAccount:
		return "account"
	case nkeys.PrefixByteServer:
		return "server"
	case nkeys.PrefixByteCluster:
		return "cluster"
	case nkeys.PrefixByteCurve:
		return "curve"
	}
	return "unknown"
}

// resolveNKey checks nats.nkey and returns its public key.
func resolveNKey(path string) (string, []error) {
	if path == "" {
		return "", nil
	}
	kp, err := LoadUserKey(path)
	if err != nil {
		return "", []error{&ConfigError{Field: "nats.nkey", Rule: "must be a readable file of at most 16 KiB holding a user nkey seed (SU..., as understudy init writes it): " + err.Error(), Value: path}}
	}
	defer kp.Wipe()
	pub, _ := kp.PublicKey()
	return pub, nil
}

// isLoopback reports whether a listen host accepts connections from this
// machine only. An empty host listens on every interface.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// offLoopbackRule is the rule broken by a listener off loopback without
// TLS or without the deployment's identities, "" when neither is missing.
func offLoopbackRule(what string, haveTLS, haveSecurity bool, tlsField string) string {
	var missing []string
	if !haveTLS {
		missing = append(missing, tlsField+" (cert, key and ca: clients must present a certificate signed by the CA)")
	}
	if !haveSecurity {
		missing = append(missing, "a security section (the identities allowed to connect, each with its permissions)")
	}
	if len(missing) == 0 {
		return ""
	}
	return what + " listens off loopback, where anyone who reaches it could write any pair's register or any agent's manifest: it needs " +
		strings.Join(missing, " and ") + "; run understudy init to create them (docs/security.md), or listen on 127.0.0.1"
}

// serverTLS loads a server side of TLS: all three of cert, key and ca, or
// none (nil). The config requires and verifies the peers' certificates.
func (t ServerTLS) resolve(field string) (*tls.Config, tls.Certificate, *x509.CertPool, []error) {
	if t == (ServerTLS{}) {
		return nil, tls.Certificate{}, nil, nil
	}
	var errs []error
	bad := func(f, rule, value string) {
		errs = append(errs, &ConfigError{Field: field + "." + f, Rule: rule, Value: value})
	}
	for _, f := range []struct{ name, v string }{{"cert", t.Cert}, {"key", t.Key}, {"ca", t.CA}} {
		if f.v == "" {
			bad(f.name, "must be set with the other two of cert, key and ca: the server presents cert and verifies its peers' certificates against ca", "")
		}
	}
	if len(errs) > 0 {
		return nil, tls.Certificate{}, nil, errs
	}
	pool, err := loadCAPool(t.CA)
	if err != nil {
		bad("ca", err.Error(), t.CA)
	}
	pair, err := tls.LoadX509KeyPair(t.Cert, t.Key)
	if err != nil {
		bad("cert", "must be a PEM certificate matching "+field+".key: "+err.Error(), t.Cert)
	}
	if len(errs) > 0 {
		return nil, tls.Certificate{}, nil, errs
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{pair},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}, pair, pool, nil
}

func loadCAPool(path string) (*x509.CertPool, error) {
	pem, err := readBounded(path, 1<<20)
	if err != nil {
		return nil, errors.New("must be a readable PEM file of at most 1 MiB: " + err.Error())
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("must contain at least one PEM certificate")
	}
	return pool, nil
}

// routeTLS is the mutual TLS of a cluster's routes. A route is a server
// of the cluster, trusted with every message: only a certificate made for
// a node (valid for both server and client authentication, as understudy
// init makes them; an operator's or a reader's is client-only) may be one.
func routeTLS(pair tls.Certificate, pool *x509.CertPool) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{pair},
		RootCAs:      pool,
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("route peer presented no certificate")
			}
			leaf := cs.PeerCertificates[0]
			if !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
				return fmt.Errorf("route peer's certificate (%s) is not a node's: a route needs one valid for both server and client authentication", leaf.Subject)
			}
			return nil
		},
	}
}

// selfClientTLS is the client side of the node's connection to its own
// embedded server: its certificate, and the server's chain checked
// against pool. The node dials its own server in-process, by an address
// (loopback) the certificate need not name, so the name is not checked.
func selfClientTLS(pair tls.Certificate, pool *x509.CertPool, serverName string) *tls.Config {
	tc := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{pair},
		RootCAs:      pool,
		ServerName:   serverName,
	}
	if serverName != "" {
		return tc
	}
	tc.InsecureSkipVerify = true // replaced by VerifyConnection: chain only
	tc.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the server presented no certificate")
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
			Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		})
		return err
	}
	return tc
}

// resolveServer checks nats.server (the embedded server's name, TLS and
// cluster) and refuses listeners off loopback without TLS and security.
// clientTLS is the node's own connection's TLS (nil without server TLS).
func resolveServer(c Config, listenHost string, listenOK bool) (srv serverSettings, clientTLS *tls.Config, errs []error) {
	bad := func(field, rule, value string) {
		errs = append(errs, &ConfigError{Field: field, Rule: rule, Value: value})
	}
	sec := c.Security != nil
	srv.name = c.NATS.Server.Name
	if srv.name == "" {
		srv.name = c.Node
	}
	if srv.name != "" && !serverNameRE.MatchString(srv.name) {
		bad("nats.server.name", "must be a NATS server name, without spaces (default: node)", srv.name)
	}

	tc, pair, pool, terrs := c.NATS.Server.TLS.resolve("nats.server.tls")
	errs = append(errs, terrs...)
	srv.tls = tc
	if rule := offLoopbackRule("the embedded NATS server", c.NATS.Server.TLS != (ServerTLS{}), sec, "nats.server.tls"); rule != "" && listenOK && !isLoopback(listenHost) {
		bad("nats.listen", rule, c.NATS.Listen)
	}

	// The node's own connection: nats.tls when given, else the node's
	// certificate (made for both server and client authentication).
	ct := c.NATS.TLS
	switch {
	case ct == (TLSConfig{}) && tc != nil:
		clientTLS = selfClientTLS(pair, pool, "")
	case ct != (TLSConfig{}) && c.NATS.Server.TLS == (ServerTLS{}):
		for _, f := range []struct{ field, v string }{
			{"nats.tls.ca", ct.CA}, {"nats.tls.cert", ct.Cert}, {"nats.tls.key", ct.Key}, {"nats.tls.server_name", ct.ServerName},
		} {
			if f.v != "" {
				bad(f.field, "applies only to an external NATS (set nats.url, --nats-url), or to the node's own connection to its embedded server when that has nats.server.tls", f.v)
			}
		}
		if ct.Insecure {
			bad("nats.tls.insecure", "applies only to an external NATS: set nats.url (--nats-url) too", "true")
		}
	case ct.Insecure:
		bad("nats.tls.insecure", "applies only to an external NATS: the node checks its own server's certificate against nats.server.tls.ca", "true")
	case ct != (TLSConfig{}):
		cc, cerrs := ct.resolve()
		errs = append(errs, cerrs...)
		if cc != nil && len(cerrs) == 0 {
			if len(cc.Certificates) == 0 {
				bad("nats.tls.cert", "must be set with nats.server.tls: the server requires a client certificate of the node too", "")
			} else {
				if cc.RootCAs == nil {
					cc.RootCAs = pool
				}
				clientTLS = selfClientTLS(cc.Certificates[0], cc.RootCAs, ct.ServerName)
			}
		}
	}

	cl := c.NATS.Server.Cluster
	if cl == nil {
		return srv, clientTLS, errs
	}
	cs := &clusterSettings{name: cl.Name}
	if srv.name == "" {
		bad("nats.server.name", "must be set in a cluster, where every server has a name of its own: set node (the default) or nats.server.name", "")
	}
	if cl.Name == "" || !serverNameRE.MatchString(cl.Name) {
		bad("nats.server.cluster.name", "must be the cluster's name, the same on every site, without spaces", cl.Name)
	}
	host, port, err := splitListen(cl.Listen, true)
	if err != nil {
		bad("nats.server.cluster.listen", err.Error(), cl.Listen)
	}
	cs.host, cs.port = host, port
	if port == 0 {
		cs.port = -1
	}
	offLoopback := err == nil && !isLoopback(host)
	for i, r := range cl.Routes {
		field := "nats.server.cluster.routes[" + strconv.Itoa(i) + "]"
		u, err := url.Parse(strings.TrimSpace(r))
		switch {
		case err != nil || u.Host == "" || u.Port() == "":
			bad(field, "must be a route URL like tls://host:6222, the cluster listen address of another site's server", r)
			continue
		case u.Scheme != "nats-route" && u.Scheme != "nats" && u.Scheme != "tls":
			bad(field, "must use the scheme tls, nats-route or nats (the routes' TLS is nats.server.cluster.tls either way)", r)
			continue
		case u.User != nil:
			bad(field, "must not carry credentials: the routes authenticate with their certificates", u.Redacted())
			continue
		}
		offLoopback = offLoopback || !isLoopback(u.Hostname())
		cs.routes = append(cs.routes, u)
	}
	rt := cl.TLS
	if rt == (ServerTLS{}) {
		rt = c.NATS.Server.TLS // the node's certificate serves the routes too
	}
	rtc, rpair, rpool, rerrs := rt.resolve("nats.server.cluster.tls")
	if cl.TLS == (ServerTLS{}) {
		rerrs = nil // already reported as nats.server.tls
	}
	errs = append(errs, rerrs...)
	if rtc != nil {
		cs.tls = routeTLS(rpair, rpool)
	}
	rule := offLoopbackRule("the cluster's route listener", rt != (ServerTLS{}), sec, "nats.server.cluster.tls (or nats.server.tls)")
	if rule != "" && offLoopback {
		bad("nats.server.cluster.listen", rule, cl.Listen)
	}
	if sec && rt == (ServerTLS{}) && !offLoopback { // off loopback: the rule above
		// On loopback too: anyone on the machine could join as a route,
		// and a route is trusted with every message, past every permission.
		bad("nats.server.cluster.tls", "must be set (or nats.server.tls) with a security section: routes without mutual TLS are unauthenticated, and a route bypasses every identity's permissions", "")
	}
	if sec {
		cs.pinned, errs = routePins(c, rpair, rtc != nil, errs)
	}
	srv.cluster = cs
	return srv, clientTLS, errs
}

// routePins are the certificates a secured cluster accepts as routes:
// every node's security.nodes.<node>.cert_sha256, each required (understudy
// init writes them), and this node's the one its routes present (else the
// others would refuse it). Malformed pins are resolveSecurity's to report.
func routePins(c Config, own tls.Certificate, haveOwn bool, errs []error) ([]string, []error) {
	var pins []string
	for _, n := range slices.Sorted(mapKeys(c.Security.Nodes)) {
		pin := c.Security.Nodes[n].CertSHA256
		field := "security.nodes." + n + ".cert_sha256"
		switch {
		case pin == "":
			errs = append(errs, &ConfigError{Field: field, Rule: "must be set in a cluster: the hex SHA-256 of the SubjectPublicKeyInfo of node " + n +
				"'s certificate; the servers accept only pinned certificates as routes. Run understudy init again: it writes them into every node file", Value: ""})
			continue
		case !certPinRE.MatchString(pin):
			continue
		}
		pins = append(pins, strings.ToLower(pin))
	}
	if id, ok := c.Security.Nodes[c.Node]; ok && haveOwn && certPinRE.MatchString(id.CertSHA256) {
		if leaf, err := x509.ParseCertificate(own.Certificate[0]); err == nil && !strings.EqualFold(CertSHA256(leaf), id.CertSHA256) {
			errs = append(errs, &ConfigError{Field: "security.nodes." + c.Node + ".cert_sha256",
				Rule: "must pin this node's route certificate (nats.server.cluster.tls.cert, else nats.server.tls.cert), whose pin is " + CertSHA256(leaf) +
					": the other servers would refuse its routes; run understudy init again to rewrite the node files", Value: id.CertSHA256})
		}
	}
	return pins, errs
}

// resolveSecurity checks the security section: every key is of its kind,
// no key has two identities, and this node's entry exists, is its nkey's,
// and lets it write what it hosts (else its own server would refuse the
// writes of its members and agent).
func resolveSecurity(c Config, nkeyPub string, members []MemberConfig, agentID string) []error {
	sec := c.Security
	if sec == nil {
		return nil
	}
	var errs []error
	bad := func(field, rule, value string) {
		errs = append(errs, &ConfigError{Field: field, Rule: rule, Value: value})
	}
	seen := map[string]string{} // public key -> field
	user := func(field, key string) {
		switch {
		case !nkeys.IsValidPublicUserKey(key):
			bad(field, "must be a public user nkey (U..., 56 characters)", key)
		case seen[key] != "":
			bad(field, "must be a key of its own: it is "+seen[key]+" too, and an identity has one set of permissions", key)
		default:
			seen[key] = field
		}
	}
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range sec.Nodes {
			if !yield(n) {
				return
			}
		}
	})
	for _, n := range names {
		id := sec.Nodes[n]
		field := "security.nodes." + n
		if err := failover.CheckName(n); err != nil {
			bad("security.nodes", "node names "+err.Error(), n)
		}
		user(field+".nkey", id.NKey)
		for i, p := range id.Pairs {
			if err := failover.CheckName(p); err != nil {
				bad(field+".pairs["+strconv.Itoa(i)+"]", "must be a pair name: "+err.Error(), p)
			}
		}
		for i, s := range id.Sites {
			if err := failover.CheckName(s); err != nil {
				bad(field+".sites["+strconv.Itoa(i)+"]", "must be a site name: "+err.Error(), s)
			}
		}
		if id.Agent != "" && id.Agent != "-" {
			if rule := agent.CheckID(id.Agent); rule != "" {
				bad(field+".agent", rule+", or - for none (default: the node's name)", id.Agent)
			}
		}
		if id.CertSHA256 != "" && !certPinRE.MatchString(id.CertSHA256) {
			bad(field+".cert_sha256", "must be 64 hex digits: the SHA-256 of the SubjectPublicKeyInfo of the node's certificate, as understudy init writes it", id.CertSHA256)
		}
	}
	for i, k := range sec.Operators {
		user("security.operators["+strconv.Itoa(i)+"]", k)
	}
	for i, k := range sec.Readers {
		user("security.readers["+strconv.Itoa(i)+"]", k)
	}
	for i, k := range sec.Admins {
		user("security.admins["+strconv.Itoa(i)+"]", k)
	}
	for i, k := range sec.ManifestKeys {
		if !nkeys.IsValidPublicOperatorKey(k) {
			bad("security.manifest_keys["+strconv.Itoa(i)+"]", "must be a public operator nkey (O..., 56 characters): a manifest signing key, as understudy init makes it", k)
		}
	}

	if c.Node == "" {
		bad("node", "must be set with a security section: it names this node's entry in security.nodes", "")
		return errs
	}
	id, ok := sec.Nodes[c.Node]
	if !ok {
		bad("security.nodes", "must have an entry for this node ("+c.Node+"): its NATS identity and what it may write", "")
		return errs
	}
	field := "security.nodes." + c.Node
	switch {
	case c.NATS.NKey == "":
		bad("nats.nkey", "must be set with a security section: the file of this node's nkey seed, whose public key is "+field+".nkey", "")
	case nkeyPub != "" && nkeyPub != id.NKey:
		bad("nats.nkey", "must be this node's seed: its public key "+nkeyPub+" is not "+field+".nkey ("+id.NKey+")", c.NATS.NKey)
	}
	sites := id.Sites
	if len(sites) == 0 {
		sites = []string{c.Node}
	}
	for _, m := range members {
		if !slices.Contains(id.Pairs, m.Rules.Pair) {
			bad(field+".pairs", "must list pair "+m.Rules.Pair+", which this node hosts: the server would refuse its writes of the pair's register, heartbeats and events", strings.Join(id.Pairs, ","))
		}
		if !slices.Contains(sites, m.Site) {
			bad(field+".sites", "must list site "+m.Site+", which this node runs a member of pair "+m.Rules.Pair+" as (default: the node's name): the server would refuse its heartbeats", strings.Join(sites, ","))
		}
	}
	if agentID != "" {
		want := id.Agent
		if want == "" {
			want = c.Node
		}
		if want != agentID {
			bad(field+".agent", "must be this node's agent id ("+agentID+"; - is none, empty is the node's name): the server would refuse its agent's writes of actual-state, presence and events", id.Agent)
		}
	}
	return errs
}
