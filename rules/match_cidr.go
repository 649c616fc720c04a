package rules

import (
	"fmt"
	"net/netip"
	"strings"
)

// cidrMatcher matches the destination address against comma-separated prefixes, IPv4
// and IPv6; a bare address is a host prefix.
type cidrMatcher struct {
	prefixes []netip.Prefix
}

var _ matcher = (*cidrMatcher)(nil)

func newCIDRMatcher(s string) (*cidrMatcher, error) {
	m := &cidrMatcher{}
	for i, e := range strings.Split(s, ",") {
		p, err := parsePrefix(strings.TrimSpace(e))
		if err != nil {
			return nil, &Error{Code: CodeBadCIDR, Msg: fmt.Sprintf("cidr entry %d: %v", i+1, err)}
		}
		m.prefixes = append(m.prefixes, p)
	}
	return m, nil
}

// parsePrefix parses a prefix or a bare address (a host prefix). Host bits after the
// prefix length are cleared; IPv4-mapped IPv6 prefixes are refused as ambiguous.
func parsePrefix(s string) (netip.Prefix, error) {
	if s == "" {
		return netip.Prefix{}, fmt.Errorf("empty prefix")
	}
	if strings.Contains(s, "%") {
		return netip.Prefix{}, fmt.Errorf("%q: zones are not allowed", s)
	}
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is neither an address nor a prefix", s)
		}
		if a.Is4In6() {
			return netip.Prefix{}, fmt.Errorf("%q: write IPv4-mapped addresses as IPv4", s)
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a valid prefix", s)
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%q: write IPv4-mapped prefixes as IPv4", s)
	}
	return p.Masked(), nil
}

func (m *cidrMatcher) Match(v *view) bool {
	if !v.addr.IsValid() {
		return false
	}
	for _, p := range m.prefixes {
		if p.Contains(v.addr) {
			return true
		}
	}
	return false
}

func (m *cidrMatcher) String() string {
	s := make([]string, len(m.prefixes))
	for i, p := range m.prefixes {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}
