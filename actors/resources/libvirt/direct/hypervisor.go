package direct

import (
	"context"
	"errors"
	"fmt"
	"strings"

	lv "libvirt.org/go/libvirt"

	"understudy/actors/resources/libvirt"
)

// Hypervisor is one libvirt connection URI, reached through a Conns: the
// libvirt.Hypervisor that calls libvirt in this process. Every method
// returns when ctx ends (the libvirt call then finishes in the background:
// libvirt calls cannot be interrupted), is idempotent, and may be called
// concurrently.
type Hypervisor struct {
	conns *Conns
	uri   string
	fresh bool // every call on a connection of its own (Conns.Fresh)
}

// Hypervisor implements libvirt.Connector: calls share the pool's
// connection to uri. Nothing is opened until a method needs it.
func (c *Conns) Hypervisor(uri string) libvirt.Hypervisor { return &Hypervisor{conns: c, uri: uri} }

// Fresh implements libvirt.Connector: each call opens its own connection
// to uri and closes it after.
func (c *Conns) Fresh(uri string) libvirt.Hypervisor {
	return &Hypervisor{conns: c, uri: uri, fresh: true}
}

// URI is the connection URI.
func (h *Hypervisor) URI() string { return h.uri }

// run runs op on a connection to h's URI: the pool's, or one of its own.
func run[T any](ctx context.Context, h *Hypervisor, op func(*lv.Connect) (T, error)) (T, error) {
	var v T
	var err error
	if h.fresh {
		v, err = once(ctx, h.conns, h.uri, op)
	} else {
		v, err = call(ctx, h.conns, h.uri, op)
	}
	return v, h.wrap(err)
}

func (h *Hypervisor) wrap(err error) error {
	if err == nil || strings.HasPrefix(err.Error(), "libvirt") {
		return err
	}
	return fmt.Errorf("libvirt %s: %w", h.uri, err)
}

var stateNames = map[lv.DomainState]string{
	lv.DOMAIN_NOSTATE: "nostate", lv.DOMAIN_RUNNING: libvirt.StateRunning, lv.DOMAIN_BLOCKED: "blocked",
	lv.DOMAIN_PAUSED: "paused", lv.DOMAIN_SHUTDOWN: "shutting-down", lv.DOMAIN_SHUTOFF: libvirt.StateShutoff,
	lv.DOMAIN_CRASHED: "crashed", lv.DOMAIN_PMSUSPENDED: "pmsuspended",
}

// lookupDomain finds a domain by name or UUID; libvirt.ErrNotFound when
// absent.
func lookupDomain(conn *lv.Connect, ref string) (*lv.Domain, error) {
	var d *lv.Domain
	var err error
	if libvirt.IsUUID(ref) {
		d, err = conn.LookupDomainByUUIDString(ref)
	} else {
		d, err = conn.LookupDomainByName(ref)
	}
	if hasCode(err, lv.ERR_NO_DOMAIN) {
		return nil, fmt.Errorf("domain %s: %w", ref, libvirt.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("domain %s: %w", ref, plain(err))
	}
	return d, nil
}

func inspectDomain(conn *lv.Connect, name string) (libvirt.DomainStatus, error) {
	d, err := lookupDomain(conn, name)
	if errors.Is(err, libvirt.ErrNotFound) {
		return libvirt.DomainStatus{}, nil
	}
	if err != nil {
		return libvirt.DomainStatus{}, err
	}
	defer d.Free()
	return inspect(d)
}

// inspect reads a domain's status with its definitions: the persistent one
// (what the next boot runs) and, while active, the live one.
func inspect(d *lv.Domain) (libvirt.DomainStatus, error) {
	st := libvirt.DomainStatus{Defined: true}
	var err error
	fail := func(what string, e error) (libvirt.DomainStatus, error) {
		return libvirt.DomainStatus{}, fmt.Errorf("domain %s: %s: %w", st.Name, what, plain(e))
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
	if st.NICs, err = libvirt.DomainNICs(liveXML); err != nil {
		return libvirt.DomainStatus{}, err
	}
	st.XML = liveXML
	if st.Active() {
		st.LiveXML = liveXML
		if st.Persistent {
			if st.XML, err = d.GetXMLDesc(lv.DOMAIN_XML_INACTIVE); err != nil {
				return fail("inactive XML", err)
			}
		}
	}
	return st, nil
}

// DomainStatus implements libvirt.Hypervisor.
func (h *Hypervisor) DomainStatus(ctx context.Context, name string) (libvirt.DomainStatus, error) {
	return run(ctx, h, func(conn *lv.Connect) (libvirt.DomainStatus, error) { return inspectDomain(conn, name) })
}

// EnsureVM implements libvirt.Hypervisor.
func (h *Hypervisor) EnsureVM(ctx context.Context, vm *libvirt.VM, state string, autostart bool) (libvirt.DomainStatus, error) {
	if err := vm.Validate(); err != nil {
		return libvirt.DomainStatus{}, err
	}
	if err := libvirt.CheckVMState(state); err != nil {
		return libvirt.DomainStatus{}, err
	}
	return run(ctx, h, func(conn *lv.Connect) (libvirt.DomainStatus, error) { return ensureVM(conn, vm, state, autostart) })
}

func ensureVM(conn *lv.Connect, vm *libvirt.VM, state string, autostart bool) (libvirt.DomainStatus, error) {
	st, err := inspectDomain(conn, vm.Name)
	if err != nil {
		return st, err
	}
	xml, err := vm.Redefinition(st)
	if err != nil {
		return st, err
	}
	if xml != "" {
		d, err := conn.DomainDefineXML(xml)
		if err != nil {
			return st, fmt.Errorf("define domain %s: %w", vm.Name, plain(err))
		}
		d.Free()
	}
	d, err := lookupDomain(conn, vm.Name)
	if err != nil {
		return st, err
	}
	defer d.Free()
	if st, err = inspect(d); err != nil {
		return st, err
	}
	if st.Autostart != autostart {
		if err := d.SetAutostart(autostart); err != nil {
			return st, fmt.Errorf("domain %s: autostart: %w", vm.Name, plain(err))
		}
	}
	switch s := st.State; {
	case state == libvirt.StateRunning && s == "crashed":
		if err := d.Destroy(); err != nil && !hasCode(err, lv.ERR_OPERATION_INVALID) {
			return st, fmt.Errorf("domain %s: destroy the crashed domain: %w", vm.Name, plain(err))
		}
		fallthrough
	case state == libvirt.StateRunning && s == libvirt.StateShutoff:
		if err := d.Create(); err != nil && !hasCode(err, lv.ERR_OPERATION_INVALID) {
			return st, fmt.Errorf("domain %s: start: %w", vm.Name, plain(err))
		}
	case state == libvirt.StateRunning && s == "paused":
		if err := d.Resume(); err != nil {
			return st, fmt.Errorf("domain %s: resume: %w", vm.Name, plain(err))
		}
	case state == libvirt.StateShutoff && s != libvirt.StateShutoff && s != "shutting-down":
		if err := d.Shutdown(); err != nil && !notRunning(err) {
			return st, fmt.Errorf("domain %s: shutdown: %w", vm.Name, plain(err))
		}
	}
	return inspect(d)
}

// notRunning: the call failed only because the domain is not running.
func notRunning(err error) bool {
	var le lv.Error
	if !errors.As(err, &le) {
		return false
	}
	return le.Code == lv.ERR_OPERATION_INVALID || strings.Contains(le.Message, "not running")
}

// Start implements libvirt.Hypervisor.
func (h *Hypervisor) Start(ctx context.Context, name string) error {
	_, err := run(ctx, h, func(conn *lv.Connect) (struct{}, error) {
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
	return err
}

// Shutdown implements libvirt.Hypervisor.
func (h *Hypervisor) Shutdown(ctx context.Context, name string) error {
	_, err := run(ctx, h, func(conn *lv.Connect) (struct{}, error) {
		return struct{}{}, withDomain(conn, name, func(d *lv.Domain) error {
			if err := d.Shutdown(); err != nil && !notRunning(err) {
				return fmt.Errorf("domain %s: shutdown: %w", name, plain(err))
			}
			return nil
		})
	})
	return err
}

// Destroy implements libvirt.Hypervisor.
func (h *Hypervisor) Destroy(ctx context.Context, name string) (wasRunning bool, err error) {
	return run(ctx, h, func(conn *lv.Connect) (bool, error) { return destroy(conn, name) })
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

// Undefine implements libvirt.Hypervisor.
func (h *Hypervisor) Undefine(ctx context.Context, name string) error {
	_, err := run(ctx, h, func(conn *lv.Connect) (struct{}, error) { return struct{}{}, undefine(conn, name) })
	return err
}

func undefine(conn *lv.Connect, name string) error {
	d, err := lookupDomain(conn, name)
	if errors.Is(err, libvirt.ErrNotFound) {
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

// DeleteVM implements libvirt.Hypervisor.
func (h *Hypervisor) DeleteVM(ctx context.Context, name string, owner libvirt.Owner) error {
	_, err := run(ctx, h, func(conn *lv.Connect) (struct{}, error) {
		if !owner.IsZero() {
			st, err := inspectDomain(conn, name)
			if err != nil {
				return struct{}{}, err
			}
			if !st.Defined {
				return struct{}{}, nil
			}
			if err := libvirt.CheckDomainOwner(name, st.XML, owner); err != nil {
				return struct{}{}, err
			}
		}
		if _, err := destroy(conn, name); err != nil && !errors.Is(err, libvirt.ErrNotFound) {
			return struct{}{}, err
		}
		return struct{}{}, undefine(conn, name)
	})
	return err
}

// SetLink implements libvirt.Hypervisor.
func (h *Hypervisor) SetLink(ctx context.Context, domain string, nic libvirt.NICRef, up bool) (libvirt.LinkResult, error) {
	return run(ctx, h, func(conn *lv.Connect) (libvirt.LinkResult, error) { return setLink(conn, domain, nic, up) })
}

func setLink(conn *lv.Connect, domain string, ref libvirt.NICRef, up bool) (libvirt.LinkResult, error) {
	var res libvirt.LinkResult
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
		raw, found, err := libvirt.FindInterface(liveXML, ref)
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
		if err := d.UpdateDeviceFlags(libvirt.WithLinkState(raw, want), lv.DOMAIN_DEVICE_MODIFY_LIVE); err != nil {
			return fmt.Errorf("domain %s: set the link of %s %s: %w", domain, ref, want, plain(err))
		}
		after, err := d.GetXMLDesc(0)
		if err != nil {
			return fmt.Errorf("domain %s: XML: %w", domain, plain(err))
		}
		if _, now, err := libvirt.FindInterface(after, ref); err != nil || now.Link != want {
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

// NetworkStatus implements libvirt.Hypervisor.
func (h *Hypervisor) NetworkStatus(ctx context.Context, name string) (libvirt.NetworkStatus, error) {
	return run(ctx, h, func(conn *lv.Connect) (libvirt.NetworkStatus, error) { return inspectNetwork(conn, name) })
}

func lookupNetwork(conn *lv.Connect, name string) (*lv.Network, error) {
	n, err := conn.LookupNetworkByName(name)
	if hasCode(err, lv.ERR_NO_NETWORK) {
		return nil, fmt.Errorf("network %s: %w", name, libvirt.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("network %s: %w", name, plain(err))
	}
	return n, nil
}

func inspectNetwork(conn *lv.Connect, name string) (libvirt.NetworkStatus, error) {
	n, err := lookupNetwork(conn, name)
	if errors.Is(err, libvirt.ErrNotFound) {
		return libvirt.NetworkStatus{}, nil
	}
	if err != nil {
		return libvirt.NetworkStatus{}, err
	}
	defer n.Free()
	return inspectNet(n, name)
}

func inspectNet(n *lv.Network, name string) (libvirt.NetworkStatus, error) {
	st := libvirt.NetworkStatus{Defined: true, Name: name}
	var err error
	fail := func(what string, e error) (libvirt.NetworkStatus, error) {
		return libvirt.NetworkStatus{}, fmt.Errorf("network %s: %s: %w", name, what, plain(e))
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
	st.XML = x
	if st.Bridge, err = libvirt.NetworkBridge(x); err != nil {
		return libvirt.NetworkStatus{}, err
	}
	if st.Active {
		if b, err := n.GetBridgeName(); err == nil {
			st.Bridge = b
		}
	}
	return st, nil
}

// EnsureNetwork implements libvirt.Hypervisor.
func (h *Hypervisor) EnsureNetwork(ctx context.Context, net *libvirt.Network, autostart bool) (libvirt.NetworkStatus, error) {
	if err := net.Validate(); err != nil {
		return libvirt.NetworkStatus{}, err
	}
	return run(ctx, h, func(conn *lv.Connect) (libvirt.NetworkStatus, error) { return ensureNetwork(conn, net, autostart) })
}

func ensureNetwork(conn *lv.Connect, net *libvirt.Network, autostart bool) (libvirt.NetworkStatus, error) {
	st, err := inspectNetwork(conn, net.Name)
	if err != nil {
		return st, err
	}
	xml, restart, err := net.Redefinition(st)
	if err != nil {
		return st, err
	}
	if xml != "" {
		if restart {
			// Stopped first, then redefined: a definition given to an
			// active network waits for its restart (and the test driver
			// never applies it).
			if err := stopNetwork(conn, net.Name); err != nil {
				return st, err
			}
		}
		n, err := conn.NetworkDefineXML(xml)
		if err != nil {
			err = fmt.Errorf("define network %s: %w", net.Name, plain(err))
			if restart {
				// The old definition stands: the network only needs to
				// run again.
				return restoreNetwork(conn, net.Name, "", err)
			}
			return st, err
		}
		n.Free()
	}
	n, err := lookupNetwork(conn, net.Name)
	if err != nil {
		return st, err
	}
	defer n.Free()
	if active, err := n.IsActive(); err != nil {
		return st, fmt.Errorf("network %s: %w", net.Name, plain(err))
	} else if !active {
		if err := n.Create(); err != nil && !hasCode(err, lv.ERR_OPERATION_INVALID) {
			err = fmt.Errorf("network %s: start: %w", net.Name, plain(err))
			if restart {
				return restoreNetwork(conn, net.Name, st.XML, err)
			}
			return st, err
		}
	}
	if a, err := n.GetAutostart(); err != nil || a != autostart {
		if err := n.SetAutostart(autostart); err != nil {
			return st, fmt.Errorf("network %s: autostart: %w", net.Name, plain(err))
		}
	}
	return inspectNet(n, net.Name)
}

// restoreNetwork brings back a network ensureNetwork stopped to apply a
// definition that failed (cause): it defines oldXML again (unless "": the
// old definition still stands) and starts the network. The error is cause,
// saying whether the network runs its old definition again.
func restoreNetwork(conn *lv.Connect, name, oldXML string, cause error) (libvirt.NetworkStatus, error) {
	fail := func(what string, err error) (libvirt.NetworkStatus, error) {
		st, _ := inspectNetwork(conn, name)
		return st, fmt.Errorf("%w; restoring its previous definition failed too (%s: %w): the network is down", cause, what, plain(err))
	}
	if oldXML != "" {
		n, err := conn.NetworkDefineXML(oldXML)
		if err != nil {
			return fail("define", err)
		}
		n.Free()
	}
	n, err := lookupNetwork(conn, name)
	if err != nil {
		return fail("look up", err)
	}
	defer n.Free()
	if err := n.Create(); err != nil && !hasCode(err, lv.ERR_OPERATION_INVALID) {
		return fail("start", err)
	}
	st, err := inspectNet(n, name)
	if err != nil {
		return st, fmt.Errorf("%w; its previous definition was restored and started again", cause)
	}
	return st, fmt.Errorf("%w; the network runs its previous definition again", cause)
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

// DeleteNetwork implements libvirt.Hypervisor.
func (h *Hypervisor) DeleteNetwork(ctx context.Context, name string, owner libvirt.Owner) error {
	_, err := run(ctx, h, func(conn *lv.Connect) (struct{}, error) {
		n, err := lookupNetwork(conn, name)
		if errors.Is(err, libvirt.ErrNotFound) {
			return struct{}{}, nil
		}
		if err != nil {
			return struct{}{}, err
		}
		defer n.Free()
		if !owner.IsZero() {
			st, err := inspectNet(n, name)
			if err != nil {
				return struct{}{}, err
			}
			if err := libvirt.CheckNetworkOwner(name, st.XML, owner); err != nil {
				return struct{}{}, err
			}
		}
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
	return err
}
