package direct

import (
	"context"
	"strings"
	"testing"
	"time"

	lv "libvirt.org/go/libvirt"

	"understudy/actors/procedure"
	"understudy/actors/resources/libvirt"
	"understudy/actors/resources/libvirt/libvirttest"
	"understudy/actors/resources/libvirt/rules"
)

func fenceStep(driver string, l procedure.LibvirtSpec) procedure.StepSpec {
	return procedure.StepSpec{Name: driver, Driver: driver, Timeout: 5 * time.Second, Libvirt: &l}
}

// fenceDrivers are the fence drivers calling libvirt in this process.
func fenceDrivers(t *testing.T) procedure.Drivers {
	conns := NewConns(nil)
	t.Cleanup(func() { conns.Close() })
	return libvirt.FenceDrivers(conns)
}

func runStep(t *testing.T, step procedure.StepSpec) procedure.Outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), step.Timeout)
	defer cancel()
	return fenceDrivers(t).Run(ctx, step)
}

// defineRaw defines (and starts) domain name from XML on the test driver.
func defineRaw(t *testing.T, conn *lv.Connect, name, x string, start bool) {
	t.Helper()
	d, err := conn.DomainDefineXML(x)
	if err != nil {
		t.Fatalf("define: %v", plain(err))
	}
	defer d.Free()
	if start {
		if err := d.Create(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if d, err := conn.LookupDomainByName(name); err == nil {
			_ = d.Destroy()
			_ = d.Undefine()
			d.Free()
		}
	})
}

func TestFenceDestroy(t *testing.T) {
	conn := testConn(t)
	defineRaw(t, conn, "pg-a", mustXML(t, libvirt.NewVM("pg-a").WithType(libvirt.DomainTest).WithDisk(libvirt.Disk{Path: "/pg-a.img"})), true)
	step := fenceStep(procedure.DriverLibvirtDestroy, procedure.LibvirtSpec{URI: rules.TestURI, Domain: "pg-a"})

	o := runStep(t, step)
	if o.Result != procedure.ResultOK || !strings.Contains(o.Detail, "domain pg-a destroyed") {
		t.Fatalf("destroy a running domain: %+v", o)
	}
	d, err := conn.LookupDomainByName("pg-a")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free()
	if st, _, _ := d.GetState(); st != lv.DOMAIN_SHUTOFF {
		t.Fatalf("state after the fence: %v", st)
	}
	// Fencing a fenced domain succeeds (the Driver contract).
	o = runStep(t, step)
	if o.Result != procedure.ResultOK || !strings.Contains(o.Detail, "already shut off") {
		t.Fatalf("destroy an already shut-off domain: %+v", o)
	}
	// A domain that does not exist is not fenced: a typo must escalate.
	o = runStep(t, fenceStep(procedure.DriverLibvirtDestroy, procedure.LibvirtSpec{URI: rules.TestURI, Domain: "pg-typo"}))
	if o.Result != procedure.ResultFailed || !strings.Contains(o.Detail, "domain pg-typo: not found") {
		t.Fatalf("an absent domain: %+v", o)
	}
	// By UUID too.
	uuid, _ := d.GetUUIDString()
	if err := d.Create(); err != nil {
		t.Fatal(err)
	}
	if o := runStep(t, fenceStep(procedure.DriverLibvirtDestroy, procedure.LibvirtSpec{URI: rules.TestURI, Domain: uuid})); o.Result != procedure.ResultOK || !strings.Contains(o.Detail, "destroyed") {
		t.Fatalf("by UUID: %+v", o)
	}
}

func TestFenceLinkDown(t *testing.T) {
	conn := testConn(t)
	vm := libvirt.NewVM("pg-b").WithType(libvirt.DomainTest).WithDisk(libvirt.Disk{Path: "/pg-b.img"}).
		WithNIC(libvirt.NIC{Network: "default", MAC: "52:54:00:00:0b:01"}).
		WithNIC(libvirt.NIC{Network: "default", MAC: "52:54:00:00:0b:02"})
	x := mustXML(t, vm)
	// The second NIC's link is already down in the definition: the test
	// driver keeps it, so the idempotent path runs against real libvirt.
	x = strings.Replace(x, `<mac address="52:54:00:00:0b:02"></mac>`, `<mac address="52:54:00:00:0b:02"></mac><link state="down"/>`, 1)
	defineRaw(t, conn, "pg-b", x, true)
	link := func(l procedure.LibvirtSpec) procedure.Outcome {
		l.URI, l.Domain = rules.TestURI, "pg-b"
		return runStep(t, fenceStep(procedure.DriverLibvirtLinkDown, l))
	}

	if o := link(procedure.LibvirtSpec{MAC: "52:54:00:00:0B:02"}); o.Result != procedure.ResultOK || !strings.Contains(o.Detail, "already down") {
		t.Fatalf("a link already down: %+v", o)
	}
	// The test driver has no virDomainUpdateDeviceFlags: the step fails
	// with libvirt's reason (and the chain escalates).
	o := link(procedure.LibvirtSpec{MAC: "52:54:00:00:0b:01"})
	if o.Result != procedure.ResultFailed || !strings.Contains(o.Detail, "set the link of mac 52:54:00:00:0b:01 down") ||
		!strings.Contains(o.Detail, "not supported by the connection driver: virDomainUpdateDeviceFlags") {
		t.Fatalf("link down on the test driver: %+v", o)
	}
	// The host-side device name picks the NIC too (the test driver names
	// them testnet0, testnet1, …).
	st, err := newTestHypervisor(t).DomainStatus(context.Background(), "pg-b")
	if err != nil || len(st.NICs) != 2 || st.NICs[1].Target == "" {
		t.Fatalf("%+v %v", st, err)
	}
	if o := link(procedure.LibvirtSpec{Interface: st.NICs[1].Target}); o.Result != procedure.ResultOK || !strings.Contains(o.Detail, "already down") {
		t.Fatalf("by interface %s: %+v", st.NICs[1].Target, o)
	}
	if o := link(procedure.LibvirtSpec{MAC: "52:54:00:00:0b:09"}); o.Result != procedure.ResultFailed ||
		!strings.Contains(o.Detail, "no NIC with mac 52:54:00:00:0b:09; the domain has: mac 52:54:00:00:0b:01 interface") {
		t.Fatalf("an unknown MAC: %+v", o)
	}
	// A domain that is not running has no live link: fenced.
	if o := runStep(t, fenceStep(procedure.DriverLibvirtDestroy, procedure.LibvirtSpec{URI: rules.TestURI, Domain: "pg-b"})); o.Result != procedure.ResultOK {
		t.Fatal(o)
	}
	if o := link(procedure.LibvirtSpec{MAC: "52:54:00:00:0b:01"}); o.Result != procedure.ResultOK || !strings.Contains(o.Detail, "not running") {
		t.Fatalf("a shut-off domain: %+v", o)
	}
}

func TestFenceTimeout(t *testing.T) {
	testConn(t)
	uri := libvirttest.SilentLibvirtd(t).URI()
	for _, driver := range []string{procedure.DriverLibvirtDestroy, procedure.DriverLibvirtLinkDown} {
		step := fenceStep(driver, procedure.LibvirtSpec{URI: uri, Domain: "pg-c", MAC: "52:54:00:00:0c:01"})
		if driver == procedure.DriverLibvirtDestroy {
			step.Libvirt.MAC = ""
		}
		step.Timeout = 300 * time.Millisecond
		start := time.Now()
		o := runStep(t, step)
		took := time.Since(start)
		if o.Result != procedure.ResultTimedOut || !strings.Contains(o.Detail, "deadline exceeded") {
			t.Fatalf("%s against a hung libvirtd: %+v", driver, o)
		}
		if took > 2*time.Second {
			t.Fatalf("%s took %v with a 300ms step timeout", driver, took)
		}
	}
	// A context already done does not start.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	o := libvirt.DestroyDriver{Connector: NewConns(nil)}.Run(ctx, fenceStep(procedure.DriverLibvirtDestroy, procedure.LibvirtSpec{URI: rules.TestURI, Domain: "x"}))
	if o.Result != procedure.ResultTimedOut || !strings.Contains(o.Detail, "not started") {
		t.Fatalf("%+v", o)
	}
}

func TestFenceStepWithoutFields(t *testing.T) {
	for _, d := range fenceDrivers(t) {
		if o := d.Run(context.Background(), procedure.StepSpec{Name: "x"}); o.Result != procedure.ResultFailed {
			t.Fatalf("%+v", o)
		}
	}
}
