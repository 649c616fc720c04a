package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/kl-egress/kl/relayd/upstream"
)

// socksError is a refused SOCKS5 request: the reply code to send and what was wrong.
type socksError struct {
	reply   upstream.SOCKSReply
	noReply bool // the greeting failed: answer nothing more (or only the method byte)
	refused bool // with noReply: the method refusal (05 ff) was sent
	msg     string
}

func (e *socksError) Error() string { return e.msg }

func socksErr(reply upstream.SOCKSReply, format string, args ...any) *socksError {
	return &socksError{reply: reply, msg: fmt.Sprintf(format, args...)}
}

// readSOCKSRequest runs the server side of the SOCKS5 greeting (no-auth only) and reads
// the CONNECT request. It writes the method selection to w; on error the caller sends the
// reply code in the *socksError (unless noReply).
func readSOCKSRequest(r io.Reader, w io.Writer) (upstream.Target, error) {
	var b [4]byte
	if _, err := io.ReadFull(r, b[:2]); err != nil {
		return upstream.Target{}, &socksError{noReply: true, msg: "read greeting: " + eofWords(err)}
	}
	if b[0] != 0x05 {
		if b[0] == 0x04 {
			return upstream.Target{}, &socksError{noReply: true, msg: "SOCKS4 is not supported (want SOCKS5)"}
		}
		return upstream.Target{}, &socksError{noReply: true, msg: fmt.Sprintf("not a SOCKS5 greeting (version byte 0x%02x)", b[0])}
	}
	n := int(b[1])
	if n == 0 {
		_, _ = w.Write([]byte{0x05, 0xff})
		return upstream.Target{}, &socksError{noReply: true, refused: true, msg: "greeting offers no auth methods"}
	}
	var methods [255]byte
	if _, err := io.ReadFull(r, methods[:n]); err != nil {
		return upstream.Target{}, &socksError{noReply: true, msg: "read auth methods: " + eofWords(err)}
	}
	noAuth := false
	for _, m := range methods[:n] {
		if m == 0x00 {
			noAuth = true
		}
	}
	if !noAuth {
		_, _ = w.Write([]byte{0x05, 0xff})
		return upstream.Target{}, &socksError{noReply: true, refused: true, msg: "client does not offer the no-auth method (the only one kl's SOCKS5 proxy uses)"}
	}
	if _, err := w.Write([]byte{0x05, 0x00}); err != nil {
		return upstream.Target{}, &socksError{noReply: true, msg: "write method selection: " + err.Error()}
	}
	if _, err := io.ReadFull(r, b[:4]); err != nil {
		return upstream.Target{}, &socksError{noReply: true, msg: "read request: " + eofWords(err)}
	}
	if b[0] != 0x05 {
		return upstream.Target{}, socksErr(upstream.ReplyGeneralFailure, "bad request version 0x%02x", b[0])
	}
	cmd, atyp := b[1], b[3]
	var t upstream.Target
	switch atyp {
	case 0x01, 0x04:
		l := 4
		if atyp == 0x04 {
			l = 16
		}
		var a [16]byte
		if _, err := io.ReadFull(r, a[:l]); err != nil {
			return t, &socksError{noReply: true, msg: "read request address: " + eofWords(err)}
		}
		ip, _ := netip.AddrFromSlice(a[:l])
		t.Addr = netip.AddrPortFrom(ip.Unmap(), 0)
	case 0x03:
		if _, err := io.ReadFull(r, b[:1]); err != nil {
			return t, &socksError{noReply: true, msg: "read request domain: " + eofWords(err)}
		}
		var d [255]byte
		if _, err := io.ReadFull(r, d[:b[0]]); err != nil {
			return t, &socksError{noReply: true, msg: "read request domain: " + eofWords(err)}
		}
		host, err := domainTarget(string(d[:b[0]]))
		if err != nil {
			return t, socksErr(upstream.ReplyHostUnreachable, "%v", err)
		}
		if ip, err := netip.ParseAddr(host); err == nil {
			t.Addr = netip.AddrPortFrom(ip.Unmap(), 0)
		} else {
			t.Host = host
		}
	default:
		return t, socksErr(upstream.ReplyAddressNotSupported, "unknown address type 0x%02x", atyp)
	}
	if _, err := io.ReadFull(r, b[:2]); err != nil {
		return t, &socksError{noReply: true, msg: "read request port: " + eofWords(err)}
	}
	t.Port = uint16(b[0])<<8 | uint16(b[1])
	if t.Addr.IsValid() {
		t.Addr = netip.AddrPortFrom(t.Addr.Addr(), t.Port)
	}
	if cmd != 0x01 {
		return t, socksErr(upstream.ReplyCommandNotSupported, "command 0x%02x is not supported (only CONNECT)", cmd)
	}
	if t.Port == 0 {
		return t, socksErr(upstream.ReplyHostUnreachable, "destination port 0")
	}
	return t, nil
}

// domainTarget validates a hostname sent by a client (SOCKS5 domain or HTTP authority):
// lowercased, no trailing dot, only characters a DNS name or IP literal has.
func domainTarget(h string) (string, error) {
	h = strings.TrimSuffix(h, ".")
	if h == "" {
		return "", errors.New("empty hostname")
	}
	if len(h) > 253 {
		return "", fmt.Errorf("hostname of %d bytes (at most 253)", len(h))
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '.', c == '_', c == ':':
		case c >= 'A' && c <= 'Z':
		default:
			return "", fmt.Errorf("hostname has byte 0x%02x at %d", c, i)
		}
	}
	if h[0] == '.' || h[len(h)-1] == '.' || strings.Contains(h, "..") {
		return "", errors.New("hostname has an empty label")
	}
	// ':' belongs only to an IPv6 literal (a SOCKS5 domain may carry one); in a name it
	// would hand the policy and the exits "name:port" as if it were a host.
	if strings.IndexByte(h, ':') >= 0 {
		if _, err := netip.ParseAddr(h); err != nil {
			return "", errors.New("hostname has ':' but is not an IPv6 address")
		}
	}
	return strings.ToLower(h), nil
}

func eofWords(err error) string {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "client closed the connection"
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timed out"
	}
	return err.Error()
}

func socksReply(code upstream.SOCKSReply, bound net.Addr) []byte {
	out := []byte{0x05, byte(code), 0x00}
	var ip netip.Addr
	var port uint16
	if ta, ok := bound.(*net.TCPAddr); ok && ta != nil {
		ap := ta.AddrPort()
		ip, port = ap.Addr().Unmap(), ap.Port()
	}
	switch {
	case ip.Is6():
		out = append(out, 0x04)
		out = append(out, ip.AsSlice()...)
	case ip.Is4():
		out = append(out, 0x01)
		out = append(out, ip.AsSlice()...)
	default:
		out = append(out, 0x01, 0, 0, 0, 0)
	}
	return append(out, byte(port>>8), byte(port))
}

func replyFor(f dialFailure) upstream.SOCKSReply {
	switch f {
	case failDenied:
		return upstream.ReplyNotAllowed
	case failRefused:
		return upstream.ReplyConnectionRefused
	case failNetUnreachable:
		return upstream.ReplyNetworkUnreachable
	case failHostUnreachable, failTimeout:
		return upstream.ReplyHostUnreachable
	}
	return upstream.ReplyGeneralFailure
}

func (s *Server) serveSOCKSConn(ctx context.Context, c net.Conn) {
	_ = c.SetDeadline(time.Now().Add(s.handshakeTimeout()))
	t, err := readSOCKSRequest(c, c)
	if err != nil {
		var se *socksError
		s.log().Warn("socks5 proxy: bad request", "why", err.Error())
		switch {
		case errors.As(err, &se) && !se.noReply:
			_, _ = c.Write(socksReply(se.reply, nil))
			s.lingerClose(c)
		case se != nil && se.refused:
			s.lingerClose(c)
		default: // nothing to answer, or the client is gone
			_ = c.Close()
		}
		return
	}
	// The handshake is read; the dial has its own timeout, and a deadline left armed
	// across it would drop the reply to a dial that succeeded late (the flow already
	// audited as carried). The reply gets one of its own.
	_ = c.SetDeadline(time.Time{})
	up, err := s.Dial(ctx, t)
	s.answerDeadline(c)
	if err != nil {
		f := classify(err)
		_, _ = c.Write(socksReply(replyFor(f), nil))
		s.log().Debug("socks5 proxy: dial failed", "target", t.String(), "why", f.String(), "err", err)
		s.lingerClose(c)
		return
	}
	if _, err := c.Write(socksReply(upstream.ReplySucceeded, c.LocalAddr())); err != nil {
		_ = up.Close()
		_ = c.Close()
		return
	}
	_ = c.SetWriteDeadline(time.Time{})
	s.pipe(c, up)
}
