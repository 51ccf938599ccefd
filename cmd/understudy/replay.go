package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"understudy/actors/failover"
	"understudy/events"
	"understudy/projections"
	"understudy/runtime"
)

func newReplayCmd(stdout, stderr io.Writer) *cobra.Command {
	var (
		nf       natsFlags
		file     string
		pair     string
		stream   string
		from, to string
		format   string
		out      string
		partial  bool
		whatIfP  string
		unsafe   bool
		seed     uint64
	)
	cmd := &cobra.Command{
		Use:   "replay (--file FILE | --nats-url U --pair P)",
		Short: "Rebuild a pair's history — leadership, failovers, split-brain check, heartbeats — from its record",
		Long: `Fold a pair's record into its history: who served when (by term), every
failover (last primary heartbeat, fence, promotion, detection, read-only gap),
switchovers and failbacks, config changes, fencing steps and escalations,
heartbeat statistics per site, availability over the window, and the
split-brain check (any overlap of two serving members, with both intervals and
the events that bound them). The record is an export file (--file, from
'understudy export' or the simulator) or a live NATS (--nats-url and --pair).

--format text (default): a readable timeline and a failover table; json: one
object (pair, window, leadership, failovers, split_brain, heartbeats,
availability, records, …); html: one self-contained page with a lane per site.
--out writes to FILE instead of stdout. docs/replay.md explains every field.

A damaged export file is an error (exit 1) naming the byte offset and how many
records were read intact before it; nothing is printed as if it were the whole
history. With --partial the history of the records read before the damage is
rendered too, marked PARTIAL, and the exit status is still 1.

--what-if PAIR.yaml (with --file) asks how other rules would have fared: the
record's heartbeat arrival pattern (each site's gaps and late writes, its
restarts, silences and the operator's switchovers) becomes a fault schedule,
run through the simulator under the recorded rules and under the proposed
ones; failovers, false failovers, unavailability and invariant violations are
printed side by side with what the record itself shows (text, or --format
json). Rules that break the safety inequality are refused unless
--allow-unsafe-config is given. docs/replay.md explains the mapping.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			usage := func(err error) error { return &usageError{cmd: cmd.CommandPath(), err: err} }
			switch {
			case file == "" && pair == "":
				return usage(errors.New("give --file FILE, or --pair P to read a live NATS (--nats-url)"))
			case file != "" && cmd.Flags().Changed("nats-url"):
				return usage(errors.New("--file and --nats-url exclude each other"))
			case partial && file == "":
				return usage(errors.New("--partial applies to --file only"))
			case whatIfP != "" && file == "":
				return usage(errors.New("--what-if needs --file: it replays an export file's heartbeat pattern"))
			case whatIfP == "" && (cmd.Flags().Changed("allow-unsafe-config") || cmd.Flags().Changed("seed")):
				return usage(errors.New("--allow-unsafe-config and --seed apply to --what-if only"))
			case whatIfP != "" && partial:
				return usage(errors.New("--what-if needs an intact file: it takes no --partial"))
			}
			f, err := projections.ParseFormat(format)
			if err != nil {
				return usage(fmt.Errorf("--format: %w", err))
			}
			if whatIfP != "" && f == projections.FormatHTML {
				return usage(errWhatIfFormat)
			}
			now := time.Now()
			fromT, err := parseWhen("--from", from, now)
			if err != nil {
				return usage(err)
			}
			toT, err := parseWhen("--to", to, now)
			if err != nil {
				return usage(err)
			}
			if toT.After(now) {
				toT = now // the record holds nothing later; the window ends where it was read
			}
			var proposed failover.Rules
			var tap *patternTap
			var newTap func(pair, bucket string) func(events.Record)
			if whatIfP != "" {
				// The proposed rules are checked before the record is read.
				if proposed, err = loadRulesFile(whatIfP, unsafe, "run"); err != nil {
					return usage(fmt.Errorf("--what-if: %w", err))
				}
				newTap = func(pair, bucket string) func(events.Record) {
					tap = newPatternTap(pair, bucket)
					return tap.add
				}
			}
			var rep *projections.Report
			var readErr error
			if file != "" {
				rep, readErr = replayFile(file, pair, fromT, toT, partial, stderr, newTap)
				if rep == nil {
					return readErr
				}
			} else {
				nc, _, err := nf.connect(cmd.Context())
				if err != nil {
					return err
				}
				defer nc.Close()
				js, err := jetstream.New(nc)
				if err != nil {
					return err
				}
				fold, err := projections.NewFold(projections.Options{Pair: pair, Bucket: nf.bucket, Codec: runtime.Codec(), From: fromT, To: toT, Source: runtime.RedactURLs(nf.url)})
				if err != nil {
					return err
				}
				prog := newProgress(stderr, "replay "+pair)
				opts := runtime.PairRecordOptions{Pair: pair, Bucket: nf.bucket, Stream: stream, From: fromT, To: toT}
				if prog.on {
					opts.Progress = func(n int, total uint64) { prog.update(n, total, "records") }
				}
				for rec, err := range runtime.ReadPairRecords(cmd.Context(), js, opts) {
					if err != nil {
						prog.done()
						return fmt.Errorf("replay pair %s: %w", pair, err)
					}
					fold.Add(rec)
				}
				prog.done()
				rep = fold.Report()
			}
			if whatIfP != "" {
				wr, err := whatIf(file, proposed, whatIfP, seed, tap, rep, usage)
				if err != nil {
					return err
				}
				return writeOut(out, stdout, func(w io.Writer) error { return writeWhatIf(w, wr, f == projections.FormatJSON) })
			}
			if err := writeReport(rep, f, out, stdout); err != nil {
				return err
			}
			return readErr
		},
	}
	nf.add(cmd)
	fl := cmd.Flags()
	fl.StringVar(&file, "file", "", "export file to replay")
	fl.StringVar(&pair, "pair", "", "pair (with --nats-url; with --file, the file's pair unless given)")
	fl.StringVar(&stream, "stream", runtime.DefaultEventsStream, "events stream (with --nats-url)")
	fl.StringVar(&from, "from", "", "start: RFC 3339 time or a duration ago (1h)")
	fl.StringVar(&to, "to", "", "end: RFC 3339 time or a duration ago")
	fl.StringVar(&format, "format", "text", "text, json or html")
	fl.StringVar(&out, "out", "", "write the report to FILE (default stdout)")
	fl.StringVar(&whatIfP, "what-if", "", "pair file with proposed rules: replay the record's heartbeat pattern through the simulator under them and the recorded rules")
	fl.BoolVar(&unsafe, "allow-unsafe-config", false, "with --what-if: accept proposed rules that break the safety inequality")
	fl.Uint64Var(&seed, "seed", 1, "with --what-if: the simulator's seed (latencies and procedure timings)")
	fl.BoolVar(&partial, "partial", false, "on a damaged file, also render what was read before the damage (marked PARTIAL; exit status 1)")
	return cmd
}

// replayFile folds an export file. On damage it returns (nil, err), or
// with partial the report of what was read (marked) and err. newTap, when
// set, is given the file's pair and bucket and returns a function that
// sees every record read, in the same pass.
func replayFile(path, pair string, from, to time.Time, partial bool, stderr io.Writer, newTap func(pair, bucket string) func(events.Record)) (*projections.Report, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	size := int64(0)
	if st, err := fh.Stat(); err == nil {
		size = st.Size()
	}
	r, err := events.NewExportReader(fh)
	if err != nil {
		return nil, fmt.Errorf("replay %s: %w", path, err)
	}
	h := r.Header()
	if pair == "" {
		pair = h.Pair
	}
	if pair == "" {
		return nil, fmt.Errorf("replay %s: the file holds all pairs; choose one with --pair", path)
	}
	if h.Pair != "" && h.Pair != pair {
		return nil, fmt.Errorf("replay %s: the file holds pair %q, not %q", path, h.Pair, pair)
	}
	if from.IsZero() {
		from = h.From
	}
	if to.IsZero() || (!h.To.IsZero() && to.After(h.To)) {
		to = h.To // the file was written up to its header's To, not beyond
	}
	source := path
	if h.Source != "" {
		source = h.Source + " (file " + filepath.Base(path) + ")"
	}
	fold, err := projections.NewFold(projections.Options{Pair: pair, Bucket: h.Meta["bucket"], Codec: runtime.Codec(), From: from, To: to, Source: source})
	if err != nil {
		return nil, err
	}
	tap := func(events.Record) {}
	if newTap != nil {
		tap = newTap(pair, h.Meta["bucket"])
	}
	prog := newProgress(stderr, "replay "+filepath.Base(path))
	defer prog.done()
	progress := func(offset int64) {
		if size > 0 {
			prog.fraction(fold.Count(), float64(offset)/float64(size), "records")
		}
	}
	for rec, err := range events.ReadAhead(r, progress) {
		if err != nil {
			var ee *events.ExportError
			if !errors.As(err, &ee) {
				return nil, fmt.Errorf("replay %s: %w", path, err)
			}
			err = fmt.Errorf("replay %s: %w", path, err)
			if !partial {
				return nil, fmt.Errorf("%w; no history printed, as it would be incomplete (--partial shows it, marked PARTIAL)", err)
			}
			fold.SetPartial(err, ee.Offset)
			return fold.Report(), err
		}
		fold.Add(rec)
		tap(rec)
	}
	return fold.Report(), nil
}

// writeReport renders to path (through a temporary file renamed into
// place) or to stdout.
func writeReport(rep *projections.Report, f projections.Format, path string, stdout io.Writer) error {
	return writeOut(path, stdout, func(w io.Writer) error { return projections.Render(w, rep, f) })
}

// writeOut writes what render writes to path (through a temporary file
// renamed into place), or to stdout.
func writeOut(path string, stdout io.Writer, render func(io.Writer) error) error {
	if path == "" {
		w := bufio.NewWriter(stdout)
		if err := render(w); err != nil {
			return err
		}
		return w.Flush()
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".part-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := render(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
