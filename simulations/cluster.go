package simulations

import (
	"math/rand/v2"
	"time"

	"understudy/actors/failover"
)

// The NATS cluster behind the simulated server: three sites — the pair's
// two (site index = node index) and the witness (index 2) — each with a
// NATS server, R3 assets, and one stream leader for them. A write is
// answered by the leader once a quorum (two sites) has it; a site's member
// talks to its local server, which forwards to the leader and serves the
// watch and direct reads from what it has applied.
//
// What isolating a site (FaultIsolate) does, as a 3-site cluster did:
//   - the leader keeps its quorum: requests from the isolated site go
//     nowhere (its server has no route to the leader), its watch and its
//     reads stop where they were; on heal the watch resumes;
//   - the leader's own site is isolated: the leader has lost its quorum.
//     Requests from elsewhere go nowhere until an election (raft election
//     timeout, seeded in nats-server's 4–9s) moves the leader to a site
//     that has a quorum; that is when those writes land again. The member
//     at the leader's site still reaches its local server, the old leader:
//     it accepts each write as a proposal it cannot commit (no answer), a
//     second conditional write to a subject with a proposal in flight is
//     refused at once with 10164, and reads answer with what it had (a
//     stale register). On heal its proposals commit in order if no
//     election replaced it (late writes), and are discarded otherwise.
const witnessIdx = 2

// Bounds of nats-server's raft election timeout (server/raft.go).
const (
	electionMin = 4 * time.Second
	electionMax = 9 * time.Second
)

// PRNG stream of the cluster: the first leader's site and election delays.
const streamCluster = 0x7573_696d_0003

type cluster struct {
	rng      *rand.Rand
	leader   int    // site index of the stream leader
	isolated [3]int // isolation faults in force, by site index
	cut      bool   // the leader has lost its quorum and no election has replaced it yet
	electGen uint64
	ghost    int // a deposed leader still isolated: it proposes what will never commit (-1: none)
	pending  [3][]proposal
	view     [3]regView // the register as each site's server last applied it
	lag      [2]time.Duration
}

// proposal is a write a leader without quorum holds.
type proposal struct {
	ref  int32
	node int8
	key  string // KV key or event subject
}

// regView is the register as one site's server has applied it (forged:
// the forger wrote it unsigned).
type regView struct {
	l      failover.Leader
	rev    uint64
	ts     time.Time
	known  bool
	forged bool
}

func (s *sim) initCluster() {
	c := &s.cl
	c.rng = rand.New(rand.NewPCG(s.cfg.Seed, streamCluster))
	c.leader = c.rng.IntN(3)
	c.ghost = -1
}

func (s *sim) siteName(i int) string {
	if i == witnessIdx {
		return Witness
	}
	return s.nodes[i].site
}

func (s *sim) siteIndex(site string) int {
	if site == Witness {
		return witnessIdx
	}
	return s.nodeBySite(site).idx
}

// quorum: the leader's site is connected to at least one other site.
func (c *cluster) quorum() bool {
	if c.isolated[c.leader] > 0 {
		return false
	}
	for j := range c.isolated {
		if j != c.leader && c.isolated[j] == 0 {
			return true
		}
	}
	return false
}

// connected: site i's server applies what the leader commits.
func (c *cluster) connected(i int) bool { return c.isolated[i] == 0 && !c.cut }

// route says where a request from node i goes: to the leader (ok), to a
// leader without quorum that holds it as a proposal (propose, at site),
// or nowhere.
type route uint8

const (
	routeOK route = iota + 1
	routePropose
	routeDrop
)

func (c *cluster) route(i int) (route, int) {
	if i == c.ghost {
		return routePropose, i
	}
	l := c.leader
	if i == l || (c.isolated[i] == 0 && c.isolated[l] == 0) {
		if c.cut {
			return routePropose, l
		}
		return routeOK, l
	}
	return routeDrop, -1
}

// isolate starts (delta 1) or ends (-1) an isolation of a site.
func (s *sim) isolate(site string, delta int) {
	c := &s.cl
	i := s.siteIndex(site)
	c.isolated[i] += delta
	if delta < 0 && c.isolated[i] == 0 && c.ghost == i {
		// A deposed leader rejoins: it learns the new term, and what it
		// proposed alone is discarded.
		s.tracef("nats", "%s rejoins: %d proposals of the deposed leader discarded", site, len(c.pending[i]))
		s.dropProposals(i)
		c.ghost = -1
	}
	s.clusterChanged()
	if i < witnessIdx {
		n := s.nodes[i]
		if delta > 0 {
			n.down.dropped = true // its watch stops where it was
		} else if s.reachable(n) {
			n.down.dropped = false
			s.resync(n)
		}
	}
}

// clusterChanged notices a leader losing or regaining its quorum.
func (s *sim) clusterChanged() {
	c := &s.cl
	q := c.quorum()
	switch {
	case !q && !c.cut:
		c.cut = true
		c.electGen++
		d := electionMin + time.Duration(c.rng.Int64N(int64(electionMax-electionMin)))
		s.push(item{at: s.now + d, kind: evElection, gen: c.electGen})
		s.inv.faultEvent(s, scopeNATS, 1) // every member's writes stall
		s.tracef("nats", "stream leader at %s lost its quorum: writes stall (election in %v)", s.siteName(c.leader), d.Round(time.Millisecond))
	case q && c.cut:
		c.cut = false
		s.inv.faultEvent(s, scopeNATS, -1)
		s.tracef("nats", "stream leader at %s has its quorum again: %d proposals commit", s.siteName(c.leader), len(c.pending[c.leader]))
		s.commitProposals(c.leader)
		s.refreshViews()
	}
}

// election runs when a leader without quorum has been silent for the
// election timeout: the sites that still form a quorum elect a leader.
func (s *sim) election(gen uint64) {
	c := &s.cl
	if !c.cut || gen != c.electGen {
		return
	}
	var cand [3]int
	nc := 0
	for j := range c.isolated {
		if c.isolated[j] == 0 {
			cand[nc] = j
			nc++
		}
	}
	if nc < 2 {
		// No quorum anywhere: try again after another timeout.
		c.electGen++
		d := electionMin + time.Duration(c.rng.Int64N(int64(electionMax-electionMin)))
		s.push(item{at: s.now + d, kind: evElection, gen: c.electGen})
		return
	}
	old := c.leader
	c.leader = cand[c.rng.IntN(nc)]
	if c.ghost >= 0 && c.ghost != old {
		s.dropProposals(c.ghost)
	}
	c.ghost = old
	c.cut = false
	s.count(cLeaderElected)
	s.inv.faultEvent(s, scopeNATS, -1)
	s.tracef("nats", "stream leader elected at %s (%s still cut off, %d proposals will be discarded)", s.siteName(c.leader), s.siteName(old), len(c.pending[old]))
	s.refreshViews()
}

// moveLeader is a planned leader transfer (FaultLeader).
func (s *sim) moveLeader(site string) {
	c := &s.cl
	i := s.siteIndex(site)
	if c.cut || c.isolated[i] > 0 || i == c.leader {
		s.tracef("nats", "stream leader stays at %s", s.siteName(c.leader))
		return
	}
	c.leader = i
	s.tracef("nats", "stream leader moved to %s", site)
}

func (s *sim) dropProposals(i int) {
	c := &s.cl
	for _, p := range c.pending[i] {
		s.release(p.ref)
	}
	clear(c.pending[i])
	c.pending[i] = c.pending[i][:0]
}

// commitProposals lands what a leader held while without quorum, in order.
func (s *sim) commitProposals(i int) {
	c := &s.cl
	ps := c.pending[i]
	c.pending[i] = nil
	for _, p := range ps {
		s.count(cProposalLate)
		s.serve(s.nodes[p.node], p.ref)
	}
	c.pending[i] = ps[:0]
}

// inFlight reports whether site i's leader holds a proposal for key.
func (c *cluster) inFlight(i int, key string) bool {
	for _, p := range c.pending[i] {
		if p.key == key {
			return true
		}
	}
	return false
}

// refreshViews: every site connected to a leader with quorum has applied
// the register as it stands.
func (s *sim) refreshViews() {
	c := &s.cl
	for i := range c.view {
		if c.connected(i) {
			c.view[i] = s.top
		}
	}
}
