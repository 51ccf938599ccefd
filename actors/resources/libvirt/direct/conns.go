package direct

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	lv "libvirt.org/go/libvirt"

	"understudy/actors/resources/libvirt"
	"understudy/actors/resources/libvirt/rules"
)

// Conns keeps one libvirt connection per URI, opened on first use and
// reopened when it is found dead (virConnectIsAlive, or a call failing
// because the connection went away). Safe for concurrent use: libvirt
// connections are thread-safe, and a connection is closed only once no
// call uses it. No libvirt call runs under the pool's lock — opening a
// connection to a remote host that hangs holds up only the calls to that
// URI, which wait for that opening. Conns is a libvirt.Connector.
type Conns struct {
	logger *slog.Logger
	mu     sync.Mutex
	open   map[string]*pooled
	closed bool
}

type pooled struct {
	conn  *lv.Connect // nil while opening
	users int
	dead  bool // replaced or closed: close once users drops to 0
	// opening is closed once the connection is open or failed to (err);
	// nil for a connection that is open.
	opening chan struct{}
	err     error
}

// NewConns returns an empty pool; logger nil means slog.Default().
func NewConns(logger *slog.Logger) *Conns {
	return &Conns{logger: logger, open: map[string]*pooled{}}
}

func (c *Conns) log() *slog.Logger {
	if c.logger == nil {
		return slog.Default()
	}
	return c.logger
}

// Close closes every connection (those in use once their call returns,
// one being opened once it is); later calls fail with libvirt.ErrClosed.
// Close is idempotent.
func (c *Conns) Close() error {
	c.mu.Lock()
	c.closed = true
	var idle []*lv.Connect
	for uri, p := range c.open {
		delete(c.open, uri)
		p.dead = true
		if p.users == 0 && p.conn != nil {
			idle = append(idle, p.conn)
		}
	}
	c.mu.Unlock()
	for _, conn := range idle {
		closeConn(conn)
	}
	return nil
}

// acquire returns a live connection to uri, opening one if needed; fresh
// says it was just opened. Pair with release. The connection is opened,
// and checked alive, outside the pool's lock; calls to the same URI wait
// for one opening rather than open their own.
func (c *Conns) acquire(uri string) (p *pooled, fresh bool, err error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, false, libvirt.ErrClosed
		}
		p := c.open[uri]
		if p != nil && p.opening != nil {
			wait := p.opening
			c.mu.Unlock()
			<-wait
			if p.err != nil {
				return nil, false, p.err
			}
			continue // opened: take it (or, closed meanwhile, fail)
		}
		if p != nil {
			p.users++
			c.mu.Unlock()
			if alive, err := p.conn.IsAlive(); err == nil && alive {
				return p, false, nil
			}
			c.log().Warn("libvirt: connection is dead; reconnecting", "uri", uri)
			c.release(uri, p, true)
			continue
		}
		p = &pooled{opening: make(chan struct{}), users: 1}
		c.open[uri] = p
		c.mu.Unlock()

		conn, err := openConn(uri)
		c.mu.Lock()
		p.conn, p.err = conn, err
		close(p.opening)
		p.opening = nil
		if err != nil {
			if c.open[uri] == p {
				delete(c.open, uri)
			}
			c.mu.Unlock()
			return nil, false, err
		}
		if p.dead { // closed while opening
			c.mu.Unlock()
			closeConn(conn)
			return nil, false, libvirt.ErrClosed
		}
		c.mu.Unlock()
		return p, true, nil
	}
}

// release ends a use of p; broken retires it (the next acquire reopens).
func (c *Conns) release(uri string, p *pooled, broken bool) {
	c.mu.Lock()
	p.users--
	if broken && c.open[uri] == p {
		delete(c.open, uri)
		p.dead = true
	}
	last := p.dead && p.users == 0
	c.mu.Unlock()
	if last {
		closeConn(p.conn)
	}
}

var eventLoop sync.Once

// openConn opens a connection. The first call registers libvirt's default
// event loop and runs it on a goroutine for the life of the process: remote
// connections need it for keepalive, which is how a dead peer is noticed.
func openConn(uri string) (*lv.Connect, error) {
	if rule := rules.URI(uri); rule != "" {
		return nil, fmt.Errorf("libvirt: uri %s: %s", uri, rule)
	}
	eventLoop.Do(func() {
		if err := lv.EventRegisterDefaultImpl(); err != nil {
			slog.Default().Warn("libvirt: no event loop; remote connections get no keepalive", "err", plain(err))
			return
		}
		go func() {
			for {
				if err := lv.EventRunDefaultImpl(); err != nil {
					slog.Default().Error("libvirt: event loop stopped; remote connections get no keepalive", "err", plain(err))
					return
				}
			}
		}()
	})
	conn, err := lv.NewConnect(uri)
	if err != nil {
		err = plain(err)
		if !rules.Remote(uri) && strings.Contains(err.Error(), "Failed to connect socket") {
			return nil, fmt.Errorf("libvirt: connect %s: %w (is libvirtd or virtqemud running on this node?)", uri, err)
		}
		return nil, fmt.Errorf("libvirt: connect %s: %w", uri, err)
	}
	if rules.Remote(uri) {
		// A probe every 5 s, dead after 3 unanswered: ~20 s to notice a
		// peer that vanished (the default count is 5).
		_ = conn.SetKeepAlive(5, 3)
	}
	return conn, nil
}

func closeConn(conn *lv.Connect) { _, _ = conn.Close() }

// call runs op on a live connection to uri from a goroutine, and returns
// when op does or when ctx ends (op then finishes on its own: libvirt calls
// cannot be interrupted, so a hung one holds its goroutine until libvirt's
// keepalive gives up). A call that fails because the connection died is
// retried once on a new connection: every op is idempotent.
func call[T any](ctx context.Context, c *Conns, uri string, op func(*lv.Connect) (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, fmt.Errorf("libvirt %s: not started: %w", uri, err)
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1) // the goroutine never blocks on a caller that left
	go func() {
		for attempt := 0; ; attempt++ {
			p, fresh, err := c.acquire(uri)
			if err != nil {
				done <- result{err: err}
				return
			}
			v, err := op(p.conn)
			broken := err != nil && connectionLost(p.conn, err)
			c.release(uri, p, broken)
			if broken && !fresh && attempt == 0 && ctx.Err() == nil {
				c.log().Warn("libvirt: connection lost; retrying on a new one", "uri", uri, "err", plain(err))
				continue
			}
			done <- result{v, err}
			return
		}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		return zero, fmt.Errorf("libvirt %s: %w (the call goes on in the background)", uri, ctx.Err())
	}
}

// once opens a connection for a single op and closes it after, all on one
// goroutine; it returns when op does or ctx ends (the goroutine then
// finishes and closes on its own). Fresh hypervisors (fence steps) use it:
// a fence must not depend on a connection that sat idle for days.
func once[T any](ctx context.Context, c *Conns, uri string, op func(*lv.Connect) (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, fmt.Errorf("libvirt %s: not started: %w", uri, err)
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return zero, libvirt.ErrClosed
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		conn, err := openConn(uri)
		if err != nil {
			done <- result{err: err}
			return
		}
		defer closeConn(conn)
		v, err := op(conn)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		return zero, fmt.Errorf("libvirt %s: %w (the call goes on in the background)", uri, ctx.Err())
	}
}

// connectionLost reports whether err means the connection is gone.
func connectionLost(conn *lv.Connect, err error) bool {
	var le lv.Error
	if errors.As(err, &le) && (le.Code == lv.ERR_NO_CONNECT || le.Code == lv.ERR_INVALID_CONN || le.Code == lv.ERR_RPC) {
		return true
	}
	alive, aerr := conn.IsAlive()
	return aerr != nil || !alive
}

// libvirtError shows a libvirt error by its message alone (the module's
// Error() prints codes); errors.As still finds the libvirt.Error.
type libvirtError struct{ e lv.Error }

func (e libvirtError) Error() string {
	msg := e.e.Message
	if msg == "" {
		msg = fmt.Sprintf("libvirt error %d", e.e.Code)
	}
	return msg
}

func (e libvirtError) Unwrap() error { return e.e }

// plain turns a libvirt.Error into one whose text is its message; a
// missing libvirt.so.0 becomes libvirt.ErrLibraryMissing.
func plain(err error) error {
	var le lv.Error
	if !errors.As(err, &le) {
		return err
	}
	if le.Domain == lv.FROM_NONE && strings.Contains(le.Message, "libvirt.so.0") {
		return fmt.Errorf("%w (%s)", libvirt.ErrLibraryMissing, le.Message)
	}
	return libvirtError{le}
}

// hasCode reports whether err is a libvirt error with one of codes.
func hasCode(err error, codes ...lv.ErrorNumber) bool {
	var le lv.Error
	if !errors.As(err, &le) {
		return false
	}
	for _, c := range codes {
		if le.Code == c {
			return true
		}
	}
	return false
}

// LibraryVersion is the version of the libvirt.so.0 this process loaded
// (major.minor.micro); libvirt.ErrLibraryMissing when it cannot load one.
func LibraryVersion() (string, error) {
	v, err := lv.GetVersion()
	if err != nil {
		return "", plain(err)
	}
	return fmt.Sprintf("%d.%d.%d", v/1000000, v/1000%1000, v%1000), nil
}
