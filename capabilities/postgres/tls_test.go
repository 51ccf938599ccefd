package postgres

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"understudy/actors/capability"
)

// writeTLS makes a CA and one certificate for both sites (server for
// 127.0.0.1, client as the replication user), owned by postgres.
func writeTLS(t *testing.T, dir string, uid, gid int) TLSConfig {
	t.Helper()
	dir = filepath.Join(dir, "tls")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "understudy test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "replicator"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	caCert, _ := x509.ParseCertificate(caDER)
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cfg := TLSConfig{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, "site.crt"), Key: filepath.Join(dir, "site.key")}
	for path, block := range map[string]*pem.Block{
		cfg.CA:   {Type: "CERTIFICATE", Bytes: caDER},
		cfg.Cert: {Type: "CERTIFICATE", Bytes: leafDER},
		cfg.Key:  {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(path, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	return cfg
}

// With TLS and no password the peer authenticates by certificate: clone,
// streaming over TLS, failover and pg_rewind.
func TestPairOverTLSWithCertificates(t *testing.T) {
	needPostgres(t)
	var probe Config
	probe.RunAs = "postgres"
	if err := probe.validateUser(func(k, r, v string) error { t.Fatal(k, r, v); return nil }); err != nil {
		t.Fatal(err)
	}
	tlsCfg := writeTLS(t, testDir(t), int(probe.uid), int(probe.gid))
	a, b := newPair(t, func(c *Config) {
		c.TLS = tlsCfg
		c.Replication.Password = ""
	})
	if _, err := os.Stat(filepath.Join(a.run, passFile)); err == nil {
		t.Fatal("a passfile was written without a password")
	}
	bootstrap(t, a)
	if err := b.Rejoin(ctxFor(t, 60*time.Second), req(b, "site-a")); err != nil {
		t.Fatalf("rejoin by clone over TLS: %v", err)
	}
	eventually(t, 10*time.Second, "the peer streams over TLS", func() error {
		st, err := check(t, a, true)
		if err == nil && !st.PeerStreaming {
			return errNotYet(st)
		}
		return err
	})
	if n := count(t, a, "pg_stat_replication r JOIN pg_stat_ssl s USING (pid) WHERE s.ssl AND r.application_name = 'site-b'"); n != 1 {
		t.Fatalf("%d walsenders to site-b over TLS, want 1", n)
	}
	mustExec(t, a, "CREATE TABLE t AS SELECT 1 AS id")
	if err := b.stopImmediate(ctxFor(t, 5*time.Second), b.keeper.Load()); err != nil {
		t.Fatal(err)
	}
	mustExec(t, a, "CREATE TABLE lost AS SELECT 1 AS id")
	if err := a.Fence(ctxFor(t, 5*time.Second), req(a, "")); err != nil {
		t.Fatal(err)
	}
	pr := req(b, "site-b")
	pr.Term = 2
	if err := b.Promote(ctxFor(t, 60*time.Second), pr); err != nil {
		t.Fatalf("promote: %v", err)
	}
	if err := a.Rejoin(ctxFor(t, 60*time.Second), req(a, "site-b")); err != nil {
		t.Fatalf("rejoin by rewind over TLS: %v", err)
	}
	if _, err := os.Stat(a.cfg.DataDir + ".old"); err == nil {
		t.Fatal("cloned again, not rewound")
	}
	if st, err := check(t, a, false); err != nil || !st.Streaming || st.Timeline != 2 {
		t.Fatalf("check of the rewound standby: %+v, %v", st, err)
	}
}

type notYet struct{ st capability.Status }

func (e notYet) Error() string { return e.st.Detail }

func errNotYet(st capability.Status) error { return notYet{st} }
