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
		return fn()
	}
	target, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", nsPath, err)
	}
	defer unix.Close(target)

	errc := make(chan error, 1)
	go func() {
		errc <- doLocked(nsPath, target, fn)
	}()
	return <-errc
}

// doLocked runs on its own goroutine; when it returns without unlocking, the goroutine ends
// with the thread locked and the runtime terminates that thread.
func doLocked(nsPath string, target int, fn func() error) (err error) {
	runtime.LockOSThread()
	orig, err := unix.Open(threadNetns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("open current netns: %w", err)
	}
	defer unix.Close(orig)
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
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, fmt.Errorf("listen in %s: network %q is not tcp, tcp4 or tcp6", nsPath, network)
	}
	var ln net.Listener
	err := Do(nsPath, func() error {
		var err error
		ln, err = net.Listen(network, addr)
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
	var family string
	switch network {
	case "tcp":
		family = "ip"
	case "tcp4":
		family = "ip4"
	case "tcp6":
		family = "ip6"
	default:
		return nil, fmt.Errorf("dial %s in %s: network %q is not tcp, tcp4 or tcp6", addr, nsPath, network)
	}
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s in %s: %w", addr, nsPath, err)
	}
	port, err := net.DefaultResolver.LookupPort(ctx, network, portStr)
	if err != nil {
		return nil, fmt.Errorf("dial %s in %s: %w", addr, nsPath, err)
	}
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip.Unmap()}
	} else {
		ips, err = net.DefaultResolver.LookupNetIP(ctx, family, host)
		if err != nil {
			return nil, fmt.Errorf("dial %s in %s: %w", addr, nsPath, err)
		}
	}
	var errs []error
	for _, ip := range ips {
		ip = ip.Unmap()
		if (family == "ip4" && !ip.Is4()) || (family == "ip6" && ip.Is4()) {
			errs = append(errs, fmt.Errorf("%s is not an %s address", ip, family))
			continue
		}
		c, err := dialAddr(ctx, nsPath, mark, netip.AddrPortFrom(ip, uint16(port)))
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("dial %s in %s: %w", addr, nsPath, errors.Join(errs...))
}

// dialAddr connects one socket made in nsPath to ap.
func dialAddr(ctx context.Context, nsPath string, mark uint32, ap netip.AddrPort) (net.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	domain := unix.AF_INET6
	var sa unix.Sockaddr = &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	if ap.Addr().Is4() {
		domain = unix.AF_INET
		sa = &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	fd := -1
	err := Do(nsPath, func() error {
		var err error
		fd, err = unix.Socket(domain, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
		return err
	})
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
