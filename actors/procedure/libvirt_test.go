package procedure

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"understudy/actors"
)

const libvirtYAML = `
procedures:
  fence:
    steps:
      - {name: pg-stop, driver: exec, timeout: 1s, exec: {command: pg_ctl, args: [stop, -m, fast]}}
      - name: power-off
        driver: libvirt-destroy
        timeout: 3s
        libvirt: {uri: "qemu+ssh://root@kvm1/system", domain: pg-a}
      - driver: libvirt-link-down
        timeout: 2s
        libvirt: {domain: pg-a, mac: "52:54:00:12:34:56"}
`

func TestLibvirtSteps(t *testing.T) {
	spec, err := load(t, libvirtYAML)
	if err != nil {
		t.Fatal(err)
	}
	steps := spec.Fence.Steps
	want := []StepSpec{
		{Name: "power-off", Driver: DriverLibvirtDestroy, Timeout: 3 * time.Second, Libvirt: &LibvirtSpec{URI: "qemu+ssh://root@kvm1/system", Domain: "pg-a"}},
		{Name: "libvirt-link-down-2", Driver: DriverLibvirtLinkDown, Timeout: 2 * time.Second, Libvirt: &LibvirtSpec{Domain: "pg-a", MAC: "52:54:00:12:34:56"}},
	}
	if !reflect.DeepEqual(steps[1:], want) {
		t.Fatalf("got %+v", steps[1:])
	}
	if got := steps[2].Libvirt.ConnURI(); got != "qemu:///system" {
		t.Errorf("default URI %s", got)
	}
	if got := steps[1].Summary(); got != "libvirt-destroy pg-a (qemu+ssh://root@kvm1/system)" {
		t.Errorf("summary %q", got)
	}
	if got := steps[2].Summary(); got != "libvirt-link-down pg-a mac 52:54:00:12:34:56" {
		t.Errorf("summary %q", got)
	}
	// Round trip through YAML (the node file a pair entry is written as).
	b, err := yaml.Marshal(node{Procedures: spec})
	if err != nil {
		t.Fatal(err)
	}
	again, err := load(t, string(b))
	if err != nil || !reflect.DeepEqual(again, spec) {
		t.Fatalf("round trip: %v\n%s", err, b)
	}
}

func TestLibvirtStepErrors(t *testing.T) {
	step := func(s string) string {
		return "procedures:\n  fence:\n    steps:\n      - " + s + "\n"
	}
	for _, c := range []struct{ yaml, field, rule, value string }{
		{step(`{name: off, driver: libvirt-destroy}`), "procedures.fence.steps[0].libvirt", "must be set with driver libvirt-destroy", ""},
		{step(`{name: off, driver: libvirt-destroy, libvirt: {uri: "qemu:///system"}}`), "procedures.fence.steps[0].libvirt.domain", "must name the domain", ""},
		{step(`{name: off, driver: libvirt-destroy, libvirt: {uri: "qemu+ssh:///system", domain: pg}}`), "procedures.fence.steps[0].libvirt.uri", "the ssh transport needs a host", "qemu+ssh:///system"},
		{step(`{name: off, driver: libvirt-destroy, libvirt: {uri: "qemu:///sytem", domain: pg}}`), "procedures.fence.steps[0].libvirt.uri", "must end in /system or /session", "qemu:///sytem"},
		{step(`{name: off, driver: libvirt-destroy, libvirt: {uri: "vbox:///session", domain: pg}}`), "procedures.fence.steps[0].libvirt.uri", "must use the driver qemu", "vbox:///session"},
		{step(`{name: off, driver: libvirt-destroy, libvirt: {domain: "pg/a"}}`), "procedures.fence.steps[0].libvirt.domain", "no '/'", `"pg/a"`},
		{step(`{name: off, driver: libvirt-destroy, libvirt: {domain: pg, mac: "52:54:00:12:34:56"}}`), "procedures.fence.steps[0].libvirt.mac", "applies to driver libvirt-link-down only", "52:54:00:12:34:56"},
		{step(`{name: off, driver: libvirt-destroy, libvirt: {domain: pg}, exec: {command: x}}`), "procedures.fence.steps[0].exec", "applies to driver exec only", ""},
		{step(`{name: cut, driver: libvirt-link-down, libvirt: {domain: pg}}`), "procedures.fence.steps[0].libvirt.interface", "one of interface", ""},
		{step(`{name: cut, driver: libvirt-link-down, libvirt: {domain: pg, interface: vnet0, mac: "52:54:00:12:34:56"}}`), "procedures.fence.steps[0].libvirt.mac", "not both", "52:54:00:12:34:56"},
		{step(`{name: cut, driver: libvirt-link-down, libvirt: {domain: pg, mac: "52:54:00:12:34"}}`), "procedures.fence.steps[0].libvirt.mac", "six colon-separated hex octets", "52:54:00:12:34"},
		{step(`{name: cut, driver: libvirt-link-down, libvirt: {domain: pg, interface: "vnet 0"}}`), "procedures.fence.steps[0].libvirt.interface", "host-side device name", "vnet 0"},
		{step(`{name: stop, driver: exec, exec: {command: pg_ctl}, libvirt: {domain: pg}}`), "procedures.fence.steps[0].libvirt", "applies to the libvirt drivers only", ""},
	} {
		_, err := load(t, c.yaml)
		var ce *actors.ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("%s: want a ConfigError, got %v", c.yaml, err)
			continue
		}
		if ce.Field != c.field || !strings.Contains(ce.Rule, c.rule) || ce.Value != c.value {
			t.Errorf("%s\n got %s (value %q)\nwant field %s, rule containing %q, value %q", c.yaml, err, ce.Value, c.field, c.rule, c.value)
		}
	}
	// A misspelt key inside libvirt is refused by the decoder.
	if _, err := load(t, step(`{name: off, driver: libvirt-destroy, libvirt: {domian: pg}}`)); err == nil || !strings.Contains(err.Error(), "domian") {
		t.Fatalf("unknown key: %v", err)
	}
}
