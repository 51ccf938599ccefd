// Package events is the bottom layer of understudy: the versioned event
// envelope and its msgpack codec, and the two storage contracts every actor
// builds on — Log, an append-only stream with per-subject optimistic
// concurrency, and KV, a revisioned key/value register with history.
//
// Each contract has two implementations with identical semantics: one on
// NATS JetStream (the real thing) and one in memory with an injected clock
// (for unit tests and the deterministic simulator). A single conformance suite
// (package events/eventstest) runs against both.
//
// events imports nothing else of understudy; everything else imports it.
package events
