// Package libvirt is the vm and network resource kinds and the
// libvirt-destroy and libvirt-link-down fence drivers, without linking
// libvirt: the libvirt calls run in a separate process, understudy-libvirt
// (cmd/understudy-libvirt, built on the subpackage direct).
//
// Its callers: the node agent's resource actors, through the vm and
// network kinds (VMReconciler, NetworkReconciler: resources.Reconciler
// implementations), and fence chains, through the step drivers of
// FenceDrivers, which the runtime adds to every node's procedure drivers.
// The procedure package names those drivers and checks their fields
// (procedure.LibvirtSpec); the shared naming rules are in the pure
// subpackage rules.
//
// Both reach libvirt through the Hypervisor interface (one connection URI),
// handed out by a Connector. The runtime's Connector is a DriverProcess:
// it starts understudy-libvirt on first need and speaks net/rpc to it over
// its stdin and stdout (protocol.go). Why a process of its own: libvirt's
// Go module loads libvirt.so.0 and some forty libraries at process start
// (about 20 MiB of a node's memory, for nodes that may never run a VM);
// a crash in libvirt's C code would take the node's failover members down
// with it; and a libvirt call cannot be interrupted — killing the process
// is what stops a fence step's call at its deadline. The kinds' calls share
// one process (restarted by the next call when it died); each fence step
// runs in one of its own, so that killing it stops that step only. A
// process is killed, with its process group (libvirt's ssh children), when
// its call's context ends, and stopped when its owner (the agent, a node's
// members) stops.
//
// The kinds manage only what they made: the definitions they write carry
// an ownership marker (Owner), and a domain or network of the same name
// without it is reported, never redefined nor deleted.
//
// Like every driver under actors/, it does I/O but decides nothing and
// reads no clock: when to observe, retry or fence is the caller's, and
// deadlines arrive in a context.
//
// Configs are built in Go (NewVM, NewNetwork and their With methods) and
// rendered to libvirt's XML by this package with encoding/xml — never by
// string pasting in callers. Drift compares only what a spec manages
// (domain type, vCPUs, memory, disks, NICs, CD-ROM, boot order; a network's
// forward mode, bridge, address and DHCP range) against the persistent
// definition libvirt reports (DomainStatus.XML, NetworkStatus.XML), so the
// defaults libvirt adds (addresses, controllers, generated MACs) are not
// drift. What libvirt reports is read here too (Redefinition, DomainNICs,
// FindInterface): the direct implementation only makes the calls.
package libvirt
