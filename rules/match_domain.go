package rules

import (
	"fmt"
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
		if err != nil {
			return nil, &Error{Code: CodeBadGlob, Msg: fmt.Sprintf("domain entry %d: %v", i+1, err)}
		}
		m.globs = append(m.globs, g)
	}
	return m, nil
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
