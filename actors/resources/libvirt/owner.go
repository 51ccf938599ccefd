package libvirt

import (
	"encoding/xml"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Ownership. A libvirt name says nothing of who made the domain or network
// behind it: the vm and network kinds would adopt, redefine and delete
// whatever carries the name a spec asks for — the operator's hand-made VM
// included. So every definition they write carries an ownership marker in
// its <metadata> (libvirt keeps foreign namespaces there, in domains and,
// since long before its network metadata API of 9.7, in networks):
//
//	<metadata>
//	  <understudy:resource xmlns:understudy="https://understudy.dev/xmlns/resource/1" agent="n1" id="web"/>
//	</metadata>
//
// and they redefine or delete an object only when it carries theirs (an
// absent object is theirs to define). Anything else fails with an error
// wrapping ErrNotOwned that names the object and how to hand it over.

// MarkerNamespace is the XML namespace of the ownership marker.
const MarkerNamespace = "https://understudy.dev/xmlns/resource/1"

// markerPrefix is the marker's namespace prefix (virsh metadata --key).
const markerPrefix = "understudy"

// ErrNotOwned: a domain or network of that name exists and is not the
// resource's (no ownership marker, or another resource's).
var ErrNotOwned = errors.New("not managed by this resource")

// Owner is the resource a domain or network belongs to: the agent that
// runs it and its id in the agent's manifest. The zero Owner asks for no
// marker and checks none (the Hypervisor used directly, as the tests and
// fence steps do).
type Owner struct {
	Agent string
	ID    string
}

// IsZero reports the zero Owner.
func (o Owner) IsZero() bool { return o == Owner{} }

func (o Owner) String() string {
	agent := o.Agent
	if agent == "" {
		agent = "(unnamed)"
	}
	return "resource " + strconv.Quote(o.ID) + " of agent " + agent
}

// ownerXML reads the marker; metadataXML writes it.
type (
	metadataXML struct {
		// Inner is what is written: the marker with its prefix, which
		// encoding/xml cannot write (it would declare a default
		// namespace).
		Inner string `xml:",innerxml"`
		// Owner is what is read: the marker among whatever else the
		// metadata holds. Nil on writing.
		Owner *ownerXML `xml:"https://understudy.dev/xmlns/resource/1 resource"`
	}
	ownerXML struct {
		Agent string `xml:"agent,attr"`
		ID    string `xml:"id,attr"`
	}
)

// metadata is the <metadata> holding o's marker; nil for the zero Owner.
func (o Owner) metadata() *metadataXML {
	if o.IsZero() {
		return nil
	}
	return &metadataXML{Inner: o.marker(true)}
}

// marker is the marker element; with its namespace declared, or, for
// virsh metadata --key understudy --set, without.
func (o Owner) marker(declared bool) string {
	var b strings.Builder
	if declared {
		b.WriteString("<" + markerPrefix + ":resource xmlns:" + markerPrefix + `="` + MarkerNamespace + `"`)
	} else {
		b.WriteString("<resource")
	}
	for _, a := range [][2]string{{"agent", o.Agent}, {"id", o.ID}} {
		b.WriteString(" " + a[0] + `="`)
		_ = xml.EscapeText(&b, []byte(a[1]))
		b.WriteString(`"`)
	}
	b.WriteString("/>")
	return b.String()
}

func ownerOf(m *metadataXML) (Owner, bool) {
	if m == nil || m.Owner == nil {
		return Owner{}, false
	}
	return Owner{Agent: m.Owner.Agent, ID: m.Owner.ID}, true
}

// checkOwner returns nil when want is zero or the object's marker (found:
// it has one) names want; else an error wrapping ErrNotOwned that names
// the object and says what to do. what is "domain" or "network".
func checkOwner(what, name string, want, have Owner, found bool) error {
	if want.IsZero() || (found && have == want) {
		return nil
	}
	if found {
		return notOwned(fmt.Sprintf("%s %s belongs to understudy %s (its ownership marker), not to %s: two resources cannot manage one %s — give one of them another name (spec field name)",
			what, name, have, want, what))
	}
	handover := "virsh metadata " + name + " --config --uri " + MarkerNamespace + " --key " + markerPrefix + " --set '" + want.marker(false) + "'"
	if what == "network" {
		handover = "add " + want.marker(true) + " to its <metadata> (virsh net-edit " + name + ")"
	}
	return notOwned(fmt.Sprintf("%s %s exists and was not made by understudy: its definition has no ownership marker. Refusing to redefine or delete it: give the resource another name (spec field name), or hand the %s over to %s: %s",
		what, name, what, want, handover))
}

// notOwned is an error wrapping ErrNotOwned whose text is msg alone.
func notOwned(msg string) error { return &notOwnedError{msg} }

type notOwnedError struct{ msg string }

func (e *notOwnedError) Error() string { return e.msg }
func (e *notOwnedError) Unwrap() error { return ErrNotOwned }

// CheckDomainOwner checks that the domain whose definition is domainXML
// belongs to owner (see Owner); the understudy-libvirt process calls it
// before deleting a domain.
func CheckDomainOwner(name, domainXML string, owner Owner) error {
	if owner.IsZero() {
		return nil
	}
	d, err := parseDomain(domainXML)
	if err != nil {
		return err
	}
	have, found := ownerOf(d.Metadata)
	return checkOwner("domain", name, owner, have, found)
}

// CheckNetworkOwner is CheckDomainOwner for a network.
func CheckNetworkOwner(name, networkXML string, owner Owner) error {
	if owner.IsZero() {
		return nil
	}
	n, err := parseNetwork(networkXML)
	if err != nil {
		return err
	}
	have, found := ownerOf(n.Metadata)
	return checkOwner("network", name, owner, have, found)
}
