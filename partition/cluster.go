package partition

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The pair every cluster runs, and the names of its two member sites.
const (
	PairName = "pg-main"
	NodeA    = "site-a"
	NodeB    = "site-b"
)

// Rules of the pair: the documented defaults.
const (
	HeartbeatTimeout = time.Second
	FailoverTimeout  = 5 * time.Second
	FailureThreshold = 2
	FenceGrace       = 2 * time.Second
	// AvailabilityBound is how soon after the primary's site loses the
	// cluster the replica must serve: failover_timeout + 2 × heartbeat_timeout.
	AvailabilityBound = FailoverTimeout + 2*HeartbeatTimeout
	// LandingHolderBound is the bound when the primary's register writes
	// may still land while it hears nothing back (one-way cuts, delay and
	// loss): it fences within (failure_threshold + 1) heartbeats and
	// fence_grace, says so in its next register write (one heartbeat
	// later), and a holder whose writes land is taken over once it has
	// stayed fenced for failover_timeout (docs/failover.md); 2 heartbeats
	// for the takeover's CAS, as in AvailabilityBound.
	LandingHolderBound = (FailureThreshold+1)*HeartbeatTimeout + FenceGrace + HeartbeatTimeout + FailoverTimeout + 2*HeartbeatTimeout
)

// nodeSite maps a lab site to the pair member it hosts (the witness hosts none).
var nodeSite = map[string]string{"a": NodeA, "b": NodeB}

// Binaries are the programs a cluster runs.
type Binaries struct {
	Understudy string
	NATSServer string
}

// Cluster is one three-site NATS cluster (nats-a, nats-b, nats-w) in a lab,
// with understudy nodes on sites a and b running the pair's two members.
// Each member's procedures are scripts that append to its site's oracle file.
type Cluster struct {
	Lab *Lab
	Dir string
	Bin Binaries
	// PreferredLeader, when set, is written as assets.preferred_leader.
	PreferredLeader string

	mu    sync.Mutex
	nats  map[string]*Proc
	nodes map[string]*Proc
	all   procs
}

// NewCluster writes the configuration files of a cluster into dir.
func NewCluster(lab *Lab, dir string, bin Binaries, preferredLeader string) (*Cluster, error) {
	c := &Cluster{Lab: lab, Dir: dir, Bin: bin, PreferredLeader: preferredLeader, nats: map[string]*Proc{}, nodes: map[string]*Proc{}}
	script := "#!/bin/sh\n# oracle <kind> <site> <file>: one line, on the machine's one clock\nprintf '%s %s %s\\n' \"$1\" \"$(date +%s%N)\" \"$2\" >> \"$3\"\n"
	if err := os.WriteFile(filepath.Join(dir, "oracle.sh"), []byte(script), 0o755); err != nil {
		return nil, err
	}
	for name := range lab.Sites {
		if err := os.MkdirAll(filepath.Join(dir, "nats-"+name), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(c.natsConfPath(name), []byte(c.natsConf(name)), 0o644); err != nil {
			return nil, err
		}
	}
	for name := range nodeSite {
		if err := os.WriteFile(c.nodeFilePath(name), []byte(c.nodeFile(name)), 0o644); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *Cluster) natsConfPath(site string) string {
	return filepath.Join(c.Dir, "nats-"+site, "nats.conf")
}

// NATSLog is the log file of a site's NATS server (all its runs).
func (c *Cluster) NATSLog(site string) string { return filepath.Join(c.Dir, "nats-"+site, "nats.log") }

func (c *Cluster) nodeFilePath(site string) string {
	return filepath.Join(c.Dir, nodeSite[site]+".yaml")
}

// NodeLog is the log file of a site's understudy node.
func (c *Cluster) NodeLog(site string) string { return filepath.Join(c.Dir, nodeSite[site]+".log") }

// OracleFile is the oracle file of a pair member.
func (c *Cluster) OracleFile(node string) string { return filepath.Join(c.Dir, "oracle-"+node+".log") }

// ClientURL is the client URL of a site's NATS server.
func (c *Cluster) ClientURL(site string) string { return "nats://" + c.Lab.Sites[site].IP + ":4222" }

func (c *Cluster) natsConf(site string) string {
	s := c.Lab.Sites[site]
	var routes []string
	for _, other := range []string{"a", "b", "w"} {
		if other != site {
			routes = append(routes, fmt.Sprintf("%q", "nats-route://"+c.Lab.Sites[other].IP+":6222"))
		}
	}
	return fmt.Sprintf(`# site %s of the partition suite
server_name: nats-%s
listen: "%s:4222"
http: "%s:8222"
jetstream {
  store_dir: %q
  # every write fsynced before the ack: leadership is decided on these
  sync_interval: always
}
cluster {
  name: understudy-partition
  listen: "%s:6222"
  routes: [%s]
}
`, site, site, s.IP, s.IP, filepath.Join(c.Dir, "nats-"+site, "js"), s.IP, strings.Join(routes, ", "))
}

func (c *Cluster) nodeFile(site string) string {
	node := nodeSite[site]
	urls := []string{c.ClientURL(site)} // the local server first
	for _, other := range []string{"a", "b", "w"} {
		if other != site {
			urls = append(urls, c.ClientURL(other))
		}
	}
	preferred := ""
	if c.PreferredLeader != "" {
		preferred = "  preferred_leader: " + c.PreferredLeader + "\n"
	}
	step := func(kind string) string {
		return fmt.Sprintf(`        steps:
          - name: oracle-%s
            driver: exec
            timeout: 1s
            exec: {command: /bin/sh, args: [%q, %s, %s, %q]}
`, kind, filepath.Join(c.Dir, "oracle.sh"), kind, node, c.OracleFile(node))
	}
	return fmt.Sprintf(`node: %s
%snats:
  url: %q
  retry: {initial: 250ms, max: 2s}
assets:
  replicas: 3
%shttp: "127.0.0.1:9464"
log: {level: info, format: text}
pairs:
  - pair: %s
    primary: %s
    replica: %s
    heartbeat_timeout: %s
    failure_threshold: 2
    success_threshold: 2
    failover_timeout: %s
    fence_grace: 2s
    failback: auto
    procedures:
      fence:
%s      promote:
%s      demote:
%s`, node, TestLeadership(), strings.Join(urls, ","), preferred, PairName, NodeA, NodeB, HeartbeatTimeout, FailoverTimeout,
		step(KindFence), step(KindPromote), step(KindDemote))
}

// StartNATS starts (or restarts, on the same store) a site's NATS server.
func (c *Cluster) StartNATS(site string) error {
	p, err := c.Lab.Start(site, "nats-"+site, c.NATSLog(site), nil, c.Bin.NATSServer, "-c", c.natsConfPath(site))
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.nats[site] = p
	c.mu.Unlock()
	c.all.add(p)
	return nil
}

// KillNATS kills a site's NATS server with SIGKILL.
func (c *Cluster) KillNATS(site string) {
	c.mu.Lock()
	p := c.nats[site]
	c.mu.Unlock()
	if p != nil {
		p.Kill()
	}
}

// SignalNATS sends a signal to a site's NATS server (SIGSTOP freezes it
// with its connections open, SIGCONT resumes it).
func (c *Cluster) SignalNATS(site string, sig syscall.Signal) error {
	c.mu.Lock()
	p := c.nats[site]
	c.mu.Unlock()
	if p == nil || !p.Running() {
		return fmt.Errorf("nats-%s is not running", site)
	}
	return p.cmd.Process.Signal(sig)
}

// StartNode starts a site's understudy node.
func (c *Cluster) StartNode(site string) error {
	p, err := c.Lab.Start(site, nodeSite[site], c.NodeLog(site), nil, c.Bin.Understudy, "serve", "--config", c.nodeFilePath(site))
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.nodes[site] = p
	c.mu.Unlock()
	c.all.add(p)
	return nil
}

// Node is a site's understudy process.
func (c *Cluster) Node(site string) *Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[site]
}

// Close stops the nodes (SIGTERM: they hand over and exit), then kills
// every process the cluster started.
func (c *Cluster) Close() {
	c.mu.Lock()
	nodes := []*Proc{c.nodes["a"], c.nodes["b"]}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range nodes {
		if p != nil {
			wg.Go(func() { p.Stop(5 * time.Second) })
		}
	}
	wg.Wait()
	c.all.killAll()
}

// Oracle reads both members' oracle files, merged in time order.
func (c *Cluster) Oracle() ([]Event, error) {
	var all []Event
	for _, node := range []string{NodeA, NodeB} {
		f, err := os.Open(c.OracleFile(node))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		evs, err := ParseOracle(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.OracleFile(node), err)
		}
		all = append(all, evs...)
	}
	SortEvents(all)
	return all, nil
}

// stopLineRE matches a node's log line saying a member stops for good.
var stopLineRE = regexp.MustCompile(`member stops|member fences its resource and stops`)

// StopLines returns a node log's lines that say a member stopped.
func StopLines(logPath string) ([]string, error) {
	return grepFile(logPath, stopLineRE, 0)
}

// levelRE matches warning and error lines of the text log format.
var levelRE = regexp.MustCompile(`level=(WARN|ERROR)`)

// Trouble returns the last max warning and error lines of a node log.
func Trouble(logPath string, max int) []string {
	lines, _ := grepFile(logPath, levelRE, max)
	return lines
}

func grepFile(path string, re *regexp.Regexp, last int) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if re.MatchString(sc.Text()) {
			out = append(out, sc.Text())
			if last > 0 && len(out) > last {
				out = out[1:]
			}
		}
	}
	return out, sc.Err()
}

// Replay is what the suite reads of `understudy replay --format json`.
type Replay struct {
	SplitBrain []json.RawMessage `json:"split_brain"`
	Failovers  []json.RawMessage `json:"failovers"`
	Handovers  []json.RawMessage `json:"handovers"`
	Leadership []json.RawMessage `json:"leadership"`
}

// ExportReplay exports the pair's record through the NATS server of site
// (from inside its namespace) and replays it.
func (c *Cluster) ExportReplay(ctx context.Context, site string) (*Replay, error) {
	file := filepath.Join(c.Dir, "record.export")
	ns := c.Lab.Sites[site].NS
	if _, err := run(ctx, "ip", "netns", "exec", ns, c.Bin.Understudy, "export", "--nats-url", c.ClientURL(site), "--pair", PairName, "--out", file); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, c.Bin.Understudy, "replay", "--file", file, "--format", "json", "--out", filepath.Join(c.Dir, "replay.json"))
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("understudy replay: %v: %s", err, bytes.TrimSpace(out))
	}
	raw, err := os.ReadFile(filepath.Join(c.Dir, "replay.json"))
	if err != nil {
		return nil, err
	}
	var r Replay
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("replay json: %w", err)
	}
	return &r, nil
}

// LeaderMap asks a site's NATS server (its monitoring port, from inside its
// namespace) which servers lead the meta group ("meta") and each stream.
func (c *Cluster) LeaderMap(site string) (map[string]string, error) {
	body, err := c.Lab.HTTPGet(site, c.Lab.Sites[site].IP+":8222", "/jsz?accounts=true&streams=true", 2*time.Second)
	if err != nil {
		return nil, err
	}
	var jsz struct {
		Meta *struct {
			Leader string `json:"leader"`
		} `json:"meta_cluster"`
		Accounts []struct {
			Streams []struct {
				Name    string `json:"name"`
				Cluster *struct {
					Leader string `json:"leader"`
				} `json:"cluster"`
			} `json:"stream_detail"`
		} `json:"account_details"`
	}
	if err := json.Unmarshal(body, &jsz); err != nil {
		return nil, fmt.Errorf("jsz of nats-%s: %w", site, err)
	}
	out := map[string]string{}
	if jsz.Meta != nil {
		out["meta"] = jsz.Meta.Leader
	}
	for _, a := range jsz.Accounts {
		for _, s := range a.Streams {
			if s.Cluster != nil {
				out[s.Name] = s.Cluster.Leader
			} else {
				out[s.Name] = ""
			}
		}
	}
	return out, nil
}

// MetaReady reports whether a site's server sees a JetStream meta leader
// with both other servers current: the cluster is formed, and asset
// creation can place three replicas.
func (c *Cluster) MetaReady(site string) (bool, string) {
	ok, why, leader := c.metaReady(site)
	if ok || leader == "" {
		return ok, why
	}
	// Only the meta leader knows whether its followers are current.
	if l, found := strings.CutPrefix(leader, "nats-"); found && l != site && c.Lab.Sites[l] != nil {
		ok, why, _ = c.metaReady(l)
	}
	return ok, why
}

func (c *Cluster) metaReady(site string) (bool, string, string) {
	body, err := c.Lab.HTTPGet(site, c.Lab.Sites[site].IP+":8222", "/jsz", 2*time.Second)
	if err != nil {
		return false, err.Error(), ""
	}
	var jsz struct {
		Meta *struct {
			Leader   string `json:"leader"`
			Size     int    `json:"cluster_size"`
			Replicas []struct {
				Name    string `json:"name"`
				Current bool   `json:"current"`
			} `json:"replicas"`
		} `json:"meta_cluster"`
	}
	if err := json.Unmarshal(body, &jsz); err != nil {
		return false, err.Error(), ""
	}
	m := jsz.Meta
	if m == nil || m.Leader == "" {
		return false, "no meta leader", ""
	}
	current := 0
	for _, r := range m.Replicas {
		if r.Current {
			current++
		}
	}
	if m.Size < 3 || current < 2 {
		return false, fmt.Sprintf("meta leader %s, cluster size %d, %d other peers current (as nats-%s sees it)", m.Leader, m.Size, current, site), m.Leader
	}
	return true, "", m.Leader
}

// Leaders is LeaderMap as one line:
// "meta=nats-w KV_understudy_failover=nats-a UNDERSTUDY_EVENTS=nats-b".
func (c *Cluster) Leaders(site string) string {
	m, err := c.LeaderMap(site)
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if k != "meta" {
			parts = append(parts, k+"="+orNone(m[k]))
		}
	}
	return strings.Join(append([]string{"meta=" + orNone(m["meta"])}, parts...), " ")
}

// PairStreams are the streams that decide leadership: the failover
// bucket's and the events stream.
var PairStreams = []string{"KV_understudy_failover", "UNDERSTUDY_EVENTS"}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// TestLeadership is the node files' leadership line: from
// UNDERSTUDY_TEST_LEADERSHIP (node or per-pair), so that the suites run
// in either mode; empty (the default of the node file) when unset.
func TestLeadership() string {
	if l := strings.TrimSpace(os.Getenv("UNDERSTUDY_TEST_LEADERSHIP")); l != "" {
		return "leadership: " + l + "\n"
	}
	return ""
}
