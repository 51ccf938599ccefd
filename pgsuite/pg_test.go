package pgsuite

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The tests run in parallel (go test's -parallel, GOMAXPROCS by default:
// two at a time on two cores). The twenty kills come first: they are the
// long one, and the others fill the second lane meanwhile.

// syncKills is how many times TestSynchronousKills kills the primary.
const syncKills = 20

// TestSynchronousKills: synchronous on, a writer running, the current
// primary's node killed -9 twenty times, alternating between the sites
// (failback manual); before each kill the pair is whole again and in sync.
// No acknowledged commit may be lost.
func TestSynchronousKills(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pairOptions{synchronous: "on", failback: "manual"})
	c.start()
	m := c.startMonitor()
	w := c.startWriter(0)
	leader := 0
	c.waitInSync(leader, time.Time{}, 60*time.Second)
	var firsts []float64
	totalLost := 0
	for k := 1; k <= syncKills; k++ {
		other := 1 - leader
		// Commits made while in sync, before the kill.
		inSync := time.Now()
		time.Sleep(300 * time.Millisecond)
		if _, ok := w.waitAckBy(leader, inSync, 20*time.Second); !ok {
			t.Fatalf("kill %d: %s acknowledged no commit within 20s before the kill (%v)", k, c.sites[leader].name, w)
		}
		killAt := time.Now()
		c.kill9(leader)
		at, ok := w.waitAckBy(other, killAt, 40*time.Second)
		if !ok {
			t.Fatalf("kill %d (of %s): %s acknowledged no commit within 40s (%v); %s:%s; %s:%s", k, c.sites[leader].name, c.sites[other].name, w,
				c.sites[other].name, m.timeline(other, killAt), c.sites[leader].name, m.timeline(leader, killAt))
		}
		firsts = append(firsts, ms(at.Sub(killAt)))
		lost, checked, err := w.lost(other, func(a ack) bool { return a.at.Before(killAt) })
		if err != nil {
			t.Fatalf("kill %d: read %s's table: %v", k, c.sites[other].name, err)
		}
		totalLost += len(lost)
		if len(lost) > 0 {
			t.Errorf("kill %d (of %s): %d of %d commits acknowledged before the kill are missing on %s, the new primary (synchronous: on):%s",
				k, c.sites[leader].name, len(lost), checked, c.sites[other].name, sample(lost))
		}
		t.Logf("kill %d: %s killed, %s first commit after %.0f ms, lost %d of %d", k, c.sites[leader].name, c.sites[other].name, firsts[len(firsts)-1], len(lost), checked)
		restartAt := time.Now()
		c.startNode(leader)
		if _, ok := m.waitFor(leader, stStreaming, restartAt, 90*time.Second); !ok {
			t.Fatalf("kill %d: the restarted %s does not stream from %s within 90s:%s", k, c.sites[leader].name, c.sites[other].name, m.timeline(leader, restartAt))
		}
		leader = other
		c.waitInSync(leader, killAt, 60*time.Second)
	}
	if both := m.bothWritable(); len(both) > 0 {
		t.Errorf("%d polls found both sites accepting writes, the first at %s", len(both), both[0].Format(time.RFC3339Nano))
	}
	// Over the whole run: every acknowledged commit is on the last primary.
	final, checked, err := w.lost(leader, func(a ack) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	if len(final) > 0 {
		t.Errorf("%d of %d acknowledged commits are missing on the last primary %s:%s", len(final), checked, c.sites[leader].name, sample(final))
	}
	sorted := slices.Clone(firsts)
	slices.Sort(sorted)
	t.Logf("FIGURE sync-kills kills=%d first_write_ms_median=%.0f first_write_ms_max=%.0f first_write_ms_min=%.0f lost_total=%d lost_at_end=%d acked=%d polls=%d",
		len(firsts), sorted[len(sorted)/2], sorted[len(sorted)-1], sorted[0], totalLost, len(final), checked, m.pollCount())
	t.Logf("FIGURE sync-kills first_write_ms_each=%s", joinFloats(firsts))
}

// waitInSync waits until the leader's PostgreSQL makes commits wait for the
// other site (pg_stat_replication says sync) and the leader's member says
// so in the register: its latest failover.replication_mode_changed since
// since is synchronous.
func (c *cluster) waitInSync(leader int, since time.Time, within time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	var st, mode string
	for time.Now().Before(deadline) {
		st, _ = c.syncState(leader)
		mode = "none"
		for _, e := range c.events(leader, 0) {
			if e.typ == "failover.replication_mode_changed" && !e.at.Before(since) {
				mode = e.detail
			}
		}
		if st == "sync" && strings.Contains(mode, "Synchronous:true") {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("within %v: %s is not in sync with %s: pg_stat_replication sync_state %q, latest replication_mode_changed %s",
		within, c.sites[leader].name, c.sites[1-leader].name, st, mode)
}

func joinFloats(fs []float64) string {
	var s []string
	for _, f := range fs {
		s = append(s, strconv.FormatFloat(f, 'f', 0, 64))
	}
	return strings.Join(s, ",")
}

// TestBootstrap: from empty directories site-a initdb's and serves, site-b
// clones it and streams; a row written on a appears on b.
func TestBootstrap(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pairOptions{})
	start := time.Now()
	c.start()
	healthy := time.Since(start)
	if err := c.exec(0, "CREATE TABLE pgsuite_marker (v text)"); err != nil {
		t.Fatalf("write on site-a: %v", err)
	}
	wrote := time.Now()
	if err := c.exec(0, "INSERT INTO pgsuite_marker VALUES ('from site-a')"); err != nil {
		t.Fatalf("write on site-a: %v", err)
	}
	var seen time.Duration
	for {
		conn, err := c.connectSite(t.Context(), 1, time.Second, false)
		if err == nil {
			var n int
			err = conn.QueryRow(t.Context(), "SELECT count(*) FROM pgsuite_marker WHERE v = 'from site-a'").Scan(&n)
			_ = conn.Close(t.Context())
			if err == nil && n == 1 {
				seen = time.Since(wrote)
				break
			}
		}
		if time.Since(wrote) > 10*time.Second {
			t.Fatalf("the row written on site-a is not on site-b after 10s (last error %v)", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i, want := range []siteState{stWritable, stStreaming} {
		if st, err := c.state(i); st != want {
			t.Errorf("%s is %s (%v), want %s", c.sites[i].name, st, err, want)
		}
	}
	t.Logf("FIGURE bootstrap healthy_ms=%.0f replicated_ms=%.0f", ms(healthy), ms(seen))
}

// TestKillPrimary: kill -9 of the primary's node, keeper and PostgreSQL;
// site-b serves. Asynchronous (the default): lost commits are reported.
func TestKillPrimary(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pairOptions{})
	c.start()
	m := c.startMonitor()
	w := c.startWriter(0)
	if _, ok := w.waitAckBy(0, time.Now(), 10*time.Second); !ok {
		t.Fatal("the writer got no commit acknowledged by site-a")
	}
	time.Sleep(time.Second)
	killAt := time.Now()
	c.kill9(0)
	at, ok := w.waitAckBy(1, killAt, 30*time.Second)
	if !ok {
		t.Fatalf("site-b acknowledged no commit within 30s of the kill (%v); site-b's states:%s", w, m.timeline(1, killAt))
	}
	bw, ok := m.waitFor(1, stWritable, killAt, 10*time.Second)
	if !ok {
		t.Errorf("the writer's commits were acknowledged by site-b, but the monitor never saw it accept writes:%s", m.timeline(1, killAt))
	}
	lost, checked, err := w.lost(1, func(a ack) bool { return a.at.Before(killAt) })
	if err != nil {
		t.Fatal(err)
	}
	if both := m.bothWritable(); len(both) > 0 {
		t.Errorf("%d polls found both sites accepting writes", len(both))
	}
	bound := failoverTimeout + 2*heartbeat + 3*time.Second
	if d := at.Sub(killAt); d > bound {
		t.Errorf("first commit on site-b %.0f ms after the kill; want within %v", ms(d), bound)
	}
	t.Logf("FIGURE kill9-primary first_write_ms=%.0f b_writable_ms=%.0f lost=%d acked_before_kill=%d%s",
		ms(at.Sub(killAt)), ms(bw.Sub(killAt)), len(lost), checked, sample(lost))
}

// TestKillNodeOnly: kill -9 of the primary's node process alone. Its
// keeper sees the node's pipe close and stops PostgreSQL, well within
// fence_grace; both sites are polled every 20 ms from before the kill
// until site-b serves, and never both accept writes.
func TestKillNodeOnly(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pairOptions{})
	c.start()
	m := c.startMonitor()
	w := c.startWriter(0)
	if _, ok := w.waitAckBy(0, time.Now(), 10*time.Second); !ok {
		t.Fatal("the writer got no commit acknowledged by site-a")
	}
	if _, ok := m.waitFor(0, stWritable, time.Now(), 5*time.Second); !ok {
		t.Fatal("the monitor does not see site-a accepting writes")
	}
	pm := postmasterPID(c.sites[0].pgdata)
	if pm == 0 || !alive(pm) {
		t.Fatalf("site-a's postmaster (%d) does not run", pm)
	}
	killAt := time.Now()
	c.killNodeOnly(0)
	var gone, refused time.Duration
	for gone == 0 || refused == 0 {
		d := time.Since(killAt)
		if gone == 0 && !alive(pm) {
			gone = d
		}
		if refused == 0 && portRefuses(c.sites[0].port) {
			refused = d
		}
		if d > 10*time.Second {
			t.Fatalf("10s after the node's kill: postmaster gone after %v, port refusing after %v (0: not yet)", gone, refused)
		}
		time.Sleep(2 * time.Millisecond)
	}
	bw, ok := m.waitFor(1, stWritable, killAt, 30*time.Second)
	if !ok {
		t.Fatalf("site-b does not accept writes within 30s:%s", m.timeline(1, killAt))
	}
	polls := m.pollCount()
	if gone > fenceGrace || refused > fenceGrace {
		t.Errorf("site-a's PostgreSQL stopped %.0f ms (port refused %.0f ms) after its node was killed; want within fence_grace %v", ms(gone), ms(refused), fenceGrace)
	}
	if both := m.bothWritable(); len(both) > 0 {
		t.Errorf("%d of %d polls found both sites accepting writes", len(both), polls)
	}
	if bw.Before(killAt.Add(gone)) {
		t.Errorf("site-b accepted writes %.0f ms after the kill, before site-a's postmaster was gone (%.0f ms)", ms(bw.Sub(killAt)), ms(gone))
	}
	t.Logf("FIGURE kill-node-only postmaster_gone_ms=%.0f port_refused_ms=%.0f b_writable_ms=%.0f polls=%d both_writable=%d",
		ms(gone), ms(refused), ms(bw.Sub(killAt)), polls, len(m.bothWritable()))
}

// TestPausedNode: SIGSTOP of the primary's node for longer than
// fence_grace; the keeper, no longer petted, stops PostgreSQL; site-b
// takes over. After SIGCONT the old primary's member finds it lost the
// register, and its database is rewound and streams from site-b.
func TestPausedNode(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pairOptions{})
	c.start()
	m := c.startMonitor()
	w := c.startWriter(0)
	if _, ok := w.waitAckBy(0, time.Now(), 10*time.Second); !ok {
		t.Fatal("the writer got no commit acknowledged by site-a")
	}
	pm := postmasterPID(c.sites[0].pgdata)
	node := c.sites[0].node.pid()
	stopAt := time.Now()
	_ = syscall.Kill(node, syscall.SIGSTOP)
	resumed := false
	defer func() {
		if !resumed {
			_ = syscall.Kill(node, syscall.SIGCONT)
		}
	}()
	var fenced time.Duration
	for alive(pm) {
		if time.Since(stopAt) > 10*time.Second {
			_ = syscall.Kill(node, syscall.SIGCONT)
			t.Fatalf("site-a's postmaster %d still runs 10s after its node was stopped (fence_grace %v)", pm, fenceGrace)
		}
		time.Sleep(2 * time.Millisecond)
	}
	fenced = time.Since(stopAt)
	bw, ok := m.waitFor(1, stWritable, stopAt, 30*time.Second)
	if !ok {
		_ = syscall.Kill(node, syscall.SIGCONT)
		t.Fatalf("site-b does not accept writes within 30s of the SIGSTOP:%s", m.timeline(1, stopAt))
	}
	firstB, _ := w.waitAckBy(1, stopAt, 10*time.Second)
	time.Sleep(time.Second)
	contAt := time.Now()
	_ = syscall.Kill(node, syscall.SIGCONT)
	resumed = true
	lostEv, ok := c.waitEvent(0, "failover.leadership_lost", contAt, nil, 20*time.Second)
	if !ok {
		t.Errorf("site-a's member logged no failover.leadership_lost within 20s of SIGCONT")
	}
	st, ok := m.waitFor(0, stStreaming, contAt, 90*time.Second)
	if !ok {
		t.Fatalf("site-a does not stream from site-b within 90s of SIGCONT:%s", m.timeline(0, contAt))
	}
	if _, ok := c.logHas(0, regexp.MustCompile(`postgres: pg_rewind done`), contAt); !ok {
		t.Errorf("site-a streams again without a pg_rewind in its log since SIGCONT")
	}
	if both := m.bothWritable(); len(both) > 0 {
		t.Errorf("%d polls found both sites accepting writes", len(both))
	}
	if fenced > fenceGrace+500*time.Millisecond {
		t.Errorf("the keeper stopped site-a's PostgreSQL %.0f ms after the node stopped; want about fence_grace (%v)", ms(fenced), fenceGrace)
	}
	if bw.Before(stopAt.Add(fenced)) {
		t.Errorf("site-b accepted writes (%.0f ms) before site-a's PostgreSQL was stopped (%.0f ms)", ms(bw.Sub(stopAt)), ms(fenced))
	}
	lostAfter := -1.0
	if !lostEv.at.IsZero() {
		lostAfter = ms(lostEv.at.Sub(contAt))
	}
	t.Logf("FIGURE sigstop fence_ms=%.0f b_writable_ms=%.0f b_first_write_ms=%.0f leadership_lost_after_cont_ms=%.0f streaming_after_cont_ms=%.0f",
		ms(fenced), ms(bw.Sub(stopAt)), ms(firstB.Sub(stopAt)), lostAfter, ms(st.Sub(contAt)))
}

// TestLaggingReplica: site-b replicates through a proxy that limits it to
// 200 KiB/s; 20 MB written on site-a leave it far more than
// maximum_lag_on_failover (1 MiB) behind. After kill -9 of site-a's node,
// site-b must not promote (3 × failover_timeout observed) and says why in
// a failover.promotion_withheld event.
func TestLaggingReplica(t *testing.T) {
	t.Parallel()
	var prox *throttle
	c := newCluster(t, pairOptions{peerOf: func(c *cluster, site int) string {
		if site != 1 {
			return ""
		}
		prox = newThrottle(t, "127.0.0.1:"+strconv.Itoa(c.sites[0].port), 200<<10)
		return prox.addr()
	}})
	c.start()
	m := c.startMonitor()
	prox.limited.Store(true)
	if err := c.exec(0, "CREATE TABLE pgsuite_big (n int, pad text)"); err != nil {
		t.Fatal(err)
	}
	if err := c.exec(0, "INSERT INTO pgsuite_big SELECT g, repeat(md5(g::text), 32) FROM generate_series(1, 20000) g"); err != nil {
		t.Fatal(err)
	}
	// Let site-a publish its flush position and site-b its own.
	time.Sleep(4 * heartbeat)
	lag, err := c.replicaLag()
	if err != nil {
		t.Fatal(err)
	}
	if lag < 4<<20 {
		t.Fatalf("site-b lags only %d bytes behind site-a: the setup failed to make it lag", lag)
	}
	killAt := time.Now()
	c.kill9(0)
	watch := 3*failoverTimeout + time.Second
	time.Sleep(watch)
	if m.seen(1, stWritable, killAt, time.Now()) {
		at, _ := m.firstSince(1, stWritable, killAt)
		t.Errorf("site-b, %d bytes behind, accepted writes %.0f ms after site-a's kill (maximum_lag_on_failover 1MiB)", lag, ms(at.Sub(killAt)))
	}
	ev, ok := c.waitEvent(1, "failover.promotion_withheld", killAt, nil, time.Second)
	if !ok {
		t.Fatalf("site-b logged no failover.promotion_withheld after site-a's kill; its events: %s", eventTypes(c.events(1, 0), killAt))
	}
	re := regexp.MustCompile(`Lag:(\d+) Limit:(\d+)`)
	mm := re.FindStringSubmatch(ev.detail)
	if mm == nil {
		t.Fatalf("promotion_withheld without the numbers: %s", ev.detail)
	}
	evLag, _ := strconv.ParseUint(mm[1], 10, 64)
	limit, _ := strconv.ParseUint(mm[2], 10, 64)
	if limit != 1<<20 || evLag <= limit {
		t.Errorf("promotion_withheld says lag %d, limit %d; want a lag over the limit 1048576: %s", evLag, limit, ev.detail)
	}
	reason := regexp.MustCompile(`Reason:(.*?) LeaderFlush:`).FindStringSubmatch(ev.detail)
	why := ev.detail
	if reason != nil {
		why = reason[1]
	}
	t.Logf("FIGURE lagging-replica lag_bytes_at_kill=%d withheld_lag=%d withheld_limit=%d withheld_after_ms=%.0f watched_ms=%.0f b_writable=%v reason=%q",
		lag, evLag, limit, ms(ev.at.Sub(killAt)), ms(watch), m.seen(1, stWritable, killAt, time.Now()), why)
}

// replicaLag is site-a's current WAL position minus what site-b received.
func (c *cluster) replicaLag() (uint64, error) {
	read := func(i int, q string) (uint64, error) {
		conn, err := c.connectSite(c.t.Context(), i, 2*time.Second, false)
		if err != nil {
			return 0, err
		}
		defer conn.Close(c.t.Context())
		var n uint64
		err = conn.QueryRow(c.t.Context(), q).Scan(&n)
		return n, err
	}
	a, err := read(0, "SELECT (pg_current_wal_lsn() - '0/0')::bigint")
	if err != nil {
		return 0, err
	}
	b, err := read(1, "SELECT (coalesce(pg_last_wal_receive_lsn(), '0/0') - '0/0')::bigint")
	if err != nil {
		return 0, err
	}
	if b > a {
		return 0, nil
	}
	return a - b, nil
}

func eventTypes(evs []event, since time.Time) string {
	var s []string
	for _, e := range evs {
		if !e.at.Before(since) {
			s = append(s, e.typ)
		}
	}
	return strings.Join(s, " ")
}

// TestFailbackAfterRewind: site-a killed -9, site-b serves and takes
// writes; site-a's node restarts: its database is rewound and streams from
// b, and only then (failback auto) does leadership return to site-a, with
// b's writes on it.
func TestFailbackAfterRewind(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pairOptions{})
	c.start()
	m := c.startMonitor()
	w := c.startWriter(0)
	if _, ok := w.waitAckBy(0, time.Now(), 10*time.Second); !ok {
		t.Fatal("the writer got no commit acknowledged by site-a")
	}
	killAt := time.Now()
	c.kill9(0)
	first, ok := w.waitAckBy(1, killAt, 30*time.Second)
	if !ok {
		t.Fatalf("site-b acknowledged no commit within 30s of the kill (%v); site-b's states:%s", w, m.timeline(1, killAt))
	}
	time.Sleep(2 * time.Second) // the outage's writes, on b
	restartAt := time.Now()
	c.startNode(0)
	aw, ok := m.waitFor(0, stWritable, restartAt, 90*time.Second)
	if !ok {
		t.Fatalf("leadership did not return to site-a within 90s of its restart (failback auto):%s", m.timeline(0, restartAt))
	}
	streamAt, streamed := m.firstSince(0, stStreaming, restartAt)
	if !streamed || !streamAt.Before(aw) {
		t.Errorf("site-a accepted writes again %.0f ms after its restart without having streamed from site-b first; its states:%s",
			ms(aw.Sub(restartAt)), m.timeline(0, restartAt))
	}
	if _, ok := c.logHas(0, regexp.MustCompile(`postgres: pg_rewind done`), restartAt); !ok {
		t.Errorf("site-a was not rewound (no \"pg_rewind done\" in its log since the restart)")
	}
	if _, ok := w.waitAckBy(0, aw, 20*time.Second); !ok {
		t.Errorf("the writer got no commit acknowledged by site-a within 20s of failback")
	}
	lost, checked, err := w.lost(0, func(a ack) bool { return a.site == 1 })
	if err != nil {
		t.Fatal(err)
	}
	if checked == 0 || len(lost) > 0 {
		t.Errorf("%d of the %d commits site-b acknowledged during the outage are missing on site-a after failback:%s", len(lost), checked, sample(lost))
	}
	bs, ok := m.waitFor(1, stStreaming, aw, 60*time.Second)
	if !ok {
		t.Errorf("site-b does not stream from site-a within 60s of failback:%s", m.timeline(1, aw))
	}
	if both := m.bothWritable(); len(both) > 0 {
		t.Errorf("%d polls found both sites accepting writes", len(both))
	}
	t.Logf("FIGURE failback first_write_ms=%.0f a_streaming_after_restart_ms=%.0f a_writable_after_restart_ms=%.0f b_streaming_after_failback_ms=%.0f b_commits=%d b_commits_lost=%d",
		ms(first.Sub(killAt)), ms(streamAt.Sub(restartAt)), ms(aw.Sub(restartAt)), ms(bs.Sub(aw)), checked, len(lost))
}

// TestSwitchover: `understudy switchover` to site-b, then back to site-a:
// each time the target accepts writes, the other streams from it, and no
// acknowledged commit is lost.
func TestSwitchover(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pairOptions{failback: "manual", escalation: true})
	c.start()
	m := c.startMonitor()
	w := c.startWriter(0)
	if _, ok := w.waitAckBy(0, time.Now(), 10*time.Second); !ok {
		t.Fatal("the writer got no commit acknowledged by site-a")
	}
	for _, to := range []int{1, 0} {
		from := 1 - to
		time.Sleep(time.Second)
		at := time.Now()
		out, err := c.understudy(60*time.Second, "switchover", "--pair", pairName, "--to", c.sites[to].name)
		if err != nil {
			t.Fatalf("switchover to %s: %v", c.sites[to].name, err)
		}
		tw, ok := m.waitFor(to, stWritable, at, 30*time.Second)
		if !ok {
			t.Fatalf("switchover to %s: it does not accept writes within 30s (%s):%s", c.sites[to].name, strings.TrimSpace(out), m.timeline(to, at))
		}
		fs, ok := m.waitFor(from, stStreaming, tw, 60*time.Second)
		if !ok {
			t.Fatalf("switchover to %s: %s does not stream from it within 60s:%s", c.sites[to].name, c.sites[from].name, m.timeline(from, at))
		}
		first, ok := w.waitAckBy(to, at, 20*time.Second)
		if !ok {
			t.Fatalf("switchover to %s: the writer got no commit acknowledged by it", c.sites[to].name)
		}
		lost, checked, err := w.lost(to, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(lost) > 0 {
			t.Errorf("switchover to %s: %d of %d acknowledged commits missing on it:%s", c.sites[to].name, len(lost), checked, sample(lost))
		}
		t.Logf("FIGURE switchover to=%s target_writable_ms=%.0f first_write_ms=%.0f old_streaming_ms=%.0f lost=%d acked=%d",
			c.sites[to].name, ms(tw.Sub(at)), ms(first.Sub(at)), ms(fs.Sub(at)), len(lost), checked)
	}
	if both := m.bothWritable(); len(both) > 0 {
		t.Errorf("%d polls found both sites accepting writes", len(both))
	}
}

// TestForeignPostgres: site-b's node is stopped (its PostgreSQL stops with
// it), and its PostgreSQL is started by hand as a primary (pg_ctl, no
// standby.signal, the same port) and written to. When b's node starts,
// it stops that server and b becomes a streaming standby of site-a again,
// with site-a's data and not the rows written behind understudy's back.
// Both sites accept writes while the hand-started server runs (that is the
// operator's doing); from b's node's "ready" line on, never.
func TestForeignPostgres(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pairOptions{})
	c.start()
	m := c.startMonitor()
	w := c.startWriter(0)
	if _, ok := w.waitAckBy(0, time.Now(), 10*time.Second); !ok {
		t.Fatal("the writer got no commit acknowledged by site-a")
	}
	b := c.sites[1]
	c.stopNode(1, 40*time.Second)
	c.waitNoPostgres(1, 5*time.Second)
	if err := os.Remove(filepath.Join(b.pgdata, "standby.signal")); err != nil {
		t.Fatalf("remove standby.signal: %v", err)
	}
	handLog := filepath.Join(b.dir, "by-hand.log")
	if err := os.WriteFile(handLog, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(handLog, int(c.pgUser.uid), int(c.pgUser.gid)); err != nil {
		t.Fatal(err)
	}
	pgctl := exec.Command(filepath.Join(pgBinDir(), "pg_ctl"), "-D", b.pgdata, "-l", handLog, "-w", "-t", "60",
		"-o", fmt.Sprintf("-c port=%d -c listen_addresses=127.0.0.1 -c unix_socket_directories=%s", b.port, b.sock), "start")
	pgctl.Dir = b.pgdata
	pgctl.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C"}
	pgctl.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: &syscall.Credential{Uid: c.pgUser.uid, Gid: c.pgUser.gid}}
	if out, err := pgctl.CombinedOutput(); err != nil {
		t.Fatalf("pg_ctl start on site-b's data: %v\n%s\n%s", err, out, tailFile(handLog, 20))
	}
	hand := postmasterPID(b.pgdata)
	c.addHandStarted(hand)
	if err := c.exec(1, "CREATE TABLE pgsuite_behind_the_back (v text); INSERT INTO pgsuite_behind_the_back VALUES ('hand')"); err != nil {
		t.Fatalf("the hand-started server on site-b does not accept writes: %v", err)
	}
	handWritable, ok := m.waitFor(1, stWritable, time.Now().Add(-time.Second), 5*time.Second)
	if !ok {
		t.Fatalf("the monitor does not see the hand-started server accepting writes:%s", m.timeline(1, time.Now().Add(-10*time.Second)))
	}
	startAt := time.Now()
	c.startNode(1)
	readyAt := time.Now()
	var stopped time.Duration
	for alive(hand) {
		if time.Since(startAt) > 10*time.Second {
			t.Fatalf("the hand-started postmaster %d still runs 10s after site-b's node started", hand)
		}
		time.Sleep(2 * time.Millisecond)
	}
	stopped = time.Since(startAt)
	if _, ok := c.logHas(1, regexp.MustCompile(`a PostgreSQL this node did not start runs in the data directory`), startAt); !ok {
		t.Errorf("site-b's node did not log that it stopped a PostgreSQL it had not started")
	}
	st, ok := m.waitFor(1, stStreaming, startAt, 90*time.Second)
	if !ok {
		t.Fatalf("site-b does not stream from site-a within 90s of its node's start:%s", m.timeline(1, startAt))
	}
	var after []time.Time
	for _, at := range m.bothWritable() {
		if !at.Before(readyAt) {
			after = append(after, at)
		}
	}
	if len(after) > 0 {
		t.Errorf("%d polls after site-b's node was ready found both sites accepting writes", len(after))
	}
	// Same data: stop writing, let b catch up, compare.
	w.close()
	if err := c.waitCaughtUp(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	var sums [2]string
	for i := range sums {
		conn, err := c.connectSite(t.Context(), i, 2*time.Second, false)
		if err != nil {
			t.Fatal(err)
		}
		err = conn.QueryRow(t.Context(), "SELECT count(*)::text || '/' || coalesce(sum(n), 0)::text FROM pgsuite_counter").Scan(&sums[i])
		_ = conn.Close(t.Context())
		if err != nil {
			t.Fatal(err)
		}
	}
	if sums[0] != sums[1] {
		t.Errorf("after rejoining, site-b's counter table (count/sum %s) differs from site-a's (%s): its history diverged", sums[1], sums[0])
	}
	var handRows string
	if conn, err := c.connectSite(t.Context(), 1, 2*time.Second, false); err == nil {
		_ = conn.QueryRow(t.Context(), "SELECT coalesce(to_regclass('pgsuite_behind_the_back')::text, 'absent')").Scan(&handRows)
		_ = conn.Close(t.Context())
	}
	if handRows != "absent" {
		t.Errorf("after rejoining, site-b still has the table written behind understudy's back (%s): its history diverged from site-a's", handRows)
	}
	rejoin := "restarted"
	if line, ok := c.logHas(1, regexp.MustCompile(`postgres: pg_rewind done`), startAt); ok {
		rejoin = "rewound"
		if strings.Contains(line, "no rewind required") {
			rejoin = "rewind-not-required"
		}
	}
	if _, ok := c.logHas(1, regexp.MustCompile(`moved the old data directory aside`), startAt); ok {
		rejoin = "cloned-again"
	}
	t.Logf("FIGURE foreign-postgres hand_writable_polls=%d foreign_stopped_ms=%.0f b_streaming_ms=%.0f both_writable_after_ready=%d rejoin=%s data_a=%s data_b=%s hand_seen_writable_at=%s",
		len(m.bothWritable())-len(after), ms(stopped), ms(st.Sub(startAt)), len(after), rejoin, sums[0], sums[1], handWritable.Format("15:04:05.000"))
}

// waitCaughtUp waits until standby i has replayed site 1-i's current WAL
// position.
func (c *cluster) waitCaughtUp(i int, within time.Duration) error {
	ctx := c.t.Context()
	conn, err := c.connectSite(ctx, 1-i, 2*time.Second, false)
	if err != nil {
		return err
	}
	var target string
	err = conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&target)
	_ = conn.Close(ctx)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(within)
	for {
		conn, err := c.connectSite(ctx, i, 2*time.Second, false)
		if err == nil {
			var done bool
			err = conn.QueryRow(ctx, "SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)", target).Scan(&done)
			_ = conn.Close(ctx)
			if err == nil && done {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s has not replayed up to %s within %v (%v)", c.sites[i].name, target, within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestNodeFileWithoutProcedures: a node file whose member protects a
// postgres: workload and gives no procedures (the workload fences itself)
// must be accepted by `understudy serve`, with fence_grace covering the
// PostgreSQL fence budget (1.5 s) alone.
func TestNodeFileWithoutProcedures(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pairOptions{})
	file := strings.Replace(c.nodeFile(0), "fence_grace: "+fenceGrace.String(), "fence_grace: 1.5s", 1)
	if err := os.WriteFile(c.sites[0].config, []byte(file), 0o644); err != nil {
		t.Fatal(err)
	}
	s := c.sites[0]
	p, err := startProc(s.name, s.dir, s.log, c.bin, "serve", "--config", s.config)
	if err != nil {
		t.Fatal(err)
	}
	s.node = p
	if _, err := waitLine(s.log, 0, regexp.MustCompile(`msg=ready `), 30*time.Second, p); err != nil {
		t.Fatalf("`understudy serve` refuses a node file whose postgres member has no procedures (fence_grace 1.5s): %v\n%s\n%s",
			err, tailFile(s.log, 5), file)
	}
}

// TestBootstrapInterrupted: the witness's NATS stops answering (SIGSTOP)
// for 1.5 s while site-a runs initdb for the pair's bootstrap, so site-a's
// member fences mid-bootstrap. Once NATS answers again the pair must still
// come up: site-a serving, site-b streaming. (A heavily loaded machine
// does this by itself: a stale NATS connection during a slow initdb.)
func TestBootstrapInterrupted(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pairOptions{})
	c.startNode(0)
	c.startNode(1)
	if _, err := waitLine(c.sites[0].log, 0, regexp.MustCompile(`postgres: bootstrap: initdb`), 30*time.Second, c.sites[0].node); err != nil {
		t.Fatalf("site-a did not start its bootstrap: %v", err)
	}
	stopAt := time.Now()
	_ = syscall.Kill(c.witness.pid(), syscall.SIGSTOP)
	time.Sleep(1500 * time.Millisecond)
	_ = syscall.Kill(c.witness.pid(), syscall.SIGCONT)
	fenced, wasFenced := c.waitEvent(0, "failover.fence_requested", stopAt, regexp.MustCompile(`heartbeat-failures`), 5*time.Second)
	m := c.startMonitor()
	aw, ok := m.waitFor(0, stWritable, stopAt, 60*time.Second)
	if !ok {
		why := "none"
		if e, ok := c.waitEvent(0, "failover.promote_failed", stopAt, nil, 0); ok {
			why = e.detail
		}
		t.Fatalf("the pair did not come up within 60s of NATS answering again (site-a fenced during its bootstrap: %v); site-a's last promote failure: %s; site-a's events since: %s",
			wasFenced, why, eventTypes(c.events(0, 0), stopAt))
	}
	bs, ok := m.waitFor(1, stStreaming, stopAt, 60*time.Second)
	if !ok {
		t.Fatalf("site-b does not stream within 60s:%s", m.timeline(1, stopAt))
	}
	t.Logf("FIGURE bootstrap-interrupted fenced_mid_bootstrap=%v fenced_at_ms=%.0f a_writable_ms=%.0f b_streaming_ms=%.0f",
		wasFenced, ms(fenced.at.Sub(stopAt)), ms(aw.Sub(stopAt)), ms(bs.Sub(stopAt)))
}
