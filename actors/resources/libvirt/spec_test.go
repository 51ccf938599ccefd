package libvirt

import (
	"errors"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"understudy/actors/resources"
)

func specYAML(t *testing.T, s string) resources.Spec {
	t.Helper()
	var spec resources.Spec
	if err := yaml.Unmarshal([]byte(s), &spec); err != nil {
		t.Fatal(err)
	}
	return spec
}

func TestVMSpecValid(t *testing.T) {
	spec := specYAML(t, `
vcpus: 4
memory: 2GiB
disks:
  - {path: /var/lib/libvirt/images/db.qcow2}
  - {path: /dev/vg0/data, bus: scsi, format: raw}
nics:
  - {network: default, mac: 52:54:00:12:34:56}
  - {bridge: br0, model: e1000}
cdrom: /srv/rescue.iso
boot: [hd, cdrom]
state: shutoff
autostart: true
domain_type: qemu
`)
	s, err := parseVMSpec("db", spec)
	if err != nil {
		t.Fatal(err)
	}
	if s.vm.Name != "db" || s.vm.MemoryMiB != 2048 || s.vm.VCPUs != 4 || s.state != StateShutoff || !s.autostart || s.vm.Type != DomainQEMU {
		t.Fatalf("%+v %+v", s, s.vm)
	}
	if s.vm.NICs[0].MAC != "52:54:00:12:34:56" {
		t.Fatalf("an unquoted MAC must read as a string: %+v", s.vm.NICs[0])
	}
	for in, want := range map[any]uint64{512: 512, "512": 512, "512MiB": 512, "512M": 512, "2GiB": 2048, "2 GiB": 2048, "1TiB": 1 << 20} {
		s, err := parseVMSpec("m", resources.Spec{"memory": in, "disks": []any{map[string]any{"path": "/a"}}})
		if err != nil || s.vm.MemoryMiB != want {
			t.Errorf("memory %v: %v MiB, %v (want %d MiB)", in, s.vm.MemoryMiB, err, want)
		}
	}
	// Boot defaults to what the vm has.
	for spec, want := range map[string]string{
		`{memory: 1024, disks: [{path: /a}], cdrom: /b.iso}`:     "hd",
		`{memory: 1024, cdrom: /b.iso}`:                          "cdrom",
		`{memory: 1024, disks: [{path: /b.iso, device: cdrom}]}`: "cdrom",
		`{memory: 1024, nics: [{network: default}]}`:             "network",
	} {
		s, err := parseVMSpec("b", specYAML(t, spec))
		if err != nil || strings.Join(s.vm.Boot, " ") != want {
			t.Errorf("%s: boot %v %v, want %s", spec, s.vm.Boot, err, want)
		}
	}
}

func TestVMSpecErrors(t *testing.T) {
	for _, c := range []struct{ spec, field, rule string }{
		{`{disks: [{path: /a}]}`, "memory", "required"},
		{`{memory: 2GB, disks: [{path: /a}]}`, "memory", "must be a size such as 2GiB"},
		{`{memory: -1, disks: [{path: /a}]}`, "memory", "must be a size"},
		{`{memory: 8, disks: [{path: /a}]}`, "memory", "at least 16 MiB"},
		{`{memory: 1024, vcpus: 0, disks: [{path: /a}]}`, "vcpus", "must be 1..1024"},
		{`{memory: 1024, vcpus: two, disks: [{path: /a}]}`, "vcpus", "whole number"},
		{`{memory: 1024, disks: [{path: /a}], cpus: 2}`, "cpus", "unknown field"},
		{`{memory: 1024, disks: [{path: /a, size: 10G}]}`, "disks[0].size", "unknown field"},
		{`{memory: 1024, disks: [{path: a.img}]}`, "disks[0].path", "absolute"},
		{`{memory: 1024, disks: [{path: /a, format: vmdk}]}`, "disks[0].format", "must be one of [raw qcow2]"},
		{`{memory: 1024, disks: [{path: /a, bus: usb}]}`, "disks[0].bus", "must be one of"},
		{`{memory: 1024, disks: [{path: /a.iso, device: cdrom, bus: virtio}]}`, "disks[0].bus", "virtio"},
		{`{memory: 1024, disks: [{path: /a}, {path: /a}]}`, "disks[1].path", "is also disks[0].path"},
		{`{memory: 1024, disks: [{path: /a}], nics: [{}]}`, "nics[0].network", "give network"},
		{`{memory: 1024, disks: [{path: /a}], nics: [{network: a, bridge: b}]}`, "nics[0].bridge", "not both"},
		{`{memory: 1024, disks: [{path: /a}], nics: [{network: default, mac: "52:54:00:zz:00:01"}]}`, "nics[0].mac", "six colon-separated hex octets"},
		{`{memory: 1024, disks: [{path: /a}], nics: [{network: default, mac: "01:00:5e:00:00:01"}]}`, "nics[0].mac", "unicast"},
		{`{memory: 1024, disks: [{path: /a}], nics: [{network: default, mac: "52-54-00-00-00-01"}]}`, "nics[0].mac", "colon-separated"},
		{`{memory: 1024, disks: [{path: /a}], nics: [{network: default, mac: "52:54:00:00:00:01"}, {network: default, mac: "52:54:00:00:00:01"}]}`, "nics[1].mac", "unique"},
		{`{memory: 1024, disks: [{path: /a}], nics: [{network: default, model: ne2k}]}`, "nics[0].model", "must be one of"},
		{`{memory: 1024, disks: [{path: /a}], nics: [{bridge: "this-is-too-long-a-bridge"}]}`, "nics[0].bridge", "1 to 15 characters"},
		{`{memory: 1024, disks: [{path: /a}], boot: [floppy]}`, "boot[0]", "must be one of [hd cdrom network]"},
		{`{memory: 1024, disks: [{path: /a}], boot: [hd, hd]}`, "boot[1]", "listed twice"},
		{`{memory: 1024, disks: [{path: /a}], boot: [cdrom]}`, "boot[0]", "no cdrom"},
		{`{memory: 1024, disks: [{path: /a}], boot: [network]}`, "boot[0]", "no nic"},
		{`{memory: 1024, disks: [{path: /a}], boot: []}`, "boot", "at least one"},
		{`{memory: 1024}`, "disks", "something to boot from"},
		{`{memory: 1024, disks: [{path: /a}], state: paused}`, "state", "must be one of [running shutoff]"},
		{`{memory: 1024, disks: [{path: /a}], domain_type: xen}`, "domain_type", "must be one of [kvm qemu test]"},
		{`{memory: 1024, disks: [{path: /a}], name: "a/b"}`, "name", "letters, digits"},
		{`{memory: 1024, disks: [{path: /a}], autostart: yes please}`, "autostart", "true or false"},
		{`{memory: 1024, disks: [{path: /a}], cdrom: rescue.iso}`, "cdrom", "absolute"},
	} {
		err := (&VMReconciler{}).Validate(specYAML(t, c.spec))
		var se *resources.SpecError
		if !errors.As(err, &se) {
			t.Errorf("%s: want a *resources.SpecError, got %v", c.spec, err)
			continue
		}
		if se.Kind != KindVM || se.Field != c.field || !strings.Contains(se.Rule, c.rule) {
			t.Errorf("%s:\n got %s\nwant field %s, rule containing %q", c.spec, err, c.field, c.rule)
		}
	}
}

func TestNetworkSpecErrors(t *testing.T) {
	if err := (&NetworkReconciler{}).Validate(specYAML(t, `{bridge: virbr5, forward: nat, ip: 192.168.50.1/24, dhcp: {start: 192.168.50.10, end: 192.168.50.20}, autostart: false}`)); err != nil {
		t.Fatal(err)
	}
	if err := (&NetworkReconciler{}).Validate(resources.Spec{}); err != nil {
		t.Fatalf("an empty spec is a NAT network with libvirt's bridge and no address: %v", err)
	}
	for _, c := range []struct{ spec, field, rule string }{
		{`{mode: nat}`, "mode", "unknown field"},
		{`{forward: masquerade}`, "forward", "must be one of [nat route open bridge isolated]"},
		{`{forward: bridge}`, "bridge", "required with forward bridge"},
		{`{forward: bridge, bridge: br0, ip: 10.0.0.1/24}`, "ip", "not with forward bridge"},
		{`{ip: 10.0.0.1}`, "ip", "prefix length"},
		{`{ip: 10.0.0.0/24}`, "ip", "not the network address"},
		{`{ip: 10.0.0.1/31}`, "ip", "prefix length must be 8..30"},
		{`{dhcp: {start: 10.0.0.2, end: 10.0.0.9}}`, "dhcp", "needs ip"},
		{`{ip: 10.0.0.1/24, dhcp: {start: 10.0.1.2, end: 10.0.0.9}}`, "dhcp.start", "must lie in 10.0.0.0/24"},
		{`{ip: 10.0.0.1/24, dhcp: {start: 10.0.0.9, end: 10.0.0.2}}`, "dhcp.end", "must not come before"},
		{`{ip: 10.0.0.1/24, dhcp: {start: 10.0.0.1, end: 10.0.0.9}}`, "dhcp", "host's own address"},
		{`{ip: 10.0.0.1/24, dhcp: {start: 10.0.0.2}}`, "dhcp.end", "required"},
		{`{ip: 10.0.0.1/24, dhcp: {start: 10.0.0.2, end: 10.0.0.3, lease: 1h}}`, "dhcp.lease", "unknown field"},
		{`{bridge: "br 0"}`, "bridge", "no '/', ':' or spaces"},
		{`{name: "a b"}`, "name", "letters, digits"},
	} {
		err := (&NetworkReconciler{}).Validate(specYAML(t, c.spec))
		var se *resources.SpecError
		if !errors.As(err, &se) {
			t.Errorf("%s: want a *resources.SpecError, got %v", c.spec, err)
			continue
		}
		if se.Kind != KindNetwork || se.Field != c.field || !strings.Contains(se.Rule, c.rule) {
			t.Errorf("%s:\n got %s\nwant field %s, rule containing %q", c.spec, err, c.field, c.rule)
		}
	}
}
