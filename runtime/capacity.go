package runtime

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"understudy/actors/failover"
	"understudy/events"
)

// A node refuses at start to host more members than it can heartbeat: it
// measures the store's write rate with a few probe writes and, with
// leadership: per-pair (one write per member and heartbeat), refuses when
// the members need more than half of it. Past the store's rate, every
// write waits, every member misses its heartbeats at once and overload
// looks like failure (issue 16). With leadership: node the node needs one
// write per heartbeat, whatever the number of pairs.

// Probe sizes: a few writes alone (latency), then a burst of concurrent
// ones (what the store sustains when many members write at once).
const (
	probeSequential = 5
	probeBurst      = 64
	probeTimeout    = 5 * time.Second
	// capacityShare is the share of the store's measured rate heartbeats
	// may take: the rest is for the other nodes on the same store, the
	// events, and a slower moment than the probe's.
	capacityShare = 0.5
)

// StoreProbe is what the probe at a node's start measured.
type StoreProbe struct {
	// Latency is the median answer time of one write alone.
	Latency time.Duration
	// PerSecond is the writes per second the store sustained one at a
	// time (1 / Latency), for the log. Burst is the rate of a burst of
	// concurrent writes: members heartbeat concurrently, so this is what
	// they can count on at best (the store answers a burst faster than a
	// steady load of as many writers, each with its own watch, which the
	// probe does not have: the check catches gross overload only).
	PerSecond, Burst float64
}

// probeKey is the key node's probe writes go to: under the liveness
// prefix, which no pair may be named, and no node's liveness record.
func probeKey(node string) string {
	if node == "" {
		node = "unnamed"
	}
	return failover.LivenessKey(node) + ".probe"
}

// probeStore measures the store's write latency and rate with plain puts
// of key.
func probeStore(ctx context.Context, kv events.KV, key string) (StoreProbe, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	value := []byte("probe")
	lat := make([]time.Duration, 0, probeSequential)
	for range probeSequential {
		began := time.Now()
		if _, err := kv.Put(ctx, key, value); err != nil {
			return StoreProbe{}, err
		}
		lat = append(lat, time.Since(began))
	}
	slices.Sort(lat)
	p := StoreProbe{Latency: lat[len(lat)/2]}
	var wg sync.WaitGroup
	errs := make([]error, probeBurst)
	began := time.Now()
	for i := range probeBurst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = kv.Put(ctx, key, value)
		}()
	}
	wg.Wait()
	took := time.Since(began)
	for _, err := range errs {
		if err != nil {
			return StoreProbe{}, err
		}
	}
	p.Burst = float64(probeBurst) / took.Seconds()
	p.PerSecond = float64(time.Second) / float64(max(p.Latency, time.Microsecond))
	return p, nil
}

// heartbeatWrites is the writes per second members need with per-pair
// leadership: one per member and heartbeat_timeout.
func heartbeatWrites(members []MemberConfig) float64 {
	var need float64
	for _, m := range members {
		if hb := m.Rules.HeartbeatTimeout; hb > 0 {
			need += float64(time.Second) / float64(hb)
		}
	}
	return need
}

// CapacityError is a node's refusal to host more members than its store
// can heartbeat (leadership: per-pair).
type CapacityError struct {
	Members int
	// Need is the writes per second the members need; Sustained what the
	// store sustained in the probe at start, with Latency a write.
	Need, Sustained float64
	Latency         time.Duration
}

func (e *CapacityError) Error() string {
	return fmt.Sprintf("runtime: this node cannot heartbeat %d members with leadership: per-pair: they need %.0f writes per second (one per member and heartbeat_timeout), "+
		"and the store sustained %.0f concurrent writes per second in the probe at start (%v a write alone), of which at most %.0f%% may go to heartbeats. "+
		"Set leadership: node in the node file (one write per heartbeat for the whole node, whatever the number of pairs), or host fewer pairs on this node",
		e.Members, e.Need, e.Sustained, e.Latency.Round(10*time.Microsecond), capacityShare*100)
}

// checkCapacity refuses members the store cannot heartbeat with per-pair
// leadership (nil with no probe).
func checkCapacity(p *StoreProbe, members []MemberConfig) error {
	if p == nil {
		return nil
	}
	// Against the concurrent rate: the sequential one is one round trip
	// per write, and on a loaded machine (2 ms a write) it refused 300
	// per-pair members that the same store heartbeat without a failure.
	need := heartbeatWrites(members)
	if need > capacityShare*p.Burst {
		return &CapacityError{Members: len(members), Need: need, Sustained: p.Burst, Latency: p.Latency}
	}
	return nil
}
