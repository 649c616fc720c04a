package upstream

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"time"
)

// Handshaker is a Dialer that also hands out its handshake for a caller that does its
// own I/O (kl-relayd's event loop). Every Dialer New returns is a Handshaker.
type Handshaker interface {
	Dialer
	// Handshake returns the negotiation of one tunnel to t, with the same errors as
	// Dial's for a target that cannot be expressed (ErrTarget).
	Handshake(t Target) (*Handshake, error)
	// Addr is the upstream's host:port as configured (the host may be a name).
	Addr() string
	// Timeout bounds the TCP connect plus the handshake, as it does for Dial.
	Timeout() time.Duration
}

var (
	_ Handshaker = (*socksDialer)(nil)
	_ Handshaker = (*httpDialer)(nil)
)

// Handshake negotiates one tunnel with an upstream without doing I/O: it says what to
// send (Out, Sent) and how much to read (Want), and takes what was read (Feed) until the
// tunnel is open (Done) or the upstream refused it (Feed's error). The blocking Dialers
// drive the same Handshake over their connection, so both paths speak the protocol and
// word their errors the same way.
//
// A caller repeats: send all of Out, call Sent, read at most Want bytes, Feed them, until
// Done. An error of the connection on the way (EOF, a reset, the caller's own timeout)
// goes through IOError for the words a Dialer would use, and a failed connect through
// ConnectError; the caller bounds connect and handshake by the Handshaker's Timeout, or
// by a shorter bound of its own that it tells Bound. A Handshake comes from a Handshaker
// and is for one connection and one goroutine.
type Handshake struct {
	c        *common
	socks    bool
	pipeline bool // socks: everything was sent at once (Pipeline)
	early    bool // http: the tunnel's first bytes may follow the request (Pipeline)

	// The messages to send, out[sent:ready] due now. A SOCKS5 handshake lays out
	// greeting, credentials and CONNECT request here once, and ready moves past each as
	// its turn comes.
	out         []byte
	sent, ready int
	authEnd     int    // socks: end of the credentials (start of the request) in out
	reqEnd      int    // socks: end of the request in out
	sendStage   string // names the bytes due, for IOError

	// socks: the answer being read, msg holding its first bytes.
	state     socksState
	msg       [4]byte
	got, need int

	head httpHead // http: the answer head read so far

	rest []byte
	done bool
	err  error // the error Feed returned, returned again by any later Feed

	// timeout is the bound on the connect and the handshake that a timeout's words
	// name: the Handshaker's Timeout, or the caller's shorter one (Bound).
	timeout time.Duration
}

// Out returns the bytes to send now, nil when there are none (or the handshake failed).
// The caller sends all of them before it reads again, then calls Sent.
func (h *Handshake) Out() []byte {
	if h.sent == h.ready || h.err != nil {
		return nil
	}
	return h.out[h.sent:h.ready]
}

// Sent records that all of Out was sent.
func (h *Handshake) Sent() { h.sent = h.ready }

// Want is the most bytes the caller may read now; zero once the handshake is done or
// failed. For SOCKS5 it is exactly what the answer being read still lacks, so no byte of
// the tunnel is ever read. For HTTP it is a buffer's worth: an upstream may send tunnel
// bytes right behind its answer, and Feed keeps them for Rest.
func (h *Handshake) Want() int {
	switch {
	case h.done || h.err != nil:
		return 0
	case h.socks:
		return h.need - h.got
	}
	return readBufSize
}

// Feed takes bytes read from the upstream, in order; they may come in pieces of any size
// down to one byte. It returns an error naming the upstream, as Dial's do, when the
// answer refuses the tunnel or is not valid: errors.Is finds ErrAuth, ErrRefused (with a
// *ReplyError from a SOCKS5 upstream) or ErrProtocol in it. After an error the Handshake
// is finished and every Feed returns that error. Bytes past the end of the answer are
// kept for Rest (Feed copies them; it keeps no reference to b). Bytes beyond Want are
// taken in order as well: a SOCKS5 answer read ahead of a message still to send just
// leaves that message in Out.
func (h *Handshake) Feed(b []byte) error {
	if h.err != nil {
		return h.err
	}
	for len(b) > 0 && !h.done {
		var n int
		var err error
		if h.socks {
			n, err = h.feedSOCKS(b)
		} else {
			n, err = h.feedHTTP(b)
		}
		b = b[n:]
		if err != nil {
			h.err = err
			return err
		}
	}
	if len(b) > 0 {
		h.rest = append(h.rest, b...)
	}
	return nil
}

// EarlyData reports whether the caller may send the tunnel's first bytes right behind
// the request, in the same write, before the upstream answers: an http upstream made
// with Pipeline. They reach the target only if the upstream opens the tunnel.
func (h *Handshake) EarlyData() bool { return h.early }

// Done reports whether the tunnel is open: what follows on the connection is the
// target's.
func (h *Handshake) Done() bool { return h.done }

// Rest returns the tunnel bytes Feed was given past the end of the answer, which the
// client must get before anything read later. Only an HTTP upstream's answer leaves any
// when the caller keeps to Want.
func (h *Handshake) Rest() []byte { return h.rest }

// Bound tells h that its caller gives the connect and the handshake only d in all, when
// that is less than the Handshaker's Timeout (a deadline of the caller's own that comes
// first): a timeout's words (IOError, ConnectError) then name d, the bound that expired,
// not the upstream's longer one.
func (h *Handshake) Bound(d time.Duration) {
	h.timeout = min(h.timeout, max(d, 0))
}

// IOError words an error of the connection met while the handshake was under way, as a
// Dialer does: "upstream socks5://h:1080: read SOCKS5 method: upstream closed the
// connection" for io.EOF, "...: timed out after 10s: ..." for an error whose Timeout()
// is true (os.ErrDeadlineExceeded, context.DeadlineExceeded: pass one when the caller's
// own timer for Timeout fired), "...: cancelled: ..." for context.Canceled. The stage
// ("send CONNECT", "read SOCKS5 reply", ...) is the one the handshake is at: a send
// while Out is not yet Sent, else the read of the answer it waits for.
func (h *Handshake) IOError(err error) error {
	var ctxErr error
	switch {
	case errors.Is(err, context.Canceled):
		ctxErr = context.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		ctxErr = context.DeadlineExceeded
	}
	return h.ioErr(ctxErr, err)
}

// ConnectError words a failure to open the TCP connection to the upstream, as a Dialer
// does: "upstream http://h:3128: connect: connection refused", "...: connect: timed out
// after 10s" for os.ErrDeadlineExceeded or context.DeadlineExceeded (pass one when the
// caller's own timer for Timeout fired), "...: cancelled" for context.Canceled.
func (h *Handshake) ConnectError(err error) error {
	var ctxErr error
	switch {
	case errors.Is(err, context.Canceled):
		ctxErr = context.Canceled
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded):
		ctxErr = context.DeadlineExceeded
	}
	return h.c.errorf("connect: %w", dialReason(ctxErr, h.timeout, err))
}

// ioErr is IOError given the state of the context the handshake ran under (nil when
// there is none).
func (h *Handshake) ioErr(ctxErr, err error) error {
	if !h.socks && !h.done && h.head.over() {
		// Reading on would have gone past the bound: what a reader that stops at the
		// bound reports, whatever stopped this one.
		return h.c.errorf("read CONNECT reply: %w", errHeaderOver)
	}
	return h.c.handshakeErr(ctxErr, h.timeout, h.stage(), err)
}

// stage names what the handshake is doing, for its I/O errors.
func (h *Handshake) stage() string {
	switch {
	case h.sent < h.ready:
		return h.sendStage
	case h.done && h.socks:
		return "SOCKS5 handshake"
	case h.done:
		return "CONNECT"
	case !h.socks:
		return "read CONNECT reply"
	case h.state == socksMethod:
		return "read SOCKS5 method"
	case h.state == socksAuth:
		return "read SOCKS5 auth reply"
	}
	return "read SOCKS5 reply"
}

// readBufs are the read buffers of blocking handshakes, reused across dials: Feed keeps
// no reference to what it is given.
var readBufs = sync.Pool{New: func() any { return new([readBufSize]byte) }}

// handshakes are the Handshakes of blocking dials, reused across dials: a dial hands out
// nothing of its Handshake (the Rest bytes, taken out first, are the caller's).
var handshakes = sync.Pool{New: func() any { return new(Handshake) }}

// maxKeptOut bounds the send buffer a reused Handshake keeps.
const maxKeptOut = 1024

// reset readies h for a new negotiation through c (nil: for the pool), keeping its send
// buffer unless it grew large.
func (h *Handshake) reset(c *common) {
	out := h.out[:0]
	if cap(out) > maxKeptOut {
		out = nil
	}
	*h = Handshake{c: c, out: out}
	if c != nil {
		h.timeout = c.timeout
	}
}

// dial readies a Handshake for t with start, connects to the upstream and drives the
// handshake over the connection: the blocking Dial of both protocols.
func (c *common) dial(ctx context.Context, t Target, start func(*Handshake, Target) error) (net.Conn, error) {
	h := handshakes.Get().(*Handshake)
	defer func() {
		h.reset(nil)
		handshakes.Put(h)
	}()
	if err := start(h, t); err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		// The caller's deadline (kl-relayd's connect timeout) may come before the
		// upstream's own: a timeout then names the caller's bound, the one that
		// expired. Rounded to the millisecond, the time it took to get here is not part
		// of the words.
		h.Bound(time.Until(dl).Round(time.Millisecond))
	}
	conn, hctx, done, err := c.connect(ctx, h.timeout)
	if err != nil {
		return nil, err
	}
	err = h.run(hctx, conn)
	if derr := done(); err == nil && derr != nil {
		err = h.ioErr(hctx.Err(), derr)
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	if len(h.rest) > 0 {
		// The upstream already sent bytes of the tunnel (a server-first protocol, or a
		// pipelined answer): hand them out first.
		return &bufferedConn{Conn: conn, buf: h.rest}, nil
	}
	return conn, nil
}

// run drives h over conn until the tunnel is open.
func (h *Handshake) run(ctx context.Context, conn net.Conn) error {
	buf := readBufs.Get().(*[readBufSize]byte)
	defer readBufs.Put(buf)
	for !h.done {
		if out := h.Out(); out != nil {
			if _, err := conn.Write(out); err != nil {
				return h.ioErr(ctx.Err(), err)
			}
			h.Sent()
		}
		n, err := conn.Read(buf[:h.Want()])
		if ferr := h.Feed(buf[:n]); ferr != nil {
			return ferr
		}
		if err != nil && !h.done {
			return h.ioErr(ctx.Err(), err)
		}
	}
	return nil
}
