package rules

import (
	"fmt"
	"strings"
)

// labelMatcher matches a workload label: `key=value` exactly, `key` by presence.
type labelMatcher struct {
	key, val string
	presence bool
}

var _ matcher = (*labelMatcher)(nil)

func newLabelMatcher(s string) (*labelMatcher, error) {
	key, val, hasVal := strings.Cut(s, "=")
	if key == "" {
		return nil, &Error{Code: CodeBadLabel, Msg: fmt.Sprintf("label %q: empty key (want key=value or key)", s)}
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c <= ' ' || c == 0x7f || c == ',' {
			return nil, &Error{Code: CodeBadLabel, Msg: fmt.Sprintf("label %q: key may not contain spaces, control characters or commas", s)}
		}
	}
	for i := 0; i < len(val); i++ {
		if c := val[i]; c < ' ' || c == 0x7f {
			return nil, &Error{Code: CodeBadLabel, Msg: fmt.Sprintf("label %q: value may not contain control characters", s)}
		}
	}
	return &labelMatcher{key: key, val: val, presence: !hasVal}, nil
}

func (m *labelMatcher) Match(v *view) bool {
	got, ok := v.labels[m.key]
	return ok && (m.presence || got == m.val)
}

func (m *labelMatcher) String() string {
	if m.presence {
		return m.key
	}
	return m.key + "=" + m.val
}

// covers reports whether m matches every workload that o matches.
func (m *labelMatcher) covers(o *labelMatcher) bool {
	return m.key == o.key && (m.presence || (!o.presence && m.val == o.val))
}
