// Package libvirt drives libvirt for two callers: the node agent's resource
// actors, through the vm and network kinds (VMReconciler, NetworkReconciler:
// resources.Reconciler implementations), and fence chains, through the
// libvirt-destroy and libvirt-link-down step drivers (FenceDrivers), which
// the runtime adds to every node's procedure drivers. The procedure package
// names those drivers and checks their fields (procedure.LibvirtSpec)
// without linking libvirt; the shared naming rules are in the pure
// subpackage rules.
//
// Like every driver under actors/, it does I/O but decides nothing and
// reads no clock: when to observe, retry or fence is the caller's, and
// deadlines arrive in a context. Calls into libvirt cannot be interrupted,
// so each runs on its own goroutine and the caller returns when its context
// ends while the call finishes in the background.
//
// Configs are built in Go (NewVM, NewNetwork and their With methods) and
// rendered to libvirt's XML by this package with encoding/xml — never by
// string pasting in callers. Drift compares only what a spec manages
// (domain type, vCPUs, memory, disks, NICs, CD-ROM, boot order; a network's
// forward mode, bridge, address and DHCP range) against the persistent
// definition libvirt reports, so the defaults libvirt adds (addresses,
// controllers, generated MACs) are not drift.
//
// Connections: Conns keeps one connection per URI for the agent, opened
// lazily and reopened when found dead; fence steps open their own. The
// module is built with the libvirt_dlopen tag: libvirt.so.0 (Debian:
// libvirt0) is loaded at run time, and its absence is ErrLibraryMissing.
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
package libvirt
