package libvirt

import (
	"fmt"
	"strings"
)

// What libvirt reports, read and compared with a config. Pure: the
// understudy-libvirt process calls Redefinition, DomainNICs and
// NetworkBridge on what it got from libvirt; the kinds compare the
// statuses it returns with their specs.

// IsUUID reports whether a domain reference is a UUID rather than a name.
func IsUUID(ref string) bool { return uuidRE.MatchString(ref) }

// Redefinition returns the domain XML to define so that the domain libvirt
// reports as st gets v's definition: "" when st is a defined, persistent
// domain whose persistent definition (st.XML) already is v's. The XML
// keeps st's UUID and the MACs libvirt gave the NICs v leaves without one,
// so a redefinition changes neither. A defined domain that is not v.Owner's
// is an error wrapping ErrNotOwned (see Owner). v is not modified.
func (v *VM) Redefinition(st DomainStatus) (string, error) {
	var saved definition
	if st.Defined {
		d, err := parseDomain(st.XML)
		if err != nil {
			return "", err
		}
		have, found := ownerOf(d.Metadata)
		if err := checkOwner("domain", v.Name, v.Owner, have, found); err != nil {
			return "", err
		}
		saved = definitionOf(d)
	}
	if st.Defined && st.Persistent && len(definitionOf(v.domain()).diff(saved)) == 0 {
		return "", nil
	}
	def := *v
	def.NICs = carryMACs(v.NICs, saved.NICs)
	if st.Defined {
		def.UUID = st.UUID
	}
	return def.DomainXML()
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

// Redefinition returns the network XML to define so that the network
// libvirt reports as st gets n's definition: "" when st is a defined,
// persistent network whose definition already is n's. restart says st is
// active with another definition: it must be stopped before the new one is
// defined (a definition given to an active network waits for its restart,
// and the test driver never applies it), then started again. The XML
// keeps st's UUID. A defined network that is not n.Owner's is an error
// wrapping ErrNotOwned.
func (n *Network) Redefinition(st NetworkStatus) (xml string, restart bool, err error) {
	changed := false
	if st.Defined {
		parsed, err := parseNetwork(st.XML)
		if err != nil {
			return "", false, err
		}
		have, found := ownerOf(parsed.Metadata)
		if err := checkOwner("network", n.Name, n.Owner, have, found); err != nil {
			return "", false, err
		}
		changed = len(netDefinitionOf(n.network()).diff(netDefinitionOf(parsed))) > 0
	}
	if st.Defined && st.Persistent && !changed {
		return "", false, nil
	}
	def := *n
	if st.Defined {
		def.UUID = st.UUID
	}
	xml, err = def.NetworkXML()
	return xml, changed && st.Active, err
}

// DomainNICs lists the NICs of a domain XML as libvirt reports it.
func DomainNICs(domainXML string) ([]NICStatus, error) {
	d, err := parseDomain(domainXML)
	if err != nil {
		return nil, err
	}
	var out []NICStatus
	for _, n := range definitionOf(d).NICs {
		out = append(out, NICStatus{MAC: n.MAC, Target: n.Target, Source: n.Source, Link: n.Link})
	}
	return out, nil
}

// NetworkBridge is the bridge a network XML names ("" for none).
func NetworkBridge(networkXML string) (string, error) {
	n, err := parseNetwork(networkXML)
	if err != nil {
		return "", err
	}
	return netDefinitionOf(n).Bridge, nil
}

// domainInfo is a domain's status with its definitions read: the
// persistent one (what the next boot runs) and, while active, the live one.
type domainInfo struct {
	status DomainStatus
	saved  definition
	live   *definition
	owner  Owner // the persistent definition's ownership marker,
	marked bool  // if it has one
}

func readDomain(st DomainStatus) (domainInfo, error) {
	info := domainInfo{status: st}
	if !st.Defined {
		return info, nil
	}
	d, err := parseDomain(st.XML)
	if err != nil {
		return domainInfo{}, err
	}
	info.saved = definitionOf(d)
	info.owner, info.marked = ownerOf(d.Metadata)
	if st.LiveXML != "" {
		d, err := parseDomain(st.LiveXML)
		if err != nil {
			return domainInfo{}, err
		}
		live := definitionOf(d)
		info.live = &live
	}
	return info, nil
}

type networkInfo struct {
	status NetworkStatus
	saved  netDefinition
	owner  Owner
	marked bool
}

func readNetwork(st NetworkStatus) (networkInfo, error) {
	info := networkInfo{status: st}
	if !st.Defined {
		return info, nil
	}
	n, err := parseNetwork(st.XML)
	if err != nil {
		return networkInfo{}, err
	}
	info.saved = netDefinitionOf(n)
	info.owner, info.marked = ownerOf(n.Metadata)
	return info, nil
}

// CheckVMState returns the error for a state EnsureVM does not take.
func CheckVMState(state string) error {
	if state != StateRunning && state != StateShutoff {
		return fmt.Errorf("libvirt: state must be %s or %s (got %q)", StateRunning, StateShutoff, state)
	}
	return nil
}
