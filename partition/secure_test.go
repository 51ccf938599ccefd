package partition

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"understudy/actors/failover"
)

// The secured deployment's lab sites and the node each one runs.
var secureNode = map[string]string{"a": NodeA, "b": NodeB, "w": "witness"}

// secureRun is one secured three-site deployment: `understudy init` made
// every file; each site runs `understudy serve` with its embedded NATS
// server, clustered with the others over mutual TLS, with nkey identities.
type secureRun struct {
	t      *testing.T
	lab    *Lab
	dir    string // the test's directory
	deploy string // what understudy init wrote
	bin    Binaries

	mu    sync.Mutex
	nodes map[string]*Proc
	// killed: when a site's node was SIGKILLed. Its member's workload dies
	// with it (a real workload's keeper stops it), which the oracle, written
	// by procedures, cannot show: the judge closes its interval there.
	killed []Event
}

func (r *secureRun) nodeDir(site string) string { return filepath.Join(r.deploy, secureNode[site]) }
func (r *secureRun) nodeLog(site string) string {
	return filepath.Join(r.dir, secureNode[site]+".log")
}
func (r *secureRun) oracleFile(site string) string {
	return filepath.Join(r.dir, "oracle-"+secureNode[site]+".log")
}

// start starts (or restarts) a site's node.
func (r *secureRun) start(site string) {
	r.t.Helper()
	p, err := r.lab.Start(site, secureNode[site], r.nodeLog(site), nil, r.bin.Understudy, "serve", "--config", filepath.Join(r.nodeDir(site), "node.yaml"))
	if err != nil {
		r.t.Fatalf("start %s: %v", secureNode[site], err)
	}
	r.mu.Lock()
	r.nodes[site] = p
	r.mu.Unlock()
}

// kill SIGKILLs a site's node (its embedded NATS server dies with it).
func (r *secureRun) kill(site string) time.Time {
	r.mu.Lock()
	p := r.nodes[site]
	r.mu.Unlock()
	p.Kill()
	at := time.Now()
	if n := secureNode[site]; n == NodeA || n == NodeB {
		r.mu.Lock()
		r.killed = append(r.killed, Event{Kind: KindFence, At: at, Site: n})
		r.mu.Unlock()
	}
	return at
}

// oracle is both members' oracle lines, with a fence at each kill of a
// member's node.
func (r *secureRun) oracle() []Event {
	r.t.Helper()
	var all []Event
	for _, site := range []string{"a", "b"} {
		f, err := os.Open(r.oracleFile(site))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			r.t.Fatal(err)
		}
		evs, err := ParseOracle(f)
		f.Close()
		if err != nil {
			r.t.Fatal(err)
		}
		all = append(all, evs...)
	}
	r.mu.Lock()
	all = append(all, r.killed...)
	r.mu.Unlock()
	SortEvents(all)
	return all
}

// servingAt is who serves now, by the oracle.
func (r *secureRun) servingNow() []string {
	now := time.Now()
	return ServingAt(Serving(r.oracle(), now), now)
}

// waitServing waits until exactly site serves; it returns when that began.
func (r *secureRun) waitServing(node string, within time.Duration) time.Time {
	r.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		now := time.Now()
		ivs := Serving(r.oracle(), now)
		if s := ServingAt(ivs, now); len(s) == 1 && s[0] == node {
			for _, iv := range ivs {
				if iv.Site == node && iv.Open {
					return iv.From
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.t.Fatalf("%s does not serve within %s; serving: %v\n%s", node, within, r.servingNow(), r.trouble())
	return time.Time{}
}

// waitSteady waits until node alone has served for d without a break.
func (r *secureRun) waitSteady(node string, d, within time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		now := time.Now()
		ivs := Serving(r.oracle(), now)
		for _, iv := range ivs {
			if iv.Site == node && iv.Open && now.Sub(iv.From) >= d && len(ServingAt(ivs, now)) == 1 {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.t.Fatalf("%s does not serve steadily for %s within %s; serving: %v\n%s", node, d, within, r.servingNow(), r.trouble())
}

// leadersOn waits until server leads the streams of the three assets (the
// leader keeper moves them back to the witness once it is current again).
func (r *secureRun) leadersOn(server string, within time.Duration) {
	r.t.Helper()
	nc, _, err := r.connect("a", r.roleIdentity("reader", "reader.nk"))
	if err != nil {
		r.t.Fatalf("reader: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		r.t.Fatal(err)
	}
	start := time.Now()
	var where []string
	for time.Since(start) < within {
		where = where[:0]
		for _, name := range []string{"KV_understudy_failover", "KV_understudy_fleet", "UNDERSTUDY_EVENTS"} {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			leader := "?"
			if st, err := js.Stream(ctx, name); err == nil && st.CachedInfo().Cluster != nil {
				leader = st.CachedInfo().Cluster.Leader
			}
			cancel()
			if leader != server {
				where = append(where, name+"@"+leader)
			}
		}
		if len(where) == 0 {
			r.t.Logf("stream leaders on %s after %s", server, time.Since(start).Round(time.Millisecond))
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	r.t.Fatalf("stream leaders not on %s within %s: %v", server, within, where)
}

// operatorWrite writes the pair's pause (not paused) as the operator
// through site-a's server until a write lands, and returns how long after
// from that took: a write needs the quorum.
func (r *secureRun) operatorWrite(from time.Time, within time.Duration) time.Duration {
	r.t.Helper()
	nc, _, err := r.connect("a", r.roleIdentity("operator", "operator.nk"))
	if err != nil {
		r.t.Fatalf("operator: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		r.t.Fatal(err)
	}
	value := failover.EncodePause(failover.Pause{ID: "quorum-check", At: time.Now().UTC()})
	var last error
	for time.Since(from) < within {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := js.Publish(ctx, "$KV.understudy_failover."+failover.PauseKey(PairName), value)
		cancel()
		if err == nil {
			return time.Since(from)
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	r.t.Errorf("no write landed within %s: %v", within, last)
	return within
}

// waitReady waits until node's member follows and says it is ready in a
// heartbeat written after since (its latest start).
func (r *secureRun) waitReady(node string, since time.Time, within time.Duration) {
	r.t.Helper()
	nc, _, err := r.connect("a", r.roleIdentity("reader", "reader.nk"))
	if err != nil {
		r.t.Fatalf("reader: %v", err)
	}
	defer nc.Close()
	start := time.Now()
	for time.Since(start) < within {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		kv, err := kvOf(ctx, nc, "understudy_failover")
		if err == nil {
			if e, err := kv.Get(ctx, failover.HeartbeatKey(PairName, node)); err == nil && e.Created().After(since) {
				if h, err := failover.DecodeHeartbeat(e.Value()); err == nil && h.Ready {
					cancel()
					r.t.Logf("%s ready after %s", node, time.Since(start).Round(time.Millisecond))
					return
				}
			}
		}
		cancel()
		time.Sleep(250 * time.Millisecond)
	}
	r.t.Fatalf("%s not ready within %s\n%s", node, within, r.trouble())
}

// noSplitBrain fails the test on any moment two sites served.
func (r *secureRun) noSplitBrain(what string) {
	r.t.Helper()
	for _, o := range Overlaps(Serving(r.oracle(), time.Now())) {
		r.t.Errorf("%s: two sites serving: %s", what, o)
	}
}

// steady checks that only node serves, without a break, for d.
func (r *secureRun) steady(node string, d time.Duration, what string) {
	r.t.Helper()
	from := time.Now()
	time.Sleep(d)
	now := time.Now()
	ivs := Serving(r.oracle(), now)
	for _, g := range Gaps(ivs, from, now) {
		r.t.Errorf("%s: nobody served for %s (%s–%s)", what, g.Duration(), g.From.Format("15:04:05.000"), g.To.Format("15:04:05.000"))
	}
	if s := ServingAt(ivs, now); len(s) != 1 || s[0] != node {
		r.t.Errorf("%s: serving %v, want only %s", what, s, node)
	}
}

func (r *secureRun) trouble() string {
	var b strings.Builder
	for _, site := range []string{"a", "b", "w"} {
		fmt.Fprintf(&b, "--- %s:\n%s\n", secureNode[site], strings.Join(Trouble(r.nodeLog(site), 15), "\n"))
	}
	return b.String()
}

// identity is a set of credentials init wrote: a client certificate and
// an nkey seed.
type identity struct {
	name, cert, key, seed string
}

func (r *secureRun) nodeIdentity(site string) identity {
	d := r.nodeDir(site)
	return identity{name: secureNode[site], cert: filepath.Join(d, "cert.pem"), key: filepath.Join(d, "key.pem"), seed: filepath.Join(d, "nats.nkey")}
}

func (r *secureRun) roleIdentity(role, seed string) identity {
	d := filepath.Join(r.deploy, role)
	return identity{name: role, cert: filepath.Join(d, "cert.pem"), key: filepath.Join(d, "key.pem"), seed: filepath.Join(d, seed)}
}

// violations collects the permission violations a connection is told of.
type violations struct {
	mu   sync.Mutex
	errs []string
}

func (v *violations) add(err error) {
	v.mu.Lock()
	v.errs = append(v.errs, err.Error())
	v.mu.Unlock()
}

func (v *violations) about(subject string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, e := range v.errs {
		if strings.Contains(strings.ToLower(e), "permissions violation") && strings.Contains(e, subject) {
			return true
		}
	}
	return false
}

// siteDialer connects from inside a site's namespace.
type siteDialer struct {
	lab  *Lab
	site string
}

func (d siteDialer) Dial(_, address string) (net.Conn, error) {
	return d.lab.Dial(d.site, address, 2*time.Second)
}

// connect opens a NATS connection to a site's server as id (no client
// certificate and no nkey when those are empty).
func (r *secureRun) connect(site string, id identity) (*nats.Conn, *violations, error) {
	pem, err := os.ReadFile(filepath.Join(r.deploy, "ca", "ca.pem"))
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tc := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if id.cert != "" {
		c, err := tls.LoadX509KeyPair(id.cert, id.key)
		if err != nil {
			return nil, nil, err
		}
		tc.Certificates = []tls.Certificate{c}
	}
	v := &violations{}
	opts := []nats.Option{
		nats.SetCustomDialer(siteDialer{r.lab, site}),
		nats.Secure(tc),
		nats.Timeout(3 * time.Second),
		nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { v.add(err) }),
	}
	if id.seed != "" {
		o, err := nats.NkeyOptionFromSeed(id.seed)
		if err != nil {
			return nil, nil, err
		}
		seed, err := os.ReadFile(id.seed)
		if err != nil {
			return nil, nil, err
		}
		kp, err := nkeys.FromSeed(bytes.TrimSpace(seed))
		if err != nil {
			return nil, nil, err
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return nil, nil, err
		}
		// Each identity may receive replies only on its own inboxes.
		opts = append(opts, o, nats.CustomInboxPrefix("_INBOX."+pub))
	}
	nc, err := nats.Connect("tls://"+r.lab.Sites[site].IP+":4222", opts...)
	return nc, v, err
}

// kvOf opens a bucket on nc.
func kvOf(ctx context.Context, nc *nats.Conn, bucket string) (jetstream.KeyValue, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return js.KeyValue(ctx, bucket)
}

// refused checks that id may not put key in bucket: the put fails and the
// server says it is a permissions violation.
func (r *secureRun) refused(site string, id identity, bucket, key string, value []byte) {
	r.t.Helper()
	nc, v, err := r.connect(site, id)
	if err != nil {
		r.t.Errorf("%s: connect: %v", id.name, err)
		return
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		r.t.Fatal(err)
	}
	subject := "$KV." + bucket + "." + key
	if _, err := js.Publish(ctx, subject, value); err == nil {
		r.t.Errorf("%s wrote %s of bucket %s: it must be refused", id.name, key, bucket)
		return
	}
	deadline := time.Now().Add(2 * time.Second)
	for !v.about(subject) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if !v.about(subject) {
		r.t.Errorf("%s writing %s: refused, but not by a permissions violation: %v", id.name, key, v.errs)
	}
}

// cli runs an understudy command inside a site's namespace with the
// variables of an env file init wrote, minus those named in drop.
func (r *secureRun) cli(site, envFile string, drop []string, args ...string) (string, error) {
	env, err := readEnvFile(envFile)
	if err != nil {
		r.t.Fatal(err)
	}
	var keep []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		dropped := false
		for _, d := range drop {
			dropped = dropped || d == name
		}
		if !dropped {
			keep = append(keep, kv)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", r.lab.Sites[site].NS, r.bin.Understudy}, args...)...)
	cmd.Env = append(cleanEnv(), keep...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// cleanEnv is this process's environment without understudy's variables.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "UNDERSTUDY_") {
			out = append(out, kv)
		}
	}
	return out
}

// readEnvFile reads the `export NAME=value` lines of an env file.
func readEnvFile(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if rest, ok := strings.CutPrefix(line, "export "); ok {
			out = append(out, strings.Trim(rest, `'"`))
		}
	}
	return out, sc.Err()
}

// TestSecureDeployment is issue 15's deployment as a user makes it: three
// network namespaces, `understudy init` writes every file, each site runs
// only `understudy serve` (embedded NATS, clustered over mutual TLS, nkey
// identities with least privilege). It checks the CLI against a cluster
// that verifies client certificates, each identity's refused writes,
// forged register values, the loss of each site (quorum kept), the
// primary's node killed, and the loss of two sites.
func TestSecureDeployment(t *testing.T) {
	if testing.Short() {
		t.Skip("secured deployment: skipped with -short (it runs a real three-site cluster for minutes)")
	}
	preflight(t)
	root := moduleRoot(t)
	bin := buildBinaries(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	dir, err := os.MkdirTemp("", "understudy-secure-")
	if err != nil {
		t.Fatal(err)
	}
	lab, err := NewLab(ctx, fmt.Sprintf("%s%d-sec", NamePrefix, os.Getpid()), 60)
	if err != nil {
		t.Fatal(err)
	}
	r := &secureRun{t: t, lab: lab, dir: dir, deploy: filepath.Join(dir, "deploy"), bin: bin, nodes: map[string]*Proc{}}
	t.Cleanup(func() {
		r.mu.Lock()
		nodes := r.nodes
		r.mu.Unlock()
		for _, p := range nodes {
			p.Kill()
		}
		lab.Close()
		if t.Failed() || os.Getenv(envKeep) != "" {
			t.Logf("logs and files kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})

	// 1. understudy init, as docs/security.md says, with the sites' addresses.
	args := []string{"init", "--dir", r.deploy, "--install-dir", "",
		"--node", NodeA + "=" + lab.Sites["a"].IP, "--node", NodeB + "=" + lab.Sites["b"].IP,
		"--witness", "witness=" + lab.Sites["w"].IP, "--pair", PairName + "=" + NodeA + "," + NodeB}
	if out, err := exec.Command(bin.Understudy, args...).CombinedOutput(); err != nil {
		t.Fatalf("understudy %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	// Three nodes on one machine: each its own data directory. The
	// members' hooks write the oracle.
	oracle := filepath.Join(dir, "oracle.sh")
	script := "#!/bin/sh\n# oracle <kind> <site> <file>: one line, on the machine's one clock\nprintf '%s %s %s\\n' \"$1\" \"$(date +%s%N)\" \"$2\" >> \"$3\"\n"
	if err := os.WriteFile(oracle, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for site, node := range secureNode {
		path := filepath.Join(r.nodeDir(site), "node.yaml")
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(raw), "\n")
		found := false
		for i, l := range lines {
			if strings.HasPrefix(l, "data_dir:") {
				lines[i], found = "data_dir: "+filepath.Join(dir, "data-"+node), true
			}
		}
		if !found {
			t.Fatalf("%s has no data_dir line:\n%s", path, raw)
		}
		if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
			t.Fatal(err)
		}
		if node == "witness" {
			continue
		}
		for _, kind := range []string{KindFence, KindPromote, KindDemote} {
			hook := filepath.Join(r.nodeDir(site), "hooks", PairName, kind)
			body := fmt.Sprintf("#!/bin/sh\nexec /bin/sh %q %s %s %q\n", oracle, kind, node, r.oracleFile(site))
			if err := os.WriteFile(hook, []byte(body), 0o700); err != nil {
				t.Fatalf("hook %s: %v", hook, err)
			}
		}
	}

	// 2. Three `understudy serve`, nothing else.
	for _, site := range []string{"a", "b", "w"} {
		r.start(site)
	}
	r.waitServing(NodeA, startWithin)
	t.Logf("site-a serves; the cluster formed")

	// 3. The CLI against servers that verify client certificates.
	opEnv := filepath.Join(r.deploy, "operator", "env")
	rdEnv := filepath.Join(r.deploy, "reader", "env")
	if out, err := r.cli("w", opEnv, nil, "status", "--pair", PairName); err != nil || !strings.Contains(out, NodeA) {
		t.Errorf("operator status: %v\n%s", err, out)
	}
	if out, err := r.cli("w", rdEnv, nil, "status", "--pair", PairName); err != nil || !strings.Contains(out, NodeA) {
		t.Errorf("reader status: %v\n%s", err, out)
	}
	if out, err := r.cli("w", opEnv, []string{"UNDERSTUDY_NATS_TLS_CERT", "UNDERSTUDY_NATS_TLS_KEY"}, "status", "--pair", PairName); err == nil {
		t.Errorf("operator status without a client certificate succeeded:\n%s", out)
	} else {
		t.Logf("without a client certificate: %s", firstLine(out))
	}
	if out, err := r.cli("w", rdEnv, nil, "pause", "--pair", PairName); err == nil {
		t.Errorf("the reader paused the pair:\n%s", out)
	}

	// 4. Each identity's forbidden writes, refused by the server.
	const fb, fleet = "understudy_failover", "understudy_fleet"
	witness, siteB := r.nodeIdentity("w"), r.nodeIdentity("b")
	operator := r.roleIdentity("operator", "operator.nk")
	reader := r.roleIdentity("reader", "reader.nk")
	junk := []byte("x")
	var wg sync.WaitGroup
	for _, c := range []struct {
		id          identity
		bucket, key string
	}{
		{witness, fb, failover.LeaderKey(PairName)},            // the register of a pair it is not in
		{witness, fb, failover.HeartbeatKey(PairName, NodeA)},  // a member's heartbeat
		{siteB, fb, failover.HeartbeatKey(PairName, NodeA)},    // the other member's heartbeat (forged ready)
		{siteB, fb, failover.ConfigKey(PairName)},              // rules
		{siteB, fleet, "desired-state." + NodeA},               // another agent's desired state
		{siteB, fleet, "actual-state." + NodeA},                // another agent's status
		{operator, fb, failover.LeaderKey(PairName)},           // operators do not hold registers
		{operator, fb, failover.HeartbeatKey(PairName, NodeB)}, // nor beat
		{reader, fb, failover.ConfigKey(PairName)},             // readers write nothing
		{reader, fleet, "desired-state." + NodeA},              //
		{identity{name: "no nkey", cert: operator.cert, key: operator.key}, fb, failover.ConfigKey(PairName)},
	} {
		wg.Go(func() {
			if c.id.seed == "" {
				if nc, _, err := r.connect("w", c.id); err == nil {
					nc.Close()
					t.Errorf("a client with a certificate and no nkey was let in")
				}
				return
			}
			r.refused("w", c.id, c.bucket, c.key, junk)
		})
	}
	wg.Wait()

	// 5. Forged handoff (finding 1), with the credentials NATS lets write
	// the register: the other member's. It must not move leadership.
	nc, _, err := r.connect("b", siteB)
	if err != nil {
		t.Fatalf("site-b's identity: %v", err)
	}
	defer nc.Close()
	kv, err := kvOf(ctx, nc, fb)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := kv.Get(ctx, failover.LeaderKey(PairName))
	if err != nil {
		t.Fatal(err)
	}
	held, err := failover.DecodeLeader(cur.Value())
	if err != nil {
		t.Fatal(err)
	}
	forged := failover.Leader{Site: "", Term: held.Term, Handoff: NodeB, By: NodeA}
	if _, err := kv.Update(ctx, failover.LeaderKey(PairName), failover.EncodeLeader(forged), cur.Revision()); err != nil {
		t.Fatalf("writing the forged handoff: %v", err)
	}
	r.steady(NodeA, 4*time.Second, "forged handoff")
	if e, err := kv.Get(ctx, failover.LeaderKey(PairName)); err != nil {
		t.Error(err)
	} else if l, _ := failover.DecodeLeader(e.Value()); l.Site != NodeA {
		t.Errorf("after the forged handoff the register is %s, want site-a's (it overwrites a forged value)", l)
	}
	r.noSplitBrain("forged handoff")

	// 6. The loss of one site that does not serve: the cluster keeps its
	// quorum, writes go on, and the pair serves on. The witness leads the
	// assets' streams (assets.preferred_leader): its loss costs a JetStream
	// election, which the holder's heartbeats cannot ride out; it fences
	// and serves again after it. The replica's loss costs nothing.
	for _, site := range []string{"w", "b"} {
		r.leadersOn("witness", 60*time.Second)
		at := r.kill(site)
		wrote := r.operatorWrite(at, 45*time.Second)
		r.waitSteady(NodeA, 3*time.Second, 30*time.Second)
		gap := Longest(Gaps(Serving(r.oracle(), time.Now()), at, time.Now()))
		switch {
		case site == "b" && gap.Duration() > 10*time.Millisecond:
			t.Errorf("site-b's node killed: site-a stopped serving for %s; with the stream leaders on the witness the replica's loss must cost nothing", gap.Duration())
		case gap.Duration() > 15*time.Second:
			t.Errorf("%s's node killed: site-a stopped serving for %s, longer than a JetStream election", secureNode[site], gap.Duration())
		}
		// Reads that watch (status) need a JetStream meta leader to create
		// their consumer: during its election after a loss they time out.
		var answered time.Duration
		for {
			out, err := r.cli("a", opEnv, nil, "status", "--pair", PairName)
			if err == nil {
				answered = time.Since(at)
				break
			}
			if time.Since(at) > 30*time.Second {
				t.Errorf("%s's node killed: status through site-a failed for 30 s: %v\n%s", secureNode[site], err, out)
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		t.Logf("FIGURE site-lost %s: site-a's longest break in service %s; an operator's write landed %s and status answered %s after the kill",
			secureNode[site], gap.Duration().Round(time.Millisecond), wrote.Round(time.Millisecond), answered.Round(time.Millisecond))
		started := time.Now()
		r.start(site)
		if site == "b" {
			// No settling time: a restarted node starts its members once
			// its server's copies of the assets are current, so the
			// replica's watch delivers at once (before that fix, its first
			// reads and watch timed out for about 10 s and the primary's
			// loss below was replaced 15 s late).
			r.waitReady(NodeB, started, 60*time.Second)
		}
	}

	r.leadersOn("witness", 60*time.Second)
	r.waitReady(NodeB, time.Now().Add(-time.Second), 30*time.Second)
	// 7. The primary's node killed, while site-b's identity forges site-a's
	// register beats (finding 2): site-b still takes over within the bound.
	// The forger: site-b's identity, through the witness's server.
	fnc, _, err := r.connect("w", siteB)
	if err != nil {
		t.Fatalf("site-b's identity: %v", err)
	}
	defer fnc.Close()
	fkv, err := kvOf(ctx, fnc, fb)
	if err != nil {
		t.Fatal(err)
	}
	stopForging := make(chan struct{})
	forgedBeats := 0
	var forgeErr error
	var forging sync.WaitGroup
	killedAt := r.kill("a")
	forging.Go(func() {
		for beat := uint64(1); ; beat++ {
			select {
			case <-stopForging:
				return
			case <-time.After(300 * time.Millisecond):
			}
			fctx, fcancel := context.WithTimeout(ctx, time.Second)
			e, err := fkv.Get(fctx, failover.LeaderKey(PairName))
			if err != nil && forgeErr == nil {
				forgeErr = err
			}
			if err == nil {
				l, derr := failover.DecodeLeader(e.Value())
				if derr == nil && l.Site == NodeA {
					l.Beat += 1000 + beat
					l.Sig = nil
					if _, err := fkv.Update(fctx, failover.LeaderKey(PairName), failover.EncodeLeader(l), e.Revision()); err == nil {
						forgedBeats++
					} else if forgeErr == nil {
						forgeErr = err
					}
				}
			}
			fcancel()
		}
	})
	servedAt := r.waitServing(NodeB, 30*time.Second)
	close(stopForging)
	forging.Wait()
	took := servedAt.Sub(killedAt)
	t.Logf("FIGURE primary-node-killed: site-b served %s after site-a's node was SIGKILLed (bound failover_timeout + 2 × heartbeat_timeout = %s; %d forged beats landed meanwhile)",
		took.Round(time.Millisecond), AvailabilityBound, forgedBeats)
	if forgedBeats == 0 {
		t.Errorf("no forged beat landed (%v): the test proved nothing about finding 2", forgeErr)
	}
	if took > AvailabilityBound+3*time.Second {
		t.Errorf("site-b served %s after the primary's node died: over the bound %s (+3 s for the JetStream election of the dead server's streams)", took, AvailabilityBound)
	}

	// 8. The old primary comes back: it follows, then takes its place back
	// (failback: auto) by a hand-over.
	r.start("a")
	r.waitServing(NodeA, 40*time.Second)
	r.noSplitBrain("failback")

	// 9. Two sites lost: no quorum; the lone primary stops serving.
	lostAt := r.kill("w")
	r.kill("b")
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && len(r.servingNow()) > 0 {
		time.Sleep(100 * time.Millisecond)
	}
	if s := r.servingNow(); len(s) > 0 {
		t.Errorf("two of three sites lost: %v still serves after 30 s (it must fence without a quorum)", s)
	} else {
		evs := r.oracle()
		for i := len(evs) - 1; i >= 0; i-- {
			if evs[i].Site == NodeA && evs[i].Kind == KindFence {
				t.Logf("FIGURE quorum-lost: site-a fenced %s after the witness and site-b were lost", evs[i].At.Sub(lostAt).Round(time.Millisecond))
				break
			}
		}
	}
	r.noSplitBrain("whole run")
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}
