// Package sniff learns a flow's destination hostname from the first bytes the client
// sends, without consuming them: the server name (SNI) of a TLS ClientHello, or the Host
// header of an HTTP/1.x request. The relay uses it in transparent mode, where it knows
// only the original destination address, so that domain rules can still match.
//
// It is not a protocol implementation and never answers the client. The parsers are pure
// functions over a byte slice (fuzzed); Host peeks at a live connection with MSG_PEEK, so
// the relay can still splice the original bytes to the destination.
package sniff

import (
	"errors"
	"net/netip"
	"strings"
)

// MaxPeek bounds how many bytes Host looks at. A ClientHello is usually under 2 KiB
// (about 1.8 KiB with a post-quantum key share). A ClientHello or HTTP request whose name
// would come only after this many bytes cannot be read: Host and Peek report it as
// ErrMalformed, so it is refused rather than taken for a flow without a name.
const MaxPeek = 16 << 10

// Parser outcomes. A nil error with an empty name means the protocol was recognised but
// carries no name (a ClientHello without SNI, an HTTP/1.0 request without Host).
var (
	ErrIncomplete = errors.New("sniff: need more data")
	ErrNotTLS     = errors.New("sniff: not a TLS ClientHello")
	ErrNotHTTP    = errors.New("sniff: not an HTTP/1.x request")
	// ErrMalformed: the client names a host, but not in a way that reads as one name.
	// Its messages never quote the name (they may reach logs; SPEC §5).
	ErrMalformed = errors.New("sniff: malformed")
	// ErrUnsupported: Host cannot peek on this operating system.
	ErrUnsupported = errors.New("sniff: peeking is not supported on this system")
)

// Parse looks for a name in b, trying TLS then HTTP. It returns ErrIncomplete while b is
// a prefix of something that may still carry a name.
func Parse(b []byte) (string, error) {
	if len(b) == 0 {
		return "", ErrIncomplete
	}
	if b[0] == recordHandshake {
		return ServerName(b)
	}
	return HTTPHost(b)
}

// normalize lowercases a name, strips a trailing dot, and rejects anything that is not a
// plausible DNS name or IP literal (so garbage never reaches the rule engine).
func normalize(h string) string {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 || h[0] == '.' || h[len(h)-1] == '.' || strings.Contains(h, "..") {
		return "" // empty labels
	}
	var lower, colon bool
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '.', c == '_':
		case c >= 'A' && c <= 'Z':
			lower = true
		case c == ':':
			colon = true
		default:
			return ""
		}
	}
	if colon && !isIPv6(h) {
		return "" // a colon belongs only in an IPv6 literal ("evil.example:443" is no name)
	}
	if lower {
		return strings.ToLower(h)
	}
	return h
}

// isIPv6 reports whether s is an IPv6 address literal (without a zone).
func isIPv6(s string) bool {
	a, err := netip.ParseAddr(s)
	return err == nil && a.Is6() && a.Zone() == ""
}
