package runtime

import (
	"net"
	"sync"
)

// FaultProxy forwards TCP connections to a target address and can stall
// them: while blocked, bytes are held in both directions but sockets stay
// open, as in a real network partition (TCP retransmits until it heals);
// when unblocked, what was held is delivered late. understudy demo and the
// failover benchmarks put each simulated site behind one.
type FaultProxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	cond    *sync.Cond
	blocked bool
	held    bool // client to target only (SetUpstreamHeld)
	closed  bool
	conns   []net.Conn
	pairs   []*proxied // the connections open (HoldOpen)
	wg      sync.WaitGroup
}

// proxied is one forwarded connection.
type proxied struct {
	held bool // both directions (HoldOpen)
}

// NewFaultProxy listens on a free loopback port and forwards to target.
func NewFaultProxy(target string) (*FaultProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &FaultProxy{ln: ln, target: target}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// URL is the nats:// URL clients dial instead of the target.
func (p *FaultProxy) URL() string { return "nats://" + p.ln.Addr().String() }

// SetBlocked stalls (true) or resumes (false) all traffic.
func (p *FaultProxy) SetBlocked(b bool) {
	p.mu.Lock()
	p.blocked = b
	p.mu.Unlock()
	p.cond.Broadcast()
}

// SetUpstreamHeld stalls (true) or resumes (false) what clients send to
// the target only; what the target sends still flows: a server that
// reads a client's requests late (busy with the ones before) but still
// delivers to it.
func (p *FaultProxy) SetUpstreamHeld(h bool) {
	p.mu.Lock()
	p.held = h
	p.mu.Unlock()
	p.cond.Broadcast()
}

// HoldOpen stalls (true) both directions of the connections open now,
// and only those: connections made later flow. false resumes every
// connection held so. A server busy with one connection's requests (its
// disk syncs, in that connection's read loop) answers nothing on it, but
// answers a new one at once.
func (p *FaultProxy) HoldOpen(h bool) {
	p.mu.Lock()
	for _, c := range p.pairs {
		c.held = h
	}
	p.mu.Unlock()
	p.cond.Broadcast()
}

// Close stops accepting, closes every proxied connection and waits.
func (p *FaultProxy) Close() {
	p.mu.Lock()
	p.closed = true
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	p.cond.Broadcast()
	_ = p.ln.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	p.wg.Wait()
}

func (p *FaultProxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = in.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = in.Close()
			_ = out.Close()
			return
		}
		p.conns = append(p.conns, in, out)
		c := &proxied{}
		p.pairs = append(p.pairs, c)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, out, in, true)
		go p.pipe(c, in, out, false)
	}
}

// pipe copies src to dst, holding each chunk while the proxy is blocked
// (or, upstream, while it holds what clients send, or c is held).
func (p *FaultProxy) pipe(c *proxied, dst, src net.Conn, upstream bool) {
	defer p.wg.Done()
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for (p.blocked || upstream && p.held || c.held) && !p.closed {
				p.cond.Wait()
			}
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
