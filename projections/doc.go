// Package projections holds understudy's read models: folds over the event
// stream and KV history that rebuild the audit view (leadership timeline,
// failovers, heartbeat statistics, the split-brain check, fleet status) and
// render it as text, JSON or HTML. It imports events and the event types of
// actors, never the runtime.
package projections
