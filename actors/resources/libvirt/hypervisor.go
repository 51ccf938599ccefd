package libvirt

import (
	"context"
	"errors"
)

// VM states a spec asks for.
const (
	StateRunning = "running"
	StateShutoff = "shutoff"
)

// ErrLibraryMissing: libvirt.so.0 cannot be loaded (in the
// understudy-libvirt process, which is built with libvirt_dlopen: the
// library is needed at run time only).
var ErrLibraryMissing = errors.New("libvirt.so.0 cannot be loaded: install the libvirt0 package (apt-get install libvirt0)")

// ErrNotFound wraps a lookup of a domain or network that does not exist.
var ErrNotFound = errors.New("not found")

// ErrClosed is returned by a Connector after Close.
var ErrClosed = errors.New("libvirt connections closed")

// Hypervisor is libvirt at one connection URI. Two implementations: the
// one DriverProcess hands out, which runs each call in the
// understudy-libvirt process (the understudy binary links no libvirt), and
// the direct one of package direct, which that process runs.
//
// Every method returns when ctx ends (what the implementation does with a
// call still running then is its own: DriverProcess kills its process),
// is idempotent, and may be called concurrently.
type Hypervisor interface {
	// URI is the connection URI.
	URI() string

	// DomainStatus reports the domain name (or UUID); Defined is false
	// when it does not exist.
	DomainStatus(ctx context.Context, name string) (DomainStatus, error)

	// EnsureVM defines the domain when it is missing, redefines it when
	// its persistent definition differs from vm (keeping its UUID and the
	// MACs libvirt gave NICs the spec leaves without one: see
	// VM.Redefinition), sets autostart, and brings it to state
	// (StateRunning: started, resumed if paused, restarted if crashed;
	// StateShutoff: a graceful ACPI shutdown is requested, which the guest
	// may take a while to honour). A running domain keeps its live
	// definition until its next boot. EnsureVM reports the status it
	// leaves. A domain that is not vm.Owner's (see Owner) is left alone,
	// and the error wraps ErrNotOwned.
	EnsureVM(ctx context.Context, vm *VM, state string, autostart bool) (DomainStatus, error)

	// Start starts a defined domain; one already running is left alone.
	Start(ctx context.Context, name string) error

	// Shutdown asks the guest to power off (ACPI) and returns without
	// waiting; a domain not running is left alone.
	Shutdown(ctx context.Context, name string) error

	// Destroy powers the domain off at once (virDomainDestroy) and reports
	// whether it was running; a domain already off is left alone.
	Destroy(ctx context.Context, name string) (wasRunning bool, err error)

	// Undefine removes the domain's persistent definition (with its
	// managed save image, snapshot and checkpoint metadata and NVRAM;
	// never its disk images). A running domain keeps running, as a
	// transient one; an absent domain is left alone.
	Undefine(ctx context.Context, name string) error

	// DeleteVM destroys the domain if it runs and undefines it; an absent
	// one is left alone. Disk images stay. A domain that is not owner's
	// is left alone too, and the error wraps ErrNotOwned (the zero Owner
	// checks nothing).
	DeleteVM(ctx context.Context, name string, owner Owner) error

	// SetLink sets the live link state of a running domain's NIC up or
	// down (virDomainUpdateDeviceFlags, live only: the persistent
	// definition is not touched, so the next boot comes up with the link
	// it defines). Drivers without virDomainUpdateDeviceFlags — libvirt's
	// test driver among them — fail with their "not supported" error.
	SetLink(ctx context.Context, domain string, nic NICRef, up bool) (LinkResult, error)

	// NetworkStatus reports the network name; Defined is false when it
	// does not exist.
	NetworkStatus(ctx context.Context, name string) (NetworkStatus, error)

	// EnsureNetwork defines the network when it is missing; when its
	// persistent definition differs from net it stops it if active,
	// redefines it (keeping its UUID) and starts it again, so the change
	// takes effect (guests on it lose connectivity meanwhile) — if libvirt
	// refuses the new definition, or the network will not start with it,
	// the old definition is restored and started again before the error
	// is returned; it starts an inactive network and sets autostart. A
	// network that is not net.Owner's is refused with ErrNotOwned.
	EnsureNetwork(ctx context.Context, net *Network, autostart bool) (NetworkStatus, error)

	// DeleteNetwork stops and undefines the network; an absent one is
	// left alone, and so is one that is not owner's (ErrNotOwned).
	DeleteNetwork(ctx context.Context, name string, owner Owner) error
}

// Connector hands out the Hypervisor at a URI, in two flavours of
// connection. Safe for concurrent use.
type Connector interface {
	// Hypervisor's calls share one long-lived connection per URI, opened
	// on first use and reopened when found dead (the agent's kinds).
	Hypervisor(uri string) Hypervisor
	// Fresh's calls each open their own connection and close it after
	// (fence steps: a fence must not depend on a connection that sat idle
	// for days); on a DriverProcess each runs in a process of its own.
	Fresh(uri string) Hypervisor
}

// DomainStatus is what libvirt reports of a domain.
type DomainStatus struct {
	Defined    bool // false: no such domain (the rest is zero)
	Name       string
	UUID       string
	State      string // running, blocked, paused, shutting-down, shutoff, crashed, pmsuspended
	Persistent bool
	Autostart  bool
	NICs       []NICStatus
	// XML is the persistent definition (what the next boot runs; a
	// transient domain's live one); LiveXML is the running instance's
	// definition while the domain is active, "" otherwise. The vm kind
	// compares them with its spec (drift).
	XML     string
	LiveXML string
}

// Active reports a domain that runs (in any state but shutoff).
func (s DomainStatus) Active() bool { return s.Defined && s.State != StateShutoff }

// NICStatus is a NIC of a domain as its live XML shows it.
type NICStatus struct {
	MAC    string
	Target string // host-side device (vnet3), while running
	Source string // "network default" or "bridge br0"
	Link   string // up or down
}

// NetworkStatus is what libvirt reports of a network.
type NetworkStatus struct {
	Defined    bool // false: no such network (the rest is zero)
	Name       string
	UUID       string
	Bridge     string
	Active     bool
	Persistent bool
	Autostart  bool
	// XML is the persistent definition (the live one where the driver
	// cannot give them apart, as the test driver).
	XML string
}

// NICRef picks one NIC of a domain: by MAC, else by host-side device.
type NICRef struct {
	MAC    string
	Target string
}

func (r NICRef) String() string {
	if r.MAC != "" {
		return "mac " + r.MAC
	}
	return "interface " + r.Target
}

// LinkResult says what SetLink found and did.
type LinkResult struct {
	// Changed: the link state was changed; false when it already was as
	// asked, or the domain is not running (a shut-off domain has no live
	// link).
	Changed bool
	Running bool
	NIC     NICStatus // the NIC as found before the change
}
