package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"understudy/actors/failover"
)

// The rules of every pair (the node files set none: the defaults): the
// kill goal of issue 16 is failover_timeout + 2 × heartbeat_timeout, for
// the last pair.
var (
	defaultRules = failover.DefaultRules(pairName(0, 1), siteA, siteB)
	killGoal     = defaultRules.FailoverTimeout + 2*defaultRules.HeartbeatTimeout
)

type options struct {
	bin         string
	pairs       int
	mode        string
	topology    string
	duration    time.Duration
	sample      time.Duration
	serveWithin time.Duration
	kill        bool
	killWithin  time.Duration
	replay      bool
	jsonOut     string
	rev         string
	workDir     string
	keep        bool
	progress    bool
	pprof       bool
	killProfile string
	// The kill profiles' window: from this long after the kill, this long.
	killProfileFrom, killProfileFor time.Duration
	killTrace                       string
	promote                         string
}

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "", "the understudy binary to run (required)")
	flag.IntVar(&o.pairs, "pairs", 300, "number of pairs, each with a member on site-a (preferred primary) and on site-b")
	flag.StringVar(&o.mode, "mode", "", "leadership key written into the node files (per-pair or node); empty writes none: the binary's default")
	flag.StringVar(&o.topology, "topology", topoStore, "store: a third process runs only NATS; embedded: site-a embeds it")
	flag.DurationVar(&o.duration, "duration", time.Minute, "length of the steady phase, after all pairs serve (or -serve-within passed)")
	flag.DurationVar(&o.sample, "sample", 5*time.Second, "sampling interval of the steady phase")
	flag.DurationVar(&o.serveWithin, "serve-within", 0, "how long to wait for every pair to serve on site-a (0: 60s + 60ms per pair)")
	flag.BoolVar(&o.kill, "kill", false, "after the steady phase, SIGKILL site-a and time the takeover of every pair by site-b (store topology only)")
	flag.DurationVar(&o.killWithin, "kill-within", 0, "how long to wait for site-b to hold every pair after the kill (0: 60s + 10ms per pair)")
	flag.BoolVar(&o.replay, "replay", true, "at the end, replay every pair's record and count the pairs with two serving members")
	flag.StringVar(&o.rev, "rev", "", "the revision measured, as a label for the result (the script passes it)")
	flag.StringVar(&o.jsonOut, "json-out", "", "append the result as one JSON line to this file")
	flag.StringVar(&o.workDir, "workdir", "", "parent of the run's temporary directory (default: $TMPDIR)")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary directory (node files, logs, JetStream store)")
	flag.BoolVar(&o.progress, "progress", false, "show progress on stderr")
	flag.StringVar(&o.promote, "promote", promoteExec, "each member's promote procedure: exec (one step running `true`: a process started per promotion) or none (no step: the takeover costs the node no process)")
	flag.BoolVar(&o.pprof, "pprof", false, "member nodes serve Go's profiler on a free loopback port (see each node's log for the address); needs a binary that knows the pprof key")
	flag.StringVar(&o.killProfile, "kill-profile", "", "with -pprof and -kill: write site-b's CPU profile after the kill (see -kill-profile-from and -kill-profile-for) to this file, and the store's to this file with .store appended")
	flag.DurationVar(&o.killProfileFrom, "kill-profile-from", 0, "with -kill-profile: start the profiles this long after the kill (whole seconds)")
	flag.DurationVar(&o.killProfileFor, "kill-profile-for", 30*time.Second, "with -kill-profile: profile this long (whole seconds, at least 1s)")
	flag.StringVar(&o.killTrace, "kill-trace", "", "with -pprof and -kill: write site-b's execution trace (go tool trace) of the takeover, from 3.5 s to 8.5 s after the kill, to this file")
	flag.Parse()
	switch {
	case o.bin == "":
		fatal(errors.New("-bin is required: build it with go build -o DIR ./cmd/understudy"))
	case o.pairs < 1:
		fatal(errors.New("-pairs must be at least 1"))
	case o.mode != "" && o.mode != "per-pair" && o.mode != "node":
		fatal(fmt.Errorf("-mode %q: per-pair, node, or empty for none", o.mode))
	case o.topology != topoStore && o.topology != topoEmbedded:
		fatal(fmt.Errorf("-topology %q: %s or %s", o.topology, topoStore, topoEmbedded))
	case o.promote != promoteExec && o.promote != promoteNone:
		fatal(fmt.Errorf("-promote %q: %s or %s", o.promote, promoteExec, promoteNone))
	case o.kill && o.topology != topoStore:
		fatal(errors.New("-kill needs -topology store: with embedded, killing site-a kills the store"))
	case o.killProfileFrom < 0 || o.killProfileFrom%time.Second != 0:
		fatal(fmt.Errorf("-kill-profile-from %v: whole seconds, not negative", o.killProfileFrom))
	case o.killProfileFor < time.Second || o.killProfileFor%time.Second != 0:
		fatal(fmt.Errorf("-kill-profile-for %v: whole seconds, at least 1s", o.killProfileFor))
	}
	if o.serveWithin == 0 {
		o.serveWithin = time.Minute + time.Duration(o.pairs)*60*time.Millisecond
	}
	if o.killWithin == 0 {
		o.killWithin = time.Minute + time.Duration(o.pairs)*10*time.Millisecond
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	r, err := measure(ctx, o)
	if r != nil {
		fmt.Println(r.line())
		if o.jsonOut != "" {
			if jerr := appendJSON(o.jsonOut, r); jerr != nil {
				fmt.Fprintln(os.Stderr, "bench-pairs:", jerr)
			}
		}
	}
	if err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "bench-pairs:", err)
	os.Exit(1)
}

func appendJSON(path string, r *result) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		f.Close()
		return err
	}
	_, err = f.Write(append(b, '\n'))
	return errors.Join(err, f.Close())
}

// progressf writes a progress line to stderr: overwriting the previous
// one while a phase goes on, then kept (final) at its end.
func (o options) progressf(final bool, format string, args ...any) {
	if !o.progress {
		return
	}
	end := ""
	if final {
		end = "\n"
	}
	fmt.Fprintf(os.Stderr, "\r\033[K[%d pairs, %s] %s%s", o.pairs, modeName(o.mode), fmt.Sprintf(format, args...), end)
}

func modeName(m string) string {
	if m == "" {
		return "unset"
	}
	return m
}

// measure runs one deployment through the phases. It returns the result
// so far along with an error, so that a failed kill phase still reports
// the steady state.
func measure(ctx context.Context, o options) (*result, error) {
	dir, err := os.MkdirTemp(o.workDir, "bench-pairs-")
	if err != nil {
		return nil, err
	}
	if o.keep {
		fmt.Fprintln(os.Stderr, "bench-pairs: keeping", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	r := &result{Rev: o.rev, Mode: modeName(o.mode), Pairs: o.pairs, Topology: o.topology, Promote: o.promote, DurationS: o.duration.Seconds(), LoadStart: loadavg()}

	o.progressf(false, "starting the nodes")
	c, started, err := startCluster(ctx, o, dir)
	if err != nil {
		return nil, err
	}
	defer c.stop()
	nc, err := nats.Connect(c.natsURL, nats.Name("bench-pairs"), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", c.natsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	pairs := make([]string, o.pairs)
	for i := range pairs {
		pairs[i] = pairName(i, o.pairs)
	}
	alive := func() error {
		if bad := c.unexpectedExits(); len(bad) > 0 {
			return fmt.Errorf("exited: %s", strings.Join(bad, ", "))
		}
		return nil
	}

	// Phase 1: until every pair serves on site-a and both nodes are ready
	// (all their members started: none of their start-up is measured).
	var regs map[string]register
	src := &registerSource{node: o.mode == "node", nc: nc, js: js, pairs: pairs}
	defer src.stop()
	for {
		if ref := c.refusals(); len(ref) > 0 {
			r.RefusedAtStart = ref
			r.LoadEnd = loadavg()
			fmt.Fprintf(os.Stderr, "bench-pairs: refused at start: %s\n", strings.Join(ref, "; "))
			return r, nil
		}
		if err := alive(); err != nil {
			return nil, err
		}
		if got, err := src.read(ctx); err == nil {
			regs = got
		} else if r.snapshotFailed(ctx, err) != nil {
			return nil, err
		}
		n := countServing(regs, siteA)
		el := time.Since(started)
		o.progressf(false, "starting: %d/%d serve on site-a after %.0fs", n, o.pairs, el.Seconds())
		if n == o.pairs && isClosed(c.a.ready) && isClosed(c.b.ready) { // both nodes' members all started
			r.TimeToServingS = round(el.Seconds(), 1)
			break
		}
		if el > o.serveWithin {
			r.TimeToServingS = -1
			break
		}
		sleep(ctx, time.Second)
	}
	if r.TimeToServingS >= 0 {
		o.progressf(true, "all %d pairs serve on site-a after %.1fs", o.pairs, r.TimeToServingS)
	} else {
		o.progressf(true, "only %d/%d pairs serve on site-a after %s; measuring anyway", countServing(regs, siteA), o.pairs, o.serveWithin)
	}

	// Phase 2: the steady state.
	if err := steady(ctx, o, c, src, pairs, regs, r); err != nil {
		return r, err
	}
	if err := alive(); err != nil {
		return r, err
	}

	// Phase 3: the death of site-a.
	end := time.Now()
	if o.kill {
		if err := killPhase(ctx, o, c, src, nc, js, pairs, r); err != nil {
			return r, err
		}
		end = time.Now()
	}

	r.LoadEnd = loadavg()
	r.WarnLinesA, r.ErrorLinesA = c.a.warns.Load(), c.a.errors.Load()
	r.WarnLinesB, r.ErrorLinesB = c.b.warns.Load(), c.b.errors.Load()

	// The record, up to end: two serving members at once, and the
	// failovers it shows. The replay reads through consumers, of which the
	// store allows 1,000 per stream and the members' watches may hold them
	// all: the members are stopped first (the record is complete up to end;
	// with the embedded topology site-a is the store and stays).
	if o.replay {
		if c.store != nil {
			c.a.kill()
		}
		c.b.kill()
		if err := waitConsumers(ctx, js, o); err != nil {
			r.ReplayError = err.Error()
			return r, nil
		}
		split, fo, err := splitBrains(ctx, js, pairs, started, end, func(done int) {
			if done%max(1, o.pairs/100) == 0 {
				o.progressf(false, "replaying the record: %d/%d pairs", done, o.pairs)
			}
		})
		if err != nil {
			r.ReplayError = err.Error()
			o.progressf(true, "replay failed: %v", err)
			return r, nil
		}
		o.progressf(true, "replayed %d pairs: %d with two serving members, %d failovers", o.pairs, len(split), fo)
		r.SplitBrainPairs = len(split)
		r.ReplayFailovers = fo
		r.Replayed = true
		for _, p := range slices.Sorted(maps.Keys(split)) {
			rep := split[p]
			if len(r.SplitBrain) < 5 {
				r.SplitBrain = append(r.SplitBrain, splitBrainOf(rep))
			}
			fmt.Fprintf(os.Stderr, "bench-pairs: %s: two serving members: %s\n", p, describeOverlaps(rep))
			if o.keep {
				if b, err := json.MarshalIndent(rep, "", "  "); err == nil {
					_ = os.WriteFile(filepath.Join(dir, "replay-"+p+".json"), b, 0o644)
				}
			}
		}
	}
	return r, nil
}

// waitConsumers waits until the failover bucket's stream has room for the
// replay's consumers: the killed members' ephemeral consumers linger until
// the store notices their connections are gone.
func waitConsumers(ctx context.Context, js jetstream.JetStream, o options) error {
	const room = 900 // of nats-server's default 1,000 per stream
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := js.Stream(ctx, kvStream)
		if err != nil {
			return err
		}
		info, err := st.Info(ctx)
		if err != nil {
			return err
		}
		n := info.State.Consumers
		if n < room {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replay skipped: %d consumers still on %s two minutes after the members stopped", n, kvStream)
		}
		o.progressf(false, "waiting for the stopped members' %d consumers to go before the replay", n)
		sleep(ctx, time.Second)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// snapshotFailed counts a snapshot of the registers that the store did
// not answer in time (it is overloaded: that is a result, not the end of
// the run); it returns an error only when the run is cancelled.
func (r *result) snapshotFailed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	r.SnapshotErrors++
	fmt.Fprintln(os.Stderr, "\nbench-pairs: a snapshot of the registers failed (counted in snapshot_errors):", err)
	return nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func countServing(regs map[string]register, site string) int {
	n := 0
	for _, r := range regs {
		if r.serves(site) {
			n++
		}
	}
	return n
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// cpuMark is the CPU time of the processes and of the machine at a moment.
type cpuMark struct {
	at          time.Time
	procs       []time.Duration // store, site-a, site-b (0 for a missing process)
	busy, total time.Duration   // the machine's
}

func markCPU(c *cluster) cpuMark {
	m := cpuMark{at: time.Now()}
	for _, p := range []*proc{c.store, c.a, c.b} {
		var d time.Duration
		if p != nil && p.alive() {
			d, _ = procCPU(p.pid())
		}
		m.procs = append(m.procs, d)
	}
	m.busy, m.total, _ = machineCPU()
	return m
}

// percent of one core used between two marks by process i.
func (m cpuMark) percent(since cpuMark, i int) float64 {
	return 100 * (m.procs[i] - since.procs[i]).Seconds() / m.at.Sub(since.at).Seconds()
}

// steady samples the deployment for o.duration.
func steady(ctx context.Context, o options, c *cluster, src *registerSource, pairs []string, base map[string]register, r *result) error {
	js := src.js
	seq0, err := readSeqs(ctx, js)
	if err != nil {
		return err
	}
	cpu0 := markCPU(c)
	t0 := cpu0.at
	changed := map[string]bool{} // pairs whose leadership moved during the phase
	var (
		rssMax  [3]uint64
		last    map[string]register
		lastA   memberMetrics
		lastB   memberMetrics
		samples int
	)
	for {
		sleep(ctx, min(o.sample, time.Until(t0.Add(o.duration))))
		if ctx.Err() != nil {
			return ctx.Err()
		}
		regs, err := src.read(ctx)
		if err != nil {
			if err := r.snapshotFailed(ctx, err); err != nil {
				return err
			}
			if time.Since(t0) < o.duration {
				continue
			}
			regs = last // the phase ends on the last snapshot that answered
		}
		samples++
		offA := 0
		for _, p := range pairs {
			if regs == nil {
				break // no snapshot answered in the whole phase
			}
			now, b := regs[p], base[p]
			if !now.serves(siteA) {
				offA++
			}
			if now.site != b.site || now.term != b.term {
				changed[p] = true
			}
		}
		ma, errA := scrapeMembers(ctx, c.a.httpAddr.Load().(string))
		mb, errB := scrapeMembers(ctx, c.b.httpAddr.Load().(string))
		if err := errors.Join(errA, errB); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.ScrapeErrors++
			fmt.Fprintln(os.Stderr, "\nbench-pairs: a scrape of /metrics failed (counted in scrape_errors):", err)
			if errA != nil {
				ma = lastA
			}
			if errB != nil {
				mb = lastB
			}
		}
		dual := 0
		for p := range ma.serving {
			if mb.serving[p] {
				dual++
			}
		}
		for i, p := range []*proc{c.store, c.a, c.b} {
			if p != nil && p.alive() {
				if v, err := procRSS(p.pid()); err == nil {
					rssMax[i] = max(rssMax[i], v)
				}
			}
		}
		seq, err := readSeqs(ctx, js)
		if err != nil {
			return err
		}
		el := time.Since(t0)
		r.OffAMax = max(r.OffAMax, offA)
		r.FailingMembersMax = max(r.FailingMembersMax, ma.failing+mb.failing)
		r.DualServingSeen = max(r.DualServingSeen, dual)
		if ma.hasStore || mb.hasStore {
			r.StoreMetrics = true
			r.DegradedSamplesA += b2i(ma.degraded)
			r.DegradedSamplesB += b2i(mb.degraded)
			r.WriteLatencyMaxMS = max(r.WriteLatencyMaxMS, ms(ma.writeLatency), ms(mb.writeLatency))
		}
		last, lastA, lastB = regs, ma, mb
		o.progressf(false, "steady %.0f/%.0fs: off site-a %d, moved %d, failing members %d, kv writes/s %.0f",
			el.Seconds(), o.duration.Seconds(), offA, len(changed), ma.failing+mb.failing, float64(seq.kv-seq0.kv)/el.Seconds())
		if el >= o.duration {
			cpu1 := markCPU(c)
			secs := cpu1.at.Sub(t0).Seconds()
			r.KVWritesPerS = round(float64(seq.kv-seq0.kv)/secs, 1)
			r.EventWritesPerS = round(float64(seq.events-seq0.events)/secs, 1)
			if c.store != nil {
				r.CPUStore = round(cpu1.percent(cpu0, 0), 1)
				r.RSSStoreMB = mb1(rssMax[0])
			}
			r.CPUA, r.CPUB = round(cpu1.percent(cpu0, 1), 1), round(cpu1.percent(cpu0, 2), 1)
			r.RSSAMB, r.RSSBMB = mb1(rssMax[1]), mb1(rssMax[2])
			per := 1000 / float64(o.pairs)
			r.CPUPer1000 = round((r.CPUA+r.CPUB)/2*per, 1)
			r.RSSPer1000MB = round((r.RSSAMB+r.RSSBMB)/2*per, 1)
			mine := cpu1.procs[0] + cpu1.procs[1] + cpu1.procs[2] - cpu0.procs[0] - cpu0.procs[1] - cpu0.procs[2]
			r.OthersCPU = round(100*(cpu1.busy-cpu0.busy-mine).Seconds()/secs, 1)
			r.MachineBusy = round(100*(cpu1.busy-cpu0.busy).Seconds()/(cpu1.total-cpu0.total).Seconds(), 1)
			break
		}
	}
	r.Samples = samples
	r.Serving = countServing(last, siteA)
	r.SpuriousFailovers = len(changed)
	r.FailingMembers = lastA.failing + lastB.failing
	r.MetricsServingA, r.MetricsServingB = len(lastA.serving), len(lastB.serving)
	counts, err := readEventCounts(ctx, js, t0, time.Now())
	if err != nil {
		return err
	}
	r.PromotedB, r.PromotedA = counts["failover.promoted@"+siteB], counts["failover.promoted@"+siteA]
	r.FencedA = counts["failover.fenced@"+siteA]
	r.HeartbeatFailedEvents = counts["failover.heartbeat_failed@"+siteA] + counts["failover.heartbeat_failed@"+siteB]
	o.progressf(true, "steady %.0fs: %d/%d serve on site-a, %d moved, %d promotions on site-b, kv writes/s %.0f, cpu store %.0f%% a %.0f%% b %.0f%%",
		o.duration.Seconds(), r.Serving, o.pairs, r.SpuriousFailovers, r.PromotedB, r.KVWritesPerS, r.CPUStore, r.CPUA, r.CPUB)
	return nil
}

// servingWithin bounds the wait for the survivor's serving_started
// events to be in the record after it took every register.
const servingWithin = 3 * time.Minute

// killPhase SIGKILLs site-a and waits until site-b holds every pair that
// site-a held, then dates each takeover from the record.
func killPhase(ctx context.Context, o options, c *cluster, src *registerSource, nc *nats.Conn, js jetstream.JetStream, pairs []string, r *result) error {
	before, err := src.read(ctx)
	if err != nil {
		return err
	}
	held := map[string]bool{}
	for p, reg := range before {
		if reg.serves(siteA) {
			held[p] = true
		}
	}
	r.KillHeldByA = len(held)
	var profiled sync.WaitGroup
	if o.killProfile != "" {
		for _, p := range []*proc{c.b, c.store} {
			if p == nil {
				continue
			}
			file := o.killProfile
			if p != c.b {
				file += "." + p.name
			}
			profiled.Go(func() {
				select {
				case <-time.After(o.killProfileFrom):
				case <-ctx.Done():
					return
				}
				if err := profileCPU(ctx, p.pprofAddr.Load().(string), o.killProfileFor, file); err != nil {
					o.progressf(true, "%s's CPU profile after the kill: %v", p.name, err)
				}
			})
		}
	}
	if o.killTrace != "" {
		profiled.Go(func() {
			select {
			case <-time.After(3500 * time.Millisecond):
			case <-ctx.Done():
				return
			}
			url := fmt.Sprintf("http://%s/debug/pprof/trace?seconds=5", c.b.pprofAddr.Load().(string))
			if err := fetchTo(ctx, url, 40*time.Second, o.killTrace); err != nil {
				o.progressf(true, "site-b's execution trace after the kill: %v", err)
			}
		})
	}
	tKill := time.Now()
	c.a.kill()
	r.Killed = true
	defer profiled.Wait()
	for {
		regs, err := src.read(ctx)
		if err != nil {
			if err := r.snapshotFailed(ctx, err); err != nil {
				return err
			}
		}
		n := 0
		for p := range held {
			if regs[p].serves(siteB) {
				n++
			}
		}
		el := time.Since(tKill)
		o.progressf(false, "site-a killed %.1fs ago: site-b holds %d/%d of its pairs", el.Seconds(), n, len(held))
		if n == len(held) || el > o.killWithin {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		sleep(ctx, 250*time.Millisecond)
	}
	time.Sleep(2 * time.Second) // the last promotions' serving_started events
	if o.keep {
		// The survivor's store gate and store health, for the run's record.
		if err := saveMetrics(ctx, c.b.httpAddr.Load().(string), filepath.Join(filepath.Dir(c.b.logPath), "site-b.metrics")); err != nil {
			o.progressf(true, "site-b's metrics after the kill: %v", err)
		}
	}
	if mb, err := scrapeMembers(ctx, c.b.httpAddr.Load().(string)); err == nil {
		r.KillMetricsServingB = len(mb.serving)
	}
	// The survivor appends its events after it acts (thousands of
	// takeovers queue thousands of appends): read the record until every
	// pair it took has its serving_started, or servingWithin has passed.
	// Each event is dated when it happened (Record.Occurred), not when it
	// was stored.
	var tos map[string]*takeover
	for waited := time.Now(); ; {
		tos, err = readTakeovers(ctx, nc, js, tKill.Add(-2*defaultRules.FailoverTimeout), tKill)
		if err != nil {
			return err
		}
		missing := 0
		for p := range held {
			if t := tos[p]; t == nil || t.serving.IsZero() {
				missing++
			}
		}
		if missing == 0 || time.Since(waited) > servingWithin || ctx.Err() != nil {
			break
		}
		o.progressf(false, "site-a killed: %d of %d takeovers without serving_started in the record yet", missing, len(held))
		sleep(ctx, 5*time.Second)
	}
	var acq, srv, beat []float64
	for p := range held {
		t := tos[p]
		if t == nil || t.acquired.IsZero() {
			r.KillMissing++
			continue
		}
		acq = append(acq, ms(t.acquired.Sub(tKill)))
		if !t.serving.IsZero() {
			srv = append(srv, ms(t.serving.Sub(tKill)))
		} else {
			r.KillNotServing++
		}
		if !t.lastBeat.IsZero() {
			beat = append(beat, ms(t.acquired.Sub(t.lastBeat)))
		}
	}
	r.KillGoalMS = ms(killGoal)
	r.KillLastMS, r.KillMedianMS = lastAndMedian(acq)
	r.KillServingLastMS, r.KillServingMedianMS = lastAndMedian(srv)
	r.KillFromBeatLastMS, r.KillFromBeatMedianMS = lastAndMedian(beat)
	o.progressf(true, "site-a killed: the last of %d pairs acquired by site-b after %.0f ms (median %.0f), serving after %.0f ms; %d never",
		len(held), r.KillLastMS, r.KillMedianMS, r.KillServingLastMS, r.KillMissing)
	return nil
}

func lastAndMedian(xs []float64) (last, median float64) {
	if len(xs) == 0 {
		return -1, -1
	}
	slices.Sort(xs)
	return xs[len(xs)-1], xs[len(xs)/2]
}

func ms(d time.Duration) float64 { return round(float64(d.Microseconds())/1000, 0) }

func mb1(b uint64) float64 { return round(float64(b)/(1<<20), 1) }

func round(v float64, digits int) float64 {
	p := math.Pow10(digits)
	return math.Round(v*p) / p
}

// profileCPU writes the CPU profile of the process serving Go's profiler
// at addr, over d, to file.
func profileCPU(ctx context.Context, addr string, d time.Duration, file string) error {
	if addr == "" {
		return errors.New("no pprof address in the node's log (run with -pprof)")
	}
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(d.Seconds()))
	return fetchTo(ctx, url, d+30*time.Second, file)
}

// fetchTo writes what url answers to file.
func fetchTo(ctx context.Context, url string, timeout time.Duration, file string) error {
	return httpGet(ctx, url, timeout, func(body io.Reader) error {
		f, err := os.Create(file)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, body); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	})
}

// saveMetrics writes the understudy_store_ lines of the /metrics at addr
// to file.
func saveMetrics(ctx context.Context, addr, file string) error {
	return httpGet(ctx, "http://"+addr+"/metrics", 20*time.Second, func(body io.Reader) error {
		all, err := io.ReadAll(body)
		if err != nil {
			return err
		}
		var keep []string
		for _, l := range strings.Split(string(all), "\n") {
			if strings.HasPrefix(l, "understudy_store_") {
				keep = append(keep, l)
			}
		}
		return os.WriteFile(file, []byte(strings.Join(keep, "\n")+"\n"), 0o644)
	})
}
