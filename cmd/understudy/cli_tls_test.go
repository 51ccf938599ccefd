package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"understudy/runtime"
)

func freeTCPPort(t *testing.T) int {
	t.Helper()
	p, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// securedNode runs one node made by understudy init (runtime.Deploy): its
// embedded server requires TLS client certificates signed by the
// deployment's CA and the deployment's nkey identities. It returns the
// deployment's directory and the node's client URL.
func securedNode(t *testing.T) (runtime.DeployResult, string) {
	t.Helper()
	dir := t.TempDir()
	port, httpPort := freeTCPPort(t), freeTCPPort(t)
	res, err := runtime.Deploy(runtime.DeploySpec{
		Dir:   dir,
		Nodes: []runtime.DeployNode{{Name: "site-a", Host: "127.0.0.1", ClientPort: port, HTTP: "127.0.0.1:" + strconv.Itoa(httpPort)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := runtime.LoadConfigFile(res.Nodes[0].NodeFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the generated node file: %v", err)
	}
	cfg.LogOutput = io.Discard
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runtime.Serve(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(httpPort) + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case err := <-done:
			t.Fatalf("serve ended: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node did not become healthy: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return res, "tls://127.0.0.1:" + strconv.Itoa(port)
}

// clearCLIEnv makes sure no UNDERSTUDY_NATS_* of the test's environment
// leaks into the commands.
func clearCLIEnv(t *testing.T) {
	for _, env := range cliEnv {
		t.Setenv(env, "")
		os.Unsetenv(env)
	}
	t.Setenv(cliPasswordEnv, "")
	os.Unsetenv(cliPasswordEnv)
}

// The CLI against a server that verifies client certificates and
// authenticates nkeys: with flags, and with the env file understudy init
// writes, with a private CA and no SSL_CERT_FILE; each missing piece is an
// error naming the option that supplies it.
func TestCLITLSClientCertificatesAndNKeys(t *testing.T) {
	clearCLIEnv(t)
	t.Setenv("SSL_CERT_FILE", filepath.Join(t.TempDir(), "none.pem")) // the system's roots cannot help
	res, url := securedNode(t)
	op := func(name string) string { return filepath.Join(res.Operator.Dir, name) }
	rd := func(name string) string { return filepath.Join(res.Reader.Dir, name) }

	pair := filepath.Join(t.TempDir(), "pg.yaml")
	if err := os.WriteFile(pair, []byte("pair: pg\nprimary: site-a\nreplica: site-b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The operator, with flags.
	operator := []string{"--nats-url", url, "--nats-tls-ca", op("ca.pem"), "--nats-tls-cert", op("cert.pem"), "--nats-tls-key", op("key.pem"), "--nats-nkey", op("operator.nk")}
	code, stdout, stderr := runCLI(t, append([]string{"config", "set", "-f", pair, "--wait", "0"}, operator...)...)
	if code != exitOK {
		t.Fatalf("config set as the operator: exit %d\n%s%s", code, stdout, stderr)
	}

	// The reader, with flags: status and export.
	reader := []string{"--nats-url", url, "--nats-tls-ca", rd("ca.pem"), "--nats-tls-cert", rd("cert.pem"), "--nats-tls-key", rd("key.pem"), "--nats-nkey", rd("reader.nk")}
	if code, stdout, stderr := runCLI(t, append([]string{"status"}, reader...)...); code != exitOK || !strings.Contains(stdout, "pg") {
		t.Errorf("status as the reader: exit %d\n%s%s", code, stdout, stderr)
	}
	out := filepath.Join(t.TempDir(), "pg.export")
	if code, stdout, stderr := runCLI(t, append([]string{"export", "--pair", "pg", "--out", out}, reader...)...); code != exitOK {
		t.Errorf("export as the reader: exit %d\n%s%s", code, stdout, stderr)
	}

	// The reader, with its env file only (as sourced by a shell), and
	// the node's URL for the cluster's.
	env, err := os.ReadFile(res.Reader.Env)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(env), "\n") {
		if k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "="); ok && !strings.HasPrefix(line, "#") {
			t.Setenv(k, strings.Trim(v, "'"))
		}
	}
	t.Setenv("UNDERSTUDY_NATS_URL", url)
	code, stdout, stderr = runCLI(t, "config", "get", "--pair", "pg")
	if code != exitOK || !strings.Contains(stdout, "primary: site-a") {
		t.Fatalf("config get with the reader's env: exit %d\n%s%s", code, stdout, stderr)
	}

	// Each missing piece, named.
	for _, tc := range []struct {
		name  string
		unset string
		want  string
	}{
		{"no client certificate", "UNDERSTUDY_NATS_TLS_CERT", "the server requires a client certificate: give --nats-tls-cert ($UNDERSTUDY_NATS_TLS_CERT) and --nats-tls-key"},
		{"no private CA", "UNDERSTUDY_NATS_TLS_CA", "give its CA with --nats-tls-ca ($UNDERSTUDY_NATS_TLS_CA)"},
		{"no identity", "UNDERSTUDY_NATS_NKEY", "no identity was given: set --nats-nkey ($UNDERSTUDY_NATS_NKEY)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := os.Getenv(tc.unset)
			os.Unsetenv(tc.unset)
			if tc.unset == "UNDERSTUDY_NATS_TLS_CERT" {
				t.Setenv("UNDERSTUDY_NATS_TLS_KEY", "")
			}
			defer os.Setenv(tc.unset, old)
			code, _, stderr := runCLI(t, "status")
			if code != exitFailure || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, stderr, exitFailure, tc.want)
			}
		})
	}

	// Another deployment's identity is refused.
	other, err := runtime.Deploy(runtime.DeploySpec{Dir: t.TempDir(), Nodes: []runtime.DeployNode{{Name: "x", Host: "127.0.0.1"}}})
	if err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runCLI(t, "status", "--nats-nkey", filepath.Join(other.Reader.Dir, "reader.nk"))
	if code != exitFailure || !strings.Contains(stderr, "the server refused the credentials; check --nats-nkey ($UNDERSTUDY_NATS_NKEY)") {
		t.Errorf("a stranger's nkey: exit %d, stderr %q", code, stderr)
	}
}

// Mistakes in the connection options are found before connecting, and
// named with their flag and variable.
func TestCLIConnectionOptionErrors(t *testing.T) {
	clearCLIEnv(t)
	dir := t.TempDir()
	res, err := runtime.Deploy(runtime.DeploySpec{Dir: dir, Nodes: []runtime.DeployNode{{Name: "x", Host: "127.0.0.1"}}})
	if err != nil {
		t.Fatal(err)
	}
	op := func(name string) string { return filepath.Join(res.Operator.Dir, name) }
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--nats-tls-ca", op("nope.pem")}, nil, "--nats-tls-ca ($UNDERSTUDY_NATS_TLS_CA) " + op("nope.pem") + ": must be a readable PEM file"},
		{[]string{"--nats-tls-ca", op("operator.nk")}, nil, "must contain at least one PEM certificate"},
		{[]string{"--nats-tls-cert", op("cert.pem")}, nil, "--nats-tls-key ($UNDERSTUDY_NATS_TLS_KEY): must be set with --nats-tls-cert"},
		{[]string{"--nats-tls-cert", op("cert.pem"), "--nats-tls-key", filepath.Join(res.Reader.Dir, "key.pem")}, nil, "must be a PEM certificate matching --nats-tls-key"},
		{[]string{"--nats-nkey", op("manifest-signing.nk")}, nil, "--nats-nkey ($UNDERSTUDY_NATS_NKEY) " + op("manifest-signing.nk") + ": must be a file holding a user nkey seed"},
		{[]string{"--nats-nkey", op("operator.nk"), "--nats-user", "alice"}, nil, "--nats-nkey ($UNDERSTUDY_NATS_NKEY), --nats-user ($UNDERSTUDY_NATS_USER): give one way to authenticate"},
		{nil, map[string]string{"UNDERSTUDY_NATS_PASSWORD": "secret"}, "--nats-user ($UNDERSTUDY_NATS_USER): must be set with $UNDERSTUDY_NATS_PASSWORD"},
		{nil, map[string]string{"UNDERSTUDY_NATS_TLS_CA": op("nope.pem")}, "--nats-tls-ca ($UNDERSTUDY_NATS_TLS_CA) " + op("nope.pem")},
	} {
		for k, v := range tc.env {
			t.Setenv(k, v)
		}
		code, _, stderr := runCLI(t, append([]string{"status", "--nats-url", "tls://127.0.0.1:1"}, tc.args...)...)
		if code == exitOK || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v %v: exit %d, stderr %q; want %q", tc.args, tc.env, code, stderr, tc.want)
		}
		for k := range tc.env {
			os.Unsetenv(k)
		}
	}
	// --nats-password does not exist: a password on the command line is
	// visible to every user of the machine.
	if code, _, stderr := runCLI(t, "status", "--nats-password", "x"); code != exitUsage || !strings.Contains(stderr, "unknown flag: --nats-password") {
		t.Errorf("--nats-password: exit %d, stderr %q", code, stderr)
	}
}
