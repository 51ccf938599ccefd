package postgres

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The files and processes of one PostgreSQL cluster: its data directory,
// understudy's directory beside it (runDir), the postmaster's command line,
// and the PostgreSQL programs understudy runs as RunAs.

const (
	hbaFile     = "pg_hba.conf"
	passFile    = "pgpass"
	serverLog   = "postgres.log"
	maxLogBytes = 64 << 20 // the server log is rotated once (to .1) beyond this, at a start
	tailBytes   = 4 << 10  // what an error quotes of a command's output or the server log
)

// dataState is what the data directory holds.
type dataState int

const (
	dataEmpty   dataState = iota + 1 // missing or empty: initdb or pg_basebackup
	dataPrimary                      // a cluster last run as a primary (or crashed as one)
	dataStandby                      // a cluster last run as a standby
)

func (d dataState) String() string {
	switch d {
	case dataEmpty:
		return "empty"
	case dataPrimary:
		return "primary"
	case dataStandby:
		return "standby"
	}
	return "unset"
}

// inspectData reads the data directory's state (pg_controldata's "Database
// cluster state", and standby.signal for the ambiguous ones).
func (p *Postgres) inspectData(ctx context.Context) (dataState, string, error) {
	entries, err := os.ReadDir(p.cfg.DataDir)
	if errors.Is(err, os.ErrNotExist) || (err == nil && len(entries) == 0) {
		return dataEmpty, "", nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("read data directory %s: %w", p.cfg.DataDir, err)
	}
	if _, err := os.Stat(filepath.Join(p.cfg.DataDir, "PG_VERSION")); err != nil {
		return 0, "", fmt.Errorf("data directory %s is not empty and holds no PostgreSQL cluster (no PG_VERSION): move its contents away or fix data_dir", p.cfg.DataDir)
	}
	out, err := p.runTool(ctx, "pg_controldata", nil, p.cfg.DataDir)
	if err != nil {
		return 0, "", err
	}
	state := controlField(out, "Database cluster state")
	switch state {
	case "in archive recovery", "shut down in recovery":
		return dataStandby, state, nil
	case "starting up", "in crash recovery":
		if fileExists(filepath.Join(p.cfg.DataDir, "standby.signal")) {
			return dataStandby, state, nil
		}
	}
	return dataPrimary, state, nil
}

func controlField(out, name string) string {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == name {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// owned makes path belong to RunAs (a no-op unless the node is root).
func (p *Postgres) owned(path string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	return os.Lchown(path, int(p.cfg.uid), int(p.cfg.gid))
}

// writeOwned writes a file as RunAs's (mode 0600), atomically.
func (p *Postgres) writeOwned(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	if err := p.owned(tmp); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// prepareDirs makes runDir and its files, and checks the data directory's
// owner and mode: every start rewrites them from the configuration.
func (p *Postgres) prepareDirs() error {
	if err := p.makeParent(); err != nil {
		return err
	}
	if err := os.MkdirAll(p.run, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", p.run, err)
	}
	if err := os.Chmod(p.run, 0o700); err != nil {
		return err
	}
	if err := p.owned(p.run); err != nil {
		return fmt.Errorf("chown %s to %s: %w", p.run, p.cfg.RunAs, err)
	}
	if err := p.writeOwned(filepath.Join(p.run, hbaFile), []byte(p.hba())); err != nil {
		return fmt.Errorf("write %s: %w", hbaFile, err)
	}
	// libpq's passfile: *:*:*:user:password, with ':' and '\' escaped.
	path := filepath.Join(p.run, passFile)
	if p.cfg.password == "" { // certificate authentication
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	pw := strings.NewReplacer(`\`, `\\`, `:`, `\:`).Replace(p.cfg.password)
	if err := p.writeOwned(path, []byte("*:*:*:"+p.cfg.Replication.User+":"+pw+"\n")); err != nil {
		return fmt.Errorf("write the passfile: %w", err)
	}
	return nil
}

// checkDataDir: an existing data directory must be RunAs's and 0700 or
// 0750 (PostgreSQL refuses to start otherwise).
func (p *Postgres) checkDataDir() error {
	fi, err := os.Stat(p.cfg.DataDir)
	if err != nil {
		return err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != p.cfg.uid {
		return fmt.Errorf("data directory %s is owned by uid %d, not by %s (uid %d): chown -R %s %s", p.cfg.DataDir, st.Uid, p.cfg.RunAs, p.cfg.uid, p.cfg.RunAs, p.cfg.DataDir)
	}
	if m := fi.Mode().Perm(); m != 0o700 && m != 0o750 {
		return fmt.Errorf("data directory %s has mode %#o: PostgreSQL wants 0700 (chmod 0700 %s)", p.cfg.DataDir, m, p.cfg.DataDir)
	}
	return nil
}

// makeEmptyDataDir creates the data directory (RunAs's, 0700) for initdb
// or pg_basebackup.
func (p *Postgres) makeEmptyDataDir() error {
	if err := p.makeParent(); err != nil {
		return err
	}
	if err := os.MkdirAll(p.cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("create data directory: %w", err)
	}
	if err := os.Chmod(p.cfg.DataDir, 0o700); err != nil {
		return err
	}
	return p.owned(p.cfg.DataDir)
}

// makeParent creates the data directory's parent if missing, traversable
// (0755) so that RunAs reaches the data directory inside.
func (p *Postgres) makeParent() error {
	if err := os.MkdirAll(filepath.Dir(p.cfg.DataDir), 0o755); err != nil {
		return fmt.Errorf("create the data directory's parent: %w", err)
	}
	return nil
}

// hba is the generated pg_hba.conf: the superuser over the private socket
// only; the replication user over TCP, for streaming and (database
// postgres) as pg_rewind's source.
func (p *Postgres) hba() string {
	host, method := "host", "scram-sha-256"
	if p.cfg.TLS.enabled() {
		host = "hostssl"
		if p.cfg.password == "" {
			method = "cert"
		} else {
			method = "scram-sha-256 clientcert=verify-full"
		}
	}
	var b strings.Builder
	b.WriteString("# Generated by understudy at each start; edits are lost.\n")
	fmt.Fprintf(&b, "local all %s trust\n", p.cfg.Superuser)
	fmt.Fprintf(&b, "local replication %s trust\n", p.cfg.Superuser)
	fmt.Fprintf(&b, "%s replication %s all %s\n", host, p.cfg.Replication.User, method)
	fmt.Fprintf(&b, "%s postgres %s all %s\n", host, p.cfg.Replication.User, method)
	for _, line := range p.cfg.HBA {
		b.WriteString(line + "\n")
	}
	return b.String()
}

// peerConninfo is the libpq connection string to the peer as the
// replication user (application_name: this site, as the leader's
// synchronous_standby_names names it).
func (p *Postgres) peerConninfo(dbname string) string {
	host, port, _ := net.SplitHostPort(p.cfg.Peer)
	parts := []string{
		"host=" + host, "port=" + port, "user=" + p.cfg.Replication.User,
		"application_name=" + p.m.Site, "connect_timeout=5",
		"passfile=" + filepath.Join(p.run, passFile),
	}
	if dbname != "" {
		parts = append(parts, "dbname="+dbname)
	}
	if t := p.cfg.TLS; t.enabled() {
		parts = append(parts, "sslmode=verify-full", "sslrootcert="+t.CA, "sslcert="+t.Cert, "sslkey="+t.Key)
	}
	return strings.Join(parts, " ")
}

// slotName is the physical replication slot a primary keeps for site.
func slotName(site string) string {
	b := []byte("understudy_" + strings.ToLower(site))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	if len(b) > 63 {
		b = b[:63]
	}
	return string(b)
}

// argv is the postmaster's command line: every setting understudy manages,
// so that nothing a base backup or pg_rewind copies from the other site
// (postgresql.conf, postgresql.auto.conf) can override it.
func (p *Postgres) argv(standby bool) []string {
	set := map[string]string{}
	for k, v := range defaultParameters {
		set[k] = v
	}
	for k, v := range p.cfg.Parameters {
		set[k] = v
	}
	set["port"] = strconv.Itoa(p.cfg.Port)
	set["listen_addresses"] = p.cfg.Listen
	set["unix_socket_directories"] = p.run
	set["hba_file"] = filepath.Join(p.run, hbaFile)
	set["wal_level"] = "replica"
	set["hot_standby"] = "on"
	set["wal_log_hints"] = "on"
	if t := p.cfg.TLS; t.enabled() {
		set["ssl"] = "on"
		set["ssl_ca_file"] = t.CA
		set["ssl_cert_file"] = t.Cert
		set["ssl_key_file"] = t.Key
	}
	if standby {
		set["primary_conninfo"] = p.peerConninfo("")
		set["primary_slot_name"] = slotName(p.m.Site)
		set["recovery_target_timeline"] = "latest"
	}
	names := make([]string, 0, len(set))
	for k := range set {
		names = append(names, k)
	}
	sort.Strings(names)
	args := []string{filepath.Join(p.cfg.BinDir, "postgres"), "-D", p.cfg.DataDir}
	for _, k := range names {
		args = append(args, "-c", k+"="+set[k])
	}
	return args
}

// setSignal makes the next start a standby's (standby.signal) or a
// primary's (neither signal file).
func (p *Postgres) setSignal(standby bool) error {
	sig := filepath.Join(p.cfg.DataDir, "standby.signal")
	if standby {
		return p.writeOwned(sig, nil)
	}
	for _, f := range []string{sig, filepath.Join(p.cfg.DataDir, "recovery.signal")} {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// setAutoConf sets name in postgresql.auto.conf while the server is down
// (ALTER SYSTEM's file; a running server is changed with ALTER SYSTEM).
func (p *Postgres) setAutoConf(name, value string) error {
	path := filepath.Join(p.cfg.DataDir, "postgresql.auto.conf")
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	var b bytes.Buffer
	if len(old) == 0 {
		b.WriteString("# Do not edit this file manually!\n# It will be overwritten by the ALTER SYSTEM command.\n")
	}
	for _, line := range strings.SplitAfter(string(old), "\n") {
		if k, _, ok := strings.Cut(line, "="); ok && strings.TrimSpace(k) == name {
			continue
		}
		b.WriteString(line)
	}
	if b.Len() > 0 && !bytes.HasSuffix(b.Bytes(), []byte("\n")) {
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "%s = %s\n", name, quoteLiteral(value))
	return p.writeOwned(path, b.Bytes())
}

// startServer starts the postmaster through the keeper (as a standby or a
// primary) and returns once it accepts connections over the socket.
func (p *Postgres) startServer(ctx context.Context, standby bool) error {
	if err := p.checkDataDir(); err != nil {
		return err
	}
	if err := p.prepareDirs(); err != nil {
		return err
	}
	if err := p.setSignal(standby); err != nil {
		return fmt.Errorf("signal file: %w", err)
	}
	logPath := filepath.Join(p.run, serverLog)
	if fi, err := os.Stat(logPath); err == nil && fi.Size() > maxLogBytes {
		_ = os.Rename(logPath, logPath+".1")
	}
	k, err := p.keeperFor()
	if err != nil {
		return err
	}
	logStart, _ := fileSize(logPath)
	p.logStart = logStart
	uid := p.cfg.uid
	pid, err := k.start(ctx, keeperRequest{
		Argv: p.argv(standby), Dir: p.cfg.DataDir, Log: logPath,
		Env: []string{"PATH=/usr/bin:/bin", "LC_ALL=C"},
		UID: &uid, GID: p.cfg.gid, Groups: p.cfg.groups,
	})
	if err != nil {
		return fmt.Errorf("start PostgreSQL: %w", err)
	}
	role := "primary"
	if standby {
		role = "standby"
	}
	p.log.Info("postgres: started", "role", role, "pid", pid, "data_dir", p.cfg.DataDir)
	_, exited := k.running()
	for {
		c, err := p.connect(ctx, 2*time.Second)
		if err == nil {
			_ = c.Close(context.Background())
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("PostgreSQL exited at start (see %s): %s", logPath, tailFrom(logPath, logStart))
		case <-ctx.Done():
			return fmt.Errorf("PostgreSQL did not accept connections before the deadline (%v): %s", err, tailFrom(logPath, logStart))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func fileSize(path string) (int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// tailFrom is the last tailBytes of path written after offset from.
func tailFrom(path string, from int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return ""
	}
	if size-from > tailBytes {
		from = size - tailBytes
	}
	if from > size || from < 0 {
		from = 0
	}
	b := make([]byte, size-from)
	n, _ := f.ReadAt(b, from)
	return strings.TrimSpace(string(b[:n]))
}

// tail keeps the last tailBytes written to it.
type tail struct{ b []byte }

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 2*tailBytes {
		t.b = append(t.b[:0], t.b[len(t.b)-tailBytes:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	b := t.b
	if len(b) > tailBytes {
		b = b[len(b)-tailBytes:]
	}
	return strings.TrimSpace(string(b))
}

// runTool runs a PostgreSQL program from BinDir as RunAs, in runDir, with
// the passfile; it returns the (bounded) output, and on failure an error
// quoting its end.
func (p *Postgres) runTool(ctx context.Context, name string, env []string, args ...string) (string, error) {
	if err := p.makeParent(); err == nil && os.MkdirAll(p.run, 0o700) == nil {
		_ = p.owned(p.run)
	}
	cmd := exec.CommandContext(ctx, filepath.Join(p.cfg.BinDir, name), args...)
	cmd.Dir = p.run
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "LC_ALL=C", "PGPASSFILE=" + filepath.Join(p.run, passFile), "PGCONNECT_TIMEOUT=5"}, env...)
	var out tail
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() == 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: p.cfg.uid, Gid: p.cfg.gid, Groups: p.cfg.groups}
	}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	p.log.Debug("postgres: run", "cmd", name, "args", args)
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return out.String(), fmt.Errorf("%s: %w (%v)", name, ctx.Err(), err)
		}
		return out.String(), fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// stopForeign stops a postmaster running in DataDir that this node did not
// start (postmaster.pid names a live postgres process whose working
// directory is DataDir, and it is not the keeper's child): immediate
// shutdown, then SIGKILL to it and its children.
func (p *Postgres) stopForeign(ctx context.Context) error {
	b, err := os.ReadFile(filepath.Join(p.cfg.DataDir, "postmaster.pid"))
	if err != nil {
		return nil
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return nil
	}
	if k := p.keeper.Load(); k != nil {
		if mine, _ := k.running(); mine == pid {
			return nil
		}
	}
	if !isPostmasterOf(pid, p.cfg.DataDir) {
		return nil
	}
	p.log.Warn("postgres: a PostgreSQL this node did not start runs in the data directory: stopping it (immediate)", "pid", pid, "data_dir", p.cfg.DataDir)
	_ = syscall.Kill(pid, syscall.SIGQUIT)
	deadline := time.Now().Add(immediateWait)
	for alive(pid) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if alive(pid) {
		for _, c := range childrenOf(pid) {
			_ = syscall.Kill(c, syscall.SIGKILL)
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for alive(pid) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("a PostgreSQL this node did not start (pid %d) still runs in %s: %w", pid, p.cfg.DataDir, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	// Backends it left (they exit on their own on the postmaster's death,
	// but must not commit meanwhile).
	for _, c := range procsIn(p.cfg.DataDir) {
		_ = syscall.Kill(c, syscall.SIGKILL)
	}
	return nil
}

// alive: the process exists and is not a zombie.
func alive(pid int) bool {
	_, state, ok := procStat(pid)
	return ok && state != 'Z'
}

// isPostmasterOf: pid is a postgres process working in dataDir.
func isPostmasterOf(pid int, dataDir string) bool {
	if !alive(pid) {
		return false
	}
	comm, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
	if err != nil || !strings.HasPrefix(strings.TrimSpace(string(comm)), "postgres") && !strings.HasPrefix(strings.TrimSpace(string(comm)), "postmaster") {
		return false
	}
	cwd, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "cwd"))
	return err == nil && sameDir(cwd, dataDir)
}

func sameDir(a, b string) bool {
	ra, err1 := filepath.EvalSymlinks(a)
	rb, err2 := filepath.EvalSymlinks(b)
	if err1 != nil || err2 != nil {
		return filepath.Clean(a) == filepath.Clean(b)
	}
	return ra == rb
}

// procsIn lists live postgres processes working in dataDir.
func procsIn(dataDir string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil && isPostmasterOf(pid, dataDir) {
			out = append(out, pid)
		}
	}
	return out
}
