package upstream

import (
	"context"
	"fmt"
	"io"
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
	req, err := connectRequest(t)
	if err != nil {
		return nil, d.errorf("%w", err)
	}
	conn, hctx, done, err := d.connect(ctx, t)
	if err != nil {
		return nil, err
	}
	err = d.handshake(hctx, conn, req)
	if derr := done(); err == nil && derr != nil {
		err = d.handshakeErr(hctx, "SOCKS5 handshake", derr)
	}
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	return conn, nil
}

// connectRequest builds the CONNECT request: a domain address when the target has a
// hostname (the upstream resolves it), an IPv4 or IPv6 address otherwise.
func connectRequest(t Target) ([]byte, error) {
	req := make([]byte, 0, 6+1+255+16)
	req = append(req, socksVersion, cmdConnect, 0x00)
	host := t.hostOnly()
	if a, err := netip.ParseAddr(host); err == nil && a.Zone() == "" {
		a = a.Unmap()
		if a.Is4() {
			req = append(req, atypIPv4)
		} else {
			req = append(req, atypIPv6)
		}
		req = append(req, a.AsSlice()...)
	} else {
		if host == "" || len(host) > 255 {
			return nil, fmt.Errorf("%w: hostname of %d bytes (SOCKS5 allows 1 to 255)", ErrTarget, len(host))
		}
		req = append(req, atypDomain, byte(len(host)))
		req = append(req, host...)
	}
	p := t.port()
	return append(req, byte(p>>8), byte(p)), nil
}

// handshake negotiates the method, authenticates if the server asks to, and sends the
// CONNECT request, waiting for each answer before the next message (RFC 1928).
//
// Pipelined, it sends the greeting, the credentials and the request in one write, then
// reads the three answers: one round trip instead of two or three. The greeting then
// offers only the method whose sub-negotiation follows it (username/password when
// credentials are configured), so the server cannot pick another. Servers that read
// ahead (Dante) answer the same; servers that do not (microsocks) lose the request and
// the dial times out, which is why it is opt-in.
func (d *socksDialer) handshake(ctx context.Context, conn net.Conn, req []byte) error {
	var first []byte
	stage := "send SOCKS5 greeting"
	switch {
	case d.pipeline && d.hasUser:
		first = append(append([]byte{socksVersion, 1, authUserPass}, d.auth...), req...)
		stage = "send SOCKS5 greeting and CONNECT"
	case d.pipeline:
		first = append([]byte{socksVersion, 1, authNone}, req...)
		stage = "send SOCKS5 greeting and CONNECT"
	case d.hasUser:
		first = []byte{socksVersion, 2, authNone, authUserPass}
	default:
		first = []byte{socksVersion, 1, authNone}
	}
	if _, err := conn.Write(first); err != nil {
		return d.handshakeErr(ctx, stage, err)
	}
	method, err := d.readMethod(ctx, conn)
	if err != nil {
		return err
	}
	switch {
	case method == authUserPass:
		if !d.pipeline {
			if _, err := conn.Write(d.auth); err != nil {
				return d.handshakeErr(ctx, "send SOCKS5 credentials", err)
			}
		}
		if err := d.readAuthReply(ctx, conn); err != nil {
			return err
		}
	case d.pipeline && d.hasUser:
		return d.errorf("%w: upstream chose auth method 0x%02x, which we did not offer", ErrProtocol, method)
	}
	if !d.pipeline {
		if _, err := conn.Write(req); err != nil {
			return d.handshakeErr(ctx, "send SOCKS5 CONNECT", err)
		}
	}
	return d.readReply(ctx, conn)
}

// readMethod reads the server's method choice and checks it is one we offered.
func (d *socksDialer) readMethod(ctx context.Context, conn net.Conn) (byte, error) {
	var b [2]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		return 0, d.handshakeErr(ctx, "read SOCKS5 method", err)
	}
	if b[0] != socksVersion {
		return 0, d.errorf("%w: not a SOCKS5 server (version byte 0x%02x)", ErrProtocol, b[0])
	}
	switch b[1] {
	case authNone:
	case authUserPass:
		if !d.hasUser {
			return 0, d.errorf("%w: upstream chose username/password authentication, which we did not offer", ErrProtocol)
		}
	case authNoAcceptable:
		if d.hasUser {
			return 0, d.errorf("%w: upstream accepts neither no-auth nor username/password", ErrAuth)
		}
		return 0, d.errorf("%w: upstream requires authentication and no credentials are configured", ErrAuth)
	default:
		return 0, d.errorf("%w: upstream chose auth method 0x%02x, which we did not offer", ErrProtocol, b[1])
	}
	return b[1], nil
}

// readReply reads the CONNECT reply, skipping the bound address exactly, so no tunnel
// byte is consumed.
func (d *socksDialer) readReply(ctx context.Context, conn net.Conn) error {
	var b [4]byte
	if _, err := io.ReadFull(conn, b[:4]); err != nil {
		return d.handshakeErr(ctx, "read SOCKS5 reply", err)
	}
	if b[0] != socksVersion {
		return d.errorf("%w: bad SOCKS5 reply version 0x%02x", ErrProtocol, b[0])
	}
	if b[1] != byte(ReplySucceeded) {
		return d.errorf("%w", &ReplyError{Code: SOCKSReply(b[1])})
	}
	var skip int
	switch b[3] {
	case atypIPv4:
		skip = 4
	case atypIPv6:
		skip = 16
	case atypDomain:
		if _, err := io.ReadFull(conn, b[:1]); err != nil {
			return d.handshakeErr(ctx, "read SOCKS5 reply", err)
		}
		skip = int(b[0])
	default:
		return d.errorf("%w: bad address type 0x%02x in SOCKS5 reply", ErrProtocol, b[3])
	}
	var rest [255 + 2]byte
	if _, err := io.ReadFull(conn, rest[:skip+2]); err != nil {
		return d.handshakeErr(ctx, "read SOCKS5 reply", err)
	}
	return nil
}

// userPassRequest is the RFC 1929 username/password request.
func userPassRequest(user, pass string) []byte {
	msg := make([]byte, 0, 3+len(user)+len(pass))
	msg = append(msg, userPassVersion, byte(len(user)))
	msg = append(msg, user...)
	msg = append(msg, byte(len(pass)))
	return append(msg, pass...)
}

// readAuthReply reads the RFC 1929 status.
func (d *socksDialer) readAuthReply(ctx context.Context, conn net.Conn) error {
	var b [2]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		return d.handshakeErr(ctx, "read SOCKS5 auth reply", err)
	}
	if b[0] != userPassVersion && b[0] != socksVersion { // some servers answer 0x05 here
		return d.errorf("%w: bad auth reply version 0x%02x", ErrProtocol, b[0])
	}
	if b[1] != 0 {
		return d.errorf("%w: username/password rejected (status 0x%02x)", ErrAuth, b[1])
	}
	return nil
}
