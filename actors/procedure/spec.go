package procedure

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"understudy/actors"
)

// DefaultStepTimeout applies to a step whose YAML omits timeout.
const DefaultStepTimeout = 30 * time.Second

// Spec is a resource's procedures, as embedded in the node config file
// under "procedures". Validate it once at load; the Runner trusts it.
type Spec struct {
	Fence   ChainSpec `yaml:"fence"`
	Promote ChainSpec `yaml:"promote"`
	Demote  ChainSpec `yaml:"demote"`
	Check   ChainSpec `yaml:"check"`
}

// ChainSpec is an ordered list of steps; each escalates to the next.
type ChainSpec struct {
	Steps []StepSpec `yaml:"steps,omitempty"`
}

// WorstCase is how long the chain can take: the sum of its step timeouts
// (every step but the last fails only by timing out).
func (c ChainSpec) WorstCase() time.Duration {
	var d time.Duration
	for _, s := range c.Steps {
		d += s.Timeout
	}
	return d
}

// StepSpec is one step: a driver name plus that driver's fields. A new
// driver adds its own field (e.g. Libvirt *LibvirtSpec) and a row in
// driverChecks.
type StepSpec struct {
	Name    string        `yaml:"name"`   // default on load: <driver>-<index>
	Driver  string        `yaml:"driver"` // "exec", "libvirt-destroy", "libvirt-link-down"
	Timeout time.Duration `yaml:"timeout"`
	Exec    *ExecSpec     `yaml:"exec,omitempty"`
	Libvirt *LibvirtSpec  `yaml:"libvirt,omitempty"`

	badTimeout string // the YAML timeout text when it did not parse; Validate reports it
}

// ExecSpec runs a command. Env is added to the node process's environment.
type ExecSpec struct {
	Command string            `yaml:"command"`
	Args    []string          `yaml:"args,omitempty"`
	Env     map[string]string `yaml:"env,omitempty"`
	Dir     string            `yaml:"dir,omitempty"`
}

// stepYAML is StepSpec as written in YAML: the timeout is a Go duration
// string ("10s"), which yaml.v3 does not decode into a time.Duration.
type stepYAML struct {
	Name    string       `yaml:"name"`
	Driver  string       `yaml:"driver"`
	Timeout *string      `yaml:"timeout,omitempty"`
	Exec    *ExecSpec    `yaml:"exec,omitempty"`
	Libvirt *LibvirtSpec `yaml:"libvirt,omitempty"`
}

// UnmarshalYAML reads the timeout as a duration string, 30s when omitted.
// It uses the older callback form on purpose: yaml.v3 then decodes with the
// caller's decoder, so Decoder.KnownFields still rejects misspelled keys.
func (s *StepSpec) UnmarshalYAML(unmarshal func(any) error) error {
	var y stepYAML
	if err := unmarshal(&y); err != nil {
		return err
	}
	*s = StepSpec{Name: y.Name, Driver: y.Driver, Timeout: DefaultStepTimeout, Exec: y.Exec, Libvirt: y.Libvirt}
	if y.Timeout != nil {
		d, err := time.ParseDuration(strings.TrimSpace(*y.Timeout))
		if err != nil {
			s.Timeout, s.badTimeout = 0, *y.Timeout
		} else {
			s.Timeout = d
		}
	}
	return nil
}

// MarshalYAML writes the timeout back as a duration string.
func (s StepSpec) MarshalYAML() (any, error) {
	t := s.Timeout.String()
	return stepYAML{Name: s.Name, Driver: s.Driver, Timeout: &t, Exec: s.Exec, Libvirt: s.Libvirt}, nil
}

// UnmarshalYAML names unnamed steps <driver>-<index>, so every step event
// carries a name.
func (c *ChainSpec) UnmarshalYAML(unmarshal func(any) error) error {
	var y struct {
		Steps []StepSpec `yaml:"steps,omitempty"`
	}
	if err := unmarshal(&y); err != nil {
		return err
	}
	for i := range y.Steps {
		if y.Steps[i].Name == "" && y.Steps[i].Driver != "" {
			y.Steps[i].Name = y.Steps[i].Driver + "-" + strconv.Itoa(i)
		}
	}
	c.Steps = y.Steps
	return nil
}

// driverChecks are the drivers a step may name, each with the check of its
// own fields (path is the step's field path).
var driverChecks = map[string]func(s StepSpec, path string) error{
	"exec":                checkExec,
	DriverLibvirtDestroy:  checkLibvirt,
	DriverLibvirtLinkDown: checkLibvirt,
}

func checkExec(s StepSpec, path string) error {
	if s.Exec == nil {
		return &actors.ConfigError{Field: path + ".exec", Rule: "must be set with driver exec (command, args, env, dir)"}
	}
	if strings.TrimSpace(s.Exec.Command) == "" {
		return &actors.ConfigError{Field: path + ".exec.command", Rule: "must not be empty"}
	}
	if s.Libvirt != nil {
		return &actors.ConfigError{Field: path + ".libvirt", Rule: "applies to the libvirt drivers only; driver exec takes exec"}
	}
	for _, k := range slices.Sorted(maps.Keys(s.Exec.Env)) {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return &actors.ConfigError{Field: path + ".exec.env", Rule: "variable names must be non-empty and contain no '=' or NUL", Value: strconv.Quote(k)}
		}
	}
	return nil
}

// Chain returns the chain of a kind (the zero ChainSpec for an unknown one).
func (s Spec) Chain(kind ChainKind) ChainSpec {
	switch kind {
	case ChainFence:
		return s.Fence
	case ChainPromote:
		return s.Promote
	case ChainDemote:
		return s.Demote
	case ChainCheck:
		return s.Check
	}
	return ChainSpec{}
}

// Validate checks every chain and returns a *actors.ConfigError naming the
// first field that breaks a rule, as a path from "procedures" (a config
// that nests Spec deeper prefixes it).
func (s Spec) Validate() error {
	if len(s.Fence.Steps) == 0 {
		return &actors.ConfigError{Field: "procedures.fence.steps", Rule: "must have at least one step: a member that cannot fence must never serve"}
	}
	return s.ValidateSteps()
}

// ValidateSteps checks every step but requires none: the procedures of a
// member whose workload fences itself (postgres, vm), where fence steps
// only escalate.
func (s Spec) ValidateSteps() error {
	for kind := ChainFence; kind <= ChainCheck; kind++ {
		for i, step := range s.Chain(kind).Steps {
			if err := step.validate(fmt.Sprintf("procedures.%s.steps[%d]", kind, i)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s StepSpec) validate(path string) error {
	check, ok := driverChecks[s.Driver]
	switch {
	case s.Driver == "":
		return &actors.ConfigError{Field: path + ".driver", Rule: "must be set; known drivers: " + knownDrivers()}
	case !ok:
		return &actors.ConfigError{Field: path + ".driver", Rule: "unknown driver; known drivers: " + knownDrivers(), Value: strconv.Quote(s.Driver)}
	case strings.TrimSpace(s.Name) == "":
		return &actors.ConfigError{Field: path + ".name", Rule: "must not be empty"}
	case s.badTimeout != "":
		return &actors.ConfigError{Field: path + ".timeout", Rule: `must be a Go duration with a unit, such as "10s"`, Value: strconv.Quote(s.badTimeout)}
	case s.Timeout <= 0:
		return &actors.ConfigError{Field: path + ".timeout", Rule: "must be a positive duration (omit it for the default " + DefaultStepTimeout.String() + ")", Value: s.Timeout.String()}
	}
	return check(s, path)
}

func knownDrivers() string { return strings.Join(slices.Sorted(maps.Keys(driverChecks)), ", ") }

// Summary is a short, human description of what the step runs, for events
// and logs. Env values are left out: they may hold secrets.
func (s StepSpec) Summary() string {
	if s.Driver == "exec" && s.Exec != nil {
		parts := make([]string, 0, 1+len(s.Exec.Args))
		for _, a := range append([]string{s.Exec.Command}, s.Exec.Args...) {
			if a == "" || strings.ContainsAny(a, " \t\n'\"\\$") {
				a = strconv.Quote(a)
			}
			parts = append(parts, a)
		}
		return truncate(strings.Join(parts, " "), maxSummary)
	}
	if s.Libvirt != nil {
		return libvirtSummary(s)
	}
	return s.Driver
}
