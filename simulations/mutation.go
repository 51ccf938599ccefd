package simulations

import "strings"

// buildTag is the build tags of the deliberately broken members this
// binary hosts, joined by commas ("" for the production member): Command
// prints reproduce commands that build the same broken member.
var buildTag = joinTags(skipFenceTag, staleEpochTag)

func joinTags(tags ...string) string {
	var set []string
	for _, t := range tags {
		if t != "" {
			set = append(set, t)
		}
	}
	return strings.Join(set, ",")
}
