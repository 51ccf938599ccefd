// Command understudy-libvirt is the libvirt driver process of understudy:
// the only binary that links libvirt (libvirt.org/go/libvirt, built with
// libvirt_dlopen, on the package actors/resources/libvirt/direct).
//
// understudy starts it on first need — one for the calls of the vm and
// network kinds, and one for each libvirt fence step — from the node
// file's libvirt.driver, else from the file next to its own executable,
// else from PATH. It serves the libvirt.Hypervisor operations over net/rpc
// (gob) on its stdin and stdout, and exits when its stdin closes, after
// closing its libvirt connections. understudy starts it in a process group
// of its own and kills the group when a call's deadline passes (libvirt
// calls cannot be interrupted otherwise; the group holds libvirt's ssh
// children), and it dies with understudy (PR_SET_PDEATHSIG). Its log goes
// to stderr as JSON lines, which understudy logs as its own.
//
// With --listen SOCKET it serves every connection to that unix socket
// instead (each on libvirt connections of its own) until SIGTERM or
// SIGINT: the tests share one process between an agent and themselves
// that way (libvirt's test:///default keeps one state per process).
//
// Usage:
//
//	understudy-libvirt [--listen SOCKET] [--log-level LEVEL]
//	understudy-libvirt --version
package main
