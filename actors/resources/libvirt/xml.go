package libvirt

import (
	"encoding/xml"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$`)

// The subset of libvirt's domain XML (https://libvirt.org/formatdomain.html)
// that the vm kind writes and compares. Decoding libvirt's own output into
// these structs ignores everything else.
type (
	domainXML struct {
		XMLName  xml.Name     `xml:"domain"`
		Type     string       `xml:"type,attr"`
		Name     string       `xml:"name"`
		UUID     string       `xml:"uuid,omitempty"`
		Metadata *metadataXML `xml:"metadata,omitempty"`
		Memory   memoryXML    `xml:"memory"`
		VCPU     vcpuXML      `xml:"vcpu"`
		OS       osXML        `xml:"os"`
		Features *featuresXML `xml:"features,omitempty"`
		Devices  devicesXML   `xml:"devices"`
	}
	memoryXML struct {
		Unit  string `xml:"unit,attr,omitempty"`
		Value uint64 `xml:",chardata"`
	}
	vcpuXML struct {
		Placement string `xml:"placement,attr,omitempty"`
		Value     int    `xml:",chardata"`
	}
	osXML struct {
		Type osTypeXML `xml:"type"`
		Boot []bootXML `xml:"boot"`
	}
	osTypeXML struct {
		Arch    string `xml:"arch,attr,omitempty"`
		Machine string `xml:"machine,attr,omitempty"`
		Value   string `xml:",chardata"`
	}
	bootXML struct {
		Dev string `xml:"dev,attr"`
	}
	featuresXML struct {
		ACPI *struct{} `xml:"acpi"`
	}
	devicesXML struct {
		Disks       []diskXML       `xml:"disk"`
		Controllers []controllerXML `xml:"controller"`
		Interfaces  []interfaceXML  `xml:"interface"`
		Serials     []charDevXML    `xml:"serial"`
		Consoles    []charDevXML    `xml:"console"`
	}
	controllerXML struct {
		Type  string `xml:"type,attr"`
		Model string `xml:"model,attr,omitempty"`
	}
	diskXML struct {
		Type     string         `xml:"type,attr"`
		Device   string         `xml:"device,attr"`
		Driver   *diskDriverXML `xml:"driver"`
		Source   *diskSourceXML `xml:"source"`
		Target   diskTargetXML  `xml:"target"`
		ReadOnly *struct{}      `xml:"readonly"`
	}
	diskDriverXML struct {
		Name string `xml:"name,attr,omitempty"`
		Type string `xml:"type,attr,omitempty"`
	}
	diskSourceXML struct {
		File string `xml:"file,attr,omitempty"`
		Dev  string `xml:"dev,attr,omitempty"`
	}
	diskTargetXML struct {
		Dev string `xml:"dev,attr"`
		Bus string `xml:"bus,attr,omitempty"`
	}
	interfaceXML struct {
		Type   string        `xml:"type,attr"`
		MAC    *macXML       `xml:"mac"`
		Source ifaceSrcXML   `xml:"source"`
		Target *ifaceDevXML  `xml:"target"`
		Model  *ifaceModeXML `xml:"model"`
		Link   *linkXML      `xml:"link"`
	}
	macXML struct {
		Address string `xml:"address,attr"`
	}
	ifaceSrcXML struct {
		Network string `xml:"network,attr,omitempty"`
		Bridge  string `xml:"bridge,attr,omitempty"`
	}
	ifaceDevXML struct {
		Dev string `xml:"dev,attr"`
	}
	ifaceModeXML struct {
		Type string `xml:"type,attr"`
	}
	linkXML struct {
		State string `xml:"state,attr"`
	}
	charDevXML struct {
		Type string `xml:"type,attr"`
	}
)

// DomainXML validates the config and renders it as libvirt domain XML. A
// serial console on a pty and ACPI (for a clean shutdown) come with every
// domain.
func (v *VM) DomainXML() (string, error) {
	if err := v.Validate(); err != nil {
		return "", err
	}
	return marshal(v.domain())
}

func (v *VM) domain() domainXML {
	d := domainXML{
		Type:     v.Type,
		Name:     v.Name,
		UUID:     strings.ToLower(v.UUID),
		Metadata: v.Owner.metadata(),
		Memory:   memoryXML{Unit: "KiB", Value: v.MemoryMiB * 1024},
		VCPU:     vcpuXML{Value: v.VCPUs},
		OS:       osXML{Type: osTypeXML{Value: "hvm"}},
		Features: &featuresXML{ACPI: &struct{}{}},
	}
	for _, b := range v.Boot {
		d.OS.Boot = append(d.OS.Boot, bootXML{Dev: b})
	}
	next := map[string]int{} // target prefix → next index
	target := func(bus string) string {
		prefix := map[string]string{"virtio": "vd", "sata": "sd", "scsi": "sd", "ide": "hd"}[bus]
		i := next[prefix]
		next[prefix]++
		return prefix + diskLetters(i)
	}
	disks := make([]Disk, 0, len(v.Disks)+1)
	for _, dk := range v.Disks {
		disks = append(disks, dk.withDefaults())
	}
	if v.CDROM != "" {
		disks = append(disks, Disk{Path: v.CDROM, Format: "raw", Bus: "sata", Device: "cdrom"})
	}
	for _, dk := range disks {
		x := diskXML{
			Type:   "file",
			Device: dk.Device,
			Driver: &diskDriverXML{Name: "qemu", Type: dk.Format},
			Source: &diskSourceXML{File: dk.Path},
			Target: diskTargetXML{Dev: target(dk.Bus), Bus: dk.Bus},
		}
		if strings.HasPrefix(dk.Path, "/dev/") {
			x.Type, x.Source = "block", &diskSourceXML{Dev: dk.Path}
		}
		if dk.Device == "cdrom" {
			x.ReadOnly = &struct{}{}
		}
		d.Devices.Disks = append(d.Devices.Disks, x)
		if dk.Bus == "scsi" && len(d.Devices.Controllers) == 0 {
			// Else libvirt adds an lsilogic controller, which current
			// QEMU builds no longer carry.
			d.Devices.Controllers = []controllerXML{{Type: "scsi", Model: "virtio-scsi"}}
		}
	}
	for _, n := range v.NICs {
		n = n.withDefaults()
		x := interfaceXML{Type: "network", Source: ifaceSrcXML{Network: n.Network}, Model: &ifaceModeXML{Type: n.Model}}
		if n.Bridge != "" {
			x.Type, x.Source = "bridge", ifaceSrcXML{Bridge: n.Bridge}
		}
		if n.MAC != "" {
			x.MAC = &macXML{Address: n.MAC}
		}
		d.Devices.Interfaces = append(d.Devices.Interfaces, x)
	}
	d.Devices.Serials = []charDevXML{{Type: "pty"}}
	d.Devices.Consoles = []charDevXML{{Type: "pty"}}
	return d
}

// diskLetters names the i-th disk of a bus as libvirt does: a..z, aa..zz, ….
func diskLetters(i int) string {
	s := ""
	for i++; i > 0; i = (i - 1) / 26 {
		s = string(rune('a'+(i-1)%26)) + s
	}
	return s
}

func marshal(v any) (string, error) {
	b, err := xml.MarshalIndent(v, "", "  ")
	if err != nil {
		return "", err
	}
	return string(b) + "\n", nil
}

// definition is the part of a domain the vm kind manages, in a form that
// compares: what a spec asks for, or what libvirt reports.
type definition struct {
	Type      string
	VCPUs     int
	MemoryKiB uint64
	Disks     []string // "path (device, bus, format)", in order, CD-ROM last
	NICs      []nicDef
	Boot      []string
}

type nicDef struct {
	Source, Model, MAC string // Source: "network default" or "bridge br0"
	Target, Link       string // reported only: the host-side device, the link state
}

func (n nicDef) String() string {
	s := n.Source + " (" + n.Model
	if n.MAC != "" {
		s += ", " + n.MAC
	}
	return s + ")"
}

func definitionOf(d domainXML) definition {
	def := definition{Type: d.Type, VCPUs: d.VCPU.Value, MemoryKiB: toKiB(d.Memory)}
	for _, dk := range d.Devices.Disks {
		path, format := "", "raw"
		if dk.Source != nil {
			path = dk.Source.File + dk.Source.Dev
		}
		if dk.Driver != nil && dk.Driver.Type != "" {
			format = dk.Driver.Type
		}
		def.Disks = append(def.Disks, fmt.Sprintf("%s (%s, %s, %s)", path, dk.Device, dk.Target.Bus, format))
	}
	for _, n := range d.Devices.Interfaces {
		nd := nicDef{Source: nicSource(n.Type, n.Source), Model: "default"}
		if n.Model != nil {
			nd.Model = n.Model.Type
		}
		if n.MAC != nil {
			nd.MAC = strings.ToLower(n.MAC.Address)
		}
		if n.Target != nil {
			nd.Target = n.Target.Dev
		}
		nd.Link = "up"
		if n.Link != nil && n.Link.State != "" {
			nd.Link = n.Link.State
		}
		def.NICs = append(def.NICs, nd)
	}
	for _, b := range d.OS.Boot {
		def.Boot = append(def.Boot, b.Dev)
	}
	return def
}

// nicSource names what an <interface> is attached to, as the specs say
// it: "network lab", "bridge br0". A running domain's interface of type
// network names its network's bridge too (<source network='lab'
// bridge='virbr10' portid=…/>): that is libvirt's detail, not another
// source.
func nicSource(typ string, src ifaceSrcXML) string {
	switch typ {
	case "network":
		return "network " + src.Network
	case "bridge":
		return "bridge " + src.Bridge
	}
	return strings.TrimSpace(typ + " " + src.Network + src.Bridge)
}

// toKiB reads a <memory> in any unit libvirt knows (it reports KiB).
func toKiB(m memoryXML) uint64 {
	unit := map[string]uint64{
		"b": 1, "bytes": 1, "KB": 1000, "k": 1 << 10, "KiB": 1 << 10, "MB": 1000 * 1000, "M": 1 << 20, "MiB": 1 << 20,
		"GB": 1000 * 1000 * 1000, "G": 1 << 30, "GiB": 1 << 30, "T": 1 << 40, "TiB": 1 << 40,
	}[m.Unit]
	if m.Unit == "" {
		unit = 1 << 10
	}
	return m.Value * unit / 1024
}

// diff lists what differs from have to want, as "field have → want".
// NICs without a MAC in want match any MAC.
func (want definition) diff(have definition) []string {
	var out []string
	if have.Type != want.Type {
		out = append(out, fmt.Sprintf("domain_type %s → %s", have.Type, want.Type))
	}
	if have.VCPUs != want.VCPUs {
		out = append(out, fmt.Sprintf("vcpus %d → %d", have.VCPUs, want.VCPUs))
	}
	if have.MemoryKiB != want.MemoryKiB {
		out = append(out, fmt.Sprintf("memory %s → %s", mib(have.MemoryKiB), mib(want.MemoryKiB)))
	}
	if !slices.Equal(have.Disks, want.Disks) {
		out = append(out, fmt.Sprintf("disks [%s] → [%s]", strings.Join(have.Disks, ", "), strings.Join(want.Disks, ", ")))
	}
	nicsDiffer := len(have.NICs) != len(want.NICs)
	for i := 0; !nicsDiffer && i < len(want.NICs); i++ {
		w, h := want.NICs[i], have.NICs[i]
		nicsDiffer = w.Source != h.Source || w.Model != h.Model || (w.MAC != "" && w.MAC != h.MAC)
	}
	if nicsDiffer {
		out = append(out, fmt.Sprintf("nics [%s] → [%s]", joinNICs(have.NICs), joinNICs(want.NICs)))
	}
	if !slices.Equal(have.Boot, want.Boot) {
		out = append(out, fmt.Sprintf("boot [%s] → [%s]", strings.Join(have.Boot, " "), strings.Join(want.Boot, " ")))
	}
	return out
}

func joinNICs(ns []nicDef) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = n.String()
	}
	return strings.Join(s, ", ")
}

func mib(kib uint64) string {
	if kib%1024 == 0 {
		return strconv.FormatUint(kib/1024, 10) + " MiB"
	}
	return strconv.FormatUint(kib, 10) + " KiB"
}

func parseDomain(s string) (domainXML, error) {
	var d domainXML
	if err := xml.Unmarshal([]byte(s), &d); err != nil {
		return d, fmt.Errorf("libvirt: domain XML: %w", err)
	}
	return d, nil
}

// The subset of libvirt's network XML (https://libvirt.org/formatnetwork.html)
// the network kind writes and compares.
type (
	networkXML struct {
		XMLName  xml.Name     `xml:"network"`
		Name     string       `xml:"name"`
		UUID     string       `xml:"uuid,omitempty"`
		Metadata *metadataXML `xml:"metadata,omitempty"`
		Forward  *forwardXML  `xml:"forward"`
		Bridge   *bridgeXML   `xml:"bridge"`
		IPs      []ipXML      `xml:"ip"`
	}
	forwardXML struct {
		Mode string `xml:"mode,attr,omitempty"`
	}
	bridgeXML struct {
		Name string `xml:"name,attr,omitempty"`
		STP  string `xml:"stp,attr,omitempty"`
	}
	ipXML struct {
		Family  string   `xml:"family,attr,omitempty"`
		Address string   `xml:"address,attr"`
		Netmask string   `xml:"netmask,attr,omitempty"`
		Prefix  string   `xml:"prefix,attr,omitempty"`
		DHCP    *dhcpXML `xml:"dhcp"`
	}
	dhcpXML struct {
		Ranges []rangeXML `xml:"range"`
	}
	rangeXML struct {
		Start string `xml:"start,attr"`
		End   string `xml:"end,attr"`
	}
)

// NetworkXML validates the config and renders it as libvirt network XML.
func (n *Network) NetworkXML() (string, error) {
	if err := n.Validate(); err != nil {
		return "", err
	}
	return marshal(n.network())
}

func (n *Network) network() networkXML {
	x := networkXML{Name: n.Name, UUID: strings.ToLower(n.UUID), Metadata: n.Owner.metadata()}
	if n.Forward != ForwardIsolated {
		x.Forward = &forwardXML{Mode: n.Forward}
	}
	if n.Bridge != "" {
		x.Bridge = &bridgeXML{Name: n.Bridge}
		if n.Forward != ForwardBridge {
			x.Bridge.STP = "on"
		}
	}
	if n.IP.IsValid() {
		ip := ipXML{Address: n.IP.Addr().String(), Prefix: strconv.Itoa(n.IP.Bits())}
		if n.IP.Addr().Is6() {
			ip.Family = "ipv6"
		}
		if n.DHCP != nil {
			ip.DHCP = &dhcpXML{Ranges: []rangeXML{{Start: n.DHCP.Start.String(), End: n.DHCP.End.String()}}}
		}
		x.IPs = append(x.IPs, ip)
	}
	return x
}

// netDefinition is the part of a network the network kind manages.
type netDefinition struct {
	Forward string
	Bridge  string // compared only when the spec names one
	IP      string // "192.168.100.1/24"; "" for none
	DHCP    string // "start-end"; "" for none
}

func netDefinitionOf(x networkXML) netDefinition {
	d := netDefinition{Forward: ForwardIsolated}
	if x.Forward != nil {
		d.Forward = x.Forward.Mode
		if d.Forward == "" {
			d.Forward = ForwardNAT
		}
	}
	if x.Bridge != nil {
		d.Bridge = x.Bridge.Name
	}
	var ips []string
	var ranges []string
	for _, ip := range x.IPs {
		addr, err := netip.ParseAddr(ip.Address)
		if err != nil {
			ips = append(ips, ip.Address)
			continue
		}
		bits := -1
		if ip.Prefix != "" {
			bits, _ = strconv.Atoi(ip.Prefix)
		} else if ip.Netmask != "" {
			if m, err := netip.ParseAddr(ip.Netmask); err == nil {
				bits = maskBits(m)
			}
		} else if addr.Is4() {
			bits = classfulBits(addr)
		}
		ips = append(ips, addr.String()+"/"+strconv.Itoa(bits))
		if ip.DHCP != nil {
			for _, r := range ip.DHCP.Ranges {
				ranges = append(ranges, r.Start+"-"+r.End)
			}
		}
	}
	d.IP, d.DHCP = strings.Join(ips, ", "), strings.Join(ranges, ", ")
	return d
}

func maskBits(m netip.Addr) int {
	b := m.AsSlice()
	n := 0
	for _, x := range b {
		for i := 7; i >= 0; i-- {
			if x&(1<<i) == 0 {
				return n
			}
			n++
		}
	}
	return n
}

// classfulBits is libvirt's default prefix for an IPv4 <ip> without
// netmask or prefix.
func classfulBits(a netip.Addr) int {
	switch b := a.As4()[0]; {
	case b < 128:
		return 8
	case b < 192:
		return 16
	}
	return 24
}

func (want netDefinition) diff(have netDefinition) []string {
	var out []string
	if have.Forward != want.Forward {
		out = append(out, fmt.Sprintf("forward %s → %s", have.Forward, want.Forward))
	}
	if want.Bridge != "" && have.Bridge != want.Bridge {
		out = append(out, fmt.Sprintf("bridge %s → %s", orNone(have.Bridge), want.Bridge))
	}
	if have.IP != want.IP {
		out = append(out, fmt.Sprintf("ip %s → %s", orNone(have.IP), orNone(want.IP)))
	}
	if have.DHCP != want.DHCP {
		out = append(out, fmt.Sprintf("dhcp %s → %s", orNone(have.DHCP), orNone(want.DHCP)))
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func parseNetwork(s string) (networkXML, error) {
	var n networkXML
	if err := xml.Unmarshal([]byte(s), &n); err != nil {
		return n, fmt.Errorf("libvirt: network XML: %w", err)
	}
	return n, nil
}

// rawInterface is one <interface> of a live domain XML, kept verbatim
// (every attribute, and the inner XML) so it can be handed back to libvirt
// with only its <link> changed, as virDomainUpdateDeviceFlags wants: an
// attribute left out is a change too (without type, libvirt reads a user
// interface, and refuses the update as a change of type).
type rawInterface struct {
	// Attrs are all its attributes, type among them: no other field may
	// take an attribute, or it would be missing here.
	Attrs  []xml.Attr   `xml:",any,attr"`
	Inner  string       `xml:",innerxml"`
	MAC    *macXML      `xml:"mac"`
	Target *ifaceDevXML `xml:"target"`
	Source ifaceSrcXML  `xml:"source"`
	Link   *linkXML     `xml:"link"`
}

// attr is the value of its attribute name ("" when absent).
func (ri rawInterface) attr(name string) string {
	for _, a := range ri.Attrs {
		if a.Name.Space == "" && a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

// FindInterface finds the NIC ref names in a domain's XML and returns its
// <interface> element (verbatim, for virDomainUpdateDeviceFlags) and its
// status.
func FindInterface(domain string, ref NICRef) (string, NICStatus, error) {
	var d struct {
		Interfaces []rawInterface `xml:"devices>interface"`
	}
	if err := xml.Unmarshal([]byte(domain), &d); err != nil {
		return "", NICStatus{}, fmt.Errorf("domain XML: %w", err)
	}
	var seen []string
	for _, ri := range d.Interfaces {
		st := NICStatus{Source: nicSource(ri.attr("type"), ri.Source), Link: "up"}
		if ri.MAC != nil {
			st.MAC = strings.ToLower(ri.MAC.Address)
		}
		if ri.Target != nil {
			st.Target = ri.Target.Dev
		}
		if ri.Link != nil && ri.Link.State != "" {
			st.Link = ri.Link.State
		}
		if (ref.MAC != "" && strings.EqualFold(ref.MAC, st.MAC)) || (ref.Target != "" && ref.Target == st.Target) {
			return ri.element(), st, nil
		}
		seen = append(seen, fmt.Sprintf("mac %s interface %s", st.MAC, orNone(st.Target)))
	}
	if len(seen) == 0 {
		return "", NICStatus{}, fmt.Errorf("no NIC with %s: the domain has no NIC", ref)
	}
	return "", NICStatus{}, fmt.Errorf("no NIC with %s; the domain has: %s", ref, strings.Join(seen, "; "))
}

func (ri rawInterface) element() string {
	var b strings.Builder
	b.WriteString("<interface")
	for _, a := range ri.Attrs {
		b.WriteString(" " + a.Name.Local + "='")
		_ = xml.EscapeText(&b, []byte(a.Value))
		b.WriteString("'")
	}
	b.WriteString(">" + ri.Inner + "</interface>")
	return b.String()
}

var linkElement = regexp.MustCompile(`(?s)<link(\s[^>]*)?/>|<link(\s[^>]*)?>.*?</link>`)

// WithLinkState returns an <interface> element (from FindInterface) with
// its <link> replaced by <link state='state'/>.
func WithLinkState(iface, state string) string {
	inner := strings.TrimSuffix(iface, "</interface>")
	inner = linkElement.ReplaceAllString(inner, "")
	return inner + "<link state='" + state + "'/></interface>"
}
