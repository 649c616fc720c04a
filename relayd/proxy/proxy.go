// Package proxy serves the explicit proxies kl offers to workloads in `proxy` mode: an
// HTTP proxy (CONNECT tunnels and absolute-URI forwarding of plain HTTP) and a SOCKS5
// proxy (CONNECT with IPv4, IPv6 and domain addresses). Both listen on loopback inside the
// pod's network namespace; the hostname a client asks for is known exactly.
//
// It is not the policy: every destination is handed to a DialFunc (the relay, which
// decides, audits and dials the chosen exit); a refusal wrapping ErrDenied becomes an
// HTTP 403 or a SOCKS "not allowed by ruleset" reply. Protocol errors get a clear error
// reply and a log line saying what was wrong, never a panic. Logs never name the
// destination above debug level.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kl-egress/kl/relayd/upstream"
)

// DialFunc opens a connection to the destination through whatever exit the policy
// chooses. Return an error wrapping ErrDenied (for example a *Denied) to refuse.
type DialFunc func(ctx context.Context, t upstream.Target) (net.Conn, error)

// ErrDenied marks a destination the policy refuses.
var ErrDenied = errors.New("denied by policy")

// Denied is a refusal that says which rule refused. It wraps ErrDenied.
type Denied struct {
	Rule      int    // 1-based rule index, 0 for default/guard/script
	Dimension string // which part of the policy decided
	Exit      string // the exit chosen ("deny", or an exit that is unavailable)
	Note      string // the rule's note
}

func (d *Denied) Error() string {
	var b strings.Builder
	b.WriteString(ErrDenied.Error())
	if d.Rule > 0 {
		fmt.Fprintf(&b, ": rule %d", d.Rule)
	} else if d.Dimension != "" {
		fmt.Fprintf(&b, ": %s", d.Dimension)
	}
	if d.Rule > 0 && d.Dimension != "" {
		fmt.Fprintf(&b, " (%s)", d.Dimension)
	}
	if d.Exit != "" {
		fmt.Fprintf(&b, ", exit %s", d.Exit)
	}
	if d.Note != "" {
		fmt.Fprintf(&b, ", %q", d.Note)
	}
	return b.String()
}

func (d *Denied) Unwrap() error { return ErrDenied }

// Server holds the settings of both proxies. The zero value of each field means its
// default.
type Server struct {
	Dial DialFunc
	Log  *slog.Logger
	// HandshakeTimeout bounds reading a client's first request (HTTP headers, or the
	// SOCKS5 greeting and request). Default 10s.
	HandshakeTimeout time.Duration
	// IdleTimeout bounds the wait for the next request on a kept-alive HTTP connection.
	// Default 90s.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds an HTTP request's header block. Default 32 KiB.
	MaxHeaderBytes int
	// Pipe, when set, relays an established tunnel (client, destination) and closes
	// both (the relay passes its own, with idle timeout and byte accounting). The
	// default copies both ways with half-close, splicing between TCP connections.
	Pipe func(client, up net.Conn)
	// ConnContext, when set, derives the context of one client connection's requests
	// (passed to Dial) from the server's, as http.Server.ConnContext does; the relay
	// uses it to tell Dial which client connection asks.
	ConnContext func(ctx context.Context, c net.Conn) context.Context

	// lingerTime and lingerBytes bound the discarding of a client's bytes after the
	// last answer on its connection (see lingerClose). Default 500 ms and 256 KiB.
	lingerTime  time.Duration
	lingerBytes int64
}

func (s *Server) handshakeTimeout() time.Duration {
	if s.HandshakeTimeout > 0 {
		return s.HandshakeTimeout
	}
	return 10 * time.Second
}

func (s *Server) idleTimeout() time.Duration {
	if s.IdleTimeout > 0 {
		return s.IdleTimeout
	}
	return 90 * time.Second
}

func (s *Server) maxHeaderBytes() int64 {
	if s.MaxHeaderBytes > 0 {
		return int64(s.MaxHeaderBytes)
	}
	return 32 << 10
}

func (s *Server) lingerFor() (time.Duration, int64) {
	d, n := s.lingerTime, s.lingerBytes
	if d <= 0 {
		d = 500 * time.Millisecond
	}
	if n <= 0 {
		n = 256 << 10
	}
	return d, n
}

// lingerClose closes a client connection after kl's last answer on it (a refusal, or
// an answer after which the connection ends) while the client may still be sending: the
// rest of an oversized header, a body, tunnel bytes, pipelined requests. Closing a socket
// that holds unread bytes makes Linux send a reset instead of a FIN, and a client that
// has not read the answer yet may lose it to "connection reset by peer". So, as net/http's
// server does: shut down the write side (the FIN follows the answer, which is written
// already, unbuffered), read and discard what the client sends until it closes (normally
// right after reading the answer), for at most lingerTime and lingerBytes, then close.
// It runs on the connection's own goroutine, so it holds up no other connection, and the
// connection stays tracked until it is closed (closing a workload ends the wait).
func (s *Server) lingerClose(c net.Conn) { s.linger(c, false) }

// holdClose is lingerClose for a client that was still sending a body when the
// destination's answer went out (an origin that refused the body): once lingerBytes are
// discarded it stops reading but keeps the connection for the rest of lingerTime. A
// client that writes its whole body before it looks at the answer then finds its
// writes blocked on full buffers, not reset, and reads the answer meanwhile (net/http's
// server waits so too, after a handler left a large body unread).
func (s *Server) holdClose(c net.Conn) { s.linger(c, true) }

func (s *Server) linger(c net.Conn, hold bool) {
	defer func() { _ = c.Close() }()
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok {
		cw, ok = Raw(c).(interface{ CloseWrite() error })
	}
	if !ok || cw.CloseWrite() != nil {
		return
	}
	d, n := s.lingerFor()
	end := time.Now().Add(d)
	_ = c.SetReadDeadline(end)
	if k, err := io.CopyN(io.Discard, c, n); hold && k == n && err == nil {
		time.Sleep(time.Until(end))
	}
}

func (s *Server) log() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.New(slog.DiscardHandler)
}

// ServeHTTP serves the HTTP proxy on ln until ctx is done (then it closes ln and returns
// nil; connections already being served carry on until they end, but one kept alive
// waiting for its next request is closed).
func ServeHTTP(ctx context.Context, ln net.Listener, dial DialFunc, log *slog.Logger) error {
	s := &Server{Dial: dial, Log: log}
	return s.ServeHTTP(ctx, ln)
}

// ServeSOCKS5 serves the SOCKS5 proxy on ln until ctx is done, like ServeHTTP.
func ServeSOCKS5(ctx context.Context, ln net.Listener, dial DialFunc, log *slog.Logger) error {
	s := &Server{Dial: dial, Log: log}
	return s.ServeSOCKS5(ctx, ln)
}

// ServeHTTP serves the HTTP proxy on ln until ctx is done.
func (s *Server) ServeHTTP(ctx context.Context, ln net.Listener) error {
	return s.serve(ctx, ln, "http proxy", s.serveHTTPConn)
}

// ServeSOCKS5 serves the SOCKS5 proxy on ln until ctx is done.
func (s *Server) ServeSOCKS5(ctx context.Context, ln net.Listener) error {
	return s.serve(ctx, ln, "socks5 proxy", s.serveSOCKSConn)
}

func (s *Server) serve(ctx context.Context, ln net.Listener, what string, handle func(context.Context, net.Conn)) error {
	if s.Dial == nil {
		return fmt.Errorf("%s: no dial function", what)
	}
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if isTemporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log().Warn(what+": accept failed, retrying", "err", err, "in", backoff)
				select {
				case <-time.After(backoff):
					continue
				case <-ctx.Done():
					return nil
				}
			}
			return fmt.Errorf("%s: accept: %w", what, err)
		}
		backoff = 0
		go func() {
			defer func() {
				if r := recover(); r != nil {
					s.log().Error(what+": connection handler panicked", "panic", r)
					_ = c.Close()
				}
			}()
			cctx := ctx
			if s.ConnContext != nil {
				cctx = s.ConnContext(ctx, c)
			}
			handle(cctx, c)
		}()
	}
}

func isTemporary(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ENOBUFS) ||
		errors.Is(err, syscall.ENOMEM)
}

// dialFailure classifies a dial error for the client-facing reply; the words never
// include the destination or the upstream's address.
type dialFailure int

const (
	failOther dialFailure = iota
	failDenied
	failTimeout
	failRefused
	failNetUnreachable
	failHostUnreachable
	failUpstreamAuth
	failUpstreamRefused
)

func classify(err error) dialFailure {
	var ne net.Error
	var dnsErr *net.DNSError
	switch {
	case errors.Is(err, ErrDenied):
		return failDenied
	case errors.Is(err, upstream.ErrAuth):
		return failUpstreamAuth
	case errors.Is(err, upstream.ErrRefused):
		var re *upstream.ReplyError
		if errors.As(err, &re) {
			switch re.Code {
			case upstream.ReplyConnectionRefused:
				return failRefused
			case upstream.ReplyNetworkUnreachable:
				return failNetUnreachable
			case upstream.ReplyHostUnreachable, upstream.ReplyTTLExpired:
				return failHostUnreachable
			}
		}
		return failUpstreamRefused
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return failTimeout
	case errors.Is(err, syscall.ECONNREFUSED):
		return failRefused
	case errors.Is(err, syscall.ENETUNREACH):
		return failNetUnreachable
	case errors.Is(err, syscall.EHOSTUNREACH), errors.As(err, &dnsErr):
		return failHostUnreachable
	}
	return failOther
}

func (f dialFailure) String() string {
	switch f {
	case failDenied:
		return "denied by policy"
	case failTimeout:
		return "connect timed out"
	case failRefused:
		return "connection refused"
	case failNetUnreachable:
		return "network unreachable"
	case failHostUnreachable:
		return "host unreachable"
	case failUpstreamAuth:
		return "the upstream proxy refused kl's credentials"
	case failUpstreamRefused:
		return "the upstream proxy refused the connection"
	}
	return "cannot connect"
}

// pipe copies both ways until both directions end, half-closing as each side finishes,
// then closes both connections. io.Copy between TCP connections uses splice(2); wrappers
// that only add bookkeeping are looked through (see raw) so that still happens.
func (s *Server) pipe(client, up net.Conn) {
	if s.Pipe != nil {
		s.Pipe(client, up)
		return
	}
	rc, ru := Raw(client), Raw(up)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := io.Copy(ru, rc); err != nil {
			_ = up.Close()
			_ = client.Close()
			return
		}
		closeWrite(up)
	}()
	if _, err := io.Copy(rc, ru); err != nil {
		_ = up.Close()
		_ = client.Close()
	} else {
		closeWrite(client)
	}
	wg.Wait()
	_ = client.Close()
	_ = up.Close()
}

// Raw unwraps connections that expose NetConn() (like the relay's tracking wrappers) down
// to one with its own copy fast path. A wrapper that implements io.WriterTo or
// io.ReaderFrom itself (upstream's connection holding early bytes) is kept: reading
// around it would lose data.
func Raw(c net.Conn) net.Conn {
	for range 8 {
		if _, ok := c.(io.WriterTo); ok {
			return c
		}
		if _, ok := c.(io.ReaderFrom); ok {
			return c
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return c
		}
		c = u.NetConn()
	}
	return c
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}
