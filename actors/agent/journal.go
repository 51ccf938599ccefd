package agent

import (
	"github.com/vmihailenco/msgpack/v5"
)

// Journal is what an agent manages, kept in its state directory so that
// an agent started after a crash knows it: every resource it runs with
// its last spec, and the resources whose kind changed, whose old kind
// must be deleted before the new one runs. The runtime writes it before
// it acts on a resource and after it deleted one.
type Journal struct {
	Agent     string     `msgpack:"agent"`
	Resources []Resource `msgpack:"res"`
	Replaced  []Resource `msgpack:"replaced,omitempty"`
}

// JournalLimits bound a stored journal (twice a manifest's resources).
var JournalLimits = WireLimits{Bytes: 4 << 20, Depth: 32, Values: 1 << 18}

// EncodeJournal and DecodeJournal are its form on disk (msgpack).
func EncodeJournal(j Journal) ([]byte, error) { return msgpack.Marshal(j) }

// DecodeJournal decodes a journal within JournalLimits; it never panics.
func DecodeJournal(b []byte) (Journal, error) {
	j, err := decodeBounded[Journal](b, JournalLimits, "agent journal")
	if err != nil {
		return Journal{}, err
	}
	for _, rs := range [][]Resource{j.Resources, j.Replaced} {
		for i := range rs {
			rs[i].Spec = normalize(rs[i].Spec)
		}
	}
	return j, nil
}
