package resources

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultInitTimeout bounds an init step without its own timeout.
const DefaultInitTimeout = 300 * time.Second

// Process supervises local processes: per resource, init steps that run to
// completion first, in order, then the service, restarted by the agent
// when it is found not running (restart: always; on-failure: only after a
// non-zero exit; never). Processes run in their own process group; Delete
// and StopAll end the group.
//
// A service is tied to the agent: it gets SIGTERM when the agent's process
// dies (PR_SET_PDEATHSIG), unless its spec says detach: true. Every
// service started is recorded in StateDir/processes/<id> (pid, start
// time, boot, spec): an agent started after a crash adopts a service that
// still runs instead of starting it twice, and stops it when the resource
// is deleted or its spec changed.
type Process struct {
	// StateDir holds the records of the services started ("": none kept).
	StateDir string

	mu    sync.Mutex
	procs map[string]*proc
}

type proc struct {
	key   string
	cmd   *exec.Cmd // nil for a service adopted from its record
	pid   int       // the service, leader of its process group
	start uint64    // its start time (clock ticks after boot), with pid its identity
	done  chan struct{}
	exit  int // -1: unknown (an adopted service)
	inits []string
	// detach: it outlives the agent; StopAll leaves it running.
	detach bool
}

// processRecord is StateDir/processes/<id>.
type processRecord struct {
	PID    int      `json:"pid"`
	Start  uint64   `json:"start_ticks"`
	Boot   string   `json:"boot_id"`
	Key    string   `json:"spec"`
	Inits  []string `json:"init_completed,omitempty"`
	Detach bool     `json:"detach,omitempty"`
}

type initStep struct {
	Name    string
	Command []string
	Env     map[string]string
	Timeout time.Duration
}

type processSpec struct {
	Command []string
	Env     map[string]string
	Dir     string
	Restart string
	Detach  bool // outlives the agent's process (no PR_SET_PDEATHSIG)
	Init    []initStep
}

// NewProcess returns the process reconciler.
func NewProcess() *Process { return &Process{procs: map[string]*proc{}} }

func (*Process) Kind() string { return "process" }

func (p *Process) Validate(spec Spec) error { _, err := p.spec(spec); return err }

// MinCallTime is the call time a reconcile of spec must be given so that
// each init step can use its whole timeout: the sum of the steps'
// timeouts. A call bounded more tightly (agent.call_timeout) can cut a
// step off before its own timeout, so the agent can refuse such a
// resource. An invalid spec gives 0 (Validate says why).
func (p *Process) MinCallTime(spec Spec) time.Duration {
	s, err := p.spec(spec)
	if err != nil {
		return 0
	}
	var sum time.Duration
	for _, st := range s.Init {
		sum += st.Timeout
	}
	return sum
}

func (*Process) spec(spec Spec) (processSpec, error) {
	r := NewSpecReader("process", spec)
	var s processSpec
	s.Command = append([]string{r.Str("command", true)}, r.Strs("args")...)
	s.Env = r.StrMap("env")
	s.Dir = r.Str("dir", false)
	s.Restart = r.OneOf("restart", "always", "always", "on-failure", "never")
	s.Detach = r.Bool("detach", false)
	names := map[string]bool{}
	for i, st := range r.List("init") {
		sr := r.Sub(fmt.Sprintf("init[%d].", i), st)
		step := initStep{Name: sr.Str("name", true)}
		step.Command = append([]string{sr.Str("command", true)}, sr.Strs("args")...)
		step.Env = sr.StrMap("env")
		step.Timeout = sr.Duration("timeout", DefaultInitTimeout)
		if err := sr.Done(); err != nil {
			return s, err
		}
		if names[step.Name] {
			return s, &SpecError{"process", fmt.Sprintf("init[%d].name", i), "init step names must be unique (" + step.Name + ")"}
		}
		names[step.Name] = true
		s.Init = append(s.Init, step)
	}
	if err := r.Done(); err != nil {
		return s, err
	}
	return s, nil
}

// specKeyOf is a stable text of a spec (json sorts map keys).
func specKeyOf(s processSpec) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func (p *Process) Observe(_ context.Context, id string, spec Spec) (Observation, error) {
	s, err := p.spec(spec)
	if err != nil {
		return Observation{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.observe(id, s), nil
}

func (p *Process) observe(id string, s processSpec) Observation {
	pr := p.lookup(id)
	if pr == nil {
		return Observation{Drift: "not running"}
	}
	if pr.key != specKeyOf(s) {
		return Observation{Drift: "spec changed"}
	}
	d := map[string]string{"command": strings.Join(s.Command, " "), "services": id}
	if len(pr.inits) > 0 {
		d["init_completed"] = strings.Join(pr.inits, ",")
	}
	if pr.cmd == nil {
		d["adopted"] = "true" // started by an earlier run of the agent
	}
	if !pr.exited() {
		d["pid"] = strconv.Itoa(pr.pid)
		return Observation{InSync: true, Details: d}
	}
	code := strconv.Itoa(pr.exit)
	if pr.exit < 0 {
		code = "unknown" // it was not this agent's child
	}
	d["exit_code"] = code
	if s.Restart == "never" || (s.Restart == "on-failure" && pr.exit == 0) {
		d["services"] = ""
		return Observation{InSync: true, Details: d}
	}
	return Observation{Drift: fmt.Sprintf("exited (code %s)", code), Details: d}
}

// exited reports whether the service ended: its Wait returned, or (an
// adopted service) its pid no longer names the process it recorded.
func (pr *proc) exited() bool {
	if pr.cmd != nil {
		select {
		case <-pr.done:
			return true
		default:
			return false
		}
	}
	start, err := procStart(pr.pid)
	return err != nil || start != pr.start
}

// lookup returns the service of id: started by this agent, or adopted
// from its record (p.mu held).
func (p *Process) lookup(id string) *proc {
	if pr := p.procs[id]; pr != nil {
		return pr
	}
	if p.StateDir == "" {
		return nil
	}
	path := p.recordPath(id)
	b, err := os.ReadFile(path)
	if err != nil || len(b) > 64<<10 {
		return nil
	}
	var rec processRecord
	if json.Unmarshal(b, &rec) != nil || rec.PID <= 1 || rec.Boot != bootID() {
		_ = os.Remove(path) // unreadable, or of another boot: nothing of it runs
		return nil
	}
	if start, err := procStart(rec.PID); err != nil || start != rec.Start {
		_ = os.Remove(path) // ended while the agent was away
		return nil
	}
	pr := &proc{key: rec.Key, pid: rec.PID, start: rec.Start, exit: -1, inits: rec.Inits, detach: rec.Detach}
	p.procs[id] = pr
	return pr
}

func (p *Process) recordPath(id string) string { return filepath.Join(p.StateDir, "processes", id) }

func (p *Process) record(id string, pr *proc) error {
	if p.StateDir == "" {
		return nil
	}
	b, _ := json.Marshal(processRecord{PID: pr.pid, Start: pr.start, Boot: bootID(), Key: pr.key, Inits: pr.inits, Detach: pr.detach})
	return WriteState(p.recordPath(id), b)
}

func (p *Process) forget(id string) {
	if p.StateDir != "" {
		_ = os.Remove(p.recordPath(id))
	}
}

// procStart is the start time of process pid in clock ticks after boot
// (field 22 of /proc/<pid>/stat): with the pid, a process's identity. A
// zombie counts as gone.
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, fmt.Errorf("process %d has exited", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// bootID names this boot of the machine: a pid of another boot is another
// process.
func bootID() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b))
}

func (p *Process) Reconcile(ctx context.Context, id string, spec Spec) (Observation, error) {
	s, err := p.spec(spec)
	if err != nil {
		return Observation{}, err
	}
	p.mu.Lock()
	if o := p.observe(id, s); o.InSync {
		p.mu.Unlock()
		return o, nil
	}
	old := p.lookup(id)
	delete(p.procs, id)
	p.mu.Unlock()
	stop(old)
	p.forget(id)

	var done []string
	for _, st := range s.Init {
		if err := runStep(ctx, id, st.Name, st.Command, st.Env, s.Dir, st.Timeout); err != nil {
			return Observation{Drift: "init step " + st.Name + " failed"}, fmt.Errorf("init step %s: %w", st.Name, err)
		}
		done = append(done, st.Name)
	}
	cmd := exec.Command(s.Command[0], s.Command[1:]...)
	cmd.Env = environ(s.Env)
	cmd.Dir = s.Dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if !s.Detach {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
	}
	if err := ctx.Err(); err != nil {
		return Observation{Drift: "not running"}, err
	}
	if err := cmd.Start(); err != nil {
		return Observation{Drift: "not running"}, fmt.Errorf("start %s: %w", s.Command[0], err)
	}
	pr := &proc{key: specKeyOf(s), cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{}), inits: done, detach: s.Detach}
	pr.start, _ = procStart(pr.pid)
	go func() {
		err := cmd.Wait()
		pr.exit = exitCode(err)
		close(pr.done)
	}()
	p.mu.Lock()
	p.procs[id] = pr
	o := p.observe(id, s)
	p.mu.Unlock()
	if err := p.record(id, pr); err != nil {
		// Running, but a restarted agent would not know it: say so.
		return o, fmt.Errorf("started %s (pid %d), but cannot record it in %s: %w", s.Command[0], pr.pid, p.StateDir, err)
	}
	return o, nil
}

// Delete stops the service of id, started by this agent or by an earlier
// run of it (its record).
func (p *Process) Delete(_ context.Context, id string, _ Spec) error {
	p.mu.Lock()
	pr := p.lookup(id)
	delete(p.procs, id)
	p.mu.Unlock()
	stop(pr)
	p.forget(id)
	return nil
}

// StopAll ends every supervised process but those that detach (the agent
// is stopping): the next run of the agent adopts those from their records.
func (p *Process) StopAll() {
	p.mu.Lock()
	procs := p.procs
	p.procs = map[string]*proc{}
	p.mu.Unlock()
	for id, pr := range procs {
		if pr.detach && !pr.exited() {
			continue
		}
		stop(pr)
		p.forget(id)
	}
}

// stop ends a process group: SIGTERM, then SIGKILL after 5s.
func stop(pr *proc) {
	if pr == nil {
		return
	}
	if pr.exited() {
		return
	}
	_ = syscall.Kill(-pr.pid, syscall.SIGTERM)
	grace, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if pr.cmd != nil {
		select {
		case <-pr.done:
		case <-grace.Done():
			_ = syscall.Kill(-pr.pid, syscall.SIGKILL)
			<-pr.done
		}
		return
	}
	// Adopted: not a child to wait for. A pidfd waits for its exit (it
	// polls readable when the process ends) and signals exactly that
	// process, never a reuse of its pid; its identity is checked once the
	// pidfd is open.
	fd, err := unix.PidfdOpen(pr.pid, 0)
	if err != nil {
		return // gone already
	}
	defer unix.Close(fd)
	if pr.exited() {
		return
	}
	if n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(adoptedStopGrace/time.Millisecond)); n == 0 {
		_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		_ = syscall.Kill(-pr.pid, syscall.SIGKILL) // the rest of its group
	}
}

// adoptedStopGrace is how long an adopted service has between SIGTERM
// and SIGKILL, as a child has.
const adoptedStopGrace = 5 * time.Second

// runStep runs a command to completion within timeout: Exited{exit_code}
// (an error when not 0), TimedOut{waited} (its own timeout passed), or cut
// off (ctx, the call's bound, ended first: a *cutOffError with the real
// wait). The process group is killed in both of the last cases.
func runStep(ctx context.Context, id, name string, command []string, env map[string]string, dir string, timeout time.Duration) error {
	done := runsOf(ctx).Started(id, name, command)
	b := newStepBound(ctx, timeout)
	defer b.stop()
	cmd := exec.CommandContext(b.ctx, command[0], command[1:]...)
	cmd.Env = environ(env)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	var out tail
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		if end := b.ended(); end != nil {
			done(-1, true, end.Error())
			return end
		}
	}
	switch {
	case err != nil && exitCode(err) < 0:
		done(-1, false, err.Error())
		return err
	case err != nil:
		code := exitCode(err)
		done(code, false, out.String())
		return fmt.Errorf("exited %d%s", code, suffix(out.String()))
	}
	done(0, false, out.String())
	return nil
}

// errStepTimeout ends a step's context when the step's own timeout passes.
var errStepTimeout = errors.New("the step's own timeout passed")

// stepBound bounds one init step (or shell job) twice, by its own timeout
// and by the call's ctx (which the agent ends after agent.call_timeout),
// and tells afterwards which of the two ended it.
type stepBound struct {
	ctx     context.Context // ends with the first of the two
	call    context.Context
	own     context.Context // ends at the step's own timeout only
	timeout time.Duration
	stop    func()
}

func newStepBound(call context.Context, timeout time.Duration) *stepBound {
	// own is apart from call so that its deadline dates the step's start:
	// the real wait is then a difference of deadlines (actors/ reads no
	// clock of its own).
	own, cancelOwn := context.WithTimeout(context.WithoutCancel(call), timeout)
	ctx, cancel := context.WithCancelCause(call)
	stopAfter := context.AfterFunc(own, func() { cancel(errStepTimeout) })
	return &stepBound{ctx: ctx, call: call, own: own, timeout: timeout, stop: func() {
		stopAfter()
		cancelOwn()
		cancel(context.Canceled)
	}}
}

// ended is nil while neither bound has passed; afterwards the step's
// outcome: "timed out: waited D" (its own timeout) or a *cutOffError (the
// call's ctx ended first).
func (b *stepBound) ended() error {
	cause := context.Cause(b.ctx)
	switch {
	case cause == nil:
		return nil
	case errors.Is(cause, errStepTimeout):
		return fmt.Errorf("timed out: waited %v", b.timeout)
	}
	e := &cutOffError{err: b.call.Err(), cause: context.Cause(b.call)}
	callEnd, hasDeadline := b.call.Deadline()
	ownEnd, _ := b.own.Deadline()
	if hasDeadline && errors.Is(e.err, context.DeadlineExceeded) {
		e.waited = roundWait(min(max(b.timeout-ownEnd.Sub(callEnd), 0), b.timeout))
		e.measured = true
	}
	return e
}

// cutOffError is a step the call's context ended before the step finished
// or reached its own timeout: the reconcile's deadline passed (the wait is
// known), or the reconcile was cancelled (the agent is stopping). errors.Is
// finds context.DeadlineExceeded or context.Canceled in it.
type cutOffError struct {
	waited   time.Duration
	measured bool
	err      error // the call's ctx.Err()
	cause    error // context.Cause of the call's ctx
}

func (e *cutOffError) Error() string {
	var msg string
	if e.measured {
		msg = fmt.Sprintf("cut off after waiting %v: the reconcile's deadline passed", e.waited)
	} else if errors.Is(e.err, context.DeadlineExceeded) {
		msg = "cut off: the reconcile's deadline passed"
	} else {
		msg = "cut off: the reconcile was cancelled"
	}
	if e.cause != nil && e.cause != e.err {
		msg += " (" + e.cause.Error() + ")"
	}
	return msg
}

func (e *cutOffError) Unwrap() []error { return []error{e.err, e.cause} }

// roundWait keeps a wait readable: milliseconds under a second, tenths of
// a second above.
func roundWait(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}

func suffix(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return ""
	}
	return ": " + s
}

// exitCode is a finished command's exit code (-1: it did not exit, as
// when it could not start).
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	return -1
}

func environ(env map[string]string) []string {
	out := os.Environ()
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		out = append(out, k+"="+env[k])
	}
	return out
}

// tail keeps the last 2 KiB of a command's output.
type tail struct{ b []byte }

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 2048 {
		t.b = t.b[len(t.b)-2048:]
	}
	return len(p), nil
}

func (t *tail) String() string { return strings.TrimSpace(string(t.b)) }

// ShellJob runs a shell command to completion once per spec, when the node
// allows shell jobs (allow_shell_jobs: true); otherwise every reconcile is
// refused (ErrRefused). Every run is recorded (Runs) with the command and
// its exit code. What ran is remembered by the agent process: a restarted
// agent runs each job again.
type ShellJob struct {
	Allowed bool
	mu      sync.Mutex
	done    map[string]string // id → the spec that ran successfully
}

type shellSpec struct {
	Command string
	Timeout time.Duration
}

func (*ShellJob) Kind() string { return "shell-job" }

func (j *ShellJob) Validate(spec Spec) error { _, err := j.spec(spec); return err }

// MinCallTime is the call time a reconcile of spec must be given so that
// the job can use its whole timeout (0 for an invalid spec).
func (j *ShellJob) MinCallTime(spec Spec) time.Duration {
	s, err := j.spec(spec)
	if err != nil {
		return 0
	}
	return s.Timeout
}

func (*ShellJob) spec(spec Spec) (shellSpec, error) {
	r := NewSpecReader("shell-job", spec)
	s := shellSpec{Command: r.Str("command", true), Timeout: r.Duration("timeout", DefaultInitTimeout)}
	return s, r.Done()
}

func (j *ShellJob) Observe(_ context.Context, id string, spec Spec) (Observation, error) {
	s, err := j.spec(spec)
	if err != nil {
		return Observation{}, err
	}
	if !j.Allowed {
		return Observation{}, fmt.Errorf("shell jobs are not allowed on this node (allow_shell_jobs: false): %w", ErrRefused)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.done[id] == fmt.Sprint(s) {
		return Observation{InSync: true, Details: map[string]string{"exit_code": "0"}}, nil
	}
	return Observation{Drift: "not run"}, nil
}

func (j *ShellJob) Reconcile(ctx context.Context, id string, spec Spec) (Observation, error) {
	o, err := j.Observe(ctx, id, spec)
	if err != nil || o.InSync {
		return o, err
	}
	s, _ := j.spec(spec)
	if err := runStep(ctx, id, "job", []string{"/bin/sh", "-c", s.Command}, nil, "", s.Timeout); err != nil {
		return Observation{Drift: "failed"}, err
	}
	j.mu.Lock()
	if j.done == nil {
		j.done = map[string]string{}
	}
	j.done[id] = fmt.Sprint(s)
	j.mu.Unlock()
	return Observation{InSync: true, Details: map[string]string{"exit_code": "0"}}, nil
}

func (j *ShellJob) Delete(_ context.Context, id string, _ Spec) error {
	j.mu.Lock()
	delete(j.done, id)
	j.mu.Unlock()
	return nil
}
