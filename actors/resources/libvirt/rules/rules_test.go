package rules

import (
	"strings"
	"testing"
)

func TestURIRules(t *testing.T) {
	for _, ok := range []string{
		"qemu:///system", "qemu:///session", "qemu+unix:///system", "qemu://host/system",
		"qemu+ssh://root@kvm1.example.net/system", "qemu+ssh://kvm1:2222/system?keyfile=/root/.ssh/id_ed25519&no_tty=1",
		"qemu+tls://[fd00::1]/system", "qemu+tcp://10.0.0.5:16509/system", "qemu+libssh2://u@h/system?known_hosts_verify=ignore",
		"test:///default", "test:///etc/understudy/test-node.xml",
	} {
		if rule := URI(ok); rule != "" {
			t.Errorf("%s refused: %s", ok, rule)
		}
	}
	for _, c := range []struct{ uri, rule string }{
		{"", "must be a libvirt URI"},
		{" qemu:///system", "no spaces"},
		{"localhost", "must be a libvirt URI"},
		{"xen:///system", "must use the driver qemu"},
		{"qemu:///", "must end in /system or /session"},
		{"qemu:///embed", "must end in /system or /session"},
		{"qemu+ssh:///system", "the ssh transport needs a host"},
		{"qemu+tls:///system", "the tls transport needs a host"},
		{"qemu+unix://host/system", "the unix transport is local"},
		{"qemu+carrier-pigeon://h/system", "unknown transport carrier-pigeon"},
		{"qemu+ssh://u:secret@h/system", "must not carry a password"},
		{"qemu+ssh://h/system?keyfil=/x", "unknown parameter keyfil"},
		{"qemu+ssh://h:99999/system", "bad port"},
		{"qemu:///system#x", "fragment"},
		{"qemu://root@/system", "names a user"},
		{"test:///", "must be /default or an absolute file"},
		{"test://host/default", "the test driver is local"},
	} {
		rule := URI(c.uri)
		if !strings.Contains(rule, c.rule) {
			t.Errorf("%q: rule %q, want one containing %q", c.uri, rule, c.rule)
		}
	}
	if !Remote("qemu+ssh://h/system") || !Remote("qemu://h/system") || Remote("qemu:///system") || Remote("test:///default") {
		t.Error("Remote")
	}
}

func TestMAC(t *testing.T) {
	for _, ok := range []string{"52:54:00:12:34:56", "52:54:00:AB:cd:EF", "02:00:00:00:00:01"} {
		if rule := MAC(ok); rule != "" {
			t.Errorf("%s refused: %s", ok, rule)
		}
	}
	for _, bad := range []string{"", "52:54:00:12:34", "52-54-00-12-34-56", "5254.0012.3456", "52:54:00:12:34:56:78", "01:00:5e:00:00:01", "ff:ff:ff:ff:ff:ff", "00:00:00:00:00:00", "52:54:00:12:34:5g"} {
		if MAC(bad) == "" {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestNames(t *testing.T) {
	for _, ok := range []string{"db-1", "Web_01", "vm.example+x", strings.Repeat("a", 64)} {
		if Name(ok) != "" {
			t.Errorf("%q refused", ok)
		}
	}
	for _, bad := range []string{"", "-db", "a/b", "a b", strings.Repeat("a", 65), "é"} {
		if Name(bad) == "" {
			t.Errorf("%q accepted", bad)
		}
	}
	if Bridge("virbr0") != "" || Bridge("a-very-long-bridge") == "" || InterfaceTarget("vnet3") != "" || InterfaceTarget("vnet 3") == "" {
		t.Error("Bridge/InterfaceTarget")
	}
}
