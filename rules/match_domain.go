package rules

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// domainMatcher matches the destination hostname against comma-separated globs,
// case-insensitively, ignoring a trailing dot. `*.example.com` matches names under
// example.com but not example.com itself.
type domainMatcher struct {
	globs []string
}

var _ matcher = (*domainMatcher)(nil)

func newDomainMatcher(s string) (*domainMatcher, error) {
	m := &domainMatcher{}
	for i, g := range strings.Split(s, ",") {
		g, err := parseHostGlob(strings.TrimSpace(g))
		if err == nil {
			if ok, prefix := ipv4Glob(g); ok {
				err = fmt.Errorf("%q is an IPv4 address or address pattern, and a host that is an address is matched by address, never by name: use a cidr rule%s", g, hint("cidr: ", prefix))
			}
		}
		if err != nil {
			return nil, &Error{Code: CodeBadGlob, Msg: fmt.Sprintf("domain entry %d: %v", i+1, err)}
		}
		m.globs = append(m.globs, g)
	}
	return m, nil
}

// ipv4Glob reports whether a host glob (canonical) is shaped like an IPv4 address or
// a pattern of them: digits, dots and wildcards only, with a digit and a dot. Such a
// glob is written for addresses and never matches one: a host that parses as an
// address becomes the flow's address (splitHost). What names it can match end in an
// all-numeric label, which no DNS name does, or are accidents ("10.1.*" matches
// "10.1.example.com"). prefix is the prefix it means when that is plain: the address
// itself ("10.1.2.3"), or leading octets and a final "*" ("10.1.*" is 10.1.0.0/16);
// "" otherwise.
func ipv4Glob(g string) (ok bool, prefix string) {
	digit := false
	for i := 0; i < len(g); i++ {
		switch c := g[i]; {
		case c >= '0' && c <= '9':
			digit = true
		case c == '.', c == '*', c == '?':
		default:
			return false, ""
		}
	}
	if !digit || !strings.Contains(g, ".") {
		return false, ""
	}
	if a, err := netip.ParseAddr(g); err == nil && a.Is4() {
		return true, a.String()
	}
	octets, ok := strings.CutSuffix(g, ".*")
	if !ok {
		return true, ""
	}
	parts := strings.Split(octets, ".")
	if len(parts) > 3 {
		return true, ""
	}
	var b [4]byte
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 8)
		if err != nil || len(p) > 1 && p[0] == '0' {
			return true, ""
		}
		b[i] = byte(n)
	}
	return true, netip.PrefixFrom(netip.AddrFrom4(b), 8*len(parts)).String()
}

// hint is " (what+prefix)" for an error message, or "" without a prefix.
func hint(what, prefix string) string {
	if prefix == "" {
		return ""
	}
	return " (" + what + prefix + ")"
}

// parseHostGlob validates a hostname glob and returns its canonical form (lower case,
// no trailing dot).
func parseHostGlob(g string) (string, error) {
	if g == "" {
		return "", fmt.Errorf("empty name")
	}
	if len(g) > maxHostLen {
		return "", fmt.Errorf("%q is longer than %d bytes", g[:32]+"...", maxHostLen)
	}
	g = strings.ToLower(strings.TrimSuffix(g, "."))
	if g == "" || g[0] == '.' {
		return "", fmt.Errorf("%q: a name cannot start with a dot (for a domain and everything under it write *.%s)", g, strings.TrimLeft(g, "."))
	}
	if strings.Contains(g, "..") || strings.HasSuffix(g, ".") {
		return "", fmt.Errorf("%q: empty label", g)
	}
	for i := 0; i < len(g); i++ {
		c := g[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '*' || c == '?') {
			return "", fmt.Errorf("%q: character %q at offset %d is not allowed in a host name glob (IDNs are written in punycode)", g, c, i)
		}
	}
	return g, nil
}

func (m *domainMatcher) Match(v *view) bool {
	if v.host == "" {
		return false
	}
	for _, g := range m.globs {
		if globMatch(g, v.host) {
			return true
		}
	}
	return false
}

func (m *domainMatcher) String() string { return strings.Join(m.globs, ",") }
