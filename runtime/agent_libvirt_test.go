package runtime

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"understudy/actors/agent"
	"understudy/actors/procedure"
	"understudy/actors/resources"
	"understudy/actors/resources/libvirt"
	"understudy/actors/resources/libvirt/rules"
)

// fakeDriver writes an executable understudy-libvirt into dir (never
// started by the config tests) and returns the node file line naming it.
func fakeDriver(t *testing.T, dir string) string {
	t.Helper()
	exe := writeFile(t, dir, "understudy-libvirt", "#!/bin/sh\nexit 1\n")
	if err := os.Chmod(exe, 0o755); err != nil {
		t.Fatal(err)
	}
	return "libvirt: {driver: " + exe + "}\n"
}

func TestAgentLibvirtURIConfig(t *testing.T) {
	dir := t.TempDir()
	lv := fakeDriver(t, dir)
	s, err := loadNode(t, dir, lv+"node: n1\nagent: {}\n").resolve()
	if err != nil || s.agent.LibvirtURI != "qemu:///system" {
		t.Fatalf("default: %+v %v", s.agent, err)
	}
	s, err = loadNode(t, dir, lv+"node: n1\nagent: {libvirt_uri: \"qemu+ssh://root@kvm1/system?keyfile=/etc/understudy/id\"}\n").resolve()
	if err != nil || s.agent.LibvirtURI != "qemu+ssh://root@kvm1/system?keyfile=/etc/understudy/id" {
		t.Fatalf("remote: %+v %v", s.agent, err)
	}
	for uri, rule := range map[string]string{
		"qemu+ssh:///system":      "the ssh transport needs a host",
		"qemu:///systen":          "must end in /system or /session",
		"lxc:///":                 "must use the driver qemu",
		"qemu+ssh://u:p@h/system": "must not carry a password",
	} {
		err := loadNode(t, dir, lv+"node: n1\nagent: {libvirt_uri: \""+uri+"\"}\n").Validate()
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != "agent.libvirt_uri" || !strings.Contains(ce.Rule, rule) || ce.Value != uri {
			t.Errorf("%s: %v; want agent.libvirt_uri: ...%s", uri, err, rule)
		}
	}
}

func TestNodeFileLibvirtFenceSteps(t *testing.T) {
	pair := "node: site-a\npairs:\n  - pair: pg-main\n    primary: site-a\n    replica: site-b\n    fence_grace: 5s\n    failover_timeout: 10s\n    procedures:\n      fence:\n        steps:\n" +
		"          - {name: stop, driver: exec, timeout: 1s, exec: {command: pg_ctl}}\n"
	ok := pair + "          - {name: off, driver: libvirt-destroy, timeout: 3s, libvirt: {uri: \"qemu+ssh://root@kvm1/system\", domain: pg-a}}\n" +
		"          - {name: cut, driver: libvirt-link-down, timeout: 1s, libvirt: {domain: pg-a, mac: \"52:54:00:12:34:56\"}}\n"
	dir := t.TempDir()
	lv := fakeDriver(t, dir)
	s, err := loadNode(t, dir, lv+ok).resolve()
	if err != nil {
		t.Fatal(err)
	}
	steps := s.members[0].Procedures.Fence.Steps
	if len(steps) != 3 || steps[1].Libvirt.Domain != "pg-a" || steps[2].Libvirt.MAC != "52:54:00:12:34:56" {
		t.Fatalf("%+v", steps)
	}
	err = loadNode(t, dir, lv+pair+"          - {name: off, driver: libvirt-destroy, timeout: 3s, libvirt: {uri: \"qemu+ssh:///system\", domain: pg-a}}\n").Validate()
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "pairs[0].procedures.fence.steps[1].libvirt.uri" || !strings.Contains(ce.Rule, "needs a host") {
		t.Fatalf("%v", err)
	}
	// Every node runs them.
	for _, name := range []string{"exec", procedure.DriverLibvirtDestroy, procedure.DriverLibvirtLinkDown} {
		if DefaultDrivers(libvirt.NewDriverProcess(libvirt.DriverConfig{}, nil))[name] == nil {
			t.Errorf("DefaultDrivers has no %s", name)
		}
	}
}

// libvirt.driver is the node's understudy-libvirt, for the agent and the
// pairs' libvirt steps alike: given, it must be an executable; not given,
// it must be found (next to understudy, or in PATH) when the node runs an
// agent or a libvirt step — at load, not at the first fence.
func TestLibvirtDriverConfig(t *testing.T) {
	dir := t.TempDir()
	lv := fakeDriver(t, dir)
	exe := filepath.Join(dir, "understudy-libvirt")
	plain := writeFile(t, dir, "not-executable", "")
	s, err := loadNode(t, dir, lv+"node: n1\nagent: {}\n").resolve()
	if err != nil || s.agent.LibvirtDriver.Path != exe || s.libvirtDriver.Path != exe {
		t.Fatalf("%+v %+v %v", s.agent, s.libvirtDriver, err)
	}
	for path, rule := range map[string]string{
		"bin/understudy-libvirt":      "must be an absolute path",
		filepath.Join(dir, "missing"): "no such file or directory",
		dir:                           "not a directory or a device",
		plain:                         "must be executable",
	} {
		err := loadNode(t, dir, "node: n1\nlibvirt: {driver: \""+path+"\"}\n").Validate()
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != "libvirt.driver" || !strings.Contains(ce.Rule, rule) || ce.Value != path {
			t.Errorf("%s: %v; want libvirt.driver: ...%s", path, err, rule)
		}
	}

	// Not given: found in PATH (or next to the executable) at load.
	pairWith := func(driver, fields string) string {
		return "node: site-a\npairs:\n  - pair: pg-main\n    primary: site-a\n    replica: site-b\n    fence_grace: 5s\n    failover_timeout: 10s\n    procedures:\n      fence:\n        steps:\n" +
			"          - {name: off, driver: " + driver + ", timeout: 3s, libvirt: {" + fields + "}}\n"
	}
	t.Setenv("PATH", dir)
	for _, node := range []string{"node: n1\nagent: {}\n", pairWith("libvirt-destroy", "domain: pg-a")} {
		s, err := loadNode(t, dir, node).resolve()
		if err != nil || s.libvirtDriver.Path != exe {
			t.Fatalf("found in PATH: %+v %v", s.libvirtDriver, err)
		}
	}
	t.Setenv("PATH", t.TempDir())
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	want := "config: libvirt.driver: understudy-libvirt not found next to " + self + " or in PATH: build it with make build, or set libvirt.driver"
	for _, node := range []string{"node: n1\nagent: {}\n", pairWith("libvirt-link-down", "domain: pg-a, mac: \"52:54:00:12:34:56\"")} {
		err := loadNode(t, dir, node).Validate()
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != "libvirt.driver" || err.Error() != want {
			t.Errorf("%s: %v\nwant %s", node, err, want)
		}
	}
	// A node that runs no agent and no libvirt step needs none.
	if s, err := loadNode(t, dir, "node: n1\n").resolve(); err != nil || s.libvirtDriver != (libvirt.DriverConfig{}) {
		t.Fatalf("a node without libvirt: %+v %v", s.libvirtDriver, err)
	}

	// agent.libvirt_driver moved.
	err = loadNode(t, dir, "node: n1\nagent: {libvirt_driver: "+exe+"}\n").Validate()
	if err == nil || !strings.Contains(err.Error(), "config: agent.libvirt_driver = "+exe+": moved to libvirt.driver") {
		t.Errorf("agent.libvirt_driver: %v", err)
	}
}

func TestAgentRegistryValidatesLibvirtKindsWithoutConnecting(t *testing.T) {
	// A URI nobody answers, and a driver that leaves a mark when started:
	// validation must try neither.
	dir := t.TempDir()
	marker := filepath.Join(dir, "started")
	driver := writeFile(t, dir, "understudy-libvirt", "#!/bin/sh\ntouch "+marker+"\n")
	if err := os.Chmod(driver, 0o755); err != nil {
		t.Fatal(err)
	}
	reg := AgentRegistry(AgentConfig{LibvirtURI: "qemu+ssh://nowhere.invalid/system", LibvirtDriver: libvirt.DriverConfig{Path: driver}}, resources.NewProcess())
	for _, k := range []string{"vm", "network"} {
		if _, err := reg.Get(k); err != nil {
			t.Fatal(err)
		}
	}
	m := agent.Manifest{Agent: "n1", Resources: []agent.Resource{
		res("lab", "network", map[string]any{"ip": "10.5.0.1/24"}),
		res("web", "vm", map[string]any{"memory": "1GiB", "disks": []any{map[string]any{"path": "/w.img"}}, "nics": []any{map[string]any{"network": "lab", "mac": "52:54:00:zz:00:00"}}}),
	}}
	err := m.Validate(reg, true)
	if err == nil || !strings.Contains(err.Error(), "resources[1].spec: vm spec: nics[0].mac: must be a MAC address") {
		t.Fatalf("%v", err)
	}
	m.Resources[1].Spec["nics"] = []any{map[string]any{"network": "lab"}}
	if err := m.Validate(reg, true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("validation started the libvirt driver process (%v)", err)
	}
}

// TestAgentConvergesLibvirtKinds runs the vm and network kinds in a real
// agent against libvirt's test driver: converge, repair a domain destroyed
// behind the agent's back, delete, and close the connection at stop. The
// agent and the test share one understudy-libvirt (on a socket): the test
// driver's state is per process, and the test's own connection to that
// process is how it acts behind the agent's back.
func TestAgentConvergesLibvirtKinds(t *testing.T) {
	sock := libvirtDriverSocket(t)
	behindDriver := libvirt.NewDriverProcess(libvirt.DriverConfig{Socket: sock}, nil)
	defer behindDriver.Close()
	behind := behindDriver.Hypervisor(rules.TestURI)
	ctx := context.Background()
	w := startAgentWorld(t, AgentConfig{ID: "lv1", LibvirtURI: rules.TestURI, LibvirtDriver: libvirt.DriverConfig{Socket: sock},
		ObserveInterval: 100 * time.Millisecond, RetryBase: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond})
	lab := res("lab", "network", map[string]any{"bridge": "virbr42", "ip": "10.42.0.1/24",
		"dhcp": map[string]any{"start": "10.42.0.10", "end": "10.42.0.99"}})
	web := res("web", "vm", map[string]any{"domain_type": "test", "vcpus": 2, "memory": "1GiB",
		"disks": []any{map[string]any{"path": "/var/lib/libvirt/images/web.qcow2"}},
		"nics":  []any{map[string]any{"network": "lab", "mac": "52:54:00:42:00:01"}}})
	m := w.apply(agent.Manifest{Resources: []agent.Resource{lab, web}})
	ready := func(s agent.Status, id string) bool {
		r, ok := s.Resources[id]
		return ok && r.Phase == agent.Ready && r.Generation == s.ManifestGeneration
	}
	s := w.waitStatus("converged", func(s agent.Status) bool {
		return s.ManifestGeneration == m.Generation && ready(s, "lab") && ready(s, "web")
	})
	if d := s.Resources["web"].Details; d["state"] != "running" || d["macs"] != "52:54:00:42:00:01" {
		t.Fatalf("web details %v", d)
	}
	if d := s.Resources["lab"].Details; d["active"] != "true" || d["bridge"] != "virbr42" {
		t.Fatalf("lab details %v", d)
	}

	// Destroyed behind the agent's back: the periodic observation finds it
	// and the agent starts it again.
	if was, err := behind.Destroy(ctx, "web"); err != nil || !was {
		t.Fatalf("destroy behind the agent's back: was running %v, %v", was, err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if st, err := behind.DomainStatus(ctx, "web"); err == nil && st.State == libvirt.StateRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent did not start the destroyed domain again")
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Removed from the manifest: destroyed and undefined.
	m = w.apply(agent.Manifest{Resources: []agent.Resource{lab}})
	w.waitStatus("web deleted", func(s agent.Status) bool {
		_, has := s.Resources["web"]
		return s.ManifestGeneration == m.Generation && !has && ready(s, "lab")
	})
	if st, err := behind.DomainStatus(ctx, "web"); err != nil || st.Defined {
		t.Fatalf("web is still defined: %+v %v", st, err)
	}

	// The agent closes its connection when it stops: with ours closed too,
	// test:///default starts afresh in that process. (Looked at through
	// connections of their own, which do not keep the state alive.)
	w.a.Stop()
	if err := behindDriver.Close(); err != nil {
		t.Fatal(err)
	}
	fresh := libvirt.NewDriverProcess(libvirt.DriverConfig{Socket: sock}, nil)
	defer fresh.Close()
	deadline = time.Now().Add(5 * time.Second)
	for {
		st, err := fresh.Fresh(rules.TestURI).NetworkStatus(ctx, "lab")
		if err != nil {
			t.Fatal(err)
		}
		if !st.Defined {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("network lab outlived every connection: the agent kept its libvirt connection open after Stop")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The agent's own understudy-libvirt: started by the libvirt kinds' first
// call (not before), a child of the agent's process, stopped with the
// agent.
func TestAgentRunsLibvirtInItsOwnDriverProcess(t *testing.T) {
	bin := libvirtDriverBinary(t)
	w := startAgentWorld(t, AgentConfig{ID: "lv2", LibvirtURI: rules.TestURI, LibvirtDriver: libvirt.DriverConfig{Path: bin},
		ObserveInterval: time.Hour, RetryBase: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond})
	m := w.apply(agent.Manifest{Resources: []agent.Resource{res("motd", "file", map[string]any{"path": filepath.Join(t.TempDir(), "motd"), "content": "x"})}})
	w.waitStatus("file ready", func(s agent.Status) bool {
		return s.ManifestGeneration == m.Generation && s.Resources["motd"].Phase == agent.Ready
	})
	if pids := childrenRunning(t, bin); len(pids) != 0 {
		t.Fatalf("understudy-libvirt runs (%v) though no libvirt kind was used", pids)
	}
	m = w.apply(agent.Manifest{Resources: []agent.Resource{res("solo", "network", map[string]any{"ip": "10.44.0.1/24"})}})
	s := w.waitStatus("network ready", func(s agent.Status) bool {
		r := s.Resources["solo"]
		return s.ManifestGeneration == m.Generation && r.Phase == agent.Ready && r.Generation == m.Generation
	})
	if d := s.Resources["solo"].Details; d["active"] != "true" || d["ip"] != "10.44.0.1/24" {
		t.Fatalf("network details %v", d)
	}
	pids := childrenRunning(t, bin)
	if len(pids) != 1 {
		t.Fatalf("understudy-libvirt processes: %v, want one", pids)
	}
	w.a.Stop()
	if after := childrenRunning(t, bin); len(after) != 0 {
		t.Fatalf("understudy-libvirt still runs after the agent stopped: %v", after)
	}
}

func TestAgentContainerConfig(t *testing.T) {
	dir := t.TempDir()
	s, err := loadNode(t, dir, fakeDriver(t, dir)+"node: n1\nagent:\n  container:\n    runtime: runc\n    ulimits: [nofile=1024:1024, nproc=1024:1024]\n    env: {CONTAINERS_CONF: /etc/understudy/containers.conf, A: b}\n").resolve()
	if err != nil {
		t.Fatal(err)
	}
	p := s.agent.Podman
	if p.Runtime != "runc" || len(p.Ulimits) != 2 || strings.Join(p.Env, " ") != "A=b CONTAINERS_CONF=/etc/understudy/containers.conf" {
		t.Errorf("podman config %+v", p)
	}
	for yaml, want := range map[string]string{
		"cgroups: off":         "config: agent.container.cgroups = off: must be one of",
		"ulimits: [host, x]":   "config: agent.container.ulimits[1] = x: must be a podman ulimit",
		"env: {\"\": nothing}": "agent.container.env = =nothing: must be NAME=value",
	} {
		err := loadNode(t, dir, fakeDriver(t, dir)+"node: n1\nagent:\n  container: {"+yaml+"}\n").Validate()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", yaml, err, want)
		}
	}
}

func TestAgentCallTimeoutConfig(t *testing.T) {
	dir := t.TempDir()
	lv := fakeDriver(t, dir)
	s, err := loadNode(t, dir, lv+"node: n1\nagent: {call_timeout: 2m}\n").resolve()
	if err != nil || s.agent.CallTimeout != 2*time.Minute {
		t.Fatalf("%+v %v", s.agent, err)
	}
	err = loadNode(t, dir, lv+"node: n1\nagent: {call_timeout: 10ms}\n").Validate()
	if err == nil || !strings.Contains(err.Error(), "config: agent.call_timeout = 10ms: must be a duration from 1s to 24h") {
		t.Errorf("%v", err)
	}
}
