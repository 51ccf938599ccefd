package failover

import (
	"fmt"

	"understudy/actors/capability"
)

// db is a replicating database in the transcripts' world: a primary
// appends to its log (commits, in bytes), a standby follows one primary
// and receives its log (lagBy bytes behind while it streams), the leader
// can make commits wait for its standby. It lets transcripts show what the
// member decides from positions, and checks on every commit and promotion
// that no acknowledged commit is lost.
type db struct {
	role     capability.Role
	timeline uint32
	flush    capability.LSN // primary: its log's end; standby: received
	follows  string         // standby: the primary it streams from
	syncSet  bool           // primary: commits wait for the standby
	lagBy    capability.LSN // standby: how far behind it stays while streaming
	cut      bool           // standby: the replication link is cut
	exists   bool           // the data directory holds a database
}

// dbWorld is the world's database state: the highest acknowledged commit
// and how many acknowledged bytes a promotion lost.
type dbWorld struct {
	acked capability.LSN
	lost  int
}

func (w *world) dbOf(site string) *db { return w.node[site].db }

// stream brings every standby that follows a running primary up to date
// (minus its lag), as WAL shipping does between two commits.
func (w *world) stream() {
	for _, s := range w.sites {
		d := w.dbOf(s)
		if d.role != capability.RoleStandby || d.follows == "" || d.cut {
			continue
		}
		p := w.dbOf(d.follows)
		if p.role != capability.RolePrimary || p.timeline != d.timeline && d.flush > p.flush {
			continue
		}
		d.timeline = p.timeline
		if target := p.flush - min(p.flush, d.lagBy); target > d.flush {
			d.flush = target
		}
	}
}

// commit appends n bytes on every primary that serves; a commit is
// acknowledged when it is flushed, and, when the primary waits for its
// standby, once that standby received it (else it blocks: not acked).
func (w *world) commit(n capability.LSN) {
	for _, s := range w.sites {
		d := w.dbOf(s)
		if d.role != capability.RolePrimary || !w.node[s].serving {
			continue
		}
		d.flush += n
		w.stream()
		if d.syncSet {
			sb := w.dbOf(w.rules.Other(s))
			if sb.role != capability.RoleStandby || sb.follows != s || sb.cut || sb.flush < d.flush {
				w.logf(s, "db commit of %d bytes waits for the standby (not acknowledged)", n)
				continue
			}
		}
		w.wdb.acked = max(w.wdb.acked, d.flush)
		w.logf(s, "db commit acknowledged at %v", d.flush)
	}
}

// status is what a check of site's database reports.
func (w *world) status(site string, serving bool) (capability.Status, bool) {
	d := w.dbOf(site)
	st := capability.Status{Role: d.role, Timeline: d.timeline, Positions: true}
	switch d.role {
	case capability.RolePrimary:
		st.Flush = d.flush
		o := w.dbOf(w.rules.Other(site))
		st.PeerStreaming = o.role == capability.RoleStandby && o.follows == site && !o.cut && w.node[w.rules.Other(site)].alive
		if st.PeerStreaming {
			st.PeerFlush = o.flush
		}
		st.SynchronousSet = d.syncSet
		st.PeerSynchronous = st.PeerStreaming && d.syncSet
		return st, serving
	case capability.RoleStandby:
		st.Receive, st.Replay = d.flush, d.flush
		p := w.dbOf(d.follows)
		st.Streaming = d.follows != "" && !d.cut && p != nil && p.role == capability.RolePrimary
		return st, !serving && st.Streaming
	}
	return st, false
}

// dbProc carries out a procedure on site's database; ok false fails it.
func (w *world) dbProc(n *node, p Procedure) (ok bool, detail string, st *capability.Status) {
	d := n.db
	switch p.Kind {
	case ProcFence:
		if d.role == capability.RolePrimary {
			d.role, d.syncSet = capability.RoleDown, false
			w.logf(n.site, "db stopped (was primary)")
		}
	case ProcDemote:
		if d.role == capability.RolePrimary {
			w.stream() // a clean shutdown sends its standby everything
			d.role, d.syncSet = capability.RoleDown, false
			w.logf(n.site, "db shut down cleanly")
		}
	case ProcPromote:
		switch {
		case d.role == capability.RolePrimary:
		case !d.exists && !p.Bootstrap:
			return false, "no database to promote (empty data directory)", nil
		case !d.exists:
			d.exists, d.role, d.timeline, d.flush = true, capability.RolePrimary, 1, 100
			w.logf(n.site, "db created (initdb) and started as primary")
		case d.role == capability.RoleStandby:
			if d.flush < w.wdb.acked {
				w.wdb.lost += int(w.wdb.acked - d.flush)
				w.logf(n.site, "!! LOST COMMITS: promoted at %v, commits were acknowledged up to %v", d.flush, w.wdb.acked)
			}
			w.wdb.acked = d.flush // the new timeline's commits count from here
			d.role, d.follows, d.timeline = capability.RolePrimary, "", d.timeline+1
			w.logf(n.site, "db promoted at %v on timeline %d", d.flush, d.timeline)
		default:
			d.role = capability.RolePrimary
			w.logf(n.site, "db started as primary at %v", d.flush)
		}
		d.syncSet = p.Synchronous
	case ProcRejoin:
		l := w.node[p.Leader]
		if l == nil || !l.alive || l.db.role != capability.RolePrimary || d.cut {
			return false, "leader " + p.Leader + " unreachable or not a primary", nil
		}
		how := "follows"
		switch {
		case !d.exists:
			how = "cloned from"
		case d.timeline != l.db.timeline || d.flush > l.db.flush:
			how = "rewound to"
			d.flush = min(d.flush, l.db.flush)
		}
		d.exists, d.role, d.follows, d.timeline = true, capability.RoleStandby, p.Leader, l.db.timeline
		if how != "follows" {
			d.flush = l.db.flush - min(l.db.flush, d.lagBy)
		}
		w.stream()
		w.logf(n.site, "db %s %s, received %v", how, p.Leader, d.flush)
	case ProcSync:
		if d.role != capability.RolePrimary {
			return false, "not a primary", nil
		}
		d.syncSet = p.Synchronous
		w.logf(n.site, "db commits wait for the standby: %v", d.syncSet)
	case ProcCheck:
		s, ok := w.status(n.site, n.m.Phase() == PhaseLeader)
		detail := ""
		if !ok {
			detail = fmt.Sprintf("db is %v", s.Role)
		}
		return ok, detail, &s
	}
	return true, "", nil
}
