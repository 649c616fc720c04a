package rules

import (
	"fmt"
	"strconv"
	"strings"
)

// portRange is an inclusive range of destination ports.
type portRange struct{ lo, hi uint16 }

func (r portRange) String() string {
	if r.lo == r.hi {
		return strconv.Itoa(int(r.lo))
	}
	return fmt.Sprintf("%d-%d", r.lo, r.hi)
}

// portMatcher matches the destination port against comma-separated ports and ranges.
type portMatcher struct {
	ranges []portRange
}

var _ matcher = (*portMatcher)(nil)

func newPortMatcher(s string) (*portMatcher, error) {
	m := &portMatcher{}
	for i, e := range strings.Split(s, ",") {
		r, err := parsePortRange(strings.TrimSpace(e))
		if err != nil {
			return nil, &Error{Code: CodeBadPort, Msg: fmt.Sprintf("port entry %d: %v", i+1, err)}
		}
		m.ranges = append(m.ranges, r)
	}
	return m, nil
}

func parsePort(s string) (uint16, error) {
	if s == "" || len(s) > 5 {
		return 0, fmt.Errorf("%q is not a port (1-65535)", s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%q is not a port (1-65535)", s)
		}
	}
	n, _ := strconv.Atoi(s)
	if n < 1 || n > 65535 {
		return 0, fmt.Errorf("%q is not a port (1-65535)", s)
	}
	return uint16(n), nil
}

// parsePortRange parses `N` or `A-B` with 1 <= A <= B <= 65535.
func parsePortRange(s string) (portRange, error) {
	a, b, isRange := strings.Cut(s, "-")
	lo, err := parsePort(strings.TrimSpace(a))
	if err != nil {
		return portRange{}, err
	}
	if !isRange {
		return portRange{lo, lo}, nil
	}
	hi, err := parsePort(strings.TrimSpace(b))
	if err != nil {
		return portRange{}, err
	}
	if hi < lo {
		return portRange{}, fmt.Errorf("range %q runs backwards", s)
	}
	return portRange{lo, hi}, nil
}

func (m *portMatcher) Match(v *view) bool {
	if v.port == 0 {
		return false
	}
	for _, r := range m.ranges {
		if v.port >= r.lo && v.port <= r.hi {
			return true
		}
	}
	return false
}

func (m *portMatcher) String() string {
	s := make([]string, len(m.ranges))
	for i, r := range m.ranges {
		s[i] = r.String()
	}
	return strings.Join(s, ",")
}
