package direct

import (
	"context"
	"errors"
	"strings"
	"testing"

	lv "libvirt.org/go/libvirt"

	"understudy/actors/resources"
	"understudy/actors/resources/libvirt"
	"understudy/actors/resources/libvirt/rules"
)

// TestTestDriverSharesState pins down what the other tests rely on: two
// connections of one process to test:///default see one state, and the
// state is reset once the last connection closes.
func TestTestDriverSharesState(t *testing.T) {
	a, err := lv.NewConnect(rules.TestURI)
	if err != nil {
		testConn(t) // fails with the install hint
	}
	b := testConn(t)
	d, err := a.DomainDefineXML(mustXML(t, libvirt.NewVM("shared-state").WithType(libvirt.DomainTest).WithDisk(libvirt.Disk{Path: "/x.img"})))
	if err != nil {
		t.Fatal(err)
	}
	d.Free() // a domain object holds its connection open
	d, err = b.LookupDomainByName("shared-state")
	if err != nil {
		t.Fatalf("a domain defined through one connection must be seen through another: %v", err)
	}
	d.Free()
	closeConn(a)
	if d, err := b.LookupDomainByName("shared-state"); err != nil {
		t.Fatalf("the state must outlive one connection while another is open: %v", err)
	} else {
		d.Free()
	}
	closeConn(b)
	c := testConn(t)
	if _, err := c.LookupDomainByName("shared-state"); !hasCode(err, lv.ERR_NO_DOMAIN) {
		t.Fatalf("once every connection closed, the state must be fresh; lookup: %v", err)
	}
}

// The rendered XML is accepted by a real libvirt and reads back as the
// same definition.
func TestDomainXMLAcceptedByLibvirt(t *testing.T) {
	conn := testConn(t)
	vm := libvirt.NewVM("db-1").
		WithType(libvirt.DomainTest).
		WithVCPUs(4).
		WithMemoryMiB(4096).
		WithDisk(libvirt.Disk{Path: "/var/lib/libvirt/images/db-1.qcow2"}).
		WithDisk(libvirt.Disk{Path: "/dev/vg0/pgdata", Bus: "scsi"}).
		WithDisk(libvirt.Disk{Path: "/srv/seed.iso", Device: "cdrom"}).
		WithNIC(libvirt.NIC{Network: "default", MAC: "52:54:00:AA:BB:01"}).
		WithNIC(libvirt.NIC{Bridge: "br0", Model: "e1000"}).
		WithCDROM("/srv/install & rescue.iso").
		WithBoot(libvirt.BootCDROM, libvirt.BootHD, libvirt.BootNetwork)
	d, err := conn.DomainDefineXML(mustXML(t, vm))
	if err != nil {
		t.Fatalf("libvirt refuses the rendered XML: %v", plain(err))
	}
	defer d.Free()
	defer d.Undefine()
	st, err := inspect(d)
	if err != nil {
		t.Fatal(err)
	}
	// No redefinition needed: the definition libvirt reports is vm's.
	if x, err := vm.Redefinition(st); err != nil || x != "" {
		t.Fatalf("libvirt reports a different definition (%v); it would be redefined as:\n%s", err, x)
	}
	if len(st.NICs) != 2 || st.NICs[0].MAC != "52:54:00:aa:bb:01" || st.NICs[1].MAC == "" {
		t.Fatalf("NICs: %+v (libvirt gives a MAC to the NIC without one)", st.NICs)
	}
}

func newTestHypervisor(t *testing.T) libvirt.Hypervisor {
	t.Helper()
	conns := NewConns(nil)
	t.Cleanup(func() { conns.Close() })
	return conns.Hypervisor(rules.TestURI)
}

func vmSpecOf(extra map[string]any) resources.Spec {
	s := resources.Spec{
		"domain_type": "test",
		"vcpus":       2,
		"memory":      "512MiB",
		"disks":       []any{map[string]any{"path": "/var/lib/libvirt/images/web.qcow2"}},
		"nics":        []any{map[string]any{"network": "default"}},
	}
	for k, v := range extra {
		s[k] = v
	}
	return s
}

func observe(t *testing.T, r resources.Reconciler, id string, spec resources.Spec) resources.Observation {
	t.Helper()
	o, err := r.Observe(context.Background(), id, spec)
	if err != nil {
		t.Fatalf("observe: %v", err)
	}
	return o
}

func reconcile(t *testing.T, r resources.Reconciler, id string, spec resources.Spec) resources.Observation {
	t.Helper()
	o, err := r.Reconcile(context.Background(), id, spec)
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	if !o.InSync {
		t.Fatalf("reconcile left the resource out of sync: %s (%v)", o.Drift, o.Details)
	}
	return o
}

func TestVMReconcileDriftRepairDelete(t *testing.T) {
	behind := testConn(t) // the operator's virsh, behind the agent's back
	r := libvirt.NewVMReconciler(newTestHypervisor(t), "")
	spec := vmSpecOf(nil)

	if o := observe(t, r, "web", spec); o.InSync || o.Drift != "domain not defined" {
		t.Fatalf("before: %+v", o)
	}
	first := reconcile(t, r, "web", spec)
	if first.Details["state"] != "running" || first.Details["vcpus"] != "2" || first.Details["memory"] != "512 MiB" || first.Details["uuid"] == "" {
		t.Fatalf("details: %v", first.Details)
	}
	if first.Details["macs"] == "" {
		t.Fatalf("libvirt must have given the NIC a MAC: %v", first.Details)
	}

	// Idempotent: a second reconcile changes nothing.
	again := reconcile(t, r, "web", spec)
	if again.Details["uuid"] != first.Details["uuid"] || again.Details["macs"] != first.Details["macs"] {
		t.Fatalf("a reconcile in sync must not redefine: %v then %v", first.Details, again.Details)
	}

	// Destroyed behind the agent's back: drift, then repair.
	d, err := behind.LookupDomainByName("web")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free()
	if err := d.Destroy(); err != nil {
		t.Fatal(err)
	}
	if o := observe(t, r, "web", spec); o.InSync || o.Drift != "domain not running (shutoff)" || o.Details["state"] != "shutoff" {
		t.Fatalf("after an external destroy: %+v", o)
	}
	if o := reconcile(t, r, "web", spec); o.Details["state"] != "running" {
		t.Fatalf("repair: %+v", o)
	}

	// Paused behind its back: resumed.
	if err := d.Suspend(); err != nil {
		t.Fatal(err)
	}
	if o := observe(t, r, "web", spec); o.Drift != "domain paused, want running" {
		t.Fatalf("paused: %+v", o)
	}
	if o := reconcile(t, r, "web", spec); o.Details["state"] != "running" {
		t.Fatalf("resume: %+v", o)
	}

	// Autostart turned on behind its back.
	if err := d.SetAutostart(true); err != nil {
		t.Fatal(err)
	}
	if o := observe(t, r, "web", spec); o.Drift != "autostart on" {
		t.Fatalf("autostart drift: %+v", o)
	}
	reconcile(t, r, "web", spec)

	// The spec changes: the definition differs, is redefined with the same
	// UUID and MAC, and the running domain waits for its next boot.
	bigger := vmSpecOf(map[string]any{"vcpus": 4, "autostart": true})
	o := observe(t, r, "web", bigger)
	if o.InSync || o.Drift != "definition differs: vcpus 2 → 4; autostart off" {
		t.Fatalf("spec change: %q", o.Drift)
	}
	o = reconcile(t, r, "web", bigger)
	if o.Details["uuid"] != first.Details["uuid"] || o.Details["macs"] != first.Details["macs"] {
		t.Fatalf("a redefinition must keep UUID and MAC: %v then %v", first.Details, o.Details)
	}
	if o.Details["vcpus"] != "4" || o.Details["pending_restart"] != "vcpus 2 → 4" || o.Details["autostart"] != "true" {
		t.Fatalf("after redefining a running domain: %v", o.Details)
	}

	// Shut off on request, then started again.
	off := vmSpecOf(map[string]any{"vcpus": 4, "autostart": true, "state": "shutoff"})
	if o := observe(t, r, "web", off); o.Drift != "domain running, want shutoff" {
		t.Fatalf("state drift: %q", o.Drift)
	}
	if o := reconcile(t, r, "web", off); o.Details["state"] != "shutoff" || o.Details["pending_restart"] != "" {
		t.Fatalf("shut off: %v", o.Details)
	}
	if o := reconcile(t, r, "web", bigger); o.Details["state"] != "running" || o.Details["vcpus"] != "4" {
		t.Fatalf("started again: %v", o.Details)
	}

	// Undefined behind its back (it keeps running, transient).
	if err := d.Undefine(); err != nil {
		t.Fatal(err)
	}
	if o := observe(t, r, "web", bigger); o.Drift != "domain is transient (no persistent definition)" {
		t.Fatalf("transient: %q", o.Drift)
	}
	reconcile(t, r, "web", bigger)

	// Delete, twice.
	for i := range 2 {
		if err := r.Delete(context.Background(), "web", bigger); err != nil {
			t.Fatalf("delete %d: %v", i, err)
		}
	}
	if _, err := behind.LookupDomainByName("web"); !hasCode(err, lv.ERR_NO_DOMAIN) {
		t.Fatalf("after delete: %v", err)
	}
}

func TestVMNameFromSpecOrID(t *testing.T) {
	behind := testConn(t)
	r := libvirt.NewVMReconciler(newTestHypervisor(t), "")
	spec := vmSpecOf(map[string]any{"name": "Legacy.VM-01", "state": "shutoff"})
	reconcile(t, r, "legacy", spec)
	d, err := behind.LookupDomainByName("Legacy.VM-01")
	if err != nil {
		t.Fatalf("the spec's name names the domain: %v", err)
	}
	d.Free()
	if err := r.Delete(context.Background(), "legacy", spec); err != nil {
		t.Fatal(err)
	}
}

func TestNetworkReconcileDriftRepairDelete(t *testing.T) {
	behind := testConn(t)
	r := libvirt.NewNetworkReconciler(newTestHypervisor(t), "")
	spec := resources.Spec{"bridge": "virbr7", "ip": "10.77.0.1/24", "dhcp": map[string]any{"start": "10.77.0.100", "end": "10.77.0.199"}}

	if o := observe(t, r, "lab", spec); o.Drift != "network not defined" {
		t.Fatalf("before: %+v", o)
	}
	first := reconcile(t, r, "lab", spec)
	if first.Details["active"] != "true" || first.Details["autostart"] != "true" || first.Details["bridge"] != "virbr7" || first.Details["ip"] != "10.77.0.1/24" {
		t.Fatalf("details: %v", first.Details)
	}
	if again := reconcile(t, r, "lab", spec); again.Details["uuid"] != first.Details["uuid"] {
		t.Fatalf("reconcile in sync must not redefine: %v", again.Details)
	}

	n, err := behind.LookupNetworkByName("lab")
	if err != nil {
		t.Fatal(err)
	}
	defer n.Free()
	if err := n.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := n.SetAutostart(false); err != nil {
		t.Fatal(err)
	}
	if o := observe(t, r, "lab", spec); o.Drift != "network not active; autostart off" {
		t.Fatalf("after an external stop: %q", o.Drift)
	}
	reconcile(t, r, "lab", spec)

	changed := resources.Spec{"bridge": "virbr8", "ip": "10.78.0.1/24", "forward": "route", "autostart": false}
	if o := observe(t, r, "lab", changed); o.Drift != "definition differs: forward nat → route; bridge virbr7 → virbr8; ip 10.77.0.1/24 → 10.78.0.1/24; dhcp 10.77.0.100-10.77.0.199 → none; autostart on" {
		t.Fatalf("spec change: %q", o.Drift)
	}
	o := reconcile(t, r, "lab", changed)
	if o.Details["uuid"] != first.Details["uuid"] || o.Details["bridge"] != "virbr8" || o.Details["active"] != "true" {
		t.Fatalf("redefined and restarted: %v", o.Details)
	}

	for i := range 2 {
		if err := r.Delete(context.Background(), "lab", changed); err != nil {
			t.Fatalf("delete %d: %v", i, err)
		}
	}
	if _, err := behind.LookupNetworkByName("lab"); !hasCode(err, lv.ERR_NO_NETWORK) {
		t.Fatalf("after delete: %v", err)
	}
}

func TestNetworkBridgeForward(t *testing.T) {
	testConn(t)
	r := libvirt.NewNetworkReconciler(newTestHypervisor(t), "")
	spec := resources.Spec{"forward": "bridge", "bridge": "br0"}
	o := reconcile(t, r, "lan", spec)
	if o.Details["forward"] != "bridge" {
		t.Fatalf("%v", o.Details)
	}
	if err := r.Delete(context.Background(), "lan", spec); err != nil {
		t.Fatal(err)
	}
}

func TestHypervisorOperations(t *testing.T) {
	testConn(t)
	h := newTestHypervisor(t)
	ctx := context.Background()
	vm := libvirt.NewVM("ops").WithType(libvirt.DomainTest).WithDisk(libvirt.Disk{Path: "/ops.img"})
	st, err := h.EnsureVM(ctx, vm, libvirt.StateShutoff, false)
	if err != nil || st.State != libvirt.StateShutoff || !st.Persistent {
		t.Fatalf("ensure shut off: %+v %v", st, err)
	}
	if err := h.Shutdown(ctx, "ops"); err != nil {
		t.Fatalf("shutdown of a shut-off domain must succeed: %v", err)
	}
	if was, err := h.Destroy(ctx, "ops"); err != nil || was {
		t.Fatalf("destroy of a shut-off domain: %v %v", was, err)
	}
	for range 2 {
		if err := h.Start(ctx, "ops"); err != nil {
			t.Fatalf("start: %v", err)
		}
	}
	if st, _ := h.DomainStatus(ctx, "ops"); st.State != libvirt.StateRunning {
		t.Fatalf("after start: %+v", st)
	}
	if was, err := h.Destroy(ctx, "ops"); err != nil || !was {
		t.Fatalf("destroy: %v %v", was, err)
	}
	if err := h.Undefine(ctx, "ops"); err != nil {
		t.Fatal(err)
	}
	if err := h.Undefine(ctx, "ops"); err != nil {
		t.Fatalf("undefine of an absent domain must succeed: %v", err)
	}
	if st, err := h.DomainStatus(ctx, "ops"); err != nil || st.Defined {
		t.Fatalf("after undefine: %+v %v", st, err)
	}
	if err := h.Start(ctx, "ops"); !errors.Is(err, libvirt.ErrNotFound) {
		t.Fatalf("start of an absent domain: %v", err)
	}
}

func TestConnsReconnectAndClose(t *testing.T) {
	testConn(t)
	c := NewConns(nil)
	p, fresh, err := c.acquire(rules.TestURI)
	if err != nil || !fresh {
		t.Fatalf("first acquire: %v fresh=%v", err, fresh)
	}
	c.release(rules.TestURI, p, false)
	q, fresh, err := c.acquire(rules.TestURI)
	if err != nil || fresh || q != p {
		t.Fatalf("a live connection must be reused: %v fresh=%v", err, fresh)
	}
	c.release(rules.TestURI, q, true) // found broken: retired
	r, fresh, err := c.acquire(rules.TestURI)
	if err != nil || !fresh || r == p {
		t.Fatalf("a broken connection must be replaced: %v fresh=%v", err, fresh)
	}
	c.Close()
	c.release(rules.TestURI, r, false) // closes it now
	if _, _, err := c.acquire(rules.TestURI); !errors.Is(err, libvirt.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
	if _, err := c.Hypervisor(rules.TestURI).DomainStatus(context.Background(), "x"); !errors.Is(err, libvirt.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

func TestLibraryMissingError(t *testing.T) {
	err := plain(lv.Error{Code: lv.ERR_INTERNAL_ERROR, Domain: lv.FROM_NONE, Message: "libvirt.so.0: cannot open shared object file: No such file or directory"})
	if !errors.Is(err, libvirt.ErrLibraryMissing) || !strings.Contains(err.Error(), "install the libvirt0 package") {
		t.Fatalf("%v", err)
	}
	if err := plain(lv.Error{Code: lv.ERR_NO_DOMAIN, Domain: lv.FROM_DOMAIN, Message: "Domain not found"}); err.Error() != "Domain not found" {
		t.Fatalf("libvirt errors read as their message: %v", err)
	}
}

func TestConnectBadURI(t *testing.T) {
	_, err := NewConns(nil).Hypervisor("qemu:///nowhere").DomainStatus(context.Background(), "x")
	if err == nil || !strings.Contains(err.Error(), "must end in /system or /session") {
		t.Fatalf("%v", err)
	}
}
