// Package eventstest is the conformance suite of the events storage
// contracts. Both implementations of events.Log and events.KV — the
// JetStream one and the in-memory one the simulator builds on — run the same
// Run, so "identical semantics" is a checked claim rather than a hope: a
// behaviour the suite pins down (expectations, dedup, read ranges and
// filters, KV revisions, history, watch markers) is the same on both.
//
// It is an ordinary package (not a _test file) so each implementation's
// tests can import it; it depends only on the standard library and events.
package eventstest
