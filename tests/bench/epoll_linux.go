package main

import (
	"bytes"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/rawsys"
)

func init() { children["epoll-relay"] = epollRelay }

const (
	epollMaxFlows = 65536
	epollBatch    = 256
	epollFdsFlow  = 6 // two sockets and two pipes per flow
	epollPipe     = 1 << 20
	epollET       = unix.EPOLLIN | unix.EPOLLOUT | unix.EPOLLRDHUP | unix.EPOLLET
)

type epState uint8

const (
	stConnect epState = iota // the outgoing connect is in progress
	stGreet                  // SOCKS5 greeting sent: reading the method reply (2 bytes)
	stRequest                // SOCKS5 CONNECT sent: reading its reply (10 bytes, IPv4)
	stHTTP                   // HTTP CONNECT sent: reading the answer up to its blank line
	stRelay                  // both directions spliced
)

// half is one direction of a flow: bytes spliced from its source into the pipe and not
// yet out to its destination.
type half struct {
	p    [2]int // the pipe: read end, write end (-1: none yet)
	n    int    // bytes in the pipe
	eof  bool   // the source ended
	done bool   // and all of it went on, followed by a half-close
}

type eflow struct {
	c, u  int // client and outgoing sockets
	state epState
	dst   netip.AddrPort
	hs    []byte // the upstream's handshake answer read so far
	want  int    // its length (stGreet, stRequest)
	h     [2]half
	dead  bool
}

// epollLoop is the whole relay: one thread, one epoll set, the flows by socket fd.
type epollLoop struct {
	ep, ln  int
	self    netip.AddrPort // the listener: a flow to it was not redirected
	proto   string         // "", "socks5" or "http"
	via     netip.AddrPort
	flows   []*eflow
	live    int
	max     int
	pipes   [][2]int // empty pipes kept for the next flows
	closing []int    // sockets to close after this batch of events
}

// epollRelay is bareRelay (bare.go) without Go's scheduler on the connection path: one
// goroutine locked to its thread with GOMAXPROCS 1, sockets made with x/sys (the
// netpoller never sees them), edge-triggered epoll, and every system call through
// RawSyscall (no entersyscall, so sysmon never hands the P to another thread while
// the loop sleeps in epoll_wait). Per connection: accept4, SO_ORIGINAL_DST, a socket
// with the capture's mark, a non-blocking connect, the SOCKS5 (one round trip per
// message) or HTTP CONNECT handshake when there is an upstream, then splice both ways
// through a pipe each, passing an EOF on as a half-close.
func epollRelay(args []string) error {
	runtime.GOMAXPROCS(1)
	runtime.LockOSThread()
	l := &epollLoop{max: epollMaxFlows, self: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), api.DefaultRedirectPort)}
	if len(args) > 0 {
		scheme, hp, _ := strings.Cut(args[0], "://")
		var err error
		if l.via, err = netip.ParseAddrPort(hp); err != nil || !l.via.Addr().Is4() {
			return fmt.Errorf("epoll relay: upstream %q: want an IPv4 address and port", args[0])
		}
		if scheme != "socks5" && scheme != "http" {
			return fmt.Errorf("epoll relay: upstream %q: want socks5:// or http://", args[0])
		}
		l.proto = scheme
	}
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) == nil && rl.Cur < uint64(epollMaxFlows*epollFdsFlow) {
		l.max = max(1, int(rl.Cur-64)/epollFdsFlow)
	}
	var err error
	if l.ln, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0); err != nil {
		return fmt.Errorf("epoll relay: socket: %w", err)
	}
	_ = unix.SetsockoptInt(l.ln, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(l.ln, &unix.SockaddrInet4{Port: int(api.DefaultRedirectPort), Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return fmt.Errorf("epoll relay: bind: %w", err)
	}
	if err := unix.Listen(l.ln, 4096); err != nil {
		return fmt.Errorf("epoll relay: listen: %w", err)
	}
	if l.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return fmt.Errorf("epoll relay: %w", err)
	}
	// The listener level-triggered: accept drains it anyway.
	if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, l.ln, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(l.ln)}); err != nil {
		return fmt.Errorf("epoll relay: %w", err)
	}
	events := make([]unix.EpollEvent, epollBatch)
	for {
		n, err := epollWait(l.ep, events)
		if err != nil {
			return fmt.Errorf("epoll relay: epoll_wait: %w", err)
		}
		for _, ev := range events[:n] {
			if fd := int(ev.Fd); fd == l.ln {
				l.accept()
			} else if f := l.flows[fd]; f != nil && !f.dead {
				l.step(f, fd, ev.Events)
			}
		}
		// Sockets close only now, so no fd number of this batch's events is reused by
		// an accept in the same batch.
		for _, fd := range l.closing {
			l.flows[fd] = nil
			_ = rawsys.Close(fd)
		}
		l.closing = l.closing[:0]
	}
}

// epollWait waits for events with no timeout. EINTR (a preemption signal) returns no
// events: the caller's next call passes a function prologue, where the runtime can
// preempt this goroutine (a retry loop in here could starve a stop-the-world).
//
//go:noinline
func epollWait(ep int, events []unix.EpollEvent) (int, error) {
	// epoll_pwait with no signal mask is epoll_wait, and exists on every architecture.
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), ^uintptr(0), 0, 0)
	switch e {
	case 0:
		return int(n), nil
	case unix.EINTR:
		return 0, nil
	}
	return 0, e
}

// rawWriteAll writes a handshake message or the few bytes after one: small, on a fresh
// socket, so a short write is an error rather than something to wait for.
func rawWriteAll(fd int, b []byte) error {
	n, err := rawsys.Write(fd, b)
	if err == nil && n != len(b) {
		err = fmt.Errorf("short write: %d of %d bytes", n, len(b))
	}
	return err
}

func (l *epollLoop) track(fd int, f *eflow) error {
	for fd >= len(l.flows) {
		l.flows = append(l.flows, make([]*eflow, len(l.flows)+1024)...)
	}
	l.flows[fd] = f
	return unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: epollET, Fd: int32(fd)})
}

// accept takes every waiting connection and starts its outgoing connect.
func (l *epollLoop) accept() {
	for {
		var peer rawsys.Sockaddr
		c, err := rawsys.Accept4(l.ln, &peer)
		if err != nil {
			return // EAGAIN, or out of fds: the level-triggered listener asks again
		}
		if l.live >= l.max {
			_ = rawsys.Close(c)
			continue
		}
		f := &eflow{c: c, u: -1, h: [2]half{{p: [2]int{-1, -1}}, {p: [2]int{-1, -1}}}}
		l.live++
		if l.track(c, f) != nil {
			l.close(f)
			continue
		}
		// SO_ORIGINAL_DST copies a struct sockaddr_in. A connection to the port itself
		// (waitTCP's probe) was not redirected: its destination is the listener.
		if f.dst, err = netns.OriginalDstFD(c, true); err != nil || f.dst == l.self {
			l.close(f)
			continue
		}
		to := f.dst
		if l.proto != "" {
			to = l.via
		}
		sa, family := rawsys.SockaddrOf(to)
		if f.u, err = rawsys.Socket(family); err != nil {
			f.u = -1
			l.close(f)
			continue
		}
		if rawsys.SetsockoptInt(f.u, unix.SOL_SOCKET, unix.SO_MARK, int32(api.DefaultMark)) != nil {
			l.close(f)
			continue
		}
		if err := rawsys.Connect(f.u, &sa); err != nil && err != unix.EINPROGRESS {
			l.close(f)
			continue
		}
		// The connect's end comes as EPOLLOUT on f.u (at once if it is already done).
		if l.track(f.u, f) != nil {
			l.close(f)
		}
	}
}

// step moves flow f on after events ev on its socket fd.
func (l *epollLoop) step(f *eflow, fd int, ev uint32) {
	if f.state == stConnect {
		if fd != f.u || ev&(unix.EPOLLOUT|unix.EPOLLERR|unix.EPOLLHUP) == 0 {
			return // the client's socket: its bytes wait there until the relaying starts
		}
		if soerr, err := rawsys.GetsockoptInt(f.u, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || soerr != 0 {
			l.close(f)
			return
		}
		switch l.proto {
		case "socks5":
			// No authentication, one round trip per message, as redsocks and socks5Connect.
			f.state, f.want, f.hs = stGreet, 2, make([]byte, 0, 10)
			l.send(f, []byte{5, 1, 0})
		case "http":
			f.state, f.hs = stHTTP, make([]byte, 0, 512)
			l.send(f, fmt.Appendf(nil, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", f.dst, f.dst))
		default:
			l.relay(f)
		}
		return
	}
	if f.state == stRelay {
		l.pump(f)
		return
	}
	if fd != f.u {
		return
	}
	// A handshake answer: read what is missing of it (no more, so nothing of the
	// tunnel's own bytes is taken, except after an HTTP head: see below).
	for !f.dead && f.state != stRelay {
		var buf [512]byte
		room := buf[:cap(f.hs)-len(f.hs)]
		if f.state != stHTTP {
			room = buf[:f.want-len(f.hs)]
		} else if len(room) == 0 {
			l.close(f) // an HTTP answer head longer than the buffer
			return
		}
		n, err := rawsys.Read(f.u, room)
		if err == unix.EAGAIN {
			return
		}
		if err != nil || n == 0 {
			l.close(f)
			return
		}
		f.hs = append(f.hs, room[:n]...)
		switch f.state {
		case stGreet:
			if len(f.hs) < f.want {
				continue
			}
			if f.hs[0] != 5 || f.hs[1] != 0 {
				l.close(f)
				return
			}
			a := f.dst.Addr().As4()
			f.state, f.want, f.hs = stRequest, 10, f.hs[:0]
			l.send(f, []byte{5, 1, 0, 1, a[0], a[1], a[2], a[3], byte(f.dst.Port() >> 8), byte(f.dst.Port())})
		case stRequest:
			if len(f.hs) < f.want {
				continue
			}
			if f.hs[1] != 0 {
				l.close(f)
				return
			}
			l.relay(f)
		case stHTTP:
			i := bytes.Index(f.hs, []byte("\r\n\r\n"))
			if i < 0 {
				continue
			}
			if !bytes.HasPrefix(f.hs, []byte("HTTP/1.1 200")) && !bytes.HasPrefix(f.hs, []byte("HTTP/1.0 200")) {
				l.close(f)
				return
			}
			// Bytes after the head are the tunnel's: they go to the client first.
			if rest := f.hs[i+4:]; len(rest) > 0 && rawWriteAll(f.c, rest) != nil {
				l.close(f)
				return
			}
			l.relay(f)
		}
	}
}

// send writes a handshake message to the upstream, ending the flow if it cannot.
func (l *epollLoop) send(f *eflow, msg []byte) {
	if rawWriteAll(f.u, msg) != nil {
		l.close(f)
	}
}

// relay starts splicing: a pipe each way, then whatever both sockets already hold
// (edge-triggered: their earlier events were not acted on).
func (l *epollLoop) relay(f *eflow) {
	f.state, f.hs = stRelay, nil
	for i := range f.h {
		if k := len(l.pipes); k > 0 {
			f.h[i].p, l.pipes = l.pipes[k-1], l.pipes[:k-1]
			continue
		}
		// A 1 MiB pipe, as Go's splice uses: a stream takes 16 times fewer splices than
		// through the default 64 KiB. (Its pages are only taken while it holds data.)
		p, err := rawsys.Pipe(epollPipe)
		if err != nil {
			l.close(f)
			return
		}
		f.h[i].p = p
	}
	l.pump(f)
}

// pump moves both directions on until each would block, and ends the flow when both
// are done or one fails.
func (l *epollLoop) pump(f *eflow) {
	if l.move(&f.h[0], f.c, f.u) != nil || l.move(&f.h[1], f.u, f.c) != nil {
		l.close(f)
		return
	}
	if f.h[0].done && f.h[1].done {
		l.close(f)
	}
}

// move splices src → pipe → dst until one of them would block. The pipe is only filled
// when empty, so an EAGAIN reading src means src has nothing, never that the pipe is full.
func (l *epollLoop) move(h *half, src, dst int) error {
	for !h.done {
		if h.n > 0 {
			n, err := rawsys.Splice(h.p[0], dst, h.n)
			if err == unix.EAGAIN {
				return nil
			}
			if err != nil {
				return err
			}
			h.n -= n
			continue
		}
		if h.eof {
			h.done = true
			return rawsys.Shutdown(dst)
		}
		n, err := rawsys.Splice(src, h.p[1], epollPipe)
		if err == unix.EAGAIN {
			return nil
		}
		if err != nil {
			return err
		}
		h.n += n
		h.eof = n == 0
	}
	return nil
}

// close ends a flow: its sockets at the end of the batch, its pipes back to the pool if
// empty.
func (l *epollLoop) close(f *eflow) {
	f.dead = true
	l.live--
	for _, fd := range []int{f.c, f.u} {
		if fd >= 0 {
			if fd < len(l.flows) && l.flows[fd] == f {
				l.closing = append(l.closing, fd)
			} else {
				_ = rawsys.Close(fd) // never tracked
			}
		}
	}
	for i := range f.h {
		h := &f.h[i]
		if h.p[0] < 0 {
			continue
		}
		if h.n == 0 && len(l.pipes) < 1024 {
			l.pipes = append(l.pipes, h.p)
		} else {
			_ = rawsys.Close(h.p[0])
			_ = rawsys.Close(h.p[1])
		}
	}
}
