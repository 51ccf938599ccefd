package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"understudy/runtime"
)

func newExportCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		nf       natsFlags
		pair     string
		stream   string
		from, to string
		out      string
	)
	cmd := &cobra.Command{
		Use:   "export --pair P --out FILE",
		Short: "Write a pair's raw record (KV history and events) from NATS to an export file",
		Long: `Write the raw record of a pair — every message of the failover bucket's keys
<pair>.> (register writes, heartbeats, config, switchover requests) and of the
event subjects ev.failover.<pair>.> and ev.procedure.<pair>.>, with subjects,
sequences, server timestamps and headers — to FILE, in the versioned export
format of docs/export-format.md, ordered by server time, then stream, then
sequence. 'understudy replay --file FILE' rebuilds the history from it offline.

--from and --to take an RFC 3339 time (2025-03-01T10:00:00Z) or a duration
ago (90m, 1h, 24h). The KV bucket keeps 64 revisions per key: export soon
after an incident to keep the heartbeats that led up to it.

The file is written next to FILE and renamed into place once complete, so a
failed export never leaves a file that looks whole.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if pair == "" {
				return &usageError{cmd: cmd.CommandPath(), err: errors.New("--pair is required")}
			}
			if out == "" {
				return &usageError{cmd: cmd.CommandPath(), err: errors.New("--out is required")}
			}
			now := time.Now()
			f, err := parseWhen("--from", from, now)
			if err != nil {
				return &usageError{cmd: cmd.CommandPath(), err: err}
			}
			t, err := parseWhen("--to", to, now)
			if err != nil {
				return &usageError{cmd: cmd.CommandPath(), err: err}
			}
			if !f.IsZero() && !t.IsZero() && t.Before(f) {
				return &usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("--to %s is before --from %s", t.Format(time.RFC3339), f.Format(time.RFC3339))}
			}
			nc, _, err := nf.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			opts := runtime.PairRecordOptions{Pair: pair, Bucket: nf.bucket, Stream: stream, From: f, To: t}
			n, size, err := exportToFile(cmd.Context(), js, opts, runtime.RedactURLs(nf.url), out, stderr)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "exported %d records of pair %s (%d bytes) to %s\n", n, pair, size, out)
			return nil
		},
	}
	nf.add(cmd)
	fl := cmd.Flags()
	fl.StringVar(&pair, "pair", "", "pair to export (required)")
	fl.StringVar(&stream, "stream", runtime.DefaultEventsStream, "events stream")
	fl.StringVar(&from, "from", "", "start: RFC 3339 time or a duration ago (1h)")
	fl.StringVar(&to, "to", "", "end: RFC 3339 time or a duration ago")
	fl.StringVar(&out, "out", "", "export file to write (required)")
	return cmd
}

// exportToFile exports into a temporary file beside path and renames it
// into place when complete. It returns the records and bytes written.
func exportToFile(ctx context.Context, js jetstream.JetStream, opts runtime.PairRecordOptions, source, path string, stderr io.Writer) (int, int64, error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".part-*")
	if err != nil {
		return 0, 0, fmt.Errorf("export: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing to remove
	prog := newProgress(stderr, "export "+opts.Pair)
	if prog.on {
		opts.Progress = func(n int, total uint64) { prog.update(n, total, "records") }
	}
	n, err := runtime.ExportPair(ctx, js, opts, source, tmp)
	prog.done()
	if err != nil {
		tmp.Close()
		return n, 0, fmt.Errorf("export pair %s: %w (nothing written to %s)", opts.Pair, err, path)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return n, 0, fmt.Errorf("export: %w", err)
	}
	st, err := tmp.Stat()
	if err != nil {
		tmp.Close()
		return n, 0, err
	}
	if err := tmp.Close(); err != nil {
		return n, 0, fmt.Errorf("export: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return n, 0, fmt.Errorf("export: %w", err)
	}
	return n, st.Size(), nil
}

// parseWhen reads an RFC 3339 time or a duration before now; "" is zero.
func parseWhen(flag, s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%s %q: want an RFC 3339 time (2025-03-01T10:00:00Z) or a duration ago (90m, 1h)", flag, s)
	}
	return now.Add(-d).UTC(), nil
}

// progress draws a one-line progress report on stderr, only when stderr
// is a terminal (never in pipes, files or CI logs).
type progress struct {
	w     io.Writer
	on    bool
	what  string
	start time.Time
	mu    sync.Mutex
	last  time.Time
	drawn bool
}

func newProgress(w io.Writer, what string) *progress {
	p := &progress{w: w, what: what, start: time.Now()}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.on = true
	}
	return p
}

// draw writes "what: " and the line, at most ten times a second unless
// force (a last state that must show).
func (p *progress) draw(force bool, format string, args ...any) {
	if !p.on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if !force && now.Sub(p.last) < 100*time.Millisecond {
		return
	}
	p.last, p.drawn = now, true
	fmt.Fprintf(p.w, "\r\033[K%s: "+format, append([]any{p.what}, args...)...)
}

// rate is n per second since the start.
func (p *progress) rate(n int) float64 {
	return float64(n) / max(time.Since(p.start).Seconds(), 1e-3)
}

// update shows n of about total (0: unknown).
func (p *progress) update(n int, total uint64, unit string) {
	if total > 0 {
		p.draw(false, "%d of ~%d %s (%.0f%%), %.0f/s", n, total, unit, 100*float64(n)/float64(total), p.rate(n))
	} else {
		p.draw(false, "%d %s, %.0f/s", n, unit, p.rate(n))
	}
}

// fraction shows n with a known fraction done (0..1).
func (p *progress) fraction(n int, frac float64, unit string) {
	p.draw(false, "%d %s (%.0f%%), %.0f/s", n, unit, 100*frac, p.rate(n))
}

// done clears the line.
func (p *progress) done() {
	if !p.on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
	}
}
