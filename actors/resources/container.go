package resources

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"understudy/actors"
)

// Labels on every container the container reconciler creates, so that
// operators can filter them (podman ps -a --filter label=understudy.role=init).
const (
	LabelResource      = "understudy.resource"       // the resource id
	LabelRole          = "understudy.role"           // "service" or "init"
	LabelSpec          = "understudy.spec"           // hash of the spec the container was created for
	LabelInit          = "understudy.init"           // an init container's step name
	LabelInitOrder     = "understudy.init-order"     // an init container's position, from 0
	LabelInitCompleted = "understudy.init-completed" // on the service: the steps that completed before it
)

// PodmanConfig is how the container reconciler runs podman on this node.
// The zero value runs "podman" with podman's own defaults.
//
// On a machine without CAP_SYS_RESOURCE and with hybrid cgroups (v1
// controllers, an empty v2 hierarchy) podman's defaults cannot start a
// container: set Runtime "runc" and Ulimits below the node's hard limits
// (docs/agents.md, "container").
type PodmanConfig struct {
	// Binary is the podman executable (default "podman", found in PATH).
	Binary string
	// GlobalArgs go before every subcommand (--root, --runroot, --tmpdir,
	// --storage-driver, --cgroup-manager, --events-backend). Kept, not copied.
	GlobalArgs []string
	// Runtime is the OCI runtime (podman --runtime): "" is podman's default
	// (crun on Debian), or "runc", or a path.
	Runtime string
	// Cgroups is podman run --cgroups: "" (podman's default), "enabled",
	// "disabled", "no-conmon" or "split".
	Cgroups string
	// Ulimits are podman run --ulimit values ("nofile=1024:1024"), added to
	// every container. Kept, not copied.
	Ulimits []string
	// Env is added to podman's environment ("CONTAINERS_CONF=/etc/understudy/containers.conf").
	Env []string
}

var ulimitRule = regexp.MustCompile(`^(host|[a-z]+=-?[0-9]+(:-?[0-9]+)?)$`)

// Validate checks the configuration (the node's config loader calls it
// once). Its errors are *actors.ConfigError with the field as the node
// file names it under agent.container (cgroups, ulimits[i], env).
func (c PodmanConfig) Validate() error {
	if !slices.Contains([]string{"", "enabled", "disabled", "no-conmon", "split"}, c.Cgroups) {
		return &actors.ConfigError{Field: "cgroups", Rule: "must be one of enabled, disabled, no-conmon, split", Value: c.Cgroups}
	}
	for i, u := range c.Ulimits {
		if !ulimitRule.MatchString(u) {
			return &actors.ConfigError{Field: fmt.Sprintf("ulimits[%d]", i), Rule: "must be a podman ulimit such as nofile=1024:1024 or host", Value: u}
		}
	}
	for _, e := range c.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return &actors.ConfigError{Field: "env", Rule: "must be NAME=value", Value: e}
		}
	}
	return nil
}

// podmanRunner runs one podman command line (argv[0] is the binary) and
// returns what it printed and its exit code. err is set only when podman
// did not run to an exit: it could not be started, or ctx ended first.
// Implementations are safe for concurrent use.
type podmanRunner interface {
	run(ctx context.Context, argv []string) (podmanResult, error)
}

type podmanResult struct {
	Stdout, Stderr string
	Exit           int
}

// execPodman runs podman with env added to the agent's environment.
type execPodman struct{ env []string }

func (p execPodman) run(ctx context.Context, argv []string) (podmanResult, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.WaitDelay = 2 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	res := podmanResult{Stdout: stdout.String(), Stderr: stderr.String(), Exit: exitCode(err)}
	if err != nil && (res.Exit < 0 || ctx.Err() != nil) {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return res, fmt.Errorf("%s: %w", argv[0], err)
	}
	return res, nil
}

// Container runs containers through podman: per resource, init containers
// that run to completion first, in order, then the service container,
// detached, with its restart policy. Containers are not in a pod; they are
// named understudy-<id> and understudy-<id>-init-<step>, and labelled
// (LabelResource, LabelRole, …). State lives in podman, not in the agent: a
// restarted agent observes what it created before.
//
// Methods are safe for concurrent use on different ids; the agent never
// calls them concurrently for the same id.
type Container struct {
	cfg    PodmanConfig
	base   []string // binary and global args
	podman podmanRunner
}

// NewContainer returns the container reconciler running podman as cfg says
// (cfg is kept; validate it first with PodmanConfig.Validate).
func NewContainer(cfg PodmanConfig) *Container {
	bin := cfg.Binary
	if bin == "" {
		bin = "podman"
	}
	global := slices.Clone(cfg.GlobalArgs)
	if cfg.Runtime != "" {
		global = append(global, "--runtime", cfg.Runtime)
	}
	return &Container{cfg: cfg, base: append([]string{bin}, global...), podman: execPodman{env: cfg.Env}}
}

type containerInit struct {
	Name    string            `json:"name"`
	Image   string            `json:"image"`
	Command string            `json:"command,omitempty"`
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Timeout time.Duration     `json:"timeout"`
}

type containerSpec struct {
	Image       string            `json:"image"`
	Command     string            `json:"command,omitempty"`
	Args        []string          `json:"args,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	Restart     string            `json:"restart"`
	Network     string            `json:"network,omitempty"`
	Ports       []string          `json:"ports,omitempty"`
	Volumes     []string          `json:"volumes,omitempty"`
	StopTimeout time.Duration     `json:"stop_timeout,omitempty"`
	Init        []containerInit   `json:"init,omitempty"`
}

// containerNameRule is podman's rule for container names; ids and step
// names become parts of them.
var containerNameRule = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`)

func (*Container) Kind() string { return "container" }

func (c *Container) Validate(spec Spec) error { _, err := c.spec(spec); return err }

func (*Container) spec(spec Spec) (containerSpec, error) {
	r := newSpecReader("container", spec)
	var s containerSpec
	s.Image = r.str("image", true)
	s.Command = r.str("command", false)
	s.Args = r.strs("args")
	s.Env = r.strMap("env")
	s.Restart = r.oneOf("restart", "always", "always", "on-failure", "never")
	s.Network = r.str("network", false)
	s.Ports = r.strs("ports")
	s.Volumes = r.strs("volumes")
	s.StopTimeout = r.duration("stop_timeout", 0)
	names := map[string]bool{}
	for i, st := range r.list("init") {
		sr := r.sub(fmt.Sprintf("init[%d].", i), st)
		step := containerInit{Name: sr.str("name", true), Image: sr.str("image", false)}
		step.Command = sr.str("command", false)
		step.Args = sr.strs("args")
		step.Env = sr.strMap("env")
		step.Timeout = sr.duration("timeout", DefaultInitTimeout)
		if err := sr.done(); err != nil {
			return s, err
		}
		field := fmt.Sprintf("init[%d].name", i)
		if !containerNameRule.MatchString(step.Name) {
			return s, &SpecError{"container", field, "must be letters, digits, '_', '.' or '-', starting with a letter or digit (got " + step.Name + ")"}
		}
		if names[step.Name] {
			return s, &SpecError{"container", field, "init step names must be unique (" + step.Name + ")"}
		}
		names[step.Name] = true
		if step.Image == "" {
			step.Image = s.Image
		}
		s.Init = append(s.Init, step)
	}
	if err := r.done(); err != nil {
		return s, err
	}
	for k := range s.Env {
		if k == "" || strings.Contains(k, "=") {
			return s, &SpecError{"container", "env." + k, "must be a variable name"}
		}
	}
	return s, nil
}

// hash identifies a spec in the LabelSpec label: a changed spec is drift.
func (s containerSpec) hash() string {
	b, _ := json.Marshal(s) // map keys are sorted: stable
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

func serviceName(id string) string    { return "understudy-" + id }
func initName(id, step string) string { return "understudy-" + id + "-init-" + step }
func checkID(id string) error {
	if !containerNameRule.MatchString(id) {
		return fmt.Errorf("container: resource id %q cannot name a container (letters, digits, '_', '.', '-')", id)
	}
	return nil
}

// podmanError is podman's own message: its "Error: …" lines, with a hint
// when the cause is a known limit of the machine.
func podmanError(res podmanResult) string {
	var lines []string
	for _, l := range strings.Split(res.Stderr, "\n") {
		if m, ok := strings.CutPrefix(strings.TrimSpace(l), "Error: "); ok {
			lines = append(lines, m)
		}
	}
	msg := strings.Join(lines, "; ")
	if msg == "" {
		msg = strings.TrimSpace(res.Stderr)
	}
	if msg == "" {
		msg = "no message"
	}
	msg = fmt.Sprintf("%s (podman exit %d)", msg, res.Exit)
	switch {
	case strings.Contains(msg, "setrlimit") || strings.Contains(msg, "error setting rlimit"):
		msg += "; this node cannot raise resource limits (no CAP_SYS_RESOURCE): configure container ulimits below its hard limits (ulimit -Hn, ulimit -Hu)"
	case strings.Contains(msg, "cgroups in hybrid mode not supported"):
		msg += "; crun cannot use this node's hybrid cgroups: configure the container runtime runc"
	}
	return msg
}

// argv is the full podman command line of a subcommand.
func (c *Container) argv(args []string) []string {
	return append(slices.Clone(c.base), args...)
}

// run runs a podman subcommand.
func (c *Container) run(ctx context.Context, args ...string) (podmanResult, error) {
	return c.podman.run(ctx, c.argv(args))
}

// must runs a podman subcommand and fails unless podman exits 0.
func (c *Container) must(ctx context.Context, args ...string) (podmanResult, error) {
	res, err := c.run(ctx, args...)
	if err != nil {
		return res, err
	}
	if res.Exit != 0 {
		return res, fmt.Errorf("podman %s: %s", args[0], podmanError(res))
	}
	return res, nil
}

type inspected struct {
	ID    string `json:"Id"`
	Image string `json:"Image"`
	State struct {
		Status   string `json:"Status"`
		Running  bool   `json:"Running"`
		ExitCode int    `json:"ExitCode"`
		Error    string `json:"Error"`
	} `json:"State"`
	RestartCount int `json:"RestartCount"`
	Config       struct {
		Labels map[string]string `json:"Labels"`
	} `json:"Config"`
}

// inspect returns the named container, or nil when there is none.
func (c *Container) inspect(ctx context.Context, name string) (*inspected, error) {
	res, err := c.run(ctx, "container", "inspect", "--format", "json", name)
	if err != nil {
		return nil, err
	}
	var list []inspected
	if jerr := json.Unmarshal([]byte(res.Stdout), &list); jerr != nil || (res.Exit != 0 && !strings.Contains(res.Stderr, "no such container")) {
		return nil, fmt.Errorf("podman container inspect %s: %s", name, podmanError(res))
	}
	if len(list) == 0 {
		return nil, nil
	}
	return &list[0], nil
}

type listed struct {
	ID     string            `json:"Id"`
	Names  []string          `json:"Names"`
	Labels map[string]string `json:"Labels"`
}

// list returns the containers matching filters (same key: any of them).
func (c *Container) list(ctx context.Context, filters ...string) ([]listed, error) {
	args := []string{"ps", "--all", "--format", "json"}
	for _, f := range filters {
		args = append(args, "--filter", f)
	}
	res, err := c.must(ctx, args...)
	if err != nil {
		return nil, err
	}
	var out []listed
	if strings.TrimSpace(res.Stdout) == "" {
		return nil, nil
	}
	if err := json.Unmarshal([]byte(res.Stdout), &out); err != nil {
		return nil, fmt.Errorf("podman ps: %w", err)
	}
	return out, nil
}

func (c *Container) Observe(ctx context.Context, id string, spec Spec) (Observation, error) {
	s, err := c.spec(spec)
	if err != nil {
		return Observation{}, err
	}
	if err := checkID(id); err != nil {
		return Observation{}, err
	}
	return c.observe(ctx, id, s)
}

func (c *Container) observe(ctx context.Context, id string, s containerSpec) (Observation, error) {
	name := serviceName(id)
	ct, err := c.inspect(ctx, name)
	if err != nil {
		return Observation{}, err
	}
	if ct == nil {
		return Observation{Drift: "not running: no container " + name}, nil
	}
	d := map[string]string{
		"container":    name,
		"container_id": shortID(ct.ID),
		"state":        ct.State.Status,
		"image":        s.Image,
		"services":     "",
	}
	if ct.State.Running {
		d["services"] = name
	}
	if done := ct.Config.Labels[LabelInitCompleted]; done != "" {
		d["init_completed"] = done
	}
	if ct.RestartCount > 0 {
		d["restarts"] = strconv.Itoa(ct.RestartCount)
	}
	if ct.Config.Labels[LabelSpec] != s.hash() {
		return Observation{Drift: "spec changed", Details: d}, nil
	}
	// The tag may now name another image (a new import or pull).
	if res, err := c.run(ctx, "image", "inspect", "--format", "{{.Id}}", s.Image); err == nil && res.Exit == 0 {
		if now := strings.TrimSpace(res.Stdout); now != "" && now != ct.Image {
			return Observation{Drift: fmt.Sprintf("image changed: %s is now %s, the container runs %s", s.Image, shortID(now), shortID(ct.Image)), Details: d}, nil
		}
	}
	if ct.State.Running {
		return Observation{InSync: true, Details: d}, nil
	}
	if ct.State.Status == "exited" || ct.State.Status == "stopped" {
		d["exit_code"] = strconv.Itoa(ct.State.ExitCode)
		if s.Restart == "never" || (s.Restart == "on-failure" && ct.State.ExitCode == 0) {
			return Observation{InSync: true, Details: d}, nil
		}
		return Observation{Drift: fmt.Sprintf("exited (code %d)", ct.State.ExitCode), Details: d}, nil
	}
	drift := "not running (" + ct.State.Status + ")"
	if ct.State.Error != "" {
		d["error"] = ct.State.Error
		drift += ": " + ct.State.Error
	}
	return Observation{Drift: drift, Details: d}, nil
}

func shortID(id string) string {
	id = strings.TrimPrefix(id, "sha256:")
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func (c *Container) Reconcile(ctx context.Context, id string, spec Spec) (Observation, error) {
	s, err := c.spec(spec)
	if err != nil {
		return Observation{}, err
	}
	if err := checkID(id); err != nil {
		return Observation{}, err
	}
	if o, err := c.observe(ctx, id, s); err != nil || o.InSync {
		return o, err
	}
	names := []string{serviceName(id)}
	for _, st := range s.Init {
		names = append(names, initName(id, st.Name))
	}
	if err := c.removePrior(ctx, id, names); err != nil {
		return Observation{Drift: "not running"}, err
	}
	hash := s.hash()
	var done []string
	for i, st := range s.Init {
		if err := c.runInit(ctx, id, i, st, s, hash); err != nil {
			return Observation{Drift: "init step " + st.Name + " failed"}, fmt.Errorf("init step %s: %w", st.Name, err)
		}
		done = append(done, st.Name)
	}
	args := []string{"run", "--detach", "--name", serviceName(id),
		"--restart", map[string]string{"always": "always", "on-failure": "on-failure", "never": "no"}[s.Restart],
		"--label", LabelResource + "=" + id, "--label", LabelRole + "=service", "--label", LabelSpec + "=" + hash}
	if len(done) > 0 {
		args = append(args, "--label", LabelInitCompleted+"="+strings.Join(done, ","))
	}
	if s.StopTimeout > 0 {
		args = append(args, "--stop-timeout", strconv.Itoa(int((s.StopTimeout+time.Second-1)/time.Second)))
	}
	for _, p := range s.Ports {
		args = append(args, "--publish", p)
	}
	args = append(args, c.runArgs(s, s.Command, s.Env)...)
	args = append(args, s.Image)
	args = append(args, s.Args...)
	if _, err := c.must(ctx, args...); err != nil {
		return Observation{Drift: "not running"}, fmt.Errorf("start container %s: %w", serviceName(id), err)
	}
	return c.observe(ctx, id, s)
}

// runArgs are the podman run flags shared by init and service containers:
// the node's limits, then the resource's network, volumes, environment and
// entrypoint.
func (c *Container) runArgs(s containerSpec, command string, env map[string]string) []string {
	var args []string
	if c.cfg.Cgroups != "" {
		args = append(args, "--cgroups", c.cfg.Cgroups)
	}
	for _, u := range c.cfg.Ulimits {
		args = append(args, "--ulimit", u)
	}
	if s.Network != "" {
		args = append(args, "--network", s.Network)
	}
	for _, v := range s.Volumes {
		args = append(args, "--volume", v)
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		args = append(args, "--env", k+"="+env[k])
	}
	if command != "" {
		args = append(args, "--entrypoint", command)
	}
	return args
}

// removePrior removes the resource's containers (a changed spec, a failed
// run, init steps no longer in the spec) and any other container holding
// one of names. A container of another understudy resource is not removed:
// its name collides, which is an error.
func (c *Container) removePrior(ctx context.Context, id string, names []string) error {
	ours, err := c.list(ctx, "label="+LabelResource+"="+id)
	if err != nil {
		return err
	}
	var filters []string
	for _, n := range names {
		filters = append(filters, "name=^"+regexp.QuoteMeta(n)+"$")
	}
	same, err := c.list(ctx, filters...)
	if err != nil {
		return err
	}
	var ids []string
	for _, ct := range append(ours, same...) {
		if other, ok := ct.Labels[LabelResource]; ok && other != id {
			return fmt.Errorf("container %s belongs to resource %s: rename one of the resources", strings.Join(ct.Names, ","), other)
		}
		if !slices.Contains(ids, ct.ID) {
			ids = append(ids, ct.ID)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	_, err = c.must(ctx, append([]string{"rm", "--force", "--ignore"}, ids...)...)
	return err
}

// runInit runs init step i to completion within its timeout: Exited{code}
// (an error when not 0) or TimedOut{waited} (the container is killed and
// kept, like every init container, for podman logs).
func (c *Container) runInit(ctx context.Context, id string, i int, st containerInit, s containerSpec, hash string) error {
	name := initName(id, st.Name)
	args := []string{"run", "--detach", "--name", name, "--restart", "no",
		"--label", LabelResource + "=" + id, "--label", LabelRole + "=init", "--label", LabelSpec + "=" + hash,
		"--label", LabelInit + "=" + st.Name, "--label", LabelInitOrder + "=" + strconv.Itoa(i)}
	args = append(args, c.runArgs(s, st.Command, st.Env)...)
	args = append(args, st.Image)
	args = append(args, st.Args...)
	done := runsOf(ctx).Started(id, st.Name, redactEnv(c.argv(args)))

	tctx, cancel := context.WithTimeout(ctx, st.Timeout)
	defer cancel()
	res, err := c.run(tctx, args...)
	if err == nil && res.Exit != 0 {
		msg := podmanError(res)
		done(-1, false, msg)
		return fmt.Errorf("could not start: %s", msg)
	}
	if err == nil {
		res, err = c.run(tctx, "wait", name)
	}
	if errors.Is(tctx.Err(), context.DeadlineExceeded) {
		// The step's time is up, not the caller's: stop it with a fresh bound.
		kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer kcancel()
		_, _ = c.run(kctx, "kill", "--signal", "KILL", name)
		msg := fmt.Sprintf("timed out: waited %v", st.Timeout)
		done(-1, true, msg)
		return errors.New(msg)
	}
	if err != nil {
		done(-1, false, err.Error())
		return err
	}
	code, perr := strconv.Atoi(strings.TrimSpace(res.Stdout))
	if res.Exit != 0 || perr != nil {
		msg := podmanError(res)
		done(-1, false, msg)
		return fmt.Errorf("podman wait: %s", msg)
	}
	out := c.logs(ctx, name)
	done(code, false, out)
	if code != 0 {
		return fmt.Errorf("exited %d%s", code, suffix(out))
	}
	return nil
}

// redactEnv copies argv with environment values hidden: the audit record
// goes to the event log, and env often carries passwords.
func redactEnv(argv []string) []string {
	out := slices.Clone(argv)
	for i := 1; i < len(out); i++ {
		if out[i-1] == "--env" {
			k, _, _ := strings.Cut(out[i], "=")
			out[i] = k + "=***"
		}
	}
	return out
}

// logs is the tail of a container's output (stdout, then stderr).
func (c *Container) logs(ctx context.Context, name string) string {
	res, err := c.run(ctx, "logs", "--tail", "50", name)
	if err != nil || res.Exit != 0 {
		return ""
	}
	var t tail
	_, _ = t.Write([]byte(res.Stdout + res.Stderr))
	return t.String()
}

func (c *Container) Delete(ctx context.Context, id string, _ Spec) error {
	if err := checkID(id); err != nil {
		return err
	}
	ours, err := c.list(ctx, "label="+LabelResource+"="+id)
	if err != nil {
		return err
	}
	if len(ours) == 0 {
		return nil
	}
	args := []string{"rm", "--force", "--ignore"}
	for _, ct := range ours {
		args = append(args, ct.ID)
	}
	_, err = c.must(ctx, args...)
	return err
}
