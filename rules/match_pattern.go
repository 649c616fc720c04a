package rules

import (
	"fmt"
	"net/netip"
	"strings"
)

// patternMatcher is one rule of the pattern form: HOST[:PORT], where HOST is a host
// glob, an address, a prefix (IPv6 in brackets when a port follows) or `*` (anything,
// also a destination known only by address), and PORT a port or a range.
type patternMatcher struct {
	any    bool         // HOST is `*`
	glob   string       // a host glob (canonical), or ""
	prefix netip.Prefix // valid when HOST is an address or prefix
	ports  portRange    // {0,0}: any port
}

var _ matcher = (*patternMatcher)(nil)

// parsePattern parses HOST[:PORT].
func parsePattern(s string) (*patternMatcher, error) {
	bad := func(format string, a ...any) error {
		return &Error{Code: CodeBadPattern, Msg: fmt.Sprintf("pattern %q: ", s) + fmt.Sprintf(format, a...)}
	}
	t := strings.TrimSpace(s)
	if t == "" {
		return nil, bad("empty")
	}
	host, port := t, ""
	switch {
	case t[0] == '[':
		end := strings.IndexByte(t, ']')
		if end < 0 {
			return nil, bad("missing ']'")
		}
		host, port = t[1:end], t[end+1:]
		if port != "" {
			if port[0] != ':' {
				return nil, bad("unexpected %q after ']'", port)
			}
			port = port[1:]
			if port == "" {
				return nil, bad("empty port after ':'")
			}
		}
		if !strings.Contains(host, ":") {
			return nil, bad("brackets are only for IPv6 addresses")
		}
	case strings.Count(t, ":") > 1:
		// An unbracketed IPv6 address or prefix: no port can follow.
	default:
		if i := strings.LastIndexByte(t, ':'); i >= 0 {
			host, port = t[:i], t[i+1:]
			if port == "" {
				return nil, bad("empty port after ':'")
			}
		}
	}
	m := &patternMatcher{}
	if port != "" {
		r, err := parsePortRange(port)
		if err != nil {
			return nil, bad("%v", err)
		}
		m.ports = r
	}
	switch {
	case host == "":
		return nil, bad("empty host (use * for any host)")
	case host == "*":
		m.any = true
	case strings.ContainsAny(host, ":/") || isIPv4Literal(host):
		p, err := parsePrefix(host)
		if err != nil {
			return nil, bad("%v", err)
		}
		m.prefix = p
	default:
		g, err := parseHostGlob(host)
		if err != nil {
			return nil, bad("%v", err)
		}
		if ok, prefix := ipv4Glob(g); ok {
			if prefix != "" && port != "" {
				prefix += ":" + port
			}
			return nil, bad("an IPv4 address pattern, and a host that is an address is matched by address, never by name: write a prefix instead%s", hint("", prefix))
		}
		if g == "*" { // "*." is "*": a trailing dot is ignored
			m.any = true
			break
		}
		m.glob = g
	}
	return m, nil
}

// isIPv4Literal reports whether s looks like a dotted-quad address (digits and dots
// only), which must then parse as one: "10.0.0.256" is a mistake, not a host name.
func isIPv4Literal(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c != '.' && (c < '0' || c > '9') {
			return false
		}
	}
	return strings.Contains(s, ".")
}

func (m *patternMatcher) Match(v *view) bool {
	if m.ports.lo != 0 && (v.port < m.ports.lo || v.port > m.ports.hi) {
		return false
	}
	switch {
	case m.any:
		return v.host != "" || v.addr.IsValid()
	case m.glob != "":
		return v.host != "" && globMatch(m.glob, v.host)
	default:
		return v.addr.IsValid() && m.prefix.Contains(v.addr)
	}
}

func (m *patternMatcher) String() string {
	var h string
	switch {
	case m.any:
		h = "*"
	case m.glob != "":
		h = m.glob
	case m.prefix.Addr().Is6() && m.ports.lo != 0:
		h = "[" + prefixString(m.prefix) + "]"
	default:
		h = prefixString(m.prefix)
	}
	if m.ports.lo != 0 {
		return h + ":" + m.ports.String()
	}
	return h
}

// prefixString writes a host prefix as a bare address.
func prefixString(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

// covers reports whether m matches every flow that o matches.
func (m *patternMatcher) covers(o *patternMatcher) bool {
	if m.ports.lo != 0 && (o.ports.lo == 0 || o.ports.lo < m.ports.lo || o.ports.hi > m.ports.hi) {
		return false
	}
	switch {
	case m.any:
		return true
	case m.glob != "":
		return o.glob != "" && globCovers(m.glob, o.glob)
	default:
		return o.prefix.IsValid() && m.prefix.Bits() <= o.prefix.Bits() && m.prefix.Contains(o.prefix.Addr())
	}
}
