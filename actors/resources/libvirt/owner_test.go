package libvirt

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"understudy/actors/resources"
)

func TestOwnerMarkerRendersAndReadsBack(t *testing.T) {
	o := Owner{Agent: "n1", ID: "web"}
	x, err := NewVM("web").WithOwner(o).WithDisk(Disk{Path: "/w.img"}).DomainXML()
	if err != nil {
		t.Fatal(err)
	}
	contains(t, "domain XML", x, `<metadata><understudy:resource xmlns:understudy="https://understudy.dev/xmlns/resource/1" agent="n1" id="web"/></metadata>`)
	d, err := parseDomain(x)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := ownerOf(d.Metadata); !ok || got != o {
		t.Fatalf("read back: %+v %v", got, ok)
	}
	// Among other applications' metadata, as libvirt reports it.
	other := strings.Replace(x, "<metadata>", `<metadata><app1:foo xmlns:app1="http://app1.org/app1/">x</app1:foo>`, 1)
	if d, err := parseDomain(other); err != nil {
		t.Fatal(err)
	} else if got, ok := ownerOf(d.Metadata); !ok || got != o {
		t.Fatalf("among other metadata: %+v %v", got, ok)
	}
	// No owner, no metadata (the rendering of the golden file).
	if x, _ := NewVM("web").WithDisk(Disk{Path: "/w.img"}).DomainXML(); strings.Contains(x, "metadata") {
		t.Fatalf("a VM without owner has metadata:\n%s", x)
	}
	nx, err := NewNetwork("lab").WithOwner(Owner{Agent: "n1", ID: "lab"}).NetworkXML()
	if err != nil {
		t.Fatal(err)
	}
	n, err := parseNetwork(nx)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := ownerOf(n.Metadata); !ok || got != (Owner{Agent: "n1", ID: "lab"}) {
		t.Fatalf("network: %+v %v\n%s", got, ok, nx)
	}
}

// Redefinition refuses a defined domain or network that is not the
// owner's; an absent one is the owner's to define.
func TestRedefinitionRefusesWhatIsNotOurs(t *testing.T) {
	mine, theirs := Owner{Agent: "n1", ID: "web"}, Owner{Agent: "n1", ID: "db"}
	vm := func(o Owner) *VM {
		return NewVM("web").WithOwner(o).WithType(DomainTest).WithDisk(Disk{Path: "/w.img"})
	}
	defined := func(o Owner) DomainStatus {
		x, err := vm(o).DomainXML()
		if err != nil {
			t.Fatal(err)
		}
		return DomainStatus{Defined: true, Persistent: true, Name: "web", UUID: "6695eb01-f6a4-8304-79aa-97f2502e193f", State: StateShutoff, XML: x}
	}
	if x, err := vm(mine).Redefinition(DomainStatus{}); err != nil || !strings.Contains(x, `id="web"`) {
		t.Fatalf("an absent domain: %v\n%s", err, x)
	}
	if x, err := vm(mine).Redefinition(defined(mine)); err != nil || x != "" {
		t.Fatalf("our own domain, in sync: %v\n%s", err, x)
	}
	for _, c := range []struct {
		st   DomainStatus
		want string
	}{
		{defined(Owner{}), "domain web exists and was not made by understudy: its definition has no ownership marker. Refusing to redefine or delete it: give the resource another name (spec field name), or hand the domain over to resource \"web\" of agent n1: virsh metadata web --config --uri https://understudy.dev/xmlns/resource/1 --key understudy --set '<resource agent=\"n1\" id=\"web\"/>'"},
		{defined(theirs), "domain web belongs to understudy resource \"db\" of agent n1 (its ownership marker), not to resource \"web\" of agent n1: two resources cannot manage one domain — give one of them another name (spec field name)"},
	} {
		_, err := vm(mine).Redefinition(c.st)
		if !errors.Is(err, ErrNotOwned) || err.Error() != c.want {
			t.Errorf("got  %v\nwant %s", err, c.want)
		}
	}
	// The zero owner checks nothing (the Hypervisor used directly).
	if _, err := vm(Owner{}).Redefinition(defined(theirs)); err != nil {
		t.Fatal(err)
	}

	net := NewNetwork("lab").WithOwner(Owner{Agent: "n1", ID: "lab"}).WithIP(netip.MustParsePrefix("10.1.0.1/24"))
	foreign := NetworkStatus{Defined: true, Persistent: true, Active: true, Name: "lab", XML: "<network><name>lab</name><forward mode='nat'/></network>"}
	if _, _, err := net.Redefinition(foreign); !errors.Is(err, ErrNotOwned) || !strings.Contains(err.Error(), "network lab exists and was not made by understudy") ||
		!strings.Contains(err.Error(), "virsh net-edit lab") {
		t.Fatalf("a foreign network: %v", err)
	}
	if err := CheckNetworkOwner("lab", foreign.XML, Owner{Agent: "n1", ID: "lab"}); !errors.Is(err, ErrNotOwned) {
		t.Fatalf("CheckNetworkOwner: %v", err)
	}
	if err := CheckDomainOwner("web", defined(mine).XML, mine); err != nil {
		t.Fatalf("CheckDomainOwner of our own: %v", err)
	}
}

// A running domain on a libvirt network: libvirt's live XML names the
// network's bridge (and a port) beside the network. That is the same
// source, not a definition waiting for a restart.
func TestRunningDomainOnNetworkHasNoPendingRestart(t *testing.T) {
	spec := resources.Spec{"memory": "1GiB", "disks": []any{map[string]any{"path": "/w.img"}},
		"nics": []any{map[string]any{"network": "lab", "mac": "52:54:00:10:00:01"}}}
	r := NewVMReconciler(nil, "n1")
	s, err := r.spec("web", spec)
	if err != nil {
		t.Fatal(err)
	}
	saved, err := s.vm.DomainXML()
	if err != nil {
		t.Fatal(err)
	}
	live := strings.Replace(saved, `<source network="lab"></source>`,
		`<source network='lab' portid='5d2c8f3e-1a7b-4c55-9d0e-2f6b8a1c3e47' bridge='virbr10'/><target dev='vnet3'/><alias name='net0'/>`, 1)
	if live == saved {
		t.Fatalf("the test's live XML has no live source:\n%s", saved)
	}
	info, err := readDomain(DomainStatus{Defined: true, Persistent: true, Name: "web", State: StateRunning, XML: saved, LiveXML: live,
		NICs: []NICStatus{{MAC: "52:54:00:10:00:01", Target: "vnet3", Source: "network lab", Link: "up"}}})
	if err != nil {
		t.Fatal(err)
	}
	o := s.observe(info)
	if !o.InSync || o.Details["pending_restart"] != "" {
		t.Fatalf("a running domain on its network: %+v", o)
	}
	if nics, err := DomainNICs(live); err != nil || len(nics) != 1 || nics[0].Source != "network lab" {
		t.Fatalf("NICs of the live XML: %+v %v", nics, err)
	}
}
