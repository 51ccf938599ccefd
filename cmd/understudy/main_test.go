package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"understudy/runtime"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestVersionCommand(t *testing.T) {
	code, out, errOut := runCLI(t, "version")
	if code != exitOK || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	if want := runtime.ReadBuildInfo().String() + "\n"; out != want {
		t.Errorf("version printed %q, want %q", out, want)
	}
	if !strings.HasPrefix(out, "understudy dev (go") {
		t.Errorf("version %q: want the default version dev and the Go version", out)
	}
}

func TestCommandLineMistakesExitWithUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string // parts of stderr
	}{
		{[]string{"serve", "--replicas", "9", "--log-format", "xml", "--data-dir", t.TempDir()},
			[]string{"--replicas: must be 1..5", `(got 9)`, "--log-format: must be text or json", "understudy serve --help"}},
		{[]string{"serve", "--nats-url", "nats://127.0.0.1:4222", "--nats-tls-cert", "c.pem"},
			[]string{"--nats-tls-key: must be set together with nats.tls.cert"}},
		{[]string{"serve", "--http", "nowhere"}, []string{"--http: must be host:port"}},
		{[]string{"serve", "--no-such-flag"}, []string{"unknown flag: --no-such-flag"}},
		{[]string{"serve", "extra"}, []string{`unknown command "extra"`}},
		{[]string{"nope"}, []string{`unknown command "nope"`}},
		{[]string{"version", "x"}, []string{`unknown command "x"`}},
	} {
		code, _, errOut := runCLI(t, tc.args...)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d (stderr %q)", tc.args, code, exitUsage, errOut)
		}
		for _, w := range tc.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%v: stderr %q does not contain %q", tc.args, errOut, w)
			}
		}
	}
}

func TestServeReadsSecretsFromEnvironment(t *testing.T) {
	// Without --nats-url, a user is a mistake: which proves the variable was read.
	t.Setenv("UNDERSTUDY_NATS_USER", "alice")
	code, _, errOut := runCLI(t, "serve", "--data-dir", t.TempDir())
	if code != exitUsage || !strings.Contains(errOut, `--nats-user: applies only to an external NATS`) {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}

func TestConfigErrorsStayTyped(t *testing.T) {
	err := configErrors(errors.Join(&runtime.ConfigError{Field: "assets.replicas", Rule: "must be 1..5", Value: "9"}))
	var ce *runtime.ConfigError
	if !errors.As(err, &ce) || ce.Field != "assets.replicas" {
		t.Fatalf("errors.As lost the *runtime.ConfigError: %v", err)
	}
	if !strings.Contains(err.Error(), "--replicas: must be 1..5") {
		t.Errorf("message %q does not name the flag", err)
	}
}

// The built binary: version from -ldflags, serve until SIGTERM, exit 0.
func TestBinaryServeUntilSIGTERM(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "understudy")
	build := exec.Command("go", "build", "-tags", "libvirt_dlopen", "-ldflags", "-X understudy/runtime.Version=v9.9.9-e2e", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(out), "understudy v9.9.9-e2e (go") {
		t.Errorf("version %q: want the -ldflags version", out)
	}

	cmd := exec.Command(bin, "serve", "--data-dir", filepath.Join(dir, "data"),
		"--nats-listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--log-format", "json")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{}) // closed once cmd.Wait returned waitErr
	var waitErr error
	var logs bytes.Buffer
	ready := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logs.Write(append(sc.Bytes(), '\n'))
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["msg"] == "ready" {
				ready <- line
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		waitErr = cmd.Wait()
		close(exited)
	}()
	defer func() {
		if t.Failed() {
			_ = cmd.Process.Kill()
			<-exited
			t.Logf("serve's stderr:\n%s", logs.String())
		}
	}()

	var line map[string]any
	select {
	case line = <-ready:
	case <-exited:
		t.Fatalf("serve exited before ready: %v", waitErr)
	case <-time.After(15 * time.Second):
		t.Fatal("no ready line within 15s")
	}
	addr, _ := line["http"].(string)
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"status":"ok"`)) {
		t.Errorf("/healthz: %s %s", resp.Status, body)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("serve after SIGTERM: %v, want exit code 0", waitErr)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("serve still running 5s after SIGTERM")
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code %d", code)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "jetstream")); err != nil {
		t.Errorf("no JetStream store in --data-dir: %v", err)
	}
}
