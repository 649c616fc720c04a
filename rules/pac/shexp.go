package pac

import (
	"fmt"
	"regexp"
	"strings"
)

// shExpMatch has the browsers' semantics: the pattern becomes the regular expression
// '^' + pattern + '$' after '.' → '\.', '*' → '.*' and '?' → '.', so '*' and '?' are
// wildcards and any other regex syntax ((a|b), [ab], +) keeps working, as real PAC files
// expect. The regular expression runs on Go's linear-time engine, never on a
// backtracking one, so no pattern can make a built-in run past the deadline.
//
// Plain glob patterns (no regex syntax) skip the regex engine altogether.

// shexpCache holds compiled patterns for one runtime (single goroutine, no locking).
type shexpCache struct {
	m map[string]*regexp.Regexp
}

const shexpCacheMax = 512

// regexMeta are the characters that make a pattern more than a glob once '.', '*' and
// '?' have been translated.
const regexMeta = `\^$+()[]{}|`

func (c *shexpCache) match(url, pattern string) (bool, error) {
	if !strings.ContainsAny(pattern, regexMeta) && globSafe(url) {
		return globMatch(url, pattern), nil
	}
	re, err := c.compile(pattern)
	if err != nil {
		return false, err
	}
	return re.MatchString(url), nil
}

func (c *shexpCache) compile(pattern string) (*regexp.Regexp, error) {
	if re, ok := c.m[pattern]; ok {
		return re, nil
	}
	re, err := regexp.Compile(shexpToRegexp(pattern))
	if err != nil {
		return nil, fmt.Errorf("shExpMatch: invalid pattern %q: %w", pattern, err)
	}
	if c.m == nil || len(c.m) >= shexpCacheMax {
		c.m = make(map[string]*regexp.Regexp)
	}
	c.m[pattern] = re
	return re, nil
}

// shexpToRegexp performs the browsers' three replacements, in their order.
func shexpToRegexp(p string) string {
	p = strings.ReplaceAll(p, ".", `\.`)
	p = strings.ReplaceAll(p, "*", ".*")
	p = strings.ReplaceAll(p, "?", ".")
	return "^" + jsClasses(p) + "$"
}

// jsClasses rewrites the two character classes that JavaScript and RE2 read
// differently: in JavaScript "[]" matches nothing and "[^]" any character, while RE2
// takes a ']' right after '[' or '[^' as a literal. Everything else is left alone.
func jsClasses(p string) string {
	if !strings.Contains(p, "[]") && !strings.Contains(p, "[^]") {
		return p
	}
	var b strings.Builder
	inClass := false
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '\\' && i+1 < len(p):
			b.WriteByte(c)
			i++
			b.WriteByte(p[i])
			continue
		case inClass:
			if c == ']' {
				inClass = false
			}
		case c == '[' && strings.HasPrefix(p[i:], "[]"):
			b.WriteString(`[^\x00-\x{10FFFF}]`)
			i++
			continue
		case c == '[' && strings.HasPrefix(p[i:], "[^]"):
			b.WriteString(`(?s:.)`)
			i += 2
			continue
		case c == '[':
			inClass = true
		}
		b.WriteByte(c)
	}
	return b.String()
}

// globSafe reports whether the glob fast path gives the regex answer for this subject:
// ASCII (so '?' is one UTF-16 unit) and no line terminator (which '.' does not match).
func globSafe(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 0x80 || c == '\n' || c == '\r' {
			return false
		}
	}
	return true
}

// globMatch matches '*' (any run) and '?' (one byte), everything else literally. It is
// the classic linear backtrack-to-last-star algorithm: O(len(s)*len(p)) at worst.
func globMatch(s, p string) bool {
	si, pi := 0, 0
	star, mark := -1, 0
	for si < len(s) {
		switch {
		case pi < len(p) && (p[pi] == '?' || p[pi] == s[si]) && p[pi] != '*':
			si++
			pi++
		case pi < len(p) && p[pi] == '*':
			star, mark = pi, si
			pi++
		case star >= 0:
			pi = star + 1
			mark++
			si = mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}
