package libvirt

import (
	"encoding/xml"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

func fullVM() *VM {
	return NewVM("db-1").
		WithType(DomainKVM).
		WithVCPUs(4).
		WithMemoryMiB(4096).
		WithDisk(Disk{Path: "/var/lib/libvirt/images/db-1.qcow2"}).
		WithDisk(Disk{Path: "/dev/vg0/pgdata", Bus: "scsi"}).
		WithDisk(Disk{Path: "/srv/seed.iso", Device: "cdrom"}).
		WithNIC(NIC{Network: "default", MAC: "52:54:00:AA:BB:01"}).
		WithNIC(NIC{Bridge: "br0", Model: "e1000"}).
		WithCDROM("/srv/install & rescue.iso").
		WithBoot(BootCDROM, BootHD, BootNetwork)
}

func TestDomainXMLGolden(t *testing.T) {
	x, err := fullVM().DomainXML()
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "vm-db-1.xml", x)
}

func TestDomainXMLStructure(t *testing.T) {
	x, err := fullVM().DomainXML()
	if err != nil {
		t.Fatal(err)
	}
	d, err := parseDomain(x)
	if err != nil {
		t.Fatal(err)
	}
	def := definitionOf(d)
	want := definition{
		Type: "kvm", VCPUs: 4, MemoryKiB: 4096 * 1024,
		Disks: []string{
			"/var/lib/libvirt/images/db-1.qcow2 (disk, virtio, qcow2)",
			"/dev/vg0/pgdata (disk, scsi, raw)",
			"/srv/seed.iso (cdrom, sata, raw)",
			"/srv/install & rescue.iso (cdrom, sata, raw)",
		},
		NICs: []nicDef{
			{Source: "network default", Model: "virtio", MAC: "52:54:00:aa:bb:01", Link: "up"},
			{Source: "bridge br0", Model: "e1000", Link: "up"},
		},
		Boot: []string{"cdrom", "hd", "network"},
	}
	if !reflect.DeepEqual(def, want) {
		t.Fatalf("the rendered XML reads back as\n%+v\nwant\n%+v", def, want)
	}
	if diff := want.diff(def); len(diff) != 0 {
		t.Fatalf("a definition differs from itself: %v", diff)
	}
	targets := []string{}
	for _, dk := range d.Devices.Disks {
		targets = append(targets, dk.Target.Dev)
	}
	if got := strings.Join(targets, " "); got != "vda sda sdb sdc" {
		t.Errorf("disk targets %s, want vda sda sdb sdc (scsi and sata share sd*)", got)
	}
	if d.Devices.Disks[1].Type != "block" || d.Devices.Disks[1].Source.Dev != "/dev/vg0/pgdata" {
		t.Errorf("a /dev path must be a block disk: %+v", d.Devices.Disks[1])
	}
	if d.Devices.Disks[2].ReadOnly == nil || d.Devices.Disks[3].ReadOnly == nil {
		t.Error("CD-ROMs must be read-only")
	}
	if !strings.Contains(x, "install &amp; rescue.iso") {
		t.Error("a path's & must be escaped in the XML")
	}
	if d.Features == nil || d.Features.ACPI == nil {
		t.Error("ACPI must be on: a graceful shutdown needs it")
	}
}

func TestDiskLetters(t *testing.T) {
	for i, want := range map[int]string{0: "a", 25: "z", 26: "aa", 27: "ab", 51: "az", 52: "ba", 701: "zz", 702: "aaa"} {
		if got := diskLetters(i); got != want {
			t.Errorf("diskLetters(%d) = %s, want %s", i, got, want)
		}
	}
}

func TestDefinitionDiff(t *testing.T) {
	want := definitionOf(NewVM("a").WithVCPUs(4).WithMemoryMiB(2048).WithDisk(Disk{Path: "/a.img"}).WithNIC(NIC{Network: "default"}).domain())
	have := definitionOf(NewVM("a").WithVCPUs(2).WithMemoryMiB(2048).WithDisk(Disk{Path: "/a.img"}).WithNIC(NIC{Network: "default", MAC: "52:54:00:00:00:09"}).domain())
	got := strings.Join(want.diff(have), "; ")
	if got != "vcpus 2 → 4" {
		t.Fatalf("diff %q, want only vcpus 2 → 4 (a NIC without a MAC in the spec matches any MAC)", got)
	}
	have.MemoryKiB = 1024 * 1024
	have.Boot = []string{"network"}
	got = strings.Join(want.diff(have), "; ")
	for _, w := range []string{"vcpus 2 → 4", "memory 1024 MiB → 2048 MiB", "boot [network] → [hd]"} {
		contains(t, "diff", got, w)
	}
}

func TestNetworkXMLGolden(t *testing.T) {
	for _, c := range []struct {
		file string
		net  *Network
	}{
		{"network-nat.xml", NewNetwork("lab").WithBridge("virbr9").WithIP(netip.MustParsePrefix("192.168.100.1/24")).
			WithDHCP(netip.MustParseAddr("192.168.100.10"), netip.MustParseAddr("192.168.100.99"))},
		{"network-bridge.xml", NewNetwork("lan").WithForward(ForwardBridge).WithBridge("br0")},
		{"network-isolated-v6.xml", NewNetwork("iso6").WithForward(ForwardIsolated).WithIP(netip.MustParsePrefix("fd00:1::1/64"))},
	} {
		x, err := c.net.NetworkXML()
		if err != nil {
			t.Fatalf("%s: %v", c.file, err)
		}
		golden(t, c.file, x)
		var n networkXML
		if err := xml.Unmarshal([]byte(x), &n); err != nil {
			t.Fatal(err)
		}
		if d := netDefinitionOf(c.net.network()).diff(netDefinitionOf(n)); len(d) > 0 {
			t.Errorf("%s reads back differently: %v", c.file, d)
		}
	}
}

func TestNetDefinitionNetmask(t *testing.T) {
	// libvirt may report netmask instead of prefix, and no mode for nat.
	n, err := parseNetwork(`<network><name>x</name><forward/><bridge name='virbr0'/><ip address='10.1.2.1' netmask='255.255.254.0'/></network>`)
	if err != nil {
		t.Fatal(err)
	}
	d := netDefinitionOf(n)
	if d.IP != "10.1.2.1/23" || d.Forward != ForwardNAT {
		t.Fatalf("%+v", d)
	}
}

func TestLinkStateRewrite(t *testing.T) {
	dom := `<domain><devices>
  <interface type='network'>
    <mac address='52:54:00:00:00:01'/>
    <source network='default'/>
    <target dev='vnet3'/>
    <model type='virtio'/>
  </interface>
  <interface type='bridge' trustGuestRxFilters='no'>
    <mac address='52:54:00:00:00:02'/>
    <source bridge='br0'/>
    <target dev='vnet4'/>
    <link state='up'/>
  </interface>
</devices></domain>`
	raw, st, err := FindInterface(dom, NICRef{MAC: "52:54:00:00:00:02"})
	if err != nil {
		t.Fatal(err)
	}
	if st.Target != "vnet4" || st.Link != "up" || st.Source != "bridge br0" {
		t.Fatalf("%+v", st)
	}
	down := WithLinkState(raw, "down")
	var back rawInterface
	if err := xml.Unmarshal([]byte(down), &back); err != nil {
		t.Fatalf("%v:\n%s", err, down)
	}
	if back.Link == nil || back.Link.State != "down" || strings.Count(down, "<link") != 1 || back.MAC.Address != "52:54:00:00:00:02" {
		t.Fatalf("rewritten element:\n%s", down)
	}
	contains(t, "attributes kept", down, "trustGuestRxFilters='no'")
	if _, st, err := FindInterface(dom, NICRef{Target: "vnet3"}); err != nil || st.MAC != "52:54:00:00:00:01" || st.Link != "up" {
		t.Fatalf("by target: %+v %v", st, err)
	}
	_, _, err = FindInterface(dom, NICRef{MAC: "52:54:00:00:00:09"})
	if err == nil {
		t.Fatal("an unknown MAC must be an error")
	}
	contains(t, "unknown MAC", err.Error(), "mac 52:54:00:00:00:01 interface vnet3")
}
