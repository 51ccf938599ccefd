// Package direct calls libvirt in the process that links it: the
// libvirt.Hypervisor implementation on libvirt's Go module (Conns,
// Hypervisor) and the net/rpc server of the driver protocol (Service,
// ServeConn, Serve). Only the understudy-libvirt process
// (cmd/understudy-libvirt) links it — and the tests that run the kinds
// and fence drivers against libvirt directly; the understudy binary
// reaches it through libvirt.DriverProcess.
//
// Calls into libvirt cannot be interrupted, so each runs on its own
// goroutine and a method returns when its context ends while the call
// finishes in the background (the server calls with no deadline: its
// caller kills the process instead).
//
// Connections: Conns keeps one connection per URI, opened lazily and
// reopened when found dead, with libvirt's event loop running for the
// keepalive of remote connections; Fresh hypervisors (fence steps) open
// their own per call. The module is built with the libvirt_dlopen tag:
// libvirt.so.0 (Debian: libvirt0) is loaded at run time, and its absence
// is libvirt.ErrLibraryMissing.
//
// libvirt's test driver (test:///default, built into libvirt0) runs the
// tests. Within one process every connection to test:///default shares one
// in-memory state while at least one connection (or a domain or network
// object holding one) stays open; the state is reset once the last one
// closes. It supports defining, starting, shutting down (at once), destroying,
// undefining domains and networks, autostart, and per-domain inactive XML;
// it does not support virDomainUpdateDeviceFlags (libvirt 9.0: "this
// function is not supported by the connection driver"), so a live link
// change fails there, nor the inactive XML of a network (the live one is
// used).
package direct
