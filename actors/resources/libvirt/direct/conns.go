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
// call uses it. Conns is a libvirt.Connector.
type Conns struct {
	logger *slog.Logger
	mu     sync.Mutex
	open   map[string]*pooled
	closed bool
}

type pooled struct {
	conn  *lv.Connect
	users int
	dead  bool // replaced or closed: close once users drops to 0
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

// Close closes every connection (those in use once their call returns);
// later calls fail with libvirt.ErrClosed. Close is idempotent.
func (c *Conns) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for uri, p := range c.open {
		delete(c.open, uri)
		p.dead = true
		if p.users == 0 {
			closeConn(p.conn)
		}
	}
	return nil
}

// acquire returns a live connection to uri, opening one if needed; fresh
// says it was just opened. Pair with release.
func (c *Conns) acquire(uri string) (p *pooled, fresh bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, false, libvirt.ErrClosed
	}
	if p := c.open[uri]; p != nil {
		if alive, err := p.conn.IsAlive(); err == nil && alive {
			p.users++
			return p, false, nil
		}
		c.log().Warn("libvirt: connection is dead; reconnecting", "uri", uri)
		c.retire(uri, p)
	}
	conn, err := openConn(uri)
	if err != nil {
		return nil, false, err
	}
	p = &pooled{conn: conn, users: 1}
	c.open[uri] = p
	return p, true, nil
}

// release ends a use of p; broken retires it (the next acquire reopens).
func (c *Conns) release(uri string, p *pooled, broken bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p.users--
	if broken && c.open[uri] == p {
		c.retire(uri, p)
	}
	if p.dead && p.users == 0 {
		closeConn(p.conn)
	}
}

func (c *Conns) retire(uri string, p *pooled) {
	delete(c.open, uri)
	if !p.dead && p.users == 0 {
		closeConn(p.conn)
	}
	p.dead = true
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
