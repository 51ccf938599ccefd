package vm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"understudy/actors/capability"
	"understudy/actors/resources/libvirt"
)

// The domain states libvirt reports (libvirt.DomainStatus.State) beyond
// the two the libvirt package names.
const (
	stateBlocked      = "blocked" // running, waiting on a resource
	statePaused       = "paused"
	stateShuttingDown = "shutting-down"
	stateCrashed      = "crashed"
	statePMSuspended  = "pmsuspended"
)

// pollInterval is how often Promote and Demote read the domain's state
// while they wait for it to change.
const pollInterval = 200 * time.Millisecond

// VM is one pair member's libvirt domain as its workload. Safe for
// concurrent use; it keeps no state of its own between calls (libvirt's
// is the truth), so every method is idempotent, as capability.Workload
// requires.
//
// How each libvirt domain state reads (Check; the others act on it):
//
//   - running, blocked (running, waiting on I/O or a lock): RolePrimary.
//   - shutoff: RoleStandby. A stopped VM is a healthy standby: Promote
//     starts it.
//   - paused, pmsuspended, crashed (QEMU kept after a guest crash),
//     shutting-down, and any other: RoleDown, and Check fails in either
//     role. Such a domain cannot serve, yet it is no clean standby: its
//     QEMU still holds the disk, and a paused guest resumed later would
//     write from memory that predates what the peer has written to the
//     shared disk since. Fence and Rejoin destroy it; Promote destroys it
//     and boots it afresh (never resumes it), for the same reason.
type VM struct {
	cfg    Config // defaults filled in
	uri    string
	shared libvirt.Hypervisor // reads: Check, and the waits
	fresh  libvirt.Hypervisor // changes: start, shutdown, destroy
	logger *slog.Logger
}

var _ capability.Workload = (*VM)(nil)

// New returns the workload of cfg's domain, reached through conn (the
// runtime's libvirt.DriverProcess). It refuses a cfg that breaks a rule
// (the *actors.ConfigError names fields under "vm"); zero durations take
// their defaults. It makes no libvirt call. logger nil means
// slog.Default().
func New(cfg Config, conn libvirt.Connector, logger *slog.Logger) (*VM, error) {
	if err := cfg.Validate("vm"); err != nil {
		return nil, err
	}
	if conn == nil {
		return nil, errors.New("vm: no libvirt connector (a wiring mistake: pass the runtime's libvirt.DriverProcess)")
	}
	if logger == nil {
		logger = slog.Default()
	}
	cfg = cfg.withDefaults()
	uri := cfg.ConnURI()
	return &VM{
		cfg:    cfg,
		uri:    uri,
		shared: conn.Hypervisor(uri),
		fresh:  conn.Fresh(uri),
		logger: logger.With("domain", cfg.Domain, "uri", uri),
	}, nil
}

// FenceBudget is the longest Fence takes (its destroy's timeout, the
// config's fence_timeout): the pair's fence_grace must cover it.
func (v *VM) FenceBudget() time.Duration { return v.cfg.FenceTimeout }

// Fence destroys the domain (virDomainDestroy: powered off at once, as
// virsh destroy). A domain already shut off is fenced: Fence succeeds.
// A domain that does not exist fails it: a misspelt name must not pass for
// a fence. It fails when the destroy has not returned within FenceBudget
// (the understudy-libvirt process running it is killed then).
func (v *VM) Fence(ctx context.Context, req capability.Request) error {
	was, err := v.destroy(ctx)
	if err != nil {
		return v.errorf("fence: destroy: %w", err)
	}
	if was {
		v.log(req).Warn("vm: fenced: domain destroyed", "reason", req.Reason)
	} else {
		v.log(req).Info("vm: fenced: domain already shut off", "reason", req.Reason)
	}
	return nil
}

// Promote starts the domain (virDomainCreate) and returns once it runs.
// A running domain is left alone. One in any other active state (paused,
// crashed, …) is destroyed first and booted afresh: see VM. A domain that
// stops again at once fails Promote.
//
// When ctx ends, Promote returns its error at once; a start libvirt has
// already begun may still complete. Whatever supersedes a promotion
// (Fence, Demote, Rejoin) stops the domain again.
func (v *VM) Promote(ctx context.Context, req capability.Request) error {
	st, err := v.status(ctx)
	if err != nil {
		return v.errorf("promote: %w", err)
	}
	switch {
	case running(st.State):
		return nil
	case st.State == libvirt.StateShutoff:
	default:
		v.log(req).Warn("vm: promote: domain is "+st.State+"; destroying it to boot it afresh (a resumed guest would write from stale memory)", "state", st.State)
		if _, err := v.destroy(ctx); err != nil {
			return v.errorf("promote: destroy the %s domain before starting it: %w", st.State, err)
		}
	}
	if err := v.fresh.Start(ctx, v.cfg.Domain); err != nil {
		return v.errorf("promote: start: %w", err)
	}
	st, err = v.waitFor(ctx, time.Time{}, func(s libvirt.DomainStatus) bool {
		return running(s.State) || s.State == libvirt.StateShutoff
	})
	if err != nil {
		return v.errorf("promote: started; waiting for it to run: %w", err)
	}
	if !running(st.State) {
		return v.errorf("promote: started, but the domain is %s again at once: see its log (/var/log/libvirt/qemu/%s.log on a QEMU host)", st.State, v.cfg.Domain)
	}
	v.log(req).Info("vm: promoted: domain started", "reason", req.Reason)
	return nil
}

// Demote asks the guest to power off (ACPI, as virsh shutdown) and waits
// for it, for at most the config's shutdown_timeout — less when ctx's
// deadline comes sooner, keeping fence_timeout of it for the destroy —
// then destroys a domain that still runs. A domain not running (shut off
// already) is left alone; one paused, crashed or suspended cannot honour
// ACPI and is destroyed at once.
//
// When ctx ends, Demote returns its error; the guest goes on powering off.
func (v *VM) Demote(ctx context.Context, req capability.Request) error {
	st, err := v.status(ctx)
	if err != nil {
		return v.errorf("demote: %w", err)
	}
	if st.State == libvirt.StateShutoff {
		return nil
	}
	if running(st.State) || st.State == stateShuttingDown {
		grace := v.cfg.ShutdownTimeout
		if dl, ok := ctx.Deadline(); ok {
			grace = min(grace, time.Until(dl)-v.cfg.FenceTimeout)
		}
		if grace > 0 {
			err := v.shutdown(ctx, grace)
			if err == nil {
				v.log(req).Info("vm: demoted: guest powered off", "reason", req.Reason)
				return nil
			}
			if ctx.Err() != nil {
				return v.errorf("demote: waiting for the guest to power off: %w", ctx.Err())
			}
			v.log(req).Warn("vm: demote: guest did not power off in time; destroying the domain", "grace", grace, "err", err)
		} else {
			v.log(req).Warn("vm: demote: the deadline leaves no time for a graceful shutdown; destroying the domain", "fence_timeout", v.cfg.FenceTimeout)
		}
	}
	was, err := v.destroy(ctx)
	if err != nil {
		return v.errorf("demote: destroy: %w", err)
	}
	if was {
		v.log(req).Warn("vm: demoted: domain destroyed", "reason", req.Reason, "state", st.State)
	}
	return nil
}

// errShutdownTimeout: the guest did not power off within the grace.
var errShutdownTimeout = errors.New("still running at the end of the shutdown grace")

// shutdown requests the ACPI power-off and waits at most grace for it.
func (v *VM) shutdown(ctx context.Context, grace time.Duration) error {
	until := time.Now().Add(grace)
	// The request runs in a process of its own (Fresh): bounding it by the
	// grace kills that process only.
	sctx, cancel := context.WithDeadline(ctx, until)
	err := v.fresh.Shutdown(sctx, v.cfg.Domain)
	cancel()
	if err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	_, err = v.waitFor(ctx, until, func(s libvirt.DomainStatus) bool { return s.State == libvirt.StateShutoff })
	return err
}

// Rejoin has nothing to follow: the disk is shared, or replicated outside
// understudy. It returns nil once the domain is shut off — as Fence left
// it; a domain that runs while its member follows is destroyed (it must
// not run beside the leader's).
func (v *VM) Rejoin(ctx context.Context, req capability.Request) error {
	st, err := v.status(ctx)
	if err != nil {
		return v.errorf("rejoin: %w", err)
	}
	if st.State == libvirt.StateShutoff {
		return nil
	}
	v.log(req).Warn("vm: rejoin: domain is "+st.State+" while its member follows "+leaderName(req.Leader)+"; destroying it", "state", st.State)
	if _, err := v.destroy(ctx); err != nil {
		return v.errorf("rejoin: destroy: %w", err)
	}
	return nil
}

// Check reads the domain's state (see VM for what each reads as). It
// fails when the domain does not run on a member that serves
// (req.Serving), when it runs on one that follows, and in every role when
// it is neither running nor shut off. It only reads: stopping a domain
// that runs where it must not is Fence's or Rejoin's. Status.Positions is
// false: a VM reports no replication position.
func (v *VM) Check(ctx context.Context, req capability.Request) (capability.Status, error) {
	st, err := v.shared.DomainStatus(ctx, v.cfg.Domain)
	if err != nil {
		// Role stays unset: nothing was found.
		return capability.Status{Detail: v.where() + ": " + err.Error()}, v.errorf("check: %w", err)
	}
	status, err := judge(st, req.Serving)
	status.Detail = v.where() + ": " + status.Detail
	if err != nil {
		return status, v.errorf("check: %w", err)
	}
	return status, nil
}

// judge reads a domain's status as a Check of a member that serves or
// follows.
func judge(st libvirt.DomainStatus, serving bool) (capability.Status, error) {
	if !st.Defined {
		return capability.Status{Role: capability.RoleDown, Detail: "not defined"},
			errNotDefined
	}
	s := capability.Status{Detail: st.State}
	switch {
	case running(st.State):
		s.Role = capability.RolePrimary
		if !serving {
			return s, errors.New("domain is " + st.State + " while its member follows: it must not run beside the leader's; a fence or rejoin destroys it")
		}
	case st.State == libvirt.StateShutoff:
		s.Role = capability.RoleStandby
		if serving {
			return s, errors.New("domain is shut off while its member serves: it stopped, or was stopped behind understudy's back")
		}
	default:
		s.Role = capability.RoleDown
		return s, errors.New("domain is " + st.State + ": it cannot serve, and it is no clean standby (it holds the disk; a paused guest resumed would write from stale memory); a fence destroys it")
	}
	return s, nil
}

// errNotDefined: the config names a domain libvirt does not have here.
var errNotDefined = fmt.Errorf("domain is not defined on this host (%w): define it here, the same guest as the peer's, on the shared disk", libvirt.ErrNotFound)

// running: the guest runs (blocked is running, waiting on a resource).
func running(state string) bool { return state == libvirt.StateRunning || state == stateBlocked }

// status reads the domain's status; a domain that does not exist is an
// error.
func (v *VM) status(ctx context.Context) (libvirt.DomainStatus, error) {
	st, err := v.shared.DomainStatus(ctx, v.cfg.Domain)
	if err != nil {
		return st, err
	}
	if !st.Defined {
		return st, errNotDefined
	}
	return st, nil
}

// destroy destroys the domain within the fence timeout, in a process of
// its own.
func (v *VM) destroy(ctx context.Context) (wasRunning bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, v.cfg.FenceTimeout)
	defer cancel()
	return v.fresh.Destroy(ctx, v.cfg.Domain)
}

// waitFor reads the domain's status until done accepts it, ctx ends, or
// until passes (the zero time: no bound), when it fails with
// errShutdownTimeout. The reads use ctx, never the bound: a read cut off
// would kill the process Check shares.
func (v *VM) waitFor(ctx context.Context, until time.Time, done func(libvirt.DomainStatus) bool) (libvirt.DomainStatus, error) {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		st, err := v.status(ctx)
		if err != nil {
			return st, err
		}
		if done(st) {
			return st, nil
		}
		if !until.IsZero() && !time.Now().Before(until) {
			return st, fmt.Errorf("domain %s: %w", st.State, errShutdownTimeout)
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-tick.C:
		}
	}
}

func (v *VM) where() string { return "domain " + v.cfg.Domain + " (" + v.uri + ")" }

func (v *VM) errorf(format string, args ...any) error {
	return fmt.Errorf("vm "+v.where()+": "+format, args...)
}

func (v *VM) log(req capability.Request) *slog.Logger {
	return v.logger.With("pair", req.Pair, "site", req.Site, "term", req.Term)
}

func leaderName(site string) string {
	if site == "" {
		return "(no leader known)"
	}
	return site
}
