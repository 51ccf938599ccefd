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

// xmlTree is an element as a comparable value: name, attributes,
// children, text (whitespace between elements dropped).
type xmlTree struct {
	Name  string
	Attrs map[string]string
	Kids  []xmlTree
	Text  string
}

func parseTree(t *testing.T, s string) xmlTree {
	t.Helper()
	dec := xml.NewDecoder(strings.NewReader(s))
	var stack []*xmlTree
	var root xmlTree
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		switch e := tok.(type) {
		case xml.StartElement:
			n := xmlTree{Name: e.Name.Local, Attrs: map[string]string{}}
			for _, a := range e.Attr {
				n.Attrs[a.Name.Local] = a.Value
			}
			stack = append(stack, &n)
		case xml.EndElement:
			n := *stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if len(stack) == 0 {
				root = n
			} else {
				p := stack[len(stack)-1]
				p.Kids = append(p.Kids, n)
			}
		case xml.CharData:
			if len(stack) > 0 {
				stack[len(stack)-1].Text += strings.TrimSpace(string(e))
			}
		}
	}
	if root.Name == "" {
		t.Fatalf("no element in %q", s)
	}
	return root
}

// without is n without its children named name.
func (n xmlTree) without(name string) xmlTree {
	out := n
	out.Kids = nil
	for _, k := range n.Kids {
		if k.Name != name {
			out.Kids = append(out.Kids, k)
		}
	}
	return out
}

// A running QEMU domain's interfaces as virsh dumpxml shows them.
const liveInterfaces = `<domain type='kvm' id='3'><devices>
  <interface type='network'>
    <mac address='52:54:00:10:00:01'/>
    <source network='lab' portid='5d2c8f3e-1a7b-4c55-9d0e-2f6b8a1c3e47' bridge='virbr10'/>
    <target dev='vnet3'/>
    <model type='virtio'/>
    <alias name='net0'/>
    <address type='pci' domain='0x0000' bus='0x01' slot='0x00' function='0x0'/>
  </interface>
  <interface type='bridge' trustGuestRxFilters='no'>
    <mac address='52:54:00:10:00:02'/>
    <source bridge='br0'/>
    <target dev='vnet4'/>
    <model type='e1000'/>
    <link state='up'/>
    <alias name='net1'/>
    <address type='pci' domain='0x0000' bus='0x02' slot='0x00' function='0x0'/>
  </interface>
</devices></domain>`

// The <interface> handed to virDomainUpdateDeviceFlags is the live one
// with only its link state changed: every attribute (type above all: one
// missing reads as type user, a change QEMU refuses) and every child kept.
func TestLinkStateRewrite(t *testing.T) {
	live := parseTree(t, liveInterfaces).Kids[0].Kids
	for i, ref := range []NICRef{{MAC: "52:54:00:10:00:01"}, {Target: "vnet4"}} {
		raw, st, err := FindInterface(liveInterfaces, ref)
		if err != nil {
			t.Fatal(err)
		}
		want := []NICStatus{
			{MAC: "52:54:00:10:00:01", Target: "vnet3", Source: "network lab", Link: "up"},
			{MAC: "52:54:00:10:00:02", Target: "vnet4", Source: "bridge br0", Link: "up"},
		}[i]
		if st != want {
			t.Fatalf("%s: %+v, want %+v", ref, st, want)
		}
		down := parseTree(t, WithLinkState(raw, "down"))
		orig := live[i]
		if !reflect.DeepEqual(down.without("link"), orig.without("link")) {
			t.Fatalf("%s: the rewritten element differs from the live one beyond its link:\n got %+v\nwant %+v", ref, down.without("link"), orig.without("link"))
		}
		if down.Attrs["type"] != orig.Attrs["type"] || down.Attrs["type"] == "" {
			t.Fatalf("%s: type %q, want %q", ref, down.Attrs["type"], orig.Attrs["type"])
		}
		var links []xmlTree
		for _, k := range down.Kids {
			if k.Name == "link" {
				links = append(links, k)
			}
		}
		if len(links) != 1 || !reflect.DeepEqual(links[0].Attrs, map[string]string{"state": "down"}) {
			t.Fatalf("%s: links %+v, want one, down", ref, links)
		}
	}
	_, _, err := FindInterface(liveInterfaces, NICRef{MAC: "52:54:00:00:00:09"})
	if err == nil {
		t.Fatal("an unknown MAC must be an error")
	}
	contains(t, "unknown MAC", err.Error(), "mac 52:54:00:10:00:01 interface vnet3")
}
