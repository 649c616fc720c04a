package rules

import (
	"fmt"
	"strings"
)

// processMatcher matches `a|b|c` alternatives (each may be a glob) against the
// connecting process's comm, executable basename and argv[0] basename.
type processMatcher struct {
	alts []string
}

var _ matcher = (*processMatcher)(nil)

func newProcessMatcher(s string) (*processMatcher, error) {
	m := &processMatcher{}
	for i, a := range strings.Split(s, "|") {
		a = strings.TrimSpace(a)
		if a == "" {
			return nil, &Error{Code: CodeBadGlob, Msg: fmt.Sprintf("process %q: alternative %d is empty", s, i+1)}
		}
		for j := 0; j < len(a); j++ {
			if c := a[j]; c < ' ' || c == 0x7f || c == '/' {
				return nil, &Error{Code: CodeBadGlob, Msg: fmt.Sprintf("process %q: alternative %d %q: a process name has no '/' or control characters (use the basename)", s, i+1, a)}
			}
		}
		m.alts = append(m.alts, a)
	}
	return m, nil
}

func (m *processMatcher) Match(v *view) bool {
	if !v.proc.Known {
		return false
	}
	for _, a := range m.alts {
		if matchName(a, v.proc.Comm) || matchName(a, v.proc.Exe) || matchName(a, v.proc.Argv0) {
			return true
		}
	}
	return false
}

func matchName(glob, name string) bool { return name != "" && globMatch(glob, name) }

func (m *processMatcher) String() string { return strings.Join(m.alts, "|") }
