package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"understudy/actors/failover"
	"understudy/runtime"
)

// Names of the assets, as runtime provisions them by default.
const (
	failoverBucket = runtime.DefaultFailoverBucket
	kvStream       = "KV_" + failoverBucket
	eventsStream   = runtime.DefaultEventsStream
)

// register is what a pair's leadership register says.
type register struct {
	site   string
	term   uint64
	fenced bool
}

// serves reports whether the register names site as a holder that is not
// fenced. In per-pair mode the holder's beats keep the register fresh; in
// node mode the register is written only on changes and the holder's
// node liveness keeps it, so a register naming a dead node's member still
// reads as serving until the other node takes it (which is what -kill
// measures).
func (r register) serves(site string) bool { return r.site == site && !r.fenced }

// readRegisters reads the latest value of every pair's <pair>.leader key
// with direct gets of the last message per subject (multi_last, at most
// maxMultiLast subjects per request). It creates no consumer: nats-server
// allows 1,000 consumers per stream by default, and in per-pair mode the
// members' own watches take them all from 500 pairs on.
func readRegisters(ctx context.Context, nc *nats.Conn, pairs []string) (map[string]register, error) {
	out := make(map[string]register, len(pairs))
	for lo := 0; lo < len(pairs); lo += maxMultiLast {
		chunk := pairs[lo:min(lo+maxMultiLast, len(pairs))]
		subjects := make([]string, len(chunk))
		for i, p := range chunk {
			subjects[i] = kvPrefix + failover.LeaderKey(p)
		}
		err := directGet(ctx, nc, kvStream, map[string]any{"multi_last": subjects}, func(m *nats.Msg) {
			if op := m.Header.Get("KV-Operation"); op != "" || len(m.Data) == 0 {
				return // a delete or purge marker: no holder
			}
			pair := strings.TrimSuffix(strings.TrimPrefix(m.Header.Get("Nats-Subject"), kvPrefix), ".leader")
			l, err := failover.DecodeLeader(m.Data)
			if err != nil {
				out[pair] = register{site: "?"}
				return
			}
			out[pair] = register{site: l.Site, term: l.Term, fenced: l.Fenced}
		})
		if err != nil {
			return out, fmt.Errorf("read registers: %w", err)
		}
	}
	return out, nil
}

// maxMultiLast is the most subjects a multi_last direct get answers
// (nats-server's maxAllowedResponses is 1024).
const maxMultiLast = 1000

const kvPrefix = "$KV." + failoverBucket + "."

// directGet sends a batched direct get request ($JS.API.DIRECT.GET, the
// stream must allow direct gets, as KV streams do) and calls fn with each
// message until the end-of-batch status. A 404 (nothing matched) is no
// error.
func directGet(ctx context.Context, nc *nats.Conn, stream string, req map[string]any, fn func(*nats.Msg)) error {
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return err
	}
	defer sub.Unsubscribe()
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return err
	}
	if err := nc.PublishRequest("$JS.API.DIRECT.GET."+stream, inbox, body); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for {
		m, err := sub.NextMsgWithContext(ctx)
		if err != nil {
			return err
		}
		switch st := m.Header.Get("Status"); st {
		case "":
			fn(m)
		case "204": // end of batch
			return nil
		case "404":
			return nil
		default:
			return fmt.Errorf("direct get %s: status %s %s", stream, st, m.Header.Get("Description"))
		}
	}
}

// kvRecord is one message of the failover bucket's stream.
type kvRecord struct {
	key  string
	seq  uint64
	time time.Time // the server's timestamp
	data []byte    // nil for a delete or purge marker
}

// readKV calls fn with every message of the failover bucket stored at or
// after from, in order, with batched direct gets (no consumer).
func readKV(ctx context.Context, nc *nats.Conn, from time.Time, fn func(kvRecord)) error {
	const batch = 1000
	req := map[string]any{"start_time": from.UTC(), "batch": batch, "next_by_subj": kvPrefix + ">"}
	for {
		n, last := 0, uint64(0)
		err := directGet(ctx, nc, kvStream, req, func(m *nats.Msg) {
			n++
			seq, _ := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
			ts, _ := time.Parse(time.RFC3339Nano, m.Header.Get("Nats-Time-Stamp"))
			last = max(last, seq)
			r := kvRecord{key: strings.TrimPrefix(m.Header.Get("Nats-Subject"), kvPrefix), seq: seq, time: ts, data: m.Data}
			if m.Header.Get("KV-Operation") != "" {
				r.data = nil
			}
			fn(r)
		})
		if err != nil {
			return fmt.Errorf("read the failover bucket: %w", err)
		}
		if n < batch {
			return nil
		}
		req = map[string]any{"seq": last + 1, "batch": batch, "next_by_subj": kvPrefix + ">"}
	}
}

// streamSeqs are the last sequences of the failover bucket's stream and
// of the events stream: their deltas are the store's writes.
type streamSeqs struct{ kv, events uint64 }

func readSeqs(ctx context.Context, js jetstream.JetStream) (streamSeqs, error) {
	var s streamSeqs
	for _, x := range []struct {
		name string
		into *uint64
	}{{kvStream, &s.kv}, {eventsStream, &s.events}} {
		ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err := js.Stream(ictx, x.name)
		if err == nil {
			var info *jetstream.StreamInfo
			info, err = st.Info(ictx)
			if err == nil {
				*x.into = info.State.LastSeq
			}
		}
		cancel()
		if err != nil {
			return s, fmt.Errorf("stream %s: %w", x.name, err)
		}
	}
	return s, nil
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// procCPU is a process's CPU time so far (user + system), from /proc.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces and parentheses: fields count from
	// the last ')'. After it: state (3), ..., utime (14), stime (15).
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("unexpected /proc/pid/stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, errors.New("short /proc/pid/stat")
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// procRSS is a process's resident set size in bytes (VmRSS).
func procRSS(pid int) (uint64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS")
}

// machineCPU is the machine's busy and total CPU time so far, from the
// first line of /proc/stat (busy: everything but idle and iowait).
func machineCPU() (busy, total time.Duration, err error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		return 0, 0, err
	}
	fs := strings.Fields(line)
	if len(fs) < 6 || fs[0] != "cpu" {
		return 0, 0, errors.New("unexpected /proc/stat")
	}
	var sum, idle uint64
	for i, v := range fs[1:] {
		if i >= 8 { // guest and guest_nice are already in user and nice
			break
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, 0, err
		}
		sum += n
		if i == 3 || i == 4 {
			idle += n
		}
	}
	tick := time.Second / clockTicks
	return time.Duration(sum-idle) * tick, time.Duration(sum) * tick, nil
}

// loadavg is the first field of /proc/loadavg.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// memberMetrics is what a node's /metrics says of its members.
type memberMetrics struct {
	serving map[string]bool // pair → its member on this node serves
	failing int             // members with heartbeat failures counted
	// The node's view of its store (since issue 16; absent before):
	// understudy_node_degraded and understudy_store_write_latency_seconds.
	hasStore     bool
	degraded     bool
	writeLatency time.Duration
}

// scrapeMembers reads understudy_member_serving and
// understudy_member_heartbeat_failures from a node's /metrics.
func scrapeMembers(ctx context.Context, addr string) (memberMetrics, error) {
	m := memberMetrics{serving: map[string]bool{}}
	if addr == "" {
		return m, errors.New("no http address (yet)")
	}
	err := httpGet(ctx, "http://"+addr+"/metrics", 20*time.Second, m.parse)
	return m, err
}

// httpGet gets url within d and hands fn the body of a 200 answer.
func httpGet(ctx context.Context, url string, d time.Duration, fn func(io.Reader) error) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, resp.Body)
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return fn(resp.Body)
}

// parse reads the members' series from a /metrics body.
func (m *memberMetrics) parse(body io.Reader) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if name, val, ok := strings.Cut(line, " "); ok && (name == "understudy_node_degraded" || name == "understudy_store_write_latency_seconds") {
			v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
			if err != nil {
				continue
			}
			m.hasStore = true
			if name == "understudy_node_degraded" {
				m.degraded = v != 0
			} else {
				m.writeLatency = time.Duration(v * float64(time.Second))
			}
			continue
		}
		name, rest, ok := strings.Cut(line, "{")
		if !ok || (name != "understudy_member_serving" && name != "understudy_member_heartbeat_failures") {
			continue
		}
		labels, val, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil || v == 0 {
			continue
		}
		if name == "understudy_member_heartbeat_failures" {
			m.failing++
			continue
		}
		if pair := label(labels, "pair"); pair != "" {
			m.serving[pair] = true
		}
	}
	return sc.Err()
}

// label returns a label's value from a Prometheus label list
// (pair="pg-0001",site="site-a"); pair names need no unescaping.
func label(labels, name string) string {
	for _, kv := range strings.Split(labels, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if ok && k == name {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// registerFollower keeps every pair's register as a watch of the bucket
// delivers its changes (one consumer, as a node's watch).
type registerFollower struct {
	w    jetstream.KeyWatcher
	mu   sync.Mutex
	regs map[string]register
	done chan struct{}
}

// followRegisters follows the registers from their latest values (from
// stands for a register whose key the watch does not deliver).
func followRegisters(ctx context.Context, js jetstream.JetStream, from map[string]register) (*registerFollower, error) {
	kv, err := js.KeyValue(ctx, failoverBucket)
	if err != nil {
		return nil, err
	}
	w, err := kv.Watch(ctx, "*.leader")
	if err != nil {
		return nil, err
	}
	f := &registerFollower{w: w, regs: maps.Clone(from), done: make(chan struct{})}
	current := make(chan struct{})
	var once sync.Once
	go func() {
		defer close(f.done)
		for e := range w.Updates() {
			if e == nil {
				once.Do(func() { close(current) }) // the latest values are in; changes follow
				continue
			}
			pair := strings.TrimSuffix(e.Key(), ".leader")
			reg := register{}
			if e.Operation() == jetstream.KeyValuePut {
				if l, err := failover.DecodeLeader(e.Value()); err != nil {
					reg.site = "?"
				} else {
					reg = register{site: l.Site, term: l.Term, fenced: l.Fenced}
				}
			}
			f.mu.Lock()
			f.regs[pair] = reg
			f.mu.Unlock()
		}
	}()
	select {
	case <-current:
		return f, nil
	case <-f.done:
		return nil, errors.New("the registers' watch ended before it delivered their latest values")
	case <-ctx.Done():
		f.stop()
		return nil, ctx.Err()
	}
}

// now is a copy of the registers as followed so far.
func (f *registerFollower) now() map[string]register {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.regs)
}

func (f *registerFollower) stop() {
	_ = f.w.Stop()
	<-f.done
}

// registerSource reads every pair's register. With node leadership it
// follows them with a watch once the bucket answers (followRegisters):
// polling 10,000 registers (multi_last direct gets, 1,000 a request)
// holds the bucket's stream against its writes while each request is
// answered — every 250 ms after a kill it slowed the very takeover it
// timed, half the store's CPU in those reads. Per-pair members take every
// consumer the stream allows from 500 pairs on: there it polls.
type registerSource struct {
	node   bool
	nc     *nats.Conn
	js     jetstream.JetStream
	pairs  []string
	follow *registerFollower
}

func (s *registerSource) read(ctx context.Context) (map[string]register, error) {
	if s.follow != nil {
		return s.follow.now(), nil
	}
	regs, err := readRegisters(ctx, s.nc, s.pairs)
	if err != nil || !s.node {
		return regs, err
	}
	f, ferr := followRegisters(ctx, s.js, regs)
	if ferr != nil {
		return regs, nil // polled again next time
	}
	s.follow = f
	return f.now(), nil
}

func (s *registerSource) stop() {
	if s.follow != nil {
		s.follow.stop()
	}
}
