package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"understudy/runtime"
)

// flagOf maps a configuration field (its YAML path, as runtime.ConfigError
// names it) to the serve flag that sets it.
var flagOf = map[string]string{
	"data_dir":             "data-dir",
	"nats.listen":          "nats-listen",
	"nats.url":             "nats-url",
	"nats.user":            "nats-user",
	"nats.password":        "nats-password",
	"nats.creds":           "nats-creds",
	"nats.nkey":            "nats-nkey",
	"nats.tls.ca":          "nats-tls-ca",
	"nats.tls.cert":        "nats-tls-cert",
	"nats.tls.key":         "nats-tls-key",
	"nats.tls.server_name": "nats-tls-server-name",
	"nats.tls.insecure":    "nats-tls-insecure",
	"assets.replicas":      "replicas",
	"http":                 "http",
	"log.level":            "log-level",
	"log.format":           "log-format",
}

// envOf names the environment variables read for flags not given: secrets
// are better kept off the command line, which every user can see in ps.
var envOf = map[string]string{
	"nats-url":      "UNDERSTUDY_NATS_URL",
	"nats-user":     "UNDERSTUDY_NATS_USER",
	"nats-password": "UNDERSTUDY_NATS_PASSWORD",
	"nats-creds":    "UNDERSTUDY_NATS_CREDS",
	"nats-nkey":     "UNDERSTUDY_NATS_NKEY",
	// The TLS files: the names the other commands read too (cliEnv).
	"nats-tls-ca":          "UNDERSTUDY_NATS_TLS_CA",
	"nats-tls-cert":        "UNDERSTUDY_NATS_TLS_CERT",
	"nats-tls-key":         "UNDERSTUDY_NATS_TLS_KEY",
	"nats-tls-server-name": "UNDERSTUDY_NATS_TLS_SERVER_NAME",
}

// overrideFromFlag copies a flag's value from the flag-bound config onto the
// node file's, for the flags given on the command line.
var overrideFromFlag = map[string]func(dst, src *runtime.Config){
	"data-dir":             func(d, s *runtime.Config) { d.DataDir = s.DataDir },
	"nats-listen":          func(d, s *runtime.Config) { d.NATS.Listen = s.NATS.Listen },
	"nats-url":             func(d, s *runtime.Config) { d.NATS.URL = s.NATS.URL },
	"nats-user":            func(d, s *runtime.Config) { d.NATS.User = s.NATS.User },
	"nats-password":        func(d, s *runtime.Config) { d.NATS.Password = s.NATS.Password },
	"nats-creds":           func(d, s *runtime.Config) { d.NATS.Creds = s.NATS.Creds },
	"nats-nkey":            func(d, s *runtime.Config) { d.NATS.NKey = s.NATS.NKey },
	"nats-tls-ca":          func(d, s *runtime.Config) { d.NATS.TLS.CA = s.NATS.TLS.CA },
	"nats-tls-cert":        func(d, s *runtime.Config) { d.NATS.TLS.Cert = s.NATS.TLS.Cert },
	"nats-tls-key":         func(d, s *runtime.Config) { d.NATS.TLS.Key = s.NATS.TLS.Key },
	"nats-tls-server-name": func(d, s *runtime.Config) { d.NATS.TLS.ServerName = s.NATS.TLS.ServerName },
	"nats-tls-insecure":    func(d, s *runtime.Config) { d.NATS.TLS.Insecure = s.NATS.TLS.Insecure },
	"replicas":             func(d, s *runtime.Config) { d.Assets.Replicas = s.Assets.Replicas },
	"http":                 func(d, s *runtime.Config) { d.HTTP = s.HTTP },
	"log-level":            func(d, s *runtime.Config) { d.Log.Level = s.Log.Level },
	"log-format":           func(d, s *runtime.Config) { d.Log.Format = s.Log.Format },
}

func newServeCmd(stderr io.Writer) *cobra.Command {
	cfg := runtime.DefaultConfig()
	var configFile string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the node: NATS (embedded or external), provisioning, health and metrics",
		Long: `Run the node until SIGINT or SIGTERM.

By default it embeds a NATS server with JetStream, storing its data in
--data-dir with synchronous writes. With --nats-url it joins an existing NATS
cluster instead, creating the JetStream assets with 3 replicas (--replicas),
and retries until that NATS is reachable. Run those servers' JetStream with
"sync_interval: always", as the embedded one is: the leadership register
must not lose acknowledged writes.

A node file's nats.server.cluster makes the embedded server one member of a
NATS cluster with the other sites' (one understudy serve per site, three
sites: the assets then have 3 replicas); a node with no pairs and no agent
is a witness, holding only its replica. Off loopback the embedded server
requires TLS (nats.server.tls) and the deployment's identities (security,
with this node's --nats-nkey): understudy init writes them (docs/security.md).

It serves /healthz and Prometheus /metrics on --http and logs "ready" once
the assets are provisioned.

Environment variables, read for the flags of the same name when those are
not given (keep secrets off the command line):
  ` + strings.Join(sortedEnv(), "\n  "),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configFile != "" {
				fileCfg, err := runtime.LoadConfigFile(configFile)
				if err != nil {
					return &usageError{cmd: cmd.CommandPath(), err: err}
				}
				// Flags given on the command line win over the file.
				cmd.Flags().Visit(func(f *pflag.Flag) {
					if set, ok := overrideFromFlag[f.Name]; ok {
						set(&fileCfg, &cfg)
					}
				})
				cfg = fileCfg
			}
			for flag, env := range envOf {
				if v, ok := os.LookupEnv(env); ok && !cmd.Flags().Changed(flag) {
					if err := cmd.Flags().Set(flag, v); err != nil {
						return &usageError{cmd: cmd.CommandPath(), err: fmt.Errorf("%s: %w", env, err)}
					}
				}
			}
			if err := cfg.Validate(); err != nil {
				return &usageError{cmd: cmd.CommandPath(), err: configErrors(err)}
			}
			cfg.LogOutput = stderr
			return runtime.Serve(cmd.Context(), cfg)
		},
	}
	f := cmd.Flags()
	f.SortFlags = false
	f.StringVar(&configFile, "config", "", "YAML node file: node name, NATS, data_dir, http, and the pairs this node hosts (see docs/operations.md); flags override it")
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory of the embedded NATS server's JetStream data")
	f.StringVar(&cfg.NATS.Listen, "nats-listen", cfg.NATS.Listen, "client address of the embedded NATS server (port 0: any free port)")
	f.StringVar(&cfg.NATS.URL, "nats-url", cfg.NATS.URL, "external NATS URL(s), comma-separated; no server is embedded then")
	f.StringVar(&cfg.NATS.User, "nats-user", cfg.NATS.User, "user name for the external NATS")
	f.StringVar(&cfg.NATS.Password, "nats-password", cfg.NATS.Password, "password for the external NATS (prefer $UNDERSTUDY_NATS_PASSWORD)")
	f.StringVar(&cfg.NATS.Creds, "nats-creds", cfg.NATS.Creds, "credentials file (JWT and nkey seed) for the external NATS")
	f.StringVar(&cfg.NATS.NKey, "nats-nkey", cfg.NATS.NKey, "file of this node's user nkey seed (SU...): its NATS identity, embedded or external (understudy init writes it)")
	f.StringVar(&cfg.NATS.TLS.CA, "nats-tls-ca", cfg.NATS.TLS.CA, "PEM file of the CAs that sign the NATS servers' certificates")
	f.StringVar(&cfg.NATS.TLS.Cert, "nats-tls-cert", cfg.NATS.TLS.Cert, "client certificate (PEM) for TLS to NATS, with --nats-tls-key")
	f.StringVar(&cfg.NATS.TLS.Key, "nats-tls-key", cfg.NATS.TLS.Key, "client private key (PEM) for TLS to NATS, with --nats-tls-cert")
	f.StringVar(&cfg.NATS.TLS.ServerName, "nats-tls-server-name", cfg.NATS.TLS.ServerName, "name expected in the NATS servers' certificates")
	f.BoolVar(&cfg.NATS.TLS.Insecure, "nats-tls-insecure", cfg.NATS.TLS.Insecure, "do not verify the NATS servers' certificates (tests only)")
	f.IntVar(&cfg.Assets.Replicas, "replicas", cfg.Assets.Replicas, fmt.Sprintf("replicas of the JetStream assets, 1..%d (0: 1 with a single embedded server, %d in a cluster or with --nats-url)", runtime.MaxReplicas, runtime.DefaultExternalReplicas))
	f.StringVar(&cfg.HTTP, "http", cfg.HTTP, "address of /healthz and /metrics (port 0: any free port)")
	f.StringVar(&cfg.Log.Level, "log-level", cfg.Log.Level, "debug, info, warn or error")
	f.StringVar(&cfg.Log.Format, "log-format", cfg.Log.Format, "text or json")
	return cmd
}

// configErrors rewrites validation errors in terms of flags, one per line.
func configErrors(err error) error {
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	lines := []string{"invalid configuration:"}
	for _, e := range errs {
		var ce *runtime.ConfigError
		if errors.As(e, &ce) {
			name := ce.Field
			if flag, ok := flagOf[ce.Field]; ok {
				name = "--" + flag
			}
			if ce.Value == "" {
				lines = append(lines, fmt.Sprintf("  %s: %s", name, ce.Rule))
			} else {
				lines = append(lines, fmt.Sprintf("  %s: %s (got %s)", name, ce.Rule, ce.Value))
			}
		} else {
			lines = append(lines, "  "+e.Error())
		}
	}
	return &joinedConfigError{msg: strings.Join(lines, "\n"), errs: errs}
}

// joinedConfigError keeps the *runtime.ConfigError values reachable with
// errors.As while printing them as flags.
type joinedConfigError struct {
	msg  string
	errs []error
}

func (e *joinedConfigError) Error() string   { return e.msg }
func (e *joinedConfigError) Unwrap() []error { return e.errs }

func sortedEnv() []string {
	names := slices.Collect(maps.Values(envOf))
	slices.Sort(names)
	return names
}
