package libvirt

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"understudy/actors/resources"
)

// The kinds' names in a manifest.
const (
	KindVM      = "vm"
	KindNetwork = "network"
)

// VMReconciler is the vm kind: a libvirt domain defined from the spec,
// kept running (or shut off), redefined when its definition drifts.
//
// A resource's libvirt name is its spec's name, or its resource id when the
// spec has none (ids are lower-case letters, digits, - and _, valid libvirt
// names as they are). A domain of that name is the resource's only when it
// carries the resource's ownership marker (see Owner): one it did not
// define is reported, never redefined nor deleted. Delete destroys and
// undefines the domain; disk images are data and stay. Safe for concurrent
// use; every method is idempotent, and Validate never connects (nor starts
// understudy-libvirt).
type VMReconciler struct {
	hv    Hypervisor
	agent string
}

// NewVMReconciler returns the vm kind on hv for the agent whose manifest
// it serves: the agent's id goes into the ownership marker of every domain
// it defines, beside the resource's id. hv's owner closes what it runs on.
func NewVMReconciler(hv Hypervisor, agent string) *VMReconciler {
	return &VMReconciler{hv: hv, agent: agent}
}

type vmSpec struct {
	vm        *VM
	state     string
	autostart bool
}

func (*VMReconciler) Kind() string { return KindVM }

func (r *VMReconciler) Validate(spec resources.Spec) error {
	_, err := parseVMSpec("", spec)
	return err
}

// Identity implements resources.Named: two resources naming one domain
// would fight over it.
func (r *VMReconciler) Identity(id string, spec resources.Spec) string {
	s, err := parseVMSpec(id, spec)
	if err != nil {
		return ""
	}
	return "domain " + s.vm.Name
}

// spec decodes the resource's spec, with the resource as the domain's
// owner.
func (r *VMReconciler) spec(id string, spec resources.Spec) (vmSpec, error) {
	s, err := parseVMSpec(id, spec)
	if err == nil {
		s.vm.Owner = Owner{Agent: r.agent, ID: id}
	}
	return s, err
}

// parseVMSpec decodes a vm spec; id names the domain when the spec does not.
func parseVMSpec(id string, spec resources.Spec) (vmSpec, error) {
	f := resources.NewSpecReader(KindVM, spec)
	name := f.Str("name", false)
	if name == "" {
		name = id
		if name == "" {
			name = "validate" // Validate has no id; the manifest checks ids
		}
	}
	vm := NewVM(name)
	vm.Type = f.OneOf("domain_type", DomainKVM, domainTypes...)
	vm.VCPUs = f.Int("vcpus", 1)
	mem, ok := memoryMiB(f, "memory")
	if !ok {
		f.Fail("memory", "required: a size such as 2GiB or 512MiB, or a whole number of MiB")
	}
	vm.MemoryMiB = mem
	for _, d := range f.Items("disks") {
		disk := Disk{Path: d.Str("path", false), Format: d.Str("format", false), Bus: d.Str("bus", false), Device: d.Str("device", false)}
		if err := d.Done(); err != nil {
			return vmSpec{}, err
		}
		vm.WithDisk(disk)
	}
	for _, n := range f.Items("nics") {
		// A MAC the manifest's YAML (or msgpack) hands over as anything
		// but a string is refused with a hint to quote it.
		if v, ok := n.Get("mac"); ok {
			if _, isStr := v.(string); !isStr {
				n.Fail("mac", fmt.Sprintf("must be a quoted string such as \"52:54:00:12:34:56\" (got %v)", v))
			}
		}
		nic := NIC{Network: n.Str("network", false), Bridge: n.Str("bridge", false), MAC: n.Str("mac", false), Model: n.Str("model", false)}
		if err := n.Done(); err != nil {
			return vmSpec{}, err
		}
		vm.WithNIC(nic)
	}
	vm.CDROM = f.Str("cdrom", false)
	if _, set := f.Get("boot"); set {
		vm.Boot = f.Strs("boot")
	} else {
		// Unset: the first of hd, cdrom, network the vm has.
		hasDisk, hasCDROM := false, vm.CDROM != ""
		for _, d := range vm.Disks {
			hasDisk = hasDisk || d.withDefaults().Device == "disk"
			hasCDROM = hasCDROM || d.Device == "cdrom"
		}
		switch {
		case hasDisk:
			vm.Boot = []string{BootHD}
		case hasCDROM:
			vm.Boot = []string{BootCDROM}
		case len(vm.NICs) > 0:
			vm.Boot = []string{BootNetwork}
		default:
			f.Fail("disks", "a vm needs something to boot from: a disk, a cdrom or a nic")
		}
	}
	s := vmSpec{vm: vm}
	s.state = f.OneOf("state", StateRunning, StateRunning, StateShutoff)
	s.autostart = f.Bool("autostart", false)
	if err := f.Done(); err != nil {
		return vmSpec{}, err
	}
	if err := vm.Validate(); err != nil {
		return vmSpec{}, err
	}
	return s, nil
}

func (r *VMReconciler) Observe(ctx context.Context, id string, spec resources.Spec) (resources.Observation, error) {
	s, err := r.spec(id, spec)
	if err != nil {
		return resources.Observation{}, err
	}
	st, err := r.hv.DomainStatus(ctx, s.vm.Name)
	if err != nil {
		return resources.Observation{}, err
	}
	info, err := readDomain(st)
	if err != nil {
		return resources.Observation{}, err
	}
	return s.observe(info), nil
}

func (r *VMReconciler) Reconcile(ctx context.Context, id string, spec resources.Spec) (resources.Observation, error) {
	s, err := r.spec(id, spec)
	if err != nil {
		return resources.Observation{}, err
	}
	st, err := r.hv.EnsureVM(ctx, s.vm, s.state, s.autostart)
	if err != nil {
		return resources.Observation{}, err
	}
	info, err := readDomain(st)
	if err != nil {
		return resources.Observation{}, err
	}
	o := s.observe(info)
	if !o.InSync && s.state == StateShutoff && info.status.Active() {
		o.Drift += " (an ACPI shutdown was requested; a guest that ignores it stays running)"
	}
	return o, nil
}

// Delete implements resources.Reconciler: a domain that is not the
// resource's (see Owner) is left alone, and the error says so.
func (r *VMReconciler) Delete(ctx context.Context, id string, spec resources.Spec) error {
	s, err := r.spec(id, spec)
	if err != nil {
		return err
	}
	return r.hv.DeleteVM(ctx, s.vm.Name, s.vm.Owner)
}

// observe compares what libvirt reports with the spec.
func (s vmSpec) observe(info domainInfo) resources.Observation {
	st := info.status
	if !st.Defined {
		return resources.Observation{Drift: "domain not defined", Details: map[string]string{"name": s.vm.Name}}
	}
	if err := checkOwner("domain", s.vm.Name, s.vm.Owner, info.owner, info.marked); err != nil {
		return resources.Observation{Drift: err.Error(), Details: map[string]string{"name": s.vm.Name, "uuid": st.UUID, "state": st.State}}
	}
	d := map[string]string{
		"name":       st.Name,
		"uuid":       st.UUID,
		"state":      st.State,
		"autostart":  strconv.FormatBool(st.Autostart),
		"persistent": strconv.FormatBool(st.Persistent),
		"vcpus":      strconv.Itoa(info.saved.VCPUs),
		"memory":     mib(info.saved.MemoryKiB),
	}
	var macs, ifaces []string
	for _, n := range st.NICs {
		macs = append(macs, n.MAC)
		if n.Target != "" {
			ifaces = append(ifaces, n.Target+" link "+n.Link)
		}
	}
	if len(macs) > 0 {
		d["macs"] = strings.Join(macs, ",")
	}
	if len(ifaces) > 0 {
		d["interfaces"] = strings.Join(ifaces, ",")
	}
	want := definitionOf(s.vm.domain())
	var drift []string
	if !st.Persistent {
		drift = append(drift, "domain is transient (no persistent definition)")
	}
	if diff := want.diff(info.saved); len(diff) > 0 {
		drift = append(drift, "definition differs: "+strings.Join(diff, "; "))
	} else if info.live != nil {
		if diff := want.diff(*info.live); len(diff) > 0 {
			// Defined as asked; the running instance predates it.
			d["pending_restart"] = strings.Join(diff, "; ")
		}
	}
	switch {
	case s.state == StateRunning && st.State == StateShutoff:
		drift = append(drift, "domain not running (shutoff)")
	case s.state == StateRunning && st.State != StateRunning && st.State != "blocked":
		drift = append(drift, "domain "+st.State+", want running")
	case s.state == StateShutoff && st.State != StateShutoff:
		drift = append(drift, "domain "+st.State+", want shutoff")
	}
	switch {
	case s.autostart && !st.Autostart:
		drift = append(drift, "autostart off")
	case !s.autostart && st.Autostart:
		drift = append(drift, "autostart on")
	}
	return resources.Observation{InSync: len(drift) == 0, Drift: strings.Join(drift, "; "), Details: d}
}

// NetworkReconciler is the network kind: a libvirt virtual network defined
// from the spec, kept active, with autostart as asked (on by default).
//
// A resource's libvirt name is its spec's name, or its resource id; as for
// the vm kind, a network of that name is the resource's only when it
// carries the resource's ownership marker. A changed definition of an
// active network is applied by restarting the network: guests attached to
// it lose connectivity meanwhile. Delete stops and undefines it. Safe for
// concurrent use; every method is idempotent, and Validate never connects
// (nor starts understudy-libvirt).
type NetworkReconciler struct {
	hv    Hypervisor
	agent string
}

// NewNetworkReconciler returns the network kind on hv; its owner closes
// what hv runs on.
func NewNetworkReconciler(hv Hypervisor, agent string) *NetworkReconciler {
	return &NetworkReconciler{hv: hv, agent: agent}
}

type netSpec struct {
	net       *Network
	autostart bool
}

func (*NetworkReconciler) Kind() string { return KindNetwork }

func (r *NetworkReconciler) Validate(spec resources.Spec) error {
	_, err := parseNetSpec("validate", spec)
	return err
}

// Identity implements resources.Named.
func (r *NetworkReconciler) Identity(id string, spec resources.Spec) string {
	s, err := parseNetSpec(id, spec)
	if err != nil {
		return ""
	}
	return "network " + s.net.Name
}

func (r *NetworkReconciler) spec(id string, spec resources.Spec) (netSpec, error) {
	s, err := parseNetSpec(id, spec)
	if err == nil {
		s.net.Owner = Owner{Agent: r.agent, ID: id}
	}
	return s, err
}

func parseNetSpec(id string, spec resources.Spec) (netSpec, error) {
	f := resources.NewSpecReader(KindNetwork, spec)
	name := f.Str("name", false)
	if name == "" {
		name = id
	}
	n := NewNetwork(name)
	n.Bridge = f.Str("bridge", false)
	n.Forward = f.OneOf("forward", ForwardNAT, forwardModes...)
	if ip := f.Str("ip", false); ip != "" {
		p, err := netip.ParsePrefix(ip)
		if err != nil {
			f.Fail("ip", "must be the host's address with a prefix length, such as 192.168.100.1/24 (got "+ip+")")
		}
		n.IP = p
	}
	if d := f.Object("dhcp"); d != nil {
		var r DHCPRange
		for _, e := range []struct {
			field string
			addr  *netip.Addr
		}{{"start", &r.Start}, {"end", &r.End}} {
			s := d.Str(e.field, false)
			a, err := netip.ParseAddr(s)
			switch {
			case s == "":
				d.Fail(e.field, "required: an address inside ip's subnet")
			case err != nil:
				d.Fail(e.field, "must be an IP address (got "+s+")")
			}
			*e.addr = a
		}
		if err := d.Done(); err != nil {
			return netSpec{}, err
		}
		n.DHCP = &r
	}
	s := netSpec{net: n, autostart: f.Bool("autostart", true)}
	if err := f.Done(); err != nil {
		return netSpec{}, err
	}
	if err := n.Validate(); err != nil {
		return netSpec{}, err
	}
	return s, nil
}

func (r *NetworkReconciler) Observe(ctx context.Context, id string, spec resources.Spec) (resources.Observation, error) {
	s, err := r.spec(id, spec)
	if err != nil {
		return resources.Observation{}, err
	}
	st, err := r.hv.NetworkStatus(ctx, s.net.Name)
	if err != nil {
		return resources.Observation{}, err
	}
	info, err := readNetwork(st)
	if err != nil {
		return resources.Observation{}, err
	}
	return s.observe(info), nil
}

func (r *NetworkReconciler) Reconcile(ctx context.Context, id string, spec resources.Spec) (resources.Observation, error) {
	s, err := r.spec(id, spec)
	if err != nil {
		return resources.Observation{}, err
	}
	st, err := r.hv.EnsureNetwork(ctx, s.net, s.autostart)
	if err != nil {
		return resources.Observation{}, err
	}
	info, err := readNetwork(st)
	if err != nil {
		return resources.Observation{}, err
	}
	return s.observe(info), nil
}

// Delete implements resources.Reconciler: a network that is not the
// resource's is left alone, and the error says so.
func (r *NetworkReconciler) Delete(ctx context.Context, id string, spec resources.Spec) error {
	s, err := r.spec(id, spec)
	if err != nil {
		return err
	}
	return r.hv.DeleteNetwork(ctx, s.net.Name, s.net.Owner)
}

func (s netSpec) observe(info networkInfo) resources.Observation {
	st := info.status
	if !st.Defined {
		return resources.Observation{Drift: "network not defined", Details: map[string]string{"name": s.net.Name}}
	}
	if err := checkOwner("network", s.net.Name, s.net.Owner, info.owner, info.marked); err != nil {
		return resources.Observation{Drift: err.Error(), Details: map[string]string{"name": s.net.Name, "uuid": st.UUID, "active": strconv.FormatBool(st.Active)}}
	}
	d := map[string]string{
		"name":       st.Name,
		"uuid":       st.UUID,
		"bridge":     st.Bridge,
		"active":     strconv.FormatBool(st.Active),
		"autostart":  strconv.FormatBool(st.Autostart),
		"persistent": strconv.FormatBool(st.Persistent),
		"forward":    info.saved.Forward,
	}
	if info.saved.IP != "" {
		d["ip"] = info.saved.IP
	}
	var drift []string
	if !st.Persistent {
		drift = append(drift, "network is transient (no persistent definition)")
	}
	if diff := netDefinitionOf(s.net.network()).diff(info.saved); len(diff) > 0 {
		drift = append(drift, "definition differs: "+strings.Join(diff, "; "))
	}
	if !st.Active {
		drift = append(drift, "network not active")
	}
	switch {
	case s.autostart && !st.Autostart:
		drift = append(drift, "autostart off")
	case !s.autostart && st.Autostart:
		drift = append(drift, "autostart on")
	}
	return resources.Observation{InSync: len(drift) == 0, Drift: strings.Join(drift, "; "), Details: d}
}
