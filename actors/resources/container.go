package resources

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
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
		global = append(global, "--runtime="+cfg.Runtime)
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

// MinCallTime is the call time a reconcile of spec must be given so that
// each init container can use its whole timeout: the sum of the steps'
// timeouts. A call bounded more tightly (agent.call_timeout) can cut a
// step off before its own timeout, so the agent can refuse such a
// resource. An invalid spec gives 0 (Validate says why).
func (c *Container) MinCallTime(spec Spec) time.Duration {
	s, err := c.spec(spec)
	if err != nil {
		return 0
	}
	var sum time.Duration
	for _, st := range s.Init {
		sum += st.Timeout
	}
	return sum
}

func (*Container) spec(spec Spec) (containerSpec, error) {
	r := NewSpecReader("container", spec)
	var s containerSpec
	s.Image = r.Str("image", true)
	s.Command = r.Str("command", false)
	s.Args = r.Strs("args")
	s.Env = r.StrMap("env")
	s.Restart = r.OneOf("restart", "always", "always", "on-failure", "never")
	s.Network = r.Str("network", false)
	s.Ports = r.Strs("ports")
	s.Volumes = r.Strs("volumes")
	s.StopTimeout = r.Duration("stop_timeout", 0)
	names := map[string]bool{}
	for i, st := range r.List("init") {
		sr := r.Sub(fmt.Sprintf("init[%d].", i), st)
		step := containerInit{Name: sr.Str("name", true), Image: sr.Str("image", false)}
		step.Command = sr.Str("command", false)
		step.Args = sr.Strs("args")
		step.Env = sr.StrMap("env")
		step.Timeout = sr.Duration("timeout", DefaultInitTimeout)
		if err := sr.Done(); err != nil {
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
		s.Init = append(s.Init, step)
	}
	if err := r.Done(); err != nil {
		return s, err
	}
	if err := checkRun("", s.Image, s.Command, s.Args, s.Env); err != nil {
		return s, err
	}
	if s.Network != "" {
		if rule := networkRule(s.Network); rule != "" {
			return s, &SpecError{"container", "network", rule}
		}
	}
	for i, p := range s.Ports {
		if rule := portRule(p); rule != "" {
			return s, &SpecError{"container", fmt.Sprintf("ports[%d]", i), rule}
		}
	}
	for i, v := range s.Volumes {
		if rule := volumeRule(v); rule != "" {
			return s, &SpecError{"container", fmt.Sprintf("volumes[%d]", i), rule}
		}
	}
	for i := range s.Init {
		st := &s.Init[i]
		prefix := fmt.Sprintf("init[%d].", i)
		if st.Image == "" {
			st.Image = s.Image
		}
		if err := checkRun(prefix, st.Image, st.Command, st.Args, st.Env); err != nil {
			return s, err
		}
	}
	return s, nil
}

// Every user string reaches podman as a value: after its flag in the
// --flag=value form, or after "--" (the image, then the container's
// arguments, which podman passes to the container whatever they look like).
// The rules below refuse at Validate what podman would refuse at run time,
// and anything that would read as something else.

// imageRule is the image reference grammar ([registry[:port]/]path[:tag]
// [@sha256:hex], after github.com/distribution/reference): it never starts
// with '-' and holds no whitespace.
var imageRule = func() *regexp.Regexp {
	const (
		label  = `[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?`
		host   = `(?:` + label + `(?:\.` + label + `)*|\[[a-fA-F0-9:]+\])(?::[0-9]{1,5})?`
		part   = `[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*`
		tag    = `[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,127}`
		digest = `sha256:[a-f0-9]{64}`
	)
	return regexp.MustCompile(`^(?:` + host + `/)?` + part + `(?:/` + part + `)*(?::` + tag + `)?(?:@` + digest + `)?$`)
}()

// envNameRule is a portable environment variable name.
var envNameRule = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// checkRun checks what one container runs (the service's, or an init
// step's with prefix "init[i].").
func checkRun(prefix, image, command string, args []string, env map[string]string) error {
	fail := func(field, rule string) error { return &SpecError{"container", prefix + field, rule} }
	name, _, _ := strings.Cut(image, "@")
	if i := strings.LastIndex(name, ":"); i > strings.LastIndex(name, "/") {
		name = name[:i] // the tag
	}
	if !imageRule.MatchString(image) || len(name) > 255 {
		return fail("image", "must be an image reference [registry[:port]/]path[:tag][@sha256:digest] of at most 255 characters before the tag, "+
			"path in lower case letters, digits and separators, not starting with '-' (got "+strconv.Quote(image)+")")
	}
	if strings.ContainsRune(command, 0) {
		return fail("command", "must not contain a NUL byte")
	}
	for i, a := range args {
		if strings.ContainsRune(a, 0) {
			return fail(fmt.Sprintf("args[%d]", i), "must not contain a NUL byte")
		}
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if !envNameRule.MatchString(k) {
			return fail("env."+k, "must be a variable name: letters, digits and '_', not starting with a digit")
		}
		if strings.ContainsRune(env[k], 0) {
			return fail("env."+k, "must not contain a NUL byte")
		}
	}
	return nil
}

// networkRule checks a podman --network value: "" when podman can take it.
func networkRule(n string) string {
	const rule = "must be none, host, bridge, private, slirp4netns, container:NAME, ns:/PATH, or a network name " +
		"(letters, digits, '_', '.', '-', starting with a letter or digit)"
	switch {
	case slices.Contains([]string{"none", "host", "bridge", "private", "slirp4netns"}, n):
		return ""
	case strings.HasPrefix(n, "container:"):
		if !containerNameRule.MatchString(strings.TrimPrefix(n, "container:")) {
			return rule + " (got " + strconv.Quote(n) + ": not a container name)"
		}
		return ""
	case strings.HasPrefix(n, "ns:"):
		if p := strings.TrimPrefix(n, "ns:"); !strings.HasPrefix(p, "/") || strings.ContainsRune(p, 0) {
			return rule + " (got " + strconv.Quote(n) + ": not an absolute path)"
		}
		return ""
	case containerNameRule.MatchString(n):
		return ""
	}
	return rule + " (got " + strconv.Quote(n) + ")"
}

// portRule checks a podman --publish value,
// [[ip:][hostPort]:]containerPort[/protocol]: "" when podman can take it.
func portRule(p string) string {
	bad := func(why string) string {
		return "must be [[ip:][hostPort]:]containerPort[/tcp|udp|sctp], ports 1-65535 or ranges such as 8000-8010 (got " +
			strconv.Quote(p) + ": " + why + ")"
	}
	spec, proto, hasProto := strings.Cut(p, "/")
	if hasProto && !slices.Contains([]string{"tcp", "udp", "sctp"}, strings.ToLower(proto)) {
		return bad("unknown protocol " + strconv.Quote(proto))
	}
	var ip, hostPorts, ctrPorts string
	if rest, ok := strings.CutPrefix(spec, "["); ok {
		addr, ports, ok := strings.Cut(rest, "]:")
		if a, err := netip.ParseAddr(addr); !ok || err != nil || !a.Is6() {
			return bad("not an IPv6 address in brackets")
		}
		if hostPorts, ctrPorts, ok = strings.Cut(ports, ":"); !ok {
			return bad("an address needs a host port (or none) and a container port")
		}
		ip = addr
	} else {
		parts := strings.Split(spec, ":")
		switch len(parts) {
		case 1:
			ctrPorts = parts[0]
		case 2:
			hostPorts, ctrPorts = parts[0], parts[1]
		case 3:
			ip, hostPorts, ctrPorts = parts[0], parts[1], parts[2]
			if a, err := netip.ParseAddr(ip); err != nil || !a.Is4() {
				return bad("not an IPv4 address " + strconv.Quote(ip))
			}
		default:
			return bad("too many ':'")
		}
	}
	ctrN, why := portRange(ctrPorts)
	if why != "" {
		return bad("container port " + why)
	}
	if hostPorts == "" {
		return ""
	}
	hostN, why := portRange(hostPorts)
	if why != "" {
		return bad("host port " + why)
	}
	if hostN != ctrN {
		return bad(fmt.Sprintf("the host range has %d ports, the container range %d", hostN, ctrN))
	}
	return ""
}

// portRange parses a port (80) or a range (8000-8010) and returns how many
// ports it holds, or why it is not one.
func portRange(s string) (int, string) {
	port := func(s string) (int, bool) {
		n, err := strconv.Atoi(s)
		return n, err == nil && s != "" && s[0] != '+' && s[0] != '-' && n >= 1 && n <= 65535
	}
	lo, hi, isRange := strings.Cut(s, "-")
	a, ok := port(lo)
	if !ok {
		return 0, strconv.Quote(s) + " is not a port 1-65535"
	}
	if !isRange {
		return 1, ""
	}
	b, ok := port(hi)
	if !ok || b <= a {
		return 0, strconv.Quote(s) + " is not a range low-high of ports 1-65535"
	}
	return b - a + 1, ""
}

// volumeOptions are podman's --volume options; at most one of each group.
var volumeOptions = [][]string{
	{"ro", "rw"}, {"z", "Z", "O"}, {"U"}, {"copy", "nocopy"}, {"suid", "nosuid"}, {"dev", "nodev"},
	{"exec", "noexec"}, {"bind", "rbind"}, {"idmap"},
	{"shared", "rshared", "private", "rprivate", "slave", "rslave", "unbindable", "runbindable"},
}

// volumeRule checks a podman --volume value, src:dst[:options]: "" when
// podman can take it.
func volumeRule(v string) string {
	bad := func(why string) string {
		return "must be src:dst[:options], src an absolute path or a volume name, dst an absolute path, " +
			"options from ro, rw, z, Z, O, U, copy, nocopy, [no]suid, [no]dev, [no]exec, [r]bind, [r]shared, [r]private, [r]slave, [r]unbindable, idmap (got " +
			strconv.Quote(v) + ": " + why + ")"
	}
	parts := strings.Split(v, ":")
	if len(parts) < 2 || len(parts) > 3 {
		return bad("not two or three parts")
	}
	src, dst := parts[0], parts[1]
	switch {
	case strings.ContainsRune(v, 0):
		return bad("a NUL byte")
	case strings.HasPrefix(src, "/"):
	case !containerNameRule.MatchString(src):
		return bad("src is neither an absolute path nor a volume name (letters, digits, '_', '.', '-', starting with a letter or digit)")
	}
	if !strings.HasPrefix(dst, "/") {
		return bad("dst is not an absolute path")
	}
	if len(parts) == 3 {
		used := map[int]string{}
		for _, o := range strings.Split(parts[2], ",") {
			g := slices.IndexFunc(volumeOptions, func(group []string) bool { return slices.Contains(group, o) })
			if g < 0 {
				return bad("unknown option " + strconv.Quote(o))
			}
			if prev, ok := used[g]; ok {
				return bad("options " + prev + " and " + o + " exclude each other")
			}
			used[g] = o
		}
	}
	return ""
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
	res, err := c.run(ctx, "container", "inspect", "--format=json", "--", name)
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
	args := []string{"ps", "--all", "--format=json"}
	for _, f := range filters {
		args = append(args, "--filter="+f)
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
	if res, err := c.run(ctx, "image", "inspect", "--format={{.Id}}", "--", s.Image); err == nil && res.Exit == 0 {
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
	args := []string{"run", "--detach", "--name=" + serviceName(id),
		"--restart=" + map[string]string{"always": "always", "on-failure": "on-failure", "never": "no"}[s.Restart],
		"--label=" + LabelResource + "=" + id, "--label=" + LabelRole + "=service", "--label=" + LabelSpec + "=" + hash}
	if len(done) > 0 {
		args = append(args, "--label="+LabelInitCompleted+"="+strings.Join(done, ","))
	}
	if s.StopTimeout > 0 {
		args = append(args, "--stop-timeout="+strconv.Itoa(int((s.StopTimeout+time.Second-1)/time.Second)))
	}
	for _, p := range s.Ports {
		args = append(args, "--publish="+p)
	}
	args = append(args, c.runArgs(s, s.Command, s.Env)...)
	args = append(args, "--", s.Image)
	args = append(args, s.Args...)
	if _, err := c.must(ctx, args...); err != nil {
		return Observation{Drift: "not running"}, fmt.Errorf("start container %s: %w", serviceName(id), err)
	}
	return c.observe(ctx, id, s)
}

// runArgs are the podman run flags shared by init and service containers:
// the node's limits, then the resource's network, volumes, environment and
// entrypoint, each as --flag=value.
func (c *Container) runArgs(s containerSpec, command string, env map[string]string) []string {
	var args []string
	if c.cfg.Cgroups != "" {
		args = append(args, "--cgroups="+c.cfg.Cgroups)
	}
	for _, u := range c.cfg.Ulimits {
		args = append(args, "--ulimit="+u)
	}
	if s.Network != "" {
		args = append(args, "--network="+s.Network)
	}
	for _, v := range s.Volumes {
		args = append(args, "--volume="+v)
	}
	for _, k := range slices.Sorted(maps.Keys(env)) {
		args = append(args, "--env="+k+"="+env[k])
	}
	if command != "" {
		args = append(args, "--entrypoint="+command)
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
	_, err = c.must(ctx, append([]string{"rm", "--force", "--ignore", "--"}, ids...)...)
	return err
}

// runInit runs init step i to completion within its timeout: Exited{code}
// (an error when not 0), TimedOut{waited}, or cut off when ctx (the call's
// bound) ends first (a *cutOffError with the real wait). A container timed
// out or cut off is killed and kept, like every init container, for
// podman logs.
func (c *Container) runInit(ctx context.Context, id string, i int, st containerInit, s containerSpec, hash string) error {
	name := initName(id, st.Name)
	args := []string{"run", "--detach", "--name=" + name, "--restart=no",
		"--label=" + LabelResource + "=" + id, "--label=" + LabelRole + "=init", "--label=" + LabelSpec + "=" + hash,
		"--label=" + LabelInit + "=" + st.Name, "--label=" + LabelInitOrder + "=" + strconv.Itoa(i)}
	args = append(args, c.runArgs(s, st.Command, st.Env)...)
	args = append(args, "--", st.Image)
	args = append(args, st.Args...)
	done := runsOf(ctx).Started(id, st.Name, redactEnv(c.argv(args)))

	b := newStepBound(ctx, st.Timeout)
	defer b.stop()
	res, err := c.run(b.ctx, args...)
	if err == nil && res.Exit != 0 {
		msg := podmanError(res)
		done(-1, false, msg)
		return fmt.Errorf("could not start: %s", msg)
	}
	if err == nil {
		res, err = c.run(b.ctx, "wait", "--", name)
	}
	if err != nil {
		end := b.ended()
		if end == nil {
			done(-1, false, err.Error())
			return err
		}
		// The step's time or the call's is up: stop it with a fresh bound.
		kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer kcancel()
		_, _ = c.run(kctx, "kill", "--signal=KILL", "--", name)
		done(-1, true, end.Error())
		return end
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
	for i, a := range out {
		if rest, ok := strings.CutPrefix(a, "--env="); ok {
			k, _, _ := strings.Cut(rest, "=")
			out[i] = "--env=" + k + "=***"
		}
		if a == "--" {
			break // the container's own arguments follow
		}
	}
	return out
}

// logs is the tail of a container's output (stdout, then stderr).
func (c *Container) logs(ctx context.Context, name string) string {
	res, err := c.run(ctx, "logs", "--tail=50", "--", name)
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
	args := []string{"rm", "--force", "--ignore", "--"}
	for _, ct := range ours {
		args = append(args, ct.ID)
	}
	_, err = c.must(ctx, args...)
	return err
}
