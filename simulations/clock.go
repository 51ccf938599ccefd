package simulations

import (
	"sync/atomic"
	"time"
)

// Epoch is virtual time zero on the simulated server's clock.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// serverClock is the simulated NATS server's wall clock: the source of every
// server timestamp the stores write. The simulator sets it before each server
// operation; it is atomic only so the conformance suite may read it from
// several goroutines.
type serverClock struct{ ns atomic.Int64 }

// Now implements events.Clock.
func (c *serverClock) Now() time.Time { return time.Unix(0, c.ns.Load()).UTC() }

func (c *serverClock) set(t time.Time) { c.ns.Store(t.UnixNano()) }

// nodeClock is a node's local monotonic clock: it runs at rate 1 + ppm/1e6
// of virtual time and may jump forward. local(t) = base + (t - t0) * (1 + ppm/1e6).
// All arithmetic is on integers, so it is the same on every machine.
type nodeClock struct {
	t0   time.Duration // virtual time of the last rebase
	base time.Duration // local reading at t0
	ppm  int64         // drift in parts per million, |ppm| <= 1000
}

func (c *nodeClock) local(t time.Duration) time.Duration {
	el := int64(t - c.t0)
	return c.base + time.Duration(el+el*c.ppm/1_000_000)
}

// virtual returns the earliest virtual time at which the clock reads at
// least l (never before t0).
func (c *nodeClock) virtual(l time.Duration) time.Duration {
	x := int64(l - c.base)
	if x <= 0 {
		return c.t0
	}
	t := c.t0 + time.Duration(x-x*c.ppm/(1_000_000+c.ppm))
	for c.local(t) < l {
		t++
	}
	for t > c.t0 && c.local(t-1) >= l {
		t--
	}
	return t
}

// jump moves the clock forward by d at virtual time t.
func (c *nodeClock) jump(t, d time.Duration) {
	c.base, c.t0 = c.local(t)+d, t
}
