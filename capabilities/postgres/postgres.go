package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"understudy/actors/capability"
)

var (
	_ capability.Workload     = (*Postgres)(nil)
	_ capability.Synchronizer = (*Postgres)(nil)
	_ capability.Watched      = (*Postgres)(nil)
)

// Member is the pair member a Postgres serves.
type Member struct {
	Pair, Site, PeerSite string
	// FenceGrace: the keeper stops PostgreSQL when, armed, it has no pet
	// for this long (0: never; the runtime always sets it).
	FenceGrace time.Duration
	// Logger carries the caller's context (pair, site); default
	// slog.Default().
	Logger *slog.Logger
}

// Postgres is the PostgreSQL workload of one failover pair member. Its
// methods follow capability.Workload's contract: the host calls one of
// Fence, Promote, Demote, Rejoin and SetSynchronous at a time; Check and
// Pet may run concurrently with them and with each other.
type Postgres struct {
	cfg Config
	m   Member
	log *slog.Logger
	run string // runDir(cfg.DataDir)

	keeperMu sync.Mutex // serialises (re)starting the keeper
	keeper   atomic.Pointer[keeperClient]
	// armed: PostgreSQL may accept writes by understudy's will (Promote
	// armed the keeper); Fence, Demote and Rejoin disarm once it is a
	// standby or stopped.
	armed atomic.Bool

	checkMu   sync.Mutex // guards checkConn
	checkConn *pgx.Conn

	// logStart is the server log's size at the last start: what it wrote
	// since is read for the reasons a standby cannot stream. Only the one
	// method in flight uses it.
	logStart int64
}

var siteRule = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

// New starts the keeper and stops a PostgreSQL that runs in the data
// directory without this node having started it. cfg must have passed
// Validate; New keeps a copy.
func New(cfg Config, m Member) (*Postgres, error) {
	if !siteRule.MatchString(m.Site) || !siteRule.MatchString(m.PeerSite) || m.Site == m.PeerSite {
		return nil, fmt.Errorf("postgres: pair %q: site %q and peer site %q must be distinct names of letters, digits, '.', '_' and '-'", m.Pair, m.Site, m.PeerSite)
	}
	if cfg.BinDir == "" || cfg.DataDir == "" || (cfg.uid == 0 && os.Geteuid() == 0) {
		return nil, errors.New("postgres: New needs a configuration that passed Validate")
	}
	if m.Logger == nil {
		m.Logger = slog.Default()
	}
	cfg.Parameters = cloneMap(cfg.Parameters)
	if len(cfg.KeeperCommand) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("postgres: find the understudy binary for the keeper: %w", err)
		}
		cfg.KeeperCommand = []string{exe, KeeperSubcommand}
	}
	p := &Postgres{
		cfg: cfg, m: m, run: runDir(cfg.DataDir),
		log: m.Logger,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.stopForeign(ctx); err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if _, err := p.keeperFor(); err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return p, nil
}

// KeeperSubcommand is the understudy subcommand that runs KeeperMain.
const KeeperSubcommand = "pg-keeper"

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// keeperFor returns the running keeper, starting one if there is none or
// it died (PostgreSQL died with it).
func (p *Postgres) keeperFor() (*keeperClient, error) {
	if k := p.keeper.Load(); k != nil && k.alive() {
		return k, nil
	}
	p.keeperMu.Lock()
	defer p.keeperMu.Unlock()
	if k := p.keeper.Load(); k != nil {
		if k.alive() {
			return k, nil
		}
		_ = k.close()
		p.log.Warn("postgres: the keeper had exited (PostgreSQL with it): starting a new one")
	}
	k, err := startKeeper(p.cfg.KeeperCommand, p.m.FenceGrace, p.cfg.Watchdog, p.log)
	if err != nil {
		return nil, err
	}
	p.armed.Store(false)
	p.keeper.Store(k)
	return k, nil
}

// begin is the opening of every change to the server: a PostgreSQL this
// node did not start is stopped first, and the keeper runs.
func (p *Postgres) begin(ctx context.Context) (*keeperClient, error) {
	if err := p.stopForeign(ctx); err != nil {
		return nil, err
	}
	return p.keeperFor()
}

// Pet tells the keeper the node is alive. It never blocks.
func (p *Postgres) Pet() {
	if k := p.keeper.Load(); k != nil {
		k.pet()
	}
}

// FenceBudget is the worst case of Fence: a 150 ms probe of the role, the
// immediate shutdown's 100 ms before SIGKILL, and the reaping. The pair's
// fence_grace must cover it, and failover_timeout the fence_grace: a
// shorter budget is a faster failover. An immediate shutdown takes 15–45
// ms here; SIGKILL of the whole group does what a power cut does, which
// loses no committed transaction.
func (p *Postgres) FenceBudget() time.Duration { return 400 * time.Millisecond }

const probeTimeout = 150 * time.Millisecond

func (p *Postgres) arm(ctx context.Context, k *keeperClient) error {
	if _, err := k.call(ctx, keeperRequest{Op: "arm"}); err != nil {
		return fmt.Errorf("arm the keeper: %w", err)
	}
	p.armed.Store(true)
	return nil
}

func (p *Postgres) disarm(ctx context.Context, k *keeperClient) error {
	if _, err := k.call(ctx, keeperRequest{Op: "disarm"}); err != nil && !errors.Is(err, errKeeperGone) {
		return fmt.Errorf("disarm the keeper: %w", err)
	}
	p.armed.Store(false)
	return nil
}

// Fence makes PostgreSQL unable to accept writes. A standby this node did
// not promote is fenced as it is and keeps streaming; a stopped one is
// fenced; anything else (a primary, a promotion in flight, a server whose
// role cannot be read within 150 ms) is stopped at once (immediate
// shutdown, SIGKILL after 100 ms) and Fence returns once the postmaster
// and its backends are gone. Within FenceBudget.
func (p *Postgres) Fence(ctx context.Context, req capability.Request) error {
	k, err := p.begin(ctx)
	if err != nil {
		return err
	}
	if pid, _ := k.running(); pid != 0 && !p.armed.Load() {
		rec, err := p.inRecovery(ctx, probeTimeout)
		if (err == nil && rec) || isCannotConnectNow(err) {
			// Started by us as a standby and never promoted: it cannot
			// accept writes (57P03: still in recovery, not yet open).
			return p.disarm(ctx, k)
		}
		if err == nil {
			p.log.Warn("postgres: fence: a primary this node did not promote: stopping it (immediate)", "reason", req.Reason)
		}
	}
	if err := p.stopImmediate(ctx, k); err != nil {
		return err
	}
	return p.disarm(ctx, k)
}

// stopImmediate stops PostgreSQL (SIGQUIT, SIGKILL to all of it after
// 100 ms) and returns once it is gone. It does not give up on ctx: a fence
// that returned early would leave a primary running.
func (p *Postgres) stopImmediate(ctx context.Context, k *keeperClient) error {
	pid, _ := k.running()
	if pid == 0 {
		return nil
	}
	start := time.Now()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := k.stop(sctx, "immediate"); err != nil {
		return fmt.Errorf("stop PostgreSQL (immediate): %w", err)
	}
	p.log.Info("postgres: stopped (immediate)", "pid", pid, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// Promote makes PostgreSQL a primary that accepts writes, and returns once
// a write was accepted.
//
//   - running as a standby: arm the keeper, set synchronous_standby_names
//     (ALTER SYSTEM, still read-only), pg_promote, wait;
//   - stopped, data last run as a primary (a fenced primary after a
//     restart of the node): start it as a primary;
//   - stopped, data last run as a standby: start it as a standby, then as
//     above (a promotion, so that it takes a new timeline);
//   - empty data directory: initdb only with req.Bootstrap; without it,
//     an error (a replica must never serve an empty database);
//   - already a primary: ensure the settings below and return.
//
// In every case synchronous_standby_names follows req.Synchronous before
// writes are accepted, and the replication role, understudy's heartbeat
// table and the peer's replication slot exist when it returns.
func (p *Postgres) Promote(ctx context.Context, req capability.Request) error {
	k, err := p.begin(ctx)
	if err != nil {
		return err
	}
	ctx, cancel := withDefaultTimeout(ctx, 2*time.Minute)
	defer cancel()
	names := p.syncValue(req.Synchronous)
	if pid, _ := k.running(); pid == 0 {
		state, cluster, err := p.inspectData(ctx)
		if err != nil {
			return err
		}
		p.log.Info("postgres: promote: PostgreSQL is stopped", "data", state.String(), "cluster_state", cluster, "bootstrap", req.Bootstrap)
		if state == dataEmpty {
			if !req.Bootstrap {
				return fmt.Errorf("promote: data directory %s is empty: refusing to serve an empty database (only the bootstrap of a new pair creates one; a replica must be cloned from its peer by Rejoin first)", p.cfg.DataDir)
			}
			if err := p.initdb(ctx); err != nil {
				return err
			}
			state = dataPrimary
		}
		if err := p.setAutoConf("synchronous_standby_names", names); err != nil {
			return fmt.Errorf("promote: set synchronous_standby_names: %w", err)
		}
		if err := p.arm(ctx, k); err != nil {
			return err
		}
		if err := p.startServer(ctx, state == dataStandby); err != nil {
			return fmt.Errorf("promote: %w", err)
		}
	} else if err := p.arm(ctx, k); err != nil {
		return err
	}
	return p.withConn(ctx, 10*time.Second, func(c *pgx.Conn) error {
		var rec bool
		if err := c.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&rec); err != nil {
			return fmt.Errorf("promote: %w", err)
		}
		if rec {
			if err := p.setSynchronousNames(ctx, names); err != nil {
				return fmt.Errorf("promote: %w", err)
			}
			p.log.Info("postgres: promoting the standby", "reason", req.Reason, "term", req.Term, "synchronous", req.Synchronous)
			var done bool
			if err := c.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&done); err != nil {
				return fmt.Errorf("promote: pg_promote: %w", err)
			}
			if !done {
				return errors.New("promote: pg_promote did not finish within 60s: see the server log in " + p.run)
			}
		} else if err := p.setSynchronousNames(ctx, names); err != nil {
			return fmt.Errorf("promote: %w", err)
		}
		for {
			if err := c.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&rec); err != nil {
				return fmt.Errorf("promote: %w", err)
			}
			if !rec {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("promote: still in recovery: %w", ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
		if err := p.setupPrimary(ctx, c); err != nil {
			return fmt.Errorf("promote: %w", err)
		}
		if err := p.heartbeatWrite(ctx, c, req.Term); err != nil {
			return fmt.Errorf("promote: test write: %w", err)
		}
		p.log.Info("postgres: primary accepts writes", "term", req.Term, "synchronous", req.Synchronous)
		return nil
	})
}

// initdb creates the cluster: data checksums (pg_rewind needs them or
// wal_log_hints), UTF8, the configured superuser. It runs in a sibling
// directory renamed into place, so that an interrupted initdb leaves the
// data directory empty rather than half made.
func (p *Postgres) initdb(ctx context.Context) error {
	if err := p.makeParent(); err != nil {
		return err
	}
	tmp := p.cfg.DataDir + ".initdb"
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("bootstrap: remove %s: %w", tmp, err)
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	if err := p.owned(tmp); err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	p.log.Info("postgres: bootstrap: initdb", "data_dir", p.cfg.DataDir)
	_, err := p.runTool(ctx, "initdb", nil, "-D", tmp, "-U", p.cfg.Superuser,
		"--data-checksums", "--encoding=UTF8", "--locale=C", "--auth-local=trust", "--auth-host=scram-sha-256")
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	// The data directory is missing or empty (inspectData said so).
	if err := os.Remove(p.cfg.DataDir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("bootstrap: %w", err)
	}
	if err := os.Rename(tmp, p.cfg.DataDir); err != nil {
		return fmt.Errorf("bootstrap: move the new cluster into place: %w", err)
	}
	return nil
}

// Demote stops a primary cleanly for a planned hand-over: a fast shutdown,
// which waits for the walsenders to send everything written, and leaves
// PostgreSQL stopped; Rejoin then follows the new leader (pg_rewind finds
// nothing to rewind after a clean hand-over). A standby is left streaming,
// a stopped one stopped. If ctx ends first the shutdown is made immediate.
func (p *Postgres) Demote(ctx context.Context, req capability.Request) error {
	k, err := p.begin(ctx)
	if err != nil {
		return err
	}
	if pid, _ := k.running(); pid != 0 {
		if rec, err := p.inRecovery(ctx, 2*time.Second); err == nil && rec && !p.armed.Load() {
			return p.disarm(ctx, k)
		}
		p.log.Info("postgres: demote: fast shutdown", "reason", req.Reason)
		if err := k.stop(ctx, "fast"); err != nil {
			p.log.Warn("postgres: demote: fast shutdown did not finish: immediate", "err", err)
			if err := p.stopImmediate(ctx, k); err != nil {
				return err
			}
		}
	}
	return p.disarm(context.WithoutCancel(ctx), k)
}

// Rejoin makes PostgreSQL a standby streaming from the leader, which must
// be the peer. Empty data: pg_basebackup. Data last run as a standby:
// (re)start it with the peer as primary_conninfo (recovery_target_timeline
// latest follows the leader's promotion). Data last run as a primary:
// stop it if running, pg_rewind from the leader, and if that fails, move
// the data directory aside (to data_dir.old, replacing an older one) and
// clone again. Returns once the standby streams.
func (p *Postgres) Rejoin(ctx context.Context, req capability.Request) error {
	switch req.Leader {
	case p.m.Site:
		return fmt.Errorf("rejoin: the leader is this site (%s): nothing to follow", p.m.Site)
	case p.m.PeerSite:
	default:
		return fmt.Errorf("rejoin: the leader %q is not this pair's peer %q", req.Leader, p.m.PeerSite)
	}
	k, err := p.begin(ctx)
	if err != nil {
		return err
	}
	if pid, _ := k.running(); pid != 0 {
		rec, err := p.inRecovery(ctx, 2*time.Second)
		if (err == nil && rec || isCannotConnectNow(err)) && !p.armed.Load() {
			if err := p.disarm(ctx, k); err != nil {
				return err
			}
			return p.followOrClone(ctx, k)
		}
		p.log.Info("postgres: rejoin: stopping the primary (immediate)")
		if err := p.stopImmediate(ctx, k); err != nil {
			return err
		}
	}
	if err := p.disarm(ctx, k); err != nil {
		return err
	}
	state, cluster, err := p.inspectData(ctx)
	if err != nil {
		return err
	}
	p.log.Info("postgres: rejoin", "leader", req.Leader, "data", state.String(), "cluster_state", cluster)
	if err := p.prepareDirs(); err != nil {
		return err
	}
	switch state {
	case dataEmpty:
		if err := p.clone(ctx); err != nil {
			return err
		}
	case dataPrimary:
		if err := p.rewind(ctx); err != nil {
			if ctx.Err() != nil {
				return err
			}
			p.log.Warn("postgres: rejoin: pg_rewind failed: cloning again", "err", err)
			if err := p.reclone(ctx); err != nil {
				return err
			}
		}
	}
	if err := p.startStandby(ctx); err != nil {
		return err
	}
	return p.followOrClone(ctx, k)
}

// startStandby starts PostgreSQL as a standby (2 minutes at most when ctx
// has no deadline; a clone or a rewind before it takes what it takes).
func (p *Postgres) startStandby(ctx context.Context) error {
	sctx, cancel := withDefaultTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := p.startServer(sctx, true); err != nil {
		return fmt.Errorf("rejoin: %w", err)
	}
	return nil
}

// followOrClone waits until the running standby streams; if its log says
// it never will, it clones the leader again.
func (p *Postgres) followOrClone(ctx context.Context, k *keeperClient) error {
	err := p.waitStreaming(ctx)
	if !errors.Is(err, errCannotFollow) {
		return err
	}
	// The leader no longer has the WAL this standby needs (its slot was
	// invalidated past max_slot_wal_keep_size, or it never had one), or
	// the histories diverged: only a new copy can follow.
	p.log.Warn("postgres: rejoin: the standby cannot follow the leader: cloning again", "err", err)
	if err := p.stopImmediate(ctx, k); err != nil {
		return err
	}
	if err := p.reclone(ctx); err != nil {
		return err
	}
	if err := p.startStandby(ctx); err != nil {
		return err
	}
	return p.waitStreaming(ctx)
}

// errCannotFollow: the standby's log says it can never stream from the
// leader as it is.
var errCannotFollow = errors.New("the standby cannot follow the leader")

// cannotFollow are the server log's messages that mean errCannotFollow.
var cannotFollow = []string{
	"has already been removed",                // the WAL it needs is gone from the leader
	"is not a child of this server's history", // it went past the leader's fork
	"requested starting point",                // ahead of the leader's flush on the same timeline
}

// cannotFollowIn returns the line of the server log that says the
// standby cannot follow, or "".
func cannotFollowIn(logged string) string {
	for _, m := range cannotFollow {
		if i := strings.Index(logged, m); i >= 0 {
			line, _, _ := strings.Cut(logged[strings.LastIndexByte(logged[:i], '\n')+1:], "\n")
			return line
		}
	}
	return ""
}

func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// clone copies the leader into the empty data directory (pg_basebackup
// through this site's slot on the leader, created if missing).
func (p *Postgres) clone(ctx context.Context) error {
	if err := p.makeEmptyDataDir(); err != nil {
		return err
	}
	slot := slotName(p.m.Site)
	args := []string{"-d", p.peerConninfo(""), "-D", p.cfg.DataDir, "-X", "stream", "-c", "fast", "-S", slot, "--no-password"}
	p.log.Info("postgres: pg_basebackup from the leader", "peer", p.cfg.Peer, "slot", slot)
	start := time.Now()
	out, err := p.runTool(ctx, "pg_basebackup", nil, args...)
	if err != nil && ctx.Err() == nil && containsAll(out, "replication slot", "does not exist") {
		// The leader has no slot for us yet: have pg_basebackup make it.
		p.log.Info("postgres: the leader has no slot for this site: pg_basebackup creates it", "slot", slot)
		_, err = p.runTool(ctx, "pg_basebackup", nil, append(args, "-C")...)
	}
	if err != nil {
		return fmt.Errorf("rejoin: clone from %s: %w", p.cfg.Peer, err)
	}
	p.log.Info("postgres: pg_basebackup done", "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// reclone moves the data directory aside and clones again.
func (p *Postgres) reclone(ctx context.Context) error {
	if err := p.peerReachable(ctx); err != nil {
		return err
	}
	old := p.cfg.DataDir + ".old"
	if err := os.RemoveAll(old); err != nil {
		return fmt.Errorf("rejoin: remove %s: %w", old, err)
	}
	if err := os.Rename(p.cfg.DataDir, old); err != nil {
		return fmt.Errorf("rejoin: move the data directory aside to %s: %w", old, err)
	}
	p.log.Warn("postgres: rejoin: moved the old data directory aside", "to", old)
	return p.clone(ctx)
}

// rewind makes a former primary's data a copy of the leader's history
// (pg_rewind; it recovers an unclean shutdown itself first).
func (p *Postgres) rewind(ctx context.Context) error {
	if err := p.peerReachable(ctx); err != nil {
		return err
	}
	if err := p.recoverCrashed(ctx); err != nil {
		return err
	}
	p.log.Info("postgres: pg_rewind from the leader", "peer", p.cfg.Peer)
	start := time.Now()
	out, err := p.runTool(ctx, "pg_rewind", nil, "--target-pgdata", p.cfg.DataDir, "--source-server", p.peerConninfo("postgres"))
	if err != nil {
		return fmt.Errorf("rejoin: %w", err)
	}
	if strings.Contains(out, "source and target cluster are on the same timeline") {
		// pg_rewind compares timelines only. Data that last ran as a
		// primary on the leader's own timeline was started as one
		// without a promotion (by hand, behind understudy's back): its
		// WAL diverges from the leader's at the same positions, and a
		// standby started on it streams with both histories mixed.
		return fmt.Errorf("rejoin: this former primary ran on the leader's timeline (%s): its history diverged where pg_rewind cannot see it", strings.ReplaceAll(strings.TrimSpace(out), "\n", "; "))
	}
	p.log.Info("postgres: pg_rewind done", "took", time.Since(start).Round(time.Millisecond), "output", strings.ReplaceAll(strings.TrimSpace(out), "\n", "; "))
	return nil
}

// recoverCrashed brings data that was not shut down cleanly (a fenced
// primary) to a clean shutdown in single-user mode, as pg_rewind would
// itself, but with understudy's settings: pg_rewind's own run uses only
// postgresql.conf, and would record settings (max_connections...) that a
// standby started with understudy's command line then refuses.
func (p *Postgres) recoverCrashed(ctx context.Context) error {
	out, err := p.runTool(ctx, "pg_controldata", nil, p.cfg.DataDir)
	if err != nil {
		return err
	}
	if state := controlField(out, "Database cluster state"); state == "shut down" || state == "shut down in recovery" {
		return nil
	}
	if err := p.setSignal(false); err != nil {
		return err
	}
	args := append(append([]string{"--single", "-F"}, p.argv(false)[1:]...), "template1")
	p.log.Info("postgres: crash recovery in single-user mode before pg_rewind")
	if _, err := p.runTool(ctx, "postgres", nil, args...); err != nil {
		return fmt.Errorf("rejoin: crash recovery of the former primary: %w", err)
	}
	return nil
}

// peerReachable checks the leader accepts the replication user before
// anything touches the data: an unreachable leader must not cost this
// site its data directory. It also runs a CHECKPOINT there (the role has
// pg_checkpoint): a freshly promoted leader's pg_control names its new
// timeline only after one, and pg_rewind reads the timeline from it.
func (p *Postgres) peerReachable(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(p.peerConninfo("postgres"))
	if err != nil {
		return err
	}
	if p.cfg.password != "" {
		cfg.Password = p.cfg.password
	}
	c, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return fmt.Errorf("rejoin: the leader at %s does not accept %s: %w (the data directory is left as it is)", p.cfg.Peer, p.cfg.Replication.User, err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, "CHECKPOINT"); err != nil {
		p.log.Warn("postgres: rejoin: CHECKPOINT on the leader failed; pg_rewind may see its old timeline", "err", err)
	}
	return nil
}

// waitStreaming waits until the standby's WAL receiver streams (2 minutes
// at most when ctx has no deadline).
// streamSettle is how long a new WAL receiver must stream before a rejoin
// counts it as following.
const streamSettle = 300 * time.Millisecond

func (p *Postgres) waitStreaming(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx, 2*time.Minute)
	defer cancel()
	status := ""
	var last error
	var since time.Time // streaming seen continuously since
	for {
		err := p.withConn(ctx, 2*time.Second, func(c *pgx.Conn) error {
			return c.QueryRow(ctx, "SELECT coalesce((SELECT status FROM pg_stat_wal_receiver), '')").Scan(&status)
		})
		// The receiver says streaming as soon as it asked for WAL; a leader
		// that removed that WAL refuses it right after. Streaming counts
		// once it lasted streamSettle with no such refusal in the log.
		switch {
		case err == nil && status == "streaming" && since.IsZero():
			since = time.Now()
		case err == nil && status == "streaming" && time.Since(since) >= streamSettle:
			if line := cannotFollowIn(tailFrom(filepath.Join(p.run, serverLog), p.logStart)); line != "" {
				return fmt.Errorf("%w: %s", errCannotFollow, line)
			}
			p.log.Info("postgres: standby streams from the leader", "peer", p.cfg.Peer)
			return nil
		case err != nil || status != "streaming":
			since = time.Time{}
		}
		last = err
		if line := cannotFollowIn(tailFrom(filepath.Join(p.run, serverLog), p.logStart)); line != "" {
			return fmt.Errorf("%w: %s", errCannotFollow, line)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("rejoin: the standby does not stream from %s (WAL receiver %q, %v; see %s/%s): %w", p.cfg.Peer, status, last, p.run, serverLog, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Check reports PostgreSQL's role and replication positions. For a leader
// (req.Serving) anything but a primary is an error; for a follower,
// anything but a streaming standby. A follower found running as a primary
// that this node did not promote accepts writes where it must not: Check
// stops it (immediate) and reports the error.
func (p *Postgres) Check(ctx context.Context, req capability.Request) (capability.Status, error) {
	st := capability.Status{Positions: true, Role: capability.RoleDown}
	k := p.keeper.Load()
	pid := 0
	if k != nil {
		pid, _ = k.running()
	}
	if pid == 0 {
		st.Detail = "PostgreSQL is not running"
		if k != nil {
			k.mu.Lock()
			switch {
			case k.expired != "":
				st.Detail += " (the keeper stopped it: " + k.expired + ")"
			case k.exitMsg != "":
				st.Detail += " (the postmaster exited: " + k.exitMsg + "; see " + p.run + "/" + serverLog + ")"
			}
			k.mu.Unlock()
		}
		return st, errors.New(st.Detail)
	}
	if err := p.probeChecked(ctx, &st); err != nil {
		st.Role = capability.RoleDown
		st.Detail = "PostgreSQL does not answer: " + err.Error()
		return st, errors.New(st.Detail)
	}
	switch {
	case req.Serving && st.Role != capability.RolePrimary:
		return st, fmt.Errorf("the leader's PostgreSQL is not a primary: %s", st.Detail)
	case !req.Serving && st.Role == capability.RolePrimary:
		if p.armed.Load() {
			return st, fmt.Errorf("a follower's PostgreSQL is a primary (promoted by this node; awaiting a fence): %s", st.Detail)
		}
		p.log.Error("postgres: a follower's PostgreSQL accepts writes (promoted behind understudy's back): stopping it (immediate)", "detail", st.Detail)
		if k != nil {
			if err := p.stopImmediate(ctx, k); err != nil {
				return st, fmt.Errorf("a follower's PostgreSQL is a primary and could not be stopped: %w", err)
			}
			st.Role = capability.RoleDown
		}
		return st, fmt.Errorf("a follower's PostgreSQL was a primary (promoted behind understudy's back): stopped it: %s", st.Detail)
	case !req.Serving && !st.Streaming:
		return st, fmt.Errorf("the follower's standby does not stream: %s", st.Detail)
	}
	return st, nil
}

// probeChecked probes over Check's own connection, reconnecting once when
// it broke.
func (p *Postgres) probeChecked(ctx context.Context, st *capability.Status) error {
	p.checkMu.Lock()
	defer p.checkMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		if p.checkConn == nil || p.checkConn.IsClosed() {
			p.checkConn, err = p.connect(ctx, time.Second)
			if err != nil {
				p.checkConn = nil
				return err
			}
		}
		if err = p.probe(ctx, p.checkConn, st); err == nil {
			return nil
		}
		_ = p.checkConn.Close(context.Background())
		p.checkConn = nil
		if ctx.Err() != nil {
			break
		}
	}
	return err
}

// SetSynchronous makes commits wait for the peer (req.Synchronous) or stop
// waiting: synchronous_standby_names by ALTER SYSTEM and a reload, and
// returns once the server reports the new value. A stopped server gets it
// in postgresql.auto.conf for its next start.
func (p *Postgres) SetSynchronous(ctx context.Context, req capability.Request) error {
	value := p.syncValue(req.Synchronous)
	k, err := p.keeperFor()
	if err != nil {
		return err
	}
	if pid, _ := k.running(); pid == 0 {
		if _, err := os.Stat(p.cfg.DataDir); err != nil {
			return fmt.Errorf("set synchronous: PostgreSQL is stopped and has no data directory: %w", err)
		}
		return p.setAutoConf("synchronous_standby_names", value)
	}
	ctx, cancel := withDefaultTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.setSynchronousNames(ctx, value); err != nil {
		return fmt.Errorf("set synchronous: %w", err)
	}
	p.log.Info("postgres: synchronous_standby_names set", "value", value)
	return nil
}

// Close stops PostgreSQL (fast shutdown, immediate after 30 s) and the
// keeper: the node is shutting down.
func (p *Postgres) Close() error {
	p.checkMu.Lock()
	if p.checkConn != nil {
		_ = p.checkConn.Close(context.Background())
		p.checkConn = nil
	}
	p.checkMu.Unlock()
	p.keeperMu.Lock()
	defer p.keeperMu.Unlock()
	k := p.keeper.Load()
	if k == nil {
		return nil
	}
	var err error
	if k.alive() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if serr := k.stop(ctx, "fast"); serr != nil {
			p.log.Warn("postgres: fast shutdown did not finish: immediate", "err", serr)
			err = p.stopImmediate(context.Background(), k)
		}
		cancel()
		_ = p.disarm(context.Background(), k)
	}
	if cerr := k.close(); err == nil {
		err = cerr
	}
	p.keeper.Store(nil)
	return err
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
