package runtime

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"understudy/actors/agent"
	"understudy/actors/resources"
	"understudy/actors/resources/libvirt"
	"understudy/actors/resources/libvirt/libvirttest"
	"understudy/actors/resources/libvirt/rules"
	"understudy/events"
)

type agentWorld struct {
	t     *testing.T
	nats  *failoverNATS
	nc    *nats.Conn
	fleet events.KV
	a     *Agent
	id    string
}

func startAgentWorld(t *testing.T, cfg AgentConfig) *agentWorld {
	t.Helper()
	return startAgentWorldLogged(t, cfg, slog.New(slog.DiscardHandler))
}

func startAgentWorldLogged(t *testing.T, cfg AgentConfig, logger *slog.Logger) *agentWorld {
	t.Helper()
	fn := startFailoverNATS(t)
	nc := connectTo(t, "nats://"+fn.addr)
	ctx := context.Background()
	fleet, err := events.NewJetStreamKV(ctx, fn.js, fn.names.FleetBucket)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	a, err := StartAgent(ctx, nc, fn.names.FleetBucket, fn.names.EventsStream, cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Stop)
	return &agentWorld{t: t, nats: fn, nc: nc, fleet: fleet, a: a, id: cfg.ID}
}

func (w *agentWorld) apply(m agent.Manifest) agent.Manifest {
	w.t.Helper()
	m.Agent = w.id
	m, _, err := ApplyManifest(context.Background(), w.fleet, m, AgentRegistry(AgentConfig{}, resources.NewProcess()), ManifestWriter{})
	if err != nil {
		w.t.Fatal(err)
	}
	return m
}

// waitStatus polls actual-state.<agent> until ok holds.
func (w *agentWorld) waitStatus(what string, ok func(agent.Status) bool) agent.Status {
	w.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var last agent.Status
	for time.Now().Before(deadline) {
		if e, err := w.fleet.Get(context.Background(), agent.ActualKey(w.id)); err == nil {
			s, err := agent.DecodeStatus(e.Value)
			if err != nil {
				w.t.Fatal(err)
			}
			last = s
			if ok(s) {
				return s
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	b, _ := json.MarshalIndent(last, "", "  ")
	w.t.Fatalf("status never %s; last:\n%s", what, b)
	return last
}

func res(id, kind string, spec map[string]any) agent.Resource {
	return agent.Resource{ID: id, Kind: kind, Spec: spec}
}

// The node agent end to end, on embedded NATS and libvirt's test driver: a
// manifest with a network, a VM, a file, a process with an init step, an
// unknown kind and a refused shell job converges; drift made behind the
// agent's back (file rewritten, process killed, VM destroyed) is repaired;
// a changed manifest is applied and what left it is deleted.
func TestAgentConvergesRepairsDriftAndAppliesChanges(t *testing.T) {
	// One understudy-libvirt for the agent and the test: test:///default
	// keeps its state per process, so the test's own connection to that
	// process sees the agent's domains and can act behind its back.
	sock := libvirtDriverSocket(t)
	behindDriver := libvirt.NewDriverProcess(libvirt.DriverConfig{Socket: sock}, nil)
	defer behindDriver.Close()
	behind := behindDriver.Hypervisor(rules.TestURI)
	ctx := context.Background()
	w := startAgentWorld(t, AgentConfig{ID: "n1", LibvirtURI: rules.TestURI, LibvirtDriver: libvirt.DriverConfig{Socket: sock},
		ObserveInterval: 100 * time.Millisecond, RetryBase: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond})
	dir := t.TempDir()
	motd := filepath.Join(dir, "motd")
	marker := filepath.Join(dir, "prepared")
	m := w.apply(agent.Manifest{Resources: []agent.Resource{
		res("e2e-net", "network", map[string]any{"bridge": "virbr43", "ip": "10.43.0.1/24",
			"dhcp": map[string]any{"start": "10.43.0.10", "end": "10.43.0.99"}}),
		res("e2e-vm", "vm", map[string]any{"domain_type": "test", "vcpus": 2, "memory": "512MiB",
			"disks": []any{map[string]any{"path": "/var/lib/libvirt/images/e2e.qcow2"}},
			"nics":  []any{map[string]any{"network": "e2e-net", "mac": "52:54:00:43:00:01"}}, "boot": []any{"hd"}}),
		res("motd", "file", map[string]any{"path": motd, "mode": "0640", "content": "hello\n"}),
		res("svc", "process", map[string]any{"command": "sleep", "args": []any{"60"},
			"init": []any{map[string]any{"name": "prepare", "command": "touch", "args": []any{marker}}}}),
		res("gizmo", "gizmo", map[string]any{"size": 3}),
		res("job", "shell-job", map[string]any{"command": "echo hi"}),
	}})
	ready := func(s agent.Status, id string) bool {
		r, ok := s.Resources[id]
		return ok && r.Phase == agent.Ready && r.Generation == s.ManifestGeneration
	}
	s := w.waitStatus("converged (but for the unknown kind and the refused job)", func(s agent.Status) bool {
		return s.ManifestGeneration == m.Generation && ready(s, "motd") && ready(s, "svc") && ready(s, "e2e-net") && ready(s, "e2e-vm") &&
			s.Resources["gizmo"].Phase == agent.UnknownResource && s.Resources["job"].Phase == agent.Refused
	})
	if d := s.Resources["e2e-vm"].Details; d["state"] != "running" || d["macs"] != "52:54:00:43:00:01" || d["vcpus"] != "2" {
		t.Errorf("vm details %v", d)
	}
	if d := s.Resources["e2e-net"].Details; d["active"] != "true" || d["bridge"] != "virbr43" {
		t.Errorf("network details %v", d)
	}
	if s.Converged() || !s.Settled() || s.ObservedGeneration != m.Generation {
		t.Errorf("converged %v settled %v observed %d (manifest %d)", s.Converged(), s.Settled(), s.ObservedGeneration, m.Generation)
	}
	if !strings.Contains(s.Resources["gizmo"].Error, "gizmo") || !strings.Contains(s.Resources["job"].Error, "allow_shell_jobs") {
		t.Errorf("unknown kind / refused job errors: %q / %q", s.Resources["gizmo"].Error, s.Resources["job"].Error)
	}
	if b, err := os.ReadFile(motd); err != nil || string(b) != "hello\n" {
		t.Fatalf("motd: %q %v", b, err)
	}
	if st, _ := os.Stat(motd); st.Mode().Perm() != 0o640 {
		t.Errorf("motd mode %v", st.Mode())
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the init step did not run: %v", err)
	}
	svc := s.Resources["svc"].Details
	if svc["init_completed"] != "prepare" || svc["services"] != "svc" || svc["pid"] == "" {
		t.Errorf("process details %v: init steps done, not listed among services", svc)
	}

	// Drift behind the agent's back: the file's content and mode, the
	// process killed. Both are repaired by the periodic observation.
	if err := os.WriteFile(motd, []byte("tampered\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(svc["pid"])
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if was, err := behind.Destroy(ctx, "e2e-vm"); err != nil || !was {
		t.Fatalf("destroy e2e-vm behind the agent's back: was running %v, %v", was, err)
	}
	w.waitStatus("repaired", func(s agent.Status) bool {
		b, _ := os.ReadFile(motd)
		st, err := behind.DomainStatus(ctx, "e2e-vm")
		return string(b) == "hello\n" && ready(s, "svc") && s.Resources["svc"].Details["pid"] != svc["pid"] &&
			err == nil && st.State == libvirt.StateRunning && ready(s, "e2e-vm")
	})

	// A new manifest: the file and the VM are gone from it (deleted from
	// disk and from libvirt), the process's env changed (restarted), the
	// network stays as it is.
	m2 := w.apply(agent.Manifest{Resources: []agent.Resource{
		m.Resources[0],
		res("svc", "process", map[string]any{"command": "sleep", "args": []any{"60"}, "env": map[string]any{"MODE": "b"}}),
	}})
	s = w.waitStatus("converged on generation 2", func(s agent.Status) bool {
		return s.ManifestGeneration == m2.Generation && len(s.Resources) == 2 && ready(s, "svc") && ready(s, "e2e-net") && s.Converged()
	})
	if _, err := os.Stat(motd); !os.IsNotExist(err) {
		t.Errorf("motd left the manifest but is still on disk: %v", err)
	}
	if st, err := behind.DomainStatus(ctx, "e2e-vm"); err != nil || st.Defined {
		t.Errorf("e2e-vm left the manifest but is still defined: %+v %v", st, err)
	}
	if st, err := behind.NetworkStatus(ctx, "e2e-net"); err != nil || !st.Defined {
		t.Errorf("e2e-net stayed in the manifest but is gone: %+v %v", st, err)
	} else if !st.Active {
		t.Errorf("e2e-net stayed in the manifest but is no longer active")
	}
	if s.ObservedGeneration != m2.Generation {
		t.Errorf("observed generation %d, want %d", s.ObservedGeneration, m2.Generation)
	}

	// Generations that change nothing: every resource, the unknown kind
	// too, reports for the new generation and keeps what it said.
	m3 := agent.Manifest{Resources: append(m2.Resources, res("gizmo", "gizmo", map[string]any{"size": 3}))}
	w.apply(m3)
	m4 := w.apply(m3)
	s4 := w.waitStatus("settled on generation 4", func(s agent.Status) bool {
		return s.ManifestGeneration == m4.Generation && s.Settled() && s.ObservedGeneration == m4.Generation
	})
	if s4.Resources["svc"].Details["pid"] != s.Resources["svc"].Details["pid"] || s4.Resources["svc"].Since != s.Resources["svc"].Since {
		t.Errorf("an unchanged process was touched: %+v, before %+v", s4.Resources["svc"], s.Resources["svc"])
	}
	if g := s4.Resources["gizmo"]; g.Phase != agent.UnknownResource || g.Generation != m4.Generation {
		t.Errorf("unknown kind on an unchanged manifest: %+v", g)
	}

	// Every transition is an event on the resource's subject.
	seen := map[string]int{}
	for rec, err := range w.nats.evlog.Read(context.Background(), events.ReadOptions{Subject: "ev.agent.n1.>"}) {
		if err != nil {
			t.Fatal(err)
		}
		ev, err := Codec().DecodeRecord(rec)
		if err != nil {
			t.Fatal(err)
		}
		seen[rec.Subject+" "+ev.EventType()]++
	}
	for _, want := range []string{"ev.agent.n1.motd agent.deleted", "ev.agent.n1.svc agent.ran", "ev.agent.n1.gizmo agent.phase_changed", "ev.agent.n1.motd agent.phase_changed"} {
		if seen[want] == 0 {
			t.Errorf("no %s event; seen %v", want, seen)
		}
	}
}

func TestAgentInitStepOutcomesAndBackoff(t *testing.T) {
	w := startAgentWorld(t, AgentConfig{ID: "n2", ObserveInterval: time.Second, RetryBase: 50 * time.Millisecond, RetryMax: 400 * time.Millisecond})
	w.apply(agent.Manifest{Resources: []agent.Resource{
		res("fails", "process", map[string]any{"command": "sleep", "args": []any{"60"},
			"init": []any{map[string]any{"name": "check", "command": "sh", "args": []any{"-c", "echo broken >&2; exit 3"}}}}),
		res("hangs", "process", map[string]any{"command": "sleep", "args": []any{"60"},
			"init": []any{map[string]any{"name": "wait", "command": "sleep", "args": []any{"30"}, "timeout": "200ms"}}}),
	}})
	s := w.waitStatus("failed twice each", func(s agent.Status) bool {
		return s.Resources["fails"].Failures >= 2 && s.Resources["hangs"].Failures >= 2
	})
	f, h := s.Resources["fails"], s.Resources["hangs"]
	if f.Phase != agent.Failed || !strings.Contains(f.Error, "init step check: exited 3: broken") || f.RetryAfter == nil {
		t.Errorf("failing init step: %+v", f)
	}
	if h.Phase != agent.Failed || !strings.Contains(h.Error, "init step wait: timed out: waited 200ms") {
		t.Errorf("hanging init step: %+v", h)
	}
}

func TestAgentCommands(t *testing.T) {
	w := startAgentWorld(t, AgentConfig{ID: "n3"})
	w.apply(agent.Manifest{Resources: []agent.Resource{res("x", "gizmo", nil)}})
	w.waitStatus("with x", func(s agent.Status) bool { return s.Resources["x"].Phase == agent.UnknownResource })
	ask := func(verb string, into any) {
		msg, err := w.nc.Request(agent.CommandSubject("n3", verb), nil, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(msg.Data, into); err != nil {
			t.Fatalf("%s: %v: %s", verb, err, msg.Data)
		}
	}
	var p PingReply
	ask("ping", &p)
	if p.DeviceID != "n3" || p.AgentVersion != Version || p.UptimeS <= 0 {
		t.Errorf("ping %+v", p)
	}
	var s agent.Status
	ask("status", &s)
	if s.Agent != "n3" || s.Resources["x"].Phase != agent.UnknownResource {
		t.Errorf("status %+v", s)
	}
	var e CommandError
	ask("reboot", &e)
	if e.Code != "unknown_verb" || e.Verb != "reboot" {
		t.Errorf("unknown verb: %+v", e)
	}
	if _, err := w.fleet.Get(context.Background(), agent.PresenceKey("n3")); err != nil {
		t.Errorf("no presence: %v", err)
	}
}

func TestApplyManifestRefusesBadSpecs(t *testing.T) {
	w := startAgentWorld(t, AgentConfig{ID: "n4"})
	reg := AgentRegistry(AgentConfig{}, resources.NewProcess())
	for _, tc := range []struct {
		m    agent.Manifest
		want string
	}{
		{agent.Manifest{Agent: "n4", Resources: []agent.Resource{res("a", "file", map[string]any{"path": "relative", "content": "x"})}}, "resources[0].spec: file spec: path: must be an absolute, clean path"},
		{agent.Manifest{Agent: "n4", Resources: []agent.Resource{res("a", "file", map[string]any{"path": "/tmp/a", "content": "x", "colour": "red"})}}, "colour: unknown field"},
		{agent.Manifest{Agent: "n4", Resources: []agent.Resource{res("a", "process", map[string]any{})}}, "process spec: command: required"},
		{agent.Manifest{Agent: "n4", Resources: []agent.Resource{res("a", "file", nil), res("a", "file", nil)}}, ""},
		{agent.Manifest{Agent: "N4"}, "manifest: agent: must be lower-case"},
		{agent.Manifest{Agent: "n4", Resources: []agent.Resource{{ID: "a"}}}, "resources[0].kind: required"},
	} {
		_, _, err := ApplyManifest(context.Background(), w.fleet, tc.m, reg, ManifestWriter{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err %v, want %q", tc.m, err, tc.want)
		}
	}
}

// A reconcile that outlives agent.call_timeout fails the resource (and is
// retried) instead of stalling its actor; the rest of the manifest is not
// held up. Here a vm whose libvirt never answers: the call is cut off by
// killing the understudy-libvirt process it hangs in.
func TestAgentCallTimeoutCutsOffAHungReconcile(t *testing.T) {
	silent := libvirttest.SilentLibvirtd(t)
	w := startAgentWorld(t, AgentConfig{ID: "n5", CallTimeout: time.Second, ObserveInterval: time.Second,
		LibvirtURI: silent.URI(), LibvirtDriver: libvirt.DriverConfig{Path: libvirtDriverBinary(t)},
		RetryBase: time.Minute, RetryMax: time.Minute})
	motd := filepath.Join(t.TempDir(), "motd")
	m := w.apply(agent.Manifest{Resources: []agent.Resource{
		res("hung", "vm", map[string]any{"domain_type": "test", "memory": "512MiB", "disks": []any{map[string]any{"path": "/var/lib/libvirt/images/hung.qcow2"}}}),
		res("motd", "file", map[string]any{"path": motd, "content": "hi\n"}),
	}})
	start := time.Now()
	s := w.waitStatus("hung failed, motd ready", func(s agent.Status) bool {
		return s.ManifestGeneration == m.Generation && s.Resources["hung"].Phase == agent.Failed && s.Resources["motd"].Phase == agent.Ready
	})
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("the cut-off took %v", took)
	}
	if e := s.Resources["hung"].Error; !strings.Contains(e, "cut off after agent.call_timeout 1s") {
		t.Errorf("error %q", e)
	}
}

// A resource's first reconcile runs on its own actor: a slow one holds up
// neither the rest of the manifest nor the agent's status, and Stop cuts
// the call in flight off instead of waiting it out.
func TestAgentSlowResourceHoldsUpNothing(t *testing.T) {
	w := startAgentWorld(t, AgentConfig{ID: "n6", ObserveInterval: time.Hour})
	motd := filepath.Join(t.TempDir(), "motd")
	m := w.apply(agent.Manifest{Resources: []agent.Resource{
		res("slow", "process", map[string]any{"command": "sleep", "args": []any{"60"},
			"init": []any{map[string]any{"name": "wait", "command": "sleep", "args": []any{"60"}, "timeout": "120s"}}}),
		res("motd", "file", map[string]any{"path": motd, "content": "hi\n"}),
	}})
	w.waitStatus("motd ready while slow is still reconciling", func(s agent.Status) bool {
		return s.ManifestGeneration == m.Generation && s.Resources["motd"].Phase == agent.Ready && s.Resources["slow"].Phase == agent.Reconciling
	})
	start := time.Now()
	w.a.Stop()
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("Stop waited %v for the init step in flight", took)
	}
}

// A delete that fails is reported and retried until it succeeds: what a
// manifest dropped is never forgotten.
func TestAgentRetriesAFailedDelete(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a symbolic link away")
	}
	w := startAgentWorld(t, AgentConfig{ID: "n7", ObserveInterval: time.Hour, RetryBase: 50 * time.Millisecond, RetryMax: 100 * time.Millisecond})
	dir := t.TempDir()
	motd := filepath.Join(dir, "etc", "motd")
	keep := filepath.Join(dir, "keep")
	m1 := w.apply(agent.Manifest{Resources: []agent.Resource{
		res("motd", "file", map[string]any{"path": motd, "content": "hi\n"}),
		res("keep", "file", map[string]any{"path": keep, "content": "x\n"}),
	}})
	w.waitStatus("converged", func(s agent.Status) bool { return s.ManifestGeneration == m1.Generation && s.Converged() })
	// The file's directory becomes a symbolic link of an unprivileged
	// user's: the agent refuses to delete through it.
	real := filepath.Join(dir, "real")
	if err := os.Rename(filepath.Dir(motd), real); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Dir(motd)); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(filepath.Dir(motd), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	m := w.apply(agent.Manifest{Resources: []agent.Resource{res("keep", "file", map[string]any{"path": keep, "content": "x\n"})}})
	s := w.waitStatus("the failed delete reported", func(s agent.Status) bool {
		r := s.Resources["motd"]
		return s.ManifestGeneration == m.Generation && r.Phase == agent.Failed && r.Failures >= 2
	})
	if e := s.Resources["motd"].Error; !strings.Contains(e, "delete failed") || !strings.Contains(e, "refusing to follow it") {
		t.Errorf("error %q", e)
	}
	if s.Converged() {
		t.Error("converged while a dropped resource is still there")
	}
	if err := os.Lchown(filepath.Dir(motd), 0, 0); err != nil {
		t.Fatal(err)
	}
	w.waitStatus("deleted at last", func(s agent.Status) bool {
		_, has := s.Resources["motd"]
		return !has && s.Converged() && s.ObservedGeneration == m.Generation
	})
	if _, err := os.Stat(filepath.Join(real, "motd")); !os.IsNotExist(err) {
		t.Errorf("motd still there: %v", err)
	}
}

// A resource whose init steps may take longer than agent.call_timeout is
// refused with the numbers, not cut off and retried forever.
func TestAgentRefusesStepsLongerThanTheCallTimeout(t *testing.T) {
	w := startAgentWorld(t, AgentConfig{ID: "n8", CallTimeout: time.Minute})
	m := w.apply(agent.Manifest{Resources: []agent.Resource{
		res("long", "process", map[string]any{"command": "sleep", "args": []any{"60"},
			"init": []any{map[string]any{"name": "a", "command": "true", "timeout": "40s"}, map[string]any{"name": "b", "command": "true", "timeout": "40s"}}}),
	}})
	s := w.waitStatus("refused", func(s agent.Status) bool {
		return s.ManifestGeneration == m.Generation && s.Resources["long"].Phase == agent.Refused
	})
	if e := s.Resources["long"].Error; !strings.Contains(e, "may take 1m20s (the sum of their timeouts), more than agent.call_timeout 1m0s") {
		t.Errorf("error %q", e)
	}
}

// An agent whose first status write fails (the store refuses it: a
// leader election, a full stream) tries again until it lands, with one
// warning, rather than leaving actual-state.<agent> missing until
// something else changes (found as an intermittent failure of
// TestSecuredCluster: an agent's actual-state missing after 10 s on an
// R3 cluster under load).
func TestAgentRetriesAFailedStatusWrite(t *testing.T) {
	fn := startFailoverNATS(t)
	ctx := context.Background()
	stream := "KV_" + fn.names.FleetBucket
	st, err := fn.js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.CachedInfo().Config
	full := cfg
	full.MaxMsgs, full.Discard = max(int64(st.CachedInfo().State.Msgs), 1), jetstream.DiscardNew
	if st.CachedInfo().State.Msgs == 0 {
		// One message makes the stream full.
		if _, err := fn.js.Publish(ctx, "$KV."+fn.names.FleetBucket+".filler", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := fn.js.UpdateStream(ctx, full); err != nil {
		t.Fatal(err)
	}
	log, rec := newLogRecorder(t)
	nc := connectTo(t, "nats://"+fn.addr)
	a, err := StartAgent(ctx, nc, fn.names.FleetBucket, fn.names.EventsStream, AgentConfig{ID: "n1", StateDir: t.TempDir()}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop()
	rec.waitFor(t, "agent: status write failed; trying again every second until it lands", 1, 10*time.Second)
	fleet, err := events.NewJetStreamKV(ctx, fn.js, fn.names.FleetBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fleet.Get(ctx, agent.ActualKey("n1")); err == nil {
		t.Fatal("the status landed in a full stream")
	}
	time.Sleep(2500 * time.Millisecond) // two more tries, still refused
	if _, err := fn.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := fleet.Get(ctx, agent.ActualKey("n1")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("actual-state.n1 still missing 5 s after the stream took writes again")
		}
		time.Sleep(50 * time.Millisecond)
	}
	rec.waitFor(t, "agent: status written again", 1, 5*time.Second)
	if n := len(rec.matching("agent: status write failed; trying again every second until it lands")); n != 1 {
		t.Errorf("%d warnings of the failed status write, want one for the whole outage", n)
	}
}
