package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"understudy/runtime"
)

func newInitCmd(stdout io.Writer) *cobra.Command {
	var (
		spec     = runtime.DeploySpec{Cluster: runtime.DefaultDeployCluster, InstallDir: "/etc/understudy", DataDir: runtime.DefaultDeployDataDir}
		nodes    []string
		witness  []string
		pairs    []string
		asJSON   bool
		loopback bool
	)
	cmd := &cobra.Command{
		Use:   "init --dir DIR --node NAME=HOST ... [--witness NAME=HOST] --pair NAME=PRIMARY,REPLICA ...",
		Short: "Create a secured deployment: a CA, certificates, NATS identities and one node file per site",
		Long: `Creates in --dir what a secured deployment needs (docs/security.md):

  ca/          the CA (ca.pem, ca-key.pem): keep ca-key.pem offline, it signs
               new certificates when init runs again
  <node>/      one directory per node, to install as --install-dir on its
               machine: node.yaml, ca.pem, the node's certificate (cert.pem,
               key.pem, for both server and client authentication), its NATS
               identity (nats.nkey) and, for each pair it hosts, the pair file
               (pairs/<pair>.yaml) and placeholder hooks (hooks/<pair>/*)
  operator/    the operator's NATS identity (operator.nk), the manifest
               signing key (manifest-signing.nk), a client certificate and
               env, to source before running understudy commands
  admin/       the only identity that may change the assets' settings (a
               stream update: replicas, limits), with its certificate and
               env: keep it offline, like ca-key.pem
  reader/      a read-only identity (status, export, replay) and its env

Each node's embedded NATS server listens on its host with TLS, requires a
client certificate of the CA and one of the deployment's nkeys, and routes
to the other nodes' servers (one NATS cluster, JetStream assets at R3),
accepting as routes only the nodes' certificates, pinned in every node file
(security.nodes.<node>.cert_sha256).
A witness node hosts no pair member and no agent: it holds the third
replica, so that the cluster keeps its quorum when a pair's site is lost.

Running init again reuses the CA and every key: only what is missing is
created (add a node by running it with one more --node), node files are
rewritten (the previous one kept as node.yaml.prev), and a key is never
overwritten. A node left out of a later run loses its identity and its route
pin in the rewritten node files: install them on the remaining nodes to
revoke it. Files are 0600, directories 0700.`,
		Example: `  understudy init --dir ./deploy \
    --node site-a=10.0.1.10 --node site-b=10.0.2.10 --witness witness=10.0.3.10 \
    --pair pg-main=site-a,site-b`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			usage := func(err error) error { return &usageError{cmd: cmd.CommandPath(), err: err} }
			if spec.Dir == "" {
				return usage(errors.New("--dir is required: the directory that receives the deployment"))
			}
			var given []string // each node's flag as given, by index in spec.Nodes
			for _, f := range []struct {
				flag    string
				values  []string
				witness bool
			}{{"node", nodes, false}, {"witness", witness, true}} {
				for _, v := range f.values {
					n, err := parseDeployNode(v)
					if err != nil {
						return usage(fmt.Errorf("--%s %s: %w", f.flag, v, err))
					}
					n.Witness = f.witness
					spec.Nodes = append(spec.Nodes, n)
					given = append(given, "--"+f.flag+" "+v)
				}
			}
			if len(spec.Nodes) == 0 {
				return usage(errors.New("--node is required: give each site as --node NAME=HOST (and a third site as --witness NAME=HOST)"))
			}
			for _, v := range pairs {
				p, err := parseDeployPair(v)
				if err != nil {
					return usage(fmt.Errorf("--pair %s: %w", v, err))
				}
				spec.Pairs = append(spec.Pairs, p)
			}
			spec.Loopback = loopback
			res, err := runtime.Deploy(spec)
			if err != nil {
				var ce *runtime.ConfigError
				if errors.As(err, &ce) {
					return usage(initErrors(err, given, pairs))
				}
				return err
			}
			if asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			}
			printDeploy(stdout, res)
			return nil
		},
	}
	f := cmd.Flags()
	f.SortFlags = false
	f.StringVar(&spec.Dir, "dir", "", "directory that receives the deployment (created 0700; run init again on it to add nodes)")
	f.StringArrayVar(&nodes, "node", nil, "a site: NAME=HOST[:CLIENT_PORT[:CLUSTER_PORT[:HTTP_PORT]]], HOST its IP address or DNS name (ports default 4222, 6222, 9464 on 127.0.0.1); repeatable")
	f.StringArrayVar(&witness, "witness", nil, "a witness node (no pair member, no agent; a NATS replica only), same form as --node; repeatable")
	f.StringArrayVar(&pairs, "pair", nil, "a failover pair: NAME=PRIMARY,REPLICA, two --node names; repeatable")
	f.StringVar(&spec.Cluster, "cluster", spec.Cluster, "the NATS cluster's name")
	f.StringVar(&spec.InstallDir, "install-dir", spec.InstallDir, "where each node's directory is installed on its machine; the node files name their files there ({node}: the node's name; empty: where init writes them)")
	f.StringVar(&spec.DataDir, "data-dir", spec.DataDir, "every node's data_dir ({node}: the node's name)")
	f.BoolVar(&spec.Agents, "agents", false, "give every node that is not a witness an agent (needs understudy-libvirt on the node)")
	f.BoolVar(&loopback, "loopback-names", false, "add localhost, 127.0.0.1 and ::1 to every node's certificate (clients on the node's machine connecting by loopback)")
	f.BoolVar(&asJSON, "json", false, "print what was written as JSON")
	return cmd
}

// nodeSpecRE is NAME=HOST[:PORT[:PORT[:PORT]]], HOST an IPv6 address in
// brackets or anything without ':'.
var nodeSpecRE = regexp.MustCompile(`^([^=]+)=(\[[^\]]+\]|[^:\[\]]+)((?::[^:]*){0,3})$`)

func parseDeployNode(v string) (runtime.DeployNode, error) {
	m := nodeSpecRE.FindStringSubmatch(v)
	if _, host, _ := strings.Cut(v, "="); m == nil || strings.Count(host, ":") > 3 || net.ParseIP(host) != nil && strings.Contains(host, ":") {
		return runtime.DeployNode{}, errors.New("must be NAME=HOST[:CLIENT_PORT[:CLUSTER_PORT[:HTTP_PORT]]] (an IPv6 address in brackets)")
	}
	n := runtime.DeployNode{Name: m[1], Host: strings.Trim(m[2], "[]")}
	if m[3] == "" {
		return n, nil
	}
	names := []string{"CLIENT_PORT", "CLUSTER_PORT", "HTTP_PORT"}
	for i, p := range strings.Split(m[3][1:], ":") {
		if p == "" {
			continue // the default
		}
		port, err := strconv.Atoi(p)
		if err != nil || port < 1 || port > 65535 {
			return n, fmt.Errorf("%s must be a port 1..65535 (empty: the default), not %q", names[i], p)
		}
		switch i {
		case 0:
			n.ClientPort = port
		case 1:
			n.ClusterPort = port
		case 2:
			n.HTTP = net.JoinHostPort("127.0.0.1", p)
		}
	}
	return n, nil
}

func parseDeployPair(v string) (runtime.DeployPair, error) {
	name, members, ok := strings.Cut(v, "=")
	primary, replica, ok2 := strings.Cut(members, ",")
	if !ok || !ok2 || name == "" || primary == "" || replica == "" || strings.Contains(replica, ",") {
		return runtime.DeployPair{}, errors.New("must be NAME=PRIMARY,REPLICA, the preferred primary's node first")
	}
	return runtime.DeployPair{Name: name, Primary: primary, Replica: replica}, nil
}

// initFieldRE splits a deploy spec field: nodes[2].host → nodes, 2, host.
var initFieldRE = regexp.MustCompile(`^(nodes|pairs)\[(\d+)\](?:\.(.+))?$`)

// initErrors renders Deploy's configuration errors as the flags that
// gave the broken values.
func initErrors(err error, nodes, pairs []string) error {
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	flags := map[string]string{"dir": "--dir", "cluster": "--cluster", "install_dir": "--install-dir", "data_dir": "--data-dir", "nodes": "--node, --witness"}
	lines := []string{"invalid deployment:"}
	for _, e := range errs {
		var ce *runtime.ConfigError
		if !errors.As(e, &ce) {
			lines = append(lines, "  "+e.Error())
			continue
		}
		name := ce.Field
		if f, ok := flags[ce.Field]; ok {
			name = f
		} else if m := initFieldRE.FindStringSubmatch(ce.Field); m != nil {
			i, _ := strconv.Atoi(m[2])
			given := nodes
			if m[1] == "pairs" {
				given = pairs
				name = "--pair"
			}
			if i < len(given) {
				name = given[i]
				if m[1] == "pairs" {
					name = "--pair " + given[i]
				}
			}
			if m[3] != "" {
				name += ": " + m[3]
			}
		}
		lines = append(lines, fmt.Sprintf("  %s: %s", name, ce.Rule))
	}
	return &joinedConfigError{msg: strings.Join(lines, "\n"), errs: errs}
}

// printDeploy says what was written, what to copy where, and how to start.
func printDeploy(w io.Writer, res runtime.DeployResult) {
	fmt.Fprintf(w, "Deployment %s in %s: %d files created, %d node files updated, %d kept.\n",
		res.Cluster, res.Dir, len(res.Created), len(res.Updated), len(res.Kept))
	for _, u := range res.Updated {
		fmt.Fprintf(w, "  updated %s (the previous one is %s.prev)\n", u, filepath.Base(u))
	}
	fmt.Fprintf(w, "\nThe CA is %s; its key, %s, stays here (offline): it is needed\nonly to add nodes or renew certificates.\n",
		res.CA, filepath.Join(filepath.Dir(res.CA), runtime.DeployCAKeyFile))

	fmt.Fprintf(w, "\nOn each node's machine, install its directory (files 0600, directories 0700, owned by\nthe user understudy runs as) and start it:\n")
	for _, n := range res.Nodes {
		role := "pairs: " + strings.Join(n.Pairs, ", ")
		switch {
		case n.Witness:
			role = "witness: a NATS replica only"
		case len(n.Pairs) == 0:
			role = "no pairs"
		}
		fmt.Fprintf(w, "\n  %s (%s, %s)\n", n.Name, n.Host, role)
		fmt.Fprintf(w, "    rsync -a %s/ root@%s:%s/\n", n.Dir, bracketIPv6(n.Host), n.InstallDir)
		fmt.Fprintf(w, "    %s\n", n.Serve)
	}
	if hasPairs(res) {
		fmt.Fprintf(w, "\nEach pair member's procedures are placeholder hooks (<node>/hooks/<pair>/fence,\npromote, demote) that do nothing: replace them with the workload's own before\nit holds data (docs/failover.md). Init never rewrites them, nor the pair files.\n")
	}
	fmt.Fprintf(w, "\nOperator (rules, switchover, pause, failover, apply; %s):\n    . %s\n    understudy status\n", res.Operator.Dir, res.Operator.Env)
	fmt.Fprintf(w, "  Manifests are signed with %s\n  (public key %s, trusted by every node): keep it off the nodes.\n",
		filepath.Join(res.Operator.Dir, runtime.DeploySigningSeed), res.ManifestKey)
	fmt.Fprintf(w, "\nAdmin (the only identity that may change the assets' settings: replicas, limits; %s):\n    . %s\n", res.Admin.Dir, res.Admin.Env)
	fmt.Fprintf(w, "  A stream update can rewrite or purge any pair's history: keep %s offline, like the CA key.\n", res.Admin.Dir)
	fmt.Fprintf(w, "\nReader (status, export, replay only; %s):\n    . %s\n", res.Reader.Dir, res.Reader.Env)
	for _, warning := range res.Warnings {
		fmt.Fprintf(w, "\nwarning: %s\n", warning)
	}
}

func hasPairs(res runtime.DeployResult) bool {
	for _, n := range res.Nodes {
		if len(n.Pairs) > 0 {
			return true
		}
	}
	return false
}

func bracketIPv6(host string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]"
	}
	return host
}
