package projections

import "understudy/events"

// describe renders an event's fields for the timeline, leaving out the
// ones every event of a subject repeats (pair, site, resource, rules).
func describe(ev events.Event) string {
	return events.Describe(ev, "Pair", "Site", "Resource", "Rules")
}
