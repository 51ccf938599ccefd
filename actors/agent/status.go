package agent

import (
	"slices"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Phase is where one resource stands.
type Phase string

const (
	Pending         Phase = "Pending"
	Reconciling     Phase = "Reconciling"
	Ready           Phase = "Ready"
	Failed          Phase = "Failed"
	UnknownResource Phase = "UnknownResource" // the agent has no reconciler for its kind
	Refused         Phase = "Refused"         // the node does not allow it (shell-job without allow_shell_jobs)
)

// ResourceStatus is one resource's status: Pending, Reconciling{since},
// Ready{since, details}, Failed{since, error, retry_after}, or
// UnknownResource / Refused with the reason in Error.
type ResourceStatus struct {
	Kind       string            `msgpack:"kind" json:"kind"`
	Phase      Phase             `msgpack:"phase" json:"phase"`
	Since      time.Time         `msgpack:"since" json:"since"`
	Details    map[string]string `msgpack:"details,omitempty" json:"details,omitempty"`
	Error      string            `msgpack:"error,omitempty" json:"error,omitempty"`
	RetryAfter *time.Time        `msgpack:"retry_after,omitempty" json:"retry_after,omitempty"`
	Failures   int               `msgpack:"failures,omitempty" json:"failures,omitempty"`
	// Generation is the manifest generation this status is for.
	Generation uint64 `msgpack:"gen" json:"generation"`
	// Audit says the resource's event trail (ev.agent.<agent>.<id>) was
	// interrupted: another process appended to it, and events this agent
	// queued then were lost. "" while the trail is whole.
	Audit string `msgpack:"audit,omitempty" json:"audit,omitempty"`
}

// Condition is an agent-wide fact ("Converged", "ManifestInvalid").
type Condition struct {
	Type    string    `msgpack:"type" json:"type"`
	Status  bool      `msgpack:"status" json:"status"`
	Reason  string    `msgpack:"reason,omitempty" json:"reason,omitempty"`
	Message string    `msgpack:"message,omitempty" json:"message,omitempty"`
	Since   time.Time `msgpack:"since" json:"since"`
}

// Status is what an agent reports at actual-state.<agent>.
type Status struct {
	Agent string `msgpack:"agent" json:"agent"`
	// ManifestGeneration is the generation of the manifest the agent has
	// read; ObservedGeneration the one every resource has been reconciled
	// against (equal when converged).
	ManifestGeneration uint64                    `msgpack:"manifest_gen" json:"manifest_generation"`
	ObservedGeneration uint64                    `msgpack:"observed_gen" json:"observed_generation"`
	Resources          map[string]ResourceStatus `msgpack:"resources" json:"resources"`
	Conditions         []Condition               `msgpack:"conditions" json:"conditions"`
	Version            string                    `msgpack:"version" json:"agent_version"`
	Updated            time.Time                 `msgpack:"updated" json:"updated"`
	// ManifestSigner is the public key that signed the manifest the agent
	// runs ("": it runs an unsigned one, or none).
	ManifestSigner string `msgpack:"manifest_signer,omitempty" json:"manifest_signer,omitempty"`
	// RefusedManifest is the latest desired state the agent refused to
	// run; nil once it runs the latest. What it ran before keeps running.
	RefusedManifest *ManifestRefusal `msgpack:"refused_manifest,omitempty" json:"refused_manifest,omitempty"`
}

// RefusalReason says why an agent refused a desired state.
type RefusalReason string

const (
	RefusedUndecodable  RefusalReason = "Undecodable"  // not a manifest, nor a signed one
	RefusedInvalid      RefusalReason = "Invalid"      // a manifest rule (agent, ids, two resources of one thing)
	RefusedUnsigned     RefusalReason = "Unsigned"     // the node requires signatures (security.manifest_keys)
	RefusedBadSignature RefusalReason = "BadSignature" // the signature does not verify against the key it names
	RefusedUntrustedKey RefusalReason = "UntrustedKey" // signed by a key not in security.manifest_keys
	RefusedRollback     RefusalReason = "Rollback"     // signed, but older than the manifest the agent runs
)

// ManifestRefusal is a desired state an agent refused, and why.
type ManifestRefusal struct {
	Revision uint64        `msgpack:"rev" json:"revision"` // of desired-state.<agent>
	Reason   RefusalReason `msgpack:"reason" json:"reason"`
	// Signer is the key the value says signed it ("": unsigned or
	// undecodable); with BadSignature it did not sign it.
	Signer string `msgpack:"signer,omitempty" json:"signer,omitempty"`
	// Generation is what the refused manifest claims (0: unknown); with
	// any reason but Rollback and Invalid it is unverified.
	Generation uint64    `msgpack:"gen,omitempty" json:"generation,omitempty"`
	Message    string    `msgpack:"message" json:"message"`
	Since      time.Time `msgpack:"since" json:"since"`
}

// Converged reports whether every resource is Ready for the manifest's
// generation.
func (s Status) Converged() bool {
	if s.ObservedGeneration != s.ManifestGeneration {
		return false
	}
	for _, r := range s.Resources {
		if r.Phase != Ready || r.Generation != s.ManifestGeneration {
			return false
		}
	}
	return true
}

// Settled reports whether every resource of the manifest's generation has
// an outcome (Ready, Failed, UnknownResource or Refused).
func (s Status) Settled() bool {
	for _, r := range s.Resources {
		if r.Generation != s.ManifestGeneration || r.Phase == Pending || r.Phase == Reconciling {
			return false
		}
	}
	return true
}

// IDs lists the resources, sorted.
func (s Status) IDs() []string {
	ids := make([]string, 0, len(s.Resources))
	for id := range s.Resources {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// EncodeStatus and DecodeStatus are the wire form (msgpack).
func EncodeStatus(s Status) ([]byte, error) { return msgpack.Marshal(s) }

// DecodeStatus decodes a stored status.
// b is untrusted: it is checked against StatusLimits first (CheckWire).
func DecodeStatus(b []byte) (Status, error) {
	return decodeBounded[Status](b, StatusLimits, "agent status")
}

// Backoff is the wait before retry number failures (1: the first retry):
// base doubled per failure, capped at max.
func Backoff(failures int, base, max time.Duration) time.Duration {
	d := base
	for i := 1; i < failures && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}
