package runtime

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/dustin/go-humanize"
	"gopkg.in/yaml.v3"

	"understudy/actors/failover"
	"understudy/actors/procedure"
	"understudy/capabilities/postgres"
	"understudy/capabilities/vm"
)

// PairFile is a pair's rules as written in YAML (see docs/failover.md):
//
//	pair: pg-main
//	primary: site-a          # preferred primary
//	replica: site-b
//	heartbeat_timeout: 1s
//	failure_threshold: 2
//	success_threshold: 2
//	failover_timeout: 5s
//	fence_grace: 2s
//	failback: auto           # or manual
//	synchronous: off         # on or strict: a workload that replicates (postgres)
//	maximum_lag_on_failover: 1MiB
//
// Absent keys take DESIGN.md's defaults.
type PairFile struct {
	Pair             string `yaml:"pair"`
	Primary          string `yaml:"primary"`
	Replica          string `yaml:"replica"`
	HeartbeatTimeout string `yaml:"heartbeat_timeout"`
	FailureThreshold *int   `yaml:"failure_threshold"`
	SuccessThreshold *int   `yaml:"success_threshold"`
	FailoverTimeout  string `yaml:"failover_timeout"`
	FenceGrace       string `yaml:"fence_grace"`
	Failback         string `yaml:"failback"`
	Synchronous      string `yaml:"synchronous"`
	// MaximumLagOnFailover is in bytes of log, with an optional unit
	// ("1MiB", "16MB", "0"). A YAML number is read as bytes.
	MaximumLagOnFailover string `yaml:"maximum_lag_on_failover"`
}

// Rules validates the file into typed rules: every field, then the safety
// inequality (unless allowUnsafe, for the simulator's planted-bug runs).
// Errors are *ConfigError values naming field and rule.
func (p PairFile) Rules(allowUnsafe bool) (failover.Rules, error) {
	r := failover.DefaultRules(p.Pair, p.Primary, p.Replica)
	dur := func(field, s string, into *time.Duration) error {
		if s == "" {
			return nil
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return &ConfigError{Field: field, Rule: `must be a duration such as "1s" or "500ms"`, Value: s}
		}
		*into = d
		return nil
	}
	for _, f := range []struct {
		field string
		s     string
		into  *time.Duration
	}{
		{"heartbeat_timeout", p.HeartbeatTimeout, &r.HeartbeatTimeout},
		{"failover_timeout", p.FailoverTimeout, &r.FailoverTimeout},
		{"fence_grace", p.FenceGrace, &r.FenceGrace},
	} {
		if err := dur(f.field, f.s, f.into); err != nil {
			return failover.Rules{}, err
		}
	}
	if p.FailureThreshold != nil {
		r.FailureThreshold = *p.FailureThreshold
	}
	if p.SuccessThreshold != nil {
		r.SuccessThreshold = *p.SuccessThreshold
	}
	if p.Failback != "" {
		fb, err := failover.ParseFailback(p.Failback)
		if err != nil {
			return failover.Rules{}, err
		}
		r.Failback = fb
	}
	if p.Synchronous != "" {
		s, err := failover.ParseSynchronous(p.Synchronous)
		if err != nil {
			return failover.Rules{}, err
		}
		r.Synchronous = s
	}
	if p.MaximumLagOnFailover != "" {
		n, err := humanize.ParseBytes(p.MaximumLagOnFailover)
		if err != nil {
			return failover.Rules{}, &ConfigError{Field: "maximum_lag_on_failover", Rule: `must be a size in bytes, with an optional unit such as "1MiB" or "16MB"`, Value: p.MaximumLagOnFailover}
		}
		r.MaxLagOnFailover = n
	}
	var err error
	if allowUnsafe {
		err = r.ValidateShape()
	} else {
		err = r.Validate()
	}
	if err != nil {
		return failover.Rules{}, err
	}
	return r, nil
}

// decodeStrict decodes one YAML document refusing unknown keys, so a typo
// is an error rather than a silently ignored setting. An empty file and a
// second document ("---") are refused too: nothing in them would be read.
func decodeStrict(data []byte, into any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(into); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("the file is empty (or only comments): write the settings, even if only the required ones")
		}
		return err
	}
	var rest yaml.Node
	switch err := dec.Decode(&rest); {
	case errors.Is(err, io.EOF):
		return nil
	case err != nil:
		return fmt.Errorf("after the first document: %w", err)
	}
	return fmt.Errorf("line %d: a second YAML document (after ---): one document per file; it would be ignored", rest.Line)
}

// LoadPairFile reads and validates a pair file.
func LoadPairFile(path string, allowUnsafe bool) (failover.Rules, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return failover.Rules{}, fmt.Errorf("pair file: %w", err)
	}
	var p PairFile
	if err := decodeStrict(data, &p); err != nil {
		return failover.Rules{}, fmt.Errorf("pair file %s: %w", path, err)
	}
	r, err := p.Rules(allowUnsafe)
	if err != nil {
		return failover.Rules{}, fmt.Errorf("pair file %s: %w", path, err)
	}
	return r, nil
}

// PairMember is one entry of a node file's "pairs": the pair's rules (a
// pair file, or the same keys inline), the member this node runs (its site;
// the node's name when omitted) and that member's procedures.
type PairMember struct {
	File       string `yaml:"file"`
	PairFile   `yaml:",inline"`
	Member     string         `yaml:"member"`
	Procedures procedure.Spec `yaml:"procedures"`
	// CheckInterval ("10s"), when set, makes the member run its check
	// chain that often while it serves; CheckFailures (default 3) failed
	// checks in a row hand leadership to a ready replica.
	CheckInterval string `yaml:"check_interval"`
	CheckFailures int    `yaml:"check_failures"`
	// Postgres or VM, when set, is the workload the member protects,
	// driven by the member itself; Procedures may then hold only fence
	// steps, run when the workload's own fence fails (escalation).
	Postgres *postgres.Config `yaml:"postgres"`
	VM       *vm.Config       `yaml:"vm"`
}

// resolvePairs validates a node file's pairs into member configurations.
// baseDir resolves relative pair file paths.
func resolvePairs(node string, pairs []PairMember, baseDir string) ([]MemberConfig, []error) {
	var out []MemberConfig
	var errs []error
	seen := map[string]bool{}
	for i, pm := range pairs {
		field := "pairs[" + strconv.Itoa(i) + "]"
		var rules failover.Rules
		var err error
		if pm.File != "" {
			if pm.PairFile != (PairFile{}) {
				errs = append(errs, &ConfigError{Field: field + ".file", Rule: "give the pair either as a file or inline, not both", Value: pm.File})
				continue
			}
			path := pm.File
			if !filepath.IsAbs(path) && baseDir != "" {
				path = filepath.Join(baseDir, path)
			}
			rules, err = LoadPairFile(path, false)
		} else {
			rules, err = pm.PairFile.Rules(false)
		}
		if err != nil {
			var ce *ConfigError
			if errors.As(err, &ce) {
				rule := ce.Rule
				if pm.File != "" {
					rule += " (in pair file " + pm.File + ")"
				}
				err = &ConfigError{Field: field + "." + ce.Field, Rule: rule, Value: ce.Value}
			}
			errs = append(errs, err)
			continue
		}
		site := pm.Member
		if site == "" {
			site = node
		}
		if !rules.Has(site) {
			errs = append(errs, &ConfigError{Field: field + ".member", Rule: fmt.Sprintf("must name a member of pair %s (%s or %s); it defaults to the node name", rules.Pair, rules.Primary, rules.Replica), Value: site})
			continue
		}
		opts, err := workloadOptions(pm, rules, field)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		validate := pm.Procedures.Validate
		if pm.Postgres != nil || pm.VM != nil {
			validate = pm.Procedures.ValidateSteps // the workload fences itself
		}
		if err := validate(); err != nil {
			var ce *ConfigError
			if errors.As(err, &ce) {
				err = &ConfigError{Field: field + "." + ce.Field, Rule: ce.Rule, Value: ce.Value}
			}
			errs = append(errs, err)
			continue
		}
		if err := rules.CheckFenceBudget(pm.Procedures.Fence.WorstCase()); err != nil {
			ce := err.(*ConfigError)
			errs = append(errs, &ConfigError{Field: field + "." + ce.Field, Rule: ce.Rule + " (procedures.fence)", Value: ce.Value})
			continue
		}
		if pm.CheckInterval != "" {
			d, err := time.ParseDuration(pm.CheckInterval)
			switch {
			case err != nil:
				errs = append(errs, &ConfigError{Field: field + ".check_interval", Rule: `must be a duration such as "10s"`, Value: pm.CheckInterval})
				continue
			case d < rules.HeartbeatTimeout:
				errs = append(errs, &ConfigError{Field: field + ".check_interval", Rule: "must be at least heartbeat_timeout (" + rules.HeartbeatTimeout.String() + ")", Value: pm.CheckInterval})
				continue
			case len(pm.Procedures.Check.Steps) == 0 && pm.Postgres == nil && pm.VM == nil:
				errs = append(errs, &ConfigError{Field: field + ".procedures.check.steps", Rule: "must have at least one step when check_interval is set"})
				continue
			}
			opts.CheckInterval = d
		}
		if pm.CheckFailures < 0 || pm.CheckFailures > failover.MaxThreshold {
			errs = append(errs, &ConfigError{Field: field + ".check_failures", Rule: "must be between 1 and " + strconv.Itoa(failover.MaxThreshold) + " (0: the default, 3)", Value: strconv.Itoa(pm.CheckFailures)})
			continue
		}
		opts.CheckFailures = pm.CheckFailures
		key := rules.Pair + "/" + site
		if seen[key] {
			errs = append(errs, &ConfigError{Field: field, Rule: "each pair member may be hosted once per node", Value: key})
			continue
		}
		seen[key] = true
		out = append(out, MemberConfig{Rules: rules, Site: site, Procedures: pm.Procedures, Options: opts, Postgres: pm.Postgres, VM: pm.VM})
	}
	return out, errs
}

// workloadOptions validates a member's workload section (postgres or vm)
// and returns the member options it implies.
func workloadOptions(pm PairMember, rules failover.Rules, field string) (failover.Options, error) {
	var opts failover.Options
	if pm.Postgres != nil && pm.VM != nil {
		return opts, &ConfigError{Field: field + ".vm", Rule: "a member protects one workload: postgres or vm, not both"}
	}
	if pm.Postgres != nil || pm.VM != nil {
		wl := "postgres"
		if pm.VM != nil {
			wl = "vm"
		}
		for _, c := range []struct {
			name  string
			chain procedure.ChainSpec
		}{{"promote", pm.Procedures.Promote}, {"demote", pm.Procedures.Demote}, {"check", pm.Procedures.Check}} {
			if len(c.chain.Steps) > 0 {
				return opts, &ConfigError{Field: field + ".procedures." + c.name, Rule: "must be empty with " + wl + ": the member drives the " + wl + " itself; only fence steps may be given, run when its own fence fails"}
			}
		}
	}
	if (rules.Synchronous == failover.SyncOn || rules.Synchronous == failover.SyncStrict) && pm.Postgres == nil {
		return opts, &ConfigError{Field: field + ".synchronous", Rule: "must be off unless the member protects a workload that replicates (postgres)", Value: rules.Synchronous.String()}
	}
	switch {
	case pm.Postgres != nil:
		if err := pm.Postgres.Validate(field + ".postgres"); err != nil {
			return opts, err
		}
		opts.Rejoin, opts.Positions, opts.Synchronizer = true, true, true
	case pm.VM != nil:
		if err := pm.VM.Validate(field + ".vm"); err != nil {
			return opts, err
		}
		opts.Rejoin = true
	}
	return opts, nil
}

// PairFileOf renders rules back into the pair file's shape (every key
// written), for `understudy config get`.
func PairFileOf(r failover.Rules) PairFile {
	ft, st := r.FailureThreshold, r.SuccessThreshold
	return PairFile{
		Pair: r.Pair, Primary: r.Primary, Replica: r.Replica,
		HeartbeatTimeout: r.HeartbeatTimeout.String(), FailureThreshold: &ft, SuccessThreshold: &st,
		FailoverTimeout: r.FailoverTimeout.String(), FenceGrace: r.FenceGrace.String(), Failback: r.Failback.String(),
		Synchronous: r.Synchronous.String(), MaximumLagOnFailover: strconv.FormatUint(r.MaxLagOnFailover, 10),
	}
}
