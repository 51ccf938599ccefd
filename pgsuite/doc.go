// Package pgsuite is the real PostgreSQL pair suite: each test runs a
// witness `understudy serve` holding the embedded NATS, and two nodes
// (site-a, the preferred primary, and site-b) from node files with a
// postgres: member, each node driving its own PostgreSQL 15 through its
// keeper process. The tests then do to the primary what a machine can
// suffer — kill -9 of the node, keeper and postmaster; kill -9 of the node
// alone; SIGSTOP; a replica behind a slow link; twenty kills in a row with
// synchronous: on; a restart that must be rewound before failback; the
// two switchovers; a PostgreSQL started by hand behind understudy's back;
// NATS stopped while the bootstrap's initdb runs —
// and judge the databases themselves: a monitor polls both sites every
// 20 ms (a site accepts writes when it is out of recovery and a tiny
// INSERT commits; it streams when pg_stat_wal_receiver says so), and a
// writer commits an increasing counter through the read-write multi-host
// connection string, so that lost acknowledged commits are counted.
//
// Every test logs its measured figures on lines starting "FIGURE <test>"
// (go test -v ./pgsuite | grep FIGURE).
//
// It needs root (PostgreSQL runs as the OS user postgres) and PostgreSQL
// 15's server programs (`make test-deps`); without them every test fails,
// none skips. The understudy binary is built from the working tree once
// per run. Each test has its own directory (os.TempDir()/pgsuite-<pid>-*),
// free ports and processes, all killed at its end, after a failure too; a
// failed test keeps its directory (node logs in */node.log, PostgreSQL's
// in */pgdata.understudy/postgres.log) and names it.
//
//	go test -tags libvirt_dlopen -race ./pgsuite
//	go test -tags libvirt_dlopen -run TestKillPrimary -v ./pgsuite
//
// Environment:
//
//	UNDERSTUDY_PGSUITE_UNDERSTUDY  test this understudy binary instead of building one
//	UNDERSTUDY_PGSUITE_KEEP        keep every test's directory, not only failed ones
//	UNDERSTUDY_PGSUITE_PG_BIN      PostgreSQL 15's bin directory (default /usr/lib/postgresql/15/bin)
//	UNDERSTUDY_SIDEBYSIDE          1: run BenchmarkSideBySide, understudy vs Patroni (about 30 minutes;
//	                               make bench-sidebyside); UNDERSTUDY_SIDEBYSIDE_KILLS kills per profile (15)
//
// Nothing in the module imports it, and it imports nothing of the module:
// it drives the binary as an operator would. partition/ is its sibling for
// network faults (docs/partitions.md).
package pgsuite
