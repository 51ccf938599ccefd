package events

// The default names of a deployment's JetStream assets, declared once:
// the node provisions them (runtime), and the simulator, the projections
// and the partition lab name the same ones.
const (
	// DefaultFailoverBucket is the KV bucket of the pairs' registers,
	// heartbeats and node liveness records.
	DefaultFailoverBucket = "understudy_failover"
	// DefaultFleetBucket is the KV bucket of the agents' desired and
	// actual state.
	DefaultFleetBucket = "understudy_fleet"
	// DefaultEventsStream is the stream of every member's, resource's and
	// agent's events.
	DefaultEventsStream = "UNDERSTUDY_EVENTS"
)

// KVStream is the stream that holds KV bucket's entries.
func KVStream(bucket string) string { return "KV_" + bucket }
