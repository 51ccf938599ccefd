// Package vm is a libvirt virtual machine as the workload of a failover
// pair: it implements capability.Workload, so the pair (written once over
// that interface) protects a VM as it protects any other workload.
//
// The VM's disk is shared between the pair's two sites, or replicated
// outside understudy: each site defines the same guest as a domain of its
// own, and the pair makes sure at most one of them runs. Promote starts
// the local domain, Fence and Rejoin destroy it, Demote shuts it down
// (gracefully, then by force), Check reads its state. There is nothing to
// follow and no replication position (Status.Positions is false: the lag
// rules do not apply).
//
// Like the libvirt fence steps, it links no libvirt: every call goes
// through a libvirt.Connector, in the runtime a libvirt.DriverProcess,
// which runs it in an understudy-libvirt process (see package
// actors/resources/libvirt). Calls that change the domain (start,
// shutdown, destroy) use Connector.Fresh: each runs in a process of its
// own on a connection of its own, so that cancelling one — a fence
// superseding a promote — kills that call only, and a fence never depends
// on a connection that sat idle. Reads (Check, and the waits of Promote
// and Demote) share the Connector.Hypervisor process: a read cut off by
// its ctx kills that process, failing a Check under way once (the next
// call starts another), which is why Demote's bounded wait never cuts a
// read short.
//
// The package sits beside actors/ rather than in it because it waits on
// real time (Demote's bounded shutdown); its host, the runtime, owns its
// lifetime and the Connector.
package vm
