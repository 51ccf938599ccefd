package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Sites of the two member nodes: every pair has site-a as its preferred
// primary and site-b as its replica.
const (
	siteA = "site-a"
	siteB = "site-b"
)

// Topologies: where the NATS server runs.
const (
	topoStore    = "store"    // a third process runs only the embedded NATS
	topoEmbedded = "embedded" // site-a embeds it, site-b connects to it
)

// nodeSpec is one node file to write.
type nodeSpec struct {
	name     string
	dataDir  string
	embedded bool   // run the embedded NATS (listen on any free loopback port)
	url      string // with !embedded: the store's client URL
	mode     string // leadership key; "" writes none (today's code knows none)
	pairs    int    // members to host, one per pair pg-0000..
	pprof    bool   // serve Go's profiler on a free loopback port (the log's "pprof listening" line)
	promote  string // promoteExec or promoteNone
}

// The members' promote procedure (-promote).
const (
	promoteExec = "exec" // one step running `true`: a process per promotion
	promoteNone = "none" // no step
)

// pairName is the name of the i-th pair, zero-padded so that names sort.
func pairName(i, n int) string {
	w := max(4, len(strconv.Itoa(n-1)))
	return fmt.Sprintf("pg-%0*d", w, i)
}

// nodeFile renders the node file: JSON logs (the harness reads the ready
// line's addresses from them), HTTP and NATS on free ports, and one inline
// member per pair with default rules and procedures that do nothing.
func nodeFile(s nodeSpec) string {
	var b strings.Builder
	fmt.Fprintf(&b, "node: %s\n", s.name)
	fmt.Fprintf(&b, "data_dir: %s\n", strconv.Quote(s.dataDir))
	if s.embedded {
		b.WriteString("nats: {listen: \"127.0.0.1:0\"}\n")
	} else {
		// An external NATS defaults to 3 replicas; the store is one server.
		fmt.Fprintf(&b, "nats: {url: %s}\nassets: {replicas: 1}\n", strconv.Quote(s.url))
	}
	b.WriteString("http: \"127.0.0.1:0\"\n")
	b.WriteString("log: {level: info, format: json}\n")
	if s.pprof {
		b.WriteString("pprof: \"127.0.0.1:0\"\n")
	}
	if s.mode != "" {
		fmt.Fprintf(&b, "leadership: %s\n", s.mode)
	}
	if s.pairs == 0 {
		return b.String()
	}
	b.WriteString("pairs:\n")
	// A fence step is required (a member that cannot fence must never
	// serve); its timeout stays inside the default fence_grace (2s).
	// With -promote none, a promotion has nothing to run (a valid pair:
	// only fence steps are required).
	noop := `procedures: {fence: {steps: [{name: fence, driver: exec, timeout: 500ms, exec: {command: "true"}}]}, promote: {steps: [{name: promote, driver: exec, timeout: 1s, exec: {command: "true"}}]}}`
	if s.promote == promoteNone {
		noop = `procedures: {fence: {steps: [{name: fence, driver: exec, timeout: 500ms, exec: {command: "true"}}]}}`
	}
	for i := range s.pairs {
		fmt.Fprintf(&b, "  - {pair: %s, primary: %s, replica: %s, %s}\n", pairName(i, s.pairs), siteA, siteB, noop)
	}
	return b.String()
}

// proc is one `understudy serve` process. Its stderr (JSON log lines) is
// copied to a file and scanned for the lines the harness waits on.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string

	ready     chan struct{} // closed at the "ready" line
	clientURL string        // from the ready line; read after ready is closed
	httpAddr  atomic.Value  // string, from the "http listening" line
	pprofAddr atomic.Value  // string, from the "pprof listening" line
	warns     atomic.Int64  // log lines at WARN
	errors    atomic.Int64  // log lines at ERROR

	refusal atomic.Value // string: the err of a "refusing to start" line

	exited  chan struct{} // closed when the process has been reaped
	waitErr error         // read after exited is closed
	killed  atomic.Bool   // the harness killed it (its exit is expected)
}

// startNode starts `bin serve --config file`. The child is in its own
// process group and dies with the harness (Pdeathsig), so an interrupted
// run leaves no node behind even if the deferred cleanup never runs.
func startNode(bin, name, file, logPath string) (*proc, error) {
	cmd := exec.Command(bin, "serve", "--config", file)
	cmd.Env = childEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stdout = logf
	stderr, err := cmd.StderrPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, ready: make(chan struct{}), exited: make(chan struct{})}
	p.httpAddr.Store("")
	p.pprofAddr.Store("")
	p.refusal.Store("")
	var scanned sync.WaitGroup
	scanned.Add(1)
	go func() {
		defer scanned.Done()
		p.scan(stderr, logf)
	}()
	go func() {
		scanned.Wait() // Wait closes the pipe: read it to the end first
		p.waitErr = cmd.Wait()
		logf.Close()
		close(p.exited)
	}()
	return p, nil
}

// childEnv is the harness's environment without the UNDERSTUDY_NATS_*
// variables serve would read in place of the node file's settings.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "UNDERSTUDY_") {
			env = append(env, kv)
		}
	}
	return env
}

func (p *proc) scan(r io.Reader, out io.Writer) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	readyClosed := false
	for sc.Scan() {
		line := sc.Bytes()
		out.Write(line)
		out.Write([]byte{'\n'})
		s := string(line)
		switch {
		case strings.Contains(s, `"level":"WARN"`):
			p.warns.Add(1)
		case strings.Contains(s, `"level":"ERROR"`):
			p.errors.Add(1)
		}
		if !strings.Contains(s, `"msg":"ready"`) && !strings.Contains(s, `"msg":"http listening"`) && !strings.Contains(s, `"msg":"pprof listening"`) && !strings.Contains(s, `"msg":"refusing to start`) {
			continue
		}
		var l struct {
			Msg       string `json:"msg"`
			ClientURL string `json:"client_url"`
			Addr      string `json:"addr"`
			Err       string `json:"err"`
		}
		if json.Unmarshal(line, &l) != nil {
			continue
		}
		switch {
		case strings.HasPrefix(l.Msg, "refusing to start"):
			// A node that refuses its members (more than the store can
			// heartbeat): a result, not a failure of the harness.
			p.refusal.Store(l.Err)
		case l.Msg == "http listening":
			p.httpAddr.Store(l.Addr)
		case l.Msg == "pprof listening":
			p.pprofAddr.Store(l.Addr)
		case l.Msg == "ready" && !readyClosed:
			p.clientURL = l.ClientURL
			readyClosed = true
			close(p.ready)
		}
	}
	io.Copy(out, r) // a line longer than the buffer: keep the rest anyway
}

// waitReady waits for the ready line, the process's exit or the timeout.
func (p *proc) waitReady(ctx context.Context, within time.Duration) error {
	t := time.NewTimer(within)
	defer t.Stop()
	select {
	case <-p.ready:
		return nil
	case <-p.exited:
		return fmt.Errorf("%s exited before it was ready (%v); its log: %s%s", p.name, p.waitErr, p.logPath, p.tail())
	case <-t.C:
		return fmt.Errorf("%s not ready within %s; its log: %s%s", p.name, within, p.logPath, p.tail())
	case <-ctx.Done():
		return ctx.Err()
	}
}

// tail is the end of the process's log, for errors.
func (p *proc) tail() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil || len(b) == 0 {
		return ""
	}
	const keep = 1500
	if len(b) > keep {
		b = b[len(b)-keep:]
	}
	return "\n... " + string(b)
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// alive reports whether the process still runs.
func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// kill sends SIGKILL to the process (not its group: a node's procedures
// are its children only while they run) and waits until it is reaped.
func (p *proc) kill() {
	if p == nil || !p.alive() {
		return
	}
	p.killed.Store(true)
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
	}
}

// cluster is the running deployment of one measurement.
type cluster struct {
	dir      string
	topology string
	store    *proc // nil with topoEmbedded
	a, b     *proc
	natsURL  string
}

// start writes the node files under dir and starts the processes: the
// store (its ready line gives the NATS URL), then site-a, then site-b
// right after it. It returns when both member processes are running, not
// when their members serve; started is when site-a was started.
func startCluster(ctx context.Context, o options, dir string) (c *cluster, started time.Time, err error) {
	c = &cluster{dir: dir, topology: o.topology}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()
	write := func(s nodeSpec) (string, error) {
		path := filepath.Join(dir, s.name+".yaml")
		return path, os.WriteFile(path, []byte(nodeFile(s)), 0o600)
	}
	launch := func(s nodeSpec) (*proc, error) {
		path, err := write(s)
		if err != nil {
			return nil, err
		}
		return startNode(o.bin, s.name, path, filepath.Join(dir, s.name+".log"))
	}
	var first *proc // the process embedding NATS
	a := nodeSpec{name: siteA, dataDir: filepath.Join(dir, siteA), mode: o.mode, pairs: o.pairs, pprof: o.pprof, promote: o.promote}
	switch o.topology {
	case topoStore:
		if c.store, err = launch(nodeSpec{name: "store", dataDir: filepath.Join(dir, "store"), embedded: true, pprof: o.pprof}); err != nil {
			return c, started, err
		}
		first = c.store
	case topoEmbedded:
		a.embedded = true
		started = time.Now()
		if c.a, err = launch(a); err != nil {
			return c, started, err
		}
		first = c.a
	default:
		return c, started, fmt.Errorf("unknown topology %q: %s or %s", o.topology, topoStore, topoEmbedded)
	}
	// A node with N members logs ready once all N have started.
	if err := first.waitReady(ctx, 2*time.Minute+time.Duration(o.pairs)*20*time.Millisecond); err != nil {
		return c, started, err
	}
	c.natsURL = first.clientURL
	if c.natsURL == "" {
		return c, started, errors.New(first.name + ": the ready line gave no client_url")
	}
	if c.a == nil {
		a.url = c.natsURL
		started = time.Now()
		if c.a, err = launch(a); err != nil {
			return c, started, err
		}
	}
	if c.b, err = launch(nodeSpec{name: siteB, dataDir: filepath.Join(dir, siteB), url: c.natsURL, mode: o.mode, pairs: o.pairs, pprof: o.pprof, promote: o.promote}); err != nil {
		return c, started, err
	}
	return c, started, nil
}

// members are the member processes, site-a first.
func (c *cluster) members() []*proc { return []*proc{c.a, c.b} }

// stop kills every process, members first (the store last, so that
// nothing the members do in their last moment meets a dead store).
func (c *cluster) stop() {
	c.a.kill()
	c.b.kill()
	c.store.kill()
}

// unexpectedExits names the processes that exited without being killed.
func (c *cluster) unexpectedExits() []string {
	var out []string
	for _, p := range []*proc{c.store, c.a, c.b} {
		if p != nil && !p.alive() && !p.killed.Load() {
			out = append(out, fmt.Sprintf("%s (%v; the end of its log:%s)", p.name, p.waitErr, p.tail()))
		}
	}
	return out
}

// refusals are the reasons the member nodes gave for refusing to start.
func (c *cluster) refusals() []string {
	var out []string
	for _, p := range c.members() {
		if r := p.refusal.Load().(string); r != "" && !p.alive() {
			out = append(out, p.name+": "+r)
		}
	}
	return out
}
