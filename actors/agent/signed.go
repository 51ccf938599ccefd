package agent

import (
	"bytes"
	"crypto/ed25519"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// SignedManifest is a manifest signed with a manifest key (an operator
// nkey), as apply stores it at desired-state.<agent>: the manifest's wire
// form (EncodeManifest) kept as bytes, so that the bytes verified are the
// bytes decoded, the signer's public key, and the signature over
// SigningInput(Manifest). An unsigned manifest is stored bare (a map with
// the keys agent, gen and res); an envelope is a map with the key format,
// which a manifest never has: DecodeDesired tells the three apart
// (signed, unsigned, garbage). The pure part only: the runtime verifies
// the signature (nkeys) before it decodes the manifest inside.
type SignedManifest struct {
	Format   string `msgpack:"format"`   // SignedFormat
	Manifest []byte `msgpack:"manifest"` // EncodeManifest's bytes, signed as they are
	Key      string `msgpack:"key"`      // the signer's public key ("O…")
	Sig      []byte `msgpack:"sig"`      // ed25519 over SigningInput(Manifest)
}

// SignedFormat names the envelope and its version: an agent refuses a
// format it does not know rather than guess.
const SignedFormat = "understudy.signed-manifest/v1"

// signingContext prefixes what is signed, so that a signature the same
// key made over anything else (a NATS JWT, another protocol's message)
// is never a manifest's.
const signingContext = "understudy signed manifest v1\x00"

// SigningInput is what a manifest's signature covers: a fixed context
// and the manifest's wire form. It copies manifest.
func SigningInput(manifest []byte) []byte {
	out := make([]byte, 0, len(signingContext)+len(manifest))
	return append(append(out, signingContext...), manifest...)
}

// MaxKeyLen bounds the signer's key in an envelope (an nkey is 56
// characters).
const MaxKeyLen = 64

// SignedLimits bound a value at desired-state.<agent> before anything
// decodes it: a manifest's limits, and room for the envelope around it.
// The manifest inside an envelope is checked against ManifestLimits
// again when it is decoded.
var SignedLimits = WireLimits{Bytes: ManifestLimits.Bytes + 1024, Depth: ManifestLimits.Depth, Values: ManifestLimits.Values}

// EncodeSigned is the envelope's wire form (msgpack). It refuses an
// envelope an agent would refuse to read.
func EncodeSigned(s SignedManifest) ([]byte, error) {
	if s.Format == "" {
		s.Format = SignedFormat
	}
	if err := s.check(); err != nil {
		return nil, err
	}
	b, err := msgpack.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("signed manifest: %w", err)
	}
	if err := CheckWire(b, SignedLimits); err != nil {
		return nil, fmt.Errorf("signed manifest: too large for an agent to read: %w", err)
	}
	return b, nil
}

// check is the envelope's shape; the signature itself is the runtime's.
func (s SignedManifest) check() error {
	switch {
	case s.Format != SignedFormat:
		return fmt.Errorf("signed manifest: format %q is not one this agent reads (%s): upgrade the agent", s.Format, SignedFormat)
	case len(s.Manifest) == 0:
		return fmt.Errorf("signed manifest: manifest: required")
	case len(s.Manifest) > ManifestLimits.Bytes:
		return fmt.Errorf("signed manifest: manifest: %d bytes, more than the %d allowed", len(s.Manifest), ManifestLimits.Bytes)
	case s.Key == "" || len(s.Key) > MaxKeyLen:
		return fmt.Errorf("signed manifest: key: must be a public key of at most %d characters (got %d)", MaxKeyLen, len(s.Key))
	case len(s.Sig) != ed25519.SignatureSize:
		return fmt.Errorf("signed manifest: sig: must be an ed25519 signature of %d bytes (got %d)", ed25519.SignatureSize, len(s.Sig))
	}
	return nil
}

// Desired is a value read at desired-state.<agent>: a signed manifest
// (Signed set) or an unsigned one (Manifest).
type Desired struct {
	// Signed is the envelope, nil for an unsigned manifest. Its manifest
	// is not decoded: verify the signature first, then DecodeManifest.
	Signed *SignedManifest
	// Manifest is the unsigned manifest (zero when Signed is set).
	Manifest Manifest
}

// DecodeDesired decodes a value stored at desired-state.<agent>. b is
// untrusted: it is walked against SignedLimits before msgpack sees it,
// and an envelope is decoded strictly (unknown fields refused). A value
// that is neither an envelope nor a manifest gives DecodeManifest's
// error. It never panics and does not keep b.
func DecodeDesired(b []byte) (Desired, error) {
	if err := CheckWire(b, SignedLimits); err != nil {
		return Desired{}, fmt.Errorf("desired state: %w", err)
	}
	format, isEnvelope, err := envelopeFormat(b)
	if err != nil {
		return Desired{}, fmt.Errorf("desired state: %w", err)
	}
	if !isEnvelope {
		m, err := DecodeManifest(b)
		if err != nil {
			return Desired{}, err
		}
		return Desired{Manifest: m}, nil
	}
	if format != SignedFormat {
		return Desired{}, fmt.Errorf("signed manifest: format %q is not one this agent reads (%s): upgrade the agent", format, SignedFormat)
	}
	s, err := decodeEnvelope(b)
	if err != nil {
		return Desired{}, err
	}
	if err := s.check(); err != nil {
		return Desired{}, err
	}
	return Desired{Signed: &s}, nil
}

// envelopeFormat reports whether b (checked by CheckWire: its keys are
// strings, its nesting bounded) is a map with the key format, and that
// key's value when it is a string.
func envelopeFormat(b []byte) (format string, isEnvelope bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			format, isEnvelope, err = "", false, fmt.Errorf("msgpack decoder panic: %v", p)
		}
	}()
	dec := msgpack.NewDecoder(bytes.NewReader(b))
	n, err := dec.DecodeMapLen()
	if err != nil {
		return "", false, nil // not a map: not an envelope (nor a manifest)
	}
	for range max(n, 0) {
		key, err := dec.DecodeString()
		if err != nil {
			return "", false, err
		}
		if key != "format" {
			if err := dec.Skip(); err != nil {
				return "", false, err
			}
			continue
		}
		v, err := dec.DecodeInterface()
		if err != nil {
			return "", false, err
		}
		s, ok := v.(string)
		if !ok {
			return "", true, fmt.Errorf("signed manifest: format: not a string (%T)", v)
		}
		return s, true, nil
	}
	return "", false, nil
}

func decodeEnvelope(b []byte) (s SignedManifest, err error) {
	defer func() {
		if p := recover(); p != nil {
			s, err = SignedManifest{}, fmt.Errorf("signed manifest: msgpack decoder panic: %v", p)
		}
	}()
	dec := msgpack.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields(true)
	if err := dec.Decode(&s); err != nil {
		return SignedManifest{}, fmt.Errorf("signed manifest: %w", err)
	}
	return s, nil
}
