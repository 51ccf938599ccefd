package runtime

import (
	"slices"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"understudy/actors/agent"
	"understudy/actors/failover"
)

// Permissions are the identities of sec as the embedded server accepts
// them: each node, operator, admin and reader an nkey user with the least
// privilege that lets it do its job (docs/security.md lists them):
//
//   - a node writes the register and its sites' heartbeats and published
//     rules (<pair>.rules.<site>, never the rules in force) of the pairs it
//     hosts, its own liveness record (_live.<node>) and its probe key, the
//     liveness records of the nodes it shares a pair with (an epoch raise
//     takes a dead node's pairs over), their events, its agent's
//     actual-state, presence and events; it creates (not changes) and
//     reads the assets, and answers its agent's device commands;
//   - an operator writes the rules, switchover, pause and failover
//     requests of any pair, any agent's desired state, sends device
//     commands, and reads;
//   - an admin changes the assets' settings (a stream update, which can
//     add a republish rule that writes any subject, or shrink a stream's
//     limits and so purge it), and reads;
//   - a reader reads.
//
// Nobody may delete a stream or purge or delete its messages through the
// JetStream API. names gives the assets' names (its Replicas is unused).
// The result is new; it keeps nothing of sec. Every identity must connect
// with its inbox prefix (InboxPrefix; AuthOptions sets it).
//
// NATS permissions are per subject: an identity allowed to write a key may
// also write a delete or purge marker on it, and a leader value of a pair
// it hosts may claim any site of it, which is why register values are
// signed.
func Permissions(sec *SecuritySection, names AssetsConfig) []*server.NkeyUser {
	if sec == nil {
		return nil
	}
	a := newPermAssets(names)
	var users []*server.NkeyUser
	for _, node := range slices.Sorted(mapKeys(sec.Nodes)) {
		users = append(users, &server.NkeyUser{Nkey: sec.Nodes[node].NKey, Permissions: a.node(node, sec)})
	}
	for _, k := range sec.Operators {
		users = append(users, &server.NkeyUser{Nkey: k, Permissions: a.operator(k)})
	}
	for _, k := range sec.Admins {
		users = append(users, &server.NkeyUser{Nkey: k, Permissions: a.admin(k)})
	}
	for _, k := range sec.Readers {
		users = append(users, &server.NkeyUser{Nkey: k, Permissions: a.reader(k)})
	}
	return users
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// permAssets are the names permissions are written with.
type permAssets struct {
	failover string // the failover bucket's subject prefix, "$KV.<bucket>."
	fleet    string // the fleet bucket's
	streams  []string
}

func newPermAssets(names AssetsConfig) permAssets {
	return permAssets{
		failover: "$KV." + names.FailoverBucket + ".",
		fleet:    "$KV." + names.FleetBucket + ".",
		streams: []string{
			Asset{Kind: KVBucket, Name: names.FailoverBucket}.StreamName(),
			Asset{Kind: KVBucket, Name: names.FleetBucket}.StreamName(),
			names.EventsStream,
		},
	}
}

// denied to everyone, whatever the allow lists say: the JetStream API
// calls that destroy history.
var deniedToAll = []string{
	"$JS.API.STREAM.DELETE.>",
	"$JS.API.STREAM.PURGE.>",
	"$JS.API.STREAM.MSG.DELETE.>",
	"$JS.API.STREAM.SNAPSHOT.>",
	"$JS.API.STREAM.RESTORE.>",
	"$JS.API.ACCOUNT.PURGE.>",
	"$JS.API.SERVER.REMOVE",
	"$JS.API.META.LEADER.STEPDOWN",
}

// readSet is what every identity needs to read the assets: JetStream
// account info, stream info, direct and message gets, and consumers on
// the three streams (KV watches are push consumers with flow control).
//
// A consumer's deliver subject is in the body of its create request, out
// of reach of permissions: NATS delivers to any subject its creator names.
// It delivers only to literal subscriptions, though, so the streams (whose
// subjects are wildcards) and the agents' commands are out of reach; the
// inboxes, literal, are each identity's own (InboxPrefix), which no other
// identity can subscribe to and so learn.
func (a permAssets) readSet() []string {
	pub := []string{"$JS.API.INFO"}
	for _, st := range a.streams {
		pub = append(pub,
			"$JS.API.STREAM.INFO."+st,
			"$JS.API.STREAM.MSG.GET."+st,
			"$JS.API.DIRECT.GET."+st,
			"$JS.API.DIRECT.GET."+st+".>",
			"$JS.API.CONSUMER.CREATE."+st,
			"$JS.API.CONSUMER.CREATE."+st+".>",
			"$JS.API.CONSUMER.INFO."+st+".*",
			"$JS.API.CONSUMER.DELETE."+st+".*",
			"$JS.API.CONSUMER.MSG.NEXT."+st+".*",
			"$JS.FC."+st+".>",
		)
	}
	return pub
}

// InboxPrefix is the inbox prefix of the identity whose public nkey is
// pub: its replies and its consumers' deliveries arrive under it, and
// nobody else may subscribe there. Another identity that could would
// learn the deliver subjects of its KV watches and could have a consumer
// of its own deliver stale values to them. [AuthOptions] sets it.
func InboxPrefix(pub string) string { return "_INBOX." + pub }

// inboxes is what the identity pub may subscribe to: its own inboxes.
func inboxes(pub string) []string { return []string{InboxPrefix(pub) + ".>"} }

func (a permAssets) reader(key string) *server.Permissions {
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: a.readSet(), Deny: deniedToAll},
		Subscribe: &server.SubjectPermission{Allow: inboxes(key)},
	}
}

func (a permAssets) operator(key string) *server.Permissions {
	pub := a.readSet()
	for _, k := range []string{failover.ConfigKey("*"), failover.SwitchoverKey("*"), failover.PauseKey("*"), failover.ManualFailoverKey("*"), failover.DeploymentLeadershipKey} {
		pub = append(pub, a.failover+k)
	}
	pub = append(pub, a.fleet+agent.DesiredKey("*"), agent.CommandSubject("*", "*"))
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: pub, Deny: deniedToAll},
		Subscribe: &server.SubjectPermission{Allow: inboxes(key)},
	}
}

// admin may update the assets, which nobody else may: an update is a
// write of anything (a RePublish rule copies every message stored to any
// subject, the stream's own included) and a purge (shrunk limits).
func (a permAssets) admin(key string) *server.Permissions {
	pub := a.readSet()
	for _, st := range a.streams {
		pub = append(pub, "$JS.API.STREAM.UPDATE."+st)
	}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: pub, Deny: deniedToAll},
		Subscribe: &server.SubjectPermission{Allow: inboxes(key)},
	}
}

// commandReplyWindow bounds how long after a device command its agent may
// answer it.
const commandReplyWindow = time.Minute

// sharesPair reports whether nodes x and y host members of a common pair.
func sharesPair(x, y NodeIdentity) bool {
	for _, p := range x.Pairs {
		if slices.Contains(y.Pairs, p) {
			return true
		}
	}
	return false
}

func (a permAssets) node(name string, sec *SecuritySection) *server.Permissions {
	id := sec.Nodes[name]
	pub := a.readSet()
	// Leadership: node. Its own liveness record and probe key; the records
	// of the nodes it shares a pair with, whose epoch it raises to take
	// their pairs over (a raise is signed: another node's beats it is
	// not, nor a raise by a third node).
	pub = append(pub, a.failover+failover.LivenessKey(name), a.failover+probeKey(name))
	// The deployment's leadership, which the first node to start records
	// (NATS cannot tell a create from an update: a node that may record it
	// may change it, which can only make nodes refuse to start).
	pub = append(pub, a.failover+failover.DeploymentLeadershipKey)
	for _, other := range slices.Sorted(mapKeys(sec.Nodes)) {
		if other != name && sharesPair(id, sec.Nodes[other]) {
			pub = append(pub, a.failover+failover.LivenessKey(other))
		}
	}
	// Provisioning creates the assets (ProvisionCreateOnly: an update may
	// shorten a stream's history to nothing, so it is an admin's), and
	// the preferred leader's keeper moves their leaders.
	for _, st := range a.streams {
		pub = append(pub, "$JS.API.STREAM.CREATE."+st, "$JS.API.STREAM.LEADER.STEPDOWN."+st)
	}
	sites := id.Sites
	if len(sites) == 0 {
		sites = []string{name}
	}
	for _, p := range id.Pairs {
		// The rules in force (<pair>.config) are the operators' alone:
		// NATS cannot tell a create from an update, so a member that may
		// create them may change them. It publishes its pair file's under
		// its own key instead (RulesKey), which no member applies.
		pub = append(pub, a.failover+failover.LeaderKey(p))
		for _, s := range sites {
			pub = append(pub, a.failover+failover.HeartbeatKey(p, s), a.failover+failover.RulesKey(p, s),
				failover.NamesOf(p).Member(s), failover.HostSubject(p, s), failover.NamesOf(p).Procedure(s))
		}
	}
	sub := inboxes(id.NKey)
	var resp *server.ResponsePermission
	if ag := id.Agent; ag != "-" {
		if ag == "" {
			ag = name
		}
		pub = append(pub, agent.Subject(ag, ">"), a.fleet+agent.ActualKey(ag), a.fleet+agent.PresenceKey(ag))
		sub = append(sub, agent.CommandSubject(ag, "*"))
		resp = &server.ResponsePermission{MaxMsgs: 1, Expires: commandReplyWindow}
	}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: pub, Deny: deniedToAll},
		Subscribe: &server.SubjectPermission{Allow: sub},
		Response:  resp,
	}
}
