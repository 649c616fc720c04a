// Package rawsys makes the system calls of an event loop that owns its thread: every call
// but the wait goes through RawSyscall, without entersyscall. A socket call that takes a
// few tens of microseconds (a loopback connect runs the peer's SYN handling inline) then
// never lets sysmon hand the loop's P to another thread, which would wake one: on a
// small machine such hand-offs, not the calls, are most of what a connection costs.
//
// Every call here must be non-blocking (sockets and pipes opened O_NONBLOCK); the ones
// that sleep are Wait, which enters the scheduler as any blocking call does, and
// WaitHeld, which does not and is bounded.
package rawsys

import (
	"encoding/binary"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// call makes a non-blocking system call, retrying on EINTR.
func call(trap, a1, a2, a3, a4, a5, a6 uintptr) (int, error) {
	for {
		r, _, e := unix.RawSyscall6(trap, a1, a2, a3, a4, a5, a6)
		switch e {
		case 0:
			return int(r), nil
		case unix.EINTR:
			continue
		}
		return int(r), e
	}
}

// Wait waits for events on epoll set ep for at most msec milliseconds (-1: no bound).
// It enters the scheduler (the P may go to other goroutines while the thread sleeps).
// EINTR returns no events: the caller's next call passes a function prologue, where the
// runtime can preempt it.
func Wait(ep int, events []unix.EpollEvent, msec int) (int, error) {
	// epoll_pwait with no signal mask is epoll_wait, and exists on every architecture.
	n, _, e := unix.Syscall6(unix.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), uintptr(msec), 0, 0)
	return waited(n, e)
}

// WaitHeld is Wait without entering the scheduler: the thread sleeps holding its P, so
// neither the sleep nor the wake hands the P to another thread and back (sysmon retakes
// a P from a thread in a system call, and the thread must then find one again). For a
// loop that is busy, waits between events are short and most of what a wake-up through
// the scheduler costs is such hand-offs. It must be bounded (msec >= 0, a few
// milliseconds): the runtime cannot use the P meanwhile, and a stop-the-world waits for
// the preemption signal to interrupt the sleep.
//
//go:noinline
func WaitHeld(ep int, events []unix.EpollEvent, msec int) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), uintptr(msec), 0, 0)
	return waited(n, e)
}

func waited(n uintptr, e unix.Errno) (int, error) {
	switch e {
	case 0:
		return int(n), nil
	case unix.EINTR:
		return 0, nil
	}
	return 0, e
}

// Close closes fd. It is not retried on EINTR: Linux has released the descriptor by
// then, and its number may already be another socket's.
func Close(fd int) error {
	if _, _, e := unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0); e != 0 && e != unix.EINTR {
		return e
	}
	return nil
}

// Read reads into b (len(b) > 0).
func Read(fd int, b []byte) (int, error) {
	return call(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0, 0, 0)
}

// Write writes b (len(b) > 0).
func Write(fd int, b []byte) (int, error) {
	return call(unix.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), 0, 0, 0)
}

// Write2 writes a, then b, in one system call (writev): one TCP segment where both fit
// (len(a) > 0, len(b) > 0).
func Write2(fd int, a, b []byte) (int, error) {
	iov := [2]unix.Iovec{{Base: &a[0]}, {Base: &b[0]}}
	iov[0].SetLen(len(a))
	iov[1].SetLen(len(b))
	return call(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), 2, 0, 0, 0)
}

// Splice moves up to n bytes from one descriptor to the other, one of them a pipe,
// without blocking.
func Splice(from, to, n int) (int, error) {
	return call(unix.SYS_SPLICE, uintptr(from), 0, uintptr(to), 0, uintptr(n), unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
}

// AtMark reports whether TCP socket fd's next byte to read is at its urgent mark
// (SIOCATMARK): reads and splices stop there, and only a read goes past it.
func AtMark(fd int) (bool, error) {
	var v int32
	_, err := call(unix.SYS_IOCTL, uintptr(fd), unix.SIOCATMARK, uintptr(unsafe.Pointer(&v)), 0, 0, 0)
	return v != 0, err
}

// RecvOOB takes the urgent byte pending on TCP socket fd (MSG_OOB), or with peek looks
// at it and leaves it. EINVAL: none is pending (or it was taken); EAGAIN: the urgent
// pointer has come but not its byte.
func RecvOOB(fd int, peek bool) (byte, error) {
	var b [1]byte
	flags := unix.MSG_OOB | unix.MSG_DONTWAIT
	if peek {
		flags |= unix.MSG_PEEK
	}
	n, err := call(unix.SYS_RECVFROM, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), 1, uintptr(flags), 0, 0)
	if err == nil && n != 1 {
		err = unix.EINVAL // the connection has ended: nothing pending
	}
	return b[0], err
}

// SendOOB sends b on TCP socket fd as urgent data (MSG_OOB): the urgent mark follows it.
func SendOOB(fd int, b byte) error {
	_, err := call(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&b)), 1, unix.MSG_OOB|unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, 0, 0)
	return err
}

// Pipe returns a non-blocking pipe (read end, write end) of about size bytes (the
// kernel's default size when it refuses that one).
func Pipe(size int) ([2]int, error) {
	var p [2]int32
	if _, err := call(unix.SYS_PIPE2, uintptr(unsafe.Pointer(&p[0])), unix.O_NONBLOCK|unix.O_CLOEXEC, 0, 0, 0, 0); err != nil {
		return [2]int{-1, -1}, err
	}
	_, _ = call(unix.SYS_FCNTL, uintptr(p[0]), unix.F_SETPIPE_SZ, uintptr(size), 0, 0, 0)
	return [2]int{int(p[0]), int(p[1])}, nil
}

// Socket makes a non-blocking TCP socket of family domain in the thread's netns.
func Socket(domain int) (int, error) {
	return call(unix.SYS_SOCKET, uintptr(domain), unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP, 0, 0, 0)
}

// Shutdown shuts down the write side of a socket (a half-close).
func Shutdown(fd int) error {
	_, err := call(unix.SYS_SHUTDOWN, uintptr(fd), unix.SHUT_WR, 0, 0, 0, 0)
	return err
}

// Getsockopt reads an option of *n bytes into v; *n becomes the length the kernel wrote.
func Getsockopt(fd, level, opt int, v unsafe.Pointer, n *uint32) error {
	_, err := call(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(v), uintptr(unsafe.Pointer(n)), 0)
	return err
}

// GetsockoptInt reads an int option.
func GetsockoptInt(fd, level, opt int) (int, error) {
	var v int32
	n := uint32(4)
	err := Getsockopt(fd, level, opt, unsafe.Pointer(&v), &n)
	return int(v), err
}

// SetsockoptInt sets an int option.
func SetsockoptInt(fd, level, opt int, v int32) error {
	_, err := call(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(unsafe.Pointer(&v)), 4, 0)
	return err
}

// Abort makes the next close of fd send a reset (SO_LINGER with a zero timeout).
func Abort(fd int) error {
	l := unix.Linger{Onoff: 1, Linger: 0}
	_, err := call(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_LINGER, uintptr(unsafe.Pointer(&l)), unsafe.Sizeof(l), 0)
	return err
}

// Sockaddr is a struct sockaddr_in or sockaddr_in6 as the kernel reads and writes it.
type Sockaddr struct {
	b [unix.SizeofSockaddrInet6]byte
	n uint32
}

// SockaddrOf returns the sockaddr for ap (AF_INET for an IPv4 address) and its family.
func SockaddrOf(ap netip.AddrPort) (Sockaddr, int) {
	var sa Sockaddr
	binary.BigEndian.PutUint16(sa.b[2:4], ap.Port())
	if a := ap.Addr().Unmap(); a.Is4() {
		binary.NativeEndian.PutUint16(sa.b[0:2], unix.AF_INET)
		a4 := a.As4()
		copy(sa.b[4:8], a4[:])
		sa.n = unix.SizeofSockaddrInet4
		return sa, unix.AF_INET
	}
	binary.NativeEndian.PutUint16(sa.b[0:2], unix.AF_INET6)
	a16 := ap.Addr().As16()
	copy(sa.b[8:24], a16[:])
	sa.n = unix.SizeofSockaddrInet6
	return sa, unix.AF_INET6
}

// AddrPort is the address in sa (unmapped), invalid when sa is neither family.
func (sa *Sockaddr) AddrPort() netip.AddrPort {
	port := binary.BigEndian.Uint16(sa.b[2:4])
	switch binary.NativeEndian.Uint16(sa.b[0:2]) {
	case unix.AF_INET:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(sa.b[4:8])), port)
	case unix.AF_INET6:
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(sa.b[8:24])).Unmap(), port)
	}
	return netip.AddrPort{}
}

// Connect starts a connect of fd to sa (EINPROGRESS: under way).
func Connect(fd int, sa *Sockaddr) error {
	_, err := call(unix.SYS_CONNECT, uintptr(fd), uintptr(unsafe.Pointer(&sa.b[0])), uintptr(sa.n), 0, 0, 0)
	return err
}

// Accept4 accepts a connection on listener fd as a non-blocking socket; peer becomes
// its remote address.
func Accept4(fd int, peer *Sockaddr) (int, error) {
	peer.n = uint32(len(peer.b))
	return call(unix.SYS_ACCEPT4, uintptr(fd), uintptr(unsafe.Pointer(&peer.b[0])), uintptr(unsafe.Pointer(&peer.n)), unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0, 0)
}

// Getsockname reads fd's local address into sa.
func Getsockname(fd int, sa *Sockaddr) error {
	sa.n = uint32(len(sa.b))
	_, err := call(unix.SYS_GETSOCKNAME, uintptr(fd), uintptr(unsafe.Pointer(&sa.b[0])), uintptr(unsafe.Pointer(&sa.n)), 0, 0, 0)
	return err
}
