package procedure

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkExecStarts runs 2,000 steps of `true` asked for at once, as a
// node's takeover of 2,000 pairs asks for their promotes, with every start
// at once (unbounded, the driver before StartLimit) and with
// DefaultStarts. Beside them a goroutine of the same process sleeps 10ms
// again and again: timer_late_max_ms is its worst lateness, what the
// starts cost everything else the process does (a node's members and its
// liveness writer). starts/s is the throughput.
//
//	go test -tags libvirt_dlopen -run '^$' -bench BenchmarkExecStarts -benchtime 3x ./actors/procedure/
func BenchmarkExecStarts(b *testing.B) {
	const steps = 2000
	for _, c := range []struct {
		name   string
		starts *StartLimit
	}{{"unbounded", nil}, {"default", NewStartLimit(DefaultStarts())}} {
		b.Run(c.name, func(b *testing.B) {
			d := ExecDriver{Starts: c.starts}
			var worst time.Duration
			var total time.Duration
			for b.Loop() {
				var stop atomic.Bool
				late := make(chan time.Duration)
				go func() {
					var m time.Duration
					for !stop.Load() {
						t := time.Now()
						time.Sleep(10 * time.Millisecond)
						m = max(m, time.Since(t)-10*time.Millisecond)
					}
					late <- m
				}()
				start := time.Now()
				var wg sync.WaitGroup
				var failed atomic.Int32
				for range steps {
					wg.Go(func() {
						if o := d.Run(context.Background(), execStep("true")); o.Result != ResultOK {
							failed.Add(1)
						}
					})
				}
				wg.Wait()
				total += time.Since(start)
				stop.Store(true)
				worst = max(worst, <-late)
				if n := failed.Load(); n > 0 {
					b.Fatalf("%d of %d steps failed", n, steps)
				}
			}
			b.ReportMetric(float64(steps*b.N)/total.Seconds(), "starts/s")
			b.ReportMetric(float64(worst.Microseconds())/1000, "timer_late_max_ms")
		})
	}
}
