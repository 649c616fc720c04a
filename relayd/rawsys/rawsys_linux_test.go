package rawsys

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestSockaddr(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		family   int
	}{
		{"192.0.2.1:80", "192.0.2.1:80", unix.AF_INET},
		{"[::ffff:192.0.2.1]:443", "192.0.2.1:443", unix.AF_INET},
		{"[fd00::1]:15001", "[fd00::1]:15001", unix.AF_INET6},
		{"[::]:1", "[::]:1", unix.AF_INET6},
	} {
		sa, fam := SockaddrOf(netip.MustParseAddrPort(tc.in))
		if got := sa.AddrPort().String(); got != tc.want || fam != tc.family {
			t.Errorf("%s: %s family %d, want %s family %d", tc.in, got, fam, tc.want, tc.family)
		}
	}
	var zero Sockaddr
	if zero.AddrPort().IsValid() {
		t.Error("an empty sockaddr has an address")
	}
}

// TestLoopback runs the calls an event loop makes over loopback: listen (by hand), a
// non-blocking connect, accept with the peer's address, getsockname, then bytes spliced
// socket to pipe to socket, a half-close, and an abort that the peer sees as a reset.
func TestLoopback(t *testing.T) {
	c, s, peer := tcpPair(t)
	defer func() {
		if s >= 0 {
			Close(s)
		}
	}()
	var csa Sockaddr
	if err := Getsockname(c, &csa); err != nil || csa.AddrPort() != peer.AddrPort() {
		t.Fatalf("peer %v, client's own address %v (%v)", peer.AddrPort(), csa.AddrPort(), err)
	}
	if soerr, err := GetsockoptInt(c, unix.SOL_SOCKET, unix.SO_ERROR); err != nil || soerr != 0 {
		t.Fatalf("SO_ERROR %d, %v", soerr, err)
	}

	msg := []byte("spliced")
	if n, err := Write(c, msg); err != nil || n != len(msg) {
		t.Fatalf("write: %d %v", n, err)
	}
	if err := Shutdown(c); err != nil {
		t.Fatal(err)
	}
	p, err := Pipe(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer Close(p[0])
	defer Close(p[1])
	var in int
	for deadline := time.Now().Add(5 * time.Second); in < len(msg); time.Sleep(time.Millisecond) {
		n, err := Splice(s, p[1], 1<<20)
		if err != nil && err != unix.EAGAIN || time.Now().After(deadline) {
			t.Fatalf("splice in: %d %v", n, err)
		}
		in += max(n, 0)
	}
	if n, err := Splice(s, p[1], 1<<20); n != 0 || err != nil {
		t.Errorf("after the half-close: %d %v, want 0 (EOF)", n, err)
	}
	buf := make([]byte, 16)
	if n, err := Read(p[0], buf); err != nil || !bytes.Equal(buf[:n], msg) {
		t.Errorf("pipe holds %q %v, want %q", buf[:n], err, msg)
	}

	if err := Abort(s); err != nil {
		t.Fatal(err)
	}
	Close(s)
	s = -1
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		_, err := Read(c, buf)
		if err == unix.ECONNRESET {
			break
		}
		if err != unix.EAGAIN || time.Now().After(deadline) {
			t.Fatalf("client read after the abort: %v, want ECONNRESET", err)
		}
	}
}

func TestWrite2(t *testing.T) {
	p, err := Pipe(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer Close(p[0])
	defer Close(p[1])
	if n, err := Write2(p[1], []byte("CONNECT "), []byte("hello")); n != 13 || err != nil {
		t.Fatalf("Write2 = %d, %v; want 13, nil", n, err)
	}
	buf := make([]byte, 32)
	if n, err := Read(p[0], buf); err != nil || string(buf[:n]) != "CONNECT hello" {
		t.Errorf("read %q, %v; want %q", buf[:n], err, "CONNECT hello")
	}
}

// TestUrgent sends an urgent byte in the middle of a stream and takes it as the relay's
// event loop does: a splice stops at the mark (and never passes it), AtMark says so,
// RecvOOB peeks at and then takes the byte, SendOOB sends it on as urgent, and a read
// goes past the mark to the bytes behind it.
func TestUrgent(t *testing.T) {
	a, b, _ := tcpPair(t)
	defer Close(b)
	c, d, _ := tcpPair(t)
	defer Close(d)
	if err := unix.SetsockoptInt(a, unix.IPPROTO_TCP, unix.TCP_CORK, 1); err != nil {
		t.Fatal(err)
	}
	Write(a, []byte("abc"))
	if err := SendOOB(a, 'X'); err != nil {
		t.Fatal(err)
	}
	Write(a, []byte("def"))
	if err := unix.SetsockoptInt(a, unix.IPPROTO_TCP, unix.TCP_CORK, 0); err != nil {
		t.Fatal(err)
	}
	p, err := Pipe(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer Close(p[0])
	defer Close(p[1])
	var in int
	for deadline := time.Now().Add(5 * time.Second); in < 3; time.Sleep(time.Millisecond) {
		n, err := Splice(b, p[1], 1<<16)
		if err != nil && err != unix.EAGAIN || time.Now().After(deadline) {
			t.Fatalf("splice up to the mark: %d %v", n, err)
		}
		in += max(n, 0)
	}
	if n, err := Splice(b, p[1], 1<<16); err != unix.EAGAIN {
		t.Errorf("splice at the mark: %d %v, want EAGAIN", n, err)
	}
	if at, err := AtMark(b); !at || err != nil {
		t.Errorf("AtMark at the mark = %v, %v", at, err)
	}
	for _, peek := range []bool{true, false} {
		if x, err := RecvOOB(b, peek); x != 'X' || err != nil {
			t.Errorf("RecvOOB(peek %v) = %q, %v; want X", peek, x, err)
		}
	}
	if _, err := RecvOOB(b, false); err != unix.EINVAL {
		t.Errorf("RecvOOB once taken: %v, want EINVAL", err)
	}
	buf := make([]byte, 16)
	if n, err := Read(b, buf); string(buf[:n]) != "def" || err != nil {
		t.Errorf("read past the mark: %q %v, want def", buf[:n], err)
	}
	if at, err := AtMark(b); at || err != nil {
		t.Errorf("AtMark past the mark = %v, %v", at, err)
	}
	if err := SendOOB(c, 'Y'); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		y, err := RecvOOB(d, false)
		if err == nil && y == 'Y' {
			break
		}
		if err != unix.EAGAIN && err != unix.EINVAL || time.Now().After(deadline) {
			t.Fatalf("the peer's RecvOOB: %q %v, want Y", y, err)
		}
	}
}

// tcpPair connects two non-blocking TCP sockets on loopback: the connecting one (closed
// at the end of the test), the accepted one (the caller's to close) and the address it
// was accepted from. Listen, connect, accept and getsockname are the calls an event loop
// makes.
func tcpPair(t *testing.T) (c, s int, peer Sockaddr) {
	ln, err := Socket(unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	defer Close(ln)
	if err := unix.Bind(ln, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(ln, 1); err != nil {
		t.Fatal(err)
	}
	var lsa Sockaddr
	if err := Getsockname(ln, &lsa); err != nil {
		t.Fatal(err)
	}
	if c, err = Socket(unix.AF_INET); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Close(c) })
	if err := Connect(c, &lsa); err != nil && err != unix.EINPROGRESS {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if s, err = Accept4(ln, &peer); err == nil {
			return c, s, peer
		}
		if err != unix.EAGAIN || time.Now().After(deadline) {
			t.Fatalf("accept: %v", err)
		}
	}
}
