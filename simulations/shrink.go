package simulations

import (
	"strconv"
	"strings"
	"time"
)

// Shrink minimises the fault schedule of a failing run by delta debugging
// (ddmin): it looks for the smallest subset of cfg's faults that still
// makes the same seed violate the same invariant. The seed keeps driving
// everything else (latencies, timings), and each fault draws from its own
// streams, so a subset replays the rest of the run as closely as it can.
// budget bounds the number of runs. It returns the minimal schedule, the
// violation it produces, and the runs used.
func Shrink(cfg Config, invariant string, budget int) ([]Fault, *Violation, int) {
	if !cfg.FaultsSet {
		s, err := newSim(cfg)
		if err != nil {
			return nil, nil, 0
		}
		cfg.Faults = s.faults
	}
	cfg.FaultsSet, cfg.StopAtFirstViolation, cfg.Trace, cfg.Export = true, true, nil, nil
	runs := 0
	var last *Violation
	fails := func(fs []Fault) bool {
		runs++
		c := cfg
		c.Faults = fs
		r, err := Run(c)
		if err != nil {
			return false
		}
		for _, v := range r.Violations {
			if v.Invariant == invariant {
				last = &v
				return true
			}
		}
		return false
	}
	items := append([]Fault(nil), cfg.Faults...)
	if !fails(items) {
		return items, nil, runs // not reproducible with a set schedule: keep it whole
	}
	best := last
	n := 2
	for len(items) >= 2 && runs < budget {
		chunks := split(items, n)
		reduced := false
		for _, c := range chunks {
			if runs >= budget {
				break
			}
			if fails(c) {
				items, n, reduced, best = c, 2, true, last
				break
			}
		}
		if !reduced && n > 2 {
			for i := range chunks {
				if runs >= budget {
					break
				}
				comp := complement(chunks, i)
				if fails(comp) {
					items, n, reduced, best = comp, max(n-1, 2), true, last
					break
				}
			}
		}
		if !reduced {
			if n >= len(items) {
				break
			}
			n = min(2*n, len(items))
		}
	}
	if len(items) == 1 && runs < budget && fails(nil) {
		items, best = nil, last
	}
	return items, best, runs
}

func split(items []Fault, n int) [][]Fault {
	out := make([][]Fault, 0, n)
	for i := 0; i < n; i++ {
		lo, hi := i*len(items)/n, (i+1)*len(items)/n
		if hi > lo {
			out = append(out, items[lo:hi:hi])
		}
	}
	return out
}

func complement(chunks [][]Fault, skip int) []Fault {
	var out []Fault
	for i, c := range chunks {
		if i != skip {
			out = append(out, c...)
		}
	}
	return out
}

// Command is the understudy command line that reproduces cfg. pairConfig
// is the --pair-config path the run used ("" when the default rules).
func Command(cfg Config, pairConfig string) string {
	var b strings.Builder
	if buildTag != "" {
		// The failure needs the planted bug: build it as this binary was.
		b.WriteString("go run -tags libvirt_dlopen," + buildTag + " ./cmd/understudy simulate --scenario ")
	} else {
		b.WriteString("understudy simulate --scenario ")
	}
	b.WriteString(cfg.Scenario)
	b.WriteString(" --seed ")
	b.WriteString(strconv.FormatUint(cfg.Seed, 10))
	if cfg.Duration > 0 {
		b.WriteString(" --duration ")
		b.WriteString(FormatDuration(cfg.Duration))
	}
	if pairConfig != "" {
		b.WriteString(" --pair-config ")
		b.WriteString(shellQuote(pairConfig))
	}
	if cfg.AllowUnsafe {
		b.WriteString(" --allow-unsafe-config")
	}
	if cfg.Fsync == FsyncInterval {
		b.WriteString(" --fsync interval")
	}
	if cfg.Leadership == LeadershipNode {
		b.WriteString(" --leadership node")
	}
	if cfg.Pairs > 1 {
		b.WriteString(" --pairs ")
		b.WriteString(strconv.Itoa(cfg.Pairs))
	}
	if cfg.StoreWriteTime > 0 {
		b.WriteString(" --store-write-time ")
		b.WriteString(cfg.StoreWriteTime.String())
	}
	if cfg.StoreBatchWritePart > 0 {
		b.WriteString(" --store-batch-write-time ")
		b.WriteString(cfg.StoreBatchWritePart.String())
	}
	if cfg.HostWriteBound > 0 {
		b.WriteString(" --host-write-bound ")
		b.WriteString(strconv.Itoa(cfg.HostWriteBound))
	}
	if cfg.HostBatch > 0 {
		b.WriteString(" --host-batch ")
		b.WriteString(strconv.Itoa(cfg.HostBatch))
		if cfg.HostBatchNoAppends {
			b.WriteString(" --host-batch-no-appends")
		}
	}
	if cfg.HostRaiseOnce {
		b.WriteString(" --host-raise-once")
	}
	if c := cfg.CPU; c.StepCost > 0 {
		b.WriteString(" --host-step-cost ")
		b.WriteString(c.StepCost.String())
		if c.Cores > 0 {
			b.WriteString(" --host-cores ")
			b.WriteString(strconv.Itoa(c.Cores))
		}
		if c.StartCost > 0 {
			b.WriteString(" --host-start-cost ")
			b.WriteString(c.StartCost.String())
		}
		if c.StartLimit != 0 {
			b.WriteString(" --host-start-limit ")
			b.WriteString(strconv.Itoa(c.StartLimit))
		}
	}
	if cfg.HostConnNaive {
		b.WriteString(" --host-conn-naive")
	} else if cfg.HostConnWatch {
		b.WriteString(" --host-conn-watch")
	}
	if cfg.FaultsSet {
		b.WriteString(" --faults ")
		b.WriteString(shellQuote(FormatFaults(cfg.Faults)))
	}
	return b.String()
}

// FormatDuration writes d as a Go duration without trailing zero units
// ("10m", "1h30m", "2.5s").
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=+@%,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
