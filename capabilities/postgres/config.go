package postgres

import (
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"understudy/actors"
)

// Config is the `postgres:` section of a pair member in the node file.
// Strict decoding is the caller's; Validate fills the defaults and checks
// every field once, at load: nothing downstream re-reads them.
type Config struct {
	// Version selects /usr/lib/postgresql/<version>/bin (Debian's layout);
	// default 15.
	Version int `yaml:"version"`
	// BinDir overrides the directory Version selects.
	BinDir string `yaml:"bin_dir"`
	// DataDir is the cluster's data directory; required, absolute.
	DataDir string `yaml:"data_dir"`
	// Listen is listen_addresses; default "127.0.0.1".
	Listen string `yaml:"listen"`
	// Port is this site's PostgreSQL port; default 5432.
	Port int `yaml:"port"`
	// Peer is host:port of the other site's PostgreSQL: the source of
	// replication, pg_basebackup and pg_rewind. Required.
	Peer string `yaml:"peer"`
	// RunAs is the OS user PostgreSQL runs as: default "postgres" when the
	// node runs as root, else the node's own user.
	RunAs string `yaml:"run_as"`
	// Superuser is the database superuser the node connects as, over a
	// Unix socket only it and RunAs can reach; default "postgres".
	Superuser   string            `yaml:"superuser"`
	Replication ReplicationConfig `yaml:"replication"`
	TLS         TLSConfig         `yaml:"tls"`
	// Parameters are passed to postgres as -c name=value. The settings
	// understudy manages are refused (see managedParameters); a few it
	// only defaults may be overridden (see defaultParameters).
	Parameters map[string]string `yaml:"parameters"`
	// HBA are pg_hba.conf lines appended after understudy's own (which
	// admit only the superuser over the private socket and the replication
	// user over TCP): how applications connect, e.g.
	// "hostssl app app 10.0.0.0/8 scram-sha-256".
	HBA []string `yaml:"hba"`
	// Watchdog is an optional Linux watchdog device (/dev/watchdog) the
	// keeper pets while PostgreSQL may accept writes. Without it, only
	// understudy's own keeper process guards against a paused node.
	Watchdog string `yaml:"watchdog"`
	// KeeperCommand starts the keeper process; default
	// {os.Executable(), "pg-keeper"}. Tests set their own.
	KeeperCommand []string `yaml:"-"`

	// Filled by Validate.
	uid, gid uint32
	groups   []uint32
	password string // from Replication.Password or PasswordFile
}

// ReplicationConfig is the role the peer connects as to stream, clone and
// rewind. A password (or password_file) is required unless TLS is set, in
// which case the peer may authenticate by certificate alone (the
// certificate's CN must be the user).
type ReplicationConfig struct {
	User         string `yaml:"user"` // default "replicator"
	Password     string `yaml:"password"`
	PasswordFile string `yaml:"password_file"`
}

// TLSConfig: with all three set, the server runs with ssl=on and these
// files, and connections to the peer use sslmode=verify-full with them.
// The key must be readable by RunAs only (libpq refuses it otherwise).
type TLSConfig struct {
	CA   string `yaml:"ca"`
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

func (t TLSConfig) enabled() bool { return t.CA != "" }

// managedParameters are set by understudy on the postmaster's command line
// (or, for synchronous_standby_names, by SetSynchronous): Parameters may not
// set them.
var managedParameters = map[string]bool{
	"port": true, "listen_addresses": true, "unix_socket_directories": true,
	"hba_file": true, "ident_file": true, "config_file": true, "data_directory": true,
	"wal_level": true, "hot_standby": true, "wal_log_hints": true,
	"primary_conninfo": true, "primary_slot_name": true, "recovery_target_timeline": true,
	"synchronous_standby_names": true, "ssl": true, "ssl_cert_file": true,
	"ssl_key_file": true, "ssl_ca_file": true, "external_pid_file": true,
}

// defaultParameters are understudy's defaults that Parameters may override.
// max_slot_wal_keep_size bounds what an absent peer's slot may retain.
var defaultParameters = map[string]string{
	"max_wal_senders":             "10",
	"max_replication_slots":       "10",
	"max_slot_wal_keep_size":      "4GB",
	"wal_keep_size":               "256MB",
	"wal_retrieve_retry_interval": "100ms", // a promotion waits up to one interval for the startup process
}

var (
	identifierRule = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)
	parameterRule  = regexp.MustCompile(`^[a-z_][a-z0-9_.]*$`)
)

// binaries understudy runs from BinDir.
var binaries = []string{"postgres", "initdb", "pg_basebackup", "pg_rewind", "pg_controldata"}

// Validate fills the defaults and checks every field. field is where the
// section sits in the node file ("pairs[0].postgres"): errors are
// *actors.ConfigError naming field+".<key>".
func (c *Config) Validate(field string) error {
	bad := func(key, rule, value string) error {
		return &actors.ConfigError{Field: field + "." + key, Rule: rule, Value: value}
	}
	if c.Version == 0 {
		c.Version = 15
	}
	if c.Version < 10 || c.Version > 99 {
		return bad("version", "a PostgreSQL major version (15 is tested)", strconv.Itoa(c.Version))
	}
	if c.DataDir == "" {
		return bad("data_dir", "required: the absolute path of the cluster's data directory", "")
	}
	if !filepath.IsAbs(c.DataDir) {
		return bad("data_dir", "must be an absolute path", c.DataDir)
	}
	c.DataDir = filepath.Clean(c.DataDir)
	if c.DataDir == "/" {
		return bad("data_dir", "must not be the root directory", c.DataDir)
	}
	if len(runDir(c.DataDir))+len("/.s.PGSQL.65535.lock") > 107 {
		return bad("data_dir", "too long: the Unix socket beside it must fit in 107 bytes", c.DataDir)
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1"
	}
	if strings.ContainsAny(c.Listen, "'\\\x00 ") {
		return bad("listen", "a comma-separated list of host names or addresses", c.Listen)
	}
	if c.Port == 0 {
		c.Port = 5432
	}
	if c.Port < 1 || c.Port > 65535 {
		return bad("port", "a TCP port, 1 to 65535", strconv.Itoa(c.Port))
	}
	if c.Peer == "" {
		return bad("peer", "required: host:port of the other site's PostgreSQL", "")
	}
	host, port, err := net.SplitHostPort(c.Peer)
	if err != nil || host == "" || strings.ContainsAny(host, "'\\ \x00") {
		return bad("peer", "host:port of the other site's PostgreSQL", c.Peer)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return bad("peer", "host:port with a TCP port, 1 to 65535", c.Peer)
	}
	if err := c.validateUser(bad); err != nil {
		return err
	}
	if c.Superuser == "" {
		c.Superuser = "postgres"
	}
	if !identifierRule.MatchString(c.Superuser) {
		return bad("superuser", "a PostgreSQL role name of letters, digits and _", c.Superuser)
	}
	r := &c.Replication
	if r.User == "" {
		r.User = "replicator"
	}
	if !identifierRule.MatchString(r.User) {
		return bad("replication.user", "a PostgreSQL role name of letters, digits and _", r.User)
	}
	if r.User == c.Superuser {
		return bad("replication.user", "must differ from superuser: the peer's role gets replication rights only", r.User)
	}
	switch {
	case r.Password != "" && r.PasswordFile != "":
		return bad("replication", "set password or password_file, not both", "")
	case r.PasswordFile != "":
		b, err := os.ReadFile(r.PasswordFile)
		if err != nil {
			return bad("replication.password_file", fmt.Sprintf("cannot read it: %v", err), r.PasswordFile)
		}
		c.password = strings.TrimRight(string(b), "\r\n")
		if c.password == "" {
			return bad("replication.password_file", "the file is empty", r.PasswordFile)
		}
	default:
		c.password = r.Password
	}
	if strings.ContainsAny(c.password, "\x00\n") {
		return bad("replication.password", "must be one line", "")
	}
	t := c.TLS
	if set := btoi(t.CA != "") + btoi(t.Cert != "") + btoi(t.Key != ""); set != 0 && set != 3 {
		return bad("tls", "set ca, cert and key together, or none of them", "")
	}
	for key, p := range map[string]string{"tls.ca": t.CA, "tls.cert": t.Cert, "tls.key": t.Key} {
		if p == "" {
			continue
		}
		if !filepath.IsAbs(p) || strings.ContainsAny(p, "'\\ \x00") {
			return bad(key, "an absolute path without spaces, quotes or backslashes", p)
		}
		if _, err := os.Stat(p); err != nil {
			return bad(key, fmt.Sprintf("cannot read it: %v", err), p)
		}
	}
	if c.password == "" && !t.enabled() {
		return bad("replication.password", "required unless tls is set (then the peer authenticates by certificate)", "")
	}
	for name, value := range c.Parameters {
		if !parameterRule.MatchString(name) {
			return bad("parameters", "a PostgreSQL setting name (lower case)", name)
		}
		if managedParameters[name] {
			return bad("parameters."+name, "understudy sets this one itself; remove it", value)
		}
		if strings.ContainsRune(value, 0) {
			return bad("parameters."+name, "must not contain a NUL byte", "")
		}
	}
	for i, line := range c.HBA {
		f := strings.Fields(line)
		switch {
		case strings.ContainsAny(line, "\n\r\x00"):
			return bad("hba["+strconv.Itoa(i)+"]", "one pg_hba.conf line: no line breaks or NUL", strconv.Quote(line))
		case len(f) < 4 || strings.HasPrefix(f[0], "#"):
			return bad("hba["+strconv.Itoa(i)+"]", "a pg_hba.conf rule: type, database, user, [address,] method", strconv.Quote(line))
		}
	}
	binKey := "version"
	if c.BinDir == "" {
		c.BinDir = fmt.Sprintf("/usr/lib/postgresql/%d/bin", c.Version)
	} else {
		binKey = "bin_dir"
		if !filepath.IsAbs(c.BinDir) {
			return bad("bin_dir", "must be an absolute path", c.BinDir)
		}
	}
	for _, b := range binaries {
		if fi, err := os.Stat(filepath.Join(c.BinDir, b)); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return bad(binKey, fmt.Sprintf("PostgreSQL %d's %s is not in %s: install the Debian package postgresql-%d (apt-get install postgresql-%d) or set bin_dir to the directory holding initdb, postgres, pg_basebackup, pg_rewind and pg_controldata", c.Version, b, c.BinDir, c.Version, c.Version), c.BinDir)
		}
	}
	if c.Watchdog != "" {
		if !filepath.IsAbs(c.Watchdog) {
			return bad("watchdog", "the absolute path of a watchdog device (/dev/watchdog)", c.Watchdog)
		}
		if _, err := os.Stat(c.Watchdog); err != nil {
			return bad("watchdog", fmt.Sprintf("no such device (load a watchdog driver, e.g. softdog): %v", err), c.Watchdog)
		}
	}
	return nil
}

func (c *Config) validateUser(bad func(key, rule, value string) error) error {
	root := os.Geteuid() == 0
	if c.RunAs == "" {
		if root {
			c.RunAs = "postgres"
		} else {
			u, err := user.Current()
			if err != nil {
				return bad("run_as", fmt.Sprintf("cannot tell the node's own user: %v; set run_as", err), "")
			}
			c.RunAs = u.Username
		}
	}
	u, err := user.Lookup(c.RunAs)
	if err != nil {
		return bad("run_as", "no such OS user: create it (the Debian package postgresql-common creates \"postgres\")", c.RunAs)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		return bad("run_as", "the user's uid/gid are not numbers", c.RunAs)
	}
	if uid == 0 {
		return bad("run_as", "PostgreSQL refuses to run as root: name an unprivileged user", c.RunAs)
	}
	if !root && int(uid) != os.Geteuid() {
		return bad("run_as", "the node is not root, so PostgreSQL can only run as the node's own user", c.RunAs)
	}
	c.uid, c.gid = uint32(uid), uint32(gid)
	c.groups = nil
	if ids, err := u.GroupIds(); err == nil {
		for _, g := range ids {
			if n, err := strconv.ParseUint(g, 10, 32); err == nil {
				c.groups = append(c.groups, uint32(n))
			}
		}
	}
	return nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// runDir is understudy's directory beside the data directory: the Unix
// socket, the generated pg_hba.conf, the passfile and the server log. A
// sibling, so that a base backup or pg_rewind never carries it, and mode
// 0700 owned by RunAs, so that only RunAs and root reach the socket.
func runDir(dataDir string) string { return dataDir + ".understudy" }
