// Package rules holds libvirt's naming rules as pure functions: connection
// URIs, MAC addresses, domain and network names. Packages that must not
// link libvirt (the procedure package checks fence steps at config load)
// apply the same rules as the driver in actors/resources/libvirt.
//
// Each function returns the rule a value breaks, "" when it breaks none;
// the caller wraps it in its own error type with the field's path.
package rules

import (
	"net"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strings"
)

// DefaultURI is the connection URI used when none is configured: the
// local system libvirtd (or virtqemud).
const DefaultURI = "qemu:///system"

// TestURI is libvirt's built-in test driver, with its default in-memory
// state. The tests use it; it is accepted everywhere a URI is.
const TestURI = "test:///default"

// uriExample is quoted by every URI rule.
const uriExample = "such as qemu:///system or qemu+ssh://user@host/system"

// remoteTransports need a host; the local ones must not have one.
var remoteTransports = []string{"ssh", "libssh", "libssh2", "tls", "tcp"}

// uriParams are the query parameters libvirt's remote driver knows
// (https://libvirt.org/uri.html#remote-uris).
var uriParams = []string{
	"command", "keyfile", "known_hosts", "known_hosts_verify", "mode", "name",
	"netcat", "no_tty", "no_verify", "pkipath", "proxy", "socket", "sshauth",
	"tls_priority",
}

// URI returns the rule a libvirt connection URI breaks: driver qemu with
// path /system or /session, locally or over a remote transport (ssh,
// libssh, libssh2, tls, tcp: these need a host), or the test driver
// (test:///default or test:///<absolute file>).
func URI(raw string) string {
	if strings.TrimSpace(raw) != raw || raw == "" {
		return "must be a libvirt URI " + uriExample + " (no spaces)"
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || u.Opaque != "" {
		return "must be a libvirt URI " + uriExample
	}
	driver, transport, hasTransport := strings.Cut(u.Scheme, "+")
	switch {
	case u.Fragment != "" || strings.Contains(raw, "#"):
		return "must not have a #fragment"
	case u.User != nil && func() bool { _, set := u.User.Password(); return set }():
		return "must not carry a password: authenticate with ssh keys, TLS certificates or SASL"
	}
	for k := range u.Query() {
		if !slices.Contains(uriParams, k) {
			return "has an unknown parameter " + k + "; libvirt knows " + strings.Join(uriParams, ", ")
		}
	}
	switch driver {
	case "test":
		if hasTransport || u.Host != "" || u.User != nil || u.RawQuery != "" {
			return "the test driver is local: test:///default or test:///<absolute file>"
		}
		if u.Path == "/default" || (path.IsAbs(u.Path) && path.Clean(u.Path) == u.Path && u.Path != "/") {
			return ""
		}
		return "the test driver's path must be /default or an absolute file (test:///default)"
	case "qemu":
	default:
		return "must use the driver qemu (or test for tests), " + uriExample + " (got " + u.Scheme + ")"
	}
	remote := false
	switch {
	case !hasTransport:
		// qemu://host/system is TLS to host; qemu:///system is local.
		remote = u.Host != ""
	case transport == "unix":
		if u.Host != "" {
			return "the unix transport is local: it takes no host (qemu+unix:///system)"
		}
	case slices.Contains(remoteTransports, transport):
		remote = true
		if u.Hostname() == "" {
			return "the " + transport + " transport needs a host: qemu+" + transport + "://[user@]host/system"
		}
	default:
		return "has an unknown transport " + transport + "; use one of unix, " + strings.Join(remoteTransports, ", ")
	}
	if remote {
		if p := u.Port(); p != "" && !validPort(p) {
			return "has a bad port " + p
		}
	} else if u.User != nil {
		return "names a user, but only remote transports log in (qemu+ssh://user@host/system)"
	}
	if u.Path != "/system" && u.Path != "/session" {
		return "must end in /system or /session, " + uriExample + " (got path " + quote(u.Path) + ")"
	}
	return ""
}

// Remote reports whether a valid URI reaches libvirt over the network.
func Remote(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	_, transport, _ := strings.Cut(u.Scheme, "+")
	return u.Host != "" && transport != "unix"
}

func validPort(p string) bool {
	if len(p) > 5 {
		return false
	}
	n := 0
	for _, c := range p {
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int(c-'0')
	}
	return n > 0 && n < 65536
}

func quote(s string) string {
	if s == "" {
		return "empty"
	}
	return s
}

// MAC returns the rule a NIC's MAC address breaks: six colon-separated hex
// octets of a unicast address (libvirt refuses multicast ones).
func MAC(s string) string {
	hw, err := net.ParseMAC(s)
	if err != nil || len(hw) != 6 || strings.Count(s, ":") != 5 {
		return "must be a MAC address of six colon-separated hex octets, such as 52:54:00:12:34:56"
	}
	if hw[0]&1 == 1 {
		return "must be a unicast MAC address (the first octet's lowest bit clear), such as 52:54:00:12:34:56"
	}
	if string(hw) == string(make([]byte, 6)) {
		return "must not be 00:00:00:00:00:00"
	}
	return ""
}

// NormalizeMAC lower-cases a valid MAC, the form libvirt reports.
func NormalizeMAC(s string) string { return strings.ToLower(s) }

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.+-]*$`)

// MaxNameLen bounds a domain or network name.
const MaxNameLen = 64

// Name returns the rule a libvirt domain or network name breaks: letters,
// digits and _ . + -, starting with a letter or digit, at most MaxNameLen.
// (libvirt itself allows more; these names also appear in paths, bridge
// and log file names, where spaces and slashes break things.)
func Name(s string) string {
	if !nameRE.MatchString(s) || len(s) > MaxNameLen {
		return "must be letters, digits, _ . + and -, starting with a letter or digit, at most 64 characters"
	}
	return ""
}

// Bridge returns the rule a Linux bridge device name breaks: at most 15
// characters, no slash, colon or whitespace.
func Bridge(s string) string {
	if s == "" || len(s) > 15 || strings.ContainsAny(s, "/: \t\n") || s == "." || s == ".." {
		return "must be a network device name: 1 to 15 characters, no '/', ':' or spaces"
	}
	return ""
}

// InterfaceTarget returns the rule a NIC's host-side device name (the
// <target dev=...> libvirt gives a running domain's NIC, e.g. vnet3) breaks.
func InterfaceTarget(s string) string {
	if rule := Bridge(s); rule != "" {
		return "must be the host-side device name of the domain's NIC (virsh domiflist), 1 to 15 characters, no '/', ':' or spaces"
	}
	return ""
}
