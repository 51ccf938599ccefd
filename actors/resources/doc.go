// Package resources holds the reconcilers of managed resource kinds: the
// drivers a node agent's resource actors command (file, process, container,
// shell-job, and the libvirt vm and network kinds in resources/libvirt).
//
// A reconciler does I/O but decides nothing: the agent's pure state machine
// (actors/agent) decides when to observe, reconcile, retry or delete, and the
// runtime calls the reconciler from the resource's hollywood actor. Time
// enters through the caller; reconcilers never read the clock.
package resources
