package sniff

import (
	"bytes"
	"fmt"
	"strings"
)

// maxMethod bounds the request method token (the longest common one is 7 bytes; WebDAV
// and friends stay well under this).
const maxMethod = 24

// HTTPHost returns the name the HTTP/1.x request at the start of b asks for, without
// its port and lowercased: the host of the request target when that names one, else the
// Host header. ErrIncomplete means b ends before the name does; ErrMalformed, that the
// request names its host in a way that cannot be read as one name (a caller must not take
// that for a request without a name: a server may read one). The request line is read as
// leniently as servers read it (RFC 9112 §2.2, §3): empty lines before it, any run of
// whitespace between its parts and after the version, and any HTTP/0.x or HTTP/1.x
// version, so that no request a server would serve passes for something else.
func HTTPHost(b []byte) (string, error) {
	for {
		if len(b) > 0 && b[0] == '\n' {
			b = b[1:]
		} else if len(b) > 1 && b[0] == '\r' && b[1] == '\n' {
			b = b[2:]
		} else {
			break
		}
	}
	if len(b) == 1 && b[0] == '\r' {
		return "", ErrIncomplete // an empty line's CR, or garbage: the next byte tells
	}
	// Request line: method SP request-target SP HTTP-version CRLF.
	i := 0
	for ; i < len(b) && i <= maxMethod; i++ {
		if isSpace(b[i]) {
			break
		}
		if !isTokenChar(b[i]) {
			return "", ErrNotHTTP
		}
	}
	switch {
	case i == len(b):
		return "", ErrIncomplete
	case i == 0 || i > maxMethod:
		return "", ErrNotHTTP
	}
	eol := bytes.IndexByte(b, '\n')
	if eol < 0 {
		// Reject early what can never become a request line.
		for _, c := range b[i+1:] {
			if (c < 0x20 && !isSpace(c)) || c == 0x7f {
				return "", ErrNotHTTP
			}
		}
		return "", ErrIncomplete
	}
	line := bytes.TrimRightFunc(b[:eol], func(r rune) bool { return r < 0x80 && isSpace(byte(r)) })
	sp := bytes.LastIndexFunc(line, func(r rune) bool { return r < 0x80 && isSpace(byte(r)) })
	if sp < i || !isHTTP1Version(line[sp+1:]) {
		return "", ErrNotHTTP
	}
	target := bytes.TrimFunc(line[i:sp], func(r rune) bool { return r < 0x80 && isSpace(byte(r)) })
	if len(target) == 0 {
		return "", ErrNotHTTP
	}
	if auth, ok := targetAuthority(b[:i], target); ok {
		// The request names its host in the target (absolute-form, or CONNECT's
		// authority-form): a server then ignores Host (RFC 9112 §3.2.2), so must we.
		if n := normalize(hostOf(string(auth))); n != "" {
			return n, nil
		}
		return "", fmt.Errorf("%w: request target host", ErrMalformed)
	}
	// The first Host answers, and the header lines already at hand after it are read on
	// for a second one: a request with two is refused by a server (RFC 9112 §3.2), and
	// which of them it would serve is not for the relay to guess. Lines not received yet
	// are not waited for.
	host, seen, next := "", false, false
	rest := b[eol+1:]
	for {
		eol := bytes.IndexByte(rest, '\n')
		if eol < 0 {
			if seen && (!next || len(rest) > 0 && !isSpace(rest[0])) {
				return host, nil
			}
			return "", ErrIncomplete
		}
		h := bytes.TrimSuffix(rest[:eol], []byte("\r"))
		rest = rest[eol+1:]
		if next && len(h) > 0 && (h[0] == ' ' || h[0] == '\t') {
			// obs-fold: the line goes on the Host value, which a server joins or refuses.
			return "", fmt.Errorf("%w: Host header folded over lines", ErrMalformed)
		}
		next = false
		if len(h) == 0 {
			return host, nil // end of headers; no Host at all is HTTP/1.0's way
		}
		colon := bytes.IndexByte(h, ':')
		switch {
		case colon < 0 && seen:
			return host, nil // past the Host the lines only matter for a second Host
		case colon < 0:
			return "", fmt.Errorf("%w: header line without a colon", ErrMalformed)
		case !asciiEqualFold(bytes.TrimRight(h[:colon], " \t"), "host"):
			continue
		case colon != 4:
			// "Host :" is refused by a server (RFC 9112 §5.1) or read as Host by a
			// lenient one; either way it is not a request without a name.
			return "", fmt.Errorf("%w: whitespace before the colon of Host", ErrMalformed)
		}
		if seen {
			return "", fmt.Errorf("%w: two Host headers", ErrMalformed)
		}
		seen, next = true, true
		v := string(bytes.TrimSpace(h[colon+1:]))
		if hv := hostOf(v); hv == "" && (v == "" || v[0] == ':') {
			host = "" // an empty host (RFC 9112 §3.2: a target without authority): no name
		} else if host = normalize(hv); host == "" {
			return "", fmt.Errorf("%w: Host header", ErrMalformed)
		}
	}
}

// isHTTP1Version reports whether v is an HTTP version a server of HTTP/1.x serves:
// "HTTP/" major "." minor, with decimal numbers (leading zeros ignored, as RFC 2145 asks
// and Python's http.server does) and a major version of 0 or 1.
func isHTTP1Version(v []byte) bool {
	rest, ok := bytes.CutPrefix(v, []byte("HTTP/"))
	if !ok {
		return false
	}
	major, minor, ok := bytes.Cut(rest, []byte("."))
	if !ok || !isDigits(major) || !isDigits(minor) {
		return false
	}
	major = bytes.TrimLeft(major, "0")
	return len(major) == 0 || len(major) == 1 && major[0] == '1'
}

func isDigits(b []byte) bool {
	if len(b) == 0 || len(b) > 10 {
		return false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// isSpace reports whether c separates the parts of a request line: SP, and the other
// whitespace RFC 9112 §3 lets a recipient take for it (HTAB, VT, FF, bare CR).
func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\v' || c == '\f' || c == '\r' }

// targetAuthority returns the host[:port] a request target names, with any userinfo
// removed: the authority of an absolute-form target ("http://user@host:port/path"), or
// the whole target of a CONNECT. ok is false for origin-form ("/path") and "*".
func targetAuthority(method, target []byte) (auth []byte, ok bool) {
	if string(method) == "CONNECT" {
		return target, true
	}
	// absolute-URI = scheme ":" hier-part; a scheme starts with a letter.
	colon := bytes.Index(target, []byte("://"))
	if colon <= 0 || !isAlpha(target[0]) {
		return nil, false
	}
	for _, c := range target[1:colon] {
		if !isAlpha(c) && !(c >= '0' && c <= '9') && c != '+' && c != '-' && c != '.' {
			return nil, false
		}
	}
	auth = target[colon+3:]
	if end := bytes.IndexAny(auth, "/?#"); end >= 0 {
		auth = auth[:end]
	}
	if at := bytes.LastIndexByte(auth, '@'); at >= 0 {
		auth = auth[at+1:]
	}
	return auth, true
}

func isAlpha(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// hostOf returns the host of an authority or a Host value (host [":" port]) as servers
// take it: the IPv6 address of a bracketed literal, else what comes before the last
// colon (net.SplitHostPort, which net/http's ServeMux uses). The port is not checked: it
// may be empty (RFC 3986 §3.2.3) or text a server ignores, and the rules look only at the
// host. A bare IPv6 address is taken whole. Brackets hold only an IPv6 address (RFC 3986
// IP-literal): "[evil.example]" has no host, nor has anything but a port after "]". What
// comes back may still be no name (normalize decides); "" means no host could be cut out.
func hostOf(v string) string {
	if strings.HasPrefix(v, "[") {
		end := strings.IndexByte(v, ']')
		if end < 0 || !isIPv6(v[1:end]) {
			return "" // unbalanced bracket, or no IPv6 address inside: not a host
		}
		if rest := v[end+1:]; rest != "" && rest[0] != ':' {
			return ""
		}
		return v[1:end]
	}
	if strings.Count(v, ":") > 1 && isIPv6(v) { // (ParseAddr's error would allocate)
		return v
	}
	if i := strings.LastIndexByte(v, ':'); i >= 0 {
		return v[:i]
	}
	return v
}

func asciiEqualFold(b []byte, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i := range b {
		c := b[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// isTokenChar reports whether c may appear in an HTTP token (RFC 9110 §5.6.2).
func isTokenChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}
