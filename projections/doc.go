// Package projections holds understudy's read models: folds over the event
// stream and KV history that rebuild the audit view (leadership timeline,
// failovers, heartbeat statistics, the split-brain check, fleet status) and
// render it as text, JSON or HTML. It imports events and the event types of
// actors, never the runtime.
//
// A Fold takes records (events.Record: an export file's, or a live read's)
// in any order, folds each (stream, sequence) once, and counts what it
// cannot use — gaps in a subject's links, unknown event types, corrupt
// records — instead of dropping it. Report computes the read models;
// WriteText, WriteJSON and WriteHTML render them. docs/replay.md defines
// every field.
package projections
