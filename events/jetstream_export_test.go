package events

// Test access to the JetStream implementation's internals.
var (
	MapJetStreamError = mapJetStreamError
	ParseAckReply     = func(reply string) (streamSeq, unixNanos, pending uint64, ok bool) {
		m, ok := parseAckReply(reply)
		return m.streamSeq, uint64(m.time.UnixNano()), m.pending, ok
	}
)

// ReadPullMax is the pull size of Read, for the reference benchmark.
const ReadPullMax = readPullMax
