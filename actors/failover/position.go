package failover

import "understudy/actors/capability"

// LeaderFlush is the latest flush position a holder published in the
// register, as this member saw it (0: none yet): a follower's lag is
// measured against it.
func (m *Member) LeaderFlush() capability.LSN { return m.pubFlush }
