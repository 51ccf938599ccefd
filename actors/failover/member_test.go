package failover

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"understudy/actors/capability"
)

// TestTranscripts runs one transcript per case of the staleness-detection
// decision (node_*.txt: with leadership by node liveness, `pair
// leadership=node`). Regenerate with: go test ./actors/failover -run Transcripts -rewrite
// and review the diff.
func TestTranscripts(t *testing.T) {
	datadriven.Walk(t, filepath.Join("testdata", "transcripts"), func(t *testing.T, path string) {
		var w *world
		var out strings.Builder
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			out.Reset()
			arg := func(key string) (string, bool) {
				for _, a := range d.CmdArgs {
					if a.Key == key {
						if len(a.Vals) == 0 {
							return "", true
						}
						return a.Vals[0], true
					}
				}
				return "", false
			}
			dur := func(key string, def time.Duration) time.Duration {
				s, ok := arg(key)
				if !ok {
					return def
				}
				v, err := time.ParseDuration(s)
				if err != nil {
					d.Fatalf(t, "%s: %v", key, err)
				}
				return v
			}
			num := func(key string, def int) int {
				s, ok := arg(key)
				if !ok {
					return def
				}
				v, err := strconv.Atoi(s)
				if err != nil {
					d.Fatalf(t, "%s: %v", key, err)
				}
				return v
			}
			site := func() *node {
				s, ok := arg("site")
				if !ok {
					d.Fatalf(t, "site= required")
				}
				n := w.node[s]
				if n == nil {
					d.Fatalf(t, "unknown site %q", s)
				}
				return n
			}
			rulesFrom := func(base Rules) Rules {
				r := base
				r.HeartbeatTimeout = dur("hb", r.HeartbeatTimeout)
				r.FailureThreshold = num("ft", r.FailureThreshold)
				r.SuccessThreshold = num("st", r.SuccessThreshold)
				r.FailoverTimeout = dur("fo", r.FailoverTimeout)
				r.FenceGrace = dur("fg", r.FenceGrace)
				if s, ok := arg("sync"); ok {
					if v, err := ParseSynchronous(s); err == nil {
						r.Synchronous = v
					}
				}
				if _, ok := arg("maxlag"); ok {
					r.MaxLagOnFailover = uint64(num("maxlag", 0))
				}
				if s, ok := arg("failback"); ok {
					f, err := ParseFailback(s)
					if err != nil {
						return r
					}
					r.Failback = f
				}
				return r
			}
			switch d.Cmd {
			case "pair":
				rules := rulesFrom(DefaultRules("pg-main", "site-a", "site-b"))
				_, unsafe := arg("unsafe")
				opts := Options{AllowUnsafe: unsafe, CheckInterval: dur("check", 0), CheckFailures: num("checkfails", 0)}
				if wl, _ := arg("workload"); wl == "db" {
					opts.Rejoin, opts.Positions, opts.Synchronizer = true, true, true
				}
				nodeMode := false
				switch l, _ := arg("leadership"); l {
				case "", "per-pair":
				case "node":
					nodeMode = true
				default:
					d.Fatalf(t, "leadership must be node or per-pair")
				}
				if err := checkRules(rules, opts); err != nil {
					return "error: " + err.Error()
				}
				w = newWorld(t, rules, opts, nodeMode, &out)
				return "ok"
			case "start", "restart":
				w.start(site())
			case "run":
				until := w.now + dur("for", 0)
				if v, ok := arg("until"); ok {
					u, err := time.ParseDuration(v)
					if err != nil {
						d.Fatalf(t, "until: %v", err)
					}
					until = u
				}
				w.run(until)
			case "link":
				n := site()
				n.up = dur("up", n.up)
				n.down = dur("down", n.down)
				if s, ok := arg("drop"); ok {
					n.dropUp = s == "up" || s == "both"
					n.dropDown = s == "down" || s == "both"
				}
				n.watchLag = dur("watch", n.watchLag)
				n.lateEvery, n.lateBy = num("lateevery", n.lateEvery), dur("late", n.lateBy)
				extra := ""
				if n.watchLag > 0 {
					extra += fmt.Sprintf(" watch-lag=%v", n.watchLag)
				}
				if n.lateEvery > 0 {
					extra += fmt.Sprintf(" every %d answers one is %v late", n.lateEvery, n.lateBy)
				}
				w.logf(n.site, "link up=%v down=%v drop-up=%v drop-down=%v%s", n.up, n.down, n.dropUp, n.dropDown, extra)
			case "shutdown":
				n := site()
				w.logf(n.site, "host stopping: shutdown requested")
				w.step(n, Shutdown{})
			case "crash":
				n := site()
				n.alive = false
				w.logf(n.site, "CRASH (process and resource gone)")
				if n.live != nil {
					w.logf(n.nodeName, "liveness writer gone with the process")
				}
				w.setServing(n, false)
				if n.db != nil {
					n.db.role, n.db.syncSet = capability.RoleDown, false
				}
			case "commit":
				w.commit(capability.LSN(num("bytes", 1000)))
			case "db":
				n := site()
				if _, ok := arg("lag"); ok {
					n.db.lagBy = capability.LSN(num("lag", 0))
				}
				if v, ok := arg("cut"); ok {
					n.db.cut = v == "true"
				}
				if v, ok := arg("role"); ok && v == "down" {
					n.db.role = capability.RoleDown
					w.setServing(n, false)
				}
				w.stream()
				w.logf(n.site, "db lag-by=%d cut=%v role=%v received/flushed=%v", n.db.lagBy, n.db.cut, n.db.role, n.db.flush)
			case "jump":
				n := site()
				by := dur("by", 0)
				n.clockOffset += by
				w.logf(n.site, "monotonic clock jumps %v", by)
				if n.alive {
					if n.live != nil {
						w.handleLive(n, n.live.Step(w.local(n), Tick{}))
					}
					w.step(n, Tick{})
				}
			case "proc":
				n := site()
				kinds := map[string]ProcKind{"fence": ProcFence, "promote": ProcPromote, "demote": ProcDemote, "check": ProcCheck, "rejoin": ProcRejoin, "sync": ProcSync}
				k, _ := arg("kind")
				kind, ok := kinds[k]
				if !ok {
					d.Fatalf(t, "kind must be fence, promote, demote or check")
				}
				b := n.procs[kind]
				b.delay = dur("delay", b.delay)
				if r, ok := arg("result"); ok {
					b.fail = r == "fail"
				}
				n.procs[kind] = b
			case "switchover":
				to, _ := arg("to")
				id, _ := arg("id")
				w.logf("oper", "switchover requested to %s", to)
				w.put(SwitchoverKey(w.rules.Pair), EncodeSwitchover(Switchover{ID: id, To: to, Requested: w.serverTime()}))
			case "pause", "resume":
				id, _ := arg("id")
				reason, _ := arg("reason")
				w.logf("oper", "%s (id %s) %s", d.Cmd, id, reason)
				w.put(PauseKey(w.rules.Pair), EncodePause(Pause{ID: id, Paused: d.Cmd == "pause", Reason: reason, At: w.serverTime()}))
			case "failover":
				to, _ := arg("to")
				id, _ := arg("id")
				_, force := arg("force")
				w.logf("oper", "failover requested to %s force=%v", to, force)
				w.put(ManualFailoverKey(w.rules.Pair), EncodeManualFailover(ManualFailover{ID: id, To: to, Force: force, Requested: w.serverTime(), Within: dur("within", 0)}))
			case "forge":
				kind, _ := arg("kind")
				s, _ := arg("site")
				by, _ := arg("by")
				key, _ := arg("key")
				every := dur("every", 0)
				w.forge(kind, s, by, key, every, w.now+dur("for", 0))
			case "garbage":
				w.logf("oper", "a value that is not msgpack is written to the register")
				w.put(LeaderKey(w.rules.Pair), []byte("not msgpack \xc1"))
			case "config":
				r := rulesFrom(w.config)
				if checkRules(r, w.opts) == nil {
					w.config = r
				}
				w.logf("oper", "config written: hb=%v ft=%d st=%d fo=%v fg=%v", r.HeartbeatTimeout, r.FailureThreshold, r.SuccessThreshold, r.FailoverTimeout, r.FenceGrace)
				w.put(ConfigKey(w.rules.Pair), EncodeRules(r))
			case "state":
				for _, s := range w.sites {
					n := w.node[s]
					if n.m == nil {
						fmt.Fprintf(&out, "%s: not started\n", s)
						continue
					}
					paused := ""
					if n.m.Paused() {
						paused = " paused"
					}
					fmt.Fprintf(&out, "%s: alive=%v phase=%v term=%d serving=%v failures=%d%s\n", s, n.alive, n.m.Phase(), n.m.Term(), n.serving, n.m.Failures(), paused)
				}
				if e, ok := w.kv[LeaderKey(w.rules.Pair)]; ok {
					l, _ := DecodeLeader(e.value)
					lease := ""
					if w.nodeMode {
						lease = fmt.Sprintf(" on %s epoch %d", l.Node, l.Epoch)
					}
					fmt.Fprintf(&out, "register: %v%s rev=%d written %.3fs\n", l, lease, e.rev, e.at.Sub(epoch).Seconds())
				}
				for _, s := range w.sites {
					n := w.node[s]
					if !w.nodeMode {
						break
					}
					e, ok := w.kv[LivenessKey(n.nodeName)]
					if !ok {
						fmt.Fprintf(&out, "%s: no liveness record\n", n.nodeName)
						continue
					}
					l, _ := DecodeLiveness(e.value)
					writer := "down"
					if n.alive && n.live != nil {
						writer = fmt.Sprintf("writer in epoch %d, %d failed in a row", n.live.Epoch(), n.live.Failures())
					}
					fmt.Fprintf(&out, "liveness: %v rev=%d written %.3fs (%s)\n", l, e.rev, e.at.Sub(epoch).Seconds(), writer)
				}
				counts := map[string]int{}
				for _, s := range w.sites {
					for _, ev := range w.node[s].log {
						counts[ev.EventType()]++
					}
				}
				if n := counts["failover.promotion_rejected"] + counts["failover.acquire_failed"]; n > 0 {
					fmt.Fprintf(&out, "acquires refused or failed: %d\n", n)
				}
				if w.splits > 0 {
					fmt.Fprintf(&out, "split brains: %d\n", w.splits)
				}
				if w.opts.Rejoin {
					for _, s := range w.sites {
						d := w.node[s].db
						fmt.Fprintf(&out, "db %s: %v timeline=%d at=%v follows=%q sync=%v\n", s, d.role, d.timeline, d.flush, d.follows, d.syncSet)
					}
					fmt.Fprintf(&out, "acknowledged up to %v, lost %d bytes\n", w.wdb.acked, w.wdb.lost)
				}
			default:
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			if w != nil && w.splits > 0 && !w.opts.AllowUnsafe {
				t.Errorf("split brain with safe rules at %s", d.Pos)
			}
			if w != nil && w.wdb.lost > 0 && w.rules.Synchronous != SyncOff {
				t.Errorf("acknowledged commits lost with synchronous %v at %s", w.rules.Synchronous, d.Pos)
			}
			return out.String()
		})
	})
}
