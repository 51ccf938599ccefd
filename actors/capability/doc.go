// Package capability is what a failover pair asks of the workload it
// protects: Workload (fence, promote, demote, rejoin, check with the
// replication position) and the optional Synchronizer. The member machine
// (actors/failover) decides when; the runtime calls a Workload for each
// procedure the member asks for, whatever the workload is: exec chains
// (procedure.Chains), PostgreSQL (capabilities/postgres) or a libvirt VM
// (capabilities/vm). The pair is written once, over this interface.
//
// The package holds only the interface, its request and status types and
// the arithmetic of log positions: no I/O.
package capability
