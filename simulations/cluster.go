package simulations

import (
	"math/rand/v2"
	"slices"
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
	lag      [2]time.Duration
}

// proposal is a write a leader without quorum holds.
type proposal struct {
	ref  int32
	node int8
	key  string   // KV key or event subject
	keys []string // a batch's keys (key "")
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

func (w *world) initCluster() {
	c := &w.cl
	c.rng = rand.New(rand.NewPCG(w.cfg.Seed, streamCluster))
	c.leader = c.rng.IntN(3)
	c.ghost = -1
}

func (w *world) siteName(i int) string {
	if i == witnessIdx {
		return Witness
	}
	return w.machines[i].site
}

func (w *world) siteIndex(site string) int {
	if site == Witness {
		return witnessIdx
	}
	return w.machineBySite(site).idx
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
func (w *world) isolate(site string, delta int) {
	c := &w.cl
	i := w.siteIndex(site)
	c.isolated[i] += delta
	if delta < 0 && c.isolated[i] == 0 && c.ghost == i {
		// A deposed leader rejoins: it learns the new term, and what it
		// proposed alone is discarded.
		w.tracef("nats", "%s rejoins: %d proposals of the deposed leader discarded", site, len(c.pending[i]))
		w.dropProposals(i)
		c.ghost = -1
	}
	w.clusterChanged()
	if i < witnessIdx {
		m := w.machines[i]
		if delta > 0 {
			m.down.dropped = true // its watch stops where it was
		} else if w.reachable(m) {
			m.down.dropped = false
			w.resync(m)
		}
	}
}

// clusterChanged notices a leader losing or regaining its quorum.
func (w *world) clusterChanged() {
	c := &w.cl
	q := c.quorum()
	switch {
	case !q && !c.cut:
		c.cut = true
		c.electGen++
		d := electionMin + time.Duration(c.rng.Int64N(int64(electionMax-electionMin)))
		w.push(item{at: w.now + d, kind: evElection, gen: c.electGen})
		w.faultEvent(scopeNATS, 1) // every member's writes stall
		w.tracef("nats", "stream leader at %s lost its quorum: writes stall (election in %v)", w.siteName(c.leader), d.Round(time.Millisecond))
	case q && c.cut:
		c.cut = false
		w.faultEvent(scopeNATS, -1)
		w.tracef("nats", "stream leader at %s has its quorum again: %d proposals commit", w.siteName(c.leader), len(c.pending[c.leader]))
		w.commitProposals(c.leader)
		w.refreshAll()
	}
}

// election runs when a leader without quorum has been silent for the
// election timeout: the sites that still form a quorum elect a leader.
func (w *world) election(gen uint64) {
	c := &w.cl
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
		w.push(item{at: w.now + d, kind: evElection, gen: c.electGen})
		return
	}
	old := c.leader
	c.leader = cand[c.rng.IntN(nc)]
	if c.ghost >= 0 && c.ghost != old {
		w.dropProposals(c.ghost)
	}
	c.ghost = old
	c.cut = false
	w.count(cLeaderElected)
	w.faultEvent(scopeNATS, -1)
	w.tracef("nats", "stream leader elected at %s (%s still cut off, %d proposals will be discarded)", w.siteName(c.leader), w.siteName(old), len(c.pending[old]))
	w.refreshAll()
}

// moveLeader is a planned leader transfer (FaultLeader).
func (w *world) moveLeader(site string) {
	c := &w.cl
	i := w.siteIndex(site)
	if c.cut || c.isolated[i] > 0 || i == c.leader {
		w.tracef("nats", "stream leader stays at %s", w.siteName(c.leader))
		return
	}
	c.leader = i
	w.tracef("nats", "stream leader moved to %s", site)
}

func (w *world) dropProposals(i int) {
	c := &w.cl
	for _, p := range c.pending[i] {
		w.release(p.ref)
	}
	clear(c.pending[i])
	c.pending[i] = c.pending[i][:0]
}

// commitProposals lands what a leader held while without quorum, in order.
func (w *world) commitProposals(i int) {
	c := &w.cl
	ps := c.pending[i]
	c.pending[i] = nil
	for _, p := range ps {
		w.count(cProposalLate)
		w.serve(w.machines[p.node], p.ref)
	}
	c.pending[i] = ps[:0]
}

// inFlight reports whether site i's leader holds a proposal for key.
func (c *cluster) inFlight(i int, key string) bool {
	for _, p := range c.pending[i] {
		if p.key == key || (p.keys != nil && slices.Contains(p.keys, key)) {
			return true
		}
	}
	return false
}

// refreshViews: every site connected to a leader with quorum has applied
// the pair's register as it stands.
func (s *sim) refreshViews() {
	c := &s.cl
	for i := range s.views {
		if c.connected(i) {
			s.views[i] = s.top
		}
	}
}

// refreshAll refreshes every pair's views and the liveness records'.
func (w *world) refreshAll() {
	for _, s := range w.pairs {
		s.refreshViews()
	}
	w.refreshLiveViews()
}

// faultEvent tells every pair's checkers that a fault started (windowed:
// it stays in force), ended, or happened at an instant, in a scope.
func (w *world) faultEvent(scope int, delta int) {
	for _, s := range w.pairs {
		s.inv.faultEvent(s, scope, delta)
	}
}
