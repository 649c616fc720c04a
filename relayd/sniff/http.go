package sniff

import (
	"bytes"
	"fmt"
	"strings"
)

// maxMethod bounds the request method token (the longest common one is 7 bytes; WebDAV
// and friends stay well under this).
const maxMethod = 24

// HTTPHost returns the Host header of the HTTP/1.x request at the start of b, without
// its port and lowercased. ErrIncomplete means b ends before the header block does.
func HTTPHost(b []byte) (string, error) {
	// Request line: method SP request-target SP HTTP/1.x CRLF.
	i := 0
	for ; i < len(b) && i <= maxMethod; i++ {
		if b[i] == ' ' {
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
			if (c < 0x20 && c != '\r') || c == 0x7f {
				return "", ErrNotHTTP
			}
		}
		return "", ErrIncomplete
	}
	line := bytes.TrimSuffix(b[:eol], []byte("\r"))
	sp := bytes.LastIndexByte(line, ' ')
	if sp <= i || !bytes.HasPrefix(line[sp+1:], []byte("HTTP/1.")) || len(line[sp+1:]) != 8 {
		return "", ErrNotHTTP
	}
	if auth, ok := targetAuthority(b[:i], line[i+1:sp]); ok {
		// The request names its host in the target (absolute-form, or CONNECT's
		// authority-form): a server then ignores Host (RFC 9112 §3.2.2), so must we.
		v := string(auth)
		if n := normalize(stripPort(v)); n != "" {
			return n, nil
		}
		return "", fmt.Errorf("%w: request target host %q", ErrMalformed, truncate(v))
	}
	// The first Host answers, and the header lines already at hand after it are read on
	// for a second one: a request with two is refused by a server (RFC 9112 §3.2), and
	// which of them it would serve is not for the relay to guess. Lines not received yet
	// are not waited for.
	host := ""
	rest := b[eol+1:]
	for {
		eol := bytes.IndexByte(rest, '\n')
		if eol < 0 {
			if host != "" {
				return host, nil
			}
			return "", ErrIncomplete
		}
		h := bytes.TrimSuffix(rest[:eol], []byte("\r"))
		rest = rest[eol+1:]
		if len(h) == 0 {
			return host, nil // end of headers; no Host at all is HTTP/1.0's way
		}
		colon := bytes.IndexByte(h, ':')
		switch {
		case colon < 0 && host != "":
			return host, nil // past the Host the lines only matter for a second Host
		case colon < 0:
			return "", fmt.Errorf("%w: header line without a colon", ErrMalformed)
		case colon != 4 || !asciiEqualFold(h[:4], "host"):
			continue
		}
		if host != "" {
			return "", fmt.Errorf("%w: two Host headers", ErrMalformed)
		}
		v := string(bytes.TrimSpace(h[colon+1:]))
		if host = normalize(stripPort(v)); host == "" {
			return "", fmt.Errorf("%w: Host header %q", ErrMalformed, truncate(v))
		}
	}
}

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

// stripPort removes a :port and the brackets of an IPv6 literal. Brackets hold only an
// IPv6 address (RFC 3986 IP-literal): "[evil.example]" is not a host.
func stripPort(v string) string {
	if strings.HasPrefix(v, "[") {
		end := strings.IndexByte(v, ']')
		if end < 0 || !isIPv6(v[1:end]) {
			return "" // unbalanced bracket, or no IPv6 address inside: not a host
		}
		if rest := v[end+1:]; rest != "" && !isPort(strings.TrimPrefix(rest, ":")) {
			return ""
		}
		return v[1:end]
	}
	if i := strings.IndexByte(v, ':'); i >= 0 && strings.Count(v, ":") == 1 {
		if !isPort(v[i+1:]) {
			return ""
		}
		return v[:i]
	}
	return v
}

func isPort(s string) bool {
	if s == "" || len(s) > 5 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
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

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64]
	}
	return s
}
