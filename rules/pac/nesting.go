package pac

import (
	"bytes"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dop251/goja/ast"
	"github.com/dop251/goja/file"
)

// maxNesting bounds how deeply a script's brackets ( [ { and template substitutions
// ${ nest. goja's parser recurses in Go for each level, some 2 KB of stack each, and a
// goroutine's stack is bounded (1 GB): "var a = " and half a million [ ended the
// process with a fatal stack overflow at Compile, which no recover can catch. So the
// source is scanned before goja parses it. Real PAC files nest a few levels deep.
const maxNesting = 1000

// maxDepth bounds how deeply a script's syntax tree nests (expressions and statements,
// brackets or not). goja's compiler takes time in the square of a chain's length: one
// condition of 16000 || terms took 1.4 s to compile, a megabyte of "1 + 1 + ..." some
// five minutes, during which the reload waited. A chain of maxDepth terms compiles in
// about a tenth of a second; real PAC files nest a few dozen levels.
const maxDepth = 5000

// checkDepth refuses a parsed script whose tree nests deeper than maxDepth, naming the
// line and column of the node past the bound.
func checkDepth(prog *ast.Program) *CompileError {
	var deep ast.Node
	walkASTDepth(prog, func(n ast.Node, depth int) bool {
		if deep != nil {
			return false
		}
		if depth > maxDepth {
			deep = n
			return false
		}
		return true
	})
	if deep == nil {
		return nil
	}
	p := prog.File.Position(int(deep.Idx0()))
	ce := &CompileError{Code: CodeScript, Line: p.Line, Column: p.Column,
		Msg: fmt.Sprintf("expressions or statements nested deeper than %d levels (a condition of thousands of || terms: split it, or match against a list)", maxDepth)}
	ce.Msg += ce.at()
	return ce
}

// maxScanForks bounds the readings of a script checkNesting follows at once (below).
const maxScanForks = 64

// checkNesting refuses a script whose brackets may nest deeper than maxNesting, naming
// the line and column of the first bracket past the bound. It is a lexical scan that
// may count too deep, never too shallow: strings, comments and template text are
// skipped exactly as goja's lexer skips them, and a closer counts only when it matches
// the innermost open bracket.
//
// Whether a / starts a regular expression or divides depends on the grammar, which a
// lexical scan does not know. The token before it tells in most places (after an
// operator, an opening bracket or return: a regular expression; after a name, a number
// or a literal: a division); where it does not (after ) or }: if (x) /re/ or (a) / b),
// the scan follows both readings, each with its own brackets, and the deepest counts. Readings that
// arrive at the same place, in as many template substitutions, are merged into the one
// with more open brackets; they usually do within a line. A script that keeps more
// than maxScanForks readings apart is refused too (no real script comes close).
func checkNesting(name, src string) *CompileError {
	type reading struct {
		pos  int
		open []byte // the open brackets: ( [ { and $ for ${
		prev byte   // what a / after the last token is (slashAfter)
		// arrows counts, for each open bracket (and the top level first), the arrow
		// functions with an expression body since its last , or ; (a => b => ... nests
		// as brackets do, and goja's parser takes time in the square of it); narrows
		// is their sum.
		arrows  []int
		narrows int
	}
	depth := func(r *reading) int { return len(r.open) + r.narrows }
	fail := func(pos int, msg string) *CompileError {
		p := file.NewFile(name, src, 1).Position(pos)
		ce := &CompileError{Code: CodeScript, Line: p.Line, Column: p.Column, Msg: msg}
		ce.Msg += ce.at()
		return ce
	}
	readings := []*reading{{prev: slashRegexp, arrows: []int{0}}}
	for len(readings) > 0 {
		// Advance the reading furthest behind, after merging those at its place.
		cur := 0
		for i, r := range readings {
			if r.pos < readings[cur].pos {
				cur = i
			}
		}
		r := readings[cur]
		for i := 0; i < len(readings); i++ {
			if o := readings[i]; o != r && o.pos == r.pos && bytes.Count(o.open, dollar) == bytes.Count(r.open, dollar) {
				if depth(o) > depth(r) {
					r.open, r.arrows, r.narrows = o.open, o.arrows, o.narrows
				}
				readings[i] = readings[len(readings)-1]
				readings = readings[:len(readings)-1]
				i--
			}
		}
		i := skipSpace(src, r.pos)
		if i >= len(src) {
			for j, o := range readings {
				if o == r {
					readings = append(readings[:j], readings[j+1:]...)
					break
				}
			}
			continue
		}
		// One count per open bracket: brackets closed since (a template's may open and
		// close several at once) take theirs along; a count left from a closed one on a
		// new one only counts too deep.
		for len(r.arrows) > len(r.open)+1 {
			r.narrows -= r.arrows[len(r.arrows)-1]
			r.arrows = r.arrows[:len(r.arrows)-1]
		}
		for len(r.arrows) < len(r.open)+1 {
			r.arrows = append(r.arrows, 0)
		}
		top := byte(0)
		if len(r.open) > 0 {
			top = r.open[len(r.open)-1]
		}
		start, prev := i, slashDivides
		switch c := src[i]; c {
		case '(', '[', '{':
			r.open = append(r.open, c)
			i++
			prev = slashRegexp
		case ')', ']':
			if top == c-1 || top == c-2 { // '(' is ')' - 1, '[' is ']' - 2
				r.open = r.open[:len(r.open)-1]
			}
			i++
			if c == ')' {
				prev = slashEither // if (x) /re/ or (a) / b
			}
		case '}':
			prev = slashEither // a block, then /re/; an object, then / b
			switch top {
			case '{':
				r.open = r.open[:len(r.open)-1]
				i++
			case '$': // the end of a substitution: the template goes on
				r.open = r.open[:len(r.open)-1]
				i = skipTemplate(src, i+1, &r.open)
				prev = slashDivides
				if top := len(r.open); top > 0 && r.open[top-1] == '$' {
					prev = slashRegexp
				}
			default:
				i++
			}
		case '`':
			i = skipTemplate(src, i+1, &r.open)
			if top := len(r.open); top > 0 && r.open[top-1] == '$' && i >= 2 && src[i-2:i] == "${" {
				prev = slashRegexp
			}
		case '"', '\'':
			i = skipString(src, i+1, c)
		case '/':
			switch {
			case i+1 < len(src) && src[i+1] == '/':
				i = skipLine(src, i+2)
			case i+1 < len(src) && src[i+1] == '*':
				if end := bytes.Index([]byte(src[i+2:]), []byte("*/")); end >= 0 {
					i += 2 + end + 2
				} else {
					i = len(src)
				}
			case r.prev == slashDivides:
				i++
				prev = slashRegexp
			case r.prev == slashRegexp:
				i = skipRegexp(src, i+1)
			default: // both: follow each
				if len(readings) >= maxScanForks {
					return fail(i, "too many ways to read the script's regular expressions and divisions to check its nesting")
				}
				readings = append(readings, &reading{pos: skipRegexp(src, i+1), open: append([]byte(nil), r.open...), prev: slashDivides,
					arrows: append([]int(nil), r.arrows...), narrows: r.narrows})
				i++
				prev = slashRegexp
			}
		case '\\':
			i++ // an escape in an identifier: what follows is read as a name
		default:
			i = skipOrdinary(src, i)
			prev = slashAfter(src[start:i])
			level := &r.arrows[len(r.arrows)-1]
			for j := start; j < i; j++ {
				switch {
				case src[j] == ',' || src[j] == ';':
					r.narrows -= *level
					*level = 0
				case src[j] == '=' && j+1 < i && src[j+1] == '>':
					// A block body is a bracket, counted as one.
					if k := skipSpace(src, j+2); k >= len(src) || src[k] != '{' {
						*level++
						r.narrows++
						if depth(r) > maxNesting {
							return fail(j, fmt.Sprintf("brackets and arrow functions nested deeper than %d levels", maxNesting))
						}
					}
					j++
				}
			}
		}
		if depth(r) > maxNesting {
			if len(r.open) > 0 && r.open[len(r.open)-1] == '$' { // at the ${, not at the template's start
				start = i - 2
			}
			what := "brackets"
			if r.narrows > 0 {
				what = "brackets and arrow functions"
			}
			return fail(start, fmt.Sprintf("%s nested deeper than %d levels", what, maxNesting))
		}
		r.pos, r.prev = i, prev
	}
	return nil
}

// What a / after a token starts, for checkNesting.
const (
	slashRegexp  byte = 'r' // a regular expression: after an operator, an opening bracket, return...
	slashDivides byte = 'd' // a division: after a name, a number, a literal, ]
	slashEither  byte = 'e' // either: after ), }, ++, --, and names that are keywords only somewhere
)

// regexpKeywords are the keywords after which / starts a regular expression.
var regexpKeywords = map[string]bool{"return": true, "typeof": true, "instanceof": true, "in": true, "new": true,
	"delete": true, "void": true, "throw": true, "case": true, "do": true, "else": true, "extends": true}

// contextualKeywords are names that are keywords in some places only.
var contextualKeywords = map[string]bool{"of": true, "yield": true, "await": true, "let": true, "async": true,
	"get": true, "set": true, "static": true}

// slashAfter says what a / after run (ordinary bytes: names, numbers, operators) is.
func slashAfter(run string) byte {
	j := len(run)
	for j > 0 && (isNameByte(run[j-1]) || run[j-1] >= utf8.RuneSelf) {
		j--
	}
	if j == len(run) { // an operator
		switch {
		case strings.HasSuffix(run, "++"), strings.HasSuffix(run, "--"), strings.HasSuffix(run, "."):
			return slashEither
		}
		return slashRegexp
	}
	word := run[j:]
	if j > 0 && run[j-1] == '.' && !(j > 1 && run[j-2] == '.') { // a property name, not ...spread
		return slashDivides
	}
	switch {
	case regexpKeywords[word]:
		return slashRegexp
	case contextualKeywords[word]:
		return slashEither
	}
	return slashDivides
}

func isNameByte(c byte) bool {
	return c == '_' || c == '$' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// skipOrdinary skips a run of bytes other than scanSpecial ones and white space.
func skipOrdinary(src string, i int) int {
	i++
	for i < len(src) && !scanSpecial[src[i]] {
		if src[i] >= utf8.RuneSelf {
			r, n := utf8.DecodeRuneInString(src[i:])
			if isSpace(r) {
				return i
			}
			i += n
			continue
		}
		i++
	}
	return i
}

// isSpace: white space or a line terminator outside ASCII, which goja skips between
// tokens.
func isSpace(r rune) bool {
	return r == '\ufeff' || r == '\u2028' || r == '\u2029' || unicode.Is(unicode.Zs, r)
}

var dollar = []byte{'$'}

// scanSpecial are the bytes that end a run of ordinary ones in checkNesting: brackets,
// quotes, slashes, backslashes and white space. Other bytes (names, numbers,
// operators, UTF-8) are skipped together.
var scanSpecial = func() (s [256]bool) {
	for _, c := range []byte("()[]{}`\"'/\\ \t\n\r\v\f") {
		s[c] = true
	}
	return s
}()

func skipSpace(src string, i int) int {
	for i < len(src) {
		switch c := src[i]; {
		case c == ' ', c == '\t', c == '\n', c == '\r', c == '\v', c == '\f':
			i++
		case c >= utf8.RuneSelf:
			r, n := utf8.DecodeRuneInString(src[i:])
			if !isSpace(r) {
				return i
			}
			i += n
		default:
			return i
		}
	}
	return i
}

// lineEnd reports whether a line terminator starts at src[i] (\n, \r, U+2028, U+2029),
// and its length.
func lineEnd(src string, i int) (bool, int) {
	switch src[i] {
	case '\n', '\r':
		return true, 1
	case 0xe2:
		if i+2 < len(src) && src[i+1] == 0x80 && (src[i+2] == 0xa8 || src[i+2] == 0xa9) {
			return true, 3
		}
	}
	return false, 0
}

// skipLine skips a // comment: to its line terminator.
func skipLine(src string, i int) int {
	for i < len(src) {
		if end, _ := lineEnd(src, i); end {
			return i
		}
		i++
	}
	return i
}

// runeLen is the length of the character at src[i].
func runeLen(src string, i int) int {
	_, n := utf8.DecodeRuneInString(src[i:])
	return n
}

// skipString skips a string literal's characters after its opening quote, as goja's
// lexer does: to the closing quote, or to the end of the line (unterminated); a
// backslash escapes the next character, a line terminator included.
func skipString(src string, i int, quote byte) int {
	for i < len(src) {
		switch c := src[i]; c {
		case quote:
			return i + 1
		case '\n', '\r':
			return i
		case '\\':
			i++
			if i < len(src) {
				if src[i] == '\r' && i+1 < len(src) && src[i+1] == '\n' {
					i++
				}
				i += runeLen(src, i)
			}
		default:
			i++
		}
	}
	return i
}

// skipRegexp skips a regular expression's characters after its opening slash, as
// goja's lexer does: to the slash that closes it outside a class [...], or to the end
// of the line (unterminated); a backslash escapes the next character, but not a line
// terminator. Its flags are read as a name.
func skipRegexp(src string, i int) int {
	class := false
	for i < len(src) {
		if end, _ := lineEnd(src, i); end {
			return i
		}
		switch src[i] {
		case '\\':
			i++
			if i < len(src) {
				if end, _ := lineEnd(src, i); end {
					return i
				}
				i += runeLen(src, i)
			}
			continue
		case '[':
			class = true
		case ']':
			class = false
		case '/':
			if !class {
				return i + 1
			}
		}
		i++
	}
	return i
}

// skipTemplate skips template text after its opening backtick (or a substitution's
// closing brace), as goja's lexer does: to the closing backtick, or to a ${, which
// opens a substitution (pushed on open as '$').
func skipTemplate(src string, i int, open *[]byte) int {
	for i < len(src) {
		switch src[i] {
		case '`':
			return i + 1
		case '\\':
			i++
			if i < len(src) {
				i += runeLen(src, i)
			}
			continue
		case '$':
			if i+1 < len(src) && src[i+1] == '{' {
				*open = append(*open, '$')
				return i + 2
			}
		}
		i++
	}
	return i
}
