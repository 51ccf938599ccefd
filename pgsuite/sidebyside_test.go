package pgsuite

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The side-by-side benchmark: understudy and Patroni, each driving two
// fresh PostgreSQL 15 instances on loopback, suffer the same kill (-9 of
// the manager — `understudy serve` or `patroni` — its children, and the
// postmaster's process group, at one instant, at a random phase) and are
// judged by the same writer (a counter committed every ~10 ms through
// target_session_attrs=read-write, reconnecting on failure): kill → first
// commit the survivor acknowledges, and acknowledged commits missing from
// it. docs/benchmarks.md ("Side by side with Patroni") has the figures.
const (
	envSideBySide      = "UNDERSTUDY_SIDEBYSIDE"       // 1: run BenchmarkSideBySide (about 30 minutes)
	envSideBySideKills = "UNDERSTUDY_SIDEBYSIDE_KILLS" // kills per profile (default 15)

	patroniBin = "/usr/bin/patroni"
	etcdBin    = "/usr/bin/etcd"
)

// sbsProfile is one row of the comparison.
type sbsProfile struct {
	name     string // the sub-benchmark's name
	patroni  bool
	sync     bool
	settings string // for the table
	// understudy: the pair's rules, one "key: value" a line (empty:
	// understudy's own defaults).
	rules string
	// Patroni's bootstrap DCS timing, in seconds.
	ttl, loopWait, retryTimeout int
}

const fastRules = "heartbeat_timeout: 250ms\nfailure_threshold: 2\nsuccess_threshold: 2\nfailover_timeout: 1200ms\nfence_grace: 450ms\n"

var sbsProfiles = []sbsProfile{
	{name: "understudy-defaults", settings: "heartbeat 1s, failure_threshold 2, failover_timeout 5s, fence_grace 2s (understudy's defaults: not written)"},
	{name: "patroni-defaults", patroni: true, ttl: 30, loopWait: 10, retryTimeout: 10, settings: "ttl 30, loop_wait 10, retry_timeout 10"},
	{name: "understudy-250ms", rules: fastRules, settings: "heartbeat 250ms, thresholds 2/2, failover_timeout 1200ms, fence_grace 450ms"},
	{name: "patroni-fast", patroni: true, ttl: 10, loopWait: 2, retryTimeout: 3, settings: "ttl 10, loop_wait 2, retry_timeout 3"},
	{name: "understudy-250ms-sync", sync: true, rules: fastRules, settings: `250ms profile, synchronous: "on"`},
	{name: "patroni-fast-sync", patroni: true, sync: true, ttl: 10, loopWait: 2, retryTimeout: 3, settings: "fast profile, synchronous_mode: true"},
}

// sbsResult is what one profile measured.
type sbsResult struct {
	profile sbsProfile
	firsts  []float64      // kill → first commit on the survivor, ms, in kill order
	lost    map[int64]bool // acknowledged before a kill, missing on the survivor
	acked   int            // acknowledged before the last kill
	both    int            // monitor polls that found both sites accepting writes
}

func (r sbsResult) stats() (median, lo, hi float64) {
	s := slices.Clone(r.firsts)
	slices.Sort(s)
	n := len(s)
	if n == 0 {
		return 0, 0, 0
	}
	median = s[n/2]
	if n%2 == 0 {
		median = (s[n/2-1] + s[n/2]) / 2
	}
	return median, s[0], s[n-1]
}

// BenchmarkSideBySide runs every profile's kills (15 by default) one
// profile after the other and prints the table. It skips unless
// UNDERSTUDY_SIDEBYSIDE=1: scripts/bench-sidebyside.sh (make
// bench-sidebyside) installs Patroni and etcd and runs it.
func BenchmarkSideBySide(b *testing.B) {
	if os.Getenv(envSideBySide) != "1" {
		b.Skipf("the side-by-side benchmark with Patroni takes about 30 minutes: run `make bench-sidebyside` (scripts/bench-sidebyside.sh), or set %s=1 (and %s, default 15)", envSideBySide, envSideBySideKills)
	}
	kills := 15
	if v := os.Getenv(envSideBySideKills); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("%s=%q: want a number of kills, at least 1", envSideBySideKills, v)
		}
		kills = n
	}
	var results []sbsResult
	for _, p := range sbsProfiles {
		b.Run(p.name, func(b *testing.B) {
			r := runSideBySide(b, p, kills)
			results = append(results, r)
			med, lo, hi := r.stats()
			b.ReportMetric(med, "median-first-write-ms")
			b.ReportMetric(hi, "max-first-write-ms")
			b.ReportMetric(float64(len(r.lost)), "lost-commits")
			fmt.Printf("SIDEBYSIDE profile=%s kills=%d first_write_ms_median=%.0f min=%.0f max=%.0f lost=%d acked_before_last_kill=%d both_writable_polls=%d each=%s\n",
				p.name, len(r.firsts), med, lo, hi, len(r.lost), r.acked, r.both, joinFloats(r.firsts))
		})
	}
	fmt.Print(sideBySideTable(results))
}

// sideBySideTable is the run's table in Markdown, then the ratios of the
// medians Patroni/understudy for the profiles that both ran.
func sideBySideTable(rs []sbsResult) string {
	var b strings.Builder
	b.WriteString("SIDEBYSIDE-TABLE-BEGIN\n")
	b.WriteString("| profile | settings | kills | first write ms: median | min–max | lost acknowledged commits (of all before the last kill) | both writable (polls) |\n|---|---|---|---|---|---|---|\n")
	med := map[string]float64{}
	for _, r := range rs {
		m, lo, hi := r.stats()
		med[r.profile.name] = m
		fmt.Fprintf(&b, "| %s | %s | %d | **%.0f** | %.0f–%.0f | %d of %d | %d |\n", r.profile.name, r.profile.settings, len(r.firsts), m, lo, hi, len(r.lost), r.acked, r.both)
	}
	b.WriteString("\n| ratio of medians | Patroni/understudy |\n|---|---|\n")
	for _, pair := range [][2]string{
		{"patroni-defaults", "understudy-defaults"},
		{"patroni-fast", "understudy-250ms"},
		{"patroni-fast-sync", "understudy-250ms-sync"},
	} {
		p, okP := med[pair[0]]
		u, okU := med[pair[1]]
		if okP && okU && u > 0 {
			fmt.Fprintf(&b, "| %s / %s | **%.1f×** |\n", pair[0], pair[1], p/u)
		}
	}
	b.WriteString("SIDEBYSIDE-TABLE-END\n")
	return b.String()
}

// sbsPair is a running pair of either kind, site-a leading.
type sbsPair struct {
	c *cluster
	// restart starts site i's manager again after its kill.
	restart func(i int)
	// inSync waits until the leader's commits wait for the other site and
	// the manager would promote that site.
	inSync func(leader int, since time.Time)
	// healthy, if set, is the manager's own word that the standby is a
	// healthy replica (Patroni's GET /replica).
	healthy func(standby int) bool
}

// waitRejoined waits until the pair is whole again: the standby streams
// (its own pg_stat_wal_receiver), the leader sees it streaming
// (pg_stat_replication) and its manager calls it healthy, three checks in
// a row half a second apart — a restarted standby may stream for an
// instant before its manager stops it to rewind it.
func (pr *sbsPair) waitRejoined(b *testing.B, leader int, within time.Duration) {
	b.Helper()
	c := pr.c
	standby := 1 - leader
	deadline := time.Now().Add(within)
	ok := 0
	var last string
	for ok < 3 {
		st, err := c.state(standby)
		rep, err2 := c.syncState(leader)
		healthy := pr.healthy == nil || pr.healthy(standby)
		if st == stStreaming && rep != "" && healthy {
			ok++
		} else {
			ok = 0
			last = fmt.Sprintf("%s %s (%v); %s's pg_stat_replication %q (%v); manager says healthy: %v", c.sites[standby].name, st, err, c.sites[leader].name, rep, err2, healthy)
		}
		if time.Now().After(deadline) {
			b.Fatalf("within %v the pair is not whole again: %s", within, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// runSideBySide kills the leader `kills` times, alternating sites.
func runSideBySide(b *testing.B, p sbsProfile, kills int) sbsResult {
	var pr *sbsPair
	if p.patroni {
		pr = startPatroniPair(b, p)
	} else {
		pr = startUnderstudyPair(b, p)
	}
	c := pr.c
	m := c.startMonitor()
	w := c.startWriter(0)
	r := sbsResult{profile: p, lost: map[int64]bool{}}
	leader := 0
	pr.waitRejoined(b, leader, 180*time.Second)
	if p.sync {
		pr.inSync(leader, time.Time{})
	}
	for k := 1; k <= kills; k++ {
		other := 1 - leader
		if _, ok := w.waitAckBy(leader, time.Now(), 30*time.Second); !ok {
			b.Fatalf("%s kill %d: %s acknowledged no commit within 30s before the kill (%v)", p.name, k, c.sites[leader].name, w)
		}
		// The power cut at a random phase of the managers' loops.
		time.Sleep(rand.N(time.Second))
		killAt := time.Now()
		c.kill9(leader)
		at, ok := w.waitAckBy(other, killAt, 150*time.Second)
		if !ok {
			b.Fatalf("%s kill %d (of %s): %s acknowledged no commit within 150s (%v); %s:%s", p.name, k, c.sites[leader].name, c.sites[other].name, w,
				c.sites[other].name, m.timeline(other, killAt))
		}
		first := ms(at.Sub(killAt))
		r.firsts = append(r.firsts, first)
		lost, checked, err := w.lost(other, func(a ack) bool { return a.at.Before(killAt) })
		if err != nil {
			b.Fatalf("%s kill %d: read %s's table: %v", p.name, k, c.sites[other].name, err)
		}
		for _, n := range lost {
			r.lost[n] = true
		}
		r.acked = checked
		fmt.Printf("SIDEBYSIDE kill profile=%s k=%d killed=%s first_write_ms=%.0f lost=%d of %d%s\n", p.name, k, c.sites[leader].name, first, len(lost), checked, sample(lost))
		restartAt := time.Now()
		pr.restart(leader)
		if _, ok := m.waitFor(leader, stStreaming, restartAt, 180*time.Second); !ok {
			b.Fatalf("%s kill %d: the restarted %s does not stream from %s within 180s:%s", p.name, k, c.sites[leader].name, c.sites[other].name, m.timeline(leader, restartAt))
		}
		pr.waitRejoined(b, other, 180*time.Second)
		leader = other
		if p.sync {
			pr.inSync(leader, killAt)
		}
	}
	r.both = len(m.bothWritable())
	return r
}

// startUnderstudyPair is pgsuite's pair (a witness holding NATS, a node
// per site) with the profile's rules, failback manual so that the kills
// alternate between the sites.
func startUnderstudyPair(b *testing.B, p sbsProfile) *sbsPair {
	sync := "off"
	if p.sync {
		sync = "on"
	}
	c := newCluster(b, pairOptions{synchronous: sync, failback: "manual"})
	for i := range c.sites {
		if err := os.WriteFile(c.sites[i].config, []byte(withRules(c.nodeFile(i), p.rules)), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	c.start()
	return &sbsPair{c: c, restart: c.startNode, inSync: func(leader int, since time.Time) { c.waitInSync(leader, since, 120*time.Second) }}
}

// withRules replaces the suite's timing rules in a node file by rules
// (one "key: value" a line; none: understudy's defaults).
func withRules(file, rules string) string {
	var out []string
	for _, line := range strings.SplitAfter(file, "\n") {
		key, _, _ := strings.Cut(strings.TrimSpace(line), ":")
		switch key {
		case "heartbeat_timeout", "failure_threshold", "success_threshold", "failover_timeout", "fence_grace":
			continue
		}
		out = append(out, line)
		if strings.TrimSpace(line) == "replica: site-b" {
			for _, r := range strings.SplitAfter(rules, "\n") {
				if r != "" {
					out = append(out, "    "+r)
				}
			}
		}
	}
	return strings.Join(out, "")
}

// startPatroniPair starts one etcd and a Patroni per site (as the OS user
// postgres: Patroni refuses root), site-a first so that it bootstraps and
// leads, then site-b, which clones it; it returns once site-b streams.
func startPatroniPair(b *testing.B, p sbsProfile) *sbsPair {
	requirePostgres(b)
	for _, bin := range []string{patroniBin, etcdBin} {
		if _, err := os.Stat(bin); err != nil {
			b.Fatalf("%s is missing: run scripts/bench-sidebyside.sh (it installs the Debian packages patroni and etcd-server)", bin)
		}
	}
	root, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", rootPrefix, os.Getpid()))
	if err != nil {
		b.Fatal(err)
	}
	if err := os.Chmod(root, 0o755); err != nil {
		b.Fatal(err)
	}
	pgUser, err := lookupUser("postgres")
	if err != nil {
		b.Fatal(err)
	}
	sync := "off"
	if p.sync {
		sync = "on"
	}
	// The cluster's helpers (monitor, writer, kill9, close) need only its
	// sites; the etcd is its "witness", killed after the sites.
	c := &cluster{t: b, root: root, pgUser: pgUser, opts: pairOptions{synchronous: sync, failback: "auto"}}
	b.Cleanup(c.close)
	ports := freePorts(b, 6) // PostgreSQL a, b; REST API a, b; etcd client, peer
	edir := filepath.Join(root, "etcd")
	if err := os.MkdirAll(edir, 0o755); err != nil {
		b.Fatal(err)
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", ports[4])
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[5])
	c.witness, err = startProc("etcd", edir, filepath.Join(edir, "etcd.log"), etcdBin, "--name", "sbs", "--data-dir", filepath.Join(edir, "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client, "--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer, "--initial-cluster", "sbs="+peer, "--initial-cluster-state", "new")
	if err != nil {
		b.Fatal(err)
	}
	if err := waitHTTP(client+"/health", 30*time.Second); err != nil {
		b.Fatalf("etcd did not get healthy: %v\n%s", err, tailFile(filepath.Join(edir, "etcd.log"), 20))
	}
	var rest [2]int
	for i, name := range siteNames {
		dir := filepath.Join(root, strings.TrimPrefix(name, "site-"))
		s := &pgSite{idx: i, name: name, dir: dir, pgdata: filepath.Join(dir, "pgdata"), sock: filepath.Join(dir, "sock"), port: ports[i],
			config: filepath.Join(dir, "patroni.yaml"), log: filepath.Join(dir, "patroni.log")}
		c.sites[i] = s
		rest[i] = ports[2+i]
		for _, d := range []string{s.dir, s.sock} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				b.Fatal(err)
			}
			if err := os.Chown(d, int(pgUser.uid), int(pgUser.gid)); err != nil {
				b.Fatal(err)
			}
		}
		if err := os.WriteFile(s.config, []byte(patroniFile(p, s, rest[i], ports[4])), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	start := func(i int) {
		b.Helper()
		s := c.sites[i]
		off, _ := fileSize(s.log)
		pr, err := startProcAs(s.name, s.dir, s.log, pgUser, patroniBin, s.config)
		if err != nil {
			b.Fatal(err)
		}
		s.node, s.logOffset = pr, off
	}
	start(0)
	deadline := time.Now().Add(120 * time.Second)
	for {
		if w, _ := c.writable(0); w {
			break
		}
		if time.Now().After(deadline) || !c.sites[0].node.running() {
			b.Fatalf("Patroni on site-a did not bootstrap a writable PostgreSQL within 120s\n%s", tailFile(c.sites[0].log, 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
	start(1)
	c.waitHealthy(0, 180*time.Second)
	inSync := func(leader int, _ time.Time) {
		b.Helper()
		url := fmt.Sprintf("http://127.0.0.1:%d/sync", rest[1-leader])
		deadline := time.Now().Add(120 * time.Second)
		var st string
		var code int
		for time.Now().Before(deadline) {
			st, _ = c.syncState(leader)
			code = httpStatus(url)
			// pg_stat_replication says sync, and the DCS names the standby
			// in /sync: only then may Patroni promote it.
			if st == "sync" && code == http.StatusOK {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		b.Fatalf("within 120s: %s is not in sync with %s: sync_state %q, GET %s: %d", c.sites[leader].name, c.sites[1-leader].name, st, url, code)
	}
	healthy := func(standby int) bool {
		return httpStatus(fmt.Sprintf("http://127.0.0.1:%d/replica", rest[standby])) == http.StatusOK
	}
	return &sbsPair{c: c, restart: start, inSync: inSync, healthy: healthy}
}

// patroniFile is site s's Patroni configuration. The PostgreSQL
// parameters are those understudy passes its servers (pgsuite's pairs),
// so that both drive the same kind of instance. The watchdog is off:
// there is no /dev/watchdog here, and understudy's keeper plays no part
// in the comparison either.
func patroniFile(p sbsProfile, s *pgSite, restPort, etcdPort int) string {
	return fmt.Sprintf(`scope: sbs
namespace: /sbs/
name: %[1]s
log:
  level: INFO
restapi:
  listen: 127.0.0.1:%[2]d
  connect_address: 127.0.0.1:%[2]d
etcd3:
  hosts: 127.0.0.1:%[3]d
bootstrap:
  dcs:
    ttl: %[4]d
    loop_wait: %[5]d
    retry_timeout: %[6]d
    maximum_lag_on_failover: 1048576
    synchronous_mode: %[7]v
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_level: replica
        hot_standby: "on"
        wal_log_hints: "on"
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
        max_slot_wal_keep_size: 4GB
        wal_retrieve_retry_interval: 100ms
  initdb:
    - encoding: UTF8
postgresql:
  listen: 127.0.0.1:%[8]d
  connect_address: 127.0.0.1:%[8]d
  data_dir: %[9]s
  bin_dir: %[10]s
  pgpass: %[11]s
  remove_data_directory_on_rewind_failure: true
  remove_data_directory_on_diverged_timelines: true
  authentication:
    superuser:
      username: postgres
      password: sbs-secret
    replication:
      username: replicator
      password: sbs-secret
  parameters:
    unix_socket_directories: %[12]s
  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication replicator 127.0.0.1/32 trust
watchdog:
  mode: "off"
`, s.name, restPort, etcdPort, p.ttl, p.loopWait, p.retryTimeout, p.sync,
		s.port, s.pgdata, pgBinDir(), filepath.Join(s.dir, "pgpass"), s.sock)
}

// startProcAs is startProc as the OS user u, with a minimal environment.
func startProcAs(name, dir, logPath string, u osUser, argv ...string) (*proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(f, "---- pgsuite %s: start %s\n", time.Now().UTC().Format(time.RFC3339Nano), strings.Join(argv, " "))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8", "LC_ALL=C.UTF-8", "HOME=" + dir}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid}}
	if err := spawn(cmd); err != nil {
		f.Close()
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), log: f}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

// waitHTTP waits until GET url answers 200.
func waitHTTP(url string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		code := httpStatus(url)
		if code == http.StatusOK {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("GET %s: status %d after %v", url, code, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// httpStatus is GET url's status code (0: no answer within a second).
func httpStatus(url string) int {
	cl := http.Client{Timeout: time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
