package agent

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"

	"github.com/vmihailenco/msgpack/v5"
	"gopkg.in/yaml.v3"

	"understudy/actors/resources"
)

// Manifest is an agent's desired state: what an operator applies
// (`understudy apply`), stored at desired-state.<agent> in the fleet bucket
// (msgpack). Generation is set by apply: one more than the stored one.
type Manifest struct {
	Agent      string     `yaml:"agent" msgpack:"agent" json:"agent"`
	Generation uint64     `yaml:"generation,omitempty" msgpack:"gen" json:"generation"`
	Resources  []Resource `yaml:"resources" msgpack:"res" json:"resources"`
}

// Resource is one managed resource of a manifest. Spec is kind-specific
// and checked by the kind's reconciler.
type Resource struct {
	ID   string         `yaml:"id" msgpack:"id" json:"id"`
	Kind string         `yaml:"kind" msgpack:"kind" json:"kind"`
	Spec resources.Spec `yaml:"spec" msgpack:"spec" json:"spec"`
}

// Limits of a manifest.
const (
	MaxResources = 1000
	MaxIDLen     = 64
)

var idRule = regexp.MustCompile(`^[a-z0-9]([a-z0-9_-]*[a-z0-9])?$`)

// CheckID returns the rule an agent or resource ID breaks ("": none): it
// is a NATS subject token and a KV key token.
func CheckID(id string) string {
	if !idRule.MatchString(id) || len(id) > MaxIDLen {
		return fmt.Sprintf("must be lower-case letters, digits, - and _, at most %d characters", MaxIDLen)
	}
	return ""
}

// ManifestError names the field of a manifest that breaks a rule.
type ManifestError struct {
	Field string // "resources[2].id"
	Rule  string
}

func (e *ManifestError) Error() string { return "manifest: " + e.Field + ": " + e.Rule }

// ParseManifestYAML decodes a manifest file, refusing unknown fields.
func ParseManifestYAML(data []byte) (Manifest, error) {
	var m Manifest
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&m); err != nil {
		return Manifest{}, fmt.Errorf("manifest: %w", err)
	}
	return m, nil
}

// Validate checks the manifest's shape, and each resource's spec with its
// kind's reconciler when reg knows the kind. A kind reg does not know is
// not an error here unless strict: an agent keeps such a resource and
// reports it as UnknownResource, and the rest still converge. Resources of
// a kind whose reconciler is resources.Named must not manage one thing
// (two vm resources naming one libvirt domain).
func (m Manifest) Validate(reg resources.Registry, strict bool) error {
	specs, shape := m.Check(reg, strict)
	if shape != nil {
		return shape
	}
	for i := range m.Resources {
		if err := specs[i]; err != nil {
			return err
		}
	}
	return nil
}

// Check is Validate in two parts: the manifest's own rules (agent, ids,
// kinds, two resources managing one thing), which refuse it whole, and
// the spec errors of single resources by index, which an agent reports
// on those resources while the rest converge. A kind's Validate that
// panics gives a spec error.
func (m Manifest) Check(reg resources.Registry, strict bool) (specs map[int]error, shape error) {
	if m.Agent == "" {
		return nil, &ManifestError{"agent", "required"}
	}
	if rule := CheckID(m.Agent); rule != "" {
		return nil, &ManifestError{"agent", rule + " (got " + m.Agent + ")"}
	}
	if len(m.Resources) > MaxResources {
		return nil, &ManifestError{"resources", fmt.Sprintf("at most %d (got %d)", MaxResources, len(m.Resources))}
	}
	specs = map[int]error{}
	seen := map[string]int{}
	named := map[[2]string]int{} // kind, identity → index
	for i, r := range m.Resources {
		f := func(name string) string { return fmt.Sprintf("resources[%d].%s", i, name) }
		switch {
		case r.ID == "":
			return nil, &ManifestError{f("id"), "required"}
		case CheckID(r.ID) != "":
			return nil, &ManifestError{f("id"), CheckID(r.ID) + " (got " + r.ID + ")"}
		case r.Kind == "":
			return nil, &ManifestError{f("kind"), "required"}
		}
		if j, dup := seen[r.ID]; dup {
			return nil, &ManifestError{f("id"), fmt.Sprintf("%s is also resources[%d].id: ids must be unique", r.ID, j)}
		}
		seen[r.ID] = i
		rec, err := reg.Get(r.Kind)
		if err != nil {
			if strict {
				return nil, &ManifestError{f("kind"), fmt.Sprintf("unknown kind %s (known: %v)", r.Kind, reg.Kinds())}
			}
			continue
		}
		if err := validateSpec(rec, r.Spec); err != nil {
			specs[i] = &ManifestError{f("spec"), err.Error()}
			continue
		}
		if n, ok := rec.(resources.Named); ok {
			key := [2]string{r.Kind, n.Identity(r.ID, r.Spec)}
			if key[1] == "" {
				continue
			}
			if j, dup := named[key]; dup {
				return nil, &ManifestError{f("spec"), fmt.Sprintf("%s manages %s, as resources[%d] (%s) does: two resources cannot manage one thing; give one of them another name", r.ID, key[1], j, m.Resources[j].ID)}
			}
			named[key] = i
		}
	}
	return specs, nil
}

// validateSpec is rec.Validate, with a panic turned into an error.
func validateSpec(rec resources.Reconciler, spec resources.Spec) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("the %s kind's validation panicked: %v", rec.Kind(), p)
		}
	}()
	return rec.Validate(spec)
}

// EncodeManifest and DecodeManifest are the wire form (msgpack). A manifest
// the agent would refuse to decode (ManifestLimits) is refused here.
func EncodeManifest(m Manifest) ([]byte, error) {
	b, err := msgpack.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("manifest: %w", err)
	}
	if err := CheckWire(b, ManifestLimits); err != nil {
		return nil, fmt.Errorf("manifest: too large for an agent to read (at most %d bytes, %d levels of nesting, %d values): %w",
			ManifestLimits.Bytes, ManifestLimits.Depth, ManifestLimits.Values, err)
	}
	return b, nil
}

// DecodeManifest decodes a stored manifest. b is untrusted: it is checked
// against ManifestLimits before msgpack sees it (CheckWire), and a value
// that still does not decode gives an error, never a panic. It does not
// keep b.
func DecodeManifest(b []byte) (Manifest, error) {
	m, err := decodeBounded[Manifest](b, ManifestLimits, "manifest")
	if err != nil {
		return Manifest{}, err
	}
	for i := range m.Resources {
		m.Resources[i].Spec = normalize(m.Resources[i].Spec)
	}
	return m, nil
}

// normalize turns msgpack's decoded maps and integers into the shapes YAML
// gives (map[string]any, int), so that a spec reads the same either way.
func normalize(s resources.Spec) resources.Spec {
	if s == nil {
		return nil
	}
	out := make(resources.Spec, len(s))
	for k, v := range s {
		out[k] = normValue(v)
	}
	return out
}

func normValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		return normalize(x)
	case map[any]any:
		m := make(map[string]any, len(x))
		for k, vv := range x {
			m[fmt.Sprint(k)] = normValue(vv)
		}
		return m
	case []any:
		out := make([]any, len(x))
		for i := range x {
			out[i] = normValue(x[i])
		}
		return out
	case int8:
		return int(x)
	case int16:
		return int(x)
	case int32:
		return int(x)
	case int64:
		return int(x)
	case uint8:
		return int(x)
	case uint16:
		return int(x)
	case uint32:
		return int(x)
	case uint64:
		return int(x)
	}
	return v
}

// SpecKey is a stable digest of a resource's kind and spec: an update is a
// change of it.
func SpecKey(r Resource) string {
	b, err := msgpack.Marshal(sortedSpec{r.Kind, r.Spec})
	if err != nil {
		return r.Kind + fmt.Sprint(r.Spec)
	}
	return string(b)
}

type sortedSpec struct {
	Kind string
	Spec resources.Spec
}

// EncodeMsgpack sorts map keys so that SpecKey is stable.
func (s sortedSpec) EncodeMsgpack(enc *msgpack.Encoder) error {
	enc.SetSortMapKeys(true)
	return enc.EncodeMulti(s.Kind, s.Spec)
}

// Diff compares a manifest with the resources an agent runs (id → SpecKey)
// and returns what to start, update and stop, each in manifest order (stop:
// sorted).
func Diff(running map[string]string, m Manifest) (start, update []Resource, stop []string) {
	want := map[string]bool{}
	for _, r := range m.Resources {
		want[r.ID] = true
		key, ok := running[r.ID]
		switch {
		case !ok:
			start = append(start, r)
		case key != SpecKey(r):
			update = append(update, r)
		}
	}
	for id := range running {
		if !want[id] {
			stop = append(stop, id)
		}
	}
	slices.Sort(stop)
	return start, update, stop
}
