package runtime

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"understudy/actors/agent"
	"understudy/actors/failover"
	"understudy/actors/resources"
	"understudy/capabilities/postgres"
	"understudy/events"
)

// PostgresPairKind is the manifest kind of a PostgreSQL pair: one document
// (`kind: postgres-pair`, see docs/agents.md) that the agents of both
// sites converge into a running pair member each, on their node's Host.
const PostgresPairKind = "postgres-pair"

// PostgresPair is a postgres-pair spec, decoded and checked once
// (DecodePostgresPair): nothing downstream re-reads the map.
type PostgresPair struct {
	// Rules are the pair's: name, primary, replica, synchronous,
	// maximum_lag_on_failover and the rules section (defaults as a pair
	// file's).
	Rules failover.Rules
	// Sites holds the primary's and the replica's, by site name.
	Sites       map[string]PairSite
	Version     int
	Port        int
	Replication postgres.ReplicationConfig // user and password_file; never a password
	TLS         postgres.TLSConfig
	HBA         []string
	Parameters  map[string]string
}

// PairSite is one site of a postgres-pair.
type PairSite struct {
	// Address is the host the other site reaches this site's PostgreSQL at.
	Address string
	// Listen is this site's listen_addresses; default Address.
	Listen string
	// Agent is the agent that runs the site's member; default the site's
	// name.
	Agent string
	// Storage is the site's data directory: the spec's storage, unless
	// the site gives its own.
	Storage string
}

// postgresFenceBudget is the PostgreSQL workload's fence (probe, immediate
// shutdown, kill of the group): fence_grace must cover it.
var postgresFenceBudget = (*postgres.Postgres)(nil).FenceBudget()

// rulesFields are the pair file's keys the spec takes under "rules".
var rulesFields = []string{"heartbeat_timeout", "failure_threshold", "success_threshold", "failover_timeout", "fence_grace", "failback"}

// DecodePostgresPair decodes and checks a postgres-pair spec. Errors are
// *resources.SpecError values naming the field and the rule. It checks
// the shape only: what depends on a node (the binaries of the version,
// the password file, the certificates) is checked by that node's agent.
func DecodePostgresPair(spec resources.Spec) (PostgresPair, error) {
	r := resources.NewSpecReader(PostgresPairKind, spec)
	fail := func(field, rule string) (PostgresPair, error) {
		r.Fail(field, rule)
		return PostgresPair{}, r.Done()
	}
	var p PostgresPair
	pf := PairFile{
		Pair:    r.Str("pair", true),
		Primary: r.Str("primary", true),
		Replica: r.Str("replica", true),
	}
	switch v, _ := r.Get("synchronous"); x := v.(type) {
	case bool: // YAML 1.1's on and off, as some writers emit them
		pf.Synchronous = map[bool]string{true: "on", false: "off"}[x]
	default:
		pf.Synchronous = r.Str("synchronous", false)
	}
	switch v, _ := r.Get("maximum_lag_on_failover"); x := v.(type) {
	case int:
		pf.MaximumLagOnFailover = strconv.Itoa(x)
	default:
		pf.MaximumLagOnFailover = r.Str("maximum_lag_on_failover", false)
	}
	if rs := r.Object("rules"); rs != nil {
		pf.HeartbeatTimeout = rs.Str("heartbeat_timeout", false)
		pf.FailoverTimeout = rs.Str("failover_timeout", false)
		pf.FenceGrace = rs.Str("fence_grace", false)
		pf.Failback = rs.Str("failback", false)
		for _, f := range []struct {
			name string
			into **int
		}{{"failure_threshold", &pf.FailureThreshold}, {"success_threshold", &pf.SuccessThreshold}} {
			if _, set := rs.Get(f.name); set {
				n := rs.Int(f.name, 0)
				*f.into = &n
			}
		}
		if err := rs.Done(); err != nil {
			return PostgresPair{}, err
		}
	}
	p.Version = r.Int("version", 15)
	storage := r.Str("storage", false)
	p.Port = r.Int("port", 5432)
	sites := r.Object("sites")
	if repl := r.Object("replication"); repl != nil {
		p.Replication.User = repl.Str("user", false)
		if _, set := repl.Get("password"); set {
			repl.Fail("password", "not in a manifest: it would be stored in clear in the fleet bucket and in each agent's journal; give password_file (a file of one line on each node, readable by root only) or tls")
		}
		p.Replication.PasswordFile = repl.Str("password_file", false)
		if err := repl.Done(); err != nil {
			return PostgresPair{}, err
		}
	}
	if t := r.Object("tls"); t != nil {
		p.TLS = postgres.TLSConfig{CA: t.Str("ca", false), Cert: t.Str("cert", false), Key: t.Str("key", false)}
		if err := t.Done(); err != nil {
			return PostgresPair{}, err
		}
	}
	p.HBA = r.Strs("hba")
	p.Parameters = r.StrMap("parameters")
	if _, set := r.Get("sites"); !set {
		r.Fail("sites", "required: each site's address, e.g. {site-a: 10.0.1.10, site-b: 10.0.2.10}")
	}
	if err := r.Done(); err != nil {
		return PostgresPair{}, err
	}

	// The rules, as a pair file's (named as the spec names them).
	rules, err := pf.Rules(false)
	if err != nil {
		var ce *ConfigError
		if !errors.As(err, &ce) {
			return fail("pair", err.Error())
		}
		field := ce.Field
		if slices.Contains(rulesFields, field) {
			field = "rules." + field
		}
		rule := ce.Rule
		if ce.Value != "" {
			rule += " (got " + ce.Value + ")"
		}
		return fail(field, rule)
	}
	if rule := agent.CheckID(rules.Pair); rule != "" {
		return fail("pair", rule+": it is the resource's id in each agent's manifest (got "+rules.Pair+")")
	}
	if err := rules.CheckFenceBudget(postgresFenceBudget); err != nil {
		return fail("rules.fence_grace", err.(*ConfigError).Rule+" (PostgreSQL's fence)")
	}
	p.Rules = rules

	// Sites: exactly the primary and the replica.
	p.Sites = map[string]PairSite{}
	for _, name := range []string{rules.Primary, rules.Replica} {
		v, ok := sites.Get(name)
		if !ok {
			return fail("sites."+name, fmt.Sprintf("required: the address of site %s (a site of the pair)", name))
		}
		s := PairSite{Agent: name}
		switch x := v.(type) {
		case string:
			s.Address = x
		case map[string]any:
			sr := sites.Sub(name+".", x)
			s.Address = sr.Str("address", true)
			s.Listen = sr.Str("listen", false)
			s.Storage = sr.Str("storage", false)
			if a := sr.Str("agent", false); a != "" {
				s.Agent = a
			}
			if err := sr.Done(); err != nil {
				return PostgresPair{}, err
			}
		default:
			return fail("sites."+name, fmt.Sprintf("must be an address or a map {address, listen, agent, storage} (got %v)", v))
		}
		if s.Listen == "" {
			s.Listen = s.Address
		}
		field := "sites." + name + ".storage"
		if s.Storage == "" {
			s.Storage, field = storage, "storage"
		}
		switch {
		case s.Storage == "":
			return fail("storage", "required: the data directory (absolute), unless every site gives its own (sites."+name+".storage)")
		case !filepath.IsAbs(s.Storage) || filepath.Clean(s.Storage) == "/":
			return fail(field, "must be an absolute path, not / (got "+s.Storage+")")
		case len(filepath.Clean(s.Storage))+len(".understudy/.s.PGSQL.65535.lock") > 107:
			return fail(field, "too long: the Unix socket beside it must fit in 107 bytes (got "+s.Storage+")")
		}
		s.Storage = filepath.Clean(s.Storage)
		if s.Address == "" || strings.ContainsAny(s.Address, "'\\ ,/\x00") {
			return fail("sites."+name+".address", "must be a host name or an IP address (got "+strconv.Quote(s.Address)+")")
		}
		if strings.ContainsAny(s.Listen, "'\\ \x00") {
			return fail("sites."+name+".listen", "must be listen_addresses: host names or addresses separated by commas (got "+strconv.Quote(s.Listen)+")")
		}
		if rule := agent.CheckID(s.Agent); rule != "" {
			what := "sites." + name + ".agent"
			if s.Agent == name {
				rule += ": the site's name is not an agent id, so set agent"
			}
			return fail(what, rule+" (got "+s.Agent+")")
		}
		p.Sites[name] = s
	}
	if err := sites.Done(); err != nil {
		return PostgresPair{}, err
	}
	if a, b := p.Sites[rules.Primary].Agent, p.Sites[rules.Replica].Agent; a == b {
		return fail("sites."+rules.Replica+".agent", "must differ from the primary's ("+a+"): each site's member runs on its own node")
	}

	// PostgreSQL.
	if p.Version < 10 || p.Version > 99 {
		return fail("version", "a PostgreSQL major version (15 is tested) (got "+strconv.Itoa(p.Version)+")")
	}
	if p.Port < 1 || p.Port > 65535 {
		return fail("port", "a TCP port, 1 to 65535 (got "+strconv.Itoa(p.Port)+")")
	}
	t := p.TLS
	tlsSet := btoi(t.CA != "") + btoi(t.Cert != "") + btoi(t.Key != "")
	if tlsSet != 0 && tlsSet != 3 {
		return fail("tls", "set ca, cert and key together, or none of them")
	}
	for _, f := range []struct{ name, path string }{{"tls.ca", t.CA}, {"tls.cert", t.Cert}, {"tls.key", t.Key}, {"replication.password_file", p.Replication.PasswordFile}} {
		if f.path != "" && (!filepath.IsAbs(f.path) || strings.ContainsAny(f.path, "'\\ \x00")) {
			return fail(f.name, "an absolute path on each node, without spaces, quotes or backslashes (got "+f.path+")")
		}
	}
	if p.Replication.PasswordFile == "" && tlsSet == 0 {
		return fail("replication.password_file", "required unless tls is set (then the peer authenticates by certificate): a file of one line on each node")
	}
	return p, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// SiteOf returns the site whose member agent runs; false when the pair
// names agent for neither site.
func (p PostgresPair) SiteOf(agentID string) (string, bool) {
	for _, site := range []string{p.Rules.Primary, p.Rules.Replica} {
		if p.Sites[site].Agent == agentID {
			return site, true
		}
	}
	return "", false
}

// Agents returns the agents of the primary's and the replica's sites.
func (p PostgresPair) Agents() []string {
	return []string{p.Sites[p.Rules.Primary].Agent, p.Sites[p.Rules.Replica].Agent}
}

// Member returns the member configuration of site (one of the pair's):
// its postgres section (data_dir = its storage, listen, port, peer = the other
// site's address and port) and the options of a replicating workload. The
// postgres section is not validated yet: that reads the node's files
// (postgres.Config.Validate), on the node that runs it.
func (p PostgresPair) Member(site string) MemberConfig {
	other := p.Rules.Other(site)
	cfg := &postgres.Config{
		Version: p.Version, DataDir: p.Sites[site].Storage, Listen: p.Sites[site].Listen, Port: p.Port,
		Peer:        net.JoinHostPort(p.Sites[other].Address, strconv.Itoa(p.Port)),
		Replication: p.Replication, TLS: p.TLS,
		HBA: slices.Clone(p.HBA), Parameters: maps.Clone(p.Parameters),
	}
	return MemberConfig{Rules: p.Rules, Site: site, Postgres: cfg,
		Options: failover.Options{Rejoin: true, Positions: true, Synchronizer: true}}
}

// pairKind is the reconciler of the postgres-pair kind: it adds this
// node's member of a pair to the node's Host, replaces it when the spec
// changes, and removes it when the resource goes. Every call is
// idempotent; calls for one resource come from one actor at a time,
// calls for different pairs may run concurrently (the Host is safe for
// that).
type pairKind struct {
	agent string
	// host is the node's failover host; nil when the agent runs without
	// one: the kind validates but refuses to run.
	host *Host
	// keeper overrides the PostgreSQL keeper's command (tests).
	keeper []string
}

func (k *pairKind) Kind() string { return PostgresPairKind }

func (k *pairKind) Validate(spec resources.Spec) error {
	_, err := DecodePostgresPair(spec)
	return err
}

// Identity: two resources of one manifest cannot run one pair.
func (k *pairKind) Identity(_ string, spec resources.Spec) string {
	p, err := DecodePostgresPair(spec)
	if err != nil {
		return ""
	}
	return "pair " + p.Rules.Pair
}

// wanted decodes spec into this node's member: its site and its
// configuration, validated on this node.
func (k *pairKind) wanted(spec resources.Spec) (PostgresPair, MemberConfig, error) {
	p, err := DecodePostgresPair(spec)
	if err != nil {
		return p, MemberConfig{}, err
	}
	if k.host == nil {
		return p, MemberConfig{}, fmt.Errorf("the postgres-pair kind runs pair members on the node's failover host, and this agent runs without one: run the agent inside understudy serve (the node file's agent section): %w", resources.ErrRefused)
	}
	site, ok := p.SiteOf(k.agent)
	if !ok {
		return p, MemberConfig{}, fmt.Errorf("pair %s names no site for agent %s (%s: agent %s, %s: agent %s): apply it to the sites' agents: %w",
			p.Rules.Pair, k.agent, p.Rules.Primary, p.Sites[p.Rules.Primary].Agent, p.Rules.Replica, p.Sites[p.Rules.Replica].Agent, resources.ErrRefused)
	}
	mc := p.Member(site)
	if len(k.keeper) > 0 {
		mc.Postgres.KeeperCommand = k.keeper
	}
	if err := mc.Postgres.Validate("spec"); err != nil {
		return p, mc, fmt.Errorf("on this node: %w", err)
	}
	return p, mc, nil
}

// hosted returns the member of pair this node runs (any site), if any.
func (k *pairKind) hosted(pair string) (Hosted, bool) {
	for _, m := range k.host.Members() {
		if m.Pair == pair {
			return k.host.Member(m.Pair, m.Site)
		}
	}
	return Hosted{}, false
}

// refusedChange says why the running member cannot take want by a
// restart ("" when it can).
func refusedChange(run, want MemberConfig) string {
	const redo = ": delete the pair (its data directories stay) and apply it again"
	switch {
	case run.Site != want.Site:
		return fmt.Sprintf("this node runs site %s of pair %s; the manifest makes it site %s%s", run.Site, run.Rules.Pair, want.Site, redo)
	case run.Rules.Primary != want.Rules.Primary || run.Rules.Replica != want.Rules.Replica:
		return fmt.Sprintf("primary and replica are %s and %s; the manifest makes them %s and %s: a running pair keeps its sites%s",
			run.Rules.Primary, run.Rules.Replica, want.Rules.Primary, want.Rules.Replica, redo)
	case run.Postgres.DataDir != want.Postgres.DataDir:
		return fmt.Sprintf("storage is %s; the manifest makes it %s: the member does not move its data directory (stop, move it yourself, then apply)%s",
			run.Postgres.DataDir, want.Postgres.DataDir, redo)
	case run.Postgres.Version != want.Postgres.Version:
		return fmt.Sprintf("version is %d; the manifest makes it %d: a major upgrade is pg_upgrade's, not a restart's", run.Postgres.Version, want.Postgres.Version)
	}
	return ""
}

// sameMember reports whether the running member was made from want.
func sameMember(run, want MemberConfig) bool {
	return run.Site == want.Site && run.Rules == want.Rules && run.Options == want.Options &&
		reflect.DeepEqual(run.Postgres, want.Postgres)
}

// observe compares the hosted member with want.
func (k *pairKind) observe(p PostgresPair, want MemberConfig) (resources.Observation, error) {
	hm, ok := k.hosted(p.Rules.Pair)
	switch {
	case !ok:
		return resources.Observation{Drift: "member " + p.Rules.Pair + "/" + want.Site + " not running on this node"}, nil
	case !hm.Dynamic:
		return resources.Observation{}, fmt.Errorf("member %s/%s is run by this node's node file (pairs): remove it there first, or delete this resource: %w", p.Rules.Pair, hm.Config.Site, resources.ErrRefused)
	case !sameMember(hm.Config, want):
		if why := refusedChange(hm.Config, want); why != "" {
			return resources.Observation{Drift: "spec changed: " + why}, nil
		}
		return resources.Observation{Drift: "spec changed: the member restarts with it"}, nil
	}
	details := map[string]string{"pair": p.Rules.Pair, "site": want.Site, "role": "replica", "data_dir": want.Postgres.DataDir,
		"port": strconv.Itoa(want.Postgres.Port), "peer": want.Postgres.Peer, "phase": failover.PhaseStarting.String()}
	if want.Site == p.Rules.Primary {
		details["role"] = "primary"
	}
	if s := hm.Snapshot; s != nil {
		details["phase"] = s.Phase.String()
		details["term"] = strconv.FormatUint(s.Term, 10)
	}
	if !hm.State.Running {
		return resources.Observation{Details: details,
			Drift: fmt.Sprintf("member stopped at %s: %s; the node restarts it at %s", hm.State.Since.UTC().Format(time.RFC3339), hm.State.Reason, hm.State.RestartAt.UTC().Format(time.RFC3339))}, nil
	}
	return resources.Observation{InSync: true, Details: details}, nil
}

func (k *pairKind) Observe(_ context.Context, _ string, spec resources.Spec) (resources.Observation, error) {
	p, want, err := k.wanted(spec)
	if err != nil {
		return resources.Observation{}, err
	}
	return k.observe(p, want)
}

// Reconcile adds the member, or replaces it (stop, then add) when its
// spec changed in what a restart can take; a change of sites, storage
// or version is refused while it runs.
func (k *pairKind) Reconcile(ctx context.Context, _ string, spec resources.Spec) (resources.Observation, error) {
	p, want, err := k.wanted(spec)
	if err != nil {
		return resources.Observation{}, err
	}
	if hm, ok := k.hosted(p.Rules.Pair); ok && hm.Dynamic && !sameMember(hm.Config, want) {
		if why := refusedChange(hm.Config, want); why != "" {
			return resources.Observation{}, fmt.Errorf("%s; the member runs its previous spec: %w", why, resources.ErrRefused)
		}
		if err := k.host.RemoveMember(ctx, p.Rules.Pair, hm.Config.Site); err != nil {
			return resources.Observation{}, err
		}
	}
	if _, ok := k.hosted(p.Rules.Pair); !ok {
		if err := k.host.AddMember(want); err != nil {
			return resources.Observation{}, err
		}
	}
	return k.observe(p, want)
}

// Delete removes this node's member of the pair: it hands over if it
// leads, and its PostgreSQL is shut down; the data directory stays
// (deleting a database pair never deletes a database).
func (k *pairKind) Delete(ctx context.Context, _ string, spec resources.Spec) error {
	p, err := DecodePostgresPair(spec)
	if err != nil || k.host == nil {
		return nil // nothing this agent could have started
	}
	hm, ok := k.hosted(p.Rules.Pair)
	if !ok || !hm.Dynamic {
		return nil // not ours: a node file's member stays
	}
	return k.host.RemoveMember(ctx, p.Rules.Pair, hm.Config.Site)
}

// PairManifest is a postgres-pair document as `understudy apply -f`
// reads it: `kind: postgres-pair` and the spec's fields beside it.
type PairManifest struct {
	Spec resources.Spec
	Pair PostgresPair
}

// IsPairManifest reports whether a YAML document is a pair manifest (its
// top-level kind is postgres-pair) rather than an agent's manifest.
func IsPairManifest(doc map[string]any) bool { return doc["kind"] == PostgresPairKind }

// ParsePairManifestYAML reads a manifest file: ok false when it is not a
// pair manifest (an agent's manifest: agent.ParseManifestYAML reads it).
func ParsePairManifestYAML(data []byte) (pm PairManifest, ok bool, err error) {
	var doc map[string]any
	if err := decodeStrict(data, &doc); err != nil {
		return PairManifest{}, false, fmt.Errorf("manifest: %w", err)
	}
	if !IsPairManifest(doc) {
		return PairManifest{}, false, nil
	}
	pm, err = ParsePairManifest(doc)
	return pm, true, err
}

// ParsePairManifest checks a decoded pair manifest document.
func ParsePairManifest(doc map[string]any) (PairManifest, error) {
	spec := maps.Clone(doc)
	if kind, _ := spec["kind"].(string); kind != PostgresPairKind {
		return PairManifest{}, &resources.SpecError{Kind: PostgresPairKind, Field: "kind", Rule: "must be " + PostgresPairKind}
	}
	delete(spec, "kind")
	p, err := DecodePostgresPair(spec)
	if err != nil {
		return PairManifest{}, err
	}
	return PairManifest{Spec: spec, Pair: p}, nil
}

// Resource is the pair as a resource of an agent's manifest.
func (pm PairManifest) Resource() agent.Resource {
	return agent.Resource{ID: pm.Pair.Rules.Pair, Kind: PostgresPairKind, Spec: pm.Spec}
}

// PairApplied is what ApplyPair did for one agent.
type PairApplied struct {
	Agent      string
	Generation uint64 // the agent's manifest generation now
	Changed    bool   // false: the agent's manifest held this spec already
}

// ApplyPair writes the pair into the manifests of both sites' agents (the
// resource <pair> of kind postgres-pair, the rest of each manifest kept),
// each by compare-and-set with the next generation, signed when w has a
// key; an agent whose manifest holds the same spec already is not written
// (unless w signs and the stored manifest is unsigned). It stops at the
// first failure and reports the agents done so far: applying again is
// safe.
func ApplyPair(ctx context.Context, kv events.KV, pm PairManifest, w ManifestWriter) ([]PairApplied, error) {
	res := pm.Resource()
	var done []PairApplied
	for _, ag := range pm.Pair.Agents() {
		a, err := editManifest(ctx, kv, ag, w, res.ID, true, func(m *agent.Manifest) bool {
			i := slices.IndexFunc(m.Resources, func(r agent.Resource) bool { return r.ID == res.ID })
			switch {
			case i < 0:
				m.Resources = append(m.Resources, res)
			case agent.SpecKey(m.Resources[i]) == agent.SpecKey(res):
				return false
			default:
				m.Resources[i] = res
			}
			return true
		})
		if err != nil {
			return done, fmt.Errorf("agent %s: %w", ag, err)
		}
		done = append(done, a)
	}
	return done, nil
}

// DeletePair removes the resource of pair from the manifests of agents
// (by compare-and-set, the rest kept, signed when w has a key): each agent
// removes its member, and the data directories stay. An agent whose
// manifest does not hold it is not written.
func DeletePair(ctx context.Context, kv events.KV, pair string, agents []string, w ManifestWriter) ([]PairApplied, error) {
	var done []PairApplied
	for _, ag := range agents {
		a, err := editManifest(ctx, kv, ag, w, pair, false, func(m *agent.Manifest) bool {
			n := len(m.Resources)
			m.Resources = slices.DeleteFunc(m.Resources, func(r agent.Resource) bool { return r.ID == pair && r.Kind == PostgresPairKind })
			return len(m.Resources) != n
		})
		if err != nil {
			return done, fmt.Errorf("agent %s: %w", ag, err)
		}
		done = append(done, a)
	}
	return done, nil
}

// editManifest changes agent ag's stored manifest with edit (false: no
// change) and stores it with the next generation, by compare-and-set,
// retrying a few times when another apply lands between the read and the
// write. edit writes the resource own; the others are carried over, which
// a signed write does only from a stored manifest w vouches for
// (*StoredContentError otherwise). Nothing is written when edit changes
// nothing, unless resign, w signs and the stored manifest is unsigned:
// the edit then signs it, for agents that require signatures.
func editManifest(ctx context.Context, kv events.KV, ag string, w ManifestWriter, own string, resign bool, edit func(*agent.Manifest) bool) (PairApplied, error) {
	key := agent.DesiredKey(ag)
	for attempt := 0; ; attempt++ {
		sd := storedDesired{m: agent.Manifest{Agent: ag}, vouched: true}
		var rev uint64
		cur, err := kv.Get(ctx, key)
		switch {
		case errors.Is(err, events.ErrNotFound):
		case err != nil:
			return PairApplied{Agent: ag}, err
		default:
			rev = cur.Revision
			if sd, err = w.read(cur.Value); err != nil {
				return PairApplied{Agent: ag}, fmt.Errorf("the stored manifest at %s does not decode or verify (%v): apply the agent's manifest first", key, err)
			}
		}
		m := sd.m
		old := m.Generation
		changed := edit(&m)
		if !changed && !(resign && rev != 0 && w.Key != nil && sd.signer == "") {
			return PairApplied{Agent: ag, Generation: old}, nil
		}
		if !sd.vouched {
			var carried []agent.Resource
			for _, r := range m.Resources {
				if r.ID != own {
					carried = append(carried, r)
				}
			}
			if len(carried) > 0 {
				return PairApplied{Agent: ag}, &StoredContentError{Key: key, Revision: rev, Signer: sd.signer, Resources: resourceIDs(carried)}
			}
		}
		switch next := old + 1; {
		case rev == 0:
			m.Generation = 1
		case sd.vouched && next > old:
			m.Generation = next
		default: // a generation not vouched for: above the key's revision
			m.Generation = rev + 1
		}
		m.Generation = aboveReported(ctx, kv, ag, m.Generation)
		b, err := w.encode(m)
		if err != nil {
			return PairApplied{Agent: ag}, err
		}
		if rev == 0 {
			_, err = kv.Create(ctx, key, b)
		} else {
			_, err = kv.Update(ctx, key, b, rev)
		}
		if err == nil {
			return PairApplied{Agent: ag, Generation: m.Generation, Changed: true}, nil
		}
		if !errors.Is(err, events.ErrConflict) || attempt == 4 {
			return PairApplied{Agent: ag}, err
		}
	}
}
