package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"understudy/actors/capability"
)

// connect opens a connection as Superuser over the private Unix socket.
// Its own writes do not wait for a synchronous standby
// (synchronous_commit=local): understudy's bookkeeping must not block on
// the peer it is deciding about.
func (p *Postgres) connect(ctx context.Context, timeout time.Duration) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig("")
	if err != nil {
		return nil, err
	}
	cfg.Host = p.run
	cfg.Port = uint16(p.cfg.Port)
	cfg.User = p.cfg.Superuser
	cfg.Database = "postgres"
	cfg.TLSConfig = nil
	cfg.Fallbacks = nil
	cfg.ConnectTimeout = timeout
	cfg.RuntimeParams = map[string]string{"application_name": "understudy", "synchronous_commit": "local"}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return pgx.ConnectConfig(cctx, cfg)
}

// withConn runs f on a fresh connection, each query bounded by timeout.
func (p *Postgres) withConn(ctx context.Context, timeout time.Duration, f func(c *pgx.Conn) error) error {
	c, err := p.connect(ctx, timeout)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	return f(c)
}

// quoteLiteral is a SQL string literal (standard_conforming_strings).
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// quoteIdent is a SQL identifier.
func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

func isCannotConnectNow(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "57P03"
}

// inRecovery asks the running server whether it is a standby, within
// timeout in all.
func (p *Postgres) inRecovery(ctx context.Context, timeout time.Duration) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rec bool
	err := p.withConn(ctx, timeout, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&rec)
	})
	return rec, err
}

// syncValue is synchronous_standby_names for the request: the peer's
// application_name (its site) when synchronous, else empty.
func (p *Postgres) syncValue(synchronous bool) string {
	if synchronous {
		return quoteIdent(p.m.PeerSite)
	}
	return ""
}

// setSynchronousNames changes synchronous_standby_names on the running
// server (ALTER SYSTEM, reload) and waits until it is in effect.
func (p *Postgres) setSynchronousNames(ctx context.Context, value string) error {
	return p.withConn(ctx, 5*time.Second, func(c *pgx.Conn) error {
		if _, err := c.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names TO "+quoteLiteral(value)); err != nil {
			return fmt.Errorf("ALTER SYSTEM SET synchronous_standby_names: %w", err)
		}
		if _, err := c.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
			return fmt.Errorf("pg_reload_conf: %w", err)
		}
		for {
			// Each backend reloads at its next command: a new
			// connection is not needed, the SHOW of this one follows.
			var got string
			if err := c.QueryRow(ctx, "SHOW synchronous_standby_names").Scan(&got); err != nil {
				return err
			}
			if got == value {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("synchronous_standby_names is %q, not yet %q: %w", got, value, ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
}

// setupPrimary makes a primary what a pair needs, idempotently: the
// replication role (password from the configuration) with the grants
// pg_rewind's source needs, understudy's heartbeat table, and the physical
// slot for the peer.
func (p *Postgres) setupPrimary(ctx context.Context, c *pgx.Conn) error {
	r := p.cfg.Replication.User
	stmts := []string{}
	var exists bool
	if err := c.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", r).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		stmts = append(stmts, "CREATE ROLE "+quoteIdent(r)+" REPLICATION LOGIN")
	}
	pw := "NULL"
	if p.cfg.password != "" {
		pw = quoteLiteral(p.cfg.password)
	}
	stmts = append(stmts,
		"ALTER ROLE "+quoteIdent(r)+" REPLICATION LOGIN PASSWORD "+pw,
		"GRANT EXECUTE ON FUNCTION pg_catalog.pg_ls_dir(text, boolean, boolean) TO "+quoteIdent(r),
		"GRANT EXECUTE ON FUNCTION pg_catalog.pg_stat_file(text, boolean) TO "+quoteIdent(r),
		"GRANT EXECUTE ON FUNCTION pg_catalog.pg_read_binary_file(text) TO "+quoteIdent(r),
		"GRANT EXECUTE ON FUNCTION pg_catalog.pg_read_binary_file(text, bigint, bigint, boolean) TO "+quoteIdent(r),
		"CREATE SCHEMA IF NOT EXISTS understudy",
		"CREATE TABLE IF NOT EXISTS understudy.heartbeat (id int PRIMARY KEY, site text NOT NULL, term bigint NOT NULL, at timestamptz NOT NULL DEFAULT now())",
	)
	var version int
	if err := c.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return err
	}
	if version >= 150000 {
		// A rejoining former primary checkpoints its source first, so
		// that pg_rewind reads the promoted timeline from pg_control.
		stmts = append(stmts, "GRANT pg_checkpoint TO "+quoteIdent(r))
	}
	for _, s := range stmts {
		if _, err := c.Exec(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", redactPassword(s), err)
		}
	}
	slot := slotName(p.m.PeerSite)
	if _, err := c.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, true) WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)", slot); err != nil && !duplicateObject(err) {
		return fmt.Errorf("create replication slot %s: %w", slot, err)
	}
	return nil
}

// duplicateObject reports whether err is PostgreSQL's duplicate_object
// (42710). Creating the peer's slot races the peer's own clone, whose
// pg_basebackup -C creates that slot on this server too: found by the pair
// suite (TestFailbackAfterRewind), where the slot appeared between the
// check and the create during a handoff's promotion, the promotion failed
// on it and handed the pair back to a site whose clone had just been cut
// off — nobody served. The slot is there, for the same peer: done.
func duplicateObject(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42710"
}

func redactPassword(s string) string {
	if i := strings.Index(s, " PASSWORD "); i >= 0 {
		return s[:i] + " PASSWORD ***"
	}
	return s
}

// heartbeatWrite proves the primary accepts writes (locally durable: the
// connection's synchronous_commit is local).
func (p *Postgres) heartbeatWrite(ctx context.Context, c *pgx.Conn, term uint64) error {
	_, err := c.Exec(ctx, `INSERT INTO understudy.heartbeat (id, site, term, at) VALUES (1, $1, $2, now())
		ON CONFLICT (id) DO UPDATE SET site = EXCLUDED.site, term = EXCLUDED.term, at = EXCLUDED.at`, p.m.Site, int64(term))
	return err
}

// probe reads the replication state of a running server.
func (p *Postgres) probe(ctx context.Context, c *pgx.Conn, st *capability.Status) error {
	var rec bool
	if err := c.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&rec); err != nil {
		return err
	}
	if !rec {
		st.Role = capability.RolePrimary
		var flush, walfile, names string
		if err := c.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn()::text, pg_walfile_name(pg_current_wal_lsn()), current_setting('synchronous_standby_names')").Scan(&flush, &walfile, &names); err != nil {
			return err
		}
		st.Flush, _ = capability.ParseLSN(flush)
		if len(walfile) >= 8 {
			tli, _ := strconv.ParseUint(walfile[:8], 16, 32)
			st.Timeline = uint32(tli)
		}
		st.SynchronousSet = names != ""
		var state, syncState, peerFlush string
		err := c.QueryRow(ctx, "SELECT coalesce(state, ''), coalesce(sync_state, ''), coalesce(flush_lsn::text, '') FROM pg_stat_replication WHERE application_name = $1 ORDER BY state = 'streaming' DESC LIMIT 1", p.m.PeerSite).Scan(&state, &syncState, &peerFlush)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if peerFlush != "" {
			st.PeerFlush, _ = capability.ParseLSN(peerFlush)
		}
		st.PeerStreaming = state == "streaming"
		st.PeerSynchronous = st.PeerStreaming && syncState == "sync"
		peer := "not connected"
		if state != "" {
			peer = state + " (" + syncState + ")"
		}
		st.Detail = fmt.Sprintf("primary on timeline %d, flushed %s, synchronous_standby_names %q, peer %s: %s", st.Timeline, st.Flush, names, p.m.PeerSite, peer)
		return nil
	}
	st.Role = capability.RoleStandby
	var receive, replay *string
	var status string
	var tli int64
	if err := c.QueryRow(ctx, `SELECT pg_last_wal_receive_lsn()::text, pg_last_wal_replay_lsn()::text,
		coalesce((SELECT status FROM pg_stat_wal_receiver), ''),
		coalesce((SELECT received_tli FROM pg_stat_wal_receiver), (SELECT timeline_id FROM pg_control_checkpoint()))::bigint`).Scan(&receive, &replay, &status, &tli); err != nil {
		return err
	}
	if receive != nil {
		st.Receive, _ = capability.ParseLSN(*receive)
	}
	if replay != nil {
		st.Replay, _ = capability.ParseLSN(*replay)
	}
	st.Timeline = uint32(tli)
	st.Streaming = status == "streaming"
	if status == "" {
		status = "no WAL receiver"
	}
	st.Detail = fmt.Sprintf("standby on timeline %d, received %s, replayed %s, %s from %s", st.Timeline, st.Receive, st.Replay, status, p.cfg.Peer)
	return nil
}
