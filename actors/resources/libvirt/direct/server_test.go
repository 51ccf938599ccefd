package direct

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"net/rpc"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	lv "libvirt.org/go/libvirt"

	"understudy/actors/procedure"
	"understudy/actors/resources/libvirt"
	"understudy/actors/resources/libvirt/libvirttest"
	"understudy/actors/resources/libvirt/rules"
)

// serveSocket serves the driver protocol from this process on a unix
// socket, so that a test's own libvirt connection shares test:///default's
// state with what the server does.
func serveSocket(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "driver.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = Serve(ln, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	return sock
}

func socketDriver(t *testing.T, sock string) *libvirt.DriverProcess {
	t.Helper()
	d := libvirt.NewDriverProcess(libvirt.DriverConfig{Socket: sock}, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { d.Close() })
	return d
}

// Every operation crosses the protocol and does what it does directly: the
// test's own connection sees it.
func TestServedOperations(t *testing.T) {
	behind := testConn(t)
	hv := socketDriver(t, serveSocket(t)).Hypervisor(rules.TestURI)
	ctx := context.Background()

	netOwner, vmOwner := libvirt.Owner{Agent: "n1", ID: "rpc-net"}, libvirt.Owner{Agent: "n1", ID: "rpc-vm"}
	nw := libvirt.NewNetwork("rpc-net").WithOwner(netOwner).WithBridge("virbr61").WithIP(netip.MustParsePrefix("10.61.0.1/24")).
		WithDHCP(netip.MustParseAddr("10.61.0.10"), netip.MustParseAddr("10.61.0.20"))
	ns, err := hv.EnsureNetwork(ctx, nw, true)
	if err != nil || !ns.Active || !ns.Autostart || ns.Bridge != "virbr61" || !strings.Contains(ns.XML, "10.61.0.10") {
		t.Fatalf("EnsureNetwork: %+v %v", ns, err)
	}
	if n, err := behind.LookupNetworkByName("rpc-net"); err != nil {
		t.Fatalf("the network is not in libvirt: %v", err)
	} else {
		n.Free()
	}
	if again, err := hv.NetworkStatus(ctx, "rpc-net"); err != nil || again.UUID != ns.UUID {
		t.Fatalf("NetworkStatus: %+v %v", again, err)
	}

	vm := libvirt.NewVM("rpc-vm").WithOwner(vmOwner).WithType(libvirt.DomainTest).WithDisk(libvirt.Disk{Path: "/rpc.img"}).
		WithNIC(libvirt.NIC{Network: "rpc-net", MAC: "52:54:00:61:00:01"})
	st, err := hv.EnsureVM(ctx, vm, libvirt.StateRunning, false)
	if err != nil || st.State != libvirt.StateRunning || st.LiveXML == "" || len(st.NICs) != 1 || st.NICs[0].MAC != "52:54:00:61:00:01" {
		t.Fatalf("EnsureVM: %+v %v", st, err)
	}
	if x, err := vm.Redefinition(st); err != nil || x != "" {
		t.Fatalf("the definitions crossed the protocol differ from the spec: %v\n%s", err, x)
	}
	d, err := behind.LookupDomainByName("rpc-vm")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Free()
	if s, _, _ := d.GetState(); s != lv.DOMAIN_RUNNING {
		t.Fatalf("state seen directly: %v", s)
	}

	// The test driver has no live link change: its error crosses as text.
	_, err = hv.SetLink(ctx, "rpc-vm", libvirt.NICRef{MAC: "52:54:00:61:00:01"}, false)
	if err == nil || !strings.Contains(err.Error(), "virDomainUpdateDeviceFlags") || !strings.HasPrefix(err.Error(), "libvirt test:///default: ") {
		t.Fatalf("SetLink: %v", err)
	}
	if was, err := hv.Destroy(ctx, "rpc-vm"); err != nil || !was {
		t.Fatalf("Destroy: %v %v", was, err)
	}
	if s, _, _ := d.GetState(); s != lv.DOMAIN_SHUTOFF {
		t.Fatalf("after Destroy, seen directly: %v", s)
	}
	if err := hv.Start(ctx, "rpc-vm"); err != nil {
		t.Fatal(err)
	}
	if err := hv.Shutdown(ctx, "rpc-vm"); err != nil {
		t.Fatal(err)
	}
	// The owner crosses the protocol, and so does ErrNotOwned.
	other := libvirt.Owner{Agent: "n1", ID: "other"}
	if err := hv.DeleteVM(ctx, "rpc-vm", other); !errors.Is(err, libvirt.ErrNotOwned) || !strings.Contains(err.Error(), `domain rpc-vm belongs to understudy resource "rpc-vm" of agent n1 (its ownership marker), not to resource "other" of agent n1`) {
		t.Fatalf("DeleteVM of another resource's domain: %v", err)
	}
	if _, err := hv.EnsureVM(ctx, libvirt.NewVM("rpc-vm").WithOwner(other).WithType(libvirt.DomainTest).WithDisk(libvirt.Disk{Path: "/rpc.img"}), libvirt.StateShutoff, false); !errors.Is(err, libvirt.ErrNotOwned) {
		t.Fatalf("EnsureVM of another resource's domain: %v", err)
	}
	if err := hv.DeleteNetwork(ctx, "rpc-net", other); !errors.Is(err, libvirt.ErrNotOwned) {
		t.Fatalf("DeleteNetwork of another resource's network: %v", err)
	}
	if err := hv.DeleteVM(ctx, "rpc-vm", vmOwner); err != nil {
		t.Fatal(err)
	}
	if err := hv.Undefine(ctx, "rpc-vm"); err != nil {
		t.Fatal(err)
	}
	if err := hv.DeleteVM(ctx, "rpc-vm", vmOwner); err != nil {
		t.Fatal(err)
	}
	if st, err := hv.DomainStatus(ctx, "rpc-vm"); err != nil || st.Defined {
		t.Fatalf("after DeleteVM: %+v %v", st, err)
	}
	// Sentinel errors keep their identity across the process boundary.
	if err := hv.Start(ctx, "rpc-vm"); !errors.Is(err, libvirt.ErrNotFound) || !strings.Contains(err.Error(), "domain rpc-vm: not found") {
		t.Fatalf("Start of an absent domain: %v", err)
	}
	if err := hv.DeleteNetwork(ctx, "rpc-net", netOwner); err != nil {
		t.Fatal(err)
	}
	if _, err := behind.LookupNetworkByName("rpc-net"); !hasCode(err, lv.ERR_NO_NETWORK) {
		t.Fatalf("after DeleteNetwork: %v", err)
	}
}

func TestServedConcurrentCallsAndFreshConnections(t *testing.T) {
	testConn(t)
	d := socketDriver(t, serveSocket(t))
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		hv := d.Hypervisor(rules.TestURI)
		if i%2 == 1 {
			hv = d.Fresh(rules.TestURI)
		}
		wg.Go(func() {
			if st, err := hv.DomainStatus(context.Background(), "test"); err != nil || !st.Defined {
				errs <- errors.Join(err, errors.New("the test driver's own domain \"test\" must be found"))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestServedProtocolVersion(t *testing.T) {
	c, err := rpc.Dial("unix", serveSocket(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var reply libvirt.Reply
	err = c.Call(libvirt.ServiceName+".DomainStatus", &libvirt.Request{Protocol: libvirt.ProtocolVersion + 1, URI: rules.TestURI, Name: "test"}, &reply)
	if err != nil || reply.Err == nil || !strings.Contains(reply.Err.Message, "install the understudy-libvirt built with this understudy") {
		t.Fatalf("another protocol version: %v %+v", err, reply.Err)
	}
}

// On a socket, a call outliving its context only drops the connection
// (the process is not the caller's to kill); the next call reconnects.
func TestSocketCallDroppedAtDeadline(t *testing.T) {
	testConn(t)
	d := socketDriver(t, serveSocket(t))
	step := fenceStep(procedure.DriverLibvirtDestroy, procedure.LibvirtSpec{URI: libvirttest.SilentLibvirtd(t).URI(), Domain: "pg-c"})
	step.Timeout = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), step.Timeout)
	defer cancel()
	start := time.Now()
	o := libvirt.FenceDrivers(d).Run(ctx, step)
	if o.Result != procedure.ResultTimedOut || !strings.Contains(o.Detail, "deadline exceeded") || !strings.Contains(o.Detail, "dropped the connection") {
		t.Fatalf("%+v", o)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("took %v with a 300ms step timeout", took)
	}
	if st, err := d.Hypervisor(rules.TestURI).DomainStatus(context.Background(), "test"); err != nil || !st.Defined {
		t.Fatalf("the next call must reconnect: %+v %v", st, err)
	}
}
