package libvirt

import (
	"context"
	"errors"
	"fmt"

	"understudy/actors/procedure"
)

// FenceDrivers returns the libvirt fence drivers under their step driver
// names (procedure.DriverLibvirtDestroy, procedure.DriverLibvirtLinkDown),
// on c, for the runtime to add to every node's procedure.Drivers. The
// runtime gives a DriverProcess: each step runs in an understudy-libvirt
// process of its own, which it kills at the step's deadline — that stops
// the libvirt call, and no other step's.
func FenceDrivers(c Connector) procedure.Drivers {
	return procedure.Drivers{
		procedure.DriverLibvirtDestroy:  DestroyDriver{Connector: c},
		procedure.DriverLibvirtLinkDown: LinkDownDriver{Connector: c},
	}
}

// DestroyDriver is the libvirt-destroy step: it powers the step's domain
// off at once (virDomainDestroy). A domain already shut off is fenced, so
// the step succeeds; a domain that does not exist fails it (a misspelt
// name must not pass for a fence).
//
// Each run opens its own connection (Connector.Fresh) and closes it after:
// a fence must not depend on a connection that sat idle since the last
// one. Run returns ResultTimedOut when ctx ends first; on a DriverProcess
// the understudy-libvirt process that ran the call alone has been killed
// then (libvirt calls cannot be interrupted otherwise).
type DestroyDriver struct{ Connector Connector }

// Run implements procedure.Driver.
func (d DestroyDriver) Run(ctx context.Context, step procedure.StepSpec) procedure.Outcome {
	spec, hv, uri, bad := fresh(d.Connector, step)
	if bad != nil {
		return *bad
	}
	was, err := hv.Destroy(ctx, spec.Domain)
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
type LinkDownDriver struct{ Connector Connector }

// Run implements procedure.Driver.
func (d LinkDownDriver) Run(ctx context.Context, step procedure.StepSpec) procedure.Outcome {
	spec, hv, uri, bad := fresh(d.Connector, step)
	if bad != nil {
		return *bad
	}
	ref := NICRef{MAC: spec.MAC, Target: spec.Interface}
	res, err := hv.SetLink(ctx, spec.Domain, ref, false)
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

// fresh checks a step's libvirt fields and opens the connection of its run
// (Connector.Fresh); bad is the step's outcome when it cannot run.
func fresh(c Connector, step procedure.StepSpec) (spec *procedure.LibvirtSpec, hv Hypervisor, uri string, bad *procedure.Outcome) {
	spec = step.Libvirt
	if spec == nil {
		o := failed("step has no libvirt fields")
		return nil, nil, "", &o
	}
	if c == nil {
		o := failed("libvirt fence driver without a connector (a wiring mistake)")
		return nil, nil, "", &o
	}
	uri = spec.ConnURI()
	return spec, c.Fresh(uri), uri, nil
}
