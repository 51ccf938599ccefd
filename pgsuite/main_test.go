package pgsuite

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Environment variables of the suite (doc.go).
const (
	envBinary = "UNDERSTUDY_PGSUITE_UNDERSTUDY" // test this understudy binary instead of building one
	envKeep   = "UNDERSTUDY_PGSUITE_KEEP"       // keep every test's directory, not only failed ones
	envBinDir = "UNDERSTUDY_PGSUITE_PG_BIN"     // PostgreSQL 15's bin directory (default Debian's)
)

// rootPrefix starts the name of every test's directory in os.TempDir():
// rootPrefix<pid>-<random>. Short, so that the Unix socket path beside a
// data directory fits in 107 bytes; the pid says which run owns it.
const rootPrefix = "pgsuite-"

var leftoverRE = regexp.MustCompile(`^` + rootPrefix + `(\d+)-`)

// pgBinDir is where PostgreSQL 15's server programs are.
func pgBinDir() string {
	if d := os.Getenv(envBinDir); d != "" {
		return d
	}
	return "/usr/lib/postgresql/15/bin"
}

// requirePostgres fails the test (never skips it) when the PostgreSQL 15
// programs understudy and the suite run are missing.
func requirePostgres(t testing.TB) {
	t.Helper()
	var missing []string
	for _, b := range []string{"postgres", "initdb", "pg_basebackup", "pg_rewind", "pg_controldata", "pg_ctl"} {
		if fi, err := os.Stat(filepath.Join(pgBinDir(), b)); err != nil || fi.Mode()&0o111 == 0 {
			missing = append(missing, b)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("PostgreSQL 15 is not installed: %s missing from %s. Run `make test-deps` (apt-get install postgresql-15) or set $%s", strings.Join(missing, ", "), pgBinDir(), envBinDir)
	}
	if _, err := lookupUser("postgres"); err != nil {
		t.Fatalf("the OS user postgres is missing (the Debian package postgresql-common creates it; `make test-deps`): %v", err)
	}
	if os.Geteuid() != 0 {
		t.Fatalf("the PostgreSQL suite runs as root: understudy starts PostgreSQL as the OS user postgres (run `sudo go test ./pgsuite`)")
	}
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
	buildDir  string
)

// understudyBinary builds bin/understudy from the working tree once per
// run (or takes $UNDERSTUDY_PGSUITE_UNDERSTUDY).
func understudyBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		if given := os.Getenv(envBinary); given != "" {
			builtBin, buildErr = filepath.Abs(given)
			return
		}
		dir, err := os.MkdirTemp("", "pgsuite-bin-")
		if err != nil {
			buildErr = err
			return
		}
		buildDir = dir
		builtBin = filepath.Join(dir, "understudy")
		cmd := exec.Command("go", "build", "-tags", "libvirt_dlopen", "-o", builtBin, "./cmd/understudy")
		cmd.Dir = ".."
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/understudy: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

func TestMain(m *testing.M) {
	cleanLeftovers()
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// cleanLeftovers kills what an earlier run that crashed left running in
// its directories (a PostgreSQL started by hand outlives the test binary):
// processes working in os.TempDir()/pgsuite-<pid>-* whose pid is gone.
func cleanLeftovers() {
	entries, err := os.ReadDir(os.TempDir())
	if err != nil {
		return
	}
	for _, e := range entries {
		m := leftoverRE.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if pid != os.Getpid() && syscall.Kill(pid, 0) == nil {
			continue // a run in progress
		}
		dir := filepath.Join(os.TempDir(), e.Name())
		for _, p := range procsUnder(dir) {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		deadline := time.Now().Add(5 * time.Second)
		for len(procsUnder(dir)) > 0 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
}
