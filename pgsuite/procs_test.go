package pgsuite

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a process the suite started.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	log  *os.File
}

// startProc runs argv in dir with its output appended to logPath, in its
// own process group, killed if the test binary dies (PR_SET_PDEATHSIG).
func startProc(name, dir, logPath string, argv ...string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "---- pgsuite %s: start %s\n", time.Now().UTC().Format(time.RFC3339Nano), strings.Join(argv, " "))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := spawn(cmd); err != nil {
		f.Close()
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), log: f}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// wait waits up to d for the exit.
func (p *proc) wait(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

// spawns are the starts of processes, run by one goroutine locked to its
// OS thread for the life of the test binary: PR_SET_PDEATHSIG fires when
// the thread that forked the child exits, not the process.
var spawns = make(chan func())

func init() {
	go func() {
		goruntime.LockOSThread() // never unlocked: this thread is the children's parent
		for f := range spawns {
			f()
		}
	}()
}

func spawn(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	spawns <- func() { done <- cmd.Start() }
	return <-done
}

// procStat reads a process's parent and state from /proc/<pid>/stat.
func procStat(pid int) (ppid int, state byte, ok bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, false
	}
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

// alive: the process exists and is not a zombie.
func alive(pid int) bool {
	_, state, ok := procStat(pid)
	return ok && state != 'Z'
}

// childrenOf reads /proc/<pid>/task/*/children.
func childrenOf(pid int) []int {
	tasks, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "children"))
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// postmasterPID reads the postmaster's pid from its data directory (0:
// none).
func postmasterPID(dataDir string) int {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(line))
	return pid
}

// procsUnder lists the live processes working in dir or below, or naming
// it on their command line: every PostgreSQL process of a test (its
// working directory is the data directory), the nodes (their node file)
// and the keepers (started in the node's directory).
func procsUnder(dir string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self || !alive(pid) {
			continue
		}
		base := filepath.Join("/proc", e.Name())
		cwd, _ := os.Readlink(filepath.Join(base, "cwd"))
		cmdline, _ := os.ReadFile(filepath.Join(base, "cmdline"))
		if cwd == dir || strings.HasPrefix(cwd, dir+"/") || strings.Contains(string(cmdline), dir+"/") {
			out = append(out, pid)
		}
	}
	return out
}

type osUser struct{ uid, gid uint32 }

func lookupUser(name string) (osUser, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return osUser{}, err
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return osUser{}, errors.New("uid/gid of " + name + " are not numbers")
	}
	return osUser{uint32(uid), uint32(gid)}, nil
}
