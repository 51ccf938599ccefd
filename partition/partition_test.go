package partition

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Environment variables of the suite (docs/partitions.md).
const (
	envReport   = "UNDERSTUDY_PARTITION_REPORT"     // write the JSON summary here
	envParallel = "UNDERSTUDY_PARTITION_PARALLEL"   // scenarios run at once (default 3)
	envKeep     = "UNDERSTUDY_PARTITION_KEEP"       // keep every scenario's directory, not only failed ones
	envBinary   = "UNDERSTUDY_PARTITION_UNDERSTUDY" // test this understudy binary instead of building one
)

// Durations of a scenario's phases.
const (
	faultHold   = 15 * time.Second // how long a fault lasts
	settle      = 25 * time.Second // after the heal, before judging: a rejoined server forces elections up to ~15s after it
	baselineFor = 3 * time.Second  // site-a alone serving, site-b up, this long before the fault
	startWithin = 60 * time.Second // for the cluster to elect site-a
	// placementWithin bounds the wait for assets.preferred_leader to hold.
	placementWithin = 15 * time.Second
)

// scenario is one fault on a fresh three-site cluster whose pair is served
// by site-a.
type scenario struct {
	name string
	what string
	// primaryLost: the primary's site loses the cluster, so service must
	// come back within AvailabilityBound of the fault.
	primaryLost bool
	// replicaMust: only the replica can restore service (the primary's site
	// is cut off): its promote line must come within AvailabilityBound.
	replicaMust bool
	// bound replaces AvailabilityBound for primaryLost and replicaMust.
	bound       time.Duration
	needsImpair bool
	fault       func(ctx context.Context, r *scenarioRun) error
}

var scenarios = []scenario{
	{name: "isolate-primary", what: "site a (primary) cut off, both directions, 15 s", primaryLost: true, replicaMust: true,
		fault: func(ctx context.Context, r *scenarioRun) error { return r.hold(ctx, faultHold, isolate("a")) }},
	{name: "isolate-replica", what: "site b (replica) cut off, both directions, 15 s",
		fault: func(ctx context.Context, r *scenarioRun) error { return r.hold(ctx, faultHold, isolate("b")) }},
	{name: "isolate-witness", what: "site w (witness, no member) cut off, both directions, 15 s",
		fault: func(ctx context.Context, r *scenarioRun) error { return r.hold(ctx, faultHold, isolate("w")) }},
	// One-way loss breaks the primary site's connections too, but not at
	// once: what its server sends may still be delivered (and its
	// register writes land) while nothing comes back. A holder whose
	// writes land is taken over only once it has stayed fenced for
	// failover_timeout, so the bound is LandingHolderBound.
	{name: "oneway-in-primary", what: "site a receives nothing (INPUT dropped), 15 s", primaryLost: true, replicaMust: true, bound: LandingHolderBound,
		fault: func(ctx context.Context, r *scenarioRun) error {
			return r.hold(ctx, faultHold, rule("a", "INPUT", "-i"))
		}},
	{name: "oneway-out-primary", what: "site a sends nothing (OUTPUT dropped), 15 s", primaryLost: true, replicaMust: true, bound: LandingHolderBound,
		fault: func(ctx context.Context, r *scenarioRun) error {
			return r.hold(ctx, faultHold, rule("a", "OUTPUT", "-o"))
		}},
	// Delay and loss: the primary's writes land at random, its unfencing
	// announcements among them; how long the replica waits depends on
	// which land (docs/failover.md). The figures are recorded; the bound
	// the issue of availability sets is for a cut-off site.
	{name: "delay-loss-primary", what: "site a's link: 400 ms delay and 30 % loss each way, 20 s", needsImpair: true,
		fault: func(ctx context.Context, r *scenarioRun) error {
			r.markFault()
			im, err := r.c.Lab.Impair(ctx, "a", 400*time.Millisecond, 0.3, r.caps.netem, uint64(time.Now().UnixNano()))
			if err != nil {
				return err
			}
			r.logf("impairment on site a via %s", im.How)
			sleep(ctx, 20*time.Second)
			r.markHeal()
			err = im.Remove(context.WithoutCancel(ctx))
			if s := im.Stats(); s != "" {
				r.logf("impairment: %s", s)
			}
			return err
		}},
	{name: "flapping-primary", what: "site a cut off 3 s, healed 3 s, five times (30 s)",
		fault: func(ctx context.Context, r *scenarioRun) error {
			r.markFault()
			for i := 0; i < 5; i++ {
				if err := r.c.Lab.Isolate(ctx, "a"); err != nil {
					return err
				}
				sleep(ctx, 3*time.Second)
				if err := r.c.Lab.Heal(context.WithoutCancel(ctx), "a"); err != nil {
					return err
				}
				if i < 4 {
					sleep(ctx, 3*time.Second)
				}
			}
			r.markHeal()
			return nil
		}},
	{name: "kill-nats-primary", what: "site a's nats-server SIGKILLed, restarted after 15 s", primaryLost: true,
		fault: func(ctx context.Context, r *scenarioRun) error {
			r.markFault()
			r.c.KillNATS("a")
			sleep(ctx, faultHold)
			r.markHeal()
			return r.c.StartNATS("a")
		}},
	{name: "freeze-nats-primary", what: "site a's nats-server stopped (SIGSTOP: connections open, nothing answers), continued after 15 s", primaryLost: true,
		fault: func(ctx context.Context, r *scenarioRun) error {
			r.markFault()
			if err := r.c.SignalNATS("a", syscall.SIGSTOP); err != nil {
				return err
			}
			sleep(ctx, faultHold)
			r.markHeal()
			return r.c.SignalNATS("a", syscall.SIGCONT)
		}},
	{name: "cut-primary-replica", what: "sites a and b cannot reach each other; both reach w, 15 s",
		fault: func(ctx context.Context, r *scenarioRun) error {
			b := r.c.Lab.Sites["b"].IP
			return r.hold(ctx, faultHold, fault{
				apply: func(ctx context.Context, l *Lab) error {
					if err := l.IPTables(ctx, "a", "-I", "INPUT", "-s", b, "-j", "DROP"); err != nil {
						return err
					}
					return l.IPTables(ctx, "a", "-I", "OUTPUT", "-d", b, "-j", "DROP")
				},
				lift: func(ctx context.Context, l *Lab) error { return l.Heal(ctx, "a") },
			})
		}},
	{name: "stop-all-nats", what: "all three nats-servers SIGKILLed, restarted after 15 s",
		fault: func(ctx context.Context, r *scenarioRun) error {
			r.markFault()
			for _, s := range []string{"a", "b", "w"} {
				r.c.KillNATS(s)
			}
			sleep(ctx, faultHold)
			r.markHeal()
			for _, s := range []string{"a", "b", "w"} {
				if err := r.c.StartNATS(s); err != nil {
					return err
				}
			}
			return nil
		}},
}

// A fault that is applied, then lifted.
type fault struct {
	apply, lift func(ctx context.Context, l *Lab) error
}

func isolate(site string) fault {
	return fault{
		apply: func(ctx context.Context, l *Lab) error { return l.Isolate(ctx, site) },
		lift:  func(ctx context.Context, l *Lab) error { return l.Heal(ctx, site) },
	}
}

// rule drops one direction of a site's link.
func rule(site, chain, dirFlag string) fault {
	return fault{
		apply: func(ctx context.Context, l *Lab) error {
			return l.IPTables(ctx, site, "-I", chain, dirFlag, "eth0", "-j", "DROP")
		},
		lift: func(ctx context.Context, l *Lab) error { return l.Heal(ctx, site) },
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// caps is what the machine can do, found out once.
type caps struct {
	netem   bool   // sch_netem is there
	nfqueue bool   // NFQUEUE and nfnetlink_queue work
	noImp   string // why neither can impair a link
}

// TestPartitions runs every scenario on its own real cluster: three network
// namespaces joined by a bridge, a nats-server each, understudy nodes on
// two. It judges by the oracle files the members' procedures write, not by
// understudy's own record (docs/partitions.md).
func TestPartitions(t *testing.T) {
	if testing.Short() {
		t.Skip("partition suite: skipped with -short (it runs real clusters for minutes)")
	}
	cp := preflight(t)
	root := moduleRoot(t)
	bin := buildBinaries(t, root)
	preferred := ""
	if ok, why := acceptsPreferredLeader(t, bin.Understudy); ok {
		preferred = "nats-w"
	} else {
		t.Logf("assets.preferred_leader left out: %s", why)
	}
	t.Logf("assets.preferred_leader: %s", orNone(preferred))

	ctx, cancel := context.WithCancel(context.Background())
	if d, ok := t.Deadline(); ok {
		ctx, cancel = context.WithDeadline(context.Background(), d.Add(-30*time.Second))
	}
	defer cancel()
	if removed, err := CleanLeftovers(ctx); err != nil {
		t.Fatalf("removing leftovers of an earlier run: %v", err)
	} else if len(removed) > 0 {
		t.Logf("removed leftover namespaces of an earlier run: %s", strings.Join(removed, " "))
	}
	base, err := os.MkdirTemp("", "understudy-partition-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv(envKeep) != "" {
			t.Logf("logs, oracle files and records kept in %s", base)
			return
		}
		os.RemoveAll(base)
	})

	parallel := 3
	if v, err := strconv.Atoi(os.Getenv(envParallel)); err == nil && v > 0 {
		parallel = v
	}
	type pending struct {
		sc  scenario
		res chan *result
	}
	var runs []pending
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i, sc := range scenarios {
		if !selected(sc.name) {
			continue
		}
		p := pending{sc: sc, res: make(chan *result, 1)}
		runs = append(runs, p)
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			r := &scenarioRun{sc: sc, caps: cp, start: time.Now()}
			r.res = &result{Scenario: sc.name, What: sc.what}
			if sc.needsImpair && cp.noImp != "" {
				r.res.Skipped = cp.noImp
				p.res <- r.res
				return
			}
			r.id = fmt.Sprintf("%s%d-%d", NamePrefix, os.Getpid(), i)
			r.dir = filepath.Join(base, sc.name)
			r.execute(ctx, bin, preferred, 10+i)
			p.res <- r.res
		})
	}
	t.Cleanup(func() { cancel(); wg.Wait() }) // no namespace outlives the test

	var report []*result
	for _, p := range runs {
		t.Run(p.sc.name, func(t *testing.T) {
			res := <-p.res
			report = append(report, res)
			if res.Skipped != "" {
				t.Skip(res.Skipped)
			}
			for _, l := range res.log {
				t.Log(l)
			}
			t.Logf("SUMMARY %s", res.summary())
			for _, f := range res.Failures {
				t.Error(f)
			}
			if len(res.Failures) > 0 {
				for _, ex := range res.excerpts {
					t.Log(ex)
				}
			}
		})
	}
	wg.Wait()
	if path := os.Getenv(envReport); path != "" {
		raw, _ := json.MarshalIndent(map[string]any{"scenarios": report, "preferred_leader": preferred, "impairment": cp.how()}, "", "  ")
		if err := os.WriteFile(path, append(raw, '\n'), 0o644); err != nil {
			t.Errorf("writing %s: %v", envReport, err)
		}
	}
}

func (c caps) how() string {
	switch {
	case c.netem:
		return "netem"
	case c.nfqueue:
		return "nfqueue"
	}
	return "none"
}

// selected applies the -run pattern's second element (the subtest) to a
// scenario name, so `-run TestPartitions/isolate-primary` starts only that
// cluster. Scenarios run outside their subtests, in parallel, and report
// into them.
func selected(name string) bool {
	match := func(flagName string) (bool, bool) {
		f := flag.Lookup(flagName)
		if f == nil {
			return false, false
		}
		parts := strings.Split(f.Value.String(), "/")
		if len(parts) < 2 {
			return false, false
		}
		re, err := regexp.Compile(parts[1])
		if err != nil {
			return false, false
		}
		return re.MatchString(name), true
	}
	if m, ok := match("test.run"); ok && !m {
		return false
	}
	if m, ok := match("test.skip"); ok && m {
		return false
	}
	return true
}

// preflight checks that the machine can run the faults, and skips (loudly,
// saying what is missing) when it cannot.
func preflight(t *testing.T) caps {
	t.Helper()
	loud := func(what string) {
		t.Skipf("\n\n!!!!! PARTITION SUITE NOT RUN: %s !!!!!\n"+
			"It needs root, network namespaces (ip netns) and iptables in them; run scripts/install-test-deps.sh as root.\n", what)
	}
	if os.Geteuid() != 0 {
		loud("not root (uid " + strconv.Itoa(os.Geteuid()) + ")")
	}
	for _, p := range []string{"ip", "iptables", "sh", "date"} {
		if _, err := exec.LookPath(p); err != nil {
			loud(p + " not found in PATH")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	probe := fmt.Sprintf("%s%d-probe", NamePrefix, os.Getpid())
	if out, err := run(ctx, "ip", "netns", "add", probe); err != nil {
		loud("ip netns add fails: " + strings.TrimSpace(out))
	}
	defer run(context.Background(), "ip", "netns", "del", probe)
	if out, err := run(ctx, "ip", "netns", "exec", probe, "iptables", "-w", "5", "-I", "INPUT", "-i", "lo", "-j", "DROP"); err != nil {
		loud("iptables does not work inside a network namespace: " + strings.TrimSpace(out))
	}
	var c caps
	c.netem, _ = HasNetem(ctx, probe)
	if q, err := OpenQueue(probe, queueNum, time.Millisecond, 0, 1); err == nil {
		q.Close()
		c.nfqueue = true
	} else if !c.netem {
		c.noImp = "\n\n!!!!! PARTITION SCENARIO NOT RUN: delay and loss need sch_netem (tc qdisc ... netem) or NFQUEUE with nfnetlink_queue; this kernel has neither: " + err.Error() + " !!!!!\n"
	}
	if !c.netem {
		t.Logf("no sch_netem in this kernel: delay and loss go through NFQUEUE and a user-space queue (nfqueue works: %v)", c.nfqueue)
	}
	return c
}

// moduleRoot is the directory of go.mod, above this package.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the partition package")
		}
		dir = parent
	}
}

// buildBinaries builds understudy and nats-server (the version go.mod
// requires) once per test run; $UNDERSTUDY_PARTITION_UNDERSTUDY names an
// understudy binary to test instead of building one.
func buildBinaries(t *testing.T, root string) Binaries {
	t.Helper()
	dir := t.TempDir()
	b := Binaries{Understudy: filepath.Join(dir, "understudy"), NATSServer: filepath.Join(dir, "nats-server")}
	builds := [][]string{
		{"build", "-o", b.NATSServer, "github.com/nats-io/nats-server/v2"},
		{"build", "-tags", "libvirt_dlopen", "-o", b.Understudy, "./cmd/understudy"},
	}
	if given := os.Getenv(envBinary); given != "" {
		abs, err := filepath.Abs(given)
		if err != nil {
			t.Fatal(err)
		}
		b.Understudy, builds = abs, builds[:1]
		t.Logf("testing the understudy binary %s ($%s)", abs, envBinary)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(builds))
	for i, args := range builds {
		wg.Go(func() {
			cmd := exec.Command("go", args...)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// acceptsPreferredLeader reports whether the understudy binary takes
// assets.preferred_leader in a node file: a node file it refuses makes
// `understudy serve` exit 2 at once, naming the field.
func acceptsPreferredLeader(t *testing.T, understudy string) (bool, string) {
	t.Helper()
	dir := t.TempDir()
	node := filepath.Join(dir, "node.yaml")
	// 127.0.0.1:1 in a namespace of its own: nothing answers, nothing outside is touched.
	conf := "node: probe\nnats: {url: \"nats://127.0.0.1:1\"}\nassets: {replicas: 3, preferred_leader: nats-w}\nhttp: \"127.0.0.1:0\"\n"
	if err := os.WriteFile(node, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	ns := fmt.Sprintf("%s%d-probe2", NamePrefix, os.Getpid())
	if _, err := run(context.Background(), "ip", "netns", "add", ns); err != nil {
		t.Fatal(err)
	}
	defer run(context.Background(), "ip", "netns", "del", ns)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", ns, understudy, "serve", "--config", node).CombinedOutput()
	if ctx.Err() != nil {
		return true, "" // it loaded the file and was trying to connect
	}
	if strings.Contains(string(out), "preferred_leader") {
		return false, "this understudy refuses it: " + strings.TrimSpace(string(out))
	}
	return false, fmt.Sprintf("understudy serve exited early (%v): %s", err, strings.TrimSpace(string(out)))
}

// result is one scenario's outcome, also its entry in the JSON summary.
type result struct {
	Scenario string   `json:"scenario"`
	What     string   `json:"what"`
	Skipped  string   `json:"skipped,omitempty"`
	Pass     bool     `json:"pass"`
	Failures []string `json:"failures,omitempty"`

	FaultStart time.Time `json:"fault_start"`
	HealAt     time.Time `json:"heal_at"`
	End        time.Time `json:"end"`
	// LeadersAtFault: the NATS servers leading the meta group and the
	// streams when the fault began (from the witness's monitoring port).
	LeadersAtFault string `json:"leaders_at_fault,omitempty"`

	// FailoverMS: from the fault to the replica's first promote line
	// (null: the replica never promoted).
	FailoverMS *float64 `json:"failover_ms"`
	// FirstGapMS: the first time nobody served after the fault (its start,
	// relative to the fault, and its length).
	FirstGapStartMS *float64 `json:"first_gap_start_ms"`
	FirstGapMS      *float64 `json:"first_gap_ms"`
	// UnavailableMS: total time nobody served from the fault to the end.
	UnavailableMS float64 `json:"unavailable_ms"`
	// LongestGapAfterHealMS: the longest time nobody served after the heal.
	LongestGapAfterHealMS float64 `json:"longest_gap_after_heal_ms"`
	// LeadershipChanges: how often the serving site changed from the fault on.
	LeadershipChanges int      `json:"leadership_changes"`
	PromotesAfter     int      `json:"promotes_after_fault"`
	FencesAfter       int      `json:"fences_after_fault"`
	ServingAtEnd      []string `json:"serving_at_end"`
	Overlaps          []string `json:"overlaps,omitempty"`
	Intervals         []string `json:"intervals"`

	ReplaySplitBrain int `json:"replay_split_brain"`
	ReplayFailovers  int `json:"replay_failovers"`
	ReplayTenures    int `json:"replay_tenures"`

	log      []string
	excerpts []string
}

func ms(d time.Duration) *float64 {
	v := float64(d.Microseconds()) / 1000
	return &v
}

func fmtMS(p *float64) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprintf("%.0fms", *p)
}

func (r *result) summary() string {
	return fmt.Sprintf("%s pass=%v failover=%s first_gap=%s@+%s unavailable=%.0fms longest_gap_after_heal=%.0fms leadership_changes=%d promotes=%d fences=%d serving_at_end=%v replay_split_brain=%d replay_failovers=%d",
		r.Scenario, r.Pass, fmtMS(r.FailoverMS), fmtMS(r.FirstGapMS), fmtMS(r.FirstGapStartMS), r.UnavailableMS, r.LongestGapAfterHealMS,
		r.LeadershipChanges, r.PromotesAfter, r.FencesAfter, r.ServingAtEnd, r.ReplaySplitBrain, r.ReplayFailovers)
}

// scenarioRun is one scenario in progress.
type scenarioRun struct {
	sc    scenario
	caps  caps
	id    string
	dir   string
	start time.Time
	c     *Cluster
	res   *result
	mu    sync.Mutex
}

func (r *scenarioRun) logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.res.log = append(r.res.log, fmt.Sprintf("[+%5.1fs] ", time.Since(r.start).Seconds())+fmt.Sprintf(format, args...))
}

func (r *scenarioRun) fail(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.res.Failures = append(r.res.Failures, fmt.Sprintf(format, args...))
}

func (r *scenarioRun) markFault() {
	r.res.FaultStart = time.Now()
	r.res.LeadersAtFault = r.c.Leaders(r.witnessOr("b"))
	r.logf("fault: %s (raft leaders before: %s)", r.sc.what, r.res.LeadersAtFault)
	r.res.FaultStart = time.Now() // the leaders query takes a moment
}

func (r *scenarioRun) markHeal() {
	r.res.HealAt = time.Now()
	r.logf("fault lifted")
}

// witnessOr is the witness site, or other when the witness is the one cut off.
func (r *scenarioRun) witnessOr(other string) string {
	if r.sc.name == "isolate-witness" {
		return other
	}
	return "w"
}

// hold applies f, waits d, lifts it.
func (r *scenarioRun) hold(ctx context.Context, d time.Duration, f fault) error {
	r.markFault()
	if err := f.apply(ctx, r.c.Lab); err != nil {
		return err
	}
	sleep(ctx, d)
	r.markHeal()
	return f.lift(context.WithoutCancel(ctx), r.c.Lab)
}

// execute sets the cluster up, waits for site-a to serve, runs the fault,
// lets it settle and judges.
func (r *scenarioRun) execute(ctx context.Context, bin Binaries, preferred string, netOctet int) {
	defer func() {
		r.res.Pass = len(r.res.Failures) == 0
		if !r.res.Pass && r.c != nil {
			for _, site := range []string{"a", "b"} {
				lines := Trouble(r.c.NodeLog(site), 40)
				r.res.excerpts = append(r.res.excerpts, fmt.Sprintf("---- %s: last warnings and errors of %s\n%s", nodeSite[site], r.c.NodeLog(site), strings.Join(lines, "\n")))
			}
		}
	}()
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		r.fail("setup: %v", err)
		return
	}
	lab, err := NewLab(ctx, r.id, netOctet)
	if err != nil {
		r.fail("setup: lab: %v", err)
		return
	}
	defer lab.Close()
	c, err := NewCluster(lab, r.dir, bin, preferred)
	if err != nil {
		r.fail("setup: %v", err)
		return
	}
	r.c = c
	defer c.Close()
	for _, s := range []string{"a", "b", "w"} {
		if err := c.StartNATS(s); err != nil {
			r.fail("setup: nats-%s: %v", s, err)
			return
		}
	}
	// The nodes start once the cluster is formed: a meta leader and both
	// other peers current. (A node started earlier may find its first
	// provisioning attempt waiting out its timeout, or refused for want of
	// peers: the scenarios are about partitions, not the cluster's birth.)
	metaBy := time.Now().Add(30 * time.Second)
	for {
		ok, why := c.MetaReady("w")
		if ok {
			break
		}
		if time.Now().After(metaBy) || ctx.Err() != nil {
			r.logf("JetStream cluster not formed after 30s (%s); starting the nodes anyway", why)
			break
		}
		sleep(ctx, 200*time.Millisecond)
	}
	for _, s := range []string{"a", "b"} {
		if err := c.StartNode(s); err != nil {
			r.fail("setup: node %s: %v", s, err)
			return
		}
	}
	r.logf("cluster up in %s (10.231.%d.0/24, namespaces %s-*)", r.dir, netOctet, r.id)

	// Baseline: site-a alone serving for baselineFor.
	deadline := time.Now().Add(startWithin)
	var since time.Time
	for {
		evs, err := c.Oracle()
		if err != nil {
			r.fail("oracle: %v", err)
			return
		}
		for _, site := range []string{"a", "b"} {
			if p := c.Node(site); !p.Running() {
				r.fail("setup: %s: understudy serve exited at start (%v): %s", nodeSite[site], p.ExitErr(), lastLine(c.NodeLog(site)))
				return
			}
		}
		now := time.Now()
		// Both members must be up: a member comes up fenced, so its first
		// oracle line is a fence; the replica's proves it runs and watches.
		_, replicaUp := FirstAfter(evs, KindFence, NodeB, time.Time{})
		if on := ServingAt(Serving(evs, now), now); replicaUp && len(on) == 1 && on[0] == NodeA {
			if since.IsZero() {
				since = now
				r.logf("site-a serves, site-b's member is up")
			}
			if now.Sub(since) >= baselineFor {
				break
			}
		} else {
			since = time.Time{}
		}
		if now.After(deadline) || ctx.Err() != nil {
			r.fail("setup: site-a was not serving alone, with site-b's member up, for %s within %s of the start (oracle: %v)", baselineFor, startWithin, evs)
			return
		}
		sleep(ctx, 200*time.Millisecond)
	}

	if preferred != "" {
		r.awaitPlacement(ctx, preferred)
	}

	if err := r.sc.fault(ctx, r); err != nil {
		r.fail("fault: %v", err)
	}
	if r.res.HealAt.IsZero() {
		r.res.HealAt = time.Now()
	}
	sleep(ctx, settle)
	r.res.End = time.Now()
	r.judge(ctx)
}

// lastLine is a log file's last non-empty line.
func lastLine(path string) string {
	raw, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	return lines[len(lines)-1]
}

// awaitPlacement waits (up to placementWithin) for the pair's streams to be
// led by the preferred server, the steady state assets.preferred_leader
// asks for, so that a fault meets the cluster as it runs for months rather
// than in its first seconds. It does not judge: the run goes on either way.
func (r *scenarioRun) awaitPlacement(ctx context.Context, preferred string) {
	t0 := time.Now()
	for {
		m, err := r.c.LeaderMap("w")
		placed := err == nil
		for _, s := range PairStreams {
			placed = placed && m[s] == preferred
		}
		if placed {
			r.logf("pair streams led by %s after %s", preferred, time.Since(t0).Round(100*time.Millisecond))
			return
		}
		if time.Since(t0) > placementWithin || ctx.Err() != nil {
			r.logf("pair streams NOT led by the preferred %s after %s: %s", preferred, placementWithin, r.c.Leaders("w"))
			return
		}
		sleep(ctx, 250*time.Millisecond)
	}
}

// judge reads the oracle, the processes, the logs and the replayed record.
func (r *scenarioRun) judge(ctx context.Context) {
	c, res := r.c, r.res
	evs, err := c.Oracle()
	if err != nil {
		r.fail("oracle: %v", err)
		return
	}
	end := res.End
	ivs := Serving(evs, end)
	for _, iv := range ivs {
		res.Intervals = append(res.Intervals, iv.String())
	}
	r.logf("serving intervals: %s", strings.Join(res.Intervals, "; "))

	// Never two sites serving at once.
	for _, o := range Overlaps(ivs) {
		res.Overlaps = append(res.Overlaps, o.String())
		r.fail("SPLIT BRAIN by the oracle: %s", o)
	}

	// Availability after the fault.
	f := res.FaultStart
	if p, ok := FirstAfter(evs, KindPromote, NodeB, f); ok {
		res.FailoverMS = ms(p.At.Sub(f))
	}
	gaps := Gaps(ivs, f, end)
	if len(gaps) > 0 {
		res.FirstGapStartMS, res.FirstGapMS = ms(gaps[0].From.Sub(f)), ms(gaps[0].Duration())
	}
	for _, g := range gaps {
		res.UnavailableMS += *ms(g.Duration())
	}
	res.LongestGapAfterHealMS = *ms(Longest(Gaps(ivs, res.HealAt, end)).Duration())
	var since []Interval // the intervals from the fault on (the first is site-a's)
	for _, iv := range ivs {
		if iv.To.After(f) {
			since = append(since, iv)
		}
	}
	res.LeadershipChanges = LeadershipChanges(since)
	res.PromotesAfter, res.FencesAfter = Count(evs, KindPromote, f), Count(evs, KindFence, f)
	bound, boundName := AvailabilityBound, "failover_timeout + 2 × heartbeat_timeout"
	if r.sc.bound != 0 {
		bound, boundName = r.sc.bound, "(failure_threshold + 1) × heartbeat_timeout + fence_grace + heartbeat_timeout + failover_timeout + 2 × heartbeat_timeout"
	}
	if r.sc.replicaMust {
		if res.FailoverMS == nil {
			r.fail("availability: the primary's site was cut off at %s and site-b never promoted (bound %s)", f.Format("15:04:05.000"), bound)
		} else if *res.FailoverMS > float64(bound.Milliseconds()) {
			r.fail("availability: site-b promoted %s after the fault, over the bound %s = %s", fmtMS(res.FailoverMS), boundName, bound)
		}
	}
	if r.sc.primaryLost && len(gaps) > 0 && gaps[0].From.Before(f.Add(bound)) && gaps[0].To.After(f.Add(bound)) {
		r.fail("availability: nobody served from %s to %s (+%s..+%s after the fault), past the bound %s",
			gaps[0].From.Format("15:04:05.000"), gaps[0].To.Format("15:04:05.000"), gaps[0].From.Sub(f).Round(time.Millisecond), gaps[0].To.Sub(f).Round(time.Millisecond), bound)
	}

	// Exactly one site serving at the end.
	res.ServingAtEnd = ServingAt(ivs, end)
	if len(res.ServingAtEnd) != 1 {
		r.fail("end: %d sites serving %s after the heal (want exactly one): %v", len(res.ServingAtEnd), settle, res.ServingAtEnd)
	}

	// No member stopped.
	for _, site := range []string{"a", "b"} {
		if p := c.Node(site); !p.Running() {
			r.fail("%s: understudy serve exited: %v", nodeSite[site], p.ExitErr())
		}
		lines, err := StopLines(c.NodeLog(site))
		if err != nil {
			r.fail("%s: log: %v", nodeSite[site], err)
		}
		for _, l := range lines {
			r.fail("%s: a member stopped: %s", nodeSite[site], l)
		}
	}

	// The record, replayed: no split brain either.
	// JetStream may still be electing leaders after the heal (an isolated
	// server comes back with a higher raft term and unseats them): the
	// export is retried for a while, as an operator would.
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var rep *Replay
	for attempt := 1; ; attempt++ {
		rep, err = c.ExportReplay(rctx, r.witnessOr("b"))
		if err == nil {
			if attempt > 1 {
				r.logf("export succeeded at attempt %d", attempt)
			}
			break
		}
		if attempt == 15 || rctx.Err() != nil {
			r.fail("export/replay: %v", err)
			return
		}
		r.logf("export attempt %d: %v", attempt, err)
		sleep(rctx, 2*time.Second)
	}
	res.ReplaySplitBrain, res.ReplayFailovers, res.ReplayTenures = len(rep.SplitBrain), len(rep.Failovers), len(rep.Leadership)
	for _, sb := range rep.SplitBrain {
		r.fail("SPLIT BRAIN by the replayed record: %s", sb)
	}
}
