// Package postgres is the PostgreSQL workload of a failover pair: the
// driver behind capability.Workload, capability.Synchronizer and
// capability.Watched that the pair's host (runtime's workload actor) calls
// when the member machine in actors/failover decides to fence, promote,
// demote, rejoin or check. It holds no failover logic of its own: it does
// what it is told, idempotently, and reports what it finds.
//
// It is a driver, so it does I/O: it runs PostgreSQL's programs (initdb,
// pg_basebackup, pg_rewind, pg_controldata) as the configured OS user and
// talks SQL over a private Unix socket (pgx). The postmaster is not a
// child of the node but of a small keeper process (KeeperMain, the hidden
// `understudy pg-keeper` subcommand) joined to the node by a pipe, so that
// PostgreSQL cannot outlive the node (the pipe closes: immediate shutdown)
// nor outpace it (armed for writes and not petted within the pair's
// fence_grace, e.g. a node paused by SIGSTOP: immediate shutdown).
//
// Every setting understudy relies on is on the postmaster's command line,
// never in the data directory, so a base backup or pg_rewind from the
// other site cannot carry that site's; understudy's own files (socket,
// pg_hba.conf, passfile, server log) live beside the data directory in
// <data_dir>.understudy. synchronous_standby_names alone is changed at
// run time, by ALTER SYSTEM.
//
// The tests run real PostgreSQL 15 servers (Debian's postgresql-15) as
// the postgres user: the whole life of a pair (bootstrap, clone,
// synchronous commit, fences, failover, rewind, switchover) and the
// keeper's guarantees.
package postgres
