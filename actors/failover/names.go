package failover

import "strings"

// Names builds and parses the subjects and keys of one pair's record: its
// members' events, its resources' procedure events, its register and
// heartbeat keys. Every writer and every reader of a pair's record spells
// them through it, so that a reader filters and parses exactly what the
// writers wrote.
type Names struct{ Pair string }

// NamesOf returns the names of pair.
func NamesOf(pair string) Names { return Names{Pair: pair} }

// Member is the event subject of the pair's member at site (Subject).
func (n Names) Member(site string) string { return Subject(n.Pair, site) }

// Members is the filter of every member's events of the pair.
func (n Names) Members() string { return n.MemberPrefix() + ">" }

// MemberSite is the site whose member events subject is (ok false: not a
// member subject of this pair).
func (n Names) MemberSite(subject string) (site string, ok bool) {
	return oneToken(subject, n.MemberPrefix())
}

// procedureSubjects is procedure.Subject's prefix, spelled here because
// the procedure package's tests import this one (TestNamesRoundTrip
// checks the two agree).
const procedureSubjects = "ev.procedure."

// Procedure is the procedure-event subject of the pair's resource at
// site: the resource is <pair>.<site> (procedure.Subject).
func (n Names) Procedure(site string) string { return procedureSubjects + n.Pair + "." + site }

// Procedures is the filter of every procedure event of the pair's
// resources.
func (n Names) Procedures() string { return n.ProcedurePrefix() + ">" }

// ProcedureSite is the site whose resource's procedure events subject is
// (ok false: not one of this pair's).
func (n Names) ProcedureSite(subject string) (site string, ok bool) {
	return oneToken(subject, n.ProcedurePrefix())
}

// Leader is the pair's register key (LeaderKey); Heartbeat, a member's
// heartbeat key (HeartbeatKey); Keys, the filter of every key of the
// pair within its bucket.
func (n Names) Leader() string               { return LeaderKey(n.Pair) }
func (n Names) Heartbeat(site string) string { return HeartbeatKey(n.Pair, site) }
func (n Names) Keys() string                 { return n.Pair + ".>" }

// MemberPrefix and ProcedurePrefix are what every subject of the kind
// begins with ("…<pair>."), for a reader that classifies many subjects.
func (n Names) MemberPrefix() string    { return Subject(n.Pair, "") }
func (n Names) ProcedurePrefix() string { return procedureSubjects + n.Pair + "." }

// oneToken is what follows prefix in subject when it is one token.
func oneToken(subject, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(subject, prefix)
	if !ok || rest == "" || strings.Contains(rest, ".") {
		return "", false
	}
	return rest, true
}
