package attach

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// Bounds on the connections accepted and not authenticated yet (TLS, Hello): in all, and
// from one source (an IPv4 address, an IPv6 /64).
const (
	maxPending          = 64
	maxPendingPerSource = 16
)

// firstBytesTimeout is how long an accepted connection may stay silent before its first
// TLS bytes; the rest of the handshake has ServerOptions.HandshakeTimeout. A client
// sends its ClientHello as soon as it connected.
var firstBytesTimeout = 3 * time.Second

// pendingConns are the connections accepted and not authenticated yet. One more than a
// bound allows does not lock newcomers out, as refusing it would (a few idle
// connections would keep every operator out until their handshakes timed out): it
// evicts the oldest pending connection of its own source when that source is at its
// bound, else the oldest of the source with the most pending connections. A flood from
// some sources then evicts its own connections, not those of the others.
type pendingConns struct {
	mu    sync.Mutex
	conns []*pendingConn // oldest first
}

type pendingConn struct {
	c   net.Conn
	src netip.Prefix
}

// source is the bucket of the per-source bound a connection's peer counts in.
func source(a net.Addr) netip.Prefix {
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Prefix{} // not an IP peer: they all share one bucket
	}
	ip := ap.Addr().Unmap()
	if ip.Is4() {
		return netip.PrefixFrom(ip, 32)
	}
	p, _ := ip.WithZone("").Prefix(64)
	return p
}

// add records c as pending and returns the connection it evicted, closed (nil: none).
func (p *pendingConns) add(c net.Conn) (*pendingConn, net.Conn) {
	pc := &pendingConn{c: c, src: source(c.RemoteAddr())}
	p.mu.Lock()
	defer p.mu.Unlock()
	var evict *pendingConn
	counts := map[netip.Prefix]int{}
	for _, o := range p.conns {
		counts[o.src]++
	}
	switch {
	case counts[pc.src] >= maxPendingPerSource:
		evict = p.oldest(pc.src)
	case len(p.conns) >= maxPending:
		most := 0
		for _, o := range p.conns {
			if counts[o.src] > most {
				most, evict = counts[o.src], o
			}
		}
	}
	if evict != nil {
		p.drop(evict)
		evict.c.Close()
	}
	p.conns = append(p.conns, pc)
	if evict == nil {
		return pc, nil
	}
	return pc, evict.c
}

// oldest is the oldest pending connection from src (mu held).
func (p *pendingConns) oldest(src netip.Prefix) *pendingConn {
	for _, o := range p.conns {
		if o.src == src {
			return o
		}
	}
	return nil
}

// drop forgets pc (mu held).
func (p *pendingConns) drop(pc *pendingConn) {
	for i, o := range p.conns {
		if o == pc {
			p.conns = append(p.conns[:i], p.conns[i+1:]...)
			return
		}
	}
}

// done forgets pc, authenticated or ended; it may be called more than once.
func (p *pendingConns) done(pc *pendingConn) {
	p.mu.Lock()
	p.drop(pc)
	p.mu.Unlock()
}

// firstBytes is an accepted connection whose reads have the short firstBytesTimeout
// until its first bytes arrived, then the deadline given (the handshake's). Only the TLS
// handshake reads it before that, from one goroutine.
type firstBytes struct {
	net.Conn
	arrived bool
	then    time.Time
}

func (c *firstBytes) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && !c.arrived {
		c.arrived = true
		c.Conn.SetReadDeadline(c.then)
	}
	return n, err
}
