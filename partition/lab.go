package partition

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// NamePrefix starts the name of every network namespace the suite creates:
// NamePrefix<pid>-<lab>-<site>. A leftover whose pid no longer runs (or is
// this process's, from an earlier run that had the same pid) is removed at
// start.
const NamePrefix = "uspt"

var leftoverRE = regexp.MustCompile(`^` + NamePrefix + `(\d+)-`)

// Site is one network namespace of a lab, joined to the lab's bridge by a
// veth pair: eth0 inside the site, HubIf on the bridge.
type Site struct {
	Name  string // a, b, w
	NS    string
	IP    string
	HubIf string
}

// Lab is three sites on one bridge that lives in a namespace of its own, so
// nothing of the host's network is touched: every address is in
// 10.231.<Net>.0/24, which exists only inside the lab.
type Lab struct {
	Hub   string
	Net   int
	Sites map[string]*Site
}

// run runs a command and returns its combined output, with the output in
// the error.
func run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// CleanLeftovers removes the namespaces of earlier runs that crashed before
// their cleanup: those named NamePrefix<pid>- whose pid is gone or is this
// process's own. The processes still inside are killed first.
func CleanLeftovers(ctx context.Context) ([]string, error) {
	out, err := run(ctx, "ip", "netns", "list")
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		name := f[0]
		m := leftoverRE.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if pid != os.Getpid() && syscall.Kill(pid, 0) == nil {
			continue // a run in progress
		}
		killInside(ctx, name)
		if _, err := run(ctx, "ip", "netns", "del", name); err != nil {
			return removed, err
		}
		removed = append(removed, name)
	}
	return removed, nil
}

// killInside kills the processes left in a namespace (they keep it alive).
func killInside(ctx context.Context, ns string) {
	out, _ := run(ctx, "ip", "netns", "pids", ns)
	for _, f := range strings.Fields(out) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// NewLab creates the hub namespace with its bridge and the three sites
// a (10.231.net.1), b (.2) and w (.3). On error it removes what it made.
func NewLab(ctx context.Context, id string, netOctet int) (_ *Lab, err error) {
	l := &Lab{Hub: id + "-hub", Net: netOctet, Sites: map[string]*Site{}}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	steps := [][]string{
		{"ip", "netns", "add", l.Hub},
		{"ip", "-n", l.Hub, "link", "set", "lo", "up"},
		{"ip", "-n", l.Hub, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", l.Hub, "link", "set", "br0", "up"},
	}
	for i, name := range []string{"a", "b", "w"} {
		s := &Site{Name: name, NS: id + "-" + name, IP: fmt.Sprintf("10.231.%d.%d", netOctet, i+1), HubIf: "v" + name}
		l.Sites[name] = s
		steps = append(steps,
			[]string{"ip", "netns", "add", s.NS},
			[]string{"ip", "-n", s.NS, "link", "set", "lo", "up"},
			[]string{"ip", "-n", l.Hub, "link", "add", s.HubIf, "type", "veth", "peer", "name", "eth0", "netns", s.NS},
			[]string{"ip", "-n", l.Hub, "link", "set", s.HubIf, "master", "br0"},
			[]string{"ip", "-n", l.Hub, "link", "set", s.HubIf, "up"},
			[]string{"ip", "-n", s.NS, "addr", "add", s.IP + "/24", "dev", "eth0"},
			[]string{"ip", "-n", s.NS, "link", "set", "eth0", "up"},
		)
	}
	for _, st := range steps {
		if _, err := run(ctx, st[0], st[1:]...); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Close kills whatever still runs in the lab's namespaces and deletes them
// (which deletes their veths). Safe to call more than once.
func (l *Lab) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	names := []string{l.Hub}
	for _, s := range l.Sites {
		names = append(names, s.NS)
	}
	for _, ns := range names {
		if _, err := os.Stat("/var/run/netns/" + ns); err != nil {
			continue
		}
		killInside(ctx, ns)
		_, _ = run(ctx, "ip", "netns", "del", ns)
	}
}

// IPTables runs iptables inside a site's namespace.
func (l *Lab) IPTables(ctx context.Context, site string, args ...string) error {
	_, err := run(ctx, "ip", append([]string{"netns", "exec", l.Sites[site].NS, "iptables", "-w", "5"}, args...)...)
	return err
}

// Isolate drops everything a site sends or receives on its link (its own
// loopback traffic, such as a node to its local NATS server, still flows).
func (l *Lab) Isolate(ctx context.Context, site string) error {
	if err := l.IPTables(ctx, site, "-I", "INPUT", "-i", "eth0", "-j", "DROP"); err != nil {
		return err
	}
	return l.IPTables(ctx, site, "-I", "OUTPUT", "-o", "eth0", "-j", "DROP")
}

// Heal removes every rule of a site's filter table.
func (l *Lab) Heal(ctx context.Context, site string) error {
	return errors.Join(l.IPTables(ctx, site, "-F", "INPUT"), l.IPTables(ctx, site, "-F", "OUTPUT"))
}

// Proc is a process started inside a site's namespace.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start runs argv inside a site's namespace (ip netns exec execs it, so
// the pid is the program's), appending its output to logPath. The process
// is killed if this one dies (PR_SET_PDEATHSIG).
func (l *Lab) Start(site, name, logPath string, env []string, argv ...string) (*Proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "---- %s start %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(argv, " "))
	cmd := exec.Command("ip", append([]string{"netns", "exec", l.Sites[site].NS}, argv...)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := spawn(cmd); err != nil {
		f.Close()
		return nil, err
	}
	p := &Proc{Name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// Running reports whether the process has not exited.
func (p *Proc) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// ExitErr is how the process ended (nil while it runs).
func (p *Proc) ExitErr() error {
	if p.Running() {
		return nil
	}
	if p.err == nil {
		return errors.New("exit status 0")
	}
	return p.err
}

// Kill sends SIGKILL and waits for the exit.
func (p *Proc) Kill() {
	if p.Running() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-p.done
}

// Stop sends SIGTERM, then SIGKILL after grace.
func (p *Proc) Stop(grace time.Duration) {
	if !p.Running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.Kill()
	}
}

// spawns are the starts of processes, run by one goroutine locked to its
// OS thread for the life of this process: PR_SET_PDEATHSIG fires when the
// thread that forked the child exits, not the process, and the Go runtime
// ends the threads of goroutines that exit while locked (a namespace switch
// that could not be undone, in a library or here).
var spawns = make(chan func())

func init() {
	go func() {
		goruntime.LockOSThread() // never unlocked: this thread is the children's parent
		for f := range spawns {
			f()
		}
	}()
}

// spawn starts cmd on the spawner thread.
func spawn(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	spawns <- func() { done <- cmd.Start() }
	return <-done
}

// Dial opens a TCP connection to addr from inside a site's namespace: the
// socket is created on an OS thread moved into that namespace for the dial
// and moved back after it, so the rest of this process stays at home.
func (l *Lab) Dial(site, addr string, timeout time.Duration) (net.Conn, error) {
	type result struct {
		conn net.Conn
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		goruntime.LockOSThread()
		home, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			goruntime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer home.Close()
		f, err := os.Open("/var/run/netns/" + l.Sites[site].NS)
		if err != nil {
			goruntime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			// unchanged or half-changed: let the thread go with the goroutine
			ch <- result{err: fmt.Errorf("setns %s: %w", l.Sites[site].NS, err)}
			return
		}
		c, err := net.DialTimeout("tcp", addr, timeout)
		if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
			goruntime.UnlockOSThread() // back home: the thread may serve others
		} // else it stays locked and ends with this goroutine
		ch <- result{c, err}
	}()
	r := <-ch
	return r.conn, r.err
}

// HTTPGet fetches http://addr/path from inside a site's namespace (Dial).
func (l *Lab) HTTPGet(site, addr, path string, timeout time.Duration) ([]byte, error) {
	conn, err := l.Dial(site, addr, timeout)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr); err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(conn)
	if err != nil {
		return nil, err
	}
	_, body, ok := bytes.Cut(raw, []byte("\r\n\r\n"))
	if !ok {
		return nil, fmt.Errorf("GET %s%s: no HTTP body in %q", addr, path, raw)
	}
	return body, nil
}

// procs is a set of processes, killed together at cleanup.
type procs struct {
	mu sync.Mutex
	ps []*Proc
}

func (s *procs) add(p *Proc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ps = append(s.ps, p)
}

func (s *procs) killAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.ps {
		p.Kill()
	}
}
