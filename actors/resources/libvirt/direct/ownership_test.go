package direct

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	lv "libvirt.org/go/libvirt"

	"understudy/actors/resources"
	"understudy/actors/resources/libvirt"
	"understudy/actors/resources/libvirt/libvirttest"
	"understudy/actors/resources/libvirt/rules"
)

// A domain the vm kind did not define — an operator's, of the name a spec
// asks for — is reported, never adopted, redefined nor deleted; marked as
// the resource's (as the error says how), it is taken over.
func TestVMKindLeavesForeignDomainsAlone(t *testing.T) {
	behind := testConn(t)
	ctx := context.Background()
	r := libvirt.NewVMReconciler(newTestHypervisor(t), "n1")
	spec := vmSpecOf(map[string]any{"vcpus": 1})
	defineRaw(t, behind, "web", mustXML(t, libvirt.NewVM("web").WithType(libvirt.DomainTest).WithVCPUs(2).WithDisk(libvirt.Disk{Path: "/operators.img"})), true)

	o := observe(t, r, "web", spec)
	if o.InSync || !strings.Contains(o.Drift, "domain web exists and was not made by understudy") {
		t.Fatalf("observe of a foreign domain: %+v", o)
	}
	_, refused := r.Reconcile(ctx, "web", spec)
	if !errors.Is(refused, libvirt.ErrNotOwned) || !strings.Contains(refused.Error(), "Refusing to redefine or delete it") {
		t.Fatalf("reconcile of a foreign domain: %v", refused)
	}
	if err := r.Delete(ctx, "web", spec); !errors.Is(err, libvirt.ErrNotOwned) {
		t.Fatalf("delete of a foreign domain: %v", err)
	}
	d, err := behind.LookupDomainByName("web")
	if err != nil {
		t.Fatalf("the foreign domain is gone: %v", err)
	}
	defer d.Free()
	if x, _ := d.GetXMLDesc(lv.DOMAIN_XML_INACTIVE); !strings.Contains(x, "/operators.img") || strings.Contains(x, libvirt.MarkerNamespace) {
		t.Fatalf("the foreign domain was redefined:\n%s", x)
	}
	if st, _, _ := d.GetState(); st != lv.DOMAIN_RUNNING {
		t.Fatalf("the foreign domain was stopped: %v", st)
	}

	// Handed over as the error says (virsh metadata … --set '<resource …/>').
	marker := `<resource agent="n1" id="web"/>`
	if !strings.Contains(refused.Error(), "--key understudy --set '"+marker+"'") {
		t.Fatalf("the error does not say how to hand the domain over: %v", refused)
	}
	if err := d.SetMetadata(lv.DOMAIN_METADATA_ELEMENT, marker, "understudy", libvirt.MarkerNamespace, lv.DOMAIN_AFFECT_CONFIG); err != nil {
		t.Fatal(plain(err))
	}
	if o := reconcile(t, r, "web", spec); o.Details["vcpus"] != "1" {
		t.Fatalf("after the hand-over: %v", o.Details)
	}
	x, err := d.GetXMLDesc(lv.DOMAIN_XML_INACTIVE)
	if err != nil || !strings.Contains(x, `<understudy:resource xmlns:understudy="`+libvirt.MarkerNamespace+`" agent="n1" id="web"/>`) {
		t.Fatalf("the redefinition lost the marker (%v):\n%s", err, x)
	}

	// Another resource (or agent) naming the same domain is refused.
	for _, other := range []struct {
		r  *libvirt.VMReconciler
		id string
	}{{r, "web2"}, {libvirt.NewVMReconciler(newTestHypervisor(t), "n2"), "web"}} {
		s := vmSpecOf(map[string]any{"name": "web"})
		if o := observe(t, other.r, other.id, s); !strings.Contains(o.Drift, `domain web belongs to understudy resource "web" of agent n1 (its ownership marker)`) {
			t.Fatalf("observe by %s: %+v", other.id, o)
		}
		if _, err := other.r.Reconcile(ctx, other.id, s); !errors.Is(err, libvirt.ErrNotOwned) {
			t.Fatalf("reconcile by %s: %v", other.id, err)
		}
		if err := other.r.Delete(ctx, other.id, s); !errors.Is(err, libvirt.ErrNotOwned) {
			t.Fatalf("delete by %s: %v", other.id, err)
		}
	}
	if err := r.Delete(ctx, "web", spec); err != nil {
		t.Fatal(err)
	}
	if _, err := behind.LookupDomainByName("web"); !hasCode(err, lv.ERR_NO_DOMAIN) {
		t.Fatalf("the resource's own domain after delete: %v", err)
	}
}

// The same for networks: libvirt 9.0 (before its network metadata API)
// keeps the marker in a network's <metadata> too.
func TestNetworkKindLeavesForeignNetworksAlone(t *testing.T) {
	behind := testConn(t)
	ctx := context.Background()
	r := libvirt.NewNetworkReconciler(newTestHypervisor(t), "n1")
	spec := resources.Spec{"ip": "10.91.0.1/24"}
	n, err := behind.NetworkDefineXML(`<network><name>lab</name><forward mode="nat"/><ip address="10.90.0.1" prefix="24"/></network>`)
	if err != nil {
		t.Fatal(plain(err))
	}
	defer n.Free()
	if err := n.Create(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Destroy(); _ = n.Undefine() })

	if o := observe(t, r, "lab", spec); !strings.Contains(o.Drift, "network lab exists and was not made by understudy") {
		t.Fatalf("observe: %+v", o)
	}
	_, err = r.Reconcile(ctx, "lab", spec)
	if !errors.Is(err, libvirt.ErrNotOwned) || !strings.Contains(err.Error(), "virsh net-edit lab") {
		t.Fatalf("reconcile: %v", err)
	}
	if err := r.Delete(ctx, "lab", spec); !errors.Is(err, libvirt.ErrNotOwned) {
		t.Fatalf("delete: %v", err)
	}
	if x, _ := n.GetXMLDesc(0); !strings.Contains(x, "10.90.0.1") {
		t.Fatalf("the foreign network was redefined:\n%s", x)
	}
	if active, _ := n.IsActive(); !active {
		t.Fatal("the foreign network was stopped")
	}

	// A network the kind defines carries the marker, and is its own.
	o := reconcile(t, r, "lab2", spec)
	m, err := behind.LookupNetworkByName("lab2")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	if x, _ := m.GetXMLDesc(0); !strings.Contains(x, `agent="n1" id="lab2"`) {
		t.Fatalf("no marker in %v:\n%s", o.Details, x)
	}
	if err := r.Delete(ctx, "lab2", spec); err != nil {
		t.Fatal(err)
	}
}

// A redefinition libvirt refuses after the network was stopped to apply
// it leaves the network running its old definition: libvirt refuses a
// DHCP range of more than 65535 addresses, which the spec's rules let
// through.
func TestNetworkRedefinitionRefusedRestoresTheOld(t *testing.T) {
	behind := testConn(t)
	r := libvirt.NewNetworkReconciler(newTestHypervisor(t), "")
	spec := resources.Spec{"bridge": "virbr92", "ip": "10.92.0.1/24"}
	first := reconcile(t, r, "lab", spec)

	wide := resources.Spec{"bridge": "virbr92", "ip": "10.0.0.1/8", "dhcp": map[string]any{"start": "10.0.0.10", "end": "10.2.0.20"}}
	_, err := r.Reconcile(context.Background(), "lab", wide)
	if err == nil || !strings.Contains(err.Error(), "define network lab") || !strings.Contains(err.Error(), "is too large") ||
		!strings.Contains(err.Error(), "the network runs its previous definition again") {
		t.Fatalf("a refused redefinition: %v", err)
	}
	n, err := behind.LookupNetworkByName("lab")
	if err != nil {
		t.Fatal(err)
	}
	defer n.Free()
	if active, _ := n.IsActive(); !active {
		t.Fatal("the network is left down")
	}
	if o := observe(t, r, "lab", spec); !o.InSync || o.Details["uuid"] != first.Details["uuid"] || o.Details["ip"] != "10.92.0.1/24" {
		t.Fatalf("the network after the refused redefinition: %+v", o)
	}
	if err := r.Delete(context.Background(), "lab", spec); err != nil {
		t.Fatal(err)
	}
}

// Opening a connection to a remote libvirt that hangs holds up the calls
// to that URI only: the pool's lock is not held meanwhile.
func TestConnsOpenOutsideTheLock(t *testing.T) {
	testConn(t)
	conns := NewConns(nil)
	t.Cleanup(func() { conns.Close() })
	silent := libvirttest.SilentLibvirtd(t)
	hung := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := conns.Hypervisor(silent.URI()).DomainStatus(ctx, "x")
		hung <- err
	}()
	select {
	case <-silent.Accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the connection to the silent libvirtd was never attempted")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if st, err := conns.Hypervisor(rules.TestURI).DomainStatus(ctx, "test"); err != nil || !st.Defined {
		t.Fatalf("a call to another URI while a connect hangs: %+v %v", st, err)
	}
	select {
	case err := <-hung:
		t.Fatalf("the connect to the silent libvirtd returned: %v", err)
	default:
	}
	// And a second call to the hung URI waits for that opening rather
	// than open a connection of its own.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	if _, err := conns.Hypervisor(silent.URI()).DomainStatus(ctx2, "x"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second call to the hung URI: %v", err)
	}
	select {
	case <-silent.Accepted:
		t.Fatal("a second connection was opened to the URI being opened")
	case <-time.After(100 * time.Millisecond):
	}
}
