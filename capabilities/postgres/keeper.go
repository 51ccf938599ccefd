package postgres

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The keeper is a small process between the node and the postmaster: the
// postmaster's parent, so PostgreSQL cannot outlive the node nor run on
// while the node is paused. The node talks to it over its stdin and stdout,
// one JSON object a line: requests (keeperRequest) in, replies and events
// (keeperMessage) out.
//
//   - stdin closes (the node died, even by kill -9): immediate stop, exit.
//   - SIGTERM (the keeper's parent-death signal from the node, as a backup,
//     or an operator): the same.
//   - armed and no pet for the grace: immediate stop, event "expired".
//
// The postmaster gets SIGKILL when the keeper dies (its parent-death
// signal) and the keeper is a child subreaper, so that backends orphaned by
// a killed postmaster come back to it and are killed too: nothing of
// PostgreSQL that could commit is left when a stop is reported.

// keeperEnv marks a process started as the keeper (tests dispatch on it
// in TestMain; the understudy binary uses its pg-keeper subcommand).
const keeperEnv = "UNDERSTUDY_PG_KEEPER"

// immediateWait is how long an immediate stop waits for the postmaster to
// exit after SIGQUIT before killing every PostgreSQL process.
const immediateWait = 100 * time.Millisecond

type keeperRequest struct {
	ID   uint64 `json:"id"`
	Op   string `json:"op"` // start, stop, arm, disarm, pet
	Mode string `json:"mode,omitempty"`
	// start
	Argv   []string `json:"argv,omitempty"`
	Dir    string   `json:"dir,omitempty"`
	Env    []string `json:"env,omitempty"`
	Log    string   `json:"log,omitempty"`
	UID    *uint32  `json:"uid,omitempty"`
	GID    uint32   `json:"gid,omitempty"`
	Groups []uint32 `json:"groups,omitempty"`
}

type keeperMessage struct {
	ID  uint64 `json:"id,omitempty"` // a reply to request ID
	Err string `json:"err,omitempty"`
	PID int    `json:"pid,omitempty"`
	// Event: ready, exited (PID, Msg), expired (Msg), log (Msg).
	Event string `json:"ev,omitempty"`
	Msg   string `json:"msg,omitempty"`
}

// KeeperMain runs the keeper: args are its flags (-grace, -watchdog); it
// returns the exit code. Its stdin and stdout are the pipes to the node.
func KeeperMain(args []string) int {
	fs := flag.NewFlagSet("pg-keeper", flag.ContinueOnError)
	grace := fs.Duration("grace", 0, "stop PostgreSQL when armed and not petted for this long (0: never)")
	watchdog := fs.String("watchdog", "", "watchdog device to pet while armed")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	k := &keeper{
		out:      json.NewEncoder(os.Stdout),
		grace:    *grace,
		watchdog: *watchdog,
		self:     os.Getpid(),
	}
	return k.run(os.Stdin)
}

type keeper struct {
	outMu    sync.Mutex
	out      *json.Encoder
	grace    time.Duration
	watchdog string
	self     int

	pid     int // the postmaster, 0 when none
	armed   bool
	lastPet time.Time
	dog     *os.File
}

func (k *keeper) send(m keeperMessage) {
	k.outMu.Lock()
	defer k.outMu.Unlock()
	_ = k.out.Encode(m) // a node that went away reads nothing; stdin's EOF ends us
}

func (k *keeper) logf(format string, args ...any) {
	k.send(keeperMessage{Event: "log", Msg: fmt.Sprintf(format, args...)})
}

func (k *keeper) run(in io.Reader) int {
	// Orphans of a killed postmaster come back to us (see above).
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	sigs := make(chan os.Signal, 4) // SIGCHLD may come in bursts; coalescing is fine, we reap all
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	reqs := make(chan keeperRequest)
	inDone := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var r keeperRequest
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				continue
			}
			reqs <- r
		}
		inDone <- sc.Err()
	}()
	tick := time.NewTicker(tickFor(k.grace))
	defer tick.Stop()
	k.send(keeperMessage{Event: "ready", PID: k.self})
	for {
		select {
		case r := <-reqs:
			k.handle(r)
		case <-inDone:
			k.shutdown("the node's pipe closed (the node exited or died)")
			return 0
		case s := <-sigs:
			switch s {
			case syscall.SIGCHLD:
				k.reap()
			case syscall.SIGTERM:
				k.shutdown("SIGTERM (the node died, or an operator)")
				return 0
			}
			// SIGINT, SIGHUP: a terminal's signals are not ours to act on.
		case now := <-tick.C:
			k.reap()
			if k.armed && k.grace > 0 && k.pid != 0 && now.Sub(k.lastPet) > k.grace {
				msg := fmt.Sprintf("no pet from the node for %s while PostgreSQL may accept writes: stopped it (immediate)", now.Sub(k.lastPet).Round(time.Millisecond))
				k.stopImmediate()
				k.disarm()
				k.send(keeperMessage{Event: "expired", Msg: msg})
			}
		}
	}
}

// tickFor checks the grace at a tenth of it, at least every 100 ms.
func tickFor(grace time.Duration) time.Duration {
	t := grace / 10
	if t <= 0 || t > 100*time.Millisecond {
		t = 100 * time.Millisecond
	}
	if t < 10*time.Millisecond {
		t = 10 * time.Millisecond
	}
	return t
}

func (k *keeper) handle(r keeperRequest) {
	reply := keeperMessage{ID: r.ID}
	switch r.Op {
	case "pet":
		k.lastPet = time.Now()
		k.petDog()
		return // no reply: pets must not wait
	case "arm":
		k.lastPet = time.Now()
		if err := k.arm(); err != nil {
			reply.Err = err.Error()
		}
	case "disarm":
		k.disarm()
	case "start":
		if k.pid != 0 {
			reply.Err = fmt.Sprintf("PostgreSQL is already running (postmaster %d)", k.pid)
			break
		}
		pid, err := k.start(r)
		if err != nil {
			reply.Err = err.Error()
		}
		reply.PID = pid
	case "stop":
		reply.PID = k.pid
		if k.pid == 0 {
			break
		}
		switch r.Mode {
		case "immediate":
			k.stopImmediate()
		case "fast":
			_ = syscall.Kill(k.pid, syscall.SIGINT) // exit is reported by an "exited" event
		default:
			reply.Err = "unknown stop mode " + strconv.Quote(r.Mode)
		}
	default:
		reply.Err = "unknown request " + strconv.Quote(r.Op)
	}
	k.send(reply)
}

func (k *keeper) arm() error {
	k.armed = true
	if k.watchdog == "" || k.dog != nil {
		return nil
	}
	f, err := os.OpenFile(k.watchdog, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("open watchdog %s: %w", k.watchdog, err)
	}
	k.dog = f
	k.petDog()
	return nil
}

func (k *keeper) disarm() {
	k.armed = false
	if k.dog != nil {
		// Magic close: the device stops counting instead of rebooting.
		_, _ = k.dog.Write([]byte("V"))
		_ = k.dog.Close()
		k.dog = nil
	}
}

func (k *keeper) petDog() {
	if k.armed && k.dog != nil {
		if _, err := k.dog.Write([]byte{0}); err != nil {
			k.logf("pet watchdog %s: %v", k.watchdog, err)
		}
	}
}

func (k *keeper) start(r keeperRequest) (int, error) {
	if len(r.Argv) == 0 {
		return 0, errors.New("start: no command")
	}
	logf, err := os.OpenFile(r.Log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return 0, fmt.Errorf("open the server log: %w", err)
	}
	defer logf.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		return 0, err
	}
	defer null.Close()
	sys := &syscall.SysProcAttr{
		Setpgid:   true, // its own group: a terminal's ^C is not for it, and we can signal all of it
		Pdeathsig: syscall.SIGKILL,
	}
	if r.UID != nil && int(*r.UID) != os.Geteuid() {
		sys.Credential = &syscall.Credential{Uid: *r.UID, Gid: r.GID, Groups: r.Groups}
	}
	// Pdeathsig fires when the forking thread exits, not the process: fork
	// from a thread that stays (a locked thread is only ever ended when its
	// goroutine exits locked, which we do not).
	runtime.LockOSThread()
	pid, err := syscall.ForkExec(r.Argv[0], r.Argv, &syscall.ProcAttr{
		Dir:   r.Dir,
		Env:   r.Env,
		Files: []uintptr{null.Fd(), logf.Fd(), logf.Fd()},
		Sys:   sys,
	})
	runtime.UnlockOSThread()
	if err != nil {
		return 0, fmt.Errorf("start %s: %w", r.Argv[0], err)
	}
	k.pid = pid
	return pid, nil
}

// reap collects every exited child; the postmaster's exit is reported.
func (k *keeper) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
		if pid == k.pid {
			k.pid = 0
			// Orphaned backends of a postmaster that did not end them.
			k.killOrphans(pid)
			k.send(keeperMessage{Event: "exited", PID: pid, Msg: describeWait(ws)})
		}
	}
}

// stopImmediate: SIGQUIT (immediate shutdown), and if the postmaster is not
// gone within immediateWait, SIGKILL to it, its group and every process it
// left. Returns once it is reaped.
func (k *keeper) stopImmediate() {
	pid := k.pid
	if pid == 0 {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGQUIT)
	deadline := time.Now().Add(immediateWait)
	for time.Now().Before(deadline) {
		if k.reap(); k.pid == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	k.logf("postmaster %d still running %s after SIGQUIT: SIGKILL to all of PostgreSQL", pid, immediateWait)
	k.killOrphans(pid) // its children first: they must not outlive it
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for k.pid != 0 {
		time.Sleep(2 * time.Millisecond)
		k.reap()
	}
}

// killOrphans kills the children of postmaster pid, and our own children
// other than the current postmaster (backends orphaned by a killed
// postmaster are reparented to us, the subreaper).
func (k *keeper) killOrphans(pid int) {
	for round := 0; round < 50; round++ {
		found := false
		for _, p := range childrenOf(pid, k.self) {
			if p == k.pid {
				continue
			}
			found = true
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		if !found {
			return
		}
		time.Sleep(2 * time.Millisecond)
		// Reap what came back to us (not the postmaster's status: k.pid
		// is skipped only as a kill target; reap reports it as usual).
		for {
			var ws syscall.WaitStatus
			p, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if p <= 0 || err != nil {
				break
			}
			if p == k.pid {
				k.pid = 0
				k.send(keeperMessage{Event: "exited", PID: p, Msg: describeWait(ws)})
			}
		}
	}
}

func (k *keeper) shutdown(why string) {
	if k.pid != 0 {
		k.logf("%s: stopping PostgreSQL (immediate)", why)
		k.stopImmediate()
	}
	k.disarm()
}

func describeWait(ws syscall.WaitStatus) string {
	switch {
	case ws.Exited():
		return fmt.Sprintf("exit status %d", ws.ExitStatus())
	case ws.Signaled():
		return "killed by " + ws.Signal().String()
	}
	return fmt.Sprintf("wait status %#x", uint32(ws))
}

// childrenOf lists the live processes whose parent is one of parents (from
// /proc; zombies are left for their parent to reap).
func childrenOf(parents ...int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, state, ok := procStat(pid)
		if !ok || state == 'Z' {
			continue
		}
		for _, p := range parents {
			if ppid == p {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// procStat reads a process's parent and state from /proc/<pid>/stat.
func procStat(pid int) (ppid int, state byte, ok bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, false
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, false
	}
	ppid, err = strconv.Atoi(f[1])
	return ppid, f[0][0], err == nil
}
