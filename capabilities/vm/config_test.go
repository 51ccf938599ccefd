package vm

import (
	"errors"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"understudy/actors"
	"understudy/actors/resources/libvirt"
)

func decode(t *testing.T, text string) (Config, error) {
	t.Helper()
	var c Config
	dec := yaml.NewDecoder(strings.NewReader(text))
	dec.KnownFields(true)
	err := dec.Decode(&c)
	return c, err
}

func TestConfigDefaults(t *testing.T) {
	c, err := decode(t, "domain: pg-a\n")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate("vm"); err != nil {
		t.Fatal(err)
	}
	if c.ShutdownTimeout != 30*time.Second || c.FenceTimeout != DefaultFenceTimeout || c.ConnURI() != "qemu:///system" {
		t.Errorf("defaults: %+v, uri %s", c, c.ConnURI())
	}

	c, err = decode(t, "uri: qemu+ssh://root@kvm1/system\ndomain: pg-a\nshutdown_timeout: 1m30s\nfence_timeout: 1500ms\n")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate("vm"); err != nil {
		t.Fatal(err)
	}
	if c.ShutdownTimeout != 90*time.Second || c.FenceTimeout != 1500*time.Millisecond || c.ConnURI() != "qemu+ssh://root@kvm1/system" {
		t.Errorf("decoded: %+v", c)
	}
	out, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if back, err := decode(t, string(out)); err != nil || back != c {
		t.Errorf("round trip of %+v through\n%s= %+v, %v", c, out, back, err)
	}

	if _, err := decode(t, "domain: pg-a\nshutdown_timout: 10s\n"); err == nil {
		t.Error("a misspelt key was accepted")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		yaml, field, value string
	}{
		{"uri: qemu:///system\n", "pairs[0].vm.domain", ""},
		{"domain: ' pg-a'\n", "pairs[0].vm.domain", `" pg-a"`},
		{"domain: a/b\n", "pairs[0].vm.domain", `"a/b"`},
		{"uri: qemu+ssh:///system\ndomain: pg-a\n", "pairs[0].vm.uri", "qemu+ssh:///system"},
		{"domain: pg-a\nshutdown_timeout: 30\n", "pairs[0].vm.shutdown_timeout", `"30"`},
		{"domain: pg-a\nshutdown_timeout: 0s\n", "pairs[0].vm.shutdown_timeout", `"0s"`},
		{"domain: pg-a\nfence_timeout: -1s\n", "pairs[0].vm.fence_timeout", `"-1s"`},
	} {
		c, err := decode(t, tc.yaml)
		if err != nil {
			t.Fatalf("%q: %v", tc.yaml, err)
		}
		err = c.Validate("pairs[0].vm")
		var ce *actors.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field || ce.Value != tc.value {
			t.Errorf("%q: %v; want a ConfigError on %s = %s", tc.yaml, err, tc.field, tc.value)
		}
	}
	neg := Config{Domain: "pg-a", ShutdownTimeout: -time.Second}
	if err := neg.Validate("vm"); err == nil || !strings.Contains(err.Error(), "vm.shutdown_timeout") {
		t.Errorf("negative shutdown timeout: %v", err)
	}
}

func TestNew(t *testing.T) {
	conn := libvirt.NewDriverProcess(libvirt.DriverConfig{}, nil) // starts nothing until a call
	defer conn.Close()
	v, err := New(Config{Domain: "pg-a"}, conn, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v.FenceBudget() != DefaultFenceTimeout || v.cfg.ShutdownTimeout != DefaultShutdownTimeout || v.uri != "qemu:///system" {
		t.Errorf("zero durations and URI take the defaults: budget %v, %+v, %s", v.FenceBudget(), v.cfg, v.uri)
	}
	if conn.PID() != 0 {
		t.Error("New started understudy-libvirt")
	}
	var ce *actors.ConfigError
	if _, err := New(Config{}, conn, nil); !errors.As(err, &ce) || ce.Field != "vm.domain" {
		t.Errorf("New without a domain: %v", err)
	}
	if _, err := New(Config{Domain: "pg-a"}, nil, nil); err == nil {
		t.Error("New without a connector succeeded")
	}
}
