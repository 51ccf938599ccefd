package pgsuite

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Probes connect to one site's PostgreSQL over its private socket as the
// superuser. Their own commits do not wait for a synchronous standby
// (synchronous_commit=local): "accepts writes" means a commit is made
// durable where the probe is, which is what two primaries would both do.
const (
	probeConnect = 300 * time.Millisecond
	probeQuery   = 500 * time.Millisecond
)

// connectSite opens a connection to site i only.
func (c *cluster) connectSite(ctx context.Context, i int, timeout time.Duration, local bool) (*pgx.Conn, error) {
	s := c.sites[i]
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", s.sock, s.port))
	if err != nil {
		return nil, err
	}
	cfg.ConnectTimeout = timeout
	cfg.RuntimeParams["application_name"] = "pgsuite-probe"
	if local {
		cfg.RuntimeParams["synchronous_commit"] = "local"
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return pgx.ConnectConfig(cctx, cfg)
}

// siteState is what a poll saw of one site.
type siteState int

const (
	stDown      siteState = iota + 1 // no connection, or no answer in time
	stStandby                        // in recovery, its WAL receiver not streaming
	stStreaming                      // in recovery, streaming
	stReadOnly                       // out of recovery, but a write failed
	stWritable                       // out of recovery, a write committed
)

func (s siteState) String() string {
	switch s {
	case stDown:
		return "down"
	case stStandby:
		return "standby"
	case stStreaming:
		return "streaming"
	case stReadOnly:
		return "primary-read-only"
	case stWritable:
		return "writable"
	}
	return "unset"
}

// probe reads site state over conn: role, WAL receiver, and for a primary
// a tiny committed INSERT.
func probe(ctx context.Context, conn *pgx.Conn, site string) (siteState, error) {
	qctx, cancel := context.WithTimeout(ctx, probeQuery)
	defer cancel()
	var rec bool
	var status string
	if err := conn.QueryRow(qctx, "SELECT pg_is_in_recovery(), coalesce((SELECT status FROM pg_stat_wal_receiver), '')").Scan(&rec, &status); err != nil {
		return stDown, err
	}
	if rec {
		if status == "streaming" {
			return stStreaming, nil
		}
		return stStandby, nil
	}
	_, err := conn.Exec(qctx, "INSERT INTO pgsuite_probe (site) VALUES ($1)", site)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" { // no such table yet
		if _, err = conn.Exec(qctx, "CREATE TABLE IF NOT EXISTS pgsuite_probe (site text NOT NULL, at timestamptz NOT NULL DEFAULT now())"); err == nil {
			_, err = conn.Exec(qctx, "INSERT INTO pgsuite_probe (site) VALUES ($1)", site)
		}
	}
	if err != nil {
		if conn.IsClosed() || qctx.Err() != nil {
			return stDown, err
		}
		return stReadOnly, err
	}
	return stWritable, nil
}

// state probes site i once over a fresh connection.
func (c *cluster) state(i int) (siteState, error) {
	ctx := context.Background()
	conn, err := c.connectSite(ctx, i, time.Second, true)
	if err != nil {
		return stDown, err
	}
	defer conn.Close(context.Background())
	return probe(ctx, conn, c.sites[i].name)
}

func (c *cluster) writable(i int) (bool, error) {
	st, err := c.state(i)
	return st == stWritable, err
}

func (c *cluster) streaming(i int) (bool, error) {
	st, err := c.state(i)
	return st == stStreaming, err
}

// syncState is the leader's pg_stat_replication sync_state for the other
// site ("" when it is not connected).
func (c *cluster) syncState(leader int) (string, error) {
	ctx := context.Background()
	conn, err := c.connectSite(ctx, leader, time.Second, true)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background())
	qctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var st string
	err = conn.QueryRow(qctx, "SELECT coalesce((SELECT sync_state FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming' LIMIT 1), '')", c.sites[1-leader].name).Scan(&st)
	return st, err
}

// exec runs one statement on site i.
func (c *cluster) exec(i int, sql string, args ...any) error {
	ctx := context.Background()
	conn, err := c.connectSite(ctx, i, 2*time.Second, false)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = conn.Exec(qctx, sql, args...)
	return err
}

// counters reads the writer's table on site i.
func (c *cluster) counters(i int) (map[int64]bool, error) {
	ctx := context.Background()
	conn, err := c.connectSite(ctx, i, 2*time.Second, false)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rows, err := conn.Query(qctx, "SELECT n FROM pgsuite_counter")
	if err != nil {
		return nil, err
	}
	have := map[int64]bool{}
	for rows.Next() {
		var n int64
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		have[n] = true
	}
	return have, rows.Err()
}

// stateChange: from at on, a site was seen in st.
type stateChange struct {
	at time.Time
	st siteState
}

// monitor polls both sites about every 20 ms over a connection of its own
// to each, and keeps each site's state changes and every poll that found
// both writable.
type monitor struct {
	c      *cluster
	every  time.Duration
	mu     sync.Mutex
	polls  int
	last   [2]siteState
	lastAt time.Time
	change [2][]stateChange
	both   []time.Time // polls that found both sites writable
	stop   chan struct{}
	done   chan struct{}
}

func (c *cluster) startMonitor() *monitor {
	m := &monitor{c: c, every: 20 * time.Millisecond, stop: make(chan struct{}), done: make(chan struct{})}
	go m.run()
	c.onClose(m.close)
	return m
}

func (m *monitor) close() {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	<-m.done
}

func (m *monitor) run() {
	defer close(m.done)
	ctx := context.Background()
	var conns [2]*pgx.Conn
	defer func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close(context.Background())
			}
		}
	}()
	tick := time.NewTicker(m.every)
	defer tick.Stop()
	for {
		var sts [2]siteState
		for i := range conns {
			if conns[i] == nil {
				c, err := m.c.connectSite(ctx, i, probeConnect, true)
				if err != nil {
					sts[i] = stDown
					continue
				}
				conns[i] = c
			}
			st, err := probe(ctx, conns[i], m.c.sites[i].name)
			if err != nil && st == stDown {
				_ = conns[i].Close(context.Background())
				conns[i] = nil
			}
			sts[i] = st
		}
		now := time.Now()
		m.mu.Lock()
		m.polls++
		m.lastAt = now
		for i, st := range sts {
			if st != m.last[i] {
				m.change[i] = append(m.change[i], stateChange{at: now, st: st})
				m.last[i] = st
			}
		}
		if sts[0] == stWritable && sts[1] == stWritable {
			m.both = append(m.both, now)
		}
		m.mu.Unlock()
		select {
		case <-m.stop:
			return
		case <-tick.C:
		}
	}
}

// waitFor waits until site i's latest poll says st (polled after since).
func (m *monitor) waitFor(i int, st siteState, since time.Time, within time.Duration) (time.Time, bool) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if at, ok := m.firstSince(i, st, since); ok {
			return at, true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Time{}, false
}

// firstSince is when site i was first seen in st at or after since.
func (m *monitor) firstSince(i int, st siteState, since time.Time) (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ch := m.change[i]
	for k, c := range ch {
		if c.st != st {
			continue
		}
		if !c.at.Before(since) {
			return c.at, true
		}
		// In st since before `since`, and still (or until later).
		if k == len(ch)-1 || !ch[k+1].at.Before(since) {
			if m.lastAt.After(since) || m.lastAt.Equal(since) {
				return since, true
			}
		}
	}
	return time.Time{}, false
}

// seen reports whether site i was in st at some poll in [from, to).
func (m *monitor) seen(i int, st siteState, from, to time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	ch := m.change[i]
	for k, c := range ch {
		if c.st != st {
			continue
		}
		end := m.lastAt.Add(time.Nanosecond)
		if k+1 < len(ch) {
			end = ch[k+1].at
		}
		if c.at.Before(to) && end.After(from) {
			return true
		}
	}
	return false
}

// bothWritable is every poll that found both sites writable.
func (m *monitor) bothWritable() []time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.both)
}

// pollCount is how many polls ran.
func (m *monitor) pollCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.polls
}

// timeline describes site i's state changes (for failure messages).
func (m *monitor) timeline(i int, since time.Time) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := ""
	for _, c := range m.change[i] {
		if c.at.Before(since) {
			continue
		}
		s += fmt.Sprintf(" +%.0fms:%s", ms(c.at.Sub(since)), c.st)
	}
	return s
}

// ack is one commit the writer saw acknowledged.
type ack struct {
	n    int64
	at   time.Time
	site int
}

// writer commits an increasing counter through the read-write multi-host
// connection string (both sites' sockets, target_session_attrs=read-write)
// and keeps every acknowledged value.
type writer struct {
	c        *cluster
	conninfo string
	mu       sync.Mutex
	acks     []ack
	failures int
	lastErr  error
	stop     chan struct{}
	done     chan struct{}
}

// startWriter creates the counter table on site leader, waits until the
// other site replayed it, and starts the writer.
func (c *cluster) startWriter(leader int) *writer {
	c.t.Helper()
	if err := c.exec(leader, "CREATE TABLE IF NOT EXISTS pgsuite_counter (n bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())"); err != nil {
		c.t.Fatalf("create the counter table on %s: %v", c.sites[leader].name, err)
	}
	// The standby has the table before any commit counts: a kill before it
	// replayed the CREATE would leave the promoted site without the table,
	// and no commit of the writer could ever land there.
	if err := c.waitCaughtUp(1-leader, 30*time.Second); err != nil {
		c.t.Fatalf("the counter table did not reach the standby: %v", err)
	}
	a, b := c.sites[0], c.sites[1]
	w := &writer{c: c, stop: make(chan struct{}), done: make(chan struct{}),
		conninfo: fmt.Sprintf("host=%s,%s port=%d,%d user=postgres dbname=postgres target_session_attrs=read-write connect_timeout=1 application_name=pgsuite-writer",
			a.sock, b.sock, a.port, b.port)}
	go w.run()
	c.onClose(w.close)
	return w
}

func (w *writer) close() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

func (w *writer) run() {
	defer close(w.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-w.stop
		cancel()
	}()
	var conn *pgx.Conn
	site := -1
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	next := int64(1)
	for ctx.Err() == nil {
		if conn == nil {
			cctx, cc := context.WithTimeout(ctx, 3*time.Second)
			c, err := pgx.Connect(cctx, w.conninfo)
			cc()
			if err != nil {
				w.mu.Lock()
				w.lastErr = err
				w.mu.Unlock()
				sleep(ctx, 20*time.Millisecond)
				continue
			}
			var port int
			if err := c.QueryRow(ctx, "SELECT current_setting('port')::int").Scan(&port); err != nil {
				_ = c.Close(context.Background())
				continue
			}
			conn, site = c, -1
			for i, s := range w.c.sites {
				if s.port == port {
					site = i
				}
			}
		}
		n := next
		next++
		qctx, cc := context.WithTimeout(ctx, 5*time.Second)
		_, err := conn.Exec(qctx, "INSERT INTO pgsuite_counter (n) VALUES ($1)", n)
		cc()
		if err != nil {
			w.mu.Lock()
			w.failures++
			w.lastErr = err
			w.mu.Unlock()
			_ = conn.Close(context.Background())
			conn = nil
			continue
		}
		w.mu.Lock()
		w.acks = append(w.acks, ack{n: n, at: time.Now(), site: site})
		w.mu.Unlock()
		sleep(ctx, 10*time.Millisecond)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// String describes the writer's progress, for failure messages.
func (w *writer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	last := "none"
	if n := len(w.acks); n > 0 {
		a := w.acks[n-1]
		last = fmt.Sprintf("%d by site %d at %s", a.n, a.site, a.at.Format("15:04:05.000"))
	}
	return fmt.Sprintf("writer: %d acknowledged (last %s), %d failed, last error: %v", len(w.acks), last, w.failures, w.lastErr)
}

// firstAckBy is the first commit site i acknowledged after t.
func (w *writer) firstAckBy(i int, t time.Time) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range w.acks {
		if a.site == i && a.at.After(t) {
			return a.at, true
		}
	}
	return time.Time{}, false
}

// waitAckBy waits for the first commit site i acknowledges after t.
func (w *writer) waitAckBy(i int, t time.Time, within time.Duration) (time.Time, bool) {
	deadline := time.Now().Add(within)
	for {
		if at, ok := w.firstAckBy(i, t); ok {
			return at, true
		}
		if time.Now().After(deadline) {
			return time.Time{}, false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lost returns the acknowledged values that keep(ack) selects and site
// i's table lacks.
func (w *writer) lost(i int, keep func(ack) bool) ([]int64, int, error) {
	// The acknowledgements first, then the table: a commit acknowledged
	// after the table was read is not missing from it.
	w.mu.Lock()
	acks := slices.Clone(w.acks)
	w.mu.Unlock()
	have, err := w.c.counters(i)
	if err != nil {
		return nil, 0, err
	}
	var lost []int64
	checked := 0
	for _, a := range acks {
		if keep != nil && !keep(a) {
			continue
		}
		checked++
		if !have[a.n] {
			lost = append(lost, a.n)
		}
	}
	return lost, checked, nil
}

// sample is the first few values of lost, for messages.
func sample(lost []int64) string {
	s := ""
	for k, n := range lost {
		if k == 10 {
			s += " ..."
			break
		}
		s += " " + strconv.FormatInt(n, 10)
	}
	return s
}
