package runtime

import "understudy/events"

// DescribeEvent renders an event as "type key=value ...", skipping zero
// fields: for live displays and logs.
func DescribeEvent(ev events.Event) string {
	if d := events.Describe(ev); d != "" {
		return ev.EventType() + " " + d
	}
	return ev.EventType()
}
