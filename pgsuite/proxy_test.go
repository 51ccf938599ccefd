package pgsuite

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// throttle is a TCP proxy to a PostgreSQL server that, once limited, lets
// through at most rate bytes a second in each direction of each
// connection: a slow link to the replica.
type throttle struct {
	ln      net.Listener
	target  string
	rate    int64 // bytes per second once limited
	limited atomic.Bool
	mu      sync.Mutex
	conns   []net.Conn
	wg      sync.WaitGroup
}

func newThrottle(t *testing.T, target string, rate int64) *throttle {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &throttle{ln: ln, target: target, rate: rate}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *throttle) addr() string { return p.ln.Addr().String() }

func (p *throttle) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.DialTimeout("tcp", p.target, 2*time.Second)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, in, out)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(out, in)
		go p.pipe(in, out)
	}
}

// pipe copies src to dst, paced once limited; either side's end closes
// both.
func (p *throttle) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 4096)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if p.limited.Load() {
				time.Sleep(time.Duration(int64(n) * int64(time.Second) / p.rate))
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // io.EOF or a closed connection
		}
	}
}

func (p *throttle) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
