package runtime

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"understudy/actors/agent"
	"understudy/actors/resources"
	"understudy/events"
)

// agentJournal is the agent's memory of what it manages
// (StateDir/resources, agent.Journal): written before the agent acts on a
// resource and after it deleted one, read when the agent starts. Its
// methods are called by the agent actor and by resource actors.
type agentJournal struct {
	mu       sync.Mutex
	path     string
	agent    string
	logger   *slog.Logger
	managed  map[string]agent.Resource
	replaced map[string]agent.Resource
	failing  bool // the last write failed (logged once until one succeeds)
}

func loadJournal(dir, agentID string, logger *slog.Logger) *agentJournal {
	j := &agentJournal{path: filepath.Join(dir, "resources"), agent: agentID, logger: logger,
		managed: map[string]agent.Resource{}, replaced: map[string]agent.Resource{}}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		logger.Error("agent: no state directory: a restarted agent will not know what this one ran", "dir", dir, "err", err)
	}
	removeTemps(dir)
	b, err := readBounded(j.path, agent.JournalLimits.Bytes)
	switch {
	case os.IsNotExist(err):
		return j
	case err != nil:
		logger.Error("agent: cannot read its journal; starting without it", "path", j.path, "err", err)
		return j
	}
	jr, err := agent.DecodeJournal(b)
	if err != nil {
		logger.Error("agent: its journal does not decode; starting without it", "path", j.path, "err", err)
		return j
	}
	for _, r := range jr.Resources {
		j.managed[r.ID] = r
	}
	for _, r := range jr.Replaced {
		j.replaced[r.ID] = r
	}
	return j
}

// removeTemps removes what a crash left of the agent's own writes in dir
// and its subdirectories (".*.understudy-*").
func removeTemps(dir string) {
	for _, pattern := range []string{"*", "*/*"} {
		ms, _ := filepath.Glob(filepath.Join(dir, pattern, ".*.understudy-*"))
		top, _ := filepath.Glob(filepath.Join(dir, ".*.understudy-*"))
		for _, m := range append(ms, top...) {
			if st, err := os.Lstat(m); err == nil && st.Mode().IsRegular() {
				_ = os.Remove(m)
			}
		}
	}
}

// readBounded reads at most limit bytes of a regular file.
func readBounded(path string, limit int) ([]byte, error) {
	st, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() || st.Size() > int64(limit) {
		return nil, fmt.Errorf("%s: not a regular file of at most %d bytes", path, limit)
	}
	return os.ReadFile(path)
}

// manages records rs as what their resource actors run (written once, if
// anything changed); when r changes the kind of what ran under its id,
// the old one is kept as replaced until deleted.
func (j *agentJournal) manages(rs ...agent.Resource) {
	j.mu.Lock()
	defer j.mu.Unlock()
	dirty := false
	for _, r := range rs {
		old, ok := j.managed[r.ID]
		if ok && agent.SpecKey(old) == agent.SpecKey(r) {
			continue
		}
		if ok && old.Kind != r.Kind {
			if _, pending := j.replaced[r.ID]; !pending {
				j.replaced[r.ID] = old
			}
		}
		j.managed[r.ID] = r
		dirty = true
	}
	if dirty {
		j.save()
	}
}

// replacedGone: the old kind of id was deleted.
func (j *agentJournal) replacedGone(id string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.replaced, id)
	j.save()
}

// gone: id was deleted (or is no longer this agent's to manage).
func (j *agentJournal) gone(id string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.managed, id)
	delete(j.replaced, id)
	j.save()
}

// get returns what the journal says id runs, and its replaced kind.
func (j *agentJournal) get(id string) (cur, old *agent.Resource) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if r, ok := j.managed[id]; ok {
		cur = &r
	}
	if r, ok := j.replaced[id]; ok {
		old = &r
	}
	return cur, old
}

// ids lists the resources the journal knows, sorted.
func (j *agentJournal) ids() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	all := maps.Clone(j.managed)
	maps.Copy(all, j.replaced)
	return slices.Sorted(maps.Keys(all))
}

func (j *agentJournal) save() {
	jr := agent.Journal{Agent: j.agent}
	for _, id := range slices.Sorted(maps.Keys(j.managed)) {
		jr.Resources = append(jr.Resources, j.managed[id])
	}
	for _, id := range slices.Sorted(maps.Keys(j.replaced)) {
		jr.Replaced = append(jr.Replaced, j.replaced[id])
	}
	b, err := agent.EncodeJournal(jr)
	if err == nil {
		err = resources.WriteState(j.path, b)
	}
	if err != nil {
		if !j.failing {
			j.logger.Error("agent: cannot write its journal: a restarted agent may not know what this one runs", "path", j.path, "err", err)
		}
		j.failing = true
		return
	}
	j.failing = false
}

// resourceTrail is one resource's audit trail (ev.agent.<agent>.<id>):
// its appender, replaced by a new one after a conflict (another process
// appended to the subject). The conflict is reported through onBreak —
// the resource's status says its trail was interrupted — and the events
// that follow are appended after the foreign message instead of being
// dropped for good.
type resourceTrail struct {
	mu      sync.Mutex
	ap      *appender
	broken  bool
	stopped bool
	open    func() *appender
}

func newResourceTrail(log events.Log, subject string, logger *slog.Logger, onBreak func(error)) *resourceTrail {
	t := &resourceTrail{}
	t.open = func() *appender {
		ap := newAppender(log, subject, logger)
		ap.onConflict = func(err error) {
			t.mu.Lock()
			t.broken = true
			t.mu.Unlock()
			onBreak(err)
		}
		ap.start()
		return ap
	}
	t.ap = t.open()
	return t
}

// add queues events; it never blocks.
func (t *resourceTrail) add(evs ...events.Event) {
	t.mu.Lock()
	if t.broken && !t.stopped {
		old := t.ap
		t.ap, t.broken = t.open(), false
		defer old.stop() // its goroutine has returned: this does not wait
	}
	ap := t.ap
	t.mu.Unlock()
	ap.add(evs...)
}

func (t *resourceTrail) stop() {
	t.mu.Lock()
	t.stopped = true
	ap := t.ap
	t.mu.Unlock()
	ap.stop()
}

// trailBroken: the trail of id lost events to a conflict.
type trailBroken struct {
	id  string
	err error
	at  time.Time
}

// lockStateDir takes the state directory for this agent alone (an
// exclusive flock on dir/lock, released by the kernel when the process
// dies, however it dies): two agents sharing one journal would delete
// each other's resources.
func lockStateDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("agent state directory %s: %w", dir, err)
	}
	fh, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("agent state directory %s: %w", dir, err)
	}
	if err := syscall.Flock(int(fh.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		fh.Close()
		return nil, fmt.Errorf("agent state directory %s is in use by another agent (%w): give each agent a directory of its own", dir, err)
	}
	return fh, nil
}

// readDesired decodes and verifies a value stored at key (revision rev)
// against trusted (openDesired): a value that does not decode is a
// *storedManifestError; one that may not run, an *untrustedManifestError.
func readDesired(key string, rev uint64, b []byte, trusted []string) manifestMsg {
	m, signer, err := openDesired(b, trusted)
	var ue *untrustedManifestError
	if err != nil && !errors.As(err, &ue) {
		err = &storedManifestError{key: key, rev: rev, prefix: hexPrefix(b), size: len(b), err: err}
	}
	return manifestMsg{m: m, err: err, rev: rev, signer: signer, raw: b}
}

// acceptedFile holds the stored value of the last manifest the agent
// accepted (signed or not, as stored).
func acceptedFile(stateDir string) string { return filepath.Join(stateDir, "manifest") }

// loadAccepted reads acceptedFile and verifies it again against the
// node's keys now: nil when there is none, or it does not verify or no
// longer suits this agent (a key removed from security.manifest_keys
// takes its manifests with it).
func loadAccepted(cfg AgentConfig, logger *slog.Logger) *manifestMsg {
	path := acceptedFile(cfg.StateDir)
	b, err := readBounded(path, agent.SignedLimits.Bytes)
	if os.IsNotExist(err) {
		return nil
	}
	if err == nil {
		mm := readDesired(path, 0, b, cfg.ManifestKeys)
		if err = mm.err; err == nil && mm.m.Agent != cfg.ID {
			err = fmt.Errorf("names agent %s", mm.m.Agent)
		}
		if err == nil {
			return &mm
		}
	}
	logger.Warn("agent: not using the last accepted manifest of an earlier run", "path", path, "err", err)
	return nil
}
