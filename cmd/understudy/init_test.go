package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"understudy/runtime"
)

func TestInitThreeSites(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "deploy")
	args := []string{"init", "--dir", dir, "--install-dir=", "--data-dir=",
		"--node", "site-a=127.0.0.1:14222:16222:19464", "--node", "site-b=127.0.0.1:14223:16223:19465",
		"--witness", "witness=127.0.0.1:14224:16224:19466", "--pair", "pg-main=site-a,site-b"}
	code, stdout, stderr := runCLI(t, args...)
	if code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
	}
	for _, want := range []string{
		"Deployment understudy in " + dir + ": 41 files created",
		"site-a (127.0.0.1, pairs: pg-main)\n    rsync -a " + filepath.Join(dir, "site-a") + "/ root@127.0.0.1:" + filepath.Join(dir, "site-a") + "/\n" +
			"    understudy serve --config " + filepath.Join(dir, "site-a", "node.yaml"),
		"witness (127.0.0.1, witness: a NATS replica only)",
		". " + filepath.Join(dir, "operator", "env"),
		". " + filepath.Join(dir, "reader", "env"),
		". " + filepath.Join(dir, "admin", "env"),
		"keep " + filepath.Join(dir, "admin") + " offline",
		"placeholder hooks",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
	for _, node := range []string{"site-a", "site-b", "witness"} {
		c, err := runtime.LoadConfigFile(filepath.Join(dir, node, "node.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", node, err)
		}
		if c.HTTP == "" || c.NATS.Server.Cluster == nil || len(c.NATS.Server.Cluster.Routes) != 2 {
			t.Errorf("%s: http %q cluster %+v", node, c.HTTP, c.NATS.Server.Cluster)
		}
		for name, id := range c.Security.Nodes {
			if len(id.CertSHA256) != 64 {
				t.Errorf("%s: node %s's certificate is not pinned: %q", node, name, id.CertSHA256)
			}
		}
		if len(c.Security.Admins) != 1 {
			t.Errorf("%s: admins %v", node, c.Security.Admins)
		}
	}

	// Again, as JSON: nothing new, everything kept.
	code, stdout, stderr = runCLI(t, append(args, "--json")...)
	if code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
	}
	var res runtime.DeployResult
	if err := json.Unmarshal([]byte(stdout), &res); err != nil {
		t.Fatalf("--json: %v\n%s", err, stdout)
	}
	if len(res.Created) != 0 || len(res.Updated) != 0 || len(res.Nodes) != 3 || !res.Nodes[2].Witness || res.Operator.Env != filepath.Join(dir, "operator", "env") {
		t.Errorf("second run: %+v", res)
	}
}

func TestInitErrorsNameTheFlag(t *testing.T) {
	dir := t.TempDir()
	three := []string{"--node", "site-a=10.0.0.1", "--node", "site-b=10.0.0.2", "--witness", "w=10.0.0.3"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--node", "a=10.0.0.1"}, "--dir is required"},
		{[]string{"--dir", dir}, "--node is required"},
		{[]string{"--dir", dir, "--node", "site-a"}, "--node site-a: must be NAME=HOST[:CLIENT_PORT[:CLUSTER_PORT[:HTTP_PORT]]]"},
		{[]string{"--dir", dir, "--node", "site-a=10.0.0.1:70000"}, "--node site-a=10.0.0.1:70000: CLIENT_PORT must be a port 1..65535"},
		{append([]string{"--dir", dir, "--pair", "pg=site-a"}, three...), "--pair pg=site-a: must be NAME=PRIMARY,REPLICA"},
		{[]string{"--dir", dir, "--node", "site-a=10.0.0.1", "--node", "site-b=10.0.0.2"}, "--node, --witness: must be one, or three or more"},
		{append([]string{"--dir", dir, "--pair", "pg=site-a,w"}, three...), "--pair pg=site-a,w: replica: must name a node that is not a witness"},
		{append([]string{"--dir", dir, "--pair", "pg=site-a,site-c"}, three...), "--pair pg=site-a,site-c: replica: must name a node of the deployment"},
		{[]string{"--dir", dir, "--node", "Site-A=10.0.0.1"}, "--node Site-A=10.0.0.1: name: must be lower-case"},
		{append([]string{"--dir", dir, "--install-dir", "etc"}, three...), "--install-dir: must be an absolute path"},
	} {
		code, _, stderr := runCLI(t, append([]string{"init"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", tc.args, code, stderr, exitUsage, tc.want)
		}
	}
}

func TestParseDeployNode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want runtime.DeployNode
	}{
		{"a=db1.example.com", runtime.DeployNode{Name: "a", Host: "db1.example.com"}},
		{"a=10.0.0.1:5222", runtime.DeployNode{Name: "a", Host: "10.0.0.1", ClientPort: 5222}},
		{"a=10.0.0.1::7222", runtime.DeployNode{Name: "a", Host: "10.0.0.1", ClusterPort: 7222}},
		{"a=10.0.0.1:1:2:3", runtime.DeployNode{Name: "a", Host: "10.0.0.1", ClientPort: 1, ClusterPort: 2, HTTP: "127.0.0.1:3"}},
		{"a=[fd00::1]:5222", runtime.DeployNode{Name: "a", Host: "fd00::1", ClientPort: 5222}},
	} {
		got, err := parseDeployNode(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v %v, want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"a", "=h", "a=fd00::1", "a=h:1:2:3:4", "a=h:x"} {
		if _, err := parseDeployNode(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
