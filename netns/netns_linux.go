package netns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// threadNetns names the calling thread's own netns (not the thread group leader's, which
// /proc/self/ns/net would be).
const threadNetns = "/proc/thread-self/ns/net"

// isCurrent reports whether nsPath means "the netns the process already runs in", where no
// setns is needed.
func isCurrent(nsPath string) bool {
	return nsPath == "" || nsPath == "/proc/self/ns/net"
}

// Do runs fn on a locked OS thread inside the network namespace at nsPath (a bind-mounted
// netns file or /proc/PID/ns/net) and returns its error. The thread is switched back to the
// namespace it started in before it is released; if that fails the thread stays locked so
// the Go runtime discards it instead of reusing a thread in the wrong namespace (see the
// CNI pkg/ns README). fn runs on a goroutine of its own: goroutines it starts do NOT run in
// the target netns. A panic in fn is turned into an error. nsPath "" or
// "/proc/self/ns/net" runs fn in the current netns.
func Do(nsPath string, fn func() error) error {
	if isCurrent(nsPath) {
		return callHere(nsPath, fn)
	}
	target, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", nsPath, err)
	}
	defer unix.Close(target)
	return doFD(nsPath, target, fn)
}

// callHere runs fn in the current netns, turning a panic into an error as doLocked does.
func callHere(nsPath string, fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic in %s: %v", where(nsPath), r)
		}
	}()
	return fn()
}

// doFD is Do with the target netns already open.
func doFD(nsPath string, target int, fn func() error) error {
	orig, err := selfNetns()
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		errc <- doLocked(nsPath, target, orig, fn)
	}()
	return <-errc
}

// self is the netns every thread the Go runtime hands out runs in (the process's own: a
// thread that could not return from a netns dies with its locked goroutine), opened once
// and kept for the life of the process.
var self struct {
	once sync.Once
	fd   int
	err  error
}

// selfNetns returns the descriptor of the process's netns, opening it on first use from a
// fresh goroutine, so a caller locked into another netns cannot skew it.
func selfNetns() (int, error) {
	self.once.Do(func() {
		done := make(chan struct{})
		go func() {
			defer close(done)
			self.fd, self.err = unix.Open(threadNetns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if self.err != nil {
				self.err = fmt.Errorf("open current netns: %w", self.err)
			}
		}()
		<-done
	})
	return self.fd, self.err
}

// doLocked runs on its own goroutine; when it returns without unlocking, the goroutine ends
// with the thread locked and the runtime terminates that thread.
func doLocked(nsPath string, target, orig int, fn func() error) (err error) {
	runtime.LockOSThread()
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter netns %s: %w", nsPath, err)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic in netns %s: %v", nsPath, r)
		}
		if serr := unix.Setns(orig, unix.CLONE_NEWNET); serr != nil {
			// Leave the thread locked: it dies with this goroutine.
			err = errors.Join(err, fmt.Errorf("return from netns %s: %w", nsPath, serr))
			return
		}
		runtime.UnlockOSThread()
	}()
	return fn()
}

// Handle is an open network namespace: the relay keeps one per workload for the
// workload's lifetime, so a dial or listen in it needs no path lookup. It holds one file
// descriptor until Close. Its methods are safe for concurrent use; after Close they fail.
type Handle struct {
	path string
	mu   sync.RWMutex // read-held while fd is in use, so Close cannot recycle it under a setns
	fd   int          // -1: the current netns (path "" or /proc/self/ns/net), or closed
	shut bool
}

// Open opens the netns at nsPath ("" or "/proc/self/ns/net": the current one, which holds
// no descriptor).
func Open(nsPath string) (*Handle, error) {
	h := &Handle{path: nsPath, fd: -1}
	if isCurrent(nsPath) {
		return h, nil
	}
	fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", nsPath, err)
	}
	h.fd = fd
	return h, nil
}

// Name names the netns in errors and logs: its path, or "the current netns".
func (h *Handle) Name() string { return where(h.path) }

// Path is the path the handle was opened with.
func (h *Handle) Path() string { return h.path }

// Close releases the descriptor; it waits for calls in progress that use it.
func (h *Handle) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.shut {
		return nil
	}
	h.shut = true
	if h.fd < 0 {
		return nil
	}
	err := unix.Close(h.fd)
	h.fd = -1
	if err != nil {
		return fmt.Errorf("close netns %s: %w", h.path, err)
	}
	return nil
}

var errHandleClosed = errors.New("netns handle is closed")

// Do is the package's Do in the handle's netns.
func (h *Handle) Do(fn func() error) error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.shut {
		return fmt.Errorf("netns %s: %w", h.path, errHandleClosed)
	}
	if h.fd < 0 {
		return callHere(h.path, fn)
	}
	return doFD(h.path, h.fd, fn)
}

// ListenFD opens a non-blocking TCP listening socket on ap inside the handle's netns and
// returns its descriptor, which the caller owns and polls itself (the runtime's netpoller
// never sees it). An unspecified IPv6 address listens dual-stack (IPv4 peers as
// v4-mapped addresses).
func (h *Handle) ListenFD(ap netip.AddrPort) (int, error) {
	fd := -1
	err := h.Do(func() error {
		domain := unix.AF_INET6
		var sa unix.Sockaddr = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
		if ap.Addr().Is4() {
			domain = unix.AF_INET
			sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
		}
		s, err := newSocket(domain)
		if err != nil {
			return fmt.Errorf("socket: %w", err)
		}
		if err := listenSocket(s, domain, sa); err != nil {
			unix.Close(s)
			return err
		}
		fd = s
		return nil
	})
	if err != nil {
		return -1, fmt.Errorf("listen %s in %s: %w", ap, where(h.path), err)
	}
	return fd, nil
}

func listenSocket(fd, domain int, sa unix.Sockaddr) error {
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return fmt.Errorf("set SO_REUSEADDR: %w", err)
	}
	if domain == unix.AF_INET6 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
			return fmt.Errorf("set IPV6_V6ONLY: %w", err)
		}
	}
	if err := unix.Bind(fd, sa); err != nil {
		return fmt.Errorf("bind: %w", err)
	}
	// The kernel caps the backlog at net.core.somaxconn.
	if err := unix.Listen(fd, 4096); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	return nil
}

// EnterLocked moves the calling thread into the handle's netns and leaves it there. It is
// only for a goroutine that locked its thread for good (runtime.LockOSThread, never
// undone): the runtime ends such a thread with its goroutine, so no other goroutine runs
// in the netns. kl-relayd's event loops make their sockets this way, moving only when
// the next socket is for another netns.
func (h *Handle) EnterLocked() error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.shut {
		return fmt.Errorf("netns %s: %w", h.path, errHandleClosed)
	}
	fd := h.fd
	if fd < 0 {
		var err error
		if fd, err = selfNetns(); err != nil {
			return err
		}
	}
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter netns %s: %w", where(h.path), err)
	}
	return nil
}

// Listen is the package's Listen in the handle's netns.
func (h *Handle) Listen(network, addr string) (net.Listener, error) {
	return listen(h.path, h.Do, network, addr)
}

// Dial is the package's Dial from the handle's netns, cheaper: the socket is made by a
// net.Dialer on the calling goroutine's own thread, entered into the netns only until the
// socket exists (the Dialer's Control hook, which runs before connect, sets SO_MARK and
// returns the thread), so no descriptor is duplicated and the connection has no TCP
// keepalive (the relay ends idle flows itself). It must not be called from a goroutine
// that has locked its thread into another netns: the thread is returned to the process's
// netns. If that return fails, the thread stays locked to the calling goroutine and the
// runtime discards it when the goroutine ends.
func (h *Handle) Dial(ctx context.Context, mark uint32, network, addr string) (net.Conn, error) {
	return dial(ctx, h.path, func(ctx context.Context, ap netip.AddrPort) (net.Conn, error) {
		return h.dialAddr(ctx, mark, ap)
	}, network, addr)
}

// DialAddrPort is Dial for an address already known: nothing to parse or resolve.
func (h *Handle) DialAddrPort(ctx context.Context, mark uint32, ap netip.AddrPort) (net.Conn, error) {
	c, err := h.dialAddr(ctx, mark, ap)
	if err != nil {
		return nil, fmt.Errorf("dial in %s: %w", where(h.path), err)
	}
	return c, nil
}

// where names a netns in errors. The errors of the dials never name their destination
// in their own words: they reach audit records and logs (through audit.Reason, which can
// only take addresses out of the net package's errors) and those must not hold it.
// The destination stays in the wrapped *net.OpError, *net.AddrError or *net.DNSError.
func where(nsPath string) string {
	if nsPath == "" {
		return "the current netns"
	}
	return nsPath
}

func (h *Handle) dialAddr(ctx context.Context, mark uint32, ap netip.AddrPort) (net.Conn, error) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.shut {
		return nil, errHandleClosed
	}
	network := "tcp6"
	if ap.Addr().Is4() {
		network = "tcp4"
	}
	in := false // the thread is in the handle's netns
	var leaveErr error
	leave := func() {
		in = false
		orig, _ := selfNetns() // opened before entering
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			leaveErr = fmt.Errorf("return from netns %s: %w", h.path, err)
			return // the thread stays locked and dies with the goroutine
		}
		runtime.UnlockOSThread()
	}
	d := net.Dialer{KeepAlive: -1, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if mark != 0 {
			if err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(mark))
			}); err != nil {
				serr = err
			}
		}
		if in {
			leave()
			if leaveErr != nil {
				return leaveErr
			}
		}
		if serr != nil {
			return fmt.Errorf("set SO_MARK %#x: %w", mark, serr)
		}
		return nil
	}}
	if h.fd >= 0 {
		if _, err := selfNetns(); err != nil {
			return nil, err
		}
		runtime.LockOSThread()
		if err := unix.Setns(h.fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			return nil, fmt.Errorf("enter netns %s: %w", h.path, err)
		}
		in = true
	}
	// DialContext, not DialTCP: DialTCP takes the local address as a value and binds
	// even the zero one, so every dial would bind(2) port 0 before connect. Such a port
	// is the socket's alone, where connect's own choice may be shared with connections
	// to other destinations: bound, the pod could hold no more outgoing connections than
	// its ephemeral range has ports, and each bind searches the range past TIME_WAIT ones.
	c, err := d.DialContext(ctx, network, ap.String())
	if in {
		leave() // no socket was made (Control never ran)
	}
	if leaveErr != nil {
		if c != nil {
			c.Close()
		}
		return nil, errors.Join(err, leaveErr)
	}
	return c, err
}

func newSocket(domain int) (int, error) {
	return unix.Socket(domain, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
}

// Listen opens a TCP listener whose socket is created inside the netns at nsPath; it stays
// bound there after the thread leaves (the in-pod listener model of Istio's ztunnel).
// network is "tcp", "tcp4" or "tcp6".
//
// For the capture redirect, listen on loopback once per family: ("tcp4", "127.0.0.1:P")
// and ("tcp6", "[::1]:P"). Redirect in the output hook always rewrites to 127.0.0.1 or
// ::1, so that is all the relay needs, and other hosts cannot reach the port through the
// pod's address. ("tcp", ":P") also works — one dual-stack [::] socket that accepts IPv4 as
// v4-mapped addresses, which OriginalDst handles — but it is reachable from the network.
func Listen(nsPath, network, addr string) (net.Listener, error) {
	return listen(nsPath, func(fn func() error) error { return Do(nsPath, fn) }, network, addr)
}

// listenConfig leaves accepted connections without TCP keepalive (Go's default turns it
// on with four setsockopt calls per accept): the relay ends idle flows with its own
// timeout. It listens with plain TCP, not MPTCP (Go's default for listeners since 1.24):
// every connection accepted on an MPTCP listener carries an MPTCP socket around its TCP
// subflow, and the copies ask whether it fell back to TCP before they may splice.
var listenConfig = func() *net.ListenConfig {
	lc := &net.ListenConfig{KeepAlive: -1}
	lc.SetMultipathTCP(false)
	return lc
}()

func listen(nsPath string, do func(func() error) error, network, addr string) (net.Listener, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, fmt.Errorf("listen in %s: network %q is not tcp, tcp4 or tcp6", nsPath, network)
	}
	var ln net.Listener
	err := do(func() error {
		var err error
		ln, err = listenConfig.Listen(context.Background(), network, addr)
		return err
	})
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		return nil, fmt.Errorf("listen %s %s in %s: %w", network, addr, nsPath, err)
	}
	return ln, nil
}

// Dial connects to addr from a socket created inside the netns at nsPath ("" or
// "/proc/self/ns/net": the current one) that carries SO_MARK mark before it connects, so
// the capture table lets it through (mark 0: no mark). ctx bounds the whole dial.
//
// Only the socket is made inside the netns (a few microseconds on a locked thread); the
// connect and the wait for it run on ordinary goroutines, so slow destinations never pin
// OS threads. Host names are resolved first with net.DefaultResolver in the caller's
// netns, and the addresses are tried in order; literal addresses need no resolver.
func Dial(ctx context.Context, nsPath string, mark uint32, network, addr string) (net.Conn, error) {
	socket := func(domain int) (int, error) {
		fd := -1
		err := Do(nsPath, func() error {
			var err error
			fd, err = newSocket(domain)
			return err
		})
		return fd, err
	}
	return dial(ctx, nsPath, func(ctx context.Context, ap netip.AddrPort) (net.Conn, error) {
		return dialAddr(ctx, socket, mark, ap)
	}, network, addr)
}

// dial resolves addr and connects to its addresses in turn with dialOne.
func dial(ctx context.Context, nsPath string, dialOne func(context.Context, netip.AddrPort) (net.Conn, error), network, addr string) (net.Conn, error) {
	var family string
	switch network {
	case "tcp":
		family = "ip"
	case "tcp4":
		family = "ip4"
	case "tcp6":
		family = "ip6"
	default:
		return nil, fmt.Errorf("dial in %s: network %q is not tcp, tcp4 or tcp6", where(nsPath), network)
	}
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("dial in %s: %w", where(nsPath), err) // a *net.AddrError
	}
	port, err := net.DefaultResolver.LookupPort(ctx, network, portStr)
	if err != nil {
		return nil, fmt.Errorf("dial in %s: port: %w", where(nsPath), err) // a *net.DNSError
	}
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip.Unmap()}
	} else {
		ips, err = net.DefaultResolver.LookupNetIP(ctx, family, host)
		if err != nil {
			return nil, fmt.Errorf("dial in %s: %w", where(nsPath), err) // a *net.DNSError
		}
	}
	var errs []error
	for _, ip := range ips {
		ip = ip.Unmap()
		if (family == "ip4" && !ip.Is4()) || (family == "ip6" && ip.Is4()) {
			errs = append(errs, &net.AddrError{Err: "not an " + family + " address", Addr: ip.String()})
			continue
		}
		c, err := dialOne(ctx, netip.AddrPortFrom(ip, uint16(port)))
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("dial in %s: %w", where(nsPath), errors.Join(errs...))
}

// dialAddr connects one socket made by socket to ap.
func dialAddr(ctx context.Context, socket func(domain int) (int, error), mark uint32, ap netip.AddrPort) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	domain := unix.AF_INET6
	var sa unix.Sockaddr = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	if ap.Addr().Is4() {
		domain = unix.AF_INET
		sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	fd, err := socket(domain)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	// f owns fd from here; net.FileConn below takes its own duplicate.
	f := os.NewFile(uintptr(fd), "tcp "+ap.String())
	defer f.Close()
	if mark != 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, int(mark)); err != nil {
			return nil, fmt.Errorf("set SO_MARK %#x: %w", mark, err)
		}
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cerr error
	if err := rc.Control(func(fd uintptr) { cerr = unix.Connect(int(fd), sa) }); err != nil {
		return nil, err
	}
	if cerr != nil && !errors.Is(cerr, unix.EINPROGRESS) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(ap), Err: os.NewSyscallError("connect", cerr)}
	}
	if errors.Is(cerr, unix.EINPROGRESS) {
		// ctx ending (deadline or cancel) wakes the wait; ctx.Err() is set by then.
		stop := context.AfterFunc(ctx, func() { f.SetWriteDeadline(aLongTimeAgo) })
		defer stop()
		var soerr error
		werr := rc.Write(func(fd uintptr) bool {
			// Called once at once, then each time the socket turns writable.
			n, err := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
			switch {
			case err != nil:
				soerr = err
				return true
			case n != 0:
				soerr = syscall.Errno(n)
				return true
			}
			if _, err := unix.Getpeername(int(fd)); err != nil {
				return false // not connected yet
			}
			return true
		})
		if werr != nil {
			if ctx.Err() != nil {
				werr = ctx.Err()
			}
			return nil, &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(ap), Err: werr}
		}
		if soerr != nil {
			return nil, &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(ap), Err: os.NewSyscallError("connect", soerr)}
		}
	}
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("adopt socket: %w", err)
	}
	return c, nil
}

// aLongTimeAgo is a deadline in the past: setting it wakes a blocked wait at once.
var aLongTimeAgo = time.Unix(1, 0)

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST from linux/netfilter_ipv6/ip6_tables.h.
const ip6tSOOriginalDst = 80

// OriginalDst returns the destination a redirected connection was sent to before the nat
// table rewrote it: SO_ORIGINAL_DST for IPv4 (also on a dual-stack socket, where the peer
// is a v4-mapped address) and IP6T_SO_ORIGINAL_DST for IPv6. It works on the socket in
// place (no file descriptor is duplicated).
//
// A connection that was not redirected (a client inside the pod dialing 127.0.0.1:P
// itself, which the program exempts) has no NAT: the result is the listener's own address.
// Callers must refuse such flows rather than dial them, or they loop.
func OriginalDst(c *net.TCPConn) (netip.AddrPort, error) {
	if c == nil {
		return netip.AddrPort{}, errors.New("original destination: nil connection")
	}
	local, ok := c.LocalAddr().(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("original destination: local address %v is not TCP", c.LocalAddr())
	}
	v4 := local.IP.To4() != nil
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	var ap netip.AddrPort
	var serr error
	if err := rc.Control(func(fd uintptr) {
		ap, serr = originalDst(int(fd), v4)
	}); err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	if serr != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination of %v: %w", c.RemoteAddr(), serr)
	}
	return ap, nil
}

// OriginalDstFD is OriginalDst for a socket the caller polls itself: v4 says that its
// local address is IPv4 (or v4-mapped on a dual-stack listener).
func OriginalDstFD(fd int, v4 bool) (netip.AddrPort, error) { return originalDst(fd, v4) }

func originalDst(fd int, v4 bool) (netip.AddrPort, error) {
	if v4 {
		// The kernel copies a struct sockaddr_in (16 bytes) into the 20-byte ipv6_mreq
		// buffer; x/sys has no getsockopt for a raw sockaddr, this is the usual stand-in.
		m, err := unix.GetsockoptIPv6Mreq(fd, unix.IPPROTO_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			return netip.AddrPort{}, fmt.Errorf("getsockopt SO_ORIGINAL_DST: %w", err)
		}
		b := m.Multiaddr[:]
		if fam := binary.NativeEndian.Uint16(b[0:2]); fam != unix.AF_INET {
			return netip.AddrPort{}, fmt.Errorf("getsockopt SO_ORIGINAL_DST: family %d, want AF_INET", fam)
		}
		addr := netip.AddrFrom4([4]byte(b[4:8]))
		return netip.AddrPortFrom(addr, binary.BigEndian.Uint16(b[2:4])), nil
	}
	// Same trick for IPv6: struct ip6_mtuinfo starts with a struct sockaddr_in6.
	mi, err := unix.GetsockoptIPv6MTUInfo(fd, unix.IPPROTO_IPV6, ip6tSOOriginalDst)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("getsockopt IP6T_SO_ORIGINAL_DST: %w", err)
	}
	sa := mi.Addr
	if sa.Family != unix.AF_INET6 {
		return netip.AddrPort{}, fmt.Errorf("getsockopt IP6T_SO_ORIGINAL_DST: family %d, want AF_INET6", sa.Family)
	}
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
	return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), port), nil
}

// SameNetns reports whether two netns files (bind mounts or /proc/PID/ns/net) name the same
// namespace, comparing device and inode.
func SameNetns(a, b string) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		return false, fmt.Errorf("stat netns %s: %w", a, err)
	}
	if err := unix.Stat(b, &sb); err != nil {
		return false, fmt.Errorf("stat netns %s: %w", b, err)
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}
