package runtime

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/nats-io/nkeys"

	"understudy/actors/agent"
)

// ManifestKey signs desired state: an operator nkey (seed "SO…", public
// key "O…"), listed by its public key in the nodes' security.manifest_keys.
// It is not a NATS identity and can be kept offline.
type ManifestKey struct {
	kp     nkeys.KeyPair
	public string
}

// maxKeyFile bounds a key file: a seed is 58 characters; a decorated
// creds file a few hundred.
const maxKeyFile = 16 << 10

// LoadManifestKey reads a manifest signing key: a file holding an
// operator seed ("SO…", as `nk -gen operator` or understudy init write
// it; a decorated creds-style file works too). Errors name the file,
// never the seed.
func LoadManifestKey(path string) (*ManifestKey, error) {
	b, err := readKeyFile(path)
	if err != nil {
		return nil, fmt.Errorf("manifest signing key: %w", err)
	}
	k, err := ParseManifestKey(b)
	clear(b)
	if err != nil {
		return nil, fmt.Errorf("manifest signing key %s: %w", path, err)
	}
	return k, nil
}

// ParseManifestKey reads an operator seed. It does not keep seed.
func ParseManifestKey(seed []byte) (*ManifestKey, error) {
	kp, err := nkeys.ParseDecoratedNKey(bytes.TrimSpace(seed))
	if err != nil {
		return nil, fmt.Errorf("not an nkey seed (%v): a manifest signing key is an operator seed, SO…", err)
	}
	if err := nkeys.CompatibleKeyPair(kp, nkeys.PrefixByteOperator); err != nil {
		kp.Wipe()
		return nil, errors.New("not an operator seed: a manifest signing key is an operator nkey (seed SO…, public key O…), not a user or account key")
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	return &ManifestKey{kp: kp, public: pub}, nil
}

// Public is the key's public half ("O…"), what node files list.
func (k *ManifestKey) Public() string { return k.public }

// Sign encodes m and signs it: the value stored at desired-state.<agent>.
func (k *ManifestKey) Sign(m agent.Manifest) ([]byte, error) {
	b, err := agent.EncodeManifest(m)
	if err != nil {
		return nil, err
	}
	sig, err := k.kp.Sign(agent.SigningInput(b))
	if err != nil {
		return nil, fmt.Errorf("sign manifest: %w", err)
	}
	return agent.EncodeSigned(agent.SignedManifest{Format: agent.SignedFormat, Manifest: b, Key: k.public, Sig: sig})
}

// CheckManifestKey returns the rule a public manifest key breaks ("":
// none).
func CheckManifestKey(pub string) string {
	if !nkeys.IsValidPublicOperatorKey(pub) {
		return "must be an operator public key (O…, 56 characters; nk -gen operator -pubout, or understudy init)"
	}
	return ""
}

// untrustedManifestError is a desired state that decodes but does not
// run here: unsigned where signatures are required, a signature that
// does not verify, or a key this node does not trust.
type untrustedManifestError struct {
	reason agent.RefusalReason
	signer string
	msg    string
}

func (e *untrustedManifestError) Error() string { return e.msg }

// openDesired decodes and verifies a value stored at desired-state.<agent>
// against trusted (public operator keys; none: signatures are not
// required, and a signed manifest runs when its signature verifies
// against the key it names). It returns the manifest and its signer ("":
// unsigned). A value that does not decode is a plain error; one that
// decodes and may not run, an *untrustedManifestError. The manifest inside
// an envelope is decoded only once its signature verifies.
func openDesired(b []byte, trusted []string) (agent.Manifest, string, error) {
	d, err := agent.DecodeDesired(b)
	if err != nil {
		return agent.Manifest{}, "", err
	}
	if d.Signed == nil {
		if len(trusted) > 0 {
			return d.Manifest, "", &untrustedManifestError{reason: agent.RefusedUnsigned,
				msg: "unsigned: this agent runs only manifests signed by a key of security.manifest_keys (" + strings.Join(trusted, ", ") +
					"): apply it with --sign-key (or $UNDERSTUDY_SIGN_KEY)"}
		}
		return d.Manifest, "", nil
	}
	s := d.Signed
	if len(trusted) > 0 && !slices.Contains(trusted, s.Key) {
		return agent.Manifest{}, s.Key, &untrustedManifestError{reason: agent.RefusedUntrustedKey, signer: s.Key,
			msg: "signed by " + s.Key + ", not a key of security.manifest_keys (" + strings.Join(trusted, ", ") + ")"}
	}
	if err := verifySigned(s); err != nil {
		return agent.Manifest{}, s.Key, &untrustedManifestError{reason: agent.RefusedBadSignature, signer: s.Key,
			msg: "the signature does not verify against " + s.Key + " (" + err.Error() + "): the manifest was changed after it was signed, or signed by another key"}
	}
	m, err := agent.DecodeManifest(s.Manifest)
	if err != nil {
		return agent.Manifest{}, s.Key, err
	}
	return m, s.Key, nil
}

// verifySigned checks s's signature against the key it names.
func verifySigned(s *agent.SignedManifest) error {
	if !nkeys.IsValidPublicOperatorKey(s.Key) {
		return errors.New("it is not an operator public key")
	}
	pub, err := nkeys.FromPublicKey(s.Key)
	if err != nil {
		return err
	}
	return pub.Verify(agent.SigningInput(s.Manifest), s.Sig)
}

// ManifestWriter is how apply, apply of a pair, and delete of a pair
// write desired state. The zero value writes unsigned manifests.
type ManifestWriter struct {
	// Key signs what is written; nil: unsigned (agents with
	// security.manifest_keys refuse it).
	Key *ManifestKey
	// Trusted are public keys, besides Key's own, whose stored manifests
	// a signed write carries content over from: the postgres-pair
	// resources kept by apply, the resources around a pair. Signing a
	// manifest vouches for all of it: content stored unsigned or by
	// another key is refused unless its signer is trusted here or
	// TrustStored is set.
	Trusted []string
	// TrustStored carries stored content over whatever signed it (the
	// operator read it: understudy get manifest).
	TrustStored bool
}

// encode is the value to store for m.
func (w ManifestWriter) encode(m agent.Manifest) ([]byte, error) {
	if w.Key == nil {
		return agent.EncodeManifest(m)
	}
	return w.Key.Sign(m)
}

// storedDesired is a stored desired state as a writer reads it.
type storedDesired struct {
	m      agent.Manifest
	signer string // "": unsigned
	// vouched: a signed write may carry its content over (see
	// ManifestWriter.Trusted); always true for an unsigned write.
	vouched bool
}

// read decodes a stored desired state for an edit. Its signature, when it
// has one, must verify against the key it names.
func (w ManifestWriter) read(b []byte) (storedDesired, error) {
	m, signer, err := ReadStoredManifest(b)
	if err != nil {
		return storedDesired{signer: signer}, err
	}
	vouched := w.Key == nil || w.TrustStored || (signer != "" && (signer == w.Key.Public() || slices.Contains(w.Trusted, signer)))
	return storedDesired{m: m, signer: signer, vouched: vouched}, nil
}

// ForgedManifestError is a signed manifest whose signature does not
// verify against the key it names: changed after it was signed, or not
// signed by that key.
type ForgedManifestError struct {
	Signer string // the key it names
	Err    error
}

func (e *ForgedManifestError) Error() string {
	return fmt.Sprintf("its signature does not verify against %s, the key it names (%v): forged, or damaged after it was signed", e.Signer, e.Err)
}

func (e *ForgedManifestError) Unwrap() error { return e.Err }

// ReadStoredManifest decodes a value stored at desired-state.<agent>, for
// an edit or a display: the manifest and its signer ("": unsigned). A
// signature that does not verify gives the manifest it covers (for
// display: never run it) and a *ForgedManifestError. b is untrusted
// (agent.DecodeDesired).
func ReadStoredManifest(b []byte) (agent.Manifest, string, error) {
	d, err := agent.DecodeDesired(b)
	if err != nil {
		return agent.Manifest{}, "", err
	}
	if d.Signed == nil {
		return d.Manifest, "", nil
	}
	m, err := agent.DecodeManifest(d.Signed.Manifest)
	if err != nil {
		return agent.Manifest{}, d.Signed.Key, err
	}
	if err := verifySigned(d.Signed); err != nil {
		return m, d.Signed.Key, &ForgedManifestError{Signer: d.Signed.Key, Err: err}
	}
	return m, d.Signed.Key, nil
}

// StoredContentError: a signed write would carry over resources from a
// stored manifest the signer has not vouched for (ManifestWriter.Trusted).
type StoredContentError struct {
	Key       string   // desired-state.<agent>
	Revision  uint64   // of Key
	Signer    string   // "": unsigned
	Resources []string // what would be carried over
}

func (e *StoredContentError) Error() string {
	by := "is unsigned"
	if e.Signer != "" {
		by = "is signed by " + e.Signer + ", not by your key"
	}
	return fmt.Sprintf("%s (revision %d) %s: signing this write would vouch for resources you did not write (%s); "+
		"read them (understudy get manifest --agent %s), then run again with --trust-stored, or --trust-key with the key that signed them",
		e.Key, e.Revision, by, strings.Join(e.Resources, ", "), strings.TrimPrefix(e.Key, "desired-state."))
}

// readKeyFile reads a regular file (through symlinks) of at most
// maxKeyFile bytes.
func readKeyFile(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	st, err := fh.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() || st.Size() > maxKeyFile {
		return nil, fmt.Errorf("%s: not a regular file of at most %d bytes", path, maxKeyFile)
	}
	return io.ReadAll(io.LimitReader(fh, maxKeyFile))
}
