package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"understudy/actors/agent"
	"understudy/actors/resources"
	"understudy/events"
)

// Node agent figures for docs/benchmarks.md, each with its reference in the
// same run, on the same embedded server:
//
//	go test -run '^$' -bench 'BenchmarkAgent' -benchtime 20x ./runtime/
//
// The agent's idle RSS is measured on the real binary, in cmd/understudy
// (BenchmarkAgentIdleRSS).

const benchFiles = 100

type agentBench struct {
	nc     *nats.Conn
	fleet  events.KV
	id     string
	dir    string
	states chan agent.Status // every actual-state.<agent> write
	reg    resources.Registry
}

func startAgentBench(b *testing.B) *agentBench {
	b.Helper()
	addr, names := benchServer(b)
	nc, err := nats.Connect("nats://" + addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	ctx := context.Background()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	fleet, err := events.NewJetStreamKV(ctx, js, names.FleetBucket)
	if err != nil {
		b.Fatal(err)
	}
	ab := &agentBench{nc: nc, fleet: fleet, id: "bench", dir: b.TempDir(), states: make(chan agent.Status, 64),
		reg: AgentRegistry(AgentConfig{}, resources.NewProcess())}
	wctx, cancel := context.WithCancel(ctx)
	b.Cleanup(cancel)
	w, err := fleet.Watch(wctx, agent.ActualKey(ab.id), events.WatchOptions{})
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		defer w.Stop()
		for e := range w.Updates() {
			if e.Revision == 0 || e.Op != events.OpPut {
				continue
			}
			if s, err := agent.DecodeStatus(e.Value); err == nil {
				select {
				case ab.states <- s:
				case <-wctx.Done():
					return
				}
			}
		}
	}()
	// Drift checks stay out of the measurement: once an hour.
	a, err := StartAgent(ctx, nc, names.FleetBucket, names.EventsStream, AgentConfig{ID: ab.id, ObserveInterval: time.Hour, StateDir: b.TempDir()}, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(a.Stop)
	return ab
}

// waitFor reads status writes until ok holds.
func (ab *agentBench) waitFor(b *testing.B, what string, ok func(agent.Status) bool) {
	b.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case s := <-ab.states:
			if ok(s) {
				return
			}
		case <-timeout:
			b.Fatalf("agent status never %s", what)
		}
	}
}

func (ab *agentBench) manifest(round int) agent.Manifest {
	m := agent.Manifest{Agent: ab.id}
	for i := range benchFiles {
		m.Resources = append(m.Resources, agent.Resource{ID: fmt.Sprintf("f%03d", i), Kind: "file", Spec: resources.Spec{
			"path": filepath.Join(ab.dir, fmt.Sprintf("f%03d", i)), "mode": "0644", "content": fmt.Sprintf("round %d of file %d\n", round, i),
		}})
	}
	return m
}

// BenchmarkAgentApply: `understudy apply` of a manifest whose 100 file
// resources all change → the agent's status says converged for that
// generation. The reference does the same I/O by hand: the manifest write,
// 100 atomic file writes as the file kind makes them (temporary file,
// fsync, rename; concurrently) and one status write, with none of the actors, the events
// or the status bookkeeping.
func BenchmarkAgentApply(b *testing.B) {
	ab := startAgentBench(b)
	ctx := context.Background()
	b.Run("agent-100-files", func(b *testing.B) {
		round := 0
		for b.Loop() {
			round++
			m, _, err := ApplyManifest(ctx, ab.fleet, ab.manifest(round), ab.reg, ManifestWriter{})
			if err != nil {
				b.Fatal(err)
			}
			ab.waitFor(b, fmt.Sprintf("converged at generation %d", m.Generation), func(s agent.Status) bool {
				return s.ManifestGeneration == m.Generation && s.Converged()
			})
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/apply")
	})
	b.Run("raw-100-files", func(b *testing.B) {
		dir := b.TempDir()
		round := 0
		for b.Loop() {
			round++
			m := ab.manifest(round)
			mb, err := agent.EncodeManifest(m)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := ab.fleet.Put(ctx, "bench-raw.desired", mb); err != nil {
				b.Fatal(err)
			}
			// Concurrently, as the agent's resource actors write them.
			var g errgroup.Group
			for i, r := range m.Resources {
				g.Go(func() error {
					return atomicWrite(filepath.Join(dir, r.ID), []byte(fmt.Sprintf("round %d of file %d\n", round, i)))
				})
			}
			if err := g.Wait(); err != nil {
				b.Fatal(err)
			}
			sb, err := agent.EncodeStatus(agent.Status{Agent: "bench-raw", ManifestGeneration: uint64(round), ObservedGeneration: uint64(round)})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := ab.fleet.Put(ctx, "bench-raw.actual", sb); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/apply")
	})
}

func atomicWrite(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// BenchmarkAgentPing: one device-commands.<agent>.ping request/reply,
// against a bare NATS responder on the same server that answers the same
// JSON — the agent's own cost is the difference.
func BenchmarkAgentPing(b *testing.B) {
	ab := startAgentBench(b)
	reply, err := json.Marshal(PingReply{DeviceID: "raw", AgentVersion: Version, UptimeS: 1})
	if err != nil {
		b.Fatal(err)
	}
	sub, err := ab.nc.Subscribe("bench.raw.ping", func(m *nats.Msg) { _ = m.Respond(reply) })
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	// The requester is its own connection, as `understudy ping` would be.
	client, err := nats.Connect(ab.nc.ConnectedUrl())
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	for _, c := range []struct{ name, subject string }{
		{"agent", agent.CommandSubject(ab.id, "ping")},
		{"raw-responder", "bench.raw.ping"},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				m, err := client.Request(c.subject, nil, 5*time.Second)
				if err != nil {
					b.Fatal(err)
				}
				var p PingReply
				if err := json.Unmarshal(m.Data, &p); err != nil || p.DeviceID == "" {
					b.Fatalf("reply %q: %v", m.Data, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "µs/rtt")
		})
	}
}
