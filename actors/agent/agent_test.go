package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	"understudy/actors/resources"
)

func TestDiff(t *testing.T) {
	a := Resource{ID: "a", Kind: "file", Spec: map[string]any{"path": "/a", "content": "1"}}
	b := Resource{ID: "b", Kind: "file", Spec: map[string]any{"path": "/b", "content": "1"}}
	c := Resource{ID: "c", Kind: "file", Spec: map[string]any{"path": "/c", "content": "1"}}
	b2 := Resource{ID: "b", Kind: "file", Spec: map[string]any{"path": "/b", "content": "2"}}
	running := map[string]string{"a": SpecKey(a), "b": SpecKey(b), "z": "old", "y": "old"}
	start, update, stop := Diff(running, Manifest{Resources: []Resource{c, b2, a}})
	if len(start) != 1 || start[0].ID != "c" || len(update) != 1 || update[0].ID != "b" || strings.Join(stop, ",") != "y,z" {
		t.Errorf("start %v update %v stop %v", start, update, stop)
	}
}

// A spec reads the same from YAML and from its msgpack wire form: the
// agent must not see an update where there is none.
func TestSpecKeySurvivesTheWire(t *testing.T) {
	m, err := ParseManifestYAML([]byte(`agent: n1
resources:
  - id: svc
    kind: process
    spec: {command: sleep, args: ["60"], env: {B: "2", A: "1"}, init: [{name: x, command: "true", timeout: 5}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := EncodeManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeManifest(b)
	if err != nil {
		t.Fatal(err)
	}
	if SpecKey(back.Resources[0]) != SpecKey(m.Resources[0]) {
		t.Errorf("spec key changed on the wire:\n%#v\n%#v", m.Resources[0].Spec, back.Resources[0].Spec)
	}
	if err := back.Validate(resources.Registry{"process": resources.NewProcess()}, true); err != nil {
		t.Errorf("the decoded spec no longer validates: %v", err)
	}
}

func TestValidate(t *testing.T) {
	reg := resources.Registry{"file": &resources.File{}}
	for _, tc := range []struct {
		yaml, want string
		strict     bool
	}{
		{"agent: n1\nresources: [{id: a, kind: gizmo}]", "", false},
		{"agent: n1\nresources: [{id: a, kind: gizmo}]", "resources[0].kind: unknown kind gizmo", true},
		{"agent: n1\nresources: [{id: A, kind: file}]", "resources[0].id: must be lower-case", false},
		{"agent: n1\nresources: [{id: a, kind: file, spec: {path: /a, content: x}}, {id: a, kind: file}]", "resources[1].id: a is also resources[0].id", false},
		{"agent: n1\nresources: [{id: a, kind: file, spec: {path: /a, content: x, mode: \"4755\"}}]", "mode: must be octal permission bits", false},
		{"resources: []", "manifest: agent: required", false},
	} {
		m, err := ParseManifestYAML([]byte(tc.yaml))
		if err != nil {
			t.Fatal(err)
		}
		err = m.Validate(reg, tc.strict)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s (strict %v): %v, want %q", tc.yaml, tc.strict, err, tc.want)
		}
	}
	if _, err := ParseManifestYAML([]byte("agent: n1\nresorces: []")); err == nil || !strings.Contains(err.Error(), "resorces") {
		t.Errorf("unknown manifest field: %v", err)
	}
}

// namedKind is a kind whose resources manage a thing named by the spec's
// name, else by their id (as libvirt's vm and network kinds).
type namedKind struct{ kind string }

func (k namedKind) Kind() string                { return k.kind }
func (namedKind) Validate(resources.Spec) error { return nil }
func (namedKind) Observe(context.Context, string, resources.Spec) (resources.Observation, error) {
	return resources.Observation{}, nil
}
func (namedKind) Reconcile(context.Context, string, resources.Spec) (resources.Observation, error) {
	return resources.Observation{}, nil
}
func (namedKind) Delete(context.Context, string, resources.Spec) error { return nil }
func (k namedKind) Identity(id string, spec resources.Spec) string {
	if n, ok := spec["name"].(string); ok {
		id = n
	}
	return k.kind + " " + id
}

// Two resources of one kind managing one thing are refused; the same name
// in two kinds is two things.
func TestValidateRefusesTwoResourcesManagingOneThing(t *testing.T) {
	reg := resources.Registry{"vm": namedKind{"vm"}, "network": namedKind{"network"}}
	m, err := ParseManifestYAML([]byte("agent: n1\nresources:\n  - {id: web, kind: vm}\n  - {id: lab, kind: network}\n  - {id: web2, kind: vm, spec: {name: web}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	err = m.Validate(reg, true)
	if err == nil || err.Error() != "manifest: resources[2].spec: web2 manages vm web, as resources[0] (web) does: two resources cannot manage one thing; give one of them another name" {
		t.Fatalf("%v", err)
	}
	m.Resources[2].Spec = map[string]any{"name": "lab"}
	if err := m.Validate(reg, true); err != nil {
		t.Fatalf("a vm and a network of one name: %v", err)
	}
}

func TestBackoff(t *testing.T) {
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 10 * time.Second, 10 * time.Second}
	for i, w := range want {
		if got := Backoff(i+1, time.Second, 10*time.Second); got != w {
			t.Errorf("Backoff(%d) = %v, want %v", i+1, got, w)
		}
	}
}

func TestStatusConvergedAndSettled(t *testing.T) {
	s := Status{ManifestGeneration: 2, ObservedGeneration: 2, Resources: map[string]ResourceStatus{
		"a": {Phase: Ready, Generation: 2}, "b": {Phase: Ready, Generation: 2}}}
	if !s.Converged() || !s.Settled() {
		t.Fatal("all ready: converged and settled")
	}
	s.Resources["b"] = ResourceStatus{Phase: UnknownResource, Generation: 2}
	if s.Converged() || !s.Settled() {
		t.Error("an unknown kind: settled, not converged")
	}
	s.Resources["b"] = ResourceStatus{Phase: Ready, Generation: 1}
	if s.Converged() || s.Settled() {
		t.Error("a resource of an older generation: neither")
	}
}

// Finding: two file resources of one path were accepted and fought over
// it (both Ready). They are refused, naming both ids.
func TestValidateRefusesTwoFilesOfOnePath(t *testing.T) {
	reg := resources.Registry{"file": &resources.File{}}
	m, err := ParseManifestYAML([]byte("agent: n1\nresources:\n  - {id: motd, kind: file, spec: {path: /etc/motd, content: a}}\n  - {id: banner, kind: file, spec: {path: /etc/motd, content: b}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	err = m.Validate(reg, true)
	if err == nil || err.Error() != "manifest: resources[1].spec: banner manages file /etc/motd, as resources[0] (motd) does: two resources cannot manage one thing; give one of them another name" {
		t.Fatalf("%v", err)
	}
}
