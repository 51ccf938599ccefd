// Command understudy-libvirt is the libvirt driver process of understudy:
// the only binary that links libvirt (libvirt.org/go/libvirt, built with
// libvirt_dlopen, on the package actors/resources/libvirt/direct).
//
// understudy starts it on first need — the first call of the vm or
// network kind, or of a libvirt fence step — from the file next to its own
// executable, else from PATH, or from the node file's
// agent.libvirt_driver. It serves the libvirt.Hypervisor operations over
// net/rpc (gob) on its stdin and stdout, and exits when its stdin closes,
// after closing its libvirt connections. understudy kills it when a call's
// deadline passes (libvirt calls cannot be interrupted otherwise) and
// starts another on the next call. Its log goes to stderr as JSON lines,
// which understudy logs as its own.
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
