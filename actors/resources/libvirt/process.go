package libvirt

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/rpc"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"understudy/actors/resources/libvirt/rules"
)

// DriverName is the executable of the libvirt driver process.
const DriverName = "understudy-libvirt"

// ErrDriverMissing: no understudy-libvirt executable was found.
var ErrDriverMissing = errors.New(DriverName + " not found")

// DriverConfig says where the understudy-libvirt process is.
type DriverConfig struct {
	// Path is its executable. Empty: FindDriver's answer (next to the
	// running executable, else in PATH), looked up at every start so that
	// one installed later is found. (The runtime resolves it at load.)
	Path string
	// Socket, when set, is the unix socket of an understudy-libvirt that
	// someone else runs (understudy-libvirt --listen SOCKET): calls go
	// there, nothing is started, and Path is unused. A call whose ctx ends
	// then only drops its connection: the libvirt call goes on in that
	// process. For tests only — no node file sets it: they share one
	// process between an agent and themselves this way, to look behind
	// the agent's back (libvirt's test:///default keeps one state per
	// process).
	Socket string
}

// DriverProcess runs libvirt calls in understudy-libvirt processes, so
// that the process calling it links no libvirt: libvirt.so.0 and the
// forty-odd libraries it pulls in are loaded there (some 20 MiB), a crash
// in libvirt's C code takes only that process down, and a libvirt call
// that hangs can be stopped — by killing the process.
//
// Two kinds of process. The calls of Hypervisor share one, started on the
// first call (never by validation) and again on the call after it died;
// they run concurrently (net/rpc multiplexes them) on the connection pool
// that process keeps. Each call of Fresh (a fence step) runs in a process
// of its own, started for it (some 40 ms) and stopped after it, so that
// killing it at the call's deadline ends that call only. A call whose ctx
// ends before the reply kills its process — with its process group, so
// that libvirt's own children (ssh, for qemu+ssh URIs) go too — and
// returns the ctx's error; on the shared process every call it was running
// fails, and the next call starts a new one. A process dies with the
// process that started it (PR_SET_PDEATHSIG). A death nobody caused is
// logged with its exit status and the last lines of its stderr; its log
// lines (JSON on its stderr) are logged through the DriverProcess's
// logger. Close stops them all.
//
// DriverProcess is a Connector; safe for concurrent use.
type DriverProcess struct {
	cfg    DriverConfig
	logger *slog.Logger
	mu     sync.Mutex
	cur    *driverConn // the shared process; nil: none started (or the last one was dropped)
	// single are the processes of Fresh calls, each running one call,
	// until they are gone.
	single map[*driverConn]struct{}
	closed bool
}

// driverConn is one understudy-libvirt process, or one connection to a
// Socket.
type driverConn struct {
	client *rpc.Client
	cmd    *exec.Cmd // nil on a Socket
	stdin  *os.File  // our end of its stdin; nil on a Socket
	where  string    // the executable, or the socket
	// exited is closed once the process is gone and reaped (never on a
	// Socket).
	exited chan struct{}
	stderr *stderrLog
	// stopped: we killed or closed it, so its end is no news.
	stopped atomic.Bool
	single  bool // it runs one Fresh call
}

// kill kills the process and its process group: libvirt's children with
// it (ssh for qemu+ssh URIs), which would otherwise outlive it.
func (c *driverConn) kill() {
	pid := c.cmd.Process.Pid
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		_ = c.cmd.Process.Kill()
	}
}

// NewDriverProcess returns a DriverProcess; nothing starts until a call
// needs it. logger nil means slog.Default().
func NewDriverProcess(cfg DriverConfig, logger *slog.Logger) *DriverProcess {
	if logger == nil {
		logger = slog.Default()
	}
	return &DriverProcess{cfg: cfg, logger: logger, single: map[*driverConn]struct{}{}}
}

// Hypervisor implements Connector: its calls run in the shared process,
// which keeps one connection per URI for them.
func (d *DriverProcess) Hypervisor(uri string) Hypervisor { return remote{d: d, uri: uri} }

// Fresh implements Connector: each call runs in a process of its own (on
// a Socket: a connection of its own), on a libvirt connection of its own.
func (d *DriverProcess) Fresh(uri string) Hypervisor {
	return remote{d: d, uri: uri, fresh: true}
}

// PID is the id of the shared process; 0 when none runs (or on a
// Socket).
func (d *DriverProcess) PID() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cur == nil || d.cur.cmd == nil {
		return 0
	}
	select {
	case <-d.cur.exited:
		return 0
	default:
		return d.cur.cmd.Process.Pid
	}
}

// Close stops the processes. The shared one's stdin closes, it closes its
// libvirt connections and exits (it is killed if it has not within 5 s: a
// libvirt call may hang); those of Fresh calls still running are killed at
// once, and their calls fail. On a Socket it closes the connections, which
// closes the libvirt connections that process opened for them. Later calls
// fail with ErrClosed. Idempotent; it returns once the processes are gone.
func (d *DriverProcess) Close() error {
	d.mu.Lock()
	d.closed = true
	shared, singles := d.cur, slices.Collect(maps.Keys(d.single))
	d.cur = nil
	d.mu.Unlock()
	var wg sync.WaitGroup
	if shared != nil {
		wg.Go(func() { d.stop(shared, 5*time.Second) })
	}
	// A Fresh call still running is cut off: its process is killed at
	// once (a fence step of a member that stops).
	for _, c := range singles {
		wg.Go(func() { d.stop(c, 0) })
	}
	wg.Wait()
	return nil
}

// stop ends c: its stdin closes and it exits; it is killed if it has not
// within grace (0: at once). On a Socket it closes the connection.
func (d *DriverProcess) stop(c *driverConn, grace time.Duration) {
	c.stopped.Store(true)
	if c.cmd == nil {
		_ = c.client.Close()
		return
	}
	if grace == 0 {
		c.kill()
		<-c.exited
		return
	}
	// Only stdin: the replies of calls still running are read until it
	// exits (closing its stdout under it would kill it with SIGPIPE).
	_ = c.stdin.Close()
	wait, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	select {
	case <-c.exited:
		d.logger.Info("libvirt: "+DriverName+" stopped", "pid", c.cmd.Process.Pid)
	case <-wait.Done():
		d.logger.Warn("libvirt: "+DriverName+" still runs "+grace.String()+" after its stdin closed (a libvirt call hangs?); killing it", "pid", c.cmd.Process.Pid)
		c.kill()
		<-c.exited
	}
}

// FindDriver looks for understudy-libvirt next to the running executable
// (and next to the file it links to), then in PATH. Its error wraps
// ErrDriverMissing and says what to do.
func FindDriver() (string, error) {
	where := "the running executable"
	if exe, err := os.Executable(); err == nil {
		where = exe
		dirs := []string{filepath.Dir(exe)}
		if real, err := filepath.EvalSymlinks(exe); err == nil && filepath.Dir(real) != dirs[0] {
			dirs = append(dirs, filepath.Dir(real))
			where += " (" + real + ")"
		}
		for _, dir := range dirs {
			p := filepath.Join(dir, DriverName)
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
				return p, nil
			}
		}
	}
	if p, err := exec.LookPath(DriverName); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%w next to %s or in PATH: build it with make build, or set libvirt.driver", ErrDriverMissing, where)
}

// conn returns the shared process, starting one if none runs.
func (d *DriverProcess) conn() (*driverConn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	if c := d.cur; c != nil {
		select {
		case <-c.exited: // died (and was reported): start another
		default:
			return c, nil
		}
	}
	c, err := d.start()
	if err != nil {
		return nil, err
	}
	d.cur = c
	return c, nil
}

// startSingle starts a process for one Fresh call; end it with
// endSingle. Started outside d.mu, so that calls do not wait for each
// other's start.
func (d *DriverProcess) startSingle() (*driverConn, error) {
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	c, err := d.start()
	if err != nil {
		return nil, err
	}
	c.single = true
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed { // closed while starting
		go d.stop(c, 0)
		return nil, ErrClosed
	}
	d.single[c] = struct{}{}
	if c.cmd != nil {
		go func() {
			<-c.exited
			d.mu.Lock()
			delete(d.single, c)
			d.mu.Unlock()
		}()
	}
	return c, nil
}

// endSingle ends the process of a Fresh call once the call returned: it
// exits once it has closed its libvirt connection (nobody waits for that;
// Close does). A process the call killed is gone already.
func (d *DriverProcess) endSingle(c *driverConn) {
	c.stopped.Store(true)
	if c.cmd == nil {
		d.mu.Lock()
		delete(d.single, c)
		d.mu.Unlock()
		_ = c.client.Close()
		return
	}
	_ = c.stdin.Close()
}

// forget drops c if it is the shared one: the next call starts anew.
func (d *DriverProcess) forget(c *driverConn) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cur == c {
		d.cur = nil
	}
}

func (d *DriverProcess) start() (*driverConn, error) {
	if d.cfg.Socket != "" {
		nc, err := net.Dial("unix", d.cfg.Socket)
		if err != nil {
			return nil, fmt.Errorf("%s at %s: %w", DriverName, d.cfg.Socket, err)
		}
		return &driverConn{client: rpc.NewClient(nc), where: d.cfg.Socket, exited: make(chan struct{})}, nil
	}
	path := d.cfg.Path
	if path == "" {
		var err error
		if path, err = FindDriver(); err != nil {
			return nil, err
		}
	}
	// Our own pipes, not cmd's: Wait must not close our ends while the
	// rpc client still reads the last replies.
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	c := &driverConn{where: path, stdin: inW, exited: make(chan struct{}), stderr: &stderrLog{logger: d.logger}}
	cmd := exec.Command(path)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, c.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// A group of its own, killed as one: libvirt's children (ssh for
		// qemu+ssh) die with it.
		Setpgid: true,
		// It dies with us (strictly: with the OS thread that started it;
		// Go ends a thread only when a goroutine locked to it exits,
		// which nothing in understudy does).
		Pdeathsig: syscall.SIGKILL,
	}
	// A child of libvirt's (ssh, for qemu+ssh) may hold stderr open after
	// the process died.
	cmd.WaitDelay = time.Second
	err = cmd.Start()
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	c.cmd = cmd
	c.stderr.setPID(cmd.Process.Pid)
	c.client = rpc.NewClient(&pipeConn{r: outR, w: inW})
	go d.wait(c)
	d.logger.Info("libvirt: "+DriverName+" started", "pid", cmd.Process.Pid, "path", path)
	return c, nil
}

// wait reaps the process and reports a death nobody asked for.
func (d *DriverProcess) wait(c *driverConn) {
	err := c.cmd.Wait()
	_ = c.client.Close() // our pipe ends; calls still waiting fail
	close(c.exited)
	if c.stopped.Load() {
		return
	}
	d.logger.Error("libvirt: "+DriverName+" died; the next libvirt call starts a new one",
		"pid", c.cmd.Process.Pid, "status", exitStatus(c.cmd, err), "stderr", c.stderr.tail())
}

func exitStatus(cmd *exec.Cmd, waitErr error) string {
	if cmd.ProcessState != nil {
		return cmd.ProcessState.String()
	}
	return waitErr.Error()
}

// call runs method in the process and returns its reply, or an error
// naming the URI.
func (d *DriverProcess) call(ctx context.Context, method string, req *Request) (Reply, error) {
	uri := req.URI
	if err := ctx.Err(); err != nil {
		return Reply{}, fmt.Errorf("libvirt %s: not started: %w", uri, err)
	}
	if rule := rules.URI(uri); rule != "" {
		return Reply{}, fmt.Errorf("libvirt: uri %s: %s", uri, rule)
	}
	var c *driverConn
	var err error
	if req.Fresh {
		c, err = d.startSingle()
		if err == nil {
			defer d.endSingle(c)
		}
	} else {
		c, err = d.conn()
	}
	if err != nil {
		return Reply{}, fmt.Errorf("libvirt %s: %w", uri, err)
	}
	req.Protocol = ProtocolVersion
	reply := new(Reply) // written by the rpc client; not read once abandoned
	call := c.client.Go(ServiceName+"."+method, req, reply, make(chan *rpc.Call, 1))
	select {
	case <-call.Done:
	case <-ctx.Done():
		return Reply{}, fmt.Errorf("libvirt %s: %w (%s)", uri, ctx.Err(), d.abandon(c, method, uri))
	}
	if call.Error != nil {
		var se rpc.ServerError
		if errors.As(call.Error, &se) {
			return Reply{}, fmt.Errorf("libvirt %s: %s: %w", uri, DriverName, call.Error)
		}
		return Reply{}, fmt.Errorf("libvirt %s: %s", uri, d.broken(ctx, c, call.Error))
	}
	return *reply, reply.Err.Err()
}

// abandon stops a call whose ctx ended: it kills the process (on a
// Socket: drops the connection) and says so.
func (d *DriverProcess) abandon(c *driverConn, method, uri string) string {
	d.forget(c)
	c.stopped.Store(true)
	if c.cmd == nil {
		_ = c.client.Close()
		d.logger.Warn("libvirt: a call outlived its context; dropped the connection to "+DriverName+" (the call goes on in that process)",
			"socket", c.where, "uri", uri, "call", method)
		return "dropped the connection to " + DriverName + " at " + c.where + "; the call goes on there"
	}
	pid := c.cmd.Process.Pid
	c.kill()
	if c.single {
		d.logger.Warn("libvirt: a call outlived its context; killed the "+DriverName+" that ran it alone",
			"pid", pid, "uri", uri, "call", method)
	} else {
		d.logger.Warn("libvirt: a call outlived its context; killed "+DriverName+" to stop it (the next call starts a new one)",
			"pid", pid, "uri", uri, "call", method)
	}
	return fmt.Sprintf("%s (pid %d) was killed to stop the call, which libvirt cannot interrupt", DriverName, pid)
}

// broken handles a call that failed in transport: the process died (or
// broke the protocol), or the socket closed.
func (d *DriverProcess) broken(ctx context.Context, c *driverConn, callErr error) string {
	d.forget(c)
	if c.cmd == nil {
		c.stopped.Store(true)
		_ = c.client.Close()
		return fmt.Sprintf("lost the connection to %s at %s: %v", DriverName, c.where, callErr)
	}
	pid := c.cmd.Process.Pid
	// Its stdout ended: it exited or is about to; wait for the status.
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	select {
	case <-c.exited:
		if c.stopped.Load() {
			return fmt.Sprintf("%s (pid %d) was stopped during the call (closed, or killed when another call outlived its context)", DriverName, pid)
		}
		return fmt.Sprintf("%s (pid %d) died during the call (%s); stderr: %s", DriverName, pid, exitStatus(c.cmd, nil), c.stderr.tail())
	case <-wctx.Done():
		c.stopped.Store(true)
		c.kill()
		d.logger.Error("libvirt: "+DriverName+" broke the protocol; killed it", "pid", pid, "err", callErr)
		return fmt.Sprintf("%s (pid %d) broke the protocol (%v) and was killed", DriverName, pid, callErr)
	}
}

// pipeConn is the rpc client's side of the process's stdin and stdout.
type pipeConn struct{ r, w *os.File }

func (p *pipeConn) Read(b []byte) (int, error)  { return p.r.Read(b) }
func (p *pipeConn) Write(b []byte) (int, error) { return p.w.Write(b) }
func (p *pipeConn) Close() error                { return errors.Join(p.w.Close(), p.r.Close()) }

// stderrLog receives the process's stderr: its JSON log lines are logged
// through logger at their level; other lines (a crash dump, a message from
// a C library) at debug level, since the report of its death quotes them.
type stderrLog struct {
	logger  *slog.Logger
	mu      sync.Mutex
	pid     int
	partial []byte
	logged  []string // its last log lines, at most reportLogLines
	after   []string // the first reportAfterLines other lines since the last log line
	dropped int      // other lines beyond those
}

// What a death report quotes: the last log lines, then the start of what
// followed them — a Go crash dump begins with its reason (panic: …,
// SIGSEGV: …) and the goroutine that crashed (in a libvirt call: the C
// function), then goes on for a hundred lines of runtime goroutines.
const (
	reportLogLines   = 5
	reportAfterLines = 30
)

func (s *stderrLog) setPID(pid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pid = pid
}

func (s *stderrLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.partial = append(s.partial, p...)
	for {
		i := bytes.IndexByte(s.partial, '\n')
		if i < 0 {
			break
		}
		s.line(string(s.partial[:i]))
		s.partial = s.partial[i+1:]
	}
	if len(s.partial) > 64<<10 { // a line without end: take it as it is
		s.line(string(s.partial))
		s.partial = nil
	}
	return len(p), nil
}

func (s *stderrLog) line(l string) {
	if len(l) > 1024 {
		l = l[:1024] + "…"
	}
	var rec map[string]any
	if json.Unmarshal([]byte(l), &rec) != nil || rec["msg"] == nil {
		if len(s.after) < reportAfterLines {
			s.after = append(s.after, l)
		} else {
			s.dropped++
		}
		s.logger.Debug(DriverName+": "+l, "pid", s.pid)
		return
	}
	s.logged = append(s.logged, l)
	if len(s.logged) > reportLogLines {
		s.logged = append([]string(nil), s.logged[len(s.logged)-reportLogLines:]...)
	}
	s.after, s.dropped = nil, 0
	var level slog.Level
	if lv, ok := rec["level"].(string); !ok || level.UnmarshalText([]byte(lv)) != nil {
		level = slog.LevelWarn
	}
	msg, _ := rec["msg"].(string)
	attrs := []any{"pid", s.pid}
	for _, k := range slices.Sorted(maps.Keys(rec)) {
		if k != "time" && k != "level" && k != "msg" {
			attrs = append(attrs, k, rec[k])
		}
	}
	s.logger.Log(context.Background(), level, msg, attrs...)
}

// tail is what the process last wrote on its stderr, for a death report.
func (s *stderrLog) tail() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	lines := append(slices.Clone(s.logged), s.after...)
	if s.dropped > 0 {
		lines = append(lines, fmt.Sprintf("… %d more lines", s.dropped))
	}
	if len(s.partial) > 0 {
		lines = append(lines, string(s.partial))
	}
	out := strings.Join(lines, "\n")
	if strings.TrimSpace(out) == "" {
		return "(empty)"
	}
	return out
}

// remote is a Hypervisor whose calls run in a DriverProcess.
type remote struct {
	d     *DriverProcess
	uri   string
	fresh bool
}

func (h remote) URI() string { return h.uri }

func (h remote) do(ctx context.Context, method string, req Request) (Reply, error) {
	req.URI, req.Fresh = h.uri, h.fresh
	return h.d.call(ctx, method, &req)
}

func (h remote) DomainStatus(ctx context.Context, name string) (DomainStatus, error) {
	r, err := h.do(ctx, "DomainStatus", Request{Name: name})
	return r.Domain, err
}

func (h remote) EnsureVM(ctx context.Context, vm *VM, state string, autostart bool) (DomainStatus, error) {
	// Checked here too, so a bad config is refused with its typed error
	// and starts no process.
	if err := vm.Validate(); err != nil {
		return DomainStatus{}, err
	}
	if err := CheckVMState(state); err != nil {
		return DomainStatus{}, err
	}
	r, err := h.do(ctx, "EnsureVM", Request{VM: vm, State: state, Autostart: autostart})
	return r.Domain, err
}

func (h remote) Start(ctx context.Context, name string) error {
	_, err := h.do(ctx, "Start", Request{Name: name})
	return err
}

func (h remote) Shutdown(ctx context.Context, name string) error {
	_, err := h.do(ctx, "Shutdown", Request{Name: name})
	return err
}

func (h remote) Destroy(ctx context.Context, name string) (bool, error) {
	r, err := h.do(ctx, "Destroy", Request{Name: name})
	return r.WasRunning, err
}

func (h remote) Undefine(ctx context.Context, name string) error {
	_, err := h.do(ctx, "Undefine", Request{Name: name})
	return err
}

func (h remote) DeleteVM(ctx context.Context, name string, owner Owner) error {
	_, err := h.do(ctx, "DeleteVM", Request{Name: name, Owner: owner})
	return err
}

func (h remote) SetLink(ctx context.Context, domain string, nic NICRef, up bool) (LinkResult, error) {
	r, err := h.do(ctx, "SetLink", Request{Name: domain, NIC: nic, Up: up})
	return r.Link, err
}

func (h remote) NetworkStatus(ctx context.Context, name string) (NetworkStatus, error) {
	r, err := h.do(ctx, "NetworkStatus", Request{Name: name})
	return r.Network, err
}

func (h remote) EnsureNetwork(ctx context.Context, net *Network, autostart bool) (NetworkStatus, error) {
	if err := net.Validate(); err != nil {
		return NetworkStatus{}, err
	}
	r, err := h.do(ctx, "EnsureNetwork", Request{Network: net, Autostart: autostart})
	return r.Network, err
}

func (h remote) DeleteNetwork(ctx context.Context, name string, owner Owner) error {
	_, err := h.do(ctx, "DeleteNetwork", Request{Name: name, Owner: owner})
	return err
}
