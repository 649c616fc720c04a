package sniff

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// tcpCloseWait is TCP_CLOSE_WAIT from include/net/tcp_states.h: the peer sent its FIN.
const tcpCloseWait = 8

var bufPool = sync.Pool{New: func() any { b := make([]byte, MaxPeek); return &b }}

// Host peeks at the first bytes the client sent on c (recv with MSG_PEEK, so nothing is
// consumed) and returns the TLS server name or HTTP Host it finds, or "" when neither
// shows up within wait, the client sends something else, or it closes. It keeps peeking
// as more bytes arrive, so a ClientHello split across segments or records is still read.
// A server-first protocol (the client waits silently) costs at most wait; a client that
// half-closes mid message ends the wait at once. Host uses the read deadline of c and
// clears it before returning. The error is non-nil when the socket itself failed, or
// when the client names a host that cannot be read (ErrMalformed, see Peek): the caller
// must then refuse the flow, not decide it as one without a name.
func Host(c *net.TCPConn, wait time.Duration) (string, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return "", fmt.Errorf("sniff: %w", err)
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp

	var (
		host    string
		seen    int // bytes seen at the last peek; wait for more than this
		sockErr error
	)
	peek := func(fd uintptr) bool {
		h, done, err := Peek(int(fd), buf, &seen)
		host, sockErr = h, err
		return done
	}

	if wait <= 0 {
		// One look at what is already there.
		err = rc.Control(func(fd uintptr) { peek(fd) })
	} else {
		if err := c.SetReadDeadline(time.Now().Add(wait)); err != nil {
			return "", fmt.Errorf("sniff: %w", err)
		}
		err = rc.Read(peek)
		if derr := c.SetReadDeadline(time.Time{}); derr != nil && err == nil {
			err = derr
		}
	}
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("sniff: %w", err)
	case errors.Is(sockErr, ErrMalformed):
		return "", sockErr
	case sockErr != nil:
		return "", fmt.Errorf("sniff: peek: %w", sockErr)
	}
	return host, nil
}

// Peek looks once at the bytes the client sent on socket fd so far, without consuming
// them (recv with MSG_PEEK into buf, len(buf) bytes at most: MaxPeek). seen is the number
// of bytes the previous look saw (0 before the first); Peek updates it. done reports that
// the look settled the matter: host is the TLS server name or HTTP Host found, "" when
// the client sent something else, closed, or half-closed without a name. err is a
// failure of the socket, or an error wrapping ErrMalformed when the client names a host
// that cannot be read as one name: a malformed ClientHello or request (two names, a name
// that is no DNS name or IP literal). A server may still read a name there, so such a
// flow is not one without a name: the caller refuses it. A well-formed message whose
// name would come only after len(buf) bytes (a request line or headers of more than 16
// KiB before Host) is decided without a name, as one that names none: a bound on what
// is looked at, like the wait, not a refusal of long requests. Not done: nothing new
// yet, or a message still incomplete, so
// wait for the socket to turn readable and look again. Host is Peek with a wait; an
// event loop that polls the socket itself calls Peek on each readiness.
func Peek(fd int, buf []byte, seen *int) (host string, done bool, err error) {
	n, _, err := unix.Recvfrom(fd, buf, unix.MSG_PEEK|unix.MSG_DONTWAIT)
	switch {
	case err == unix.EINTR || err == unix.EAGAIN:
		return "", false, nil // nothing yet: wait for readability
	case err != nil:
		return "", true, err
	case n == 0:
		// The client closed without sending a name.
		return "", true, nil
	case n == *seen && n < len(buf):
		// Woken without new bytes: the client may have half-closed after a partial
		// message (no more bytes will come), or this is a spurious wakeup.
		return "", peerClosed(uintptr(fd)), nil
	}
	*seen = n
	h, perr := Parse(buf[:n])
	switch {
	case perr == nil:
		return h, true, nil
	case errors.Is(perr, ErrIncomplete) && n < len(buf):
		return "", peerClosed(uintptr(fd)), nil // wait for more, unless no more can come
	case errors.Is(perr, ErrIncomplete):
		return "", true, nil // no name within the bytes looked at
	case errors.Is(perr, ErrMalformed):
		return "", true, perr
	}
	return "", true, nil // neither TLS nor HTTP: no name
}

// peerClosed reports whether the client already sent its FIN (the socket is in
// CLOSE_WAIT): then the bytes peeked so far are all there will be.
func peerClosed(fd uintptr) bool {
	ti, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	return err == nil && ti.State == tcpCloseWait
}
