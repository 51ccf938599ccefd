package libvirt

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"

	"understudy/actors/resources"
	"understudy/actors/resources/libvirt/rules"
)

// Values of the VM and network configs (the manifest's words).
const (
	DomainKVM  = "kvm"  // hardware virtualisation (the default)
	DomainQEMU = "qemu" // emulation (TCG), for hosts without /dev/kvm
	DomainTest = "test" // libvirt's test driver

	BootHD      = "hd"
	BootCDROM   = "cdrom"
	BootNetwork = "network"

	ForwardNAT      = "nat"
	ForwardRoute    = "route"
	ForwardOpen     = "open"
	ForwardBridge   = "bridge"   // an existing host bridge; libvirt adds nothing
	ForwardIsolated = "isolated" // no <forward>: guests and host only
)

var (
	domainTypes  = []string{DomainKVM, DomainQEMU, DomainTest}
	bootDevices  = []string{BootHD, BootCDROM, BootNetwork}
	diskFormats  = []string{"raw", "qcow2"}
	diskBuses    = []string{"virtio", "sata", "scsi", "ide"}
	diskDevices  = []string{"disk", "cdrom"}
	nicModels    = []string{"virtio", "e1000", "e1000e", "rtl8139"}
	forwardModes = []string{ForwardNAT, ForwardRoute, ForwardOpen, ForwardBridge, ForwardIsolated}
)

// Limits of a VM config.
const (
	MaxVCPUs = 1024
	MaxDisks = 64
	MaxNICs  = 32
	// MinMemoryMiB is the least memory a VM may have.
	MinMemoryMiB = 16
)

// VM is a domain's definition, built with NewVM and the With methods and
// rendered to libvirt's domain XML by DomainXML. The With methods keep no
// reference to their arguments' slices. Field names in errors are the vm
// kind's manifest fields.
type VM struct {
	Name string
	// UUID is kept across redefinitions (libvirt refuses to redefine a
	// name under another UUID); empty lets libvirt pick one.
	UUID string
	// Owner is the resource the domain belongs to: its definition carries
	// Owner's marker, and an existing domain is redefined only when it
	// carries it too (see Owner). Zero: no marker, no check.
	Owner     Owner
	Type      string // DomainKVM (default), DomainQEMU or DomainTest
	VCPUs     int
	MemoryMiB uint64
	Disks     []Disk
	NICs      []NIC
	// CDROM is an ISO image attached as a read-only SATA CD-ROM after the
	// disks; "" for none.
	CDROM string
	// Boot is the firmware's boot order (BootHD, BootCDROM, BootNetwork).
	Boot []string
}

// Disk is one disk image or block device.
type Disk struct {
	Path   string // absolute; under /dev: a block device, else an image file
	Format string // raw or qcow2; "": qcow2 for a .qcow2 path, else raw
	Bus    string // virtio (default for disks), sata (default for CD-ROMs), scsi, ide
	Device string // disk (default) or cdrom
}

// NIC is one network interface: on a libvirt network or a host bridge.
type NIC struct {
	Network string // a libvirt network's name; or
	Bridge  string // a host bridge device
	// MAC is fixed when set; otherwise libvirt picks one at the first
	// definition and redefinitions keep it.
	MAC   string
	Model string // virtio (default), e1000, e1000e, rtl8139
}

// NewVM returns a VM of type kvm with 1 vCPU, 1024 MiB and boot order hd.
func NewVM(name string) *VM {
	return &VM{Name: name, Type: DomainKVM, VCPUs: 1, MemoryMiB: 1024, Boot: []string{BootHD}}
}

// WithType sets the domain type (kvm, qemu, test).
func (v *VM) WithType(t string) *VM { v.Type = t; return v }

// WithUUID sets the UUID (to redefine an existing domain).
func (v *VM) WithUUID(uuid string) *VM { v.UUID = uuid; return v }

// WithOwner sets the resource the domain belongs to.
func (v *VM) WithOwner(o Owner) *VM { v.Owner = o; return v }

// WithVCPUs sets the number of virtual CPUs.
func (v *VM) WithVCPUs(n int) *VM { v.VCPUs = n; return v }

// WithMemoryMiB sets the memory in MiB.
func (v *VM) WithMemoryMiB(mib uint64) *VM { v.MemoryMiB = mib; return v }

// WithDisk appends a disk.
func (v *VM) WithDisk(d Disk) *VM { v.Disks = append(v.Disks, d); return v }

// WithNIC appends a network interface.
func (v *VM) WithNIC(n NIC) *VM { v.NICs = append(v.NICs, n); return v }

// WithCDROM attaches an ISO image as a CD-ROM.
func (v *VM) WithCDROM(iso string) *VM { v.CDROM = iso; return v }

// WithBoot sets the boot order (copied).
func (v *VM) WithBoot(devs ...string) *VM { v.Boot = slices.Clone(devs); return v }

func vmErr(field, rule string) error {
	return &resources.SpecError{Kind: KindVM, Field: field, Rule: rule}
}

// Validate checks the config; the error is a *resources.SpecError naming
// the vm kind's field.
func (v *VM) Validate() error {
	if rule := rules.Name(v.Name); rule != "" {
		return vmErr("name", rule+" (got "+v.Name+")")
	}
	if v.UUID != "" && !uuidRE.MatchString(v.UUID) {
		return vmErr("uuid", "must be a UUID such as 6695eb01-f6a4-8304-79aa-97f2502e193f (got "+v.UUID+")")
	}
	if !slices.Contains(domainTypes, v.Type) {
		return vmErr("domain_type", fmt.Sprintf("must be one of %v (got %s)", domainTypes, v.Type))
	}
	if v.VCPUs < 1 || v.VCPUs > MaxVCPUs {
		return vmErr("vcpus", fmt.Sprintf("must be 1..%d (got %d)", MaxVCPUs, v.VCPUs))
	}
	if v.MemoryMiB < MinMemoryMiB || v.MemoryMiB > 1<<30 {
		return vmErr("memory", fmt.Sprintf("must be at least %d MiB and at most 1 PiB (got %d MiB)", MinMemoryMiB, v.MemoryMiB))
	}
	if len(v.Disks) > MaxDisks {
		return vmErr("disks", fmt.Sprintf("at most %d (got %d)", MaxDisks, len(v.Disks)))
	}
	paths := map[string]string{}
	hasCDROM, hasDisk := v.CDROM != "", false
	for i, d := range v.Disks {
		f := func(name string) string { return fmt.Sprintf("disks[%d].%s", i, name) }
		d = d.withDefaults()
		switch {
		case d.Path == "":
			return vmErr(f("path"), "required")
		case !filepath.IsAbs(d.Path) || filepath.Clean(d.Path) != d.Path:
			return vmErr(f("path"), "must be an absolute, clean path (got "+d.Path+")")
		case !slices.Contains(diskFormats, d.Format):
			return vmErr(f("format"), fmt.Sprintf("must be one of %v (got %s)", diskFormats, d.Format))
		case !slices.Contains(diskBuses, d.Bus):
			return vmErr(f("bus"), fmt.Sprintf("must be one of %v (got %s)", diskBuses, d.Bus))
		case !slices.Contains(diskDevices, d.Device):
			return vmErr(f("device"), fmt.Sprintf("must be one of %v (got %s)", diskDevices, d.Device))
		case d.Device == "cdrom" && d.Bus == "virtio":
			return vmErr(f("bus"), "a cdrom cannot be on the virtio bus: use sata, scsi or ide")
		}
		if j, dup := paths[d.Path]; dup {
			return vmErr(f("path"), d.Path+" is also "+j+": a disk is attached once")
		}
		paths[d.Path] = f("path")
		hasCDROM = hasCDROM || d.Device == "cdrom"
		hasDisk = hasDisk || d.Device == "disk"
	}
	if v.CDROM != "" {
		if !filepath.IsAbs(v.CDROM) || filepath.Clean(v.CDROM) != v.CDROM {
			return vmErr("cdrom", "must be an absolute, clean path to an ISO image (got "+v.CDROM+")")
		}
		if j, dup := paths[v.CDROM]; dup {
			return vmErr("cdrom", v.CDROM+" is also "+j)
		}
	}
	if len(v.NICs) > MaxNICs {
		return vmErr("nics", fmt.Sprintf("at most %d (got %d)", MaxNICs, len(v.NICs)))
	}
	macs := map[string]string{}
	for i, n := range v.NICs {
		f := func(name string) string { return fmt.Sprintf("nics[%d].%s", i, name) }
		n = n.withDefaults()
		switch {
		case n.Network == "" && n.Bridge == "":
			return vmErr(f("network"), "give network (a libvirt network) or bridge (a host bridge)")
		case n.Network != "" && n.Bridge != "":
			return vmErr(f("bridge"), "give network or bridge, not both")
		case n.Network != "" && rules.Name(n.Network) != "":
			return vmErr(f("network"), rules.Name(n.Network)+" (got "+n.Network+")")
		case n.Bridge != "" && rules.Bridge(n.Bridge) != "":
			return vmErr(f("bridge"), rules.Bridge(n.Bridge)+" (got "+n.Bridge+")")
		case !slices.Contains(nicModels, n.Model):
			return vmErr(f("model"), fmt.Sprintf("must be one of %v (got %s)", nicModels, n.Model))
		}
		if n.MAC != "" {
			if rule := rules.MAC(n.MAC); rule != "" {
				return vmErr(f("mac"), rule+" (got "+n.MAC+")")
			}
			mac := rules.NormalizeMAC(n.MAC)
			if j, dup := macs[mac]; dup {
				return vmErr(f("mac"), mac+" is also "+j+": MAC addresses must be unique")
			}
			macs[mac] = f("mac")
		}
	}
	if len(v.Boot) == 0 {
		return vmErr("boot", "must list at least one of "+strings.Join(bootDevices, ", "))
	}
	for i, b := range v.Boot {
		f := fmt.Sprintf("boot[%d]", i)
		switch {
		case !slices.Contains(bootDevices, b):
			return vmErr(f, fmt.Sprintf("must be one of %v (got %s)", bootDevices, b))
		case slices.Index(v.Boot, b) != i:
			return vmErr(f, b+" is listed twice")
		case b == BootHD && !hasDisk:
			return vmErr(f, "boots from hd, but the vm has no disk of device disk")
		case b == BootCDROM && !hasCDROM:
			return vmErr(f, "boots from cdrom, but the vm has no cdrom")
		case b == BootNetwork && len(v.NICs) == 0:
			return vmErr(f, "boots from network, but the vm has no nic")
		}
	}
	return nil
}

func (d Disk) withDefaults() Disk {
	if d.Device == "" {
		d.Device = "disk"
	}
	if d.Format == "" {
		d.Format = "raw"
		if strings.HasSuffix(strings.ToLower(d.Path), ".qcow2") {
			d.Format = "qcow2"
		}
	}
	if d.Bus == "" {
		d.Bus = "virtio"
		if d.Device == "cdrom" {
			d.Bus = "sata"
		}
	}
	return d
}

func (n NIC) withDefaults() NIC {
	if n.Model == "" {
		n.Model = "virtio"
	}
	n.MAC = rules.NormalizeMAC(n.MAC)
	return n
}

// Network is a libvirt virtual network's definition, built with NewNetwork
// and the With methods and rendered by NetworkXML. Field names in errors
// are the network kind's manifest fields.
type Network struct {
	Name string
	UUID string // kept across redefinitions; empty lets libvirt pick one
	// Owner is the resource the network belongs to, as VM.Owner.
	Owner Owner
	// Bridge is the bridge device: created by libvirt (nat, route, open,
	// isolated; "" lets libvirt pick virbrN), or an existing host bridge
	// (forward bridge, required then).
	Bridge  string
	Forward string // ForwardNAT (default), ForwardRoute, ForwardOpen, ForwardBridge, ForwardIsolated
	// IP is the host's address on the network with its prefix length; the
	// zero Prefix for none.
	IP netip.Prefix
	// DHCP is the range libvirt's dnsmasq leases from; needs IP.
	DHCP *DHCPRange
}

// DHCPRange is an inclusive address range inside the network's subnet.
type DHCPRange struct {
	Start, End netip.Addr
}

// NewNetwork returns a NAT network with no address.
func NewNetwork(name string) *Network { return &Network{Name: name, Forward: ForwardNAT} }

// WithUUID sets the UUID (to redefine an existing network).
func (n *Network) WithUUID(uuid string) *Network { n.UUID = uuid; return n }

// WithOwner sets the resource the network belongs to.
func (n *Network) WithOwner(o Owner) *Network { n.Owner = o; return n }

// WithBridge sets the bridge device name.
func (n *Network) WithBridge(name string) *Network { n.Bridge = name; return n }

// WithForward sets the forward mode.
func (n *Network) WithForward(mode string) *Network { n.Forward = mode; return n }

// WithIP sets the host's address and prefix length (192.168.100.1/24).
func (n *Network) WithIP(p netip.Prefix) *Network { n.IP = p; return n }

// WithDHCP sets the DHCP range.
func (n *Network) WithDHCP(start, end netip.Addr) *Network {
	n.DHCP = &DHCPRange{Start: start, End: end}
	return n
}

func netErr(field, rule string) error {
	return &resources.SpecError{Kind: KindNetwork, Field: field, Rule: rule}
}

// Validate checks the config; the error is a *resources.SpecError naming
// the network kind's field.
func (n *Network) Validate() error {
	if rule := rules.Name(n.Name); rule != "" {
		return netErr("name", rule+" (got "+n.Name+")")
	}
	if n.UUID != "" && !uuidRE.MatchString(n.UUID) {
		return netErr("uuid", "must be a UUID (got "+n.UUID+")")
	}
	if !slices.Contains(forwardModes, n.Forward) {
		return netErr("forward", fmt.Sprintf("must be one of %v (got %s)", forwardModes, n.Forward))
	}
	if n.Bridge != "" {
		if rule := rules.Bridge(n.Bridge); rule != "" {
			return netErr("bridge", rule+" (got "+n.Bridge+")")
		}
	}
	if n.Forward == ForwardBridge {
		switch {
		case n.Bridge == "":
			return netErr("bridge", "required with forward bridge: the existing host bridge to attach guests to")
		case n.IP.IsValid():
			return netErr("ip", "not with forward bridge: the host bridge's addresses are the host's business")
		case n.DHCP != nil:
			return netErr("dhcp", "not with forward bridge: libvirt runs no DHCP server on a host bridge")
		}
		return nil
	}
	if n.IP.IsValid() {
		bits := n.IP.Addr().BitLen()
		switch {
		case n.IP.Addr().Zone() != "":
			return netErr("ip", "must have no zone (got "+n.IP.String()+")")
		case n.IP.Bits() < 8 || n.IP.Bits() > bits-2:
			return netErr("ip", fmt.Sprintf("the prefix length must be 8..%d (got %s)", bits-2, n.IP))
		case n.IP.Addr() == n.IP.Masked().Addr():
			return netErr("ip", "must be the host's address inside the subnet, such as 192.168.100.1/24, not the network address (got "+n.IP.String()+")")
		}
	}
	if n.DHCP != nil {
		r := *n.DHCP
		switch {
		case !n.IP.IsValid():
			return netErr("dhcp", "needs ip: the host's address and the subnet the range lies in")
		case !n.IP.Contains(r.Start):
			return netErr("dhcp.start", fmt.Sprintf("must lie in %s (got %s)", n.IP.Masked(), r.Start))
		case !n.IP.Contains(r.End):
			return netErr("dhcp.end", fmt.Sprintf("must lie in %s (got %s)", n.IP.Masked(), r.End))
		case r.End.Less(r.Start):
			return netErr("dhcp.end", fmt.Sprintf("must not come before dhcp.start (%s > %s)", r.Start, r.End))
		case n.IP.Addr().Compare(r.Start) >= 0 && n.IP.Addr().Compare(r.End) <= 0:
			return netErr("dhcp", fmt.Sprintf("the range %s-%s holds the host's own address %s", r.Start, r.End, n.IP.Addr()))
		}
	}
	return nil
}
