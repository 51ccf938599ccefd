package vm

import (
	"strconv"
	"strings"
	"time"

	"understudy/actors"
	"understudy/actors/resources/libvirt/rules"
)

// Defaults of the fields a Config leaves out (or leaves zero in Go).
const (
	// DefaultShutdownTimeout is how long Demote waits for the guest to
	// power off after the ACPI request before it destroys the domain.
	DefaultShutdownTimeout = 30 * time.Second
	// DefaultFenceTimeout bounds one destroy (Fence, and the destroys of
	// Demote and Rejoin). libvirt's QEMU driver sends QEMU SIGTERM, which
	// ends a healthy one within a second; one stuck on hung storage gets
	// SIGKILL only after about 10 s, and a fence that waited for that
	// would exceed any reasonable fence_grace: it fails instead.
	DefaultFenceTimeout = 5 * time.Second
)

// Config is the node file's `vm:` section of a pair member: which domain
// on which libvirt is the member's workload. Decode it from YAML (the
// durations are Go duration strings, such as "30s", defaults filled in),
// then Validate it once, at load.
type Config struct {
	// URI is the libvirt connection URI; rules.DefaultURI (qemu:///system)
	// when empty, as for the libvirt fence steps.
	URI string `yaml:"uri,omitempty"`
	// Domain is the domain's name (or UUID), as virsh list shows it.
	Domain string `yaml:"domain"`
	// ShutdownTimeout bounds Demote's graceful shutdown (yaml
	// shutdown_timeout); zero means DefaultShutdownTimeout.
	ShutdownTimeout time.Duration `yaml:"-"`
	// FenceTimeout bounds each destroy (yaml fence_timeout); zero means
	// DefaultFenceTimeout. FenceBudget reports it: the pair's fence_grace
	// must cover it.
	FenceTimeout time.Duration `yaml:"-"`

	// The YAML texts of durations that did not parse, or were not
	// positive; Validate reports them.
	badShutdown, badFence string
}

// configYAML is Config as written in YAML: yaml.v3 does not decode
// duration strings into a time.Duration.
type configYAML struct {
	URI             string  `yaml:"uri,omitempty"`
	Domain          string  `yaml:"domain"`
	ShutdownTimeout *string `yaml:"shutdown_timeout,omitempty"`
	FenceTimeout    *string `yaml:"fence_timeout,omitempty"`
}

// UnmarshalYAML reads the durations, filling in the defaults of those
// omitted. It uses the older callback form on purpose, as
// procedure.StepSpec does: yaml.v3 then decodes with the caller's decoder,
// so Decoder.KnownFields still rejects misspelled keys.
func (c *Config) UnmarshalYAML(unmarshal func(any) error) error {
	var y configYAML
	if err := unmarshal(&y); err != nil {
		return err
	}
	*c = Config{URI: y.URI, Domain: y.Domain}
	c.ShutdownTimeout, c.badShutdown = parseDuration(y.ShutdownTimeout, DefaultShutdownTimeout)
	c.FenceTimeout, c.badFence = parseDuration(y.FenceTimeout, DefaultFenceTimeout)
	return nil
}

// parseDuration reads a duration field: def when absent, bad (the text)
// when it does not parse or is not positive.
func parseDuration(text *string, def time.Duration) (d time.Duration, bad string) {
	if text == nil {
		return def, ""
	}
	d, err := time.ParseDuration(strings.TrimSpace(*text))
	if err != nil || d <= 0 {
		return 0, *text
	}
	return d, ""
}

// MarshalYAML writes the durations back as duration strings, defaults
// filled in.
func (c Config) MarshalYAML() (any, error) {
	c = c.withDefaults()
	st, ft := c.ShutdownTimeout.String(), c.FenceTimeout.String()
	return configYAML{URI: c.URI, Domain: c.Domain, ShutdownTimeout: &st, FenceTimeout: &ft}, nil
}

// Validate returns a *actors.ConfigError naming the first field that
// breaks a rule, as a path from field (the section's own path, such as
// "pairs[0].vm").
func (c *Config) Validate(field string) error {
	bad := func(name, rule, value string) error {
		return &actors.ConfigError{Field: field + "." + name, Rule: rule, Value: value}
	}
	if c.URI != "" {
		if rule := rules.URI(c.URI); rule != "" {
			return bad("uri", rule, c.URI)
		}
	}
	if c.Domain == "" {
		return bad("domain", "must name the domain the pair runs (its libvirt name or UUID, as virsh list shows it)", "")
	}
	if strings.TrimSpace(c.Domain) != c.Domain || strings.ContainsAny(c.Domain, "/\x00") {
		return bad("domain", "must be a libvirt domain name or UUID: no surrounding spaces, no '/'", strconv.Quote(c.Domain))
	}
	for _, d := range []struct {
		name, text string
		value, def time.Duration
	}{
		{"shutdown_timeout", c.badShutdown, c.ShutdownTimeout, DefaultShutdownTimeout},
		{"fence_timeout", c.badFence, c.FenceTimeout, DefaultFenceTimeout},
	} {
		switch {
		case d.text != "":
			return bad(d.name, `must be a positive Go duration with a unit, such as "10s" (omit it for the default `+d.def.String()+")", strconv.Quote(d.text))
		case d.value < 0:
			return bad(d.name, "must be a positive duration (omit it for the default "+d.def.String()+")", d.value.String())
		}
	}
	return nil
}

// ConnURI is the URI to connect to: URI, or rules.DefaultURI.
func (c Config) ConnURI() string {
	if c.URI == "" {
		return rules.DefaultURI
	}
	return c.URI
}

// withDefaults fills in the zero durations.
func (c Config) withDefaults() Config {
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.FenceTimeout == 0 {
		c.FenceTimeout = DefaultFenceTimeout
	}
	return c
}
