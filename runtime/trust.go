package runtime

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/nats-io/nkeys"
	"github.com/vmihailenco/msgpack/v5"

	"understudy/actors/failover"
)

// ValueTrust signs this node's register values and verifies everyone's
// against the deployment's node keys (security.nodes): NATS permissions let
// every node of a pair write its register, so only a signature says which
// node wrote a value, and a value no member wrote changes nothing
// (failover.LeaderEntry.Forged; docs/failover.md, Signed register values).
//
// A value is signed with the writing node's nkey (ed25519) over its
// encoding without its signature (the "sg" entry), and names its writer's
// site in By; it is genuine when the signature verifies against the key of
// a node whose sites (security.nodes.<node>.sites, default its name)
// include By. A nil *ValueTrust signs nothing and takes every value as
// genuine: a deployment without a security section. Safe for concurrent
// use; it keeps the node's key pair for its lifetime.
type ValueTrust struct {
	node  string
	sites []string      // this node's sites
	kp    nkeys.KeyPair // this node's seed
	// bySite: the public keys of the nodes that run each site.
	bySite map[string][]nkeys.KeyPair
	// byNode: each node's public key (liveness values name nodes).
	byNode map[string]nkeys.KeyPair
}

// NewValueTrust builds the trust of node from the security section and the
// node's nkey seed file (nats.nkey), whose public key must be node's in
// sec. With sec nil it returns nil, nil: nothing is signed or verified.
func NewValueTrust(sec *SecuritySection, node, seedFile string) (*ValueTrust, error) {
	if sec == nil {
		return nil, nil
	}
	id, ok := sec.Nodes[node]
	if !ok {
		return nil, fmt.Errorf("runtime: register signing: security.nodes has no entry for this node (%q)", node)
	}
	if seedFile == "" {
		return nil, errors.New("runtime: register signing: nats.nkey must name this node's nkey seed file")
	}
	kp, err := LoadUserKey(seedFile)
	if err != nil {
		return nil, fmt.Errorf("runtime: register signing: nats.nkey %s: %w", seedFile, err)
	}
	if pub, err := kp.PublicKey(); err != nil || pub != id.NKey {
		kp.Wipe()
		return nil, fmt.Errorf("runtime: register signing: the seed in %s is not security.nodes.%s.nkey (%s)", seedFile, node, id.NKey)
	}
	t := &ValueTrust{node: node, sites: nodeSites(node, id), kp: kp, bySite: map[string][]nkeys.KeyPair{}, byNode: map[string]nkeys.KeyPair{}}
	names := make([]string, 0, len(sec.Nodes))
	for n := range sec.Nodes {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		nid := sec.Nodes[n]
		pk, err := nkeys.FromPublicKey(nid.NKey)
		if err != nil {
			return nil, fmt.Errorf("runtime: register signing: security.nodes.%s.nkey: %w", n, err)
		}
		for _, s := range nodeSites(n, nid) {
			t.bySite[s] = append(t.bySite[s], pk)
		}
		t.byNode[n] = pk
	}
	return t, nil
}

// nodeSites are the sites a node runs: its entry's, else its name.
func nodeSites(name string, id NodeIdentity) []string {
	if len(id.Sites) > 0 {
		return id.Sites
	}
	return []string{name}
}

// Sign returns the wire form of l written by this node as site: By set to
// site, Sig to the signature. A nil trust returns EncodeLeader(l)
// unchanged. site must be one of this node's sites (its members run
// nothing else): a value signed for another would not verify anywhere.
func (t *ValueTrust) Sign(pair, site string, l failover.Leader) ([]byte, error) {
	if t == nil {
		return failover.EncodeLeader(l), nil
	}
	if !slices.Contains(t.sites, site) {
		return nil, fmt.Errorf("runtime: register signing: node %s does not run site %s (security.nodes.%s.sites: %s)", t.node, site, t.node, strings.Join(t.sites, ","))
	}
	l.By, l.Sig = site, nil
	sig, err := t.kp.Sign(signedMessage(registerDomain, pair, failover.EncodeLeader(l)))
	if err != nil {
		return nil, fmt.Errorf("runtime: register signing: %w", err)
	}
	l.Sig = sig
	return failover.EncodeLeader(l), nil
}

// Verify reports why raw, a register value that decodes as l, is not
// genuine (nil when it is): it names no writer, carries no signature, or
// its signature does not verify against the key of any node that runs its
// writer's site. A nil trust takes every value as genuine.
func (t *ValueTrust) Verify(pair string, raw []byte, l failover.Leader) error {
	if t == nil {
		return nil
	}
	msg, sig, err := signedBy(raw, l.By)
	if err != nil {
		return err
	}
	keys := t.bySite[l.By]
	if len(keys) == 0 {
		return fmt.Errorf("it says %s wrote it, a site no node of security.nodes runs", l.By)
	}
	for _, k := range keys {
		if k.Verify(signedMessage(registerDomain, pair, msg), sig) == nil {
			return nil
		}
	}
	return fmt.Errorf("its signature does not verify against the key of a node that runs %s", l.By)
}

// Judge sets e.Forged when raw, the stored bytes of register entry e, is
// not genuine (a value that does not decode cannot be), and returns why.
func (t *ValueTrust) Judge(pair string, e *failover.LeaderEntry, raw []byte) error {
	if t == nil {
		return nil
	}
	err := errors.New("it does not decode as a register value")
	if !e.Corrupt {
		err = t.Verify(pair, raw, e.Value)
	}
	e.Forged = err != nil
	return err
}

// The domains that start every signed message: a signature a node key
// made for anything else (a manifest, a NATS nonce, the other kind of
// value) is never a register value's or a liveness value's.
const (
	registerDomain = "understudy register value v1\x00"
	livenessDomain = "understudy.liveness/v1\x00"
)

// signedMessage is what a value's signature covers: the domain, the name
// of the key the value is for (a register's pair, a liveness record's
// node) and the value without its signature. The name binds the value to
// its key: a node that is a member of two pairs cannot replay one pair's
// signed values into the other's register, nor one node's liveness value
// into another's record.
func signedMessage(domain, name string, value []byte) []byte {
	msg := make([]byte, 0, len(domain)+len(name)+1+len(value))
	msg = append(msg, domain...)
	msg = append(msg, name...)
	msg = append(msg, 0)
	return append(msg, value...)
}

// signedBy splits raw, a signed value that names by as its writer, into
// the bytes its signature covers and the signature, or says why it
// cannot be genuine: it is not a value, names no writer or is not signed.
func signedBy(raw []byte, by string) (msg, sig []byte, err error) {
	msg, sig, err = unsigned(raw)
	switch {
	case err != nil:
		return nil, nil, err
	case by == "":
		return nil, nil, errors.New("it names no writer (by)")
	case len(sig) == 0:
		return nil, nil, fmt.Errorf("it is not signed (it says %s wrote it)", by)
	}
	return msg, sig, nil
}

// unsigned splits a register value into the bytes its signature covers —
// the value without its "sg" entry, its map header counting one entry
// less — and the signature (nil: none). Entries it does not know are kept
// as they are, so that a value a newer version wrote verifies here too.
func unsigned(raw []byte) (msg, sig []byte, err error) {
	r := bytes.NewReader(raw)
	dec := msgpack.NewDecoder(r)
	n, err := dec.DecodeMapLen()
	if err != nil || n < 0 {
		return nil, nil, fmt.Errorf("it is not a msgpack map: %v", err)
	}
	at := func() int { return len(raw) - r.Len() }
	var kept [][2]int // byte ranges of the entries kept
	found := false
	for range n {
		start := at()
		key, err := dec.DecodeString()
		if err != nil {
			return nil, nil, fmt.Errorf("a key is not a string: %w", err)
		}
		if key == "sg" && !found {
			if sig, err = dec.DecodeBytes(); err != nil {
				return nil, nil, fmt.Errorf("its signature is not bytes: %w", err)
			}
			found = true
			continue
		}
		if err := dec.Skip(); err != nil {
			return nil, nil, fmt.Errorf("entry %q: %w", key, err)
		}
		kept = append(kept, [2]int{start, at()})
	}
	if r.Len() != 0 {
		return nil, nil, errors.New("bytes after the value")
	}
	if !found {
		return raw, nil, nil
	}
	var b bytes.Buffer
	if err := msgpack.NewEncoder(&b).EncodeMapLen(n - 1); err != nil {
		return nil, nil, err
	}
	for _, k := range kept {
		b.Write(raw[k[0]:k[1]])
	}
	return b.Bytes(), sig, nil
}

// SignLiveness returns the wire form of l, a liveness value this node
// writes (its own beat, or a raise of another node's epoch): Sig set to
// the signature of this node's key. l.By must be this node. A nil trust
// returns EncodeLiveness(l) unchanged.
func (t *ValueTrust) SignLiveness(l failover.Liveness) ([]byte, error) {
	if t == nil {
		return failover.EncodeLiveness(l), nil
	}
	if l.By != t.node {
		return nil, fmt.Errorf("runtime: liveness signing: node %s does not sign a value written by %q", t.node, l.By)
	}
	l.Sig = nil
	sig, err := t.kp.Sign(signedMessage(livenessDomain, l.Node, failover.EncodeLiveness(l)))
	if err != nil {
		return nil, fmt.Errorf("runtime: liveness signing: %w", err)
	}
	l.Sig = sig
	return failover.EncodeLiveness(l), nil
}

// VerifyLiveness reports why raw, the stored value of node's liveness
// record that decodes as l, is not genuine (nil when it is): it is another
// node's value, names no writer, carries no signature, or its signature
// does not verify against the key of the node named in By. A nil trust
// takes every value as genuine.
func (t *ValueTrust) VerifyLiveness(node string, raw []byte, l failover.Liveness) error {
	if t == nil {
		return nil
	}
	if l.Node != node {
		return fmt.Errorf("it is node %s's value, in node %s's record", l.Node, node)
	}
	msg, sig, err := signedBy(raw, l.By)
	if err != nil {
		return err
	}
	k, ok := t.byNode[l.By]
	if !ok {
		return fmt.Errorf("it says %s wrote it, which is no node of security.nodes", l.By)
	}
	if k.Verify(signedMessage(livenessDomain, node, msg), sig) != nil {
		return fmt.Errorf("its signature does not verify against the key of node %s", l.By)
	}
	return nil
}
