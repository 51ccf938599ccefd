package simulations

import (
	"math/rand/v2"
	"testing"
	"time"
)

// The queue pops by (time, sequence): equal times keep insertion order.
func TestQueueOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var q queue
	for i := 0; i < 5000; i++ {
		q.push(item{at: time.Duration(r.IntN(50)), seq: uint64(i)})
	}
	prev := item{at: -1}
	for q.len() > 0 {
		it := q.pop()
		if it.at < prev.at || (it.at == prev.at && it.seq < prev.seq) {
			t.Fatalf("popped (%v, %d) after (%v, %d)", it.at, it.seq, prev.at, prev.seq)
		}
		prev = it
	}
}

// virtual is the inverse of local: the earliest virtual time at which the
// node's clock reads at least l, with drift and after jumps.
func TestNodeClock(t *testing.T) {
	for _, ppm := range []int64{-100, -1, 0, 1, 37, 100} {
		c := nodeClock{base: 5 * time.Hour, ppm: ppm}
		c.jump(10*time.Second, 3*time.Second)
		for _, l := range []time.Duration{5*time.Hour + 13*time.Second, 5*time.Hour + time.Hour, 5*time.Hour + 13*time.Second + 1} {
			v := c.virtual(l)
			if c.local(v) < l || (v > c.t0 && c.local(v-1) >= l) {
				t.Fatalf("ppm %d: virtual(%v) = %v reads %v", ppm, l, v, c.local(v))
			}
		}
		if got := c.local(10 * time.Second); got != 5*time.Hour+3*time.Second+10*time.Second+time.Duration(int64(10*time.Second)*ppm/1_000_000) {
			t.Errorf("ppm %d: after the jump the clock reads %v", ppm, got)
		}
	}
}
