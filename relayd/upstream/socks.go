package upstream

import (
	"context"
	"fmt"
	"net"
	"net/netip"
)

// SOCKS5 protocol constants (RFC 1928, RFC 1929).
const (
	socksVersion     = 0x05
	authNone         = 0x00
	authUserPass     = 0x02
	authNoAcceptable = 0xff
	userPassVersion  = 0x01
	cmdConnect       = 0x01
	atypIPv4         = 0x01
	atypDomain       = 0x03
	atypIPv6         = 0x04
)

// SOCKSReply is a SOCKS5 reply code (RFC 1928 §6).
type SOCKSReply byte

// The reply codes of RFC 1928 §6.
const (
	ReplySucceeded           SOCKSReply = 0x00
	ReplyGeneralFailure      SOCKSReply = 0x01
	ReplyNotAllowed          SOCKSReply = 0x02
	ReplyNetworkUnreachable  SOCKSReply = 0x03
	ReplyHostUnreachable     SOCKSReply = 0x04
	ReplyConnectionRefused   SOCKSReply = 0x05
	ReplyTTLExpired          SOCKSReply = 0x06
	ReplyCommandNotSupported SOCKSReply = 0x07
	ReplyAddressNotSupported SOCKSReply = 0x08
)

var replyWords = [...]string{
	ReplySucceeded:           "succeeded",
	ReplyGeneralFailure:      "general SOCKS server failure",
	ReplyNotAllowed:          "connection not allowed by ruleset",
	ReplyNetworkUnreachable:  "network unreachable",
	ReplyHostUnreachable:     "host unreachable",
	ReplyConnectionRefused:   "connection refused",
	ReplyTTLExpired:          "TTL expired",
	ReplyCommandNotSupported: "command not supported",
	ReplyAddressNotSupported: "address type not supported",
}

func (r SOCKSReply) String() string {
	if int(r) < len(replyWords) {
		return replyWords[r]
	}
	return fmt.Sprintf("unknown reply 0x%02x", byte(r))
}

// ReplyError is a SOCKS5 upstream's refusal; it wraps ErrRefused.
type ReplyError struct{ Code SOCKSReply }

func (e *ReplyError) Error() string {
	return fmt.Sprintf("%v: SOCKS reply 0x%02x (%v)", ErrRefused, byte(e.Code), e.Code)
}
func (e *ReplyError) Unwrap() error { return ErrRefused }

type socksDialer struct {
	common
	pipeline bool   // send greeting, credentials and request at once (Pipeline)
	auth     []byte // the username/password request, built once (nil without credentials)
}

func (d *socksDialer) Dial(ctx context.Context, t Target) (net.Conn, error) {
	return d.dial(ctx, t, d.start)
}

func (d *socksDialer) Handshake(t Target) (*Handshake, error) {
	h := new(Handshake)
	if err := d.start(h, t); err != nil {
		return nil, err
	}
	return h, nil
}

// start readies h for a negotiation with t and lays out its client side (RFC 1928): the
// greeting, the credentials when configured, and the CONNECT request, each released for
// sending once the answer before it is in.
//
// Pipelined, all of them go out at once and the three answers are read after: one round
// trip instead of two or three. The greeting then offers only the method whose
// sub-negotiation follows it (username/password when credentials are configured), so
// the server cannot pick another. Servers that read ahead (Dante) answer the same;
// servers that do not (microsocks) lose the request and the dial times out, which is
// why it is opt-in.
func (d *socksDialer) start(h *Handshake, t Target) error {
	h.reset(&d.common)
	h.socks, h.pipeline, h.state, h.need = true, d.pipeline, socksMethod, 2
	var greeting []byte
	switch {
	case d.pipeline && d.hasUser:
		greeting = []byte{socksVersion, 1, authUserPass}
	case d.pipeline:
		greeting = []byte{socksVersion, 1, authNone}
	case d.hasUser:
		greeting = []byte{socksVersion, 2, authNone, authUserPass}
	default:
		greeting = []byte{socksVersion, 1, authNone}
	}
	out := append(h.out, greeting...)
	out = append(out, d.auth...)
	h.authEnd = len(out)
	out, err := appendRequest(out, t.hostOnly(), t.port())
	if err != nil {
		return d.errorf("%w", err)
	}
	if !t.Valid() {
		return d.errorf("%w: target has no host or port", ErrTarget)
	}
	h.out, h.reqEnd = out, len(out)
	if d.pipeline {
		h.ready, h.sendStage = h.reqEnd, "send SOCKS5 greeting and CONNECT"
	} else {
		h.ready, h.sendStage = len(greeting), "send SOCKS5 greeting"
	}
	return nil
}

// appendRequest appends the CONNECT request to host (a target's hostOnly) and port: a
// domain address when the host is a name (the upstream resolves it), an IPv4 or IPv6
// address otherwise.
func appendRequest(req []byte, host string, port uint16) ([]byte, error) {
	req = append(req, socksVersion, cmdConnect, 0x00)
	if a, err := netip.ParseAddr(host); err == nil && a.Zone() == "" {
		a = a.Unmap()
		if a.Is4() {
			b := a.As4()
			req = append(append(req, atypIPv4), b[:]...)
		} else {
			b := a.As16()
			req = append(append(req, atypIPv6), b[:]...)
		}
	} else {
		if host == "" || len(host) > 255 {
			return nil, fmt.Errorf("%w: hostname of %d bytes (SOCKS5 allows 1 to 255)", ErrTarget, len(host))
		}
		req = append(req, atypDomain, byte(len(host)))
		req = append(req, host...)
	}
	return append(req, byte(port>>8), byte(port)), nil
}

// socksState is the SOCKS5 answer a Handshake is reading.
type socksState uint8

const (
	socksMethod    socksState = iota // the server's method choice
	socksAuth                        // the RFC 1929 status
	socksReply                       // the CONNECT reply up to its address type
	socksReplyName                   // the length of a domain name in the reply
	socksReplyAddr                   // the bound address and port, skipped
)

// feedSOCKS takes the bytes of the answer being read from b and, once it is whole,
// checks it and moves on to the next. It returns how many bytes it took.
func (h *Handshake) feedSOCKS(b []byte) (int, error) {
	n := min(len(b), h.need-h.got)
	if h.got < len(h.msg) {
		copy(h.msg[h.got:], b[:n])
	}
	h.got += n
	if h.got < h.need {
		return n, nil
	}
	m := h.msg
	h.got = 0
	switch h.state {
	case socksMethod:
		return n, h.method(m[0], m[1])
	case socksAuth:
		if m[0] != userPassVersion && m[0] != socksVersion { // some servers answer 0x05 here
			return n, h.c.errorf("%w: bad auth reply version 0x%02x", ErrProtocol, m[0])
		}
		if m[1] != 0 {
			return n, h.c.errorf("%w: username/password rejected (status 0x%02x)", ErrAuth, m[1])
		}
		h.request()
	case socksReply:
		if m[0] != socksVersion {
			return n, h.c.errorf("%w: bad SOCKS5 reply version 0x%02x", ErrProtocol, m[0])
		}
		if m[1] != byte(ReplySucceeded) {
			return n, h.c.errorf("%w", &ReplyError{Code: SOCKSReply(m[1])})
		}
		// The bound address is skipped exactly, so no tunnel byte is consumed.
		switch m[3] {
		case atypIPv4:
			h.state, h.need = socksReplyAddr, 4+2
		case atypIPv6:
			h.state, h.need = socksReplyAddr, 16+2
		case atypDomain:
			h.state, h.need = socksReplyName, 1
		default:
			return n, h.c.errorf("%w: bad address type 0x%02x in SOCKS5 reply", ErrProtocol, m[3])
		}
	case socksReplyName:
		h.state, h.need = socksReplyAddr, int(m[0])+2
	case socksReplyAddr:
		h.done = true
	}
	return n, nil
}

// method checks the server's method choice is one we offered and moves on to the
// credentials or the request.
func (h *Handshake) method(version, method byte) error {
	if version != socksVersion {
		return h.c.errorf("%w: not a SOCKS5 server (version byte 0x%02x)", ErrProtocol, version)
	}
	switch method {
	case authNone:
		if h.pipeline && h.c.hasUser {
			return h.c.errorf("%w: upstream chose auth method 0x%02x, which we did not offer", ErrProtocol, method)
		}
		if !h.pipeline && h.authEnd > h.ready {
			// No credentials go out: the request moves up to follow the greeting, the
			// only bytes released so far.
			h.reqEnd = h.ready + copy(h.out[h.ready:], h.out[h.authEnd:h.reqEnd])
			h.authEnd = h.ready
		}
		h.request()
		return nil
	case authUserPass:
		if !h.c.hasUser {
			return h.c.errorf("%w: upstream chose username/password authentication, which we did not offer", ErrProtocol)
		}
		if !h.pipeline {
			h.ready, h.sendStage = h.authEnd, "send SOCKS5 credentials"
		}
		h.state, h.need = socksAuth, 2
		return nil
	case authNoAcceptable:
		if h.c.hasUser {
			return h.c.errorf("%w: upstream accepts neither no-auth nor username/password", ErrAuth)
		}
		return h.c.errorf("%w: upstream requires authentication and no credentials are configured", ErrAuth)
	}
	return h.c.errorf("%w: upstream chose auth method 0x%02x, which we did not offer", ErrProtocol, method)
}

// request moves on to the CONNECT request: released for sending (unless it went out
// with the greeting), then its reply read.
func (h *Handshake) request() {
	if !h.pipeline {
		h.ready, h.sendStage = h.reqEnd, "send SOCKS5 CONNECT"
	}
	h.state, h.need = socksReply, 4
}

// userPassRequest is the RFC 1929 username/password request.
func userPassRequest(user, pass string) []byte {
	msg := make([]byte, 0, 3+len(user)+len(pass))
	msg = append(msg, userPassVersion, byte(len(user)))
	msg = append(msg, user...)
	msg = append(msg, byte(len(pass)))
	return append(msg, pass...)
}
