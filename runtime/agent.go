package runtime

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/anthdm/hollywood/actor"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/vmihailenco/msgpack/v5"

	"understudy/actors/agent"
	"understudy/actors/resources"
	"understudy/actors/resources/libvirt"
	"understudy/actors/resources/libvirt/rules"
	"understudy/events"
)

// AgentConfig configures a node agent (node file, section agent).
type AgentConfig struct {
	ID string
	// ObserveInterval is how often a Ready resource is observed again to
	// catch drift the manifest did not cause.
	ObserveInterval time.Duration
	// AllowShellJobs lets shell-job resources run (otherwise: Refused).
	AllowShellJobs bool
	// LibvirtURI is where the vm and network kinds connect (validated at
	// load); rules.DefaultURI (qemu:///system) when empty.
	LibvirtURI string
	// LibvirtDriver is the understudy-libvirt process those kinds' calls
	// run in (node file: libvirt.driver): the zero value finds it
	// next to this executable, else in PATH. The agent starts it on the
	// kinds' first call and stops it when it stops.
	LibvirtDriver libvirt.DriverConfig
	// Podman is how the container kind runs podman (node file:
	// agent.container).
	Podman resources.PodmanConfig
	// CallTimeout bounds each Observe, Reconcile and Delete of a resource
	// (node file: agent.call_timeout, default 15m): a call that hangs fails
	// the resource, which is retried with backoff, instead of stalling its
	// actor for good. A libvirt call cut off this way ends with its driver
	// process killed. It must cover a resource's init steps together.
	CallTimeout time.Duration
	// RetryBase and RetryMax bound the per-resource retry backoff.
	RetryBase, RetryMax time.Duration
	// PresenceInterval is how often presence.<agent> is written.
	PresenceInterval time.Duration
	// StateDir holds what the agent must remember across its own crashes
	// (mode 0700): the resources it manages and their last specs, the
	// processes it started, the files it wrote. Default:
	// DefaultDataDir()/agent/<id>.
	StateDir string
	// ManifestKeys are the public keys (operator nkeys, "O…") whose
	// signatures make a manifest run here (node file:
	// security.manifest_keys). With them, an unsigned manifest, one whose
	// signature does not verify, and one signed by another key are refused
	// (the last accepted one keeps running, the refusal is in the status);
	// without them, manifests are not verified and unsigned ones run.
	ManifestKeys []string
	// Host is the node's failover host: the postgres-pair kind adds its
	// members to it and removes them (Serve sets it). Without one, that
	// kind is Refused.
	Host *Host
	// kinds are added to the registry (tests: a kind that panics).
	kinds []resources.Reconciler
	// pgKeeper is the PostgreSQL keeper's command of the postgres-pair
	// kind's members (tests: the test binary); default understudy pg-keeper.
	pgKeeper []string
}

// DefaultAgentCallTimeout is AgentConfig.CallTimeout's default.
const DefaultAgentCallTimeout = 15 * time.Minute

func (c *AgentConfig) defaults() {
	if c.ObserveInterval <= 0 {
		c.ObserveInterval = 30 * time.Second
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = DefaultAgentCallTimeout
	}
	if c.RetryBase <= 0 {
		c.RetryBase = time.Second
	}
	if c.RetryMax <= 0 {
		c.RetryMax = 5 * time.Minute
	}
	if c.PresenceInterval <= 0 {
		c.PresenceInterval = 10 * time.Second
	}
	if c.StateDir == "" && c.ID != "" {
		c.StateDir = filepath.Join(DefaultDataDir(), "agent", c.ID)
	}
}

// Agent runs a node agent: a hollywood actor that watches the agent's
// manifest and one child actor per resource.
type Agent struct {
	engine   *actor.Engine
	pid      *actor.PID
	end      context.CancelFunc // ends the agent's life (agentActor.life)
	actor    *agentActor
	lock     *os.File // the state directory's (lockStateDir)
	stopOnce sync.Once
}

// Presence is what an agent writes at presence.<agent>.
type Presence struct {
	Agent   string    `msgpack:"agent" json:"agent"`
	Version string    `msgpack:"version" json:"agent_version"`
	Started time.Time `msgpack:"started" json:"started"`
	At      time.Time `msgpack:"at" json:"at"`
}

// PingReply answers device-commands.<agent>.ping.
type PingReply struct {
	DeviceID     string  `json:"device_id"`
	AgentVersion string  `json:"agent_version"`
	UptimeS      float64 `json:"uptime_s"`
}

// CommandError is the typed reply to a command the agent cannot serve.
type CommandError struct {
	Error string   `json:"error"`
	Code  string   `json:"code"` // "unknown_verb"
	Verb  string   `json:"verb"`
	Verbs []string `json:"verbs"`
}

// AgentRegistry returns the reconcilers an agent runs, for validating
// manifests: its libvirt kinds never start their process (validation
// never does), so nothing needs closing.
func AgentRegistry(cfg AgentConfig, proc *resources.Process) resources.Registry {
	reg, _ := agentRegistry(cfg, proc, nil)
	return reg
}

// agentRegistry returns the reconcilers and the understudy-libvirt
// process the libvirt kinds share: started on their first call (one
// connection for both, kept in that process), closed by the agent's stop.
func agentRegistry(cfg AgentConfig, proc *resources.Process, logger *slog.Logger) (resources.Registry, *libvirt.DriverProcess) {
	reg := resources.Registry{}
	reg.Register(resources.NewFile(cfg.ID, cfg.StateDir))
	reg.Register(proc)
	reg.Register(&resources.ShellJob{Allowed: cfg.AllowShellJobs})
	uri := cfg.LibvirtURI
	if uri == "" {
		uri = rules.DefaultURI
	}
	lv := libvirt.NewDriverProcess(cfg.LibvirtDriver, logger)
	hv := lv.Hypervisor(uri)
	reg.Register(libvirt.NewVMReconciler(hv, cfg.ID))
	reg.Register(libvirt.NewNetworkReconciler(hv, cfg.ID))
	reg.Register(resources.NewContainer(cfg.Podman))
	reg.Register(&pairKind{agent: cfg.ID, host: cfg.Host, keeper: cfg.pgKeeper})
	for _, k := range cfg.kinds {
		reg.Register(k)
	}
	return reg, lv
}

// StartAgent starts a node agent on nc. The fleet bucket and the events
// stream must exist (Provision creates them).
func StartAgent(ctx context.Context, nc *nats.Conn, fleetBucket, stream string, cfg AgentConfig, logger *slog.Logger) (*Agent, error) {
	cfg.defaults()
	if logger == nil {
		logger = slog.Default()
	}
	logger = logger.With("agent", cfg.ID)
	for i, k := range cfg.ManifestKeys {
		if rule := CheckManifestKey(k); rule != "" {
			return nil, &ConfigError{Field: fmt.Sprintf("security.manifest_keys[%d]", i), Rule: rule, Value: k}
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	kv, err := events.NewJetStreamKV(ctx, js, fleetBucket)
	if err != nil {
		return nil, err
	}
	evlog, err := events.NewJetStreamLog(js, stream, Codec())
	if err != nil {
		return nil, err
	}
	engine, err := actor.NewEngine(actor.NewEngineConfig())
	if err != nil {
		return nil, err
	}
	lock, err := lockStateDir(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	proc := resources.NewProcess()
	proc.StateDir = cfg.StateDir
	reg, lv := agentRegistry(cfg, proc, logger)
	// life ends when Stop begins: every reconciler call in flight is cut
	// off then, so a stop never waits out a hung call or a long init step.
	life, end := context.WithCancel(context.Background())
	aa := &agentActor{cfg: cfg, nc: nc, kv: kv, log: evlog, logger: logger, reg: reg, libvirt: lv, proc: proc, life: life,
		children: map[string]*actor.PID{}, keys: map[string]string{}, trails: map[string]*resourceTrail{}, audit: map[string]string{},
		journal: loadJournal(cfg.StateDir, cfg.ID, logger),
		status:  agent.Status{Agent: cfg.ID, Resources: map[string]agent.ResourceStatus{}, Conditions: []agent.Condition{}, Version: Version}}
	if aa.fallback = loadAccepted(cfg, logger); aa.fallback != nil {
		aa.acceptedGen, aa.savedRaw = aa.fallback.m.Generation, aa.fallback.raw
	}
	if len(cfg.ManifestKeys) == 0 {
		logger.Warn("agent: manifests are not verified: this node has no security.manifest_keys, so whoever can write " +
			agent.DesiredKey(cfg.ID) + " decides what runs here; list the manifest keys to require signatures (docs/agents.md, Signed manifests)")
	}
	a := &Agent{engine: engine, end: end, actor: aa, lock: lock}
	a.pid = engine.Spawn(func() actor.Receiver { return aa }, "agent", actor.WithID(cfg.ID))
	return a, nil
}

// Running reports whether the agent's actor runs (false once it stopped,
// by Stop or otherwise).
func (a *Agent) Running() bool { return !a.actor.halted.Load() }

// Stop stops the agent, its resource actors and the processes it runs. It
// cuts off the reconciler calls in flight, waits for the actors to stop,
// then closes what they shared (processes, the libvirt driver, appenders).
func (a *Agent) Stop() {
	a.stopOnce.Do(func() {
		a.end()
		<-a.engine.Poison(a.pid).Done()
		a.actor.teardown()
		_ = a.lock.Close()
	})
}

type (
	// manifestMsg is a desired state read at desired-state.<agent>.
	manifestMsg struct {
		m   agent.Manifest
		err error // *storedManifestError: it did not decode; *untrustedManifestError: it may not run here
		rev uint64
		// signer is the key that signed it ("": unsigned); raw the stored
		// value, kept as the last accepted one (acceptedFile).
		signer string
		raw    []byte
	}
	resourceUpdate struct {
		id string
		st agent.ResourceStatus
	}
	// resourceGone: the actor pid of resource id deleted it and stops.
	resourceGone struct {
		id  string
		pid *actor.PID
	}
	presenceTick struct{}
	// flushStatus writes the status once for every update queued before it.
	flushStatus struct{}
)

// agentActor is the node agent: it owns the manifest, the status and the
// resource actors.
type agentActor struct {
	// halted: the actor stopped (for /healthz: an agent that stopped
	// without Agent.Stop has stopped converging).
	halted   atomic.Bool
	cfg      AgentConfig
	life     context.Context // ends when Agent.Stop begins
	nc       *nats.Conn
	kv       events.KV
	log      events.Log
	logger   *slog.Logger
	reg      resources.Registry
	proc     *resources.Process
	libvirt  *libvirt.DriverProcess // the libvirt kinds' understudy-libvirt
	started  time.Time
	engine   *actor.Engine
	self     *actor.PID
	ctx      context.Context
	cancel   context.CancelFunc
	sub      *nats.Subscription
	children map[string]*actor.PID
	keys     map[string]string // id → spec key of what its actor runs
	manifest agent.Manifest
	status   agent.Status
	statusMu sync.Mutex // guards snapshot, read by the command handler
	snapshot agent.Status
	rev      uint64
	// flushQueued: a flushStatus is on its way (see changed).
	flushQueued bool
	// statusFailing: the latest status write failed; publish tries again
	// after statusRetry until one lands.
	statusFailing bool
	// reportedRev is the last revision of a refused desired state logged
	// (once each).
	reportedRev uint64
	// acceptedGen is the generation of the manifest the agent runs (this
	// run's, or the last accepted one's of an earlier run): with
	// ManifestKeys, a signed manifest below it is a replay, refused.
	acceptedGen uint64
	accepted    bool   // a manifest was accepted in this run
	savedRaw    []byte // what acceptedFile holds
	// fallback is the last manifest an earlier run accepted (acceptedFile,
	// verified again under ManifestKeys): run when the first desired
	// state this run reads is refused. nil: none.
	fallback *manifestMsg
	trails   map[string]*resourceTrail // guarded by trailsMu (teardown)
	trailsMu sync.Mutex
	audit    map[string]string // id → why its trail is interrupted
	journal  *agentJournal
	spawned  uint64 // numbers resource actors: an id's next actor never meets its last
}

func (a *agentActor) Receive(c *actor.Context) {
	defer func() {
		// A panic here must not restart the agent with fresh state (nor,
		// after three, stop it for good): report it and carry on.
		if p := recover(); p != nil {
			a.logger.Error("agent: panic handling a message; carrying on", "message", fmt.Sprintf("%T", c.Message()), "panic", p, "stack", string(debug.Stack()))
			a.condition("Healthy", false, "Panicked", fmt.Sprintf("handling %T: %v", c.Message(), p))
			a.changed(c)
		}
	}()
	switch m := c.Message().(type) {
	case actor.Started:
		a.startedAt(c)
	case actor.Stopped:
		a.halted.Store(true)
		a.stopped()
	case manifestMsg:
		a.onManifest(c, m)
	case resourceUpdate:
		a.status.Resources[m.id] = m.st
		a.changed(c)
	case resourceGone:
		if a.children[m.id] != nil && a.children[m.id].ID != m.pid.ID {
			return // an older actor of the id: its successor runs
		}
		delete(a.children, m.id)
		delete(a.keys, m.id)
		if !a.unknownKind(m.id) {
			delete(a.status.Resources, m.id)
			delete(a.audit, m.id)
		}
		a.changed(c)
	case trailBroken:
		a.audit[m.id] = fmt.Sprintf("interrupted at %s: another process appended to %s (%v); events queued then are lost, later ones follow the foreign message",
			m.at.UTC().Format(time.RFC3339), agent.Subject(a.cfg.ID, m.id), m.err)
		a.logger.Error("agent: a resource's audit trail was interrupted by another writer", "resource", m.id, "err", m.err)
		a.changed(c)
	case flushStatus:
		a.flushQueued = false
		a.publish()
	case presenceTick:
		a.presence()
	}
}

// changed queues one status write behind the messages already waiting: a
// burst of resource updates (a manifest of 100 files) is written once, not
// once per update.
func (a *agentActor) changed(c *actor.Context) {
	if !a.flushQueued {
		a.flushQueued = true
		c.Send(c.PID(), flushStatus{})
	}
}

func (a *agentActor) startedAt(c *actor.Context) {
	a.started = time.Now()
	a.engine, a.self = c.Engine(), c.PID()
	a.ctx, a.cancel = context.WithCancel(a.life)
	if e, err := a.kv.Get(a.ctx, agent.ActualKey(a.cfg.ID)); err == nil {
		a.rev = e.Revision
	}
	engine, self := c.Engine(), c.PID()
	w, err := a.kv.Watch(a.ctx, agent.DesiredKey(a.cfg.ID), events.WatchOptions{})
	if err != nil {
		a.logger.Error("agent: cannot watch its manifest", "key", agent.DesiredKey(a.cfg.ID), "err", err)
	} else {
		go func() {
			defer w.Stop()
			for e := range w.Updates() {
				if e.Revision == 0 || e.Op != events.OpPut {
					continue
				}
				// Decoding is bounded and never panics: a hostile value
				// costs a walk over at most 1 MiB and a signature check,
				// here, off the actor.
				engine.Send(self, readDesired(e.Key, e.Revision, e.Value, a.cfg.ManifestKeys))
			}
		}()
	}
	sub, err := a.nc.Subscribe(agent.CommandSubject(a.cfg.ID, "*"), a.command)
	if err != nil {
		a.logger.Error("agent: cannot serve device commands", "err", err)
	}
	a.sub = sub
	go func() {
		t := time.NewTicker(a.cfg.PresenceInterval)
		defer t.Stop()
		engine.Send(self, presenceTick{})
		for {
			select {
			case <-a.ctx.Done():
				return
			case <-t.C:
				engine.Send(self, presenceTick{})
			}
		}
	}()
	a.publish()
	a.logger.Info("agent ready", "manifest_key", agent.DesiredKey(a.cfg.ID), "kinds", a.reg.Kinds())
}

// stopped ends what startedAt began. It also runs before a restart after
// a panic (hollywood restarts the same receiver), so what outlives one
// incarnation — processes, the libvirt driver, appenders — is closed by
// teardown, once, from Agent.Stop.
func (a *agentActor) stopped() {
	if a.sub != nil {
		_ = a.sub.Unsubscribe()
	}
	a.cancel()
}

func (a *agentActor) teardown() {
	a.proc.StopAll()
	_ = a.libvirt.Close() // and with it the libvirt connections
	a.trailsMu.Lock()
	defer a.trailsMu.Unlock()
	for _, t := range a.trails {
		t.stop()
	}
}

// unknownKind reports whether the manifest has id with a kind this agent
// does not know.
func (a *agentActor) unknownKind(id string) bool {
	for _, r := range a.manifest.Resources {
		if r.ID == id {
			_, err := a.reg.Get(r.Kind)
			return err != nil
		}
	}
	return false
}

// command answers device-commands.<agent>.<verb> (on a NATS goroutine).
func (a *agentActor) command(msg *nats.Msg) {
	verb := msg.Subject[len(agent.CommandSubject(a.cfg.ID, "")):]
	var reply any
	switch verb {
	case "ping":
		reply = PingReply{DeviceID: a.cfg.ID, AgentVersion: Version, UptimeS: time.Since(a.started).Seconds()}
	case "status":
		a.statusMu.Lock()
		reply = a.snapshot
		a.statusMu.Unlock()
	default:
		reply = CommandError{Error: fmt.Sprintf("unknown verb %q", verb), Code: "unknown_verb", Verb: verb, Verbs: []string{"ping", "status"}}
	}
	b, err := json.Marshal(reply)
	if err != nil {
		a.logger.Error("agent: encode reply", "verb", verb, "err", err)
		return
	}
	_ = msg.Respond(b)
}

func (a *agentActor) presence() {
	b, err := msgpack.Marshal(Presence{Agent: a.cfg.ID, Version: Version, Started: a.started.UTC(), At: time.Now().UTC()})
	if err == nil {
		ctx, cancel := context.WithTimeout(a.ctx, 5*time.Second)
		defer cancel()
		if _, err := a.kv.Put(ctx, agent.PresenceKey(a.cfg.ID), b); err != nil && a.ctx.Err() == nil {
			a.logger.Warn("agent: presence write failed", "err", err)
		}
	}
}

func (a *agentActor) condition(typ string, ok bool, reason, message string) {
	for i, c := range a.status.Conditions {
		if c.Type == typ {
			if c.Status != ok || c.Reason != reason || c.Message != message {
				a.status.Conditions[i] = agent.Condition{Type: typ, Status: ok, Reason: reason, Message: message, Since: time.Now().UTC()}
			}
			return
		}
	}
	a.status.Conditions = append(a.status.Conditions, agent.Condition{Type: typ, Status: ok, Reason: reason, Message: message, Since: time.Now().UTC()})
}

func (a *agentActor) onManifest(c *actor.Context, mm manifestMsg) {
	m, err := mm.m, mm.err
	reason := agent.RefusedInvalid
	var se *storedManifestError
	var ue *untrustedManifestError
	switch {
	case errors.As(err, &se):
		reason = agent.RefusedUndecodable
	case errors.As(err, &ue):
		reason = ue.reason
	case err != nil:
	case m.Agent != a.cfg.ID:
		err = fmt.Errorf("manifest: agent: names %s, not this agent (%s)", m.Agent, a.cfg.ID)
	case len(a.cfg.ManifestKeys) > 0 && m.Generation < a.acceptedGen:
		reason = agent.RefusedRollback
		err = &untrustedManifestError{reason: reason, signer: mm.signer,
			msg: fmt.Sprintf("generation %d, signed by %s, is older than generation %d that this agent runs: a replay of an old manifest; apply a new one", m.Generation, mm.signer, a.acceptedGen)}
	}
	var specErrs map[int]error
	if err == nil {
		specErrs, err = m.Check(a.reg, false)
	}
	if err != nil {
		a.refuse(c, mm, reason, err)
		return
	}
	a.run(c, m, specErrs)
	a.accept(mm)
}

// refuse keeps what runs and says why the desired state mm does not run:
// in the status (a condition and RefusedManifest) and in the log, once
// per stored revision. The first desired state of a run refused, the
// agent runs the last manifest an earlier run accepted (fallback).
func (a *agentActor) refuse(c *actor.Context, mm manifestMsg, reason agent.RefusalReason, err error) {
	if !a.accepted && a.fallback != nil {
		fb := *a.fallback
		a.fallback = nil
		if specErrs, ferr := fb.m.Check(a.reg, false); ferr == nil {
			a.logger.Warn("agent: the stored desired state is refused; running the last manifest this agent accepted",
				"generation", fb.m.Generation, "signer", fb.signer, "from", acceptedFile(a.cfg.StateDir))
			a.run(c, fb.m, specErrs)
			a.accept(fb)
		}
	}
	keeps := "nothing runs yet"
	if a.accepted {
		keeps = fmt.Sprintf("the agent keeps running generation %d", a.manifest.Generation)
		if a.status.ManifestSigner != "" {
			keeps += " (signed by " + a.status.ManifestSigner + ")"
		}
	}
	key := agent.DesiredKey(a.cfg.ID)
	msg := err.Error()
	var ue *untrustedManifestError
	untrusted := errors.As(err, &ue)
	if untrusted {
		msg = fmt.Sprintf("%s revision %d: %s; %s", key, mm.rev, msg, keeps)
	}
	if mm.rev == 0 || mm.rev != a.reportedRev {
		a.reportedRev = mm.rev
		var se *storedManifestError
		switch {
		case errors.As(err, &se):
			a.logger.Error("agent: stored manifest does not decode; the resources keep their last spec until an apply replaces it",
				"key", se.key, "revision", se.rev, "size", se.size, "starts", se.prefix, "err", se.err)
		case untrusted:
			a.logger.Error("agent: manifest refused; "+keeps,
				"key", key, "revision", mm.rev, "reason", string(reason), "signer", ue.signer, "err", ue.msg)
		default:
			a.logger.Error("agent: manifest refused; the resources keep their last spec", "revision", mm.rev, "generation", mm.m.Generation, "err", err)
		}
	}
	switch {
	case untrusted:
		a.condition("ManifestTrusted", false, string(reason), msg)
	default:
		a.condition("ManifestValid", false, string(reason), msg)
		if len(a.cfg.ManifestKeys) > 0 && mm.signer != "" {
			// Its signature verified; what it says is refused.
			a.condition("ManifestTrusted", true, "Verified", fmt.Sprintf("%s revision %d signed by %s", key, mm.rev, mm.signer))
		}
	}
	r := &agent.ManifestRefusal{Revision: mm.rev, Reason: reason, Signer: mm.signer, Generation: mm.m.Generation, Message: msg, Since: time.Now().UTC()}
	if old := a.status.RefusedManifest; old != nil && old.Revision == r.Revision && old.Reason == r.Reason {
		r.Since = old.Since
	}
	a.status.RefusedManifest = r
	a.publish()
}

// accept records mm as the manifest the agent runs: its signer in the
// status, and its stored value in the state directory (acceptedFile), for
// a later run whose first desired state is refused.
func (a *agentActor) accept(mm manifestMsg) {
	a.accepted, a.acceptedGen = true, mm.m.Generation
	a.status.ManifestSigner = mm.signer
	a.status.RefusedManifest = nil
	if len(a.cfg.ManifestKeys) > 0 {
		a.condition("ManifestTrusted", true, "Verified", fmt.Sprintf("generation %d signed by %s", mm.m.Generation, mm.signer))
	}
	if len(mm.raw) == 0 || bytes.Equal(mm.raw, a.savedRaw) {
		return
	}
	if err := resources.WriteState(acceptedFile(a.cfg.StateDir), mm.raw); err != nil {
		a.logger.Warn("agent: cannot keep the accepted manifest: a restart whose first manifest is refused will run nothing", "err", err)
		return
	}
	a.savedRaw = mm.raw
}

// run converges to m: what left it is deleted, what is new started, what
// changed updated. specErrs are m's resources whose specs are refused
// (they keep their last spec).
func (a *agentActor) run(c *actor.Context, m agent.Manifest, specErrs map[int]error) {
	a.condition("ManifestValid", true, "", "")
	a.manifest = m
	a.status.ManifestGeneration = m.Generation
	want := map[string]bool{}
	for _, r := range m.Resources {
		want[r.ID] = true
	}
	// What left the manifest: its actor deletes it; what a previous run
	// of the agent managed (the journal) and no actor runs was removed
	// while the agent was away: an actor deletes it now.
	// The journal first: a crash from here on leaves nothing it does not
	// know of.
	var managed []agent.Resource
	for i, r := range m.Resources {
		if _, err := a.reg.Get(r.Kind); err == nil && specErrs[i] == nil {
			managed = append(managed, r)
		}
	}
	a.journal.manages(managed...)
	for _, id := range slices.Sorted(maps.Keys(a.children)) {
		if !want[id] && a.keys[id] != "" {
			c.Send(a.children[id], deleteResource{})
		}
	}
	for _, id := range a.journal.ids() {
		if want[id] || a.children[id] != nil {
			continue
		}
		cur, old := a.journal.get(id)
		gone := cur
		if gone == nil {
			gone, old = old, nil
		}
		rec, err := a.reg.Get(gone.Kind)
		if err != nil {
			a.logger.Warn("agent: forgetting a resource of a kind this agent has no reconciler for", "resource", id, "kind", gone.Kind)
			a.journal.gone(id)
			continue
		}
		ra := a.newManaged(*gone, rec, m.Generation, old)
		ra.deleting = true
		a.status.Resources[id] = agent.ResourceStatus{Kind: gone.Kind, Phase: agent.Pending, Since: time.Now().UTC(), Generation: m.Generation}
		a.spawn(c, id, ra)
	}
	for id := range a.keys {
		if !want[id] {
			delete(a.keys, id)
			if a.children[id] == nil { // of an unknown kind: nothing to delete
				delete(a.status.Resources, id)
				delete(a.audit, id)
			}
		}
	}
	// Every resource of the manifest is reconciled against its generation,
	// changed or not: its status says which generation it is for.
	for i, r := range m.Resources {
		pid := a.children[r.ID]
		changed := a.keys[r.ID] != agent.SpecKey(r)
		rec, err := a.reg.Get(r.Kind)
		switch {
		case err != nil:
			// Kept and reported, never dropped: the rest still converge.
			// What ran under this id before (another kind) is deleted.
			if pid != nil {
				c.Send(pid, deleteResource{})
			}
			st := agent.ResourceStatus{Kind: r.Kind, Phase: agent.UnknownResource, Since: time.Now().UTC(), Generation: m.Generation,
				Error: fmt.Sprintf("no reconciler for kind %s on this agent (kinds: %v)", r.Kind, a.reg.Kinds())}
			if old, ok := a.status.Resources[r.ID]; ok && !changed && old.Phase == agent.UnknownResource {
				st.Since = old.Since
			}
			a.status.Resources[r.ID] = st
			if changed {
				a.event(r.ID, &agent.PhaseChanged{Agent: a.cfg.ID, ID: r.ID, Kind: r.Kind, Generation: m.Generation, Phase: st.Phase, Error: st.Error})
			}
			a.keys[r.ID] = agent.SpecKey(r)
		case specErrs[i] != nil:
			// This resource's spec only: it keeps what it runs (its actor
			// its last spec), and says why; the rest converge.
			msg := "spec refused, keeping the last one: " + specErrs[i].Error()
			st := agent.ResourceStatus{Kind: r.Kind, Phase: agent.Failed, Since: time.Now().UTC(), Generation: m.Generation, Error: msg}
			if old, ok := a.status.Resources[r.ID]; ok && old.Phase == agent.Failed && old.Error == msg {
				st.Since = old.Since
			}
			a.status.Resources[r.ID] = st
			if changed {
				a.event(r.ID, &agent.PhaseChanged{Agent: a.cfg.ID, ID: r.ID, Kind: r.Kind, Generation: m.Generation, Phase: st.Phase, Error: msg})
			}
		case pid != nil:
			a.keys[r.ID] = agent.SpecKey(r)
			c.Send(pid, specMsg{r: r, rec: rec, gen: m.Generation})
		default:
			// What the journal says ran under this id: of another kind, it
			// is deleted before this one runs.
			cur, old := a.journal.get(r.ID)
			if old == nil && cur != nil && cur.Kind != r.Kind {
				old = cur
			}
			var oldRec resources.Reconciler
			if old != nil {
				if oldRec, err = a.reg.Get(old.Kind); err != nil {
					old = nil
				}
			}
			a.keys[r.ID] = agent.SpecKey(r)
			a.status.Resources[r.ID] = agent.ResourceStatus{Kind: r.Kind, Phase: agent.Pending, Since: time.Now().UTC(), Generation: m.Generation}
			ra := a.newManaged(r, rec, m.Generation, nil)
			if old != nil {
				ra.pending, ra.pendingRec = old, oldRec
			}
			a.spawn(c, r.ID, ra)
		}
	}
	a.changed(c)
}

// newManaged returns the actor of resource r (not yet spawned); old, when
// set, is a resource of the id the actor deletes first.
func (a *agentActor) newManaged(r agent.Resource, rec resources.Reconciler, gen uint64, old *agent.Resource) *managedActor {
	ra := &managedActor{agent: a.cfg.ID, cfg: a.cfg, life: a.life, rec: rec, r: r, gen: gen, log: a.trailFor(r.ID),
		logger: a.logger.With("resource", r.ID), journal: a.journal}
	if old != nil {
		if orec, err := a.reg.Get(old.Kind); err == nil {
			ra.pending, ra.pendingRec = old, orec
		}
	}
	return ra
}

func (a *agentActor) spawn(c *actor.Context, id string, ra *managedActor) {
	a.spawned++
	a.children[id] = c.SpawnChild(func() actor.Receiver { return ra }, "resource", actor.WithID(id+"."+strconv.FormatUint(a.spawned, 10)))
}

// trailFor returns the audit trail of resource id.
func (a *agentActor) trailFor(id string) *resourceTrail {
	a.trailsMu.Lock()
	defer a.trailsMu.Unlock()
	t := a.trails[id]
	if t == nil {
		engine, self := a.engine, a.self
		t = newResourceTrail(a.log, agent.Subject(a.cfg.ID, id), a.logger, func(err error) {
			engine.Send(self, trailBroken{id: id, err: err, at: time.Now()})
		})
		a.trails[id] = t
	}
	return t
}

func (a *agentActor) event(id string, ev events.Event) { a.trailFor(id).add(ev) }

// publish recomputes the observed generation and writes the status by CAS
// on the revision of the agent's own last write.
func (a *agentActor) publish() {
	obs := a.status.ManifestGeneration
	for _, r := range a.status.Resources {
		if r.Generation < obs {
			obs = r.Generation
		}
	}
	if a.status.Settled() {
		a.status.ObservedGeneration = obs
	}
	conv := a.status.Converged()
	reason := "NotConverged"
	if conv {
		reason = "AllReady"
	}
	a.condition("Converged", conv, reason, "")
	audit := "AuditTrail"
	if len(a.audit) == 0 {
		a.condition(audit, true, "", "")
	} else {
		a.condition(audit, false, "Interrupted", fmt.Sprintf("another process appended to the trail of %v", slices.Sorted(maps.Keys(a.audit))))
	}
	a.status.Updated = time.Now().UTC()
	snap := a.status
	snap.Resources = maps.Clone(a.status.Resources)
	for id, why := range a.audit {
		if r, ok := snap.Resources[id]; ok {
			r.Audit = why
			snap.Resources[id] = r
		}
	}
	a.statusMu.Lock()
	a.snapshot = snap
	a.statusMu.Unlock()
	b, err := agent.EncodeStatus(snap)
	if err != nil {
		a.logger.Error("agent: encode status", "err", err)
		return
	}
	ctx, cancel := context.WithTimeout(a.ctx, 5*time.Second)
	defer cancel()
	key := agent.ActualKey(a.cfg.ID)
	for range 3 {
		var rev uint64
		if a.rev == 0 {
			rev, err = a.kv.Create(ctx, key, b)
		} else {
			rev, err = a.kv.Update(ctx, key, b, a.rev)
		}
		if err == nil {
			a.rev = rev
			if a.statusFailing {
				a.statusFailing = false
				a.logger.Info("agent: status written again", "key", key)
			}
			return
		}
		if !errors.Is(err, events.ErrConflict) {
			break
		}
		// Another writer (a previous run of this agent): take its revision.
		e, gerr := a.kv.Get(ctx, key)
		if gerr != nil {
			err = gerr
			break
		}
		a.rev = e.Revision
	}
	if a.ctx.Err() != nil {
		return
	}
	if !a.statusFailing {
		a.statusFailing = true
		a.logger.Warn("agent: status write failed; trying again every second until it lands", "key", key, "err", err, "retry", statusRetry)
	}
	// Nothing else may change for a long time (no manifest, nothing
	// drifting): without another try the status written at start, lost to
	// a store electing a leader, would stay missing.
	if !a.flushQueued {
		a.flushQueued = true
		engine, self := a.engine, a.self
		time.AfterFunc(statusRetry, func() { engine.Send(self, flushStatus{}) })
	}
}

// statusRetry is how soon a failed status write is tried again.
const statusRetry = time.Second

// storedManifestError is a value at desired-state.<agent> that does not
// decode: where it is and how it starts, for the operator to find it.
type storedManifestError struct {
	key    string
	rev    uint64
	size   int
	prefix string
	err    error
}

func (e *storedManifestError) Error() string {
	return fmt.Sprintf("%s revision %d (%d bytes, starting %s) does not decode: %v; the resources keep their last spec: apply a manifest to replace it",
		e.key, e.rev, e.size, e.prefix, e.err)
}

func (e *storedManifestError) Unwrap() error { return e.err }

// hexPrefix is the start of b in hex, for a report.
func hexPrefix(b []byte) string {
	const n = 16
	if len(b) > n {
		return hex.EncodeToString(b[:n]) + "…"
	}
	return hex.EncodeToString(b)
}

type (
	specMsg struct {
		r   agent.Resource
		rec resources.Reconciler // the reconciler of r's kind
		gen uint64
	}
	deleteResource struct{}
	managedTick    struct{ n uint64 }
)

// recoverer is a reconciler that cleans up after a crash of an earlier
// agent (the file kind's temporary files) when an actor starts managing a
// resource. Optional.
type recoverer interface {
	Recover(ctx context.Context, id string, spec resources.Spec) error
}

// managedActor reconciles one resource: at start and on every spec,
// again on a timer (drift), and after failures with backoff. A resource
// whose kind changed is deleted as the old kind (pending) before the new
// one runs. Every reconciler call is bounded (callCtx) and a panic in one
// fails the resource, never the agent.
type managedActor struct {
	deleting   bool // removed from the manifest; deleting until it succeeds
	agent      string
	cfg        AgentConfig
	life       context.Context // the agent's: its calls end with it
	rec        resources.Reconciler
	r          agent.Resource
	pending    *agent.Resource // what ran under this id as another kind: deleted first
	pendingRec resources.Reconciler
	recovered  bool
	gen        uint64
	log        *resourceTrail
	journal    *agentJournal
	logger     *slog.Logger
	failures   int
	phase      agent.Phase
	since      time.Time
	last       agent.ResourceStatus // the last status reported
	tick       uint64
	timer      *time.Timer
}

func (ra *managedActor) Receive(c *actor.Context) {
	switch m := c.Message().(type) {
	case actor.Started:
		// Started runs on the spawning agent's goroutine (hollywood starts
		// a child synchronously): the first reconcile goes through the
		// inbox, so a slow resource never holds up the agent.
		c.Send(c.PID(), managedTick{n: ra.tick})
	case actor.Stopped:
		if ra.timer != nil {
			ra.timer.Stop()
		}
	case specMsg:
		changed := agent.SpecKey(m.r) != agent.SpecKey(ra.r)
		if m.r.Kind != ra.r.Kind && ra.pending == nil {
			// Another kind under the same id: the old one goes first.
			old := ra.r
			ra.pending, ra.pendingRec = &old, ra.rec
		}
		ra.r, ra.rec, ra.gen = m.r, m.rec, m.gen
		if changed || ra.deleting {
			// Back in the manifest while its delete was failing: reconcile.
			ra.deleting, ra.failures = false, 0
			ra.reconcile(c, "spec changed")
		} else {
			ra.report(c, ra.last, nil) // the same outcome, for the new generation
		}
	case managedTick:
		if m.n != ra.tick {
			return
		}
		if !ra.recovered {
			ra.recovered = true
			ra.recover()
		}
		switch {
		case ra.deleting:
			ra.delete(c)
		case ra.phase == agent.Ready:
			var o resources.Observation
			err := ra.call(ra.rec, "observe", func(ctx context.Context) (err error) {
				o, err = ra.rec.Observe(ctx, ra.r.ID, ra.r.Spec)
				return err
			})
			if err == nil && o.InSync {
				// Facts that change while in sync (a pair member's phase)
				// reach the status, over those reported before; no event.
				details := maps.Clone(ra.last.Details)
				if details == nil && len(o.Details) > 0 {
					details = map[string]string{}
				}
				maps.Copy(details, o.Details)
				if !maps.Equal(details, ra.last.Details) {
					ra.report(c, agent.ResourceStatus{Phase: agent.Ready, Details: details}, nil)
				}
				ra.schedule(c, ra.cfg.ObserveInterval)
				return
			}
			drift := o.Drift
			if err != nil {
				drift = err.Error()
			}
			ra.reconcile(c, drift)
		default:
			ra.reconcile(c, "")
		}
	case deleteResource:
		if ra.timer != nil {
			ra.timer.Stop()
		}
		ra.deleting, ra.failures = true, 0
		ra.delete(c)
	}
}

// recover lets the kinds clean up what a crashed agent left of the
// resource (and of the kind it replaces).
func (ra *managedActor) recover() {
	for _, x := range []struct {
		rec resources.Reconciler
		r   *agent.Resource
	}{{ra.pendingRec, ra.pending}, {ra.rec, &ra.r}} {
		if rc, ok := x.rec.(recoverer); ok && x.r != nil {
			if err := ra.call(x.rec, "recover", func(ctx context.Context) error { return rc.Recover(ctx, x.r.ID, x.r.Spec) }); err != nil {
				ra.logger.Warn("resource: cleaning up after an earlier agent failed", "kind", x.r.Kind, "err", err)
			}
		}
	}
}

// call runs one reconciler call within callCtx; a panic in it is an
// error of this resource (with the stack in the log), not of the agent.
func (ra *managedActor) call(rec resources.Reconciler, what string, f func(ctx context.Context) error) (err error) {
	ctx, cancel := ra.callCtx()
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			ra.logger.Error("resource: reconciler panicked", "kind", rec.Kind(), "call", what, "panic", p, "stack", string(debug.Stack()))
			err = fmt.Errorf("the %s kind's %s panicked: %v", rec.Kind(), what, p)
		}
	}()
	err = f(ctx)
	if err != nil && ctx.Err() != nil && ra.life.Err() == nil {
		err = fmt.Errorf("%s cut off after agent.call_timeout %v: %w", what, ra.cfg.CallTimeout, err)
	}
	return err
}

// deletePending deletes what ran under this id as another kind; false
// when that failed (reported, retried with backoff).
func (ra *managedActor) deletePending(c *actor.Context) bool {
	if ra.pending == nil {
		return true
	}
	old := *ra.pending
	err := ra.call(ra.pendingRec, "delete", func(ctx context.Context) error { return ra.pendingRec.Delete(ctx, old.ID, old.Spec) })
	if err != nil {
		if ra.life.Err() != nil {
			return false
		}
		ra.log.add(&agent.Deleted{Agent: ra.agent, ID: old.ID, Kind: old.Kind, Error: err.Error()})
		ra.fail(c, fmt.Errorf("replacing kind %s by %s: delete of the %s failed: %w", old.Kind, ra.r.Kind, old.Kind, err), nil)
		return false
	}
	ra.log.add(&agent.Deleted{Agent: ra.agent, ID: old.ID, Kind: old.Kind})
	ra.pending, ra.pendingRec = nil, nil
	ra.journal.replacedGone(old.ID)
	return true
}

// delete removes the resource; a failed delete is reported (Failed, with
// the error) and retried with backoff until it succeeds or the resource
// returns to the manifest — what it left behind is never forgotten.
func (ra *managedActor) delete(c *actor.Context) {
	if !ra.deletePending(c) {
		return
	}
	err := ra.call(ra.rec, "delete", func(ctx context.Context) error { return ra.rec.Delete(ctx, ra.r.ID, ra.r.Spec) })
	if err != nil {
		if ra.life.Err() != nil {
			return // the agent is stopping: the next one deletes it
		}
		ra.failures++
		wait := agent.Backoff(ra.failures, ra.cfg.RetryBase, ra.cfg.RetryMax)
		retry := time.Now().Add(wait).UTC()
		msg := "delete failed: " + err.Error()
		ra.log.add(&agent.Deleted{Agent: ra.agent, ID: ra.r.ID, Kind: ra.r.Kind, Error: err.Error()})
		ra.report(c, agent.ResourceStatus{Phase: agent.Failed, Error: msg, RetryAfter: &retry, Failures: ra.failures}, nil)
		ra.logger.Warn("resource delete failed; retrying", "kind", ra.r.Kind, "retry_in", wait, "failures", ra.failures, "err", err)
		ra.schedule(c, wait)
		return
	}
	ra.log.add(&agent.Deleted{Agent: ra.agent, ID: ra.r.ID, Kind: ra.r.Kind})
	ra.journal.gone(ra.r.ID)
	c.Send(c.Parent(), resourceGone{id: ra.r.ID, pid: c.PID()})
	c.Engine().Poison(c.PID())
}

// callCtx is the context of one reconciler call: it carries the run
// recorder and ends after CallTimeout.
func (ra *managedActor) callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(resources.WithRuns(ra.life, runRecorder{ra}), ra.cfg.CallTimeout)
}

// runRecorder records every command a reconciler runs as an agent.Ran event.
type runRecorder struct{ ra *managedActor }

func (r runRecorder) Started(id, step string, command []string) func(int, bool, string) {
	start := time.Now()
	return func(code int, timedOut bool, detail string) {
		if len(detail) > 1024 {
			detail = detail[len(detail)-1024:]
		}
		r.ra.log.add(&agent.Ran{Agent: r.ra.agent, ID: id, Step: step, Command: command, ExitCode: code, TimedOut: timedOut, Took: time.Since(start), Detail: detail})
	}
}

// minCallTimer is a reconciler whose Reconcile needs at least some time
// for a spec (the sum of its init steps' timeouts).
type minCallTimer interface {
	MinCallTime(spec resources.Spec) time.Duration
}

func (ra *managedActor) reconcile(c *actor.Context, drift string) {
	if mc, ok := ra.rec.(minCallTimer); ok {
		if need := mc.MinCallTime(ra.r.Spec); need > ra.cfg.CallTimeout {
			// It could never finish: refuse it rather than cut it off forever.
			msg := fmt.Sprintf("its steps may take %v (the sum of their timeouts), more than agent.call_timeout %v: raise agent.call_timeout or shorten the steps", need, ra.cfg.CallTimeout)
			ra.report(c, agent.ResourceStatus{Phase: agent.Refused, Error: msg}, &agent.PhaseChanged{Error: msg})
			return
		}
	}
	ra.report(c, agent.ResourceStatus{Phase: agent.Reconciling}, &agent.PhaseChanged{Drift: drift})
	if !ra.deletePending(c) {
		return
	}
	var o resources.Observation
	err := ra.call(ra.rec, "reconcile", func(ctx context.Context) (err error) {
		o, err = ra.rec.Reconcile(ctx, ra.r.ID, ra.r.Spec)
		return err
	})
	switch {
	case err == nil && o.InSync:
		ra.failures = 0
		ra.report(c, agent.ResourceStatus{Phase: agent.Ready, Details: o.Details}, &agent.PhaseChanged{Details: o.Details})
		ra.schedule(c, ra.cfg.ObserveInterval)
	case errors.Is(err, resources.ErrRefused):
		ra.report(c, agent.ResourceStatus{Phase: agent.Refused, Error: err.Error()}, &agent.PhaseChanged{Error: err.Error()})
	default:
		if err == nil {
			err = fmt.Errorf("still out of sync after reconcile: %s", o.Drift)
		}
		ra.fail(c, err, o.Details)
	}
}

// fail reports the resource Failed and retries it with backoff.
func (ra *managedActor) fail(c *actor.Context, err error, details map[string]string) {
	ra.failures++
	wait := agent.Backoff(ra.failures, ra.cfg.RetryBase, ra.cfg.RetryMax)
	retry := time.Now().Add(wait).UTC()
	ra.report(c, agent.ResourceStatus{Phase: agent.Failed, Error: err.Error(), RetryAfter: &retry, Failures: ra.failures, Details: details},
		&agent.PhaseChanged{Error: err.Error(), RetryIn: wait})
	ra.logger.Warn("resource failed; retrying", "kind", ra.r.Kind, "retry_in", wait, "failures", ra.failures, "err", err)
	ra.schedule(c, wait)
}

// report sends the status to the agent and records the transition.
func (ra *managedActor) report(c *actor.Context, st agent.ResourceStatus, ev *agent.PhaseChanged) {
	if st.Phase != ra.phase {
		ra.since = time.Now().UTC()
	}
	st.Since, ra.phase = ra.since, st.Phase
	ra.last = st
	st.Kind, st.Generation = ra.r.Kind, ra.gen
	if ev != nil {
		ev.Agent, ev.ID, ev.Kind, ev.Generation, ev.Phase = ra.agent, ra.r.ID, ra.r.Kind, ra.gen, st.Phase
		ra.log.add(ev)
	}
	c.Send(c.Parent(), resourceUpdate{id: ra.r.ID, st: st})
}

func (ra *managedActor) schedule(c *actor.Context, d time.Duration) {
	ra.tick++
	n, engine, self := ra.tick, c.Engine(), c.PID()
	if ra.timer != nil {
		ra.timer.Stop()
	}
	ra.timer = time.AfterFunc(d, func() { engine.Send(self, managedTick{n: n}) })
}

// ApplyManifest stores m as the agent's desired state with the next
// generation, by compare-and-set on the stored one (a concurrent apply
// makes it fail with events.ErrConflict rather than lose either), signed
// when w has a key. m is validated first against reg: fields and rules of
// the known kinds; a kind reg does not know is left to the agent
// (UnknownResource).
//
// The postgres-pair resources belong to pair manifests (ApplyPair writes
// them into both sites' agents): m may not hold one, and those stored
// are kept, so that applying an agent's manifest never stops a database.
// A signed write keeps them only from a stored manifest w vouches for
// (ManifestWriter.Trusted; otherwise a *StoredContentError). A stored
// value that does not decode, or whose signature does not verify, is
// replaced and its content dropped.
func ApplyManifest(ctx context.Context, kv events.KV, m agent.Manifest, reg resources.Registry, w ManifestWriter) (agent.Manifest, uint64, error) {
	if err := m.Validate(reg, false); err != nil {
		return m, 0, err
	}
	for i, r := range m.Resources {
		if r.Kind == PostgresPairKind {
			return m, 0, &agent.ManifestError{Field: fmt.Sprintf("resources[%d].kind", i),
				Rule: "a postgres-pair is applied as a manifest of its own (kind: postgres-pair at the top), which reaches both sites' agents; take it out of this one"}
		}
	}
	key := agent.DesiredKey(m.Agent)
	cur, err := kv.Get(ctx, key)
	switch {
	case errors.Is(err, events.ErrNotFound):
		m.Generation = aboveReported(ctx, kv, m.Agent, 1)
		b, err := w.encode(m)
		if err != nil {
			return m, 0, err
		}
		rev, err := kv.Create(ctx, key, b)
		return m, rev, err
	case err != nil:
		return m, 0, err
	}
	// A stored value that does not decode or verify (written around
	// apply), or that w does not vouch for, gives no generation to trust:
	// the key's revision is above every generation stored there (each
	// apply takes a revision of its own).
	m.Generation = cur.Revision + 1
	if sd, err := w.read(cur.Value); err == nil {
		var kept []agent.Resource
		for _, r := range sd.m.Resources {
			if r.Kind != PostgresPairKind {
				continue
			}
			if slices.ContainsFunc(m.Resources, func(x agent.Resource) bool { return x.ID == r.ID }) {
				return m, 0, &agent.ManifestError{Field: "resources", Rule: fmt.Sprintf("id %s is the postgres-pair %s this agent runs: give the resource another id", r.ID, r.ID)}
			}
			kept = append(kept, r)
		}
		if !sd.vouched && len(kept) > 0 {
			return m, 0, &StoredContentError{Key: key, Revision: cur.Revision, Signer: sd.signer, Resources: resourceIDs(kept)}
		}
		m.Resources = append(m.Resources, kept...)
		if next := sd.m.Generation + 1; sd.vouched && next > sd.m.Generation {
			m.Generation = next
		}
	}
	m.Generation = aboveReported(ctx, kv, m.Agent, m.Generation)
	b, err := w.encode(m)
	if err != nil {
		return m, 0, err
	}
	rev, err := kv.Update(ctx, key, b, cur.Revision)
	return m, rev, err
}

// aboveReported is gen, or more: above the generation the agent reports
// running, so that an agent that refuses replays (ManifestKeys) never
// refuses a new write as one — after desired-state.<agent> was deleted
// and written again, say. The status is only read, never trusted beyond
// raising the number.
func aboveReported(ctx context.Context, kv events.KV, agentID string, gen uint64) uint64 {
	e, err := kv.Get(ctx, agent.ActualKey(agentID))
	if err != nil {
		return gen
	}
	s, err := agent.DecodeStatus(e.Value)
	if err != nil || s.ManifestGeneration+1 == 0 {
		return gen
	}
	return max(gen, s.ManifestGeneration+1)
}

// resourceIDs lists rs's ids.
func resourceIDs(rs []agent.Resource) []string {
	ids := make([]string, len(rs))
	for i, r := range rs {
		ids[i] = r.ID
	}
	return ids
}
