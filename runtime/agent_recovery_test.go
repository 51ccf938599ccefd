package runtime

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"understudy/actors/agent"
	"understudy/actors/resources"
	"understudy/events"
)

// crash stops the agent as kill -9 would: its actors end, and nothing
// it started is stopped or cleaned up (its processes keep running: the
// test process, their parent, lives on).
func (w *agentWorld) crash() {
	a := w.a
	a.stopOnce.Do(func() {
		a.end()
		<-a.engine.Poison(a.pid).Done()
		a.actor.trailsMu.Lock()
		for _, t := range a.actor.trails {
			t.stop()
		}
		a.actor.trailsMu.Unlock()
		_ = a.lock.Close() // the kernel releases a dead process's lock
	})
}

// restart starts a new agent on the world's NATS with cfg (the same
// state directory: the same node).
func (w *agentWorld) restart(cfg AgentConfig) {
	w.t.Helper()
	a, err := StartAgent(context.Background(), w.nc, w.nats.names.FleetBucket, w.nats.names.EventsStream, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(a.Stop)
	w.a = a
}

// running lists the pids of processes whose command line is args.
func running(args ...string) []int {
	want := strings.Join(args, "\x00") + "\x00"
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && string(b) == want {
			if _, err := procStartOf(pid); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// procStartOf fails for a process gone or a zombie.
func procStartOf(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if f[0] == "Z" {
		return "", fmt.Errorf("zombie")
	}
	return f[19], nil
}

func killAll(pids []int) {
	for _, p := range pids {
		_ = syscall.Kill(-p, syscall.SIGKILL)
	}
}

// Finding 5: after kill -9 of serve and a restart every process ran
// twice, the orphan survived its resource's removal, a resource removed
// while the agent was down was never deleted, a changed kind kept the
// old reconciler, and temporary files stayed. The agent now remembers
// what it runs (its journal, the kinds' records and markers): it adopts
// what still runs, deletes what left the manifest meanwhile, replaces a
// resource whose kind changed, and removes its temporary files.
func TestAgentRemembersWhatItRunsAcrossACrash(t *testing.T) {
	cfg := AgentConfig{ID: "r1", ObserveInterval: 100 * time.Millisecond, RetryBase: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond, StateDir: t.TempDir()}
	w := startAgentWorld(t, cfg)
	dir := t.TempDir()
	motd, gone, swapped := filepath.Join(dir, "motd"), filepath.Join(dir, "gone"), filepath.Join(dir, "swapped")
	m := w.apply(agent.Manifest{Resources: []agent.Resource{
		res("svc", "process", map[string]any{"command": "sleep", "args": []any{"3001"}}),
		res("old", "process", map[string]any{"command": "sleep", "args": []any{"3002"}}),
		res("swap", "process", map[string]any{"command": "sleep", "args": []any{"3003"}}),
		res("motd", "file", map[string]any{"path": motd, "content": "hi\n"}),
		res("gone", "file", map[string]any{"path": gone, "content": "bye\n"}),
	}})
	t.Cleanup(func() {
		killAll(running("sleep", "3001"))
		killAll(running("sleep", "3002"))
		killAll(running("sleep", "3003"))
	})
	s := w.waitStatus("converged", func(s agent.Status) bool { return s.ManifestGeneration == m.Generation && s.Converged() })
	svcPid := s.Resources["svc"].Details["pid"]

	w.crash()
	// While it is down: a half-written temporary file of motd, a new
	// manifest without old and gone, and swap now a file.
	temp := filepath.Join(dir, ".motd"+resources.TempPrefix+"deadbeef0000")
	if err := os.WriteFile(temp, []byte("h"), 0o600); err != nil {
		t.Fatal(err)
	}
	m2 := w.apply(agent.Manifest{Resources: []agent.Resource{
		res("svc", "process", map[string]any{"command": "sleep", "args": []any{"3001"}}),
		res("swap", "file", map[string]any{"path": swapped, "content": "now a file\n"}),
		res("motd", "file", map[string]any{"path": motd, "content": "hi\n"}),
	}})
	w.restart(cfg)
	s = w.waitStatus("converged after the restart", func(s agent.Status) bool {
		return s.ManifestGeneration == m2.Generation && s.Converged() && len(s.Resources) == 3
	})
	if p := running("sleep", "3001"); len(p) != 1 || strconv.Itoa(p[0]) != svcPid {
		t.Errorf("svc runs as %v, want only its first pid %s (adopted)", p, svcPid)
	}
	if s.Resources["svc"].Details["adopted"] != "true" {
		t.Errorf("svc details %v", s.Resources["svc"].Details)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(running("sleep", "3002"))+len(running("sleep", "3003")) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if p := running("sleep", "3002"); len(p) != 0 {
		t.Errorf("a process removed while the agent was down still runs: %v", p)
	}
	if p := running("sleep", "3003"); len(p) != 0 {
		t.Errorf("a process whose resource became a file still runs: %v", p)
	}
	if b, err := os.ReadFile(swapped); err != nil || string(b) != "now a file\n" {
		t.Errorf("the new kind's file: %q %v", b, err)
	}
	if _, err := os.Stat(gone); !os.IsNotExist(err) {
		t.Errorf("a file removed while the agent was down is still there: %v", err)
	}
	if _, err := os.Stat(temp); !os.IsNotExist(err) {
		t.Errorf("the temporary file a crash left is still there: %v", err)
	}
	// A clean stop ends what the agent runs.
	w.a.Stop()
	if p := running("sleep", "3001"); len(p) != 0 {
		t.Errorf("svc outlived a clean stop: %v", p)
	}
}

// Two agents never share a state directory.
func TestAgentStateDirIsItsOwn(t *testing.T) {
	cfg := AgentConfig{ID: "r7", StateDir: t.TempDir()}
	w := startAgentWorld(t, cfg)
	if _, err := StartAgent(context.Background(), w.nc, w.nats.names.FleetBucket, w.nats.names.EventsStream, cfg, nil); err == nil || !strings.Contains(err.Error(), "is in use by another agent") {
		t.Fatalf("a second agent on one state directory: %v", err)
	}
}

// Finding 5: changing a resource's kind under the same id kept the old
// reconciler (old process running, new file never written).
func TestAgentReplacesAResourceWhoseKindChanged(t *testing.T) {
	w := startAgentWorld(t, AgentConfig{ID: "r2", ObserveInterval: 100 * time.Millisecond, RetryBase: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond})
	path := filepath.Join(t.TempDir(), "x")
	t.Cleanup(func() { killAll(running("sleep", "3011")) })
	m := w.apply(agent.Manifest{Resources: []agent.Resource{res("x", "process", map[string]any{"command": "sleep", "args": []any{"3011"}})}})
	w.waitStatus("converged", func(s agent.Status) bool { return s.ManifestGeneration == m.Generation && s.Converged() })
	m = w.apply(agent.Manifest{Resources: []agent.Resource{res("x", "file", map[string]any{"path": path, "content": "x\n"})}})
	s := w.waitStatus("the file", func(s agent.Status) bool { return s.ManifestGeneration == m.Generation && s.Converged() })
	if s.Resources["x"].Kind != "file" {
		t.Errorf("status %+v", s.Resources["x"])
	}
	if p := running("sleep", "3011"); len(p) != 0 {
		t.Errorf("the old process still runs: %v", p)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "x\n" {
		t.Errorf("the new file: %q %v", b, err)
	}
	// And to a kind the agent does not know: the file is deleted, the
	// resource reported.
	m = w.apply(agent.Manifest{Resources: []agent.Resource{res("x", "gizmo", nil)}})
	w.waitStatus("unknown", func(s agent.Status) bool {
		_, err := os.Stat(path)
		return s.ManifestGeneration == m.Generation && s.Resources["x"].Phase == agent.UnknownResource && os.IsNotExist(err)
	})
}

// Finding 3: a value at desired-state.<agent> that does not decode is
// reported (key, revision, how it starts) in the status and the log, the
// resources keep their spec, and apply replaces it. A deeply nested one
// is refused before msgpack sees it.
func TestAgentReportsAndReplacesAnUndecodableManifest(t *testing.T) {
	w := startAgentWorld(t, AgentConfig{ID: "r3", ObserveInterval: time.Hour})
	path := filepath.Join(t.TempDir(), "motd")
	m := w.apply(agent.Manifest{Resources: []agent.Resource{res("motd", "file", map[string]any{"path": path, "content": "hi\n"})}})
	w.waitStatus("converged", func(s agent.Status) bool { return s.ManifestGeneration == m.Generation && s.Converged() })
	ctx := context.Background()
	for _, bad := range [][]byte{
		[]byte("\xc1 garbage"),
		// 900 KB of nesting inside a spec (NATS's 1 MB payload limit).
		append([]byte{0x83, 0xa5, 'a', 'g', 'e', 'n', 't', 0xa2, 'r', '3', 0xa3, 'g', 'e', 'n', 0x09, 0xa3, 'r', 'e', 's', 0x91,
			0x83, 0xa2, 'i', 'd', 0xa1, 'a', 0xa4, 'k', 'i', 'n', 'd', 0xa4, 'f', 'i', 'l', 'e', 0xa4, 's', 'p', 'e', 'c', 0x81, 0xa1, 'x'},
			append(bytes.Repeat([]byte{0x91}, 900<<10), 0xc0)...),
	} {
		rev, err := w.fleet.Put(ctx, agent.DesiredKey("r3"), bad)
		if err != nil {
			t.Fatal(err)
		}
		s := w.waitStatus("reporting it", func(s agent.Status) bool {
			for _, c := range s.Conditions {
				if c.Type == "ManifestValid" && !c.Status && strings.Contains(c.Message, fmt.Sprintf("revision %d ", rev)) {
					return true
				}
			}
			return false
		})
		for _, c := range s.Conditions {
			if c.Type == "ManifestValid" && (c.Reason != "Undecodable" || !strings.Contains(c.Message, "desired-state.r3 revision") ||
				!strings.Contains(c.Message, "apply a manifest to replace it") || !strings.Contains(c.Message, "starting "+fmt.Sprintf("%x", bad[:min(16, len(bad))]))) {
				t.Errorf("condition %+v", c)
			}
		}
		if s.Resources["motd"].Phase != agent.Ready {
			t.Errorf("motd %+v", s.Resources["motd"])
		}
	}
	// apply replaces it, with a generation above any stored before.
	m = w.apply(agent.Manifest{Resources: []agent.Resource{res("motd", "file", map[string]any{"path": path, "content": "again\n"})}})
	if m.Generation <= 1 {
		t.Errorf("generation %d", m.Generation)
	}
	w.waitStatus("converged on the new one", func(s agent.Status) bool {
		b, _ := os.ReadFile(path)
		return s.ManifestGeneration == m.Generation && s.Converged() && string(b) == "again\n"
	})
}

// A spec that does not validate (written around apply) fails its own
// resource, which keeps what it ran; the rest converge.
func TestAgentABadSpecFailsOnlyItsResource(t *testing.T) {
	w := startAgentWorld(t, AgentConfig{ID: "r4", ObserveInterval: time.Hour})
	dir := t.TempDir()
	m := w.apply(agent.Manifest{Resources: []agent.Resource{res("a", "file", map[string]any{"path": filepath.Join(dir, "a"), "content": "a\n"})}})
	w.waitStatus("converged", func(s agent.Status) bool { return s.ManifestGeneration == m.Generation && s.Converged() })
	bad := agent.Manifest{Agent: "r4", Generation: 5, Resources: []agent.Resource{
		res("a", "file", map[string]any{"path": filepath.Join(dir, "a"), "content": "a\n", "colour": "red"}),
		res("b", "file", map[string]any{"path": filepath.Join(dir, "b"), "content": "b\n"}),
	}}
	b, err := agent.EncodeManifest(bad)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.fleet.Put(context.Background(), agent.DesiredKey("r4"), b); err != nil {
		t.Fatal(err)
	}
	s := w.waitStatus("b ready, a failed", func(s agent.Status) bool {
		return s.ManifestGeneration == 5 && s.Resources["b"].Phase == agent.Ready && s.Resources["a"].Phase == agent.Failed
	})
	if e := s.Resources["a"].Error; !strings.Contains(e, "spec refused, keeping the last one") || !strings.Contains(e, "colour: unknown field") {
		t.Errorf("a: %q", e)
	}
	if _, err := os.Stat(filepath.Join(dir, "a")); err != nil {
		t.Errorf("a's file: %v", err)
	}
}

// A foreign message on ev.agent.<agent>.<id> used to end the resource's
// audit trail silently. A record no appender wrote is skipped (the
// appender's rule) and the trail goes on; a record of another appender
// (a twin of this agent) interrupts it: the agent keeps working, says in
// the status that the trail was interrupted, and appends what follows.
func TestAgentReportsAnInterruptedAuditTrail(t *testing.T) {
	w := startAgentWorld(t, AgentConfig{ID: "r5", ObserveInterval: time.Hour})
	dir := t.TempDir()
	subject := agent.Subject("r5", "a")
	ctx := context.Background()
	gen := 0
	step := func(what string, audit bool) agent.Status {
		gen++
		m := w.apply(agent.Manifest{Resources: []agent.Resource{res("a", "file", map[string]any{"path": filepath.Join(dir, "a"), "content": fmt.Sprint(gen)})}})
		return w.waitStatus(what, func(s agent.Status) bool {
			b, _ := os.ReadFile(filepath.Join(dir, "a"))
			return s.ManifestGeneration == m.Generation && s.Converged() && string(b) == fmt.Sprint(gen) && (s.Resources["a"].Audit != "") == audit
		})
	}
	lastIsOurs := func() {
		t.Helper()
		st, err := w.nats.js.Stream(ctx, w.nats.names.EventsStream)
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			last, err := st.GetLastMsgForSubject(ctx, subject)
			if err == nil && string(last.Data) != "foreign" && !strings.HasSuffix(last.Header.Get("Nats-Msg-Id"), "/twin") {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("nothing appended after the foreign record: %v", err)
			}
		}
	}
	step("converged", false)
	if _, err := w.nats.js.Publish(ctx, subject, []byte("foreign")); err != nil {
		t.Fatal(err)
	}
	step("converged past a foreign record, the trail whole", false)
	lastIsOurs()
	// Another appender's record.
	st, err := w.nats.js.Stream(ctx, w.nats.names.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	last, err := st.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	msg := nats.NewMsg(subject)
	msg.Data = []byte("foreign")
	msg.Header.Set("Nats-Msg-Id", events.AppenderMsgID(subject, last.Sequence+1, "twin", ""))
	if _, err := w.nats.js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	s := step("the trail reported interrupted", true)
	if a := s.Resources["a"].Audit; !strings.Contains(a, "another process appended to ev.agent.r5.a") {
		t.Errorf("audit %q", a)
	}
	if !hasCondition(s, "AuditTrail", false) {
		t.Errorf("conditions %+v", s.Conditions)
	}
	step("still converging", true)
	lastIsOurs()
}

func hasCondition(s agent.Status, typ string, status bool) bool {
	for _, c := range s.Conditions {
		if c.Type == typ && c.Status == status {
			return true
		}
	}
	return false
}

// panicKind panics in every call but Validate.
type panicKind struct{}

func (panicKind) Kind() string                  { return "panic" }
func (panicKind) Validate(resources.Spec) error { return nil }
func (panicKind) Observe(context.Context, string, resources.Spec) (resources.Observation, error) {
	panic("observe")
}
func (panicKind) Reconcile(context.Context, string, resources.Spec) (resources.Observation, error) {
	panic("boom")
}
func (panicKind) Delete(context.Context, string, resources.Spec) error { panic("delete") }

// A reconciler that panics fails its resource, again and again with
// backoff; the agent and the other resources carry on.
func TestAgentAPanicStaysInItsResource(t *testing.T) {
	w := startAgentWorld(t, AgentConfig{ID: "r6", ObserveInterval: time.Hour, RetryBase: 20 * time.Millisecond, RetryMax: 50 * time.Millisecond,
		kinds: []resources.Reconciler{panicKind{}}})
	path := filepath.Join(t.TempDir(), "a")
	m := agent.Manifest{Agent: "r6", Resources: []agent.Resource{res("p", "panic", nil), res("a", "file", map[string]any{"path": path, "content": "a\n"})}}
	m, _, err := ApplyManifest(context.Background(), w.fleet, m, w.a.actor.reg, ManifestWriter{})
	if err != nil {
		t.Fatal(err)
	}
	s := w.waitStatus("p failed 5 times, a ready", func(s agent.Status) bool {
		return s.ManifestGeneration == m.Generation && s.Resources["p"].Failures >= 5 && s.Resources["a"].Phase == agent.Ready
	})
	if e := s.Resources["p"].Error; e != "the panic kind's reconcile panicked: boom" {
		t.Errorf("error %q", e)
	}
	m = w.apply(agent.Manifest{Resources: []agent.Resource{res("a", "file", map[string]any{"path": path, "content": "b\n"})}})
	w.waitStatus("a on the next generation, p's delete failing", func(s agent.Status) bool {
		b, _ := os.ReadFile(path)
		return s.ManifestGeneration == m.Generation && string(b) == "b\n" && strings.Contains(s.Resources["p"].Error, "delete panicked")
	})
}
