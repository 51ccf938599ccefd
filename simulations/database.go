package simulations

import (
	"fmt"
	"math/rand/v2"
	"time"

	"understudy/actors/capability"
	"understudy/actors/failover"
	"understudy/actors/procedure"
)

// Database mode (Scenario.Database): each node's resource is a replicating
// database, the model of actors/failover/workload_test.go made to run in
// virtual time. A primary appends commits to its log; a standby follows
// one primary and receives its log (its lag behind, or not at all when its
// replication link is cut); the leader can make commits wait for its
// standby. A writer commits continuously on whatever serves.
//
// Histories are lineages: every promotion starts a new one, branching from
// the promoted database's position (its timeline is the lineage's number).
// Two databases hold the same commits up to the common prefix of their
// lineages (dbCommon), which is what a rejoin keeps (rewind), what a
// standby must not have passed to follow a new timeline, and what the
// lost-commit check compares with the highest acknowledged commit.
//
// The fence, promote and demote chains still run on the procedure.Runner;
// their steps act on the database when they succeed. Check, rejoin and
// sync are calls of the workload (capability.Workload) that the host runs
// itself, as runtime's workload actor does: a check runs beside anything,
// a rejoin supersedes a chain in flight (and a chain a rejoin), a sync is
// refused while another call runs.

// streamDB is the database mode's PRNG stream: the writer and the calls'
// durations. Runs without the mode never draw from it.
const streamDB = 0x7573_696d_0200

// dbInitial is the log position of a database initdb has just created.
const dbInitial capability.LSN = 16 << 20

// lineage is one history of commits.
type lineage struct {
	parent int32          // -1: a root (bootstrap)
	depth  int32          // 0 for a root
	fork   capability.LSN // where it branched from parent
	acked  capability.LSN // the highest acknowledged commit on it
}

// dbCall is a workload call the host runs itself (check, rejoin, sync).
type dbCall struct {
	id   uint64
	p    failover.Procedure
	at   time.Duration // started
	fail string        // decided at the start: a fault makes it fail so
	how  string        // rejoin: what it will do (for the trace)
	done bool          // it ended; res waits for a paused member
	res  failover.ProcedureResult
	st   capability.Status
}

// database is one node's database.
type database struct {
	exists  bool
	role    capability.Role
	lin     int32          // its history (-1: none)
	pos     capability.LSN // primary: flushed; standby: received (and flushed)
	follows int8           // standby: the node it streams from (-1: none)
	syncSet bool           // primary: commits wait for the standby
	lag     capability.LSN // repllag faults in force: how far behind it stays
	cut     int            // replcut faults in force
	// streamAt: the last time it was seen streaming from streamFrom.
	streamAt   time.Duration
	streamFrom int8
	promote    failover.Procedure // the latest promote request
	call       dbCall             // rejoin or sync in flight
	check      dbCall             // check in flight
	// Its latest register write that published a flush, and the lineage
	// it published it on.
	pubFlush capability.LSN
	pubLin   int32
	// The member withheld its promotion over register revision withheldRev.
	withheld     bool
	withheldSite string
	withheldTerm uint64
	excusedAt    time.Duration // the last step on which it was withheld
	// Faults on the node that excuse a failback decided on stale
	// heartbeats (link, process, NATS faults): in force, last change.
	faultsOn  int
	lastFault time.Duration
}

// dbWorld is the databases' shared state.
type dbWorld struct {
	rng       *rand.Rand
	lins      []lineage
	ref       int32          // the lineage of the latest acknowledged commit (-1: none yet)
	published capability.LSN // the flush of the latest register write that published one
	calls     uint64
}

func (s *sim) initDB() {
	stream := uint64(streamDB)
	if s.pi > 0 {
		stream += uint64(s.pi) << 20 // a stream of its own for every further pair
	}
	s.db = &dbWorld{rng: rand.New(rand.NewPCG(s.cfg.Seed, stream)), ref: -1}
	for _, n := range s.nodes {
		n.db = database{role: capability.RoleDown, lin: -1, follows: -1, streamFrom: -1, pubLin: -1}
	}
	s.push(item{at: time.Second, kind: evCommit, ref: s.pi})
}

// dbCommon is the common prefix of two histories: the positions up to
// which lineage a at pa and lineage b at pb hold the same commits.
func (s *sim) dbCommon(a int32, pa capability.LSN, b int32, pb capability.LSN) capability.LSN {
	for a != b {
		if a < 0 || b < 0 {
			return 0
		}
		la, lb := &s.db.lins[a], &s.db.lins[b]
		if la.depth >= lb.depth {
			pa, a = min(pa, la.fork), la.parent
		} else {
			pb, b = min(pb, lb.fork), lb.parent
		}
	}
	if a < 0 {
		return 0
	}
	return min(pa, pb)
}

// followable: a standby with d's history can stream from p's primary
// without a rewind: same lineage, or an older one it has not passed the
// branching point of (a timeline switch).
func (s *sim) followable(d, p *database) bool {
	if d.lin < 0 || p.lin < 0 {
		return false
	}
	return d.lin == p.lin || s.dbCommon(d.lin, d.pos, p.lin, p.pos) >= d.pos
}

// dbLinked: the replication link between a's database and primary b works.
func (s *sim) dbLinked(a, b *node) bool {
	return a != b && b.db.role == capability.RolePrimary && a.db.cut == 0 && b.db.cut == 0 &&
		s.cl.isolated[a.idx] == 0 && s.cl.isolated[b.idx] == 0
}

// dbStreaming: a's database is a standby streaming from b's primary now.
func (s *sim) dbStreaming(a, b *node) bool {
	return a.db.role == capability.RoleStandby && int(a.db.follows) == b.idx && s.dbLinked(a, b) && s.followable(&a.db, &b.db)
}

// dbStream ships the log to every standby that streams (minus its lag),
// as WAL shipping does between two commits, then acknowledges what waited
// for it. It runs before each commit and whenever a call looks at the
// databases: a standby is one commit behind in between.
func (s *sim) dbStream() {
	for _, n := range s.nodes {
		d := &n.db
		if d.follows < 0 || !s.dbStreaming(n, s.nodes[d.follows]) {
			continue
		}
		p := &s.nodes[d.follows].db
		d.lin = p.lin
		if t := p.pos - min(p.pos, d.lag); t > d.pos {
			d.pos = t
		}
		d.streamAt, d.streamFrom = s.now, d.follows
	}
	for _, n := range s.nodes {
		s.dbAck(n)
	}
}

// dbAck acknowledges what n's primary has flushed, or, when its commits
// wait for the standby, what the standby received.
func (s *sim) dbAck(n *node) {
	d := &n.db
	if d.role != capability.RolePrimary || !n.alive || !n.available() {
		return
	}
	to := d.pos
	if d.syncSet {
		o := s.other(n)
		if !s.dbStreaming(o, n) {
			return
		}
		to = min(to, o.db.pos)
	}
	if l := &s.db.lins[d.lin]; to > l.acked || s.db.ref != d.lin {
		l.acked = max(l.acked, to)
		s.db.ref = d.lin
	}
}

// dbCommit: the writer commits on every database that serves, then
// schedules its next commit.
func (s *sim) dbCommit() {
	w := s.db
	bytes := capability.LSN(256 + w.rng.IntN(16<<10))
	// What was flushed before reaches the standbys first: the commit
	// itself is in flight to them until the next one.
	s.dbStream()
	for _, n := range s.nodes {
		if n.db.role == capability.RolePrimary && n.alive && n.available() {
			n.db.pos += bytes
			s.dbAck(n)
		}
	}
	for _, n := range s.nodes {
		if d := &n.db; d.role == capability.RolePrimary && n.available() && d.syncSet && s.db.lins[d.lin].acked < d.pos {
			s.count(cDBCommitWaited)
		}
	}
	s.push(item{at: s.now + 20*time.Millisecond + time.Duration(w.rng.Int64N(int64(180*time.Millisecond))), kind: evCommit, ref: s.pi})
}

// newLineage starts a history branching from parent at fork.
func (s *sim) newLineage(parent int32, fork capability.LSN) int32 {
	l := lineage{parent: parent, fork: fork}
	if parent >= 0 {
		l.depth = s.db.lins[parent].depth + 1
	}
	s.db.lins = append(s.db.lins, l)
	return int32(len(s.db.lins) - 1)
}

func (d *database) timeline() uint32 {
	if !d.exists {
		return 0
	}
	return uint32(d.lin + 1)
}

// dbStepEffect is what a fence, demote or promote step that succeeded does
// to the database; ok false: the step fails after all (detail says why).
func (s *sim) dbStepEffect(n *node, k procedure.ChainKind) (ok bool, detail string) {
	d := &n.db
	switch k {
	case procedure.ChainFence:
		switch d.role {
		case capability.RolePrimary:
			d.role, d.syncSet = capability.RoleDown, false
			s.tracef(n.site, "db stopped (fence; was primary at %v)", d.pos)
		case capability.RoleStandby:
			s.count(cDBStandbyFenced) // already unable to write: it keeps streaming
		}
	case procedure.ChainDemote:
		if d.role == capability.RolePrimary {
			// A clean shutdown sends a connected standby everything.
			if o := s.other(n); o.db.role == capability.RoleStandby && int(o.db.follows) == n.idx && s.dbLinked(o, n) && s.followable(&o.db, d) {
				o.db.lin, o.db.pos = d.lin, max(o.db.pos, d.pos)
			}
			d.role, d.syncSet = capability.RoleDown, false
			s.tracef(n.site, "db shut down cleanly at %v", d.pos)
		}
	case procedure.ChainPromote:
		req := d.promote
		switch {
		case d.role == capability.RolePrimary:
		case !d.exists && !req.Bootstrap:
			s.count(cDBPromoteEmpty)
			return false, "no database to promote (empty data directory)"
		case !d.exists:
			d.exists, d.role, d.lin, d.pos = true, capability.RolePrimary, s.newLineage(-1, 0), dbInitial
			s.count(cDBBootstrapped)
			s.tracef(n.site, "db created (initdb) and started as primary on timeline %d", d.timeline())
		default:
			s.inv.dbPromoted(s, n)
			was := d.role
			d.lin = s.newLineage(d.lin, d.pos)
			d.role, d.follows = capability.RolePrimary, -1
			s.tracef(n.site, "db promoted at %v on timeline %d (was %v)", d.pos, d.timeline(), was)
		}
		d.syncSet = req.Synchronous
		s.tr.u64(uint64(d.pos))
	}
	return true, ""
}

// dbProcedure takes the procedures the host runs itself (check, rejoin,
// sync); for the chains it remembers the request and stops a call they
// supersede, and reports false: the runner runs them.
func (s *sim) dbProcedure(n *node, p failover.Procedure) bool {
	switch p.Kind {
	case failover.ProcCheck:
		s.dbStart(n, &n.db.check, p, between(s.db.rng, 5*time.Millisecond, 40*time.Millisecond), 1)
		return true
	case failover.ProcSync:
		if _, _, busy := n.runner.Busy(); busy || n.db.call.id != 0 {
			// As the runtime: refused while another procedure runs.
			done := procedure.ChainResult{Kind: procedure.ChainSync, Seq: p.Seq, Detail: "refused: another procedure is in flight"}
			s.appendEvent(n, 1, &procedure.ChainStarted{Resource: s.resource(n.site), Kind: done.Kind, Seq: p.Seq, Steps: 1})
			s.appendEvent(n, 1, &procedure.ChainFinished{Resource: s.resource(n.site), Kind: done.Kind, Seq: p.Seq, Detail: done.Detail})
			s.push(item{at: s.now, kind: evProcDone, node: int8(n.idx), ref: s.alloc(msg{kind: mProcResult, inc: n.inc, done: done, pair: s.pi})})
			return true
		}
		s.dbStart(n, &n.db.call, p, between(s.db.rng, 10*time.Millisecond, 60*time.Millisecond), 0)
		return true
	case failover.ProcRejoin:
		if n.db.call.id != 0 {
			s.dbSupersede(n, fmt.Sprintf("superseded by rejoin seq %d", p.Seq))
		}
		if _, _, busy := n.runner.Busy(); busy {
			s.handleOut(n, n.runner.Abandon(n.clk.local(s.now), fmt.Sprintf("superseded by rejoin seq %d", p.Seq)))
		}
		d, fail, how := s.rejoinPlan(n, p)
		c := &n.db.call
		s.dbStart(n, c, p, d, 0)
		c.fail, c.how = fail, how
		return true
	case failover.ProcPromote:
		n.db.promote = p
	}
	if n.db.call.id != 0 {
		s.dbSupersede(n, fmt.Sprintf("superseded by %s seq %d", p.Kind, p.Seq))
	}
	return false
}

func (s *sim) dbStart(n *node, c *dbCall, p failover.Procedure, d time.Duration, check int32) {
	s.db.calls++
	*c = dbCall{id: s.db.calls, p: p, at: s.now}
	if p.Kind != failover.ProcCheck {
		s.appendEvent(n, 1, &procedure.ChainStarted{Resource: s.resource(n.site), Kind: procedure.ChainKind(p.Kind), Seq: p.Seq, Steps: 1})
	}
	s.push(item{at: s.now + max(d, time.Microsecond), kind: evDBDone, node: int8(n.idx), gen: c.id, ref: check | s.pi<<1})
}

// dbSupersede ends the rejoin or sync in flight without an answer.
func (s *sim) dbSupersede(n *node, why string) {
	c := &n.db.call
	if !c.done {
		s.appendEvent(n, 1, &procedure.ChainFinished{Resource: s.resource(n.site), Kind: procedure.ChainKind(c.p.Kind), Seq: c.p.Seq,
			Superseded: true, Detail: why, Took: s.now - c.at})
	}
	*c = dbCall{}
}

// rejoinPlan: how long a rejoin will take, whether a fault makes it fail,
// and what it expects to do.
func (s *sim) rejoinPlan(n *node, p failover.Procedure) (time.Duration, string, string) {
	r := s.db.rng
	d, how := between(r, 100*time.Millisecond, 300*time.Millisecond), "follow"
	if l := s.nodeBySite(p.Leader); l != nil {
		switch {
		case !n.db.exists:
			d, how = between(r, 3*time.Second, 8*time.Second), "clone"
		case !s.followable(&n.db, &l.db):
			d, how = between(r, time.Second, 3*time.Second), "rewind"
		}
	}
	switch n.procMode(procedure.ChainRejoin) {
	case ProcFail, ProcFailAll:
		return between(r, 100*time.Millisecond, 300*time.Millisecond), "simulated failure: could not connect to " + p.Leader, how
	case ProcHang:
		return 30 * time.Second, "simulated hang: gave up after 30s", how
	case ProcSlow:
		d *= 4
	}
	return d, "", how
}

// dbDone: a workload call ends. Its effect happens now, even while the
// member is paused (it runs on its own); the answer waits for the member.
func (s *sim) dbDone(n *node, it item) {
	c := &n.db.call
	if it.ref&1 == 1 {
		c = &n.db.check
	}
	if !n.alive || c.id != it.gen {
		return
	}
	if !c.done {
		c.done = true
		s.dbFinish(n, c)
	}
	if n.paused {
		n.deferred = append(n.deferred, it)
		return
	}
	res, p, took := c.res, c.p, s.now-c.at
	if res.Status != nil {
		st := c.st // the call's slot is reused: the answer keeps its own copy
		res.Status = &st
	}
	*c = dbCall{}
	if p.Kind != failover.ProcCheck {
		s.appendEvent(n, 1, &procedure.ChainFinished{Resource: s.resource(n.site), Kind: procedure.ChainKind(p.Kind), Seq: p.Seq, OK: res.OK, Detail: res.Detail, Took: took})
	}
	s.step(n, res)
}

// dbFinish carries out a call's effect and builds its answer.
func (s *sim) dbFinish(n *node, c *dbCall) {
	p := c.p
	d := &n.db
	c.res = failover.ProcedureResult{Kind: p.Kind, Seq: p.Seq, OK: true}
	fail := func(detail string) { c.res.OK, c.res.Detail = false, detail }
	s.dbStream()
	switch p.Kind {
	case failover.ProcCheck:
		c.st = s.dbStatus(n, p.Serving)
		c.res.Status = &c.st
		if c.st.Detail != "" {
			fail(c.st.Detail)
		}
	case failover.ProcSync:
		if d.role != capability.RolePrimary {
			fail("not a primary")
			return
		}
		d.syncSet = p.Synchronous
		s.tracef(n.site, "db commits wait for the standby: %v", d.syncSet)
		s.dbAck(n) // stopping to wait releases the waiting commits
	case failover.ProcRejoin:
		l := s.nodeBySite(p.Leader)
		switch {
		case c.fail != "":
			fail(c.fail)
		case l == nil || l == n:
			fail("no leader to follow (" + p.Leader + ")")
		case d.role == capability.RolePrimary:
			fail("the database runs as primary: it must be fenced before it follows " + p.Leader)
		case !s.dbLinked(n, l):
			fail("leader " + p.Leader + " unreachable or not a primary")
		}
		if !c.res.OK {
			s.tracef(n.site, "db rejoin of %s failed: %s", p.Leader, c.res.Detail)
			return
		}
		how := "follows"
		switch {
		case !d.exists:
			how = "cloned from"
			d.exists, d.lin, d.pos = true, l.db.lin, l.db.pos-min(l.db.pos, d.lag)
			s.count(cDBCloned)
		case !s.followable(d, &l.db):
			how = "rewound to"
			d.pos = s.dbCommon(d.lin, d.pos, l.db.lin, l.db.pos)
			d.lin = l.db.lin
			s.count(cDBRewound)
		}
		d.role, d.follows, d.syncSet = capability.RoleStandby, int8(l.idx), false
		s.dbStream()
		s.tracef(n.site, "db %s %s, received %v (timeline %d)", how, p.Leader, d.pos, d.timeline())
		s.tr.u64(uint64(d.pos))
	}
}

// dbStatus is what a check of n's database reports; Detail is set when
// the check fails (the database is not healthy in the member's role).
func (s *sim) dbStatus(n *node, serving bool) capability.Status {
	d := &n.db
	st := capability.Status{Role: d.role, Timeline: d.timeline(), Positions: true}
	switch d.role {
	case capability.RolePrimary:
		st.Flush = d.pos
		st.PeerStreaming = s.dbStreaming(s.other(n), n)
		if st.PeerStreaming {
			st.PeerFlush = s.other(n).db.pos
		}
		st.SynchronousSet = d.syncSet
		st.PeerSynchronous = st.PeerStreaming && d.syncSet
		if !serving {
			st.Detail = "the database runs as primary on a member that does not serve"
		}
	case capability.RoleStandby:
		st.Receive, st.Replay = d.pos, d.pos
		st.Streaming = d.follows >= 0 && s.dbStreaming(n, s.nodes[d.follows])
		switch {
		case serving:
			st.Detail = "the database is a standby on a member that serves"
		case !st.Streaming:
			st.Detail = "the standby does not stream"
		}
	default:
		st.Detail = "the database is down"
		if !d.exists {
			st.Detail = "no database (empty data directory)"
		}
	}
	return st
}

// dbGone: n's member process stopped; its calls die with it. A crash
// takes the database down whatever it was; a member that stopped for good
// fences it (role aware: a standby keeps streaming).
func (s *sim) dbGone(n *node, crash bool) {
	d := &n.db
	d.call, d.check = dbCall{}, dbCall{}
	if d.role == capability.RolePrimary || crash {
		if d.role != capability.RoleDown {
			s.tracef(n.site, "db down (%v at %v)", d.role, d.pos)
		}
		d.role, d.syncSet, d.follows = capability.RoleDown, false, -1
	}
}

// dbRegisterLanded: n's register write landed; what it publishes.
func (s *sim) dbRegisterLanded(n *node, w *failover.Write) {
	l := w.Leader
	if l.Site == n.site && l.Flush > 0 {
		n.db.pubFlush, n.db.pubLin = l.Flush, n.db.lin
		s.db.published = l.Flush
	}
	switch {
	case l.Sync && !s.reg.Sync:
		s.count(cDBSyncOn)
	case !l.Sync && s.reg.Sync && l.Site == s.reg.Site:
		s.count(cDBSyncOff)
	}
}

// dbFault starts (delta 1) or ends (-1) a fault in database mode.
func (s *sim) dbFault(f Fault, delta int) {
	n := s.nodeBySite(f.Site)
	switch {
	case n == nil:
	case f.Kind == FaultReplCut:
		n.db.cut += delta
	case f.Kind == FaultReplLag:
		n.db.lag = capability.LSN(int64(n.db.lag) + int64(delta)*int64(f.Bytes))
	case f.Kind == FaultProc, f.Kind == FaultSwitchover:
	default:
		if !f.instant() {
			n.db.faultsOn += delta
		}
		n.db.lastFault = s.now
	}
}

// dbWithheld: n's member withheld its promotion over the holder the
// register still names, and has neither tried to acquire since nor has
// anyone served since: the lag or synchronous rule forbids the takeover,
// and waiting is what the rules want (the liveness bounds do not apply).
// It withholds again over each later write of a holder that stays fenced,
// but may not see one for a while on a bad link: the excuse lasts.
func (s *sim) dbWithheld(n *node) bool {
	return s.db != nil && n.db.withheld && s.reg.Site == n.db.withheldSite && s.reg.Term == n.db.withheldTerm
}

// dbWithholds records a member's decision: withheld (a PromotionWithheld
// over the register as s.reg holds it) or not (an acquire attempt, or a
// database that serves).
func (s *sim) dbWithholds(n *node, on bool) {
	n.db.withheld, n.db.withheldSite, n.db.withheldTerm = on, s.reg.Site, s.reg.Term
}

func (s *sim) followsName(i int8) string {
	if i < 0 {
		return ""
	}
	return s.nodes[i].site
}
