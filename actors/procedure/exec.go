package procedure

import (
	"context"
	"errors"
	"maps"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"
)

// ExecDriver runs a step's command in its own process group. When the
// step's context ends, the whole group is killed (SIGKILL), so a shell and
// everything it started die together. The last 2 KiB of combined stdout
// and stderr go into the outcome's detail.
type ExecDriver struct {
	// WaitDelay bounds how long Run waits for the output pipes after the
	// command exited or its group was killed: a child that left the group
	// may still hold them. Zero means 1s.
	WaitDelay time.Duration
	// Starts, when set, bounds how many commands start at once (see
	// StartLimit); nil: every Run starts its command at once.
	Starts *StartLimit
}

// StartLimit bounds how many processes a node starts at the same moment.
// Starting a process (fork and exec) is CPU work of the node itself, and
// a node taking over thousands of pairs starts one promote command for
// each: unbounded, thousands of starts at once left the node's own
// machinery (its members, its liveness writer) without CPU — on a 2-core
// machine a 10,000-pair takeover's registers took twice as long with a
// `true` per promotion as with none (docs/benchmarks.md, "Procedures on
// the survivor"). Only the start is bounded: a command that runs for long
// holds no slot. Starts waited in turn before too, on the process's own
// fork lock; the wait for a slot is part of the step's timeout, and a
// step whose deadline passes while it waits is not started (cmd.Start
// checks its context) and times out.
type StartLimit struct{ slots chan struct{} }

// NewStartLimit returns a limit of n starts at once (n < 1: one).
func NewStartLimit(n int) *StartLimit { return &StartLimit{slots: make(chan struct{}, max(n, 1))} }

// DefaultStarts is the bound of DefaultDrivers: two starts per CPU the
// process may use. On a 2-core machine it started `true` faster than
// thousands at once did, and a 10 ms timer of the same process ran at
// most 11.7 ms late against 47.5 ms (BenchmarkExecStarts).
func DefaultStarts() int { return 2 * runtime.GOMAXPROCS(0) }

// do runs start holding a slot.
func (l *StartLimit) do(start func() error) error {
	if l == nil {
		return start()
	}
	l.slots <- struct{}{}
	defer func() { <-l.slots }()
	return start()
}

const execTail = 2048 // bytes of output kept

// Run implements Driver.
func (d ExecDriver) Run(ctx context.Context, step StepSpec) Outcome {
	spec := step.Exec
	if spec == nil {
		return Outcome{Result: ResultFailed, ExitCode: -1, Detail: "step has no exec fields"}
	}
	if err := ctx.Err(); err != nil {
		return Outcome{Result: ResultTimedOut, ExitCode: -1, Detail: "not started: " + err.Error()}
	}
	cmd := exec.CommandContext(ctx, spec.Command, spec.Args...)
	cmd.Dir = spec.Dir
	if len(spec.Env) > 0 {
		cmd.Env = os.Environ()
		for _, k := range slices.Sorted(maps.Keys(spec.Env)) {
			cmd.Env = append(cmd.Env, k+"="+spec.Env[k])
		}
	}
	var out tailBuffer
	cmd.Stdout, cmd.Stderr = &out, &out // one writer: exec serialises the writes
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		// Setpgid made the command's pid its process group id.
		if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
			if errors.Is(err, syscall.ESRCH) {
				return os.ErrProcessDone
			}
			return err
		}
		return nil
	}
	cmd.WaitDelay = d.WaitDelay
	if cmd.WaitDelay <= 0 {
		cmd.WaitDelay = time.Second
	}

	if err := d.Starts.do(cmd.Start); err != nil {
		if ctx.Err() != nil {
			return Outcome{Result: ResultTimedOut, ExitCode: -1, Detail: "not started: " + ctx.Err().Error()}
		}
		return Outcome{Result: ResultFailed, ExitCode: -1, Detail: "cannot start: " + err.Error()}
	}
	err := cmd.Wait()
	ps := cmd.ProcessState
	switch {
	case ps != nil && ps.Success():
		// Exited 0 before any kill; a pipe still held by a daemonised child
		// (ErrWaitDelay) does not make the step fail.
		note := ""
		if errors.Is(err, exec.ErrWaitDelay) {
			note = "exit 0 (a child kept the output open; stopped reading)"
		}
		return Outcome{Result: ResultOK, ExitCode: 0, Detail: join(note, out.String())}
	case ctx.Err() != nil:
		return Outcome{Result: ResultTimedOut, ExitCode: -1, Detail: join(ctx.Err().Error()+"; process group killed", out.String())}
	case ps != nil:
		return Outcome{Result: ResultFailed, ExitCode: ps.ExitCode(), Detail: join(ps.String(), out.String())}
	}
	return Outcome{Result: ResultFailed, ExitCode: -1, Detail: join(err.Error(), out.String())}
}

func join(status, output string) string {
	switch {
	case output == "":
		return status
	case status == "":
		return output
	}
	return status + ": " + output
}

// tailBuffer keeps the last execTail bytes written to it.
type tailBuffer struct {
	buf       []byte
	truncated bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > 2*execTail { // compact now and then, not on every write
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-execTail:]...)
		t.truncated = true
	}
	return len(p), nil
}

// String is the kept output, starting on a rune boundary, "…" marking a cut.
func (t *tailBuffer) String() string {
	b := t.buf
	cut := t.truncated
	if len(b) > execTail {
		b, cut = b[len(b)-execTail:], true
	}
	if cut {
		for len(b) > 0 && !utf8.RuneStart(b[0]) {
			b = b[1:]
		}
		return "…" + strings.ToValidUTF8(string(b), "\uFFFD")
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}
