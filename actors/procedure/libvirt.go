package procedure

import (
	"strconv"
	"strings"

	"understudy/actors"
	"understudy/actors/resources/libvirt/rules"
)

// The libvirt fence drivers. This package names them and checks their
// fields; their implementation is in actors/resources/libvirt (its calls
// run in the understudy-libvirt process), and the runtime adds it to the
// Drivers of every node.
const (
	// DriverLibvirtDestroy powers a domain off at once (virDomainDestroy).
	// A domain already shut off is fenced: the step succeeds.
	DriverLibvirtDestroy = "libvirt-destroy"
	// DriverLibvirtLinkDown sets the link of one of a domain's NICs down
	// (virDomainUpdateDeviceFlags, live). A link already down, or a domain
	// not running, is fenced: the step succeeds.
	DriverLibvirtLinkDown = "libvirt-link-down"
)

// LibvirtSpec are the fields of the libvirt drivers' steps.
type LibvirtSpec struct {
	// URI is the libvirt connection URI; rules.DefaultURI (qemu:///system)
	// when empty. qemu+ssh://user@host/system fences a domain on another
	// machine.
	URI string `yaml:"uri,omitempty"`
	// Domain is the domain's name (or UUID).
	Domain string `yaml:"domain"`
	// Interface (the host-side device, e.g. vnet3) or MAC picks the NIC of
	// a libvirt-link-down step; exactly one of them.
	Interface string `yaml:"interface,omitempty"`
	MAC       string `yaml:"mac,omitempty"`
}

// ConnURI is the URI to connect to: URI, or rules.DefaultURI.
func (s LibvirtSpec) ConnURI() string {
	if s.URI == "" {
		return rules.DefaultURI
	}
	return s.URI
}

func checkLibvirt(s StepSpec, path string) error {
	l := s.Libvirt
	bad := func(field, rule, value string) error {
		return &actors.ConfigError{Field: path + ".libvirt" + field, Rule: rule, Value: value}
	}
	if s.Exec != nil {
		return &actors.ConfigError{Field: path + ".exec", Rule: "applies to driver exec only; driver " + s.Driver + " takes libvirt"}
	}
	if l == nil {
		if s.Driver == DriverLibvirtLinkDown {
			return bad("", "must be set with driver "+s.Driver+" (uri, domain, and interface or mac)", "")
		}
		return bad("", "must be set with driver "+s.Driver+" (uri, domain)", "")
	}
	if l.URI != "" {
		if rule := rules.URI(l.URI); rule != "" {
			return bad(".uri", rule, l.URI)
		}
	}
	if l.Domain == "" {
		return bad(".domain", "must name the domain to fence (its libvirt name, as virsh list shows it)", "")
	}
	if strings.TrimSpace(l.Domain) != l.Domain || strings.ContainsAny(l.Domain, "/\x00") {
		return bad(".domain", "must be a libvirt domain name or UUID: no surrounding spaces, no '/'", strconv.Quote(l.Domain))
	}
	if s.Driver != DriverLibvirtLinkDown {
		switch {
		case l.Interface != "":
			return bad(".interface", "applies to driver "+DriverLibvirtLinkDown+" only", l.Interface)
		case l.MAC != "":
			return bad(".mac", "applies to driver "+DriverLibvirtLinkDown+" only", l.MAC)
		}
		return nil
	}
	switch {
	case l.Interface == "" && l.MAC == "":
		return bad(".interface", "one of interface (the host-side device, e.g. vnet3) or mac must pick the NIC", "")
	case l.Interface != "" && l.MAC != "":
		return bad(".mac", "give interface or mac, not both", l.MAC)
	case l.Interface != "":
		if rule := rules.InterfaceTarget(l.Interface); rule != "" {
			return bad(".interface", rule, l.Interface)
		}
	default:
		if rule := rules.MAC(l.MAC); rule != "" {
			return bad(".mac", rule, l.MAC)
		}
	}
	return nil
}

// libvirtSummary describes a libvirt step for events and logs.
func libvirtSummary(s StepSpec) string {
	l := s.Libvirt
	out := s.Driver + " " + l.Domain
	switch {
	case l.Interface != "":
		out += " interface " + l.Interface
	case l.MAC != "":
		out += " mac " + l.MAC
	}
	if l.URI != "" {
		out += " (" + l.URI + ")"
	}
	return truncate(out, maxSummary)
}
