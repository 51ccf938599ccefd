// Package runtime hosts understudy on a node: it is where the pure behaviour
// of actors/ meets the network, the disk and the clock.
//
// It owns, in start-up order:
//
//   - configuration: [Config], validated in one place ([Config.Validate]) into
//     typed values; the CLI flags and the YAML node file both fill it;
//   - NATS: an embedded nats-server with JetStream in a local data directory
//     and synchronous fsync ([StartEmbedded], the default), or a connection to
//     an existing NATS cluster with credentials and TLS, retried with capped,
//     jittered exponential backoff while it is unreachable ([Connect]);
//   - provisioning: idempotent creation and update of the JetStream assets
//     (KV buckets and the event stream), reporting what NATS cannot change
//     ([Provision], [Provisioned]);
//   - the hollywood engine hosting the node's failover members ([StartHost]):
//     one actor per (pair, member) fed by a KV watch of the pair's keys, real
//     timers and write results, with a child actor running the member's
//     procedure chains; each appends its events to its own subject with
//     per-subject optimistic concurrency from a goroutine of its own;
//   - the node agent ([StartAgent]) and its resource actors;
//   - the understudy-libvirt processes: one for the agent's libvirt kinds,
//     one for the members' libvirt fence steps (libvirt.DriverProcess),
//     each started on first need and stopped with its owner;
//   - health and metrics over HTTP (/healthz, Prometheus /metrics);
//   - graceful shutdown in reverse order: HTTP, the NATS connection, the
//     embedded server ([Serve]).
//
// runtime may import events, actors, hollywood and nats-server; only
// cmd/understudy imports runtime.
package runtime
