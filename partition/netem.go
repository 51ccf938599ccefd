package partition

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/florianl/go-nfqueue/v2"
	"github.com/mdlayher/netlink"
)

// Impairment is delay and loss on a site's link, in both directions.
type Impairment struct {
	How string // "netem" or "nfqueue"

	remove func(context.Context) error
	stats  func() string
}

// Remove lifts the impairment; packets already held are still delivered.
func (im *Impairment) Remove(ctx context.Context) error { return im.remove(ctx) }

// Stats says what the impairment did (nfqueue only).
func (im *Impairment) Stats() string {
	if im.stats == nil {
		return ""
	}
	return im.stats()
}

// HasNetem reports whether the kernel has sch_netem, by adding a netem
// qdisc to the loopback of a namespace (which must exist and be disposable).
func HasNetem(ctx context.Context, ns string) (bool, string) {
	out, err := run(ctx, "ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms")
	if err != nil {
		return false, out
	}
	_, _ = run(ctx, "ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "lo", "root")
	return true, ""
}

// queueNum is the netfilter queue the impairment uses; queues are per
// network namespace, so every site can use the same number.
const queueNum = 31

// Impair delays every packet that crosses a site's link (either way) by
// delay and drops a fraction loss of them. With netem it is a netem qdisc on
// both ends of the site's veth; without, iptables NFQUEUE rules in the site
// namespace send the packets to a queue this process reads, holding each
// verdict for delay (or dropping).
func (l *Lab) Impair(ctx context.Context, site string, delay time.Duration, loss float64, netem bool, seed uint64) (*Impairment, error) {
	s := l.Sites[site]
	if netem {
		args := []string{"delay", fmt.Sprintf("%dms", delay.Milliseconds()), "loss", strconv.FormatFloat(loss*100, 'f', -1, 64) + "%"}
		ends := [][2]string{{s.NS, "eth0"}, {l.Hub, s.HubIf}}
		for _, e := range ends {
			if _, err := run(ctx, "ip", append([]string{"netns", "exec", e[0], "tc", "qdisc", "add", "dev", e[1], "root", "netem"}, args...)...); err != nil {
				return nil, err
			}
		}
		return &Impairment{How: "netem", remove: func(ctx context.Context) error {
			var errs []error
			for _, e := range ends {
				_, err := run(ctx, "ip", "netns", "exec", e[0], "tc", "qdisc", "del", "dev", e[1], "root")
				errs = append(errs, err)
			}
			return errors.Join(errs...)
		}}, nil
	}
	q, err := OpenQueue(s.NS, queueNum, delay, loss, seed)
	if err != nil {
		return nil, err
	}
	rules := [][]string{
		{"INPUT", "-i", "eth0", "-j", "NFQUEUE", "--queue-num", strconv.Itoa(queueNum)},
		{"OUTPUT", "-o", "eth0", "-j", "NFQUEUE", "--queue-num", strconv.Itoa(queueNum)},
	}
	for _, r := range rules {
		if err := l.IPTables(ctx, site, append([]string{"-I"}, r...)...); err != nil {
			q.Close()
			return nil, err
		}
	}
	return &Impairment{How: "nfqueue", stats: q.Stats, remove: func(ctx context.Context) error {
		var errs []error
		for _, r := range rules {
			errs = append(errs, l.IPTables(ctx, site, append([]string{"-D"}, r...)...))
		}
		q.Close() // after the rules are gone: the held packets are released first
		return errors.Join(errs...)
	}}, nil
}

// Queue reads a netfilter queue inside a namespace and issues each packet's
// verdict after a delay, dropping a fraction at random: a user-space netem
// for kernels without sch_netem.
type Queue struct {
	nf     *nfqueue.Nfqueue
	cancel context.CancelFunc
	mu     sync.Mutex // serialises verdicts on the netlink socket

	holdMu  sync.Mutex // orders held.Add before Close's held.Wait
	closing bool
	held    sync.WaitGroup

	seen, dropped, verdictErrs atomic.Int64
}

// OpenQueue starts reading queue num in namespace ns.
func OpenQueue(ns string, num uint16, delay time.Duration, loss float64, seed uint64) (*Queue, error) {
	f, err := os.Open("/var/run/netns/" + ns)
	if err != nil {
		return nil, err
	}
	defer f.Close() // the netlink socket keeps its namespace
	nf, err := nfqueue.Open(&nfqueue.Config{
		NfQueue:      num,
		MaxPacketLen: 0xffff,
		MaxQueueLen:  8192, // 400 ms of a cluster's chatter fits easily
		Copymode:     nfqueue.NfQnlCopyMeta,
		WriteTimeout: time.Second,
		NetNS:        int(f.Fd()),
	})
	if err != nil {
		return nil, fmt.Errorf("nfqueue %d in %s: %w", num, ns, err)
	}
	_ = nf.SetOption(netlink.NoENOBUFS, true)
	ctx, cancel := context.WithCancel(context.Background())
	q := &Queue{nf: nf, cancel: cancel}
	rng := rand.New(rand.NewPCG(seed, uint64(num))) // used by the one read goroutine only
	hook := func(a nfqueue.Attribute) int {
		if a.PacketID == nil {
			return 0
		}
		id := *a.PacketID
		q.seen.Add(1)
		if rng.Float64() < loss {
			q.dropped.Add(1)
			q.verdict(id, nfqueue.NfDrop)
			return 0
		}
		q.holdMu.Lock()
		if q.closing {
			q.holdMu.Unlock()
			q.verdict(id, nfqueue.NfAccept)
			return 0
		}
		q.held.Add(1)
		q.holdMu.Unlock()
		time.AfterFunc(delay, func() {
			defer q.held.Done()
			q.verdict(id, nfqueue.NfAccept)
		})
		return 0
	}
	errfn := func(error) int {
		if ctx.Err() != nil {
			return 1
		}
		return 0 // ENOBUFS and the like: keep reading
	}
	if err := nf.RegisterWithErrorFunc(ctx, hook, errfn); err != nil {
		cancel()
		nf.Close()
		return nil, fmt.Errorf("nfqueue %d in %s: %w", num, ns, err)
	}
	return q, nil
}

func (q *Queue) verdict(id uint32, v int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := q.nf.SetVerdict(id, v); err != nil {
		q.verdictErrs.Add(1)
	}
}

// Close waits for the held packets' verdicts, then stops reading.
func (q *Queue) Close() {
	q.holdMu.Lock()
	q.closing = true
	q.holdMu.Unlock()
	q.held.Wait()
	q.cancel()
	q.nf.Close()
}

// Stats summarises what the queue did.
func (q *Queue) Stats() string {
	return fmt.Sprintf("%d packets queued, %d dropped, %d verdict errors", q.seen.Load(), q.dropped.Load(), q.verdictErrs.Load())
}
