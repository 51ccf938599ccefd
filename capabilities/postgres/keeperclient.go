package postgres

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// keeperClient is the node's side of the keeper (see keeper.go). Calls are
// safe for concurrent use; pet never blocks.
type keeperClient struct {
	log  *slog.Logger
	cmd  *exec.Cmd
	done chan struct{} // closed when the keeper's stdout ends (it exited)

	writeMu sync.Mutex
	enc     *json.Encoder
	stdin   io.WriteCloser

	pets chan struct{} // size one: a pet pending is enough

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]pendingCall
	pid     int           // the postmaster as the keeper last said, 0 if none
	exited  chan struct{} // closed when postmaster pid exits
	exitMsg string
	// expired is the last grace expiry the keeper reported, for Check.
	expired string
}

func startKeeper(command []string, grace time.Duration, watchdog string, log *slog.Logger) (*keeperClient, error) {
	args := append(append([]string(nil), command[1:]...), "-grace", grace.String())
	if watchdog != "" {
		args = append(args, "-watchdog", watchdog)
	}
	cmd := exec.Command(command[0], args...)
	cmd.Env = append(os.Environ(), keeperEnv+"=1")
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid: true, // a terminal's ^C is for the node, which stops PostgreSQL in order
		// A backup for the pipe: the keeper treats SIGTERM as the node's death.
		Pdeathsig: syscall.SIGTERM,
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	// Pdeathsig fires when the forking thread ends: fork from a locked one.
	runtime.LockOSThread()
	err = cmd.Start()
	runtime.UnlockOSThread()
	if err != nil {
		return nil, fmt.Errorf("start the PostgreSQL keeper (%s): %w", command[0], err)
	}
	k := &keeperClient{
		log:     log,
		cmd:     cmd,
		done:    make(chan struct{}),
		enc:     json.NewEncoder(stdin),
		stdin:   stdin,
		pets:    make(chan struct{}, 1),
		pending: map[uint64]pendingCall{},
	}
	ready := make(chan struct{})
	go k.read(stdout, ready)
	go k.petLoop()
	select {
	case <-ready:
		return k, nil
	case <-k.done:
		_ = cmd.Wait()
		return nil, fmt.Errorf("the PostgreSQL keeper (%v) exited at start: is KeeperCommand right?", command)
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-k.done
		_ = cmd.Wait()
		return nil, fmt.Errorf("the PostgreSQL keeper (%v) did not start within 10s", command)
	}
}

func (k *keeperClient) read(stdout io.Reader, ready chan struct{}) {
	defer func() {
		k.mu.Lock()
		for id, pc := range k.pending {
			close(pc.ch)
			delete(k.pending, id)
		}
		if k.exited != nil && k.pid != 0 {
			// The postmaster dies with the keeper (its parent-death signal).
			k.pid = 0
			k.exitMsg = "the keeper exited"
			close(k.exited)
		}
		k.mu.Unlock()
		close(k.done)
	}()
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var m keeperMessage
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			k.log.Warn("postgres keeper: unreadable message", "line", sc.Text())
			continue
		}
		if m.ID != 0 {
			k.mu.Lock()
			pc, ok := k.pending[m.ID]
			delete(k.pending, m.ID)
			if pc.op == "start" && m.Err == "" && m.PID != 0 {
				// Before reading on: the exit may be the next message.
				k.pid = m.PID
				k.exited = make(chan struct{})
				k.exitMsg = ""
				k.expired = ""
			}
			k.mu.Unlock()
			if ok {
				pc.ch <- m
			}
			continue
		}
		switch m.Event {
		case "ready":
			close(ready)
		case "log":
			k.log.Info("postgres keeper: " + m.Msg)
		case "exited":
			k.mu.Lock()
			if m.PID == k.pid && k.exited != nil {
				k.pid = 0
				k.exitMsg = m.Msg
				close(k.exited)
			}
			k.mu.Unlock()
			k.log.Info("postgres: postmaster exited", "pid", m.PID, "status", m.Msg)
		case "expired":
			k.mu.Lock()
			k.expired = m.Msg
			k.mu.Unlock()
			k.log.Error("postgres keeper: " + m.Msg)
		}
	}
}

func (k *keeperClient) petLoop() {
	for {
		select {
		case <-k.pets:
			k.writeMu.Lock()
			_ = k.enc.Encode(keeperRequest{Op: "pet"})
			k.writeMu.Unlock()
		case <-k.done:
			return
		}
	}
}

func (k *keeperClient) pet() {
	select {
	case k.pets <- struct{}{}:
	default:
	}
}

type pendingCall struct {
	ch chan keeperMessage
	op string
}

var errKeeperGone = errors.New("the PostgreSQL keeper exited")

// call sends r and waits for its reply.
func (k *keeperClient) call(ctx context.Context, r keeperRequest) (keeperMessage, error) {
	ch := make(chan keeperMessage, 1)
	k.mu.Lock()
	select {
	case <-k.done:
		k.mu.Unlock()
		return keeperMessage{}, errKeeperGone
	default:
	}
	k.nextID++
	r.ID = k.nextID
	k.pending[r.ID] = pendingCall{ch: ch, op: r.Op}
	k.mu.Unlock()
	k.writeMu.Lock()
	err := k.enc.Encode(r)
	k.writeMu.Unlock()
	if err != nil {
		k.mu.Lock()
		delete(k.pending, r.ID)
		k.mu.Unlock()
		return keeperMessage{}, fmt.Errorf("%w: %v", errKeeperGone, err)
	}
	select {
	case m, ok := <-ch:
		if !ok {
			return keeperMessage{}, errKeeperGone
		}
		if m.Err != "" {
			return m, errors.New(m.Err)
		}
		return m, nil
	case <-ctx.Done():
		// The reply still lands (the channel has room): a start that
		// succeeded regardless is recorded by read.
		return keeperMessage{}, ctx.Err()
	}
}

// running returns the postmaster's pid and a channel closed when it exits;
// pid 0 when none runs.
func (k *keeperClient) running() (int, <-chan struct{}) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.pid, k.exited
}

func (k *keeperClient) alive() bool {
	select {
	case <-k.done:
		return false
	default:
		return true
	}
}

func (k *keeperClient) start(ctx context.Context, r keeperRequest) (int, error) {
	r.Op = "start"
	k.mu.Lock()
	if k.pid != 0 {
		pid := k.pid
		k.mu.Unlock()
		return 0, fmt.Errorf("PostgreSQL is already running (postmaster %d)", pid)
	}
	k.mu.Unlock()
	m, err := k.call(ctx, r)
	if err != nil {
		return 0, err
	}
	return m.PID, nil
}

// stop stops the postmaster (mode immediate or fast) and returns once it
// exited, or when ctx ends (a fast stop is then made immediate by the
// caller if it wants).
func (k *keeperClient) stop(ctx context.Context, mode string) error {
	pid, exited := k.running()
	if pid == 0 {
		return nil
	}
	if _, err := k.call(ctx, keeperRequest{Op: "stop", Mode: mode}); err != nil {
		if errors.Is(err, errKeeperGone) {
			<-exited // closed by read's exit
			return nil
		}
		return err
	}
	select {
	case <-exited:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (k *keeperClient) close() error {
	k.writeMu.Lock()
	err := k.stdin.Close()
	k.writeMu.Unlock()
	select {
	case <-k.done:
	case <-time.After(5 * time.Second):
		_ = k.cmd.Process.Kill()
		<-k.done
	}
	werr := k.cmd.Wait()
	if err != nil {
		return err
	}
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		return fmt.Errorf("the PostgreSQL keeper: %w", werr)
	}
	return nil
}
