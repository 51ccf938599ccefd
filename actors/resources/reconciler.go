package resources

import (
	"context"
	"errors"
	"fmt"
	"sort"
)

// Spec is a resource's desired state as written in the manifest: the
// decoded YAML or msgpack map. Each kind decodes it into its own typed spec
// (Validate) and refuses unknown fields.
type Spec = map[string]any

// Observation is what a reconciler saw of one resource.
type Observation struct {
	// InSync reports that the resource matches its spec.
	InSync bool `msgpack:"in_sync" json:"in_sync"`
	// Drift says what differs when InSync is false ("content changed",
	// "domain not running"); empty when in sync.
	Drift string `msgpack:"drift,omitempty" json:"drift,omitempty"`
	// Details are kind-specific facts for status ("pid": "123",
	// "state": "running", "sha256": "...").
	Details map[string]string `msgpack:"details,omitempty" json:"details,omitempty"`
}

// Reconciler manages one kind of resource. Every method is idempotent by
// contract: calling Reconcile on a resource in sync changes nothing, and
// Delete on a resource that does not exist succeeds.
type Reconciler interface {
	// Kind is the manifest's kind name ("file", "vm").
	Kind() string
	// Validate decodes and checks a spec without touching the system. It
	// returns a *SpecError naming the field and the rule.
	Validate(spec Spec) error
	// Observe reports the resource's current state against spec.
	Observe(ctx context.Context, id string, spec Spec) (Observation, error)
	// Reconcile brings the resource to spec and reports what it then sees.
	Reconcile(ctx context.Context, id string, spec Spec) (Observation, error)
	// Delete removes what Reconcile created for id (spec is the last one
	// applied).
	Delete(ctx context.Context, id string, spec Spec) error
}

// Named is implemented by a Reconciler whose resources manage something
// with a name of its own in the system it manages (a libvirt domain): two
// resources of one manifest naming the same thing would fight over it, so
// the manifest refuses them (agent.Manifest.Validate). Optional.
type Named interface {
	// Identity is what resource id with spec manages, as a phrase that
	// names it ("domain web"); equal phrases of one kind are one thing.
	// "" for a spec Validate refuses. It touches nothing.
	Identity(id string, spec Spec) string
}

// SpecError names the spec field that breaks a rule.
type SpecError struct {
	Kind  string
	Field string // dotted path inside spec, e.g. "disks[0].path"
	Rule  string
}

func (e *SpecError) Error() string {
	return fmt.Sprintf("%s spec: %s: %s", e.Kind, e.Field, e.Rule)
}

// ErrUnknownKind is returned by Registry.Get for a kind with no reconciler.
var ErrUnknownKind = errors.New("unknown resource kind")

// Registry maps kind names to reconcilers.
type Registry map[string]Reconciler

// Register adds r under its Kind.
func (r Registry) Register(rec Reconciler) { r[rec.Kind()] = rec }

// Get returns the reconciler of kind, or ErrUnknownKind.
func (r Registry) Get(kind string) (Reconciler, error) {
	rec, ok := r[kind]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownKind, kind)
	}
	return rec, nil
}

// Kinds lists the registered kinds, sorted.
func (r Registry) Kinds() []string {
	out := make([]string, 0, len(r))
	for k := range r {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
