package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"understudy/actors/agent"
	"understudy/actors/resources"
	"understudy/events"
	"understudy/runtime"
)

// fleetFlags are the NATS flags of the fleet commands.
func fleetFlags(cmd *cobra.Command) *natsFlags {
	nf := &natsFlags{}
	nf.addFleet(cmd)
	return nf
}

// signFlags are the signing flags of the commands that write desired
// state.
type signFlags struct {
	key         string
	trust       []string
	trustStored bool
}

func (f *signFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.key, "sign-key", "", "file of the manifest signing key, an operator nkey seed (SO…) ($UNDERSTUDY_SIGN_KEY); nodes with security.manifest_keys run only signed manifests")
	cmd.Flags().StringArrayVar(&f.trust, "trust-key", nil, "public key (O…) whose stored manifests a signed write may carry resources over from, besides the signing key's own (repeatable)")
	cmd.Flags().BoolVar(&f.trustStored, "trust-stored", false, "carry resources over from the stored manifest whatever signed it (read it first: understudy get manifest)")
}

// writer is how the command writes desired state: signed with the key of
// --sign-key or $UNDERSTUDY_SIGN_KEY, else unsigned with a warning on
// stderr (the CLI cannot know whether the nodes require signatures).
func (f *signFlags) writer(cmd *cobra.Command) (runtime.ManifestWriter, error) {
	usage := func(err error) error { return &usageError{cmd: cmd.CommandPath(), err: err} }
	w := runtime.ManifestWriter{Trusted: f.trust, TrustStored: f.trustStored}
	for i, k := range f.trust {
		if rule := runtime.CheckManifestKey(k); rule != "" {
			return w, usage(fmt.Errorf("--trust-key[%d] %q: %s", i, k, rule))
		}
	}
	path, from := f.key, "--sign-key"
	if path == "" {
		path, from = os.Getenv("UNDERSTUDY_SIGN_KEY"), "$UNDERSTUDY_SIGN_KEY"
	}
	if path == "" {
		fmt.Fprintln(cmd.ErrOrStderr(), "warning: writing an unsigned manifest (no --sign-key, no $UNDERSTUDY_SIGN_KEY): agents whose node file lists security.manifest_keys will refuse it")
		return w, nil
	}
	key, err := runtime.LoadManifestKey(path)
	if err != nil {
		return w, usage(fmt.Errorf("%s: %w", from, err))
	}
	w.Key = key
	return w, nil
}

func newApplyCmd(stdout io.Writer) *cobra.Command {
	var file, agentID string
	cmd := &cobra.Command{
		Use:   "apply -f MANIFEST.yaml [--agent ID]",
		Short: "Store an agent's desired state (a manifest of resources); the agent converges to it",
		Long: `Validate a manifest (fields and rules of every known kind; a kind this build
does not know is left to the agent, which reports it as UnknownResource) and
store it at desired-state.<agent> in the fleet bucket with the next
generation, by compare-and-set. --agent overrides or supplies the manifest's
agent. Follow the agent's progress with 'understudy get status --agent ID'.

A manifest of kind postgres-pair (kind: postgres-pair at the top) is written
into the manifests of both sites' agents, which run the pair's members;
'understudy delete -f' takes it out again.

With --sign-key (or $UNDERSTUDY_SIGN_KEY) the stored manifest is signed:
nodes whose node file lists security.manifest_keys run only manifests
signed by one of those keys. A signed write carries resources over from
the stored manifest (the postgres-pair resources an agent's manifest
keeps, the resources around a pair) only when that manifest is signed
by the same key or a --trust-key; otherwise it refuses, naming them.`,
		Args: cobra.NoArgs,
	}
	nf := fleetFlags(cmd)
	var sf signFlags
	sf.add(cmd)
	cmd.Flags().StringVarP(&file, "file", "f", "", "manifest file (YAML)")
	cmd.Flags().StringVar(&agentID, "agent", "", "agent ID (default: the manifest's agent)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		usage := func(err error) error { return &usageError{cmd: cmd.CommandPath(), err: err} }
		if file == "" {
			return usage(errors.New("give the manifest with -f FILE"))
		}
		data, err := readManifestFile(file)
		if err != nil {
			return usage(err)
		}
		if pm, isPair, err := runtime.ParsePairManifestYAML(data); isPair || err != nil {
			if err != nil {
				return usage(fmt.Errorf("%s: %w", file, err))
			}
			if agentID != "" {
				return usage(fmt.Errorf("%s: a postgres-pair goes to the agents its sites name; --agent does not apply", file))
			}
			w, err := sf.writer(cmd)
			if err != nil {
				return err
			}
			return applyPair(cmd, nf, w, stdout, pm, false)
		}
		m, err := agent.ParseManifestYAML(data)
		if err != nil {
			return usage(fmt.Errorf("%s: %w", file, err))
		}
		if agentID != "" {
			if m.Agent != "" && m.Agent != agentID {
				return usage(fmt.Errorf("%s: agent: names %s, but --agent is %s", file, m.Agent, agentID))
			}
			m.Agent = agentID
		}
		if m.Generation != 0 {
			return usage(fmt.Errorf("%s: generation: set by apply, not by the file (got %d)", file, m.Generation))
		}
		reg := runtime.AgentRegistry(runtime.AgentConfig{}, resources.NewProcess())
		if err := m.Validate(reg, false); err != nil {
			return usage(fmt.Errorf("%s: %w", file, err))
		}
		w, err := sf.writer(cmd)
		if err != nil {
			return err
		}
		nc, kv, err := nf.connect(cmd.Context())
		if err != nil {
			return err
		}
		defer nc.Close()
		m, rev, err := runtime.ApplyManifest(cmd.Context(), kv, m, reg, w)
		if errors.Is(err, events.ErrConflict) {
			return fmt.Errorf("apply: another apply to agent %s landed first; run it again: %w", m.Agent, err)
		}
		if err != nil {
			return err
		}
		signed := "unsigned"
		if w.Key != nil {
			signed = "signed by " + w.Key.Public()
		}
		fmt.Fprintf(stdout, "applied manifest generation %d for agent %s (%d resources, revision %d, %s)\n", m.Generation, m.Agent, len(m.Resources), rev, signed)
		return nil
	}
	return cmd
}

// applyPair writes a pair manifest into both sites' agents' manifests
// (runtime.ApplyPair), or takes it out of them (runtime.DeletePair).
func applyPair(cmd *cobra.Command, nf *natsFlags, w runtime.ManifestWriter, stdout io.Writer, pm runtime.PairManifest, remove bool) error {
	nc, kv, err := nf.connect(cmd.Context())
	if err != nil {
		return err
	}
	defer nc.Close()
	pair := pm.Pair.Rules.Pair
	verb := "applied"
	var done []runtime.PairApplied
	if remove {
		verb = "deleted"
		done, err = runtime.DeletePair(cmd.Context(), kv, pair, pm.Pair.Agents(), w)
	} else {
		done, err = runtime.ApplyPair(cmd.Context(), kv, pm, w)
	}
	for _, a := range done {
		if a.Changed {
			fmt.Fprintf(stdout, "%s postgres-pair %s for agent %s: manifest generation %d\n", verb, pair, a.Agent, a.Generation)
		} else {
			fmt.Fprintf(stdout, "postgres-pair %s for agent %s: unchanged (manifest generation %d)\n", pair, a.Agent, a.Generation)
		}
	}
	var sc *runtime.StoredContentError
	switch {
	case errors.As(err, &sc):
		return fmt.Errorf("%s postgres-pair %s: %w", verb[:len(verb)-1], pair, err)
	case err != nil:
		return fmt.Errorf("%s postgres-pair %s: %w (the agents listed above have it; run the command again)", verb[:len(verb)-1], pair, err)
	}
	return nil
}

func newDeleteCmd(stdout io.Writer) *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   "delete -f PAIR.yaml",
		Short: "Take a postgres-pair out of its sites' agents: each stops its member and its PostgreSQL; the data directories stay",
		Args:  cobra.NoArgs,
	}
	nf := fleetFlags(cmd)
	var sf signFlags
	sf.add(cmd)
	cmd.Flags().StringVarP(&file, "file", "f", "", "the pair manifest (kind: postgres-pair) that was applied")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		usage := func(err error) error { return &usageError{cmd: cmd.CommandPath(), err: err} }
		if file == "" {
			return usage(errors.New("give the pair manifest with -f FILE"))
		}
		data, err := readManifestFile(file)
		if err != nil {
			return usage(err)
		}
		pm, isPair, err := runtime.ParsePairManifestYAML(data)
		switch {
		case err != nil:
			return usage(fmt.Errorf("%s: %w", file, err))
		case !isPair:
			return usage(fmt.Errorf("%s: kind: delete takes a manifest of kind postgres-pair; an agent's resources go by applying its manifest without them", file))
		}
		w, err := sf.writer(cmd)
		if err != nil {
			return err
		}
		return applyPair(cmd, nf, w, stdout, pm, true)
	}
	return cmd
}

func newGetCmd(stdout io.Writer) *cobra.Command {
	get := &cobra.Command{Use: "get", Short: "Read fleet state"}
	var agentID string
	var asJSON bool
	status := &cobra.Command{
		Use:   "status --agent ID [--json]",
		Short: "An agent's reported status: every resource's phase, and whether it converged",
		Args:  cobra.NoArgs,
	}
	nf := fleetFlags(status)
	status.Flags().StringVar(&agentID, "agent", "", "agent ID")
	status.Flags().BoolVar(&asJSON, "json", false, "print the status as JSON")
	status.RunE = func(cmd *cobra.Command, _ []string) error {
		e, err := readAgentKey(cmd, nf, agentID, agent.ActualKey, "no status", " (is the agent running?)")
		if err != nil {
			return err
		}
		s, err := agent.DecodeStatus(e.Value)
		if err != nil {
			return err
		}
		if asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(s)
		}
		fmt.Fprintf(stdout, "agent %s (%s): manifest generation %d, observed %d, converged %v, updated %s\n",
			s.Agent, s.Version, s.ManifestGeneration, s.ObservedGeneration, s.Converged(), s.Updated.Format(time.RFC3339))
		if s.ManifestSigner != "" {
			fmt.Fprintf(stdout, "manifest signed by %s\n", s.ManifestSigner)
		}
		if r := s.RefusedManifest; r != nil {
			fmt.Fprintf(stdout, "refused %s revision %d (%s", agent.DesiredKey(s.Agent), r.Revision, r.Reason)
			if r.Signer != "" {
				fmt.Fprintf(stdout, ", signer %s", r.Signer)
			}
			fmt.Fprintf(stdout, ") since %s: %s\n", r.Since.Format(time.RFC3339), r.Message)
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tKIND\tPHASE\tSINCE\tDETAIL")
		for _, id := range s.IDs() {
			r := s.Resources[id]
			detail := r.Error
			if detail == "" && len(r.Details) > 0 {
				var parts []string
				for k, v := range r.Details {
					parts = append(parts, k+"="+v)
				}
				slices.Sort(parts)
				detail = strings.Join(parts, " ")
			}
			if r.Audit != "" {
				detail += " (audit trail " + r.Audit + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", id, r.Kind, r.Phase, r.Since.Format(time.RFC3339), detail)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, c := range s.Conditions {
			fmt.Fprintf(stdout, "condition %s=%v %s %s\n", c.Type, c.Status, c.Reason, c.Message)
		}
		return nil
	}
	get.AddCommand(status, newGetManifestCmd(stdout))
	return get
}

// readAgentKey is the opening of the get commands: --agent given, one read
// of the agent's key (keyOf) in the fleet bucket. missing and hint word
// the error when it has no value.
func readAgentKey(cmd *cobra.Command, nf *natsFlags, agentID string, keyOf func(string) string, missing, hint string) (events.Entry, error) {
	if agentID == "" {
		return events.Entry{}, &usageError{cmd: cmd.CommandPath(), err: errors.New("give --agent ID")}
	}
	nc, kv, err := nf.connect(cmd.Context())
	if err != nil {
		return events.Entry{}, err
	}
	defer nc.Close()
	key := keyOf(agentID)
	e, err := kv.Get(cmd.Context(), key)
	if err != nil {
		return events.Entry{}, fmt.Errorf("agent %s: %s at %s: %w%s", agentID, missing, key, err, hint)
	}
	return e, nil
}

func newGetManifestCmd(stdout io.Writer) *cobra.Command {
	var agentID string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "manifest --agent ID [--json]",
		Short: "An agent's stored desired state: the manifest, and who signed it (the signature checked against the key it names)",
		Args:  cobra.NoArgs,
	}
	nf := fleetFlags(cmd)
	cmd.Flags().StringVar(&agentID, "agent", "", "agent ID")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print it as JSON")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		key := agent.DesiredKey(agentID)
		e, err := readAgentKey(cmd, nf, agentID, agent.DesiredKey, "no desired state", "")
		if err != nil {
			return err
		}
		m, signer, verr := runtime.ReadStoredManifest(e.Value)
		var forged *runtime.ForgedManifestError
		if verr != nil && !errors.As(verr, &forged) {
			return fmt.Errorf("%s revision %d: %w", key, e.Revision, verr)
		}
		if asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(struct {
				Key      string         `json:"key"`
				Revision uint64         `json:"revision"`
				Signer   string         `json:"signer,omitempty"`
				Verified bool           `json:"verified"`
				Manifest agent.Manifest `json:"manifest"`
			}{key, e.Revision, signer, signer != "" && verr == nil, m}); err != nil {
				return err
			}
		} else {
			by := "unsigned"
			switch {
			case verr != nil:
				by = "claims to be signed by " + signer + ", but the signature does NOT verify: forged or damaged"
			case signer != "":
				by = "signed by " + signer + " (the signature verifies)"
			}
			fmt.Fprintf(stdout, "# %s revision %d, generation %d: %s\n", key, e.Revision, m.Generation, by)
			b, err := yaml.Marshal(m)
			if err != nil {
				return err
			}
			if _, err := stdout.Write(b); err != nil {
				return err
			}
		}
		if verr != nil {
			return fmt.Errorf("%s revision %d: %w", key, e.Revision, verr)
		}
		return nil
	}
	return cmd
}

func newPingCmd(stdout io.Writer) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "ping AGENT",
		Short: "Ask an agent for its ID, version and uptime (device-commands.<agent>.ping)",
		Args:  cobra.ExactArgs(1),
	}
	nf := fleetFlags(cmd)
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for the reply")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		nc, _, err := nf.connect(cmd.Context())
		if err != nil {
			return err
		}
		defer nc.Close()
		start := time.Now()
		msg, err := nc.Request(agent.CommandSubject(args[0], "ping"), nil, timeout)
		if err != nil {
			return fmt.Errorf("ping %s: %w", args[0], err)
		}
		rtt := time.Since(start)
		var p runtime.PingReply
		if err := json.Unmarshal(msg.Data, &p); err != nil {
			return fmt.Errorf("ping %s: reply %q: %w", args[0], msg.Data, err)
		}
		fmt.Fprintf(stdout, "%s: agent %s, up %.1fs, round trip %v\n", p.DeviceID, p.AgentVersion, p.UptimeS, rtt.Round(time.Microsecond))
		return nil
	}
	return cmd
}

// maxManifestFile bounds the manifest file apply reads: a YAML manifest
// several times the size of the largest one an agent reads.
const maxManifestFile = 8 << 20

// readManifestFile reads a regular file of at most maxManifestFile bytes
// (not a FIFO or a device: apply -f /dev/zero ends with an error).
func readManifestFile(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() && path != "/dev/stdin" {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, maxManifestFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxManifestFile {
		return nil, fmt.Errorf("%s: more than %d bytes: not a manifest", path, maxManifestFile)
	}
	return data, nil
}
