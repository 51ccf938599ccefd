package libvirt

import (
	"context"
	"errors"
	"fmt"

	lv "libvirt.org/go/libvirt"

	"understudy/actors/procedure"
)

// FenceDrivers returns the libvirt fence drivers under their step driver
// names (procedure.DriverLibvirtDestroy, procedure.DriverLibvirtLinkDown),
// for the runtime to add to every node's procedure.Drivers.
func FenceDrivers() procedure.Drivers {
	return procedure.Drivers{
		procedure.DriverLibvirtDestroy:  DestroyDriver{},
		procedure.DriverLibvirtLinkDown: LinkDownDriver{},
	}
}

// DestroyDriver is the libvirt-destroy step: it powers the step's domain
// off at once (virDomainDestroy). A domain already shut off is fenced, so
// the step succeeds; a domain that does not exist fails it (a misspelt
// name must not pass for a fence).
//
// Each run opens its own connection and closes it after: a fence must not
// depend on a connection that sat idle since the last one. Run returns
// ResultTimedOut when ctx ends first; the libvirt call then finishes in the
// background (libvirt calls cannot be interrupted).
type DestroyDriver struct{}

// Run implements procedure.Driver.
func (DestroyDriver) Run(ctx context.Context, step procedure.StepSpec) procedure.Outcome {
	spec := step.Libvirt
	if spec == nil {
		return failed("step has no libvirt fields")
	}
	uri := spec.ConnURI()
	was, err := once(ctx, uri, func(conn *lv.Connect) (bool, error) { return destroy(conn, spec.Domain) })
	if err != nil {
		return outcomeOf(ctx, uri, err)
	}
	if !was {
		return procedure.Outcome{Result: procedure.ResultOK, ExitCode: -1, Detail: "domain " + spec.Domain + " already shut off (" + uri + ")"}
	}
	return procedure.Outcome{Result: procedure.ResultOK, ExitCode: -1, Detail: "domain " + spec.Domain + " destroyed (" + uri + ")"}
}

// LinkDownDriver is the libvirt-link-down step: it sets the live link of
// one NIC of the step's domain down (virDomainUpdateDeviceFlags with
// <link state='down'/>), picked by MAC or host-side device. A link already
// down, or a domain not running, is fenced: the step succeeds. The
// persistent definition is not changed, so the link is up again after the
// domain's next boot (a restarted member comes up fenced anyway).
//
// Connections and timeouts are as for DestroyDriver.
type LinkDownDriver struct{}

// Run implements procedure.Driver.
func (LinkDownDriver) Run(ctx context.Context, step procedure.StepSpec) procedure.Outcome {
	spec := step.Libvirt
	if spec == nil {
		return failed("step has no libvirt fields")
	}
	uri := spec.ConnURI()
	ref := NICRef{MAC: spec.MAC, Target: spec.Interface}
	res, err := once(ctx, uri, func(conn *lv.Connect) (LinkResult, error) { return setLink(conn, spec.Domain, ref, false) })
	if err != nil {
		return outcomeOf(ctx, uri, err)
	}
	var detail string
	switch {
	case !res.Running:
		detail = fmt.Sprintf("domain %s is not running: no live link to take down", spec.Domain)
	case !res.Changed:
		detail = fmt.Sprintf("domain %s: link of %s already down", spec.Domain, ref)
	default:
		detail = fmt.Sprintf("domain %s: link of %s set down", spec.Domain, ref)
		if ref.MAC != "" && res.NIC.Target != "" {
			detail += " (" + res.NIC.Target + ")"
		}
	}
	return procedure.Outcome{Result: procedure.ResultOK, ExitCode: -1, Detail: detail + " (" + uri + ")"}
}

func failed(detail string) procedure.Outcome {
	return procedure.Outcome{Result: procedure.ResultFailed, ExitCode: -1, Detail: detail}
}

// outcomeOf maps an error to the step's outcome: ctx's end is a timeout.
func outcomeOf(ctx context.Context, uri string, err error) procedure.Outcome {
	if ctx.Err() != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		return procedure.Outcome{Result: procedure.ResultTimedOut, ExitCode: -1, Detail: err.Error()}
	}
	msg := err.Error()
	if len(msg) < 7 || msg[:7] != "libvirt" {
		msg = "libvirt " + uri + ": " + msg
	}
	return failed(msg)
}
