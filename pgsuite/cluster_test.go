package pgsuite

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"understudy/events/porttest"
)

// The pair's rules in every test: heartbeat 250 ms, thresholds 2 and 2,
// failover 2.5 s. The fence grace covers the PostgreSQL fence budget
// (1.5 s) plus the escalation step every node file needs (see
// escalationStep).
const (
	heartbeat       = 250 * time.Millisecond
	failoverTimeout = 2500 * time.Millisecond
	fenceGrace      = 1500 * time.Millisecond
	pairName        = "pg"
)

// escalationStep is a fence step run when PostgreSQL's own fence fails
// (the escalation): node files carry it with pairOptions.escalation. It
// adds its timeout to the fence budget, so fence_grace must cover 1.6 s.
const escalationStep = `    procedures:
      fence:
        steps:
          - {name: escalate, driver: exec, timeout: 100ms, exec: {command: /bin/true}}
`

var siteNames = [2]string{"site-a", "site-b"}

// pairOptions are what a test changes in the pair's rules and layout.
type pairOptions struct {
	synchronous string // off (default), on, strict
	failback    string // auto (default), manual
	// peerOf, when set, gives a site's postgres.peer (host:port) instead of
	// the other site's server: a proxy of the test.
	peerOf func(c *cluster, site int) string
	// escalation writes the node files with escalationStep (and
	// fence_grace 1.6 s to cover it).
	escalation bool
}

// cluster is one test's pair: a witness node holding the embedded NATS and
// two nodes, site-a (preferred primary) and site-b, each with its
// PostgreSQL. Everything lives under root.
type cluster struct {
	t       testing.TB
	root    string
	bin     string
	opts    pairOptions
	natsURL string
	witness *proc
	sites   [2]*pgSite
	pgUser  osUser

	mu      sync.Mutex
	extra   []int // pids of PostgreSQL servers started by hand (postmasters)
	cleanup []func()
}

// pgSite is one site: its node and PostgreSQL.
type pgSite struct {
	idx    int
	name   string
	dir    string
	pgdata string
	sock   string // PostgreSQL's private Unix socket directory
	port   int
	config string
	log    string
	node   *proc
	// logOffset is where the current node's output starts in log.
	logOffset int64
}

// newCluster makes the directories, writes the node files and starts the
// witness; the nodes are started by start.
func newCluster(t testing.TB, opts pairOptions) *cluster {
	t.Helper()
	requirePostgres(t)
	bin := understudyBinary(t)
	if opts.synchronous == "" {
		opts.synchronous = "off"
	}
	if opts.failback == "" {
		opts.failback = "auto"
	}
	root, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", rootPrefix, os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	// PostgreSQL runs as postgres: it must traverse to its directories.
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	pgUser, err := lookupUser("postgres")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, root: root, bin: bin, opts: opts, pgUser: pgUser}
	t.Cleanup(c.close)
	ports := freePorts(t, 2)
	for i, name := range siteNames {
		dir := filepath.Join(root, strings.TrimPrefix(name, "site-"))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		s := &pgSite{idx: i, name: name, dir: dir, pgdata: filepath.Join(dir, "pgdata"), port: ports[i],
			config: filepath.Join(dir, "node.yaml"), log: filepath.Join(dir, "node.log")}
		s.sock = s.pgdata + ".understudy"
		c.sites[i] = s
	}
	wdir := filepath.Join(root, "w")
	if err := os.MkdirAll(wdir, 0o755); err != nil {
		t.Fatal(err)
	}
	wlog := filepath.Join(wdir, "node.log")
	c.witness, err = startProc("witness", wdir, wlog, bin, "serve", "--nats-listen", "127.0.0.1:0",
		"--data-dir", filepath.Join(wdir, "nats"), "--http", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	line, err := waitLine(wlog, 0, regexp.MustCompile(`msg=ready .*client_url=(\S+)`), 30*time.Second, c.witness)
	if err != nil {
		t.Fatalf("the witness (embedded NATS) did not get ready: %v\n%s", err, tailFile(wlog, 20))
	}
	c.natsURL = regexp.MustCompile(`client_url=(\S+)`).FindStringSubmatch(line)[1]
	for i := range c.sites {
		if err := os.WriteFile(c.sites[i].config, []byte(c.nodeFile(i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// nodeFile is site i's node file.
func (c *cluster) nodeFile(i int) string {
	s := c.sites[i]
	peer := "127.0.0.1:" + strconv.Itoa(c.sites[1-i].port)
	if c.opts.peerOf != nil {
		if p := c.opts.peerOf(c, i); p != "" {
			peer = p
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "node: %s\ndata_dir: %s\nhttp: 127.0.0.1:0\nnats: {url: %q}\nassets: {replicas: 1}\nlog: {level: debug}\n", s.name, filepath.Join(s.dir, "state"), c.natsURL)
	if l := strings.TrimSpace(os.Getenv("UNDERSTUDY_TEST_LEADERSHIP")); l != "" {
		b.WriteString("leadership: " + l + "\n") // the suite in either mode (partition.TestLeadership)
	}
	fmt.Fprintf(&b, "pairs:\n  - pair: %s\n    primary: site-a\n    replica: site-b\n", pairName)
	fmt.Fprintf(&b, "    heartbeat_timeout: %v\n    failure_threshold: 2\n    success_threshold: 2\n", heartbeat)
	fg := fenceGrace
	if c.opts.escalation {
		fg += 100 * time.Millisecond
	}
	fmt.Fprintf(&b, "    failover_timeout: %v\n    fence_grace: %v\n", failoverTimeout, fg)
	fmt.Fprintf(&b, "    failback: %s\n    synchronous: %q\n    maximum_lag_on_failover: 1MiB\n", c.opts.failback, c.opts.synchronous)
	fmt.Fprintf(&b, "    postgres:\n      data_dir: %s\n      port: %d\n      listen: 127.0.0.1\n      peer: %s\n      replication: {password: pgsuite-secret}\n", s.pgdata, s.port, peer)
	if c.opts.escalation {
		b.WriteString(escalationStep)
	}
	return b.String()
}

// start starts both nodes and waits until site-a accepts writes and
// site-b streams from it.
func (c *cluster) start() {
	c.t.Helper()
	c.startNode(0)
	c.startNode(1)
	c.waitHealthy(0, 90*time.Second)
}

// startNode starts site i's node and waits for its "ready" line.
func (c *cluster) startNode(i int) {
	c.t.Helper()
	s := c.sites[i]
	if s.node != nil && s.node.running() {
		c.t.Fatalf("%s: the node already runs (pid %d)", s.name, s.node.pid())
	}
	off, _ := fileSize(s.log)
	p, err := startProc(s.name, s.dir, s.log, c.bin, "serve", "--config", s.config)
	if err != nil {
		c.t.Fatal(err)
	}
	s.node, s.logOffset = p, off
	if _, err := waitLine(s.log, off, regexp.MustCompile(`msg=ready `), 30*time.Second, p); err != nil {
		c.t.Fatalf("%s: the node did not get ready: %v\n%s", s.name, err, tailFile(s.log, 30))
	}
}

// waitHealthy waits until site leader accepts writes and the other site
// streams from it.
func (c *cluster) waitHealthy(leader int, within time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	var last string
	for time.Now().Before(deadline) {
		w, err1 := c.writable(leader)
		st, err2 := c.streaming(1 - leader)
		if w && st {
			return
		}
		last = fmt.Sprintf("%s writable=%v (%v), %s streaming=%v (%v)", c.sites[leader].name, w, err1, c.sites[1-leader].name, st, err2)
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("within %v: %s did not accept writes with %s streaming from it: %s", within, c.sites[leader].name, c.sites[1-leader].name, last)
}

// nodeChildren is the node's children (its keeper).
func (s *pgSite) nodeChildren() []int {
	if s.node == nil {
		return nil
	}
	return childrenOf(s.node.pid())
}

// kill9 powers a site off as far as processes go: SIGKILL to the node, to
// its children (the keeper) and to the postmaster's process group (the
// pids are read first, then killed together). Returns when the node has
// exited and no PostgreSQL process of the site runs.
func (c *cluster) kill9(i int) {
	c.t.Helper()
	s := c.sites[i]
	node := s.node.pid()
	kids := s.nodeChildren()
	pm := postmasterPID(s.pgdata)
	_ = syscall.Kill(node, syscall.SIGKILL)
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGKILL)
	}
	if pm > 0 {
		_ = syscall.Kill(-pm, syscall.SIGKILL)
		_ = syscall.Kill(pm, syscall.SIGKILL)
	}
	if !s.node.wait(10 * time.Second) {
		c.t.Fatalf("%s: the node (pid %d) did not exit after SIGKILL", s.name, node)
	}
	c.waitNoPostgres(i, 10*time.Second)
}

// killNodeOnly sends SIGKILL to the node process alone.
func (c *cluster) killNodeOnly(i int) {
	c.t.Helper()
	s := c.sites[i]
	_ = syscall.Kill(s.node.pid(), syscall.SIGKILL)
	if !s.node.wait(10 * time.Second) {
		c.t.Fatalf("%s: the node did not exit after SIGKILL", s.name)
	}
}

// stopNode stops the node with SIGTERM (a graceful shutdown).
func (c *cluster) stopNode(i int, within time.Duration) {
	c.t.Helper()
	s := c.sites[i]
	_ = syscall.Kill(s.node.pid(), syscall.SIGTERM)
	if !s.node.wait(within) {
		c.t.Fatalf("%s: the node did not exit within %v of SIGTERM\n%s", s.name, within, tailFile(s.log, 30))
	}
}

// waitNoPostgres waits until no PostgreSQL process works in site i's data
// directory.
func (c *cluster) waitNoPostgres(i int, within time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for {
		left := procsUnder(c.sites[i].pgdata)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: PostgreSQL processes %v still run %v after the kill", c.sites[i].name, left, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// addHandStarted records a postmaster the test started itself.
func (c *cluster) addHandStarted(pid int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.extra = append(c.extra, pid)
}

// onClose runs f first at cleanup (writers, monitors: before the kills).
func (c *cluster) onClose(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cleanup = append(c.cleanup, f)
}

// close kills every process the test started (after a failure too) and
// removes the directory unless the test failed or $UNDERSTUDY_PGSUITE_KEEP
// is set.
func (c *cluster) close() {
	c.mu.Lock()
	fs := c.cleanup
	c.cleanup = nil
	c.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
	for _, s := range c.sites {
		if s == nil {
			continue
		}
		var pids []int
		if s.node != nil && s.node.running() {
			pids = append(pids, s.node.pid())
			pids = append(pids, s.nodeChildren()...)
		}
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		if pm := postmasterPID(s.pgdata); pm > 0 && alive(pm) {
			_ = syscall.Kill(-pm, syscall.SIGKILL)
			_ = syscall.Kill(pm, syscall.SIGKILL)
		}
	}
	for _, pm := range c.extra {
		_ = syscall.Kill(-pm, syscall.SIGKILL)
		_ = syscall.Kill(pm, syscall.SIGKILL)
	}
	if c.witness != nil && c.witness.running() {
		_ = syscall.Kill(c.witness.pid(), syscall.SIGKILL)
		c.witness.wait(5 * time.Second)
	}
	// Whatever is left working under the test's directory.
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := procsUnder(c.root)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			c.t.Errorf("cleanup: processes %v still run under %s", left, c.root)
			break
		}
		for _, p := range left {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, s := range c.sites {
		if s != nil && s.node != nil {
			s.node.wait(5 * time.Second)
		}
	}
	if c.t.Failed() || os.Getenv(envKeep) != "" {
		c.t.Logf("the test's directory is kept: %s (node logs: */node.log, PostgreSQL logs: */pgdata.understudy/postgres.log)", c.root)
		if c.t.Failed() {
			for _, s := range c.sites {
				if s != nil {
					c.t.Logf("%s: last warnings and errors:\n%s", s.name, grepFile(s.log, regexp.MustCompile(`level=(WARN|ERROR)`), 25))
				}
			}
		}
		return
	}
	_ = os.RemoveAll(c.root)
}

// understudy runs a CLI command of the binary against the witness's NATS.
func (c *cluster) understudy(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, append(args, "--nats-url", c.natsURL)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("understudy %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// event is one member transition from a node's log.
type event struct {
	at     time.Time
	typ    string // failover.promoted
	detail string
	term   uint64
}

var (
	transitionRE = regexp.MustCompile(`^time=(\S+) .*msg=transition .*event=(\S+) detail="((?:[^"\\]|\\.)*)".* term=(\d+)`)
	transitionAt = regexp.MustCompile(`^time=(\S+) `)
)

// events reads the member transitions site i's node logged since offset
// (0: every start of the node).
func (c *cluster) events(i int, offset int64) []event {
	f, err := os.Open(c.sites[i].log)
	if err != nil {
		return nil
	}
	defer f.Close()
	if _, err := f.Seek(offset, 0); err != nil {
		return nil
	}
	var out []event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := transitionRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		at, _ := time.Parse(time.RFC3339Nano, m[1])
		term, _ := strconv.ParseUint(m[4], 10, 64)
		detail, err := strconv.Unquote(`"` + m[3] + `"`)
		if err != nil {
			detail = m[3]
		}
		out = append(out, event{at: at, typ: m[2], detail: detail, term: term})
	}
	return out
}

// waitEvent waits until site i's node logs an event of type typ after
// since (wall clock) whose detail matches (nil: any).
func (c *cluster) waitEvent(i int, typ string, since time.Time, detail *regexp.Regexp, within time.Duration) (event, bool) {
	deadline := time.Now().Add(within)
	for {
		for _, e := range c.events(i, 0) {
			if e.typ == typ && !e.at.Before(since.Add(-time.Millisecond)) && (detail == nil || detail.MatchString(e.detail)) {
				return e, true
			}
		}
		if time.Now().After(deadline) {
			return event{}, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// logHas reports whether site i's log has a line matching re written
// after since.
func (c *cluster) logHas(i int, re *regexp.Regexp, since time.Time) (string, bool) {
	b, err := os.ReadFile(c.sites[i].log)
	if err != nil {
		return "", false
	}
	for _, line := range strings.Split(string(b), "\n") {
		m := transitionAt.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil || at.Before(since.Add(-time.Millisecond)) {
			continue
		}
		if re.MatchString(line) {
			return line, true
		}
	}
	return "", false
}

// waitLine waits until a line matching re is written to path after
// offset; it gives up early when p (if any) exits.
func waitLine(path string, offset int64, re *regexp.Regexp, within time.Duration, p *proc) (string, error) {
	deadline := time.Now().Add(within)
	for {
		if b, err := os.ReadFile(path); err == nil && int64(len(b)) >= offset {
			for _, line := range strings.Split(string(b[offset:]), "\n") {
				if re.MatchString(line) {
					return line, nil
				}
			}
		}
		if p != nil && !p.running() {
			return "", fmt.Errorf("%s exited (%v) before logging %q", p.name, p.err, re)
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no line matching %q within %v", re, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func fileSize(path string) (int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// tailFile is the last n lines of path.
func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// grepFile is the last n lines of path matching re.
func grepFile(path string, re *regexp.Regexp, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if re.MatchString(l) {
			out = append(out, l)
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return strings.Join(out, "\n")
}

// freePorts returns n distinct free TCP ports on loopback, below the
// kernel's ephemeral range (porttest): a port from that range, released,
// was once taken by another process's outgoing connection before the
// standby's PostgreSQL bound it.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports, err := porttest.Free(n)
	if err != nil {
		t.Fatal(err)
	}
	return ports
}

// portRefuses reports whether a TCP connection to port is refused.
func portRefuses(port int) bool {
	conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 200*time.Millisecond)
	if err == nil {
		conn.Close()
		return false
	}
	return strings.Contains(err.Error(), "refused")
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
