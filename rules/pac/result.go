package pac

import (
	"net/netip"
	"strconv"
	"strings"
)

// ParseResult maps a FindProxyForURL return value to a route, with the table of SPEC
// §4.3. Only the first ';'-separated directive counts. As in the browsers the keyword
// is case-insensitive and separated from its argument by spaces or tabs:
//
//	DIRECT                          → direct
//	DENY, BLOCK                     → deny
//	CLIENT, CLUSTER, GATEWAY        → client, direct, gateway
//	PROXY client|gateway|cluster    → that route
//	PROXY|HTTPS|SOCKS|SOCKS5 h[:p]  → client, Proxy http://h:p, https://h:p, socks5://h:p
//	"", or anything unrecognised    → "" (the file's default)
//
// A missing port takes the scheme's default as in Chromium (80, 443, 1080). A proxy
// host must be a DNS name or an IP literal (IPv6 in brackets); anything else (user
// info, a path) makes the directive unrecognised, so a script cannot smuggle text into
// the proxy URL. A directive longer than maxDirective is unrecognised, and Directive
// keeps its first maxDirective bytes and "…". ParseResult never fails: a script
// failure is decided by Eval.
func ParseResult(v string) Result {
	if i := strings.IndexByte(v, ';'); i >= 0 {
		v = v[:i]
	}
	d := strings.Trim(v, " \t\r\n")
	r := Result{Directive: d}
	if d == "" {
		return r
	}
	if len(d) > maxDirective {
		// Longer than any valid directive: unrecognised, and cut for the record.
		r.Directive = strings.ToValidUTF8(d[:maxDirective], "") + "…"
		return r
	}
	kw, arg := d, ""
	if i := strings.IndexAny(d, " \t\r\n"); i >= 0 {
		kw, arg = d[:i], strings.Trim(d[i:], " \t\r\n")
	}
	if strings.ContainsAny(arg, " \t\r\n") {
		return r // more than one argument
	}
	switch strings.ToUpper(kw) {
	case "DIRECT":
		if arg == "" {
			r.Exit = "direct"
		}
	case "DENY", "BLOCK":
		if arg == "" {
			r.Exit = "deny"
		}
	case "CLIENT":
		if arg == "" {
			r.Exit = "client"
		}
	case "CLUSTER":
		if arg == "" {
			r.Exit = "direct"
		}
	case "GATEWAY":
		if arg == "" {
			r.Exit = "gateway"
		}
	case "PROXY":
		switch strings.ToLower(arg) {
		case "client":
			r.Exit = "client"
			return r
		case "gateway":
			r.Exit = "gateway"
			return r
		case "cluster":
			r.Exit = "direct"
			return r
		}
		r.setProxy("http", arg, 80)
	case "HTTPS":
		r.setProxy("https", arg, 443)
	case "SOCKS", "SOCKS5":
		r.setProxy("socks5", arg, 1080)
	}
	return r
}

func (r *Result) setProxy(scheme, hostport string, defPort int) {
	host, port, ok := splitHostPort(hostport, defPort)
	if !ok {
		return
	}
	r.Exit = "client"
	r.Proxy = scheme + "://" + host + ":" + strconv.Itoa(port)
}

// splitHostPort accepts host, host:port, [v6] and [v6]:port. The host comes back
// lower-cased, IPv6 in brackets.
func splitHostPort(s string, defPort int) (host string, port int, ok bool) {
	if s == "" {
		return "", 0, false
	}
	rest := ""
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", 0, false
		}
		a, err := netip.ParseAddr(s[1:end])
		if err != nil || !a.Is6() || a.Zone() != "" {
			return "", 0, false
		}
		host, rest = "["+a.String()+"]", s[end+1:]
	} else {
		h := s
		if i := strings.LastIndexByte(s, ':'); i >= 0 {
			h, rest = s[:i], s[i:]
		}
		if !validHostName(h) {
			return "", 0, false
		}
		host = strings.ToLower(h)
	}
	port = defPort
	if rest != "" {
		if rest[0] != ':' || len(rest) < 2 || len(rest) > 6 {
			return "", 0, false
		}
		p := 0
		for _, c := range rest[1:] {
			if c < '0' || c > '9' {
				return "", 0, false
			}
			p = p*10 + int(c-'0')
		}
		if p < 1 || p > 65535 {
			return "", 0, false
		}
		port = p
	}
	return host, port, true
}

// validHostName accepts DNS names (letters, digits, '-', '_', dot-separated non-empty
// labels, at most 253 bytes, an optional final dot) and IPv4 literals.
func validHostName(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	label := 0
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c == '.':
			if label == 0 {
				return false
			}
			label = 0
			continue
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return false
		}
		label++
		if label > 63 {
			return false
		}
	}
	return label > 0
}

// maxDirective bounds Result.Directive, which decision records carry: a valid
// directive is at most about 270 bytes (a keyword, a 253-byte host name and a port).
const maxDirective = 512
