package rules

import (
	"fmt"
	"strings"
	"testing"
)

// TestMatchesName: of the pattern rules only a host glob matches on the name (the relay
// then hands an exit the name, not the address it checked); a domain rule always does,
// a cidr rule never.
func TestMatchesName(t *testing.T) {
	tests := []struct {
		pattern string
		want    bool
	}{
		{"*.corp.example", true},
		{"*.corp.example:443", true},
		{"api.example.com:8000-8999", true},
		{"Host.Example.", true},
		{"*", false},
		{"*:443", false},
		{"10.0.0.0/8", false},
		{"10.1.2.3:80", false},
		{"10.1.2.3/32:80", false},
		{"fd00::/8", false},
		{"[fd00::1]:443", false},
		{"[fd00::/8]:443-445", false},
	}
	var b strings.Builder
	b.WriteString("rules:\n")
	for _, tc := range tests {
		fmt.Fprintf(&b, "  - pattern: %q\n    route: proxy\n", tc.pattern)
	}
	pol := mustParse(t, b.String(), LoadOptions{})
	for i, tc := range tests {
		if got := pol.MatchesName(i + 1); got != tc.want {
			t.Errorf("MatchesName(%q) = %v, want %v", tc.pattern, got, tc.want)
		}
	}
	dim := mustParse(t, "rules:\n  - domain: a.example\n    action: proxy\n  - cidr: 10.0.0.0/8\n    action: proxy\n", LoadOptions{})
	if !dim.MatchesName(1) || dim.MatchesName(2) {
		t.Errorf("MatchesName(domain, cidr) = %v, %v; want true, false", dim.MatchesName(1), dim.MatchesName(2))
	}
}
