package rules

import "strings"

// globMatch reports whether s matches the whole of pattern, where `*` matches any run
// of bytes (including none, and including `/` and `.`) and `?` exactly one byte. Every
// other byte matches itself. It runs in O(len(pattern)·len(s)) worst case without
// allocating (the classic single-backtrack algorithm).
func globMatch(pattern, s string) bool {
	px, sx := 0, 0
	nextPx, nextSx := -1, -1
	for px < len(pattern) || sx < len(s) {
		if px < len(pattern) {
			switch c := pattern[px]; c {
			case '*':
				nextPx, nextSx = px, sx+1
				px++
				continue
			case '?':
				if sx < len(s) {
					px++
					sx++
					continue
				}
			default:
				if sx < len(s) && s[sx] == c {
					px++
					sx++
					continue
				}
			}
		}
		if nextSx > 0 && nextSx <= len(s) {
			px, sx = nextPx, nextSx
			continue
		}
		return false
	}
	return true
}

// hasWild reports whether a glob contains a wildcard.
func hasWild(g string) bool { return strings.ContainsAny(g, "*?") }

// literalPrefix is the part of a glob before its first wildcard.
func literalPrefix(g string) string {
	if i := strings.IndexAny(g, "*?"); i >= 0 {
		return g[:i]
	}
	return g
}

// literalSuffix is the part of a glob after its last wildcard.
func literalSuffix(g string) string {
	if i := strings.LastIndexAny(g, "*?"); i >= 0 {
		return g[i+1:]
	}
	return g
}

// globCovers reports whether every string that b matches is also matched by a, as far
// as can be told cheaply and soundly: true means b can never match where a does not;
// false means "not shown". Used by lint to find rules that can never win.
func globCovers(a, b string) bool {
	if a == b {
		return true
	}
	if !hasWild(b) {
		return globMatch(a, b)
	}
	// a = "P*" covers any b whose literal prefix starts with P.
	if i := strings.IndexAny(a, "*?"); i == len(a)-1 && a[i] == '*' {
		if strings.HasPrefix(literalPrefix(b), a[:i]) {
			return true
		}
	}
	// a = "*S" covers any b whose literal suffix ends with S.
	if j := strings.LastIndexAny(a, "*?"); j == 0 && a[0] == '*' && !hasWild(a[1:]) {
		if strings.HasSuffix(literalSuffix(b), a[1:]) {
			return true
		}
	}
	return false
}
