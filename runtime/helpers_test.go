package runtime

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"understudy/events/porttest"
)

// logRecorder is a slog.Handler keeping every record, for assertions on
// what was logged. On test failure it prints what it kept.
type logRecorder struct {
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every record
	records []logged
	attrs   []slog.Attr // from WithAttrs; groups are not used here
	root    *logRecorder
}

type logged struct {
	Time  time.Time
	Level slog.Level
	Msg   string
	Attrs map[string]slog.Value
}

func (l logged) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %q", l.Level, l.Msg)
	for k, v := range l.Attrs {
		fmt.Fprintf(&b, " %s=%v", k, v)
	}
	return b.String()
}

func newLogRecorder(t *testing.T) (*slog.Logger, *logRecorder) {
	t.Helper()
	r := &logRecorder{changed: make(chan struct{})}
	r.root = r
	t.Cleanup(func() {
		if t.Failed() {
			for _, l := range r.all() {
				t.Log(l)
			}
		}
	})
	return slog.New(r), r
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	l := logged{Time: rec.Time, Level: rec.Level, Msg: rec.Message, Attrs: map[string]slog.Value{}}
	for _, a := range r.attrs {
		l.Attrs[a.Key] = a.Value.Resolve()
	}
	rec.Attrs(func(a slog.Attr) bool {
		l.Attrs[a.Key] = a.Value.Resolve()
		return true
	})
	root := r.root
	root.mu.Lock()
	root.records = append(root.records, l)
	close(root.changed)
	root.changed = make(chan struct{})
	root.mu.Unlock()
	return nil
}

func (r *logRecorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &logRecorder{root: r.root, attrs: append(append([]slog.Attr(nil), r.attrs...), attrs...)}
}

func (r *logRecorder) WithGroup(string) slog.Handler { return r }

func (r *logRecorder) all() []logged {
	r.root.mu.Lock()
	defer r.root.mu.Unlock()
	return append([]logged(nil), r.root.records...)
}

func (r *logRecorder) matching(msg string) []logged {
	var out []logged
	for _, l := range r.all() {
		if l.Msg == msg {
			out = append(out, l)
		}
	}
	return out
}

// waitFor returns the first n records with msg, failing the test after timeout.
func (r *logRecorder) waitFor(t *testing.T, msg string, n int, timeout time.Duration) []logged {
	t.Helper()
	deadline := time.After(timeout)
	for {
		r.root.mu.Lock()
		changed := r.root.changed
		r.root.mu.Unlock()
		if got := r.matching(msg); len(got) >= n {
			return got[:n]
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no %d log records %q within %s", n, msg, timeout)
		}
	}
}

// freePort returns a TCP port on 127.0.0.1 where nothing listens (now),
// below the kernel's ephemeral range (porttest).
func freePort(t *testing.T) int {
	t.Helper()
	ports, err := porttest.Free(1)
	if err != nil {
		t.Fatal(err)
	}
	return ports[0]
}

// startEmbedded starts an embedded server in a temp dir on a free port.
func startEmbedded(t *testing.T, log *slog.Logger) *EmbeddedNATS {
	t.Helper()
	e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir(), Host: "127.0.0.1", Port: -1}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	return e
}

// scrape reads /metrics into "name{labels}" -> value.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	return parseMetrics(t, resp.Body)
}

func parseMetrics(t *testing.T, r io.Reader) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}
