package resources

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

const testImage = "localhost/understudy-busybox:test"

var recordPodman = flag.Bool("record-podman", false, "re-record testdata/podman-runtime-blocked.txt from the real podman (on a machine without CAP_SYS_RESOURCE, see docs/agents.md)")

// requirePodman fails (never skips) when the container tests' system
// packages are missing.
func requirePodman(t *testing.T) {
	t.Helper()
	for _, bin := range []string{"podman", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not found: run scripts/install-test-deps.sh (it installs podman, runc and busybox-static)", bin)
		}
	}
	f, err := elf.Open("/bin/busybox")
	if err != nil {
		t.Fatalf("/bin/busybox: %v: run scripts/install-test-deps.sh (it installs busybox-static)", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("/bin/busybox is dynamically linked, an imported rootfs cannot run it: run scripts/install-test-deps.sh (it installs busybox-static)")
		}
	}
}

// rootfsTar writes a busybox rootfs (bin/busybox and its applets as
// symlinks, plus etc/variant) as a tar archive at path.
func rootfsTar(t *testing.T, path, variant string) {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, body []byte) {
		h.Size = int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(body); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"bin/", "etc/", "tmp/", "data/"} {
		add(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755}, nil)
	}
	add(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755}, bb)
	for _, applet := range []string{"sh", "true", "false", "sleep", "echo", "cat", "test", "touch"} {
		add(&tar.Header{Name: "bin/" + applet, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}, nil)
	}
	add(&tar.Header{Name: "etc/variant", Typeflag: tar.TypeReg, Mode: 0o644}, []byte(variant+"\n"))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// podmanStore is a private podman store (graph root, run root, tmp dir:
// nothing shared with the machine's podman) holding the test image.
type podmanStore struct {
	dir    string
	global []string
}

func newPodmanStore(t *testing.T) *podmanStore {
	dir, err := os.MkdirTemp("", "understudy-podman-")
	if err != nil {
		t.Fatal(err)
	}
	s := &podmanStore{dir: dir, global: []string{
		"--root", dir + "/root", "--runroot", dir + "/run", "--tmpdir", dir + "/tmp",
		"--storage-driver", "vfs", "--events-backend", "file",
	}}
	return s
}

// config is the configuration that runs containers on a machine without
// CAP_SYS_RESOURCE and with hybrid cgroups (and on ordinary machines).
func (s *podmanStore) config() PodmanConfig {
	return PodmanConfig{GlobalArgs: s.global, Runtime: "runc", Ulimits: []string{"nofile=1024:1024", "nproc=1024:1024"}}
}

// podman runs podman on the store and returns its stdout.
func (s *podmanStore) podman(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("podman", append(slices.Clone(s.global), args...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("podman %s: %v: %s", strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatalf("podman %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

// importImage imports a busybox rootfs as testImage.
func (s *podmanStore) importImage(t *testing.T, variant string) {
	t.Helper()
	tarball := filepath.Join(s.dir, "rootfs.tar")
	rootfsTar(t, tarball, variant)
	s.podman(t, "import", tarball, testImage)
}

func (s *podmanStore) remove(t *testing.T) {
	_, _ = exec.Command("podman", append(slices.Clone(s.global), "rm", "--all", "--force", "--time", "0")...).CombinedOutput()
	// conmon's cleanup processes may still be finishing in the store.
	for i := 0; ; i++ {
		err := os.RemoveAll(s.dir)
		if err == nil {
			return
		}
		if i == 20 {
			t.Errorf("removing the test podman store: %v", err)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// realPodman returns a reconciler on a private store holding testImage.
func realPodman(t *testing.T) (*Container, *podmanStore) {
	t.Helper()
	requirePodman(t)
	s := newPodmanStore(t)
	t.Cleanup(func() { s.remove(t) })
	s.importImage(t, "one")
	cfg := s.config()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return NewContainer(cfg), s
}

// codedRuns keeps what the reconciler reported running, with exit codes.
type codedRuns struct {
	mu   sync.Mutex
	runs []string
	cmds [][]string
}

func (r *codedRuns) Started(id, step string, cmd []string) func(int, bool, string) {
	return func(code int, timedOut bool, detail string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		outcome := fmt.Sprintf("exited %d", code)
		if timedOut {
			outcome = "timed out"
		}
		r.runs = append(r.runs, strings.Join([]string{id, step, outcome, detail}, "|"))
		r.cmds = append(r.cmds, cmd)
	}
}

func sh(script string) []any { return []any{"sh", "-c", script} }

func TestContainerInitThenService(t *testing.T) {
	c, store := realPodman(t)
	runs := &codedRuns{}
	ctx := WithRuns(context.Background(), runs)
	data := t.TempDir()
	spec := Spec{
		"image": testImage, "command": "/bin/busybox", "args": []any{"sleep", "600"},
		"network": "none", "stop_timeout": "1s", "volumes": []any{data + ":/data"},
		"init": []any{
			map[string]any{"name": "one", "command": "/bin/busybox", "args": sh("echo one > /data/one; echo did one")},
			map[string]any{"name": "two", "command": "/bin/busybox", "args": sh(`test -f /data/one && echo "$STEP" > /data/ready`),
				"env": map[string]any{"STEP": "two"}, "timeout": "60s"},
		},
	}
	if o, err := c.Observe(ctx, "web", spec); err != nil || o.Drift != "not running: no container understudy-web" {
		t.Fatalf("before: %+v %v", o, err)
	}
	o, err := c.Reconcile(ctx, "web", spec)
	if err != nil || !o.InSync || o.Details["init_completed"] != "one,two" || o.Details["services"] != "understudy-web" || o.Details["state"] != "running" {
		t.Fatalf("reconcile: %+v %v", o, err)
	}
	if b, err := os.ReadFile(filepath.Join(data, "ready")); err != nil || string(b) != "two\n" {
		t.Errorf("init step two did not run after one: %q %v", b, err)
	}
	if len(runs.runs) != 2 || runs.runs[0] != "web|one|exited 0|did one" || runs.runs[1] != "web|two|exited 0|" {
		t.Errorf("runs %q", runs.runs)
	}
	if cmd := strings.Join(runs.cmds[1], " "); !strings.HasPrefix(cmd, "podman --root ") || !strings.Contains(cmd, " --runtime=runc ") ||
		!strings.Contains(cmd, " --restart=no ") || !strings.Contains(cmd, " --env=STEP=*** ") {
		t.Errorf("audited command (env values hidden): %s", cmd)
	}
	// Init containers are kept, labelled, filterable, never restarted.
	names := store.podman(t, "ps", "-a", "--filter", "label=understudy.role=init", "--filter", "label=understudy.resource=web", "--format", "{{.Names}} exited={{.Exited}} {{.ExitCode}}")
	if lines := strings.Split(names, "\n"); !slices.Equal(sorted(lines), []string{"understudy-web-init-one exited=true 0", "understudy-web-init-two exited=true 0"}) {
		t.Errorf("init containers: %q", names)
	}
	if got := store.podman(t, "inspect", "--format", "{{.HostConfig.RestartPolicy.Name}} {{index .Config.Labels \"understudy.init\"}}", "understudy-web-init-two"); got != "no two" {
		t.Errorf("init restart policy and label: %q", got)
	}
	if got := store.podman(t, "inspect", "--format", "{{.HostConfig.RestartPolicy.Name}} {{index .Config.Labels \"understudy.role\"}}", "understudy-web"); got != "always service" {
		t.Errorf("service restart policy and label: %q", got)
	}
	// In sync: nothing is recreated.
	id := o.Details["container_id"]
	if o, err := c.Reconcile(ctx, "web", spec); err != nil || o.Details["container_id"] != id || len(runs.runs) != 2 {
		t.Errorf("an unchanged spec recreated the container: %+v %v", o, err)
	}
	// Stopped behind the agent's back: drift, then repaired.
	store.podman(t, "stop", "--time", "0", "understudy-web")
	if o, _ := c.Observe(ctx, "web", spec); o.InSync || !strings.HasPrefix(o.Drift, "exited (code ") || o.Details["services"] != "" {
		t.Errorf("stopped: %+v", o)
	}
	if o, err := c.Reconcile(ctx, "web", spec); err != nil || !o.InSync || o.Details["container_id"] == id {
		t.Errorf("repair: %+v %v", o, err)
	}
	// The tag now names another image.
	store.importImage(t, "two")
	if o, _ := c.Observe(ctx, "web", spec); o.InSync || !strings.HasPrefix(o.Drift, "image changed: "+testImage+" is now ") {
		t.Errorf("new image: %+v", o)
	}
	if o, err := c.Reconcile(ctx, "web", spec); err != nil || !o.InSync {
		t.Errorf("new image, reconciled: %+v %v", o, err)
	}
	if got := store.podman(t, "exec", "understudy-web", "/bin/busybox", "cat", "/etc/variant"); got != "two" {
		t.Errorf("service runs variant %q", got)
	}
	spec["env"] = map[string]any{"X": "1"}
	if o, _ := c.Observe(ctx, "web", spec); o.InSync || o.Drift != "spec changed" {
		t.Errorf("changed spec: %+v", o)
	}
	if err := c.Delete(ctx, "web", spec); err != nil {
		t.Fatal(err)
	}
	if left := store.podman(t, "ps", "-a", "--filter", "label=understudy.resource=web", "--format", "{{.Names}}"); left != "" {
		t.Errorf("after delete: %q", left)
	}
	if o, _ := c.Observe(ctx, "web", spec); o.InSync || o.Drift != "not running: no container understudy-web" {
		t.Errorf("after delete: %+v", o)
	}
	if err := c.Delete(ctx, "web", spec); err != nil {
		t.Errorf("delete is idempotent: %v", err)
	}
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

func TestContainerInitFailureAndTimeout(t *testing.T) {
	c, store := realPodman(t)
	runs := &codedRuns{}
	ctx := WithRuns(context.Background(), runs)
	failing := Spec{"image": testImage, "command": "/bin/busybox", "args": []any{"sleep", "600"}, "network": "none",
		"init": []any{
			map[string]any{"name": "bad", "command": "/bin/busybox", "args": sh("echo boom; exit 3")},
			map[string]any{"name": "after", "command": "/bin/busybox", "args": []any{"true"}},
		}}
	o, err := c.Reconcile(ctx, "db", failing)
	if err == nil || err.Error() != "init step bad: exited 3: boom" || o.Drift != "init step bad failed" {
		t.Fatalf("failing step: %+v %v", o, err)
	}
	if len(runs.runs) != 1 || runs.runs[0] != "db|bad|exited 3|boom" {
		t.Errorf("runs %q", runs.runs)
	}
	if got := store.podman(t, "ps", "-a", "--filter", "label=understudy.resource=db", "--format", "{{.Names}}"); got != "understudy-db-init-bad" {
		t.Errorf("neither the next step nor the service may run after a failed step: %q", got)
	}
	if o, _ := c.Observe(ctx, "db", failing); o.InSync {
		t.Errorf("observe after a failed step: %+v", o)
	}

	slow := Spec{"image": testImage, "command": "/bin/busybox", "args": []any{"sleep", "600"}, "network": "none",
		"init": []any{map[string]any{"name": "slow", "command": "/bin/busybox", "args": []any{"sleep", "600"}, "timeout": "1s"}}}
	o, err = c.Reconcile(ctx, "db", slow)
	if err == nil || err.Error() != "init step slow: timed out: waited 1s" || o.Drift != "init step slow failed" {
		t.Fatalf("slow step: %+v %v", o, err)
	}
	if len(runs.runs) != 2 || runs.runs[1] != "db|slow|timed out|timed out: waited 1s" {
		t.Errorf("runs %q", runs.runs)
	}
	// The timed-out init container was killed, and the failed one of the
	// previous spec removed.
	if got := store.podman(t, "ps", "-a", "--filter", "label=understudy.resource=db", "--format", "{{.Names}} exited={{.Exited}} {{.ExitCode}}"); got != "understudy-db-init-slow exited=true 137" {
		t.Errorf("after timeout: %q", got)
	}
	if err := c.Delete(ctx, "db", slow); err != nil {
		t.Fatal(err)
	}
}

func TestContainerReplacesPriorContainers(t *testing.T) {
	c, store := realPodman(t)
	ctx := context.Background()
	// A container of the same name, not ours: removed first.
	prior := store.podman(t, "run", "--detach", "--name", "understudy-web", "--stop-timeout", "1", "--runtime", "runc", "--ulimit", "nofile=1024:1024",
		"--ulimit", "nproc=1024:1024", "--network", "none", testImage, "/bin/busybox", "sleep", "600")
	withInit := Spec{"image": testImage, "command": "/bin/busybox", "args": []any{"sleep", "600"}, "network": "none", "stop_timeout": "1s",
		"init": []any{map[string]any{"name": "gone", "command": "/bin/busybox", "args": []any{"true"}}}}
	o, err := c.Reconcile(ctx, "web", withInit)
	if err != nil || !o.InSync || strings.HasPrefix(prior, o.Details["container_id"]) {
		t.Fatalf("prior container: %+v %v (prior %s)", o, err, prior)
	}
	// An init step dropped from the spec: its container goes too.
	withoutInit := Spec{"image": testImage, "command": "/bin/busybox", "args": []any{"sleep", "600"}, "network": "none", "stop_timeout": "1s"}
	if o, err := c.Reconcile(ctx, "web", withoutInit); err != nil || !o.InSync || o.Details["init_completed"] != "" {
		t.Fatalf("without init: %+v %v", o, err)
	}
	if got := store.podman(t, "ps", "-a", "--format", "{{.Names}}"); got != "understudy-web" {
		t.Errorf("containers: %q", got)
	}
	// Another resource's container is never removed for a name clash.
	if _, err := c.Reconcile(ctx, "a-init-b", withoutInit); err != nil {
		t.Fatal(err)
	}
	clash := Spec{"image": testImage, "command": "/bin/busybox", "args": []any{"sleep", "600"}, "network": "none",
		"init": []any{map[string]any{"name": "b", "command": "/bin/busybox", "args": []any{"true"}}}}
	if _, err := c.Reconcile(ctx, "a", clash); err == nil || err.Error() != "container understudy-a-init-b belongs to resource a-init-b: rename one of the resources" {
		t.Errorf("name clash: %v", err)
	}
	if o, _ := c.Observe(ctx, "a-init-b", withoutInit); !o.InSync {
		t.Errorf("the other resource was touched: %+v", o)
	}
	// restart: never — a finished container is in sync, and not a service.
	once := Spec{"image": testImage, "command": "/bin/busybox", "args": []any{"true"}, "network": "none", "restart": "never"}
	if _, err := c.Reconcile(ctx, "once", once); err != nil {
		t.Fatal(err)
	}
	store.podman(t, "wait", "understudy-once")
	if o, _ := c.Observe(ctx, "once", once); !o.InSync || o.Details["exit_code"] != "0" || o.Details["services"] != "" || o.Details["state"] != "exited" {
		t.Errorf("restart never, exited: %+v", o)
	}
	if got := store.podman(t, "inspect", "--format", "{{.HostConfig.RestartPolicy.Name}}", "understudy-once"); got != "no" {
		t.Errorf("restart never is podman's no: %q", got)
	}
}

func TestContainerSpecRules(t *testing.T) {
	c := NewContainer(PodmanConfig{})
	for _, tc := range []struct {
		spec Spec
		want string
	}{
		{Spec{"command": "x"}, "container spec: image: required"},
		{Spec{"image": "i", "restart": "sometimes"}, "restart: must be one of [always on-failure never]"},
		{Spec{"image": "i", "init": []any{map[string]any{"command": "x"}}}, "init[0].name: required"},
		{Spec{"image": "i", "init": []any{map[string]any{"name": "a b"}}}, "init[0].name: must be letters, digits"},
		{Spec{"image": "i", "init": []any{map[string]any{"name": "a"}, map[string]any{"name": "a"}}}, "init[1].name: init step names must be unique (a)"},
		{Spec{"image": "i", "init": []any{map[string]any{"name": "a", "timeout": "soon"}}}, "init[0].timeout: must be a positive duration"},
		{Spec{"image": "i", "init": []any{map[string]any{"name": "a", "restart": "always"}}}, "init[0].restart: unknown field"},
		{Spec{"image": "i", "stop_timeout": "-1s"}, "stop_timeout: must be a positive duration"},
		{Spec{"image": "i", "volumes": "/a:/b"}, "volumes: must be a list of strings"},
		{Spec{"image": "i", "colour": "red"}, "colour: unknown field"},
	} {
		err := c.Validate(tc.spec)
		var se *SpecError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.spec, err, tc.want)
		}
	}
	if err := c.Validate(Spec{"image": "i", "init": []any{map[string]any{"name": "a", "image": "j", "timeout": 30}}}); err != nil {
		t.Error(err)
	}
	for cfg, want := range map[string]PodmanConfig{
		"cgroups = off: must be one of":                {Cgroups: "off"},
		"ulimits[0] = nofile: must be a podman ulimit": {Ulimits: []string{"nofile"}},
		"env = X: must be NAME=value":                  {Env: []string{"X"}},
	} {
		if err := want.Validate(); err == nil || !strings.Contains(err.Error(), cfg) {
			t.Errorf("%+v: %v, want %q", want, err, cfg)
		}
	}
	if err := (PodmanConfig{Runtime: "runc", Cgroups: "disabled", Ulimits: []string{"host", "nproc=1024:2048"}}).Validate(); err != nil {
		t.Error(err)
	}
}

// Every rule of the container spec, with the field it names. The first
// case is the injection the rules exist for: an image that reads as a flag,
// and arguments that would then name another image.
func TestContainerSpecValueRules(t *testing.T) {
	c := NewContainer(PodmanConfig{})
	digest := "sha256:" + strings.Repeat("ab", 32)
	step := func(kv ...any) Spec {
		m := map[string]any{"name": "prep"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return Spec{"image": "alpine", "init": []any{m}}
	}
	with := func(field string, v any) Spec { return Spec{"image": "alpine", field: v} }
	for _, tc := range []struct {
		spec  Spec
		field string // "" when the spec is valid
		rule  string
	}{
		{Spec{"image": "--privileged", "args": []any{"docker.io/library/alpine", "sh"}}, "image", "must be an image reference"},
		// image
		{with("image", "-alpine"), "image", `not starting with '-' (got "-alpine")`},
		{with("image", "alpine latest"), "image", "must be an image reference"},
		{with("image", "alpine\n"), "image", "must be an image reference"},
		{with("image", "Alpine"), "image", "path in lower case"},
		{with("image", "alpine:"), "image", "must be an image reference"},
		{with("image", "alpine:-x"), "image", "must be an image reference"},
		{with("image", "alpine:a:b"), "image", "must be an image reference"},
		{with("image", "alpine@sha256:abc"), "image", "must be an image reference"},
		{with("image", "alpine@md5:"+strings.Repeat("ab", 16)), "image", "must be an image reference"},
		{with("image", "docker://alpine"), "image", "must be an image reference"},
		{with("image", "a//b"), "image", "must be an image reference"},
		{with("image", "a/"+strings.Repeat("b", 255)), "image", "must be an image reference"},
		{with("image", "a/"+strings.Repeat("b", 253)+":"+strings.Repeat("t", 128)), "", ""},
		{with("image", "alpine"), "", ""},
		{with("image", "alpine:3.19"), "", ""},
		{with("image", "docker.io/library/alpine:3.19@"+digest), "", ""},
		{with("image", "alpine@"+digest), "", ""},
		{with("image", "localhost:5000/team/my_app-x__y.z:v1.2_rc"), "", ""},
		{with("image", "Registry.Example.com/a/b"), "", ""},
		{with("image", "[::1]:5000/a"), "", ""},
		{with("image", strings.Repeat("ab", 32)), "", ""}, // an image id
		// init step images and arguments
		{step("image", "--privileged"), "init[0].image", "must be an image reference"},
		{step("image", "busy box"), "init[0].image", "must be an image reference"},
		{step("image", "docker.io/library/busybox:1.36"), "", ""},
		{step("args", []any{"-R", "--privileged"}), "", ""}, // after the image: the container's own arguments
		{step("args", []any{"ok", "a\x00b"}), "init[0].args[1]", "must not contain a NUL byte"},
		{step("command", "a\x00"), "init[0].command", "must not contain a NUL byte"},
		{step("env", map[string]any{"1X": "v"}), "init[0].env.1X", "must be a variable name"},
		{with("args", []any{"a\x00"}), "args[0]", "must not contain a NUL byte"},
		{with("command", "--privileged"), "", ""}, // --entrypoint=--privileged: a value
		{with("command", "x\x00"), "command", "must not contain a NUL byte"},
		// env
		{with("env", map[string]any{"A=B": "v"}), "env.A=B", "must be a variable name"},
		{with("env", map[string]any{"": "v"}), "env.", "must be a variable name"},
		{with("env", map[string]any{"A-B": "v"}), "env.A-B", "must be a variable name"},
		{with("env", map[string]any{"--privileged": "v"}), "env.--privileged", "must be a variable name"},
		{with("env", map[string]any{"A": "x\x00"}), "env.A", "must not contain a NUL byte"},
		{with("env", map[string]any{"_A1": "--privileged", "b": "x=y"}), "", ""},
		// ports
		{with("ports", []any{"not-a-port"}), "ports[0]", `(got "not-a-port": container port "not-a-port" is not a port 1-65535)`},
		{with("ports", []any{"80", "--publish-all"}), "ports[1]", "must be [[ip:][hostPort]:]containerPort[/tcp|udp|sctp]"},
		{with("ports", []any{"0"}), "ports[0]", "is not a port 1-65535"},
		{with("ports", []any{"65536:80"}), "ports[0]", `host port "65536" is not a port 1-65535`},
		{with("ports", []any{"+80"}), "ports[0]", "is not a port 1-65535"},
		{with("ports", []any{" 80"}), "ports[0]", "is not a port 1-65535"},
		{with("ports", []any{"80-80"}), "ports[0]", "is not a range low-high"},
		{with("ports", []any{"90-80"}), "ports[0]", "is not a range low-high"},
		{with("ports", []any{"8000-8010:80"}), "ports[0]", "the host range has 11 ports, the container range 1"},
		{with("ports", []any{"8000:80-81"}), "ports[0]", "the host range has 1 ports, the container range 2"},
		{with("ports", []any{"80/icmp"}), "ports[0]", `unknown protocol "icmp"`},
		{with("ports", []any{"80/"}), "ports[0]", `unknown protocol ""`},
		{with("ports", []any{"1.2.3:80:80"}), "ports[0]", `not an IPv4 address "1.2.3"`},
		{with("ports", []any{"host:80:80"}), "ports[0]", "not an IPv4 address"},
		{with("ports", []any{"::80"}), "ports[0]", "not an IPv4 address"},
		{with("ports", []any{"fe80::1:80:80"}), "ports[0]", "too many ':'"},
		{with("ports", []any{"[::1]:80"}), "ports[0]", "an address needs a host port"},
		{with("ports", []any{"[1.2.3.4]:80:80"}), "ports[0]", "not an IPv6 address"},
		{with("ports", []any{"80", "8080:80", "127.0.0.1:8080:80/udp", "127.0.0.1::80", ":80", "[::1]:8080:80/tcp", "[::1]::80",
			"8000-8010:9000-9010", "0.0.0.0:8000-8001:80-81", "80-81", "80/TCP", "5000/sctp", "1:65535"}), "", ""},
		// volumes
		{with("volumes", []any{"relative"}), "volumes[0]", `(got "relative": not two or three parts)`},
		{with("volumes", []any{"/data"}), "volumes[0]", "not two or three parts"},
		{with("volumes", []any{"/a:/b:ro:z"}), "volumes[0]", "not two or three parts"},
		{with("volumes", []any{"./rel:/data"}), "volumes[0]", "src is neither an absolute path nor a volume name"},
		{with("volumes", []any{"-v:/data"}), "volumes[0]", "src is neither an absolute path nor a volume name"},
		{with("volumes", []any{"a b:/data"}), "volumes[0]", "src is neither an absolute path nor a volume name"},
		{with("volumes", []any{":/data"}), "volumes[0]", "src is neither an absolute path nor a volume name"},
		{with("volumes", []any{"/srv:data"}), "volumes[0]", "dst is not an absolute path"},
		{with("volumes", []any{"/srv:"}), "volumes[0]", "dst is not an absolute path"},
		{with("volumes", []any{"/srv:/data:bogus"}), "volumes[0]", `unknown option "bogus"`},
		{with("volumes", []any{"/srv:/data:ro,"}), "volumes[0]", `unknown option ""`},
		{with("volumes", []any{"/srv:/data:ro,rw"}), "volumes[0]", "options ro and rw exclude each other"},
		{with("volumes", []any{"/srv:/data:z,Z"}), "volumes[0]", "options z and Z exclude each other"},
		{with("volumes", []any{"/srv:/data:ro,ro"}), "volumes[0]", "options ro and ro exclude each other"},
		{with("volumes", []any{"/srv:/data:private,rshared"}), "volumes[0]", "options private and rshared exclude each other"},
		{with("volumes", []any{"/srv:/da\x00ta"}), "volumes[0]", "a NUL byte"},
		{with("volumes", []any{"/srv:/data", "data:/data:ro,Z", "my_vol.1:/v:U,rbind,rshared,nosuid,nodev,noexec,nocopy,idmap", "/s:/d:O"}), "", ""},
		// network
		{with("network", "--foo"), "network", `a network name (letters, digits, '_', '.', '-', starting with a letter or digit) (got "--foo")`},
		{with("network", "a,b"), "network", "must be none, host, bridge"},
		{with("network", "bridge:ip=10.0.0.2"), "network", "must be none, host, bridge"},
		{with("network", "container:"), "network", `(got "container:": not a container name)`},
		{with("network", "container:-x"), "network", "not a container name"},
		{with("network", "ns:run/netns/x"), "network", `(got "ns:run/netns/x": not an absolute path)`},
		{with("network", "none"), "", ""},
		{with("network", "host"), "", ""},
		{with("network", "bridge"), "", ""},
		{with("network", "private"), "", ""},
		{with("network", "slirp4netns"), "", ""},
		{with("network", "container:db"), "", ""},
		{with("network", "ns:/run/netns/x"), "", ""},
		{with("network", "my_net.1"), "", ""},
	} {
		err := c.Validate(tc.spec)
		if tc.field == "" {
			if err != nil {
				t.Errorf("%q: %v, want valid", tc.spec, err)
			}
			continue
		}
		var se *SpecError
		if !errors.As(err, &se) || se.Kind != "container" || se.Field != tc.field || !strings.Contains(se.Rule, tc.rule) {
			t.Errorf("%q: %v, want field %s, rule containing %q", tc.spec, err, tc.field, tc.rule)
		}
	}
}

// fakePodman answers the driver's podman calls without running podman:
// nothing exists, every command succeeds, and "wait" answers with exit
// code 0 or, when block is set, blocks until its context ends.
type fakePodman struct {
	block bool
	mu    sync.Mutex
	calls []fakeCall
}

type fakeCall struct {
	argv     []string
	ctxEnded bool // the call's context had ended when it was made
}

func (f *fakePodman) run(ctx context.Context, argv []string) (podmanResult, error) {
	f.mu.Lock()
	f.calls = append(f.calls, fakeCall{argv: argv, ctxEnded: ctx.Err() != nil})
	f.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return podmanResult{Exit: -1}, fmt.Errorf("%s: %w", argv[0], err)
	}
	switch subcommand(argv) {
	case "container":
		return podmanResult{Stdout: "[]\n", Stderr: "Error: inspecting object: no such container " + argv[len(argv)-1] + "\n", Exit: 125}, nil
	case "ps":
		return podmanResult{Stdout: "[]\n"}, nil
	case "wait":
		if f.block {
			<-ctx.Done()
			return podmanResult{Exit: -1}, fmt.Errorf("%s: %w", argv[0], ctx.Err())
		}
		return podmanResult{Stdout: "0\n"}, nil
	}
	return podmanResult{}, nil
}

// subcommand is the podman subcommand of argv (after the global flags).
func subcommand(argv []string) string {
	i := slices.IndexFunc(argv[1:], func(a string) bool {
		return slices.Contains([]string{"container", "image", "ps", "run", "wait", "kill", "logs", "rm"}, a)
	})
	if i < 0 {
		return ""
	}
	return argv[1+i]
}

// argvs are the calls of one subcommand.
func (f *fakePodman) argvs(sub string) [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out [][]string
	for _, c := range f.calls {
		if subcommand(c.argv) == sub {
			out = append(out, c.argv)
		}
	}
	return out
}

// User strings reach podman as values only: after their flag as
// --flag=value, or after "--" (the image, then the container's arguments),
// so that none can read as a flag, whatever it looks like.
func TestContainerArgvPassesValuesOnly(t *testing.T) {
	fake := &fakePodman{}
	c := NewContainer(PodmanConfig{Binary: "/usr/bin/podman", GlobalArgs: []string{"--root", "/r"}, Runtime: "runc",
		Cgroups: "disabled", Ulimits: []string{"nofile=1024:1024"}})
	c.podman = fake
	runs := &codedRuns{}
	ctx := WithRuns(context.Background(), runs)
	image := "registry.example:5000/team/app:1.2@sha256:" + strings.Repeat("ab", 32)
	spec := Spec{
		"image": image, "command": "--privileged", "args": []any{"--privileged", "-v", "/:/host", "--"},
		"env": map[string]any{"B": "--privileged", "A": "x=y"}, "network": "container:db",
		"ports": []any{"127.0.0.1:8080:80/tcp"}, "volumes": []any{"data:/data:ro,Z"}, "stop_timeout": "1500ms", "restart": "never",
		"init": []any{map[string]any{"name": "prep", "image": "busybox", "command": "/bin/sh", "args": []any{"-c", "--env=X=1"},
			"env": map[string]any{"PASS": "secret"}}},
	}
	s, err := c.spec(spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reconcile(ctx, "web", spec); err != nil {
		t.Fatal(err)
	}
	hash := s.hash()
	node := []string{"--cgroups=disabled", "--ulimit=nofile=1024:1024", "--network=container:db", "--volume=data:/data:ro,Z"}
	wantInit := slices.Concat([]string{"/usr/bin/podman", "--root", "/r", "--runtime=runc", "run", "--detach", "--name=understudy-web-init-prep", "--restart=no",
		"--label=understudy.resource=web", "--label=understudy.role=init", "--label=understudy.spec=" + hash,
		"--label=understudy.init=prep", "--label=understudy.init-order=0"}, node,
		[]string{"--env=PASS=secret", "--entrypoint=/bin/sh", "--", "busybox", "-c", "--env=X=1"})
	wantService := slices.Concat([]string{"/usr/bin/podman", "--root", "/r", "--runtime=runc", "run", "--detach", "--name=understudy-web", "--restart=no",
		"--label=understudy.resource=web", "--label=understudy.role=service", "--label=understudy.spec=" + hash,
		"--label=understudy.init-completed=prep", "--stop-timeout=2", "--publish=127.0.0.1:8080:80/tcp"}, node,
		[]string{"--env=A=x=y", "--env=B=--privileged", "--entrypoint=--privileged", "--", image, "--privileged", "-v", "/:/host", "--"})
	if got := fake.argvs("run"); len(got) != 2 || !slices.Equal(got[0], wantInit) || !slices.Equal(got[1], wantService) {
		t.Fatalf("podman run:\n got %q\nwant %q\n     %q", got, wantInit, wantService)
	}
	// Before "--", every argument after the subcommand is a flag with its
	// value attached (or a value-less switch).
	for _, argv := range fake.argvs("run") {
		for _, a := range argv[5:slices.Index(argv, "--")] {
			if a != "--detach" && (!strings.HasPrefix(a, "--") || !strings.Contains(a, "=")) {
				t.Errorf("%q: not --flag=value", a)
			}
		}
	}
	for _, sub := range []string{"container", "wait", "logs"} {
		for _, argv := range fake.argvs(sub) {
			if len(argv) < 2 || argv[len(argv)-2] != "--" {
				t.Errorf("%q: the name does not follow --", argv)
			}
		}
	}
	// The audit record hides environment values, not the container's
	// arguments.
	if len(runs.cmds) != 1 || !slices.Equal(runs.cmds[0], slices.Concat(wantInit[:len(wantInit)-6], []string{"--env=PASS=***", "--entrypoint=/bin/sh", "--", "busybox", "-c", "--env=X=1"})) {
		t.Errorf("audited: %q", runs.cmds)
	}
}

// An init container cut off by the call's deadline (the agent's
// agent.call_timeout) is told apart from one that reached its own
// timeout: in the error and in the audit record, with the real wait.
func TestContainerInitCutOffByCallDeadline(t *testing.T) {
	spec := func(timeout string) Spec {
		step := map[string]any{"name": "slow", "args": []any{"sleep", "600"}}
		if timeout != "" {
			step["timeout"] = timeout
		}
		return Spec{"image": "alpine", "init": []any{step}}
	}
	cutOff := regexp.MustCompile(`^cut off after waiting ([0-9.]+m?s): the reconcile's deadline passed$`)
	for _, tc := range []struct {
		name    string
		call    time.Duration // 0: no deadline, cancelled after cancel
		cancel  time.Duration
		timeout string
		want    string // the outcome, or "cut off" checked with the pattern
	}{
		{"call deadline first", 400 * time.Millisecond, 0, "", "cut off"},
		{"call deadline before a short step timeout", 400 * time.Millisecond, 0, "10s", "cut off"},
		{"step timeout first", 10 * time.Second, 0, "300ms", "timed out: waited 300ms"},
		{"no call deadline", 0, 0, "300ms", "timed out: waited 300ms"},
		{"call cancelled", 0, 300 * time.Millisecond, "", "cut off: the reconcile was cancelled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := &fakePodman{block: true}
			c := NewContainer(PodmanConfig{})
			c.podman = fake
			runs := &codedRuns{}
			ctx, cancel := context.WithCancel(WithRuns(context.Background(), runs))
			defer cancel()
			if tc.call > 0 {
				ctx, cancel = context.WithTimeout(ctx, tc.call)
				defer cancel()
			}
			if tc.cancel > 0 {
				stop := time.AfterFunc(tc.cancel, cancel)
				defer stop.Stop()
			}
			o, err := c.Reconcile(ctx, "db", spec(tc.timeout))
			if err == nil || o.Drift != "init step slow failed" {
				t.Fatalf("%+v %v", o, err)
			}
			t.Log(err)
			msg, ok := strings.CutPrefix(err.Error(), "init step slow: ")
			if !ok {
				t.Fatalf("error %q", err)
			}
			if tc.want == "cut off" {
				m := cutOff.FindStringSubmatch(msg)
				if m == nil {
					t.Fatalf("error %q, want %s", err, cutOff)
				}
				if waited, _ := time.ParseDuration(m[1]); waited <= 0 || waited > tc.call {
					t.Errorf("waited %v: not the real wait (the call's bound is %v)", waited, tc.call)
				}
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("errors.Is(%v, DeadlineExceeded) = false", err)
				}
			} else if msg != tc.want {
				t.Fatalf("error %q, want %q", msg, tc.want)
			}
			if tc.cancel > 0 && !errors.Is(err, context.Canceled) {
				t.Errorf("errors.Is(%v, Canceled) = false", err)
			}
			if len(runs.runs) != 1 || runs.runs[0] != "db|slow|timed out|"+msg {
				t.Errorf("runs %q, want the outcome %q", runs.runs, msg)
			}
			// Cut off or timed out, the container is killed, with a bound of
			// its own; neither later steps nor the service run.
			kills := fake.argvs("kill")
			if len(kills) != 1 || !slices.Equal(kills[0], []string{"podman", "kill", "--signal=KILL", "--", "understudy-db-init-slow"}) {
				t.Errorf("kill %q", kills)
			}
			fake.mu.Lock()
			defer fake.mu.Unlock()
			last := fake.calls[len(fake.calls)-1]
			if subcommand(last.argv) != "kill" || last.ctxEnded {
				t.Errorf("last call %q (its context ended: %v)", last.argv, last.ctxEnded)
			}
		})
	}
}

func TestContainerMinCallTime(t *testing.T) {
	c := NewContainer(PodmanConfig{})
	for _, tc := range []struct {
		spec Spec
		want time.Duration
	}{
		{Spec{"image": "alpine"}, 0},
		{Spec{"image": "alpine", "init": []any{map[string]any{"name": "a"}}}, DefaultInitTimeout},
		{Spec{"image": "alpine", "init": []any{map[string]any{"name": "a", "timeout": "90s"}, map[string]any{"name": "b", "timeout": 30},
			map[string]any{"name": "c"}}}, 120*time.Second + DefaultInitTimeout},
		{Spec{"image": "--privileged", "init": []any{map[string]any{"name": "a"}}}, 0}, // invalid
	} {
		if got := c.MinCallTime(tc.spec); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.spec, got, tc.want)
		}
	}
}

// The runtime call, as it fails on a machine without CAP_SYS_RESOURCE and
// with hybrid cgroups (Debian 12, podman 4.3.1, crun 1.8.1, runc 1.1.5):
// replayed from a transcript of the real podman, recorded with
// -record-podman. Every podman call up to the runtime's works there; the
// driver must report the runtime's failure as the resource's error, with
// what to configure.
func TestContainerRecordedRuntimeBlocked(t *testing.T) {
	transcript := filepath.Join("testdata", "podman-runtime-blocked.txt")
	var runner podmanRunner
	var store *podmanStore
	var rec *recordingPodman
	if *recordPodman {
		requirePodman(t)
		store = newPodmanStore(t)
		t.Cleanup(func() { store.remove(t) })
		rootfsTar(t, filepath.Join(store.dir, "rootfs.tar"), "one")
		rec = &recordingPodman{dir: store.dir}
		runner = rec
	} else {
		calls, err := readTranscript(transcript)
		if err != nil {
			t.Fatal(err)
		}
		runner = &replayPodman{t: t, calls: calls}
		store = &podmanStore{dir: "$STORE", global: []string{"--root", "$STORE/root", "--runroot", "$STORE/run", "--tmpdir", "$STORE/tmp", "--storage-driver", "vfs", "--events-backend", "file"}}
	}
	with := func(cfg PodmanConfig) *Container {
		cfg.GlobalArgs = store.global
		c := NewContainer(cfg)
		c.podman = runner
		return c
	}
	runs := &codedRuns{}
	ctx := WithRuns(context.Background(), runs)
	// Importing the image works.
	if _, err := with(PodmanConfig{}).must(ctx, "import", store.dir+"/rootfs.tar", testImage); err != nil {
		t.Fatal(err)
	}
	const setrlimit = "; this node cannot raise resource limits (no CAP_SYS_RESOURCE): configure container ulimits below its hard limits (ulimit -Hn, ulimit -Hu)"
	for _, tc := range []struct {
		id   string
		cfg  PodmanConfig
		init bool
		want string
	}{
		{"web", PodmanConfig{}, true, "init step prepare: could not start: crun: setrlimit `RLIMIT_NOFILE`: Operation not permitted: OCI permission denied (podman exit 126)" + setrlimit},
		{"solo", PodmanConfig{}, false, "start container understudy-solo: podman run: crun: setrlimit `RLIMIT_NOFILE`: Operation not permitted: OCI permission denied (podman exit 126)" + setrlimit},
		{"limited", PodmanConfig{Ulimits: []string{"nofile=1024:1024", "nproc=1024:1024"}}, false,
			"start container understudy-limited: podman run: OCI runtime error: crun: cgroups in hybrid mode not supported, drop all controllers from cgroupv2 (podman exit 126); crun cannot use this node's hybrid cgroups: configure the container runtime runc"},
		{"runc", PodmanConfig{Runtime: "runc"}, false,
			"start container understudy-runc: podman run: runc: runc create failed: unable to start container process: error during container init: error setting rlimits for ready process: error setting rlimit type 7: operation not permitted: OCI permission denied (podman exit 126)" + setrlimit},
	} {
		c := with(tc.cfg)
		spec := Spec{"image": testImage, "command": "/bin/busybox", "args": []any{"sleep", "600"}, "network": "none"}
		if tc.init {
			spec["init"] = []any{map[string]any{"name": "prepare", "command": "/bin/busybox", "args": []any{"true"}}}
		}
		if _, err := c.Reconcile(ctx, tc.id, spec); err == nil || err.Error() != tc.want {
			t.Errorf("%s:\n got %v\nwant %s", tc.id, err, tc.want)
		}
		o, err := c.Observe(ctx, tc.id, spec)
		if err != nil || o.InSync {
			t.Errorf("%s: observe %+v %v", tc.id, o, err)
		}
		if !tc.init && o.Drift != "not running (created)" {
			t.Errorf("%s: a container the runtime could not start: %q", tc.id, o.Drift)
		}
		if err := c.Delete(ctx, tc.id, spec); err != nil {
			t.Errorf("%s: delete: %v", tc.id, err)
		}
	}
	if len(runs.runs) != 1 || !strings.HasPrefix(runs.runs[0], "web|prepare|exited -1|crun: setrlimit `RLIMIT_NOFILE`: Operation not permitted") {
		t.Errorf("runs %q", runs.runs)
	}
	if rec != nil {
		if err := os.WriteFile(transcript, rec.transcript(), 0o644); err != nil {
			t.Fatal(err)
		}
	} else if r := runner.(*replayPodman); r.next != len(r.calls) {
		t.Errorf("the driver made %d of the %d recorded podman calls", r.next, len(r.calls))
	}
}

// A transcript is a series of podman calls:
//
//	$ ["podman", "--root", "$STORE/root", …, "run", …]   (argv, JSON)
//	1> a line of stdout
//	2> a line of stderr
//	exit 126
//
// with the store's directory written $STORE. Lines starting with # are
// comments.
type podmanCall struct {
	argv []string
	res  podmanResult
}

func readTranscript(path string) ([]podmanCall, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var calls []podmanCall
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		cur := len(calls) - 1
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "$ "):
			var argv []string
			if err := json.Unmarshal([]byte(line[2:]), &argv); err != nil {
				return nil, fmt.Errorf("%s:%d: %w", path, n, err)
			}
			calls = append(calls, podmanCall{argv: argv})
		case cur < 0:
			return nil, fmt.Errorf("%s:%d: output before the first call", path, n)
		case strings.HasPrefix(line, "1> "), line == "1>":
			calls[cur].res.Stdout += strings.TrimPrefix(strings.TrimPrefix(line, "1>"), " ") + "\n"
		case strings.HasPrefix(line, "2> "), line == "2>":
			calls[cur].res.Stderr += strings.TrimPrefix(strings.TrimPrefix(line, "2>"), " ") + "\n"
		case strings.HasPrefix(line, "exit "):
			if _, err := fmt.Sscan(line[5:], &calls[cur].res.Exit); err != nil {
				return nil, fmt.Errorf("%s:%d: %w", path, n, err)
			}
		default:
			return nil, fmt.Errorf("%s:%d: unknown line %q", path, n, line)
		}
	}
	return calls, sc.Err()
}

// replayPodman answers the driver's podman calls from a transcript, in
// order; a call that differs from the recorded one fails the test.
type replayPodman struct {
	t     *testing.T
	mu    sync.Mutex
	calls []podmanCall
	next  int
}

func (r *replayPodman) run(_ context.Context, argv []string) (podmanResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.next >= len(r.calls) {
		r.t.Fatalf("podman call %d not in the transcript: %q (re-record with -record-podman, see the test's comment)", r.next+1, argv)
	}
	call := r.calls[r.next]
	r.next++
	if !slices.Equal(call.argv, argv) {
		r.t.Fatalf("podman call %d differs from the transcript:\n got %q\nwant %q\n(re-record with -record-podman, see the test's comment)", r.next, argv, call.argv)
	}
	return call.res, nil
}

// recordingPodman runs the real podman and keeps a transcript.
type recordingPodman struct {
	dir string
	mu  sync.Mutex
	out bytes.Buffer
}

func (r *recordingPodman) run(ctx context.Context, argv []string) (podmanResult, error) {
	res, err := execPodman{}.run(ctx, argv)
	if err != nil {
		return res, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	hide := func(s string) string { return strings.ReplaceAll(s, r.dir, "$STORE") }
	shown := make([]string, len(argv))
	for i, a := range argv {
		shown[i] = hide(a)
	}
	b, _ := json.Marshal(shown)
	fmt.Fprintf(&r.out, "$ %s\n", b)
	for _, l := range strings.Split(strings.TrimRight(hide(res.Stdout), "\n"), "\n") {
		if l != "" || res.Stdout != "" {
			fmt.Fprintf(&r.out, "1> %s\n", l)
		}
	}
	for _, l := range strings.Split(strings.TrimRight(hide(res.Stderr), "\n"), "\n") {
		if l != "" || res.Stderr != "" {
			fmt.Fprintf(&r.out, "2> %s\n", l)
		}
	}
	fmt.Fprintf(&r.out, "exit %d\n\n", res.Exit)
	return res, nil
}

func (r *recordingPodman) transcript() []byte {
	head := "# Real podman calls of TestContainerRecordedRuntimeBlocked, recorded with\n" +
		"#   go test -tags libvirt_dlopen ./actors/resources/ -run ContainerRecorded -record-podman\n" +
		"# on a machine without CAP_SYS_RESOURCE and with hybrid cgroups: " + machine() + "\n\n"
	return append([]byte(head), r.out.Bytes()...)
}

// machine names the versions the transcript was recorded with.
func machine() string {
	var parts []string
	for _, argv := range [][]string{{"podman", "--version"}, {"crun", "--version"}, {"runc", "--version"}} {
		out, _ := exec.Command(argv[0], argv[1:]...).Output()
		parts = append(parts, strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0])
	}
	if b, err := os.ReadFile("/etc/debian_version"); err == nil {
		parts = append([]string{"Debian " + strings.TrimSpace(string(b))}, parts...)
	}
	return strings.Join(parts, ", ")
}
