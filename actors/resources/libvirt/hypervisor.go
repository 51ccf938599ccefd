package libvirt

import (
	"context"
	"errors"
	"fmt"
	"strings"

	lv "libvirt.org/go/libvirt"
)

// VM states a spec asks for.
const (
	StateRunning = "running"
	StateShutoff = "shutoff"
)

// Hypervisor is one libvirt connection URI, reached through a Conns. Every
// method returns when ctx ends (the libvirt call then finishes in the
// background), is idempotent, and may be called concurrently.
type Hypervisor struct {
	conns *Conns
	uri   string
}

// Hypervisor returns the hypervisor at uri; nothing is opened until a
// method needs it.
func (c *Conns) Hypervisor(uri string) *Hypervisor { return &Hypervisor{conns: c, uri: uri} }

// URI is the connection URI.
func (h *Hypervisor) URI() string { return h.uri }

// Close closes the connections of the Conns h belongs to (every
// Hypervisor of that Conns): see Conns.Close.
func (h *Hypervisor) Close() error { return h.conns.Close() }

// DomainStatus is what libvirt reports of a domain.
type DomainStatus struct {
	Defined    bool // false: no such domain (the rest is zero)
	Name       string
	UUID       string
	State      string // running, blocked, paused, shutting-down, shutoff, crashed, pmsuspended
	Persistent bool
	Autostart  bool
	NICs       []NICStatus
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
}

var stateNames = map[lv.DomainState]string{
	lv.DOMAIN_NOSTATE: "nostate", lv.DOMAIN_RUNNING: StateRunning, lv.DOMAIN_BLOCKED: "blocked",
	lv.DOMAIN_PAUSED: "paused", lv.DOMAIN_SHUTDOWN: "shutting-down", lv.DOMAIN_SHUTOFF: StateShutoff,
	lv.DOMAIN_CRASHED: "crashed", lv.DOMAIN_PMSUSPENDED: "pmsuspended",
}

// domainInfo is a domain's status with its definitions: the persistent
// one (what the next boot runs) and, while active, the live one.
type domainInfo struct {
	status DomainStatus
	saved  definition
	live   *definition
}

// lookupDomain finds a domain by name or UUID; ErrNotFound when absent.
func lookupDomain(conn *lv.Connect, ref string) (*lv.Domain, error) {
	var d *lv.Domain
	var err error
	if uuidRE.MatchString(ref) {
		d, err = conn.LookupDomainByUUIDString(ref)
	} else {
		d, err = conn.LookupDomainByName(ref)
	}
	if hasCode(err, lv.ERR_NO_DOMAIN) {
		return nil, fmt.Errorf("domain %s: %w", ref, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("domain %s: %w", ref, plain(err))
	}
	return d, nil
}

func inspectDomain(conn *lv.Connect, name string) (domainInfo, error) {
	d, err := lookupDomain(conn, name)
	if errors.Is(err, ErrNotFound) {
		return domainInfo{}, nil
	}
	if err != nil {
		return domainInfo{}, err
	}
	defer d.Free()
	return inspect(d)
}

func inspect(d *lv.Domain) (domainInfo, error) {
	var info domainInfo
	st := &info.status
	st.Defined = true
	var err error
	fail := func(what string, e error) (domainInfo, error) {
		return domainInfo{}, fmt.Errorf("domain %s: %s: %w", st.Name, what, plain(e))
	}
	if st.Name, err = d.GetName(); err != nil {
		return fail("name", err)
	}
	if st.UUID, err = d.GetUUIDString(); err != nil {
		return fail("uuid", err)
	}
	state, _, err := d.GetState()
	if err != nil {
		return fail("state", err)
	}
	st.State = stateNames[state]
	if st.State == "" {
		st.State = fmt.Sprintf("state %d", state)
	}
	if st.Persistent, err = d.IsPersistent(); err != nil {
		return fail("persistent", err)
	}
	if st.Autostart, err = d.GetAutostart(); err != nil {
		return fail("autostart", err)
	}
	liveXML, err := d.GetXMLDesc(0)
	if err != nil {
		return fail("XML", err)
	}
	live, err := parseDomain(liveXML)
	if err != nil {
		return domainInfo{}, err
	}
	liveDef := definitionOf(live)
	for _, n := range liveDef.NICs {
		st.NICs = append(st.NICs, NICStatus{MAC: n.MAC, Target: n.Target, Source: n.Source, Link: n.Link})
	}
	info.saved = liveDef
	if st.Active() {
		info.live = &liveDef
		if st.Persistent {
			savedXML, err := d.GetXMLDesc(lv.DOMAIN_XML_INACTIVE)
			if err != nil {
				return fail("inactive XML", err)
			}
			saved, err := parseDomain(savedXML)
			if err != nil {
				return domainInfo{}, err
			}
			info.saved = definitionOf(saved)
		}
	}
	return info, nil
}

// DomainStatus reports the domain name (or UUID); Defined is false when it
// does not exist.
func (h *Hypervisor) DomainStatus(ctx context.Context, name string) (DomainStatus, error) {
	info, err := call(ctx, h.conns, h.uri, func(conn *lv.Connect) (domainInfo, error) { return inspectDomain(conn, name) })
	return info.status, h.wrap(err)
}

func (h *Hypervisor) wrap(err error) error {
	if err == nil || strings.HasPrefix(err.Error(), "libvirt") {
		return err
	}
	return fmt.Errorf("libvirt %s: %w", h.uri, err)
}

// EnsureVM defines the domain when it is missing, redefines it when its
// persistent definition differs from vm (keeping its UUID and the MACs
// libvirt gave NICs the spec leaves without one), sets autostart, and
// brings it to state (StateRunning: started, resumed if paused, restarted
// if crashed; StateShutoff: a graceful ACPI shutdown is requested, which
// the guest may take a while to honour). A running domain keeps its live
// definition until its next boot. EnsureVM reports the status it leaves.
func (h *Hypervisor) EnsureVM(ctx context.Context, vm *VM, state string, autostart bool) (DomainStatus, error) {
	if err := vm.Validate(); err != nil {
		return DomainStatus{}, err
	}
	if state != StateRunning && state != StateShutoff {
		return DomainStatus{}, fmt.Errorf("libvirt: state must be %s or %s (got %q)", StateRunning, StateShutoff, state)
	}
	info, err := call(ctx, h.conns, h.uri, func(conn *lv.Connect) (domainInfo, error) {
		return ensureVM(conn, vm, state, autostart)
	})
	return info.status, h.wrap(err)
}

func ensureVM(conn *lv.Connect, vm *VM, state string, autostart bool) (domainInfo, error) {
	info, err := inspectDomain(conn, vm.Name)
	if err != nil {
		return info, err
	}
	want := definitionOf(vm.domain())
	if !info.status.Defined || !info.status.Persistent || len(want.diff(info.saved)) > 0 {
		def := *vm
		def.NICs = carryMACs(vm.NICs, info.saved.NICs)
		if info.status.Defined {
			def.UUID = info.status.UUID
		}
		xml, err := def.DomainXML()
		if err != nil {
			return info, err
		}
		d, err := conn.DomainDefineXML(xml)
		if err != nil {
			return info, fmt.Errorf("define domain %s: %w", vm.Name, plain(err))
		}
		d.Free()
	}
	d, err := lookupDomain(conn, vm.Name)
	if err != nil {
		return info, err
	}
	defer d.Free()
	if info, err = inspect(d); err != nil {
		return info, err
	}
	if info.status.Autostart != autostart {
		if err := d.SetAutostart(autostart); err != nil {
			return info, fmt.Errorf("domain %s: autostart: %w", vm.Name, plain(err))
		}
	}
	switch s := info.status.State; {
	case state == StateRunning && s == "crashed":
		if err := d.Destroy(); err != nil && !hasCode(err, lv.ERR_OPERATION_INVALID) {
			return info, fmt.Errorf("domain %s: destroy the crashed domain: %w", vm.Name, plain(err))
		}
		fallthrough
	case state == StateRunning && s == StateShutoff:
		if err := d.Create(); err != nil && !hasCode(err, lv.ERR_OPERATION_INVALID) {
			return info, fmt.Errorf("domain %s: start: %w", vm.Name, plain(err))
		}
	case state == StateRunning && s == "paused":
		if err := d.Resume(); err != nil {
			return info, fmt.Errorf("domain %s: resume: %w", vm.Name, plain(err))
		}
	case state == StateShutoff && s != StateShutoff && s != "shutting-down":
		if err := d.Shutdown(); err != nil && !notRunning(err) {
			return info, fmt.Errorf("domain %s: shutdown: %w", vm.Name, plain(err))
		}
	}
	return inspect(d)
}

// carryMACs gives each NIC without a MAC the one libvirt assigned to the
// NIC at the same index with the same source, so a redefinition does not
// change a guest's MAC addresses. want is not modified.
func carryMACs(want []NIC, have []nicDef) []NIC {
	out := make([]NIC, len(want))
	for i, n := range want {
		n = n.withDefaults()
		if n.MAC == "" && i < len(have) && have[i].MAC != "" {
			src := "network " + n.Network
			if n.Bridge != "" {
				src = "bridge " + n.Bridge
			}
			if have[i].Source == src && !macTaken(want, have[i].MAC) {
				n.MAC = have[i].MAC
			}
		}
		out[i] = n
	}
	return out
}

func macTaken(nics []NIC, mac string) bool {
	for _, n := range nics {
		if strings.EqualFold(n.MAC, mac) {
			return true
		}
	}
	return false
}

// notRunning: the call failed only because the domain is not running.
func notRunning(err error) bool {
	var le lv.Error
	if !errors.As(err, &le) {
		return false
	}
	return le.Code == lv.ERR_OPERATION_INVALID || strings.Contains(le.Message, "not running")
}

// Start starts a defined domain; one already running is left alone.
func (h *Hypervisor) Start(ctx context.Context, name string) error {
	_, err := call(ctx, h.conns, h.uri, func(conn *lv.Connect) (struct{}, error) {
		return struct{}{}, withDomain(conn, name, func(d *lv.Domain) error {
			if active, err := d.IsActive(); err != nil || active {
				return plainOrNil(err)
			}
			if err := d.Create(); err != nil && !hasCode(err, lv.ERR_OPERATION_INVALID) {
				return fmt.Errorf("domain %s: start: %w", name, plain(err))
			}
			return nil
		})
	})
	return h.wrap(err)
}

// Shutdown asks the guest to power off (ACPI) and returns without waiting;
// a domain not running is left alone.
func (h *Hypervisor) Shutdown(ctx context.Context, name string) error {
	_, err := call(ctx, h.conns, h.uri, func(conn *lv.Connect) (struct{}, error) {
		return struct{}{}, withDomain(conn, name, func(d *lv.Domain) error {
			if err := d.Shutdown(); err != nil && !notRunning(err) {
				return fmt.Errorf("domain %s: shutdown: %w", name, plain(err))
			}
			return nil
		})
	})
	return h.wrap(err)
}

// Destroy powers the domain off at once (virDomainDestroy) and reports
// whether it was running; a domain already off is left alone.
func (h *Hypervisor) Destroy(ctx context.Context, name string) (wasRunning bool, err error) {
	wasRunning, err = call(ctx, h.conns, h.uri, func(conn *lv.Connect) (bool, error) { return destroy(conn, name) })
	return wasRunning, h.wrap(err)
}

func destroy(conn *lv.Connect, name string) (bool, error) {
	var was bool
	err := withDomain(conn, name, func(d *lv.Domain) error {
		active, err := d.IsActive()
		if err != nil {
			return fmt.Errorf("domain %s: %w", name, plain(err))
		}
		if !active {
			return nil
		}
		if err := d.Destroy(); err != nil {
			if notRunning(err) {
				return nil // it stopped meanwhile
			}
			return fmt.Errorf("domain %s: destroy: %w", name, plain(err))
		}
		if active, err := d.IsActive(); err == nil && active {
			return fmt.Errorf("domain %s: destroy returned, yet the domain is still active", name)
		}
		was = true
		return nil
	})
	return was, err
}

// Undefine removes the domain's persistent definition (with its managed
// save image, snapshot and checkpoint metadata and NVRAM; never its disk
// images). A running domain keeps running, as a transient one; an absent
// domain is left alone.
func (h *Hypervisor) Undefine(ctx context.Context, name string) error {
	_, err := call(ctx, h.conns, h.uri, func(conn *lv.Connect) (struct{}, error) { return struct{}{}, undefine(conn, name) })
	return h.wrap(err)
}

func undefine(conn *lv.Connect, name string) error {
	d, err := lookupDomain(conn, name)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	defer d.Free()
	if persistent, err := d.IsPersistent(); err != nil || !persistent {
		return plainOrNil(err)
	}
	err = d.UndefineFlags(lv.DOMAIN_UNDEFINE_MANAGED_SAVE | lv.DOMAIN_UNDEFINE_SNAPSHOTS_METADATA |
		lv.DOMAIN_UNDEFINE_CHECKPOINTS_METADATA | lv.DOMAIN_UNDEFINE_NVRAM)
	if hasCode(err, lv.ERR_INVALID_ARG, lv.ERR_NO_SUPPORT, lv.ERR_ARGUMENT_UNSUPPORTED) {
		err = d.Undefine() // a driver without these flags (the test driver)
	}
	if err != nil && !hasCode(err, lv.ERR_NO_DOMAIN) {
		return fmt.Errorf("domain %s: undefine: %w", name, plain(err))
	}
	return nil
}

// DeleteVM destroys the domain if it runs and undefines it; an absent one
// is left alone. Disk images stay.
func (h *Hypervisor) DeleteVM(ctx context.Context, name string) error {
	_, err := call(ctx, h.conns, h.uri, func(conn *lv.Connect) (struct{}, error) {
		if _, err := destroy(conn, name); err != nil && !errors.Is(err, ErrNotFound) {
			return struct{}{}, err
		}
		return struct{}{}, undefine(conn, name)
	})
	return h.wrap(err)
}

// NICRef picks a NIC of a domain: by MAC, or by the host-side device name
// (Target, e.g. vnet3). Exactly one is set.
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

// SetLink sets the live link state of a running domain's NIC up or down
// (virDomainUpdateDeviceFlags, live only: the persistent definition is not
// touched, so the next boot comes up with the link it defines). Drivers
// without virDomainUpdateDeviceFlags — libvirt's test driver among them —
// fail with their "not supported" error.
func (h *Hypervisor) SetLink(ctx context.Context, domain string, nic NICRef, up bool) (LinkResult, error) {
	res, err := call(ctx, h.conns, h.uri, func(conn *lv.Connect) (LinkResult, error) { return setLink(conn, domain, nic, up) })
	return res, h.wrap(err)
}

func setLink(conn *lv.Connect, domain string, ref NICRef, up bool) (LinkResult, error) {
	var res LinkResult
	err := withDomain(conn, domain, func(d *lv.Domain) error {
		active, err := d.IsActive()
		if err != nil {
			return fmt.Errorf("domain %s: %w", domain, plain(err))
		}
		if !active {
			return nil
		}
		res.Running = true
		liveXML, err := d.GetXMLDesc(0)
		if err != nil {
			return fmt.Errorf("domain %s: XML: %w", domain, plain(err))
		}
		raw, found, err := findInterface(liveXML, ref)
		if err != nil {
			return fmt.Errorf("domain %s: %w", domain, err)
		}
		res.NIC = found
		want := "down"
		if up {
			want = "up"
		}
		if found.Link == want {
			return nil
		}
		if err := d.UpdateDeviceFlags(withLinkState(raw, want), lv.DOMAIN_DEVICE_MODIFY_LIVE); err != nil {
			return fmt.Errorf("domain %s: set the link of %s %s: %w", domain, ref, want, plain(err))
		}
		after, err := d.GetXMLDesc(0)
		if err != nil {
			return fmt.Errorf("domain %s: XML: %w", domain, plain(err))
		}
		if _, now, err := findInterface(after, ref); err != nil || now.Link != want {
			return fmt.Errorf("domain %s: libvirt accepted the change, yet the link of %s does not read %s", domain, ref, want)
		}
		res.Changed = true
		return nil
	})
	return res, err
}

func withDomain(conn *lv.Connect, name string, f func(*lv.Domain) error) error {
	d, err := lookupDomain(conn, name)
	if err != nil {
		return err
	}
	defer d.Free()
	return f(d)
}

func plainOrNil(err error) error {
	if err == nil {
		return nil
	}
	return plain(err)
}

// NetworkStatus reports the network name; Defined is false when it does
// not exist.
func (h *Hypervisor) NetworkStatus(ctx context.Context, name string) (NetworkStatus, error) {
	info, err := call(ctx, h.conns, h.uri, func(conn *lv.Connect) (networkInfo, error) { return inspectNetwork(conn, name) })
	return info.status, h.wrap(err)
}

type networkInfo struct {
	status NetworkStatus
	saved  netDefinition
}

func lookupNetwork(conn *lv.Connect, name string) (*lv.Network, error) {
	n, err := conn.LookupNetworkByName(name)
	if hasCode(err, lv.ERR_NO_NETWORK) {
		return nil, fmt.Errorf("network %s: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("network %s: %w", name, plain(err))
	}
	return n, nil
}

func inspectNetwork(conn *lv.Connect, name string) (networkInfo, error) {
	n, err := lookupNetwork(conn, name)
	if errors.Is(err, ErrNotFound) {
		return networkInfo{}, nil
	}
	if err != nil {
		return networkInfo{}, err
	}
	defer n.Free()
	return inspectNet(n, name)
}

func inspectNet(n *lv.Network, name string) (networkInfo, error) {
	info := networkInfo{status: NetworkStatus{Defined: true, Name: name}}
	st := &info.status
	var err error
	fail := func(what string, e error) (networkInfo, error) {
		return networkInfo{}, fmt.Errorf("network %s: %s: %w", name, what, plain(e))
	}
	if st.UUID, err = n.GetUUIDString(); err != nil {
		return fail("uuid", err)
	}
	if st.Active, err = n.IsActive(); err != nil {
		return fail("active", err)
	}
	if st.Persistent, err = n.IsPersistent(); err != nil {
		return fail("persistent", err)
	}
	if st.Autostart, err = n.GetAutostart(); err != nil {
		return fail("autostart", err)
	}
	// The persistent definition; drivers that cannot give it apart from
	// the live one (the test driver) give the live one.
	x, err := n.GetXMLDesc(lv.NETWORK_XML_INACTIVE)
	if hasCode(err, lv.ERR_INVALID_ARG, lv.ERR_NO_SUPPORT, lv.ERR_ARGUMENT_UNSUPPORTED) {
		x, err = n.GetXMLDesc(0)
	}
	if err != nil {
		return fail("XML", err)
	}
	parsed, err := parseNetwork(x)
	if err != nil {
		return networkInfo{}, err
	}
	info.saved = netDefinitionOf(parsed)
	st.Bridge = info.saved.Bridge
	if st.Active {
		if b, err := n.GetBridgeName(); err == nil {
			st.Bridge = b
		}
	}
	return info, nil
}

// EnsureNetwork defines the network when it is missing; when its
// persistent definition differs from net it stops it if active, redefines
// it (keeping its UUID) and starts it again, so the change takes effect
// (guests on it lose connectivity meanwhile); it starts an inactive
// network and sets autostart.
func (h *Hypervisor) EnsureNetwork(ctx context.Context, net *Network, autostart bool) (NetworkStatus, error) {
	if err := net.Validate(); err != nil {
		return NetworkStatus{}, err
	}
	info, err := call(ctx, h.conns, h.uri, func(conn *lv.Connect) (networkInfo, error) {
		return ensureNetwork(conn, net, autostart)
	})
	return info.status, h.wrap(err)
}

func ensureNetwork(conn *lv.Connect, net *Network, autostart bool) (networkInfo, error) {
	info, err := inspectNetwork(conn, net.Name)
	if err != nil {
		return info, err
	}
	want := netDefinitionOf(net.network())
	changed := info.status.Defined && len(want.diff(info.saved)) > 0
	if !info.status.Defined || !info.status.Persistent || changed {
		def := *net
		if info.status.Defined {
			def.UUID = info.status.UUID
		}
		xml, err := def.NetworkXML()
		if err != nil {
			return info, err
		}
		if changed && info.status.Active {
			// Stopped first, then redefined: a definition given to an
			// active network waits for its restart (and the test driver
			// never applies it).
			if err := stopNetwork(conn, net.Name); err != nil {
				return info, err
			}
		}
		n, err := conn.NetworkDefineXML(xml)
		if err != nil {
			return info, fmt.Errorf("define network %s: %w", net.Name, plain(err))
		}
		n.Free()
	}
	n, err := lookupNetwork(conn, net.Name)
	if err != nil {
		return info, err
	}
	defer n.Free()
	if active, err := n.IsActive(); err != nil {
		return info, fmt.Errorf("network %s: %w", net.Name, plain(err))
	} else if !active {
		if err := n.Create(); err != nil && !hasCode(err, lv.ERR_OPERATION_INVALID) {
			return info, fmt.Errorf("network %s: start: %w", net.Name, plain(err))
		}
	}
	if a, err := n.GetAutostart(); err != nil || a != autostart {
		if err := n.SetAutostart(autostart); err != nil {
			return info, fmt.Errorf("network %s: autostart: %w", net.Name, plain(err))
		}
	}
	return inspectNet(n, net.Name)
}

func stopNetwork(conn *lv.Connect, name string) error {
	n, err := lookupNetwork(conn, name)
	if err != nil {
		return err
	}
	defer n.Free()
	if err := n.Destroy(); err != nil && !hasCode(err, lv.ERR_OPERATION_INVALID) {
		return fmt.Errorf("network %s: stop to apply the new definition: %w", name, plain(err))
	}
	return nil
}

// DeleteNetwork stops and undefines the network; an absent one is left
// alone.
func (h *Hypervisor) DeleteNetwork(ctx context.Context, name string) error {
	_, err := call(ctx, h.conns, h.uri, func(conn *lv.Connect) (struct{}, error) {
		n, err := lookupNetwork(conn, name)
		if errors.Is(err, ErrNotFound) {
			return struct{}{}, nil
		}
		if err != nil {
			return struct{}{}, err
		}
		defer n.Free()
		if active, err := n.IsActive(); err != nil {
			return struct{}{}, fmt.Errorf("network %s: %w", name, plain(err))
		} else if active {
			if err := n.Destroy(); err != nil && !hasCode(err, lv.ERR_OPERATION_INVALID) {
				return struct{}{}, fmt.Errorf("network %s: stop: %w", name, plain(err))
			}
		}
		if persistent, err := n.IsPersistent(); err == nil && persistent {
			if err := n.Undefine(); err != nil && !hasCode(err, lv.ERR_NO_NETWORK) {
				return struct{}{}, fmt.Errorf("network %s: undefine: %w", name, plain(err))
			}
		}
		return struct{}{}, nil
	})
	return h.wrap(err)
}
