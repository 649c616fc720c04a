package pac

import (
	"fmt"
	"regexp"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// shExpMatch has the browsers' semantics: the pattern becomes the regular expression
// '^' + pattern + '$' after '.' → '\.', '*' → '.*' and '?' → '.', so '*' and '?' are
// wildcards and any other regex syntax ((a|b), [ab], +) keeps working, as real PAC files
// expect. The regular expression runs on Go's linear-time engine, never on a
// backtracking one, so no pattern can make a built-in run past the deadline.
//
// Most real patterns are globs, perhaps with character classes and a group of
// alternatives ("*.(foo|bar).com", "api[0-9].example"). Those are matched by a small
// glob matcher instead of the regex engine, which is several times faster; the regex
// is the reference and the tests check the two agree.

// shexpCache holds compiled patterns for one runtime (single goroutine, no locking).
type shexpCache struct {
	m map[string]*shexp
}

type shexp struct {
	re   *regexp.Regexp
	alts [][]gtok // nil: no glob form, use re
}

const (
	shexpCacheMax    = 512
	maxCachedPattern = 1 << 10
	maxAlts          = 64
)

func (c *shexpCache) match(url, pattern string) (bool, error) {
	if !strings.ContainsAny(pattern, globMeta) && globSafe(url) && globSafe(pattern) {
		return globMatch(url, pattern), nil
	}
	x, err := c.compile(pattern)
	if err != nil {
		return false, err
	}
	if x.alts != nil && globSafe(url) {
		for _, a := range x.alts {
			if tokMatch(url, a) {
				return true, nil
			}
		}
		return false, nil
	}
	return x.reMatch(url), nil
}

// reMatch is the regex's answer for a subject: astral characters count as their two
// UTF-16 units, as in JavaScript (see utf16Units).
func (x *shexp) reMatch(s string) bool {
	return x.re.MatchString(utf16Units(s))
}

// globMeta are the characters that make a pattern more than a plain glob.
const globMeta = `\^$+()[]{}|`

func (c *shexpCache) compile(pattern string) (*shexp, error) {
	if x, ok := c.m[pattern]; ok {
		return x, nil
	}
	re, err := regexp.Compile(shexpToRegexp(pattern))
	if err != nil {
		return nil, fmt.Errorf("shExpMatch: invalid pattern %q: %w", pattern, err)
	}
	x := &shexp{re: re, alts: parseGlob(pattern)}
	if len(pattern) > maxCachedPattern {
		return x, nil // PAC patterns are short: a long one is not worth its memory
	}
	if c.m == nil || len(c.m) >= shexpCacheMax {
		c.m = make(map[string]*shexp)
	}
	c.m[pattern] = x
	return x, nil
}

// shexpToRegexp performs the browsers' three replacements, in their order.
func shexpToRegexp(p string) string {
	p = strings.ReplaceAll(p, ".", `\.`)
	p = strings.ReplaceAll(p, "*", ".*")
	p = strings.ReplaceAll(p, "?", ".")
	return "^" + jsRegexp(p) + "$"
}

// jsDot is JavaScript's '.' for RE2: any character but a line terminator. RE2's own
// '.' excludes only \n, so "a?b" matched "a\rb", which no browser's shExpMatch does.
const jsDot = `[^\n\r\x{2028}\x{2029}]`

// jsRegexp rewrites what JavaScript (a RegExp without the u flag) and RE2 read
// differently in a translated pattern: '.' outside a class is jsDot; in JavaScript
// "[]" matches nothing and "[^]" any character, while RE2 takes a ']' right after '['
// or '[^' as a literal; and an astral character is two UTF-16 units to JavaScript,
// which a '?' matches one at a time, so it becomes the two runes utf16Units makes of
// it in the subject. Everything else is left alone.
func jsRegexp(p string) string {
	if !strings.ContainsAny(p, ".[") && !hasAstral(p) {
		return p
	}
	var b strings.Builder
	inClass := false
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c >= 0xf0 { // an astral character, written as its two units
			r, n := utf8.DecodeRuneInString(p[i:])
			if n == 4 {
				writeUnits(&b, r)
				i += n - 1
				continue
			}
		}
		switch {
		case c == '\\' && i+1 < len(p):
			if p[i+1] >= 0xf0 {
				// An identity escape of an astral character's first unit: both
				// units stand for themselves.
				continue
			}
			b.WriteByte(c)
			i++
			b.WriteByte(p[i])
			continue
		case inClass:
			if c == ']' {
				inClass = false
			}
		case c == '.':
			b.WriteString(jsDot)
			continue
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

// hasAstral reports whether s has a character outside the Basic Multilingual Plane
// (4 bytes in UTF-8).
func hasAstral(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0xf0 {
			return true
		}
	}
	return false
}

// unitBase is where utf16Units puts UTF-16 surrogates: U+F0000 + (unit - 0xD800), in a
// private use plane. Those runes are astral themselves, so none of them is left in a
// converted string but as a unit.
const unitBase = 0xf0000 - 0xd800

// utf16Units returns s with every astral character replaced by two runes, one per
// UTF-16 unit (its surrogates, moved by unitBase), so that RE2, which matches runes,
// counts units as JavaScript does: '?' matches one of the two, "??" both. s itself
// when it has none (every real host name).
func utf16Units(s string) string {
	if !hasAstral(s) {
		return s
	}
	var b strings.Builder
	b.Grow(2 * len(s))
	for _, r := range s {
		if r > 0xffff {
			writeUnits(&b, r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func writeUnits(b *strings.Builder, r rune) {
	hi, lo := utf16.EncodeRune(r)
	b.WriteRune(unitBase + hi)
	b.WriteRune(unitBase + lo)
}

// globSafe reports whether the glob matchers give the regex answer for this subject:
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
// the classic backtrack-to-last-star algorithm: O(len(s)*len(p)) at worst.
func globMatch(s, p string) bool {
	si, pi := 0, 0
	star, mark := -1, 0
	for si < len(s) {
		switch {
		case pi < len(p) && p[pi] != '*' && (p[pi] == '?' || p[pi] == s[si]):
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

// gtok is one element of an extended glob.
type gtok struct {
	kind byte // 'l' literal, '?' any byte, '*' any run, '[' class
	c    byte
	set  *[128]bool
}

func (t gtok) one(c byte) bool {
	switch t.kind {
	case 'l':
		return c == t.c
	case '?':
		return true
	case '[':
		return t.set[c&0x7f]
	}
	return false
}

// tokMatch is globMatch over tokens (the subject is ASCII).
func tokMatch(s string, p []gtok) bool {
	si, pi := 0, 0
	star, mark := -1, 0
	for si < len(s) {
		switch {
		case pi < len(p) && p[pi].kind != '*' && p[pi].one(s[si]):
			si++
			pi++
		case pi < len(p) && p[pi].kind == '*':
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
	for pi < len(p) && p[pi].kind == '*' {
		pi++
	}
	return pi == len(p)
}

// parseGlob returns the alternatives of a pattern made of literals, '*', '?', simple
// character classes and groups of plain alternatives, or nil when the pattern uses
// anything else (then the regex decides). Only ASCII patterns qualify.
func parseGlob(p string) [][]gtok {
	alts := [][]gtok{nil}
	for i := 0; i < len(p); i++ {
		c := p[i]
		var add [][]gtok // what this element appends: one sequence per alternative
		switch c {
		case '*', '?':
			add = [][]gtok{{{kind: c}}}
		case '[':
			t, n := parseClass(p[i:])
			if n == 0 {
				return nil
			}
			add = [][]gtok{{t}}
			i += n - 1
		case '(':
			end := strings.IndexByte(p[i:], ')')
			if end < 0 {
				return nil
			}
			for _, alt := range strings.Split(p[i+1:i+end], "|") {
				sub := parseGlob(alt)
				if len(sub) != 1 {
					return nil // nested groups or unsupported syntax
				}
				add = append(add, sub[0])
			}
			i += end
		default:
			if c >= 0x80 || strings.IndexByte(globMeta, c) >= 0 {
				return nil
			}
			add = [][]gtok{{{kind: 'l', c: c}}}
		}
		if len(alts)*len(add) > maxAlts {
			return nil
		}
		next := make([][]gtok, 0, len(alts)*len(add))
		for _, a := range alts {
			for _, b := range add {
				next = append(next, append(append([]gtok(nil), a...), b...))
			}
		}
		alts = next
	}
	return alts
}

// parseClass parses "[...]" at the start of p: plain ASCII characters and ranges, an
// optional leading '^'. It returns the bytes consumed, 0 when the class needs the regex
// engine (escapes, '.', '*' or '?' inside, which the translation rewrites, an empty or
// unterminated class, a reversed range).
func parseClass(p string) (gtok, int) {
	end := strings.IndexByte(p[1:], ']')
	if end <= 0 {
		return gtok{}, 0
	}
	body := p[1 : 1+end]
	neg := false
	if body[0] == '^' {
		neg, body = true, body[1:]
		if body == "" {
			return gtok{}, 0
		}
	}
	var set [128]bool
	for i := 0; i < len(body); i++ {
		c := body[i]
		if c >= 0x80 || strings.IndexByte(`\[.*?`, c) >= 0 {
			return gtok{}, 0
		}
		if i+2 < len(body) && body[i+1] == '-' {
			hi := body[i+2]
			if hi >= 0x80 || hi < c || strings.IndexByte(`\[.*?`, hi) >= 0 {
				return gtok{}, 0
			}
			for x := c; x <= hi; x++ {
				set[x] = true
			}
			i += 2
			continue
		}
		set[c] = true
	}
	if neg {
		for i := range set {
			set[i] = !set[i]
		}
	}
	return gtok{kind: '[', set: &set}, end + 2
}
