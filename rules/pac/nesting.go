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

// maxLabels bounds the labels of a script, as checkNesting counts them. goja's parser
// compares each label with every label around it in the same function, and records
// an error for each that has the same name: 8000 times `a:` (16 KB) took 28 s and 3
// GB at Compile, and 100 000 distinct labels (a megabyte) 16 s. Real PAC files have a
// handful of labels at most; maxLabels nested labels cost the parser a few thousand
// comparisons.
const maxLabels = 100

// maxScanForks bounds the readings of a script checkNesting follows at once (below).
const maxScanForks = 64

// scanLevel is what checkNesting keeps for each open bracket (and the top level).
type scanLevel struct {
	// arrows counts the arrow functions with an expression body since the bracket's
	// last , or ; (a => b => ... nests as brackets do, and goja's parser takes time in
	// the square of it).
	arrows int
	// labels counts the labels and first object keys in the bracket (see
	// checkNesting); ternaries and cases the ? and case whose : is still to come.
	labels, ternaries, cases int
}

// What the last token was, for the labels of checkNesting.
const (
	tokOther byte = iota // an operator, ( [ ?, a ternary's :, most keywords: an expression follows
	tokStmt              // ; { => and the : of a label or a case, the start: a statement may follow
	tokSep               // , . ?. : a name after it is a property or a key, never a label
	tokName              // a name that may be a label
	tokProp              // a name after tokSep
	tokObj               // { where an expression goes: an object literal
	tokKey               // a name right after tokObj: an object's first key
	tokEnd               // the end of an expression: a number, a literal, ] } ++ --, this, null...
	tokParen             // ) closing a parenthesis: (a): is a label to goja too
	tokHead              // if while for with switch catch: a ( after it is their header
	tokBody              // do else try finally, or a header's ): a statement follows
)

// parenHeader stands in checkNesting's brackets for the ( of a statement's header
// (if (...)), whose ) is followed by a statement, not an expression.
const parenHeader = 'h'

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
//
// The same scan refuses a script with more than maxLabels labels, naming the line and
// column of the label past the bound. A label is a name (or a parenthesized one: goja
// takes (a): as a label) followed by a ':' that is not a ternary's or a case's, nor an
// object key's: each bracket counts the ? (after a value: not ?. or ??) and case
// waiting for their ':', and a ';' or a statement keyword ends them, as it does in
// goja's parser, which resumes at such a keyword after a syntax error. A ? or case
// that cannot be one (right after if, while, catch (e) and the like, where goja's
// parser takes it for a wrong token and goes on with what follows) waits for nothing.
// An object key follows a ',' or opens an object literal: a { where an expression
// goes (after an operator, ( [ , ? return and the like), not where a statement may
// start (after ; { } ), a name, a label's ':'). The labels of the whole
// script count, not only those nested in one another (a: x; b: y counts two): a
// malformed script can make goja's parser skip the brackets that close them and nest
// what follows. An object's first key and a label count together too, per bracket
// and the brackets around it, up to maxLabels ({a: {b: ...}} as deep as that is
// refused): a first key is a label when the { is a block after all.
func checkNesting(name, src string) *CompileError {
	type reading struct {
		pos  int
		open []byte // the open brackets: ( [ { and $ for ${, parenHeader
		prev byte   // what a / after the last token is (slashAfter)
		// levels has one entry per open bracket and the top level first; narrows and
		// nlabels are the sums of their arrows and labels.
		levels           []scanLevel
		narrows, nlabels int
		tok              byte // the kind of the last token (tokName...)
		tokAt            int  // where the last name or ) starts
		escEnd           int  // just past the last escape in a name, where the name goes on
		total            int  // the labels so far
	}
	depth := func(r *reading) int { return len(r.open) + r.narrows }
	fail := func(pos int, msg string) *CompileError {
		p := file.NewFile(name, src, 1).Position(pos)
		ce := &CompileError{Code: CodeScript, Line: p.Line, Column: p.Column, Msg: msg}
		ce.Msg += ce.at()
		return ce
	}
	labelsMsg := fmt.Sprintf("more than %d labels (a name and ':' before a statement)", maxLabels)
	nestedMsg := fmt.Sprintf("more than %d labels and object keys (a name and ':') in one block and the blocks around it", maxLabels)
	readings := []*reading{{prev: slashRegexp, levels: []scanLevel{{}}, escEnd: -1, tok: tokStmt}}
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
				// The merged reading keeps the deeper brackets, the more labels (those
				// of the other counted at the top level, which never closes), and what
				// waits for a ':' only where both wait for it.
				other := *o
				if depth(o) > depth(r) {
					other = *r
					r.open, r.levels, r.narrows, r.nlabels = o.open, o.levels, o.narrows, o.nlabels
				}
				if len(other.levels) == len(r.levels) {
					for k := range r.levels {
						r.levels[k].ternaries = min(r.levels[k].ternaries, other.levels[k].ternaries)
						r.levels[k].cases = min(r.levels[k].cases, other.levels[k].cases)
					}
				} else {
					for k := range r.levels {
						r.levels[k].ternaries, r.levels[k].cases = 0, 0
					}
				}
				if d := other.nlabels - r.nlabels; d > 0 {
					r.levels[0].labels += d
					r.nlabels += d
				}
				r.total = max(r.total, other.total)
				if other.tok == tokName || other.tok == tokParen {
					r.tok, r.tokAt = other.tok, other.tokAt
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
		// One level per open bracket: brackets closed since (a template's may open and
		// close several at once) take theirs along; a count left from a closed one on a
		// new one only counts too deep.
		for len(r.levels) > len(r.open)+1 {
			l := r.levels[len(r.levels)-1]
			r.narrows -= l.arrows
			r.nlabels -= l.labels
			r.levels = r.levels[:len(r.levels)-1]
		}
		for len(r.levels) < len(r.open)+1 {
			r.levels = append(r.levels, scanLevel{})
		}
		level := &r.levels[len(r.levels)-1]
		top := byte(0)
		if len(r.open) > 0 {
			top = r.open[len(r.open)-1]
		}
		start, prev := i, slashDivides
		tok := tokEnd // strings, templates and regular expressions
		switch c := src[i]; c {
		case '(', '[', '{':
			tok = tokOther
			switch {
			case c == '(' && r.tok == tokHead:
				c = parenHeader
			case c == '{' && (r.tok == tokOther || r.tok == tokSep):
				tok = tokObj
			case c == '{':
				tok = tokStmt
			}
			r.open = append(r.open, c)
			i++
			prev = slashRegexp
		case ')', ']':
			tok = tokEnd
			if c == ')' {
				tok = tokParen
			}
			if top == c-1 || top == c-2 || c == ')' && top == parenHeader { // '(' is ')' - 1, '[' is ']' - 2
				r.open = r.open[:len(r.open)-1]
				if top == parenHeader {
					tok = tokBody
				}
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
					prev, tok = slashRegexp, tokOther
				}
			default:
				i++
			}
		case '`':
			i = skipTemplate(src, i+1, &r.open)
			if top := len(r.open); top > 0 && r.open[top-1] == '$' && i >= 2 && src[i-2:i] == "${" {
				prev, tok = slashRegexp, tokOther
			}
		case '"', '\'':
			i = skipString(src, i+1, c)
		case '/':
			tok = r.tok // a comment changes nothing
			switch {
			case i+1 < len(src) && src[i+1] == '/':
				i = skipLine(src, i+2)
				prev = r.prev
			case i+1 < len(src) && src[i+1] == '*':
				if end := bytes.Index([]byte(src[i+2:]), []byte("*/")); end >= 0 {
					i += 2 + end + 2
				} else {
					i = len(src)
				}
				prev = r.prev
			case r.prev == slashDivides:
				i++
				prev, tok = slashRegexp, tokOther
			case r.prev == slashRegexp:
				i = skipRegexp(src, i+1)
				tok = tokEnd
			default: // both: follow each
				if len(readings) >= maxScanForks {
					return fail(i, "too many ways to read the script's regular expressions and divisions to check its nesting")
				}
				readings = append(readings, &reading{pos: skipRegexp(src, i+1), open: append([]byte(nil), r.open...), prev: slashDivides,
					levels: append([]scanLevel(nil), r.levels...), narrows: r.narrows, nlabels: r.nlabels,
					tok: tokEnd, tokAt: r.tokAt, escEnd: -1})
				i++
				prev, tok = slashRegexp, tokOther
			}
		case '\\':
			// An escape in a name (\u0061, \u{61}): it starts a name, or goes on with the
			// one right before it.
			tok = r.tok
			if !(i == r.pos && (r.tok == tokName || r.tok == tokProp || r.tok == tokKey)) {
				tok, r.tokAt = tokName, i
				switch r.tok {
				case tokSep:
					tok = tokProp
				case tokObj:
					tok = tokKey
				}
			}
			i++
			if i+1 < len(src) && src[i] == 'u' && src[i+1] == '{' {
				if end := strings.IndexByte(src[i:], '}'); end >= 0 {
					i += end + 1
				}
			}
			r.escEnd = i
		default:
			i = skipOrdinary(src, i)
			prev = slashAfter(src[start:i])
			tok = r.tok
			for j := start; j < i; {
				switch c := src[j]; {
				case c == ',' || c == ';':
					r.narrows -= level.arrows
					level.arrows = 0
					if c == ',' {
						tok = tokSep
					} else {
						level.ternaries, level.cases, tok = 0, 0, tokStmt
					}
					j++
				case c == '=' && j+1 < i && src[j+1] == '>':
					// A block body is a bracket, counted as one.
					if k := skipSpace(src, j+2); k >= len(src) || src[k] != '{' {
						level.arrows++
						r.narrows++
						if depth(r) > maxNesting {
							return fail(j, fmt.Sprintf("brackets and arrow functions nested deeper than %d levels", maxNesting))
						}
					}
					j += 2
					tok = tokStmt // a block body is a block
				case c == '?':
					switch {
					case j+1 < i && src[j+1] == '?': // ?? and ??=
						j += 2
						tok = tokOther
						continue
					case j+1 < i && src[j+1] == '.' && !(j+2 < i && '0' <= src[j+2] && src[j+2] <= '9'): // ?. but not ?.5
						j += 2
						tok = tokSep
						continue
					}
					if tok == tokName || tok == tokProp || tok == tokKey || tok == tokEnd || tok == tokParen {
						level.ternaries++
					}
					j++
					tok = tokOther
				case c == ':':
					was := tok
					tok = tokOther // a value follows
					switch {
					case level.ternaries > 0:
						level.ternaries--
					case level.cases > 0:
						level.cases--
						tok = tokStmt
					case was == tokName || was == tokParen || was == tokKey:
						if was != tokKey {
							tok = tokStmt
							if r.total++; r.total > maxLabels {
								return fail(r.tokAt, labelsMsg)
							}
						}
						level.labels++
						r.nlabels++
						if r.nlabels > maxLabels {
							return fail(r.tokAt, nestedMsg)
						}
					}
					j++
				case c == '.':
					switch {
					case j+2 < i && src[j+1] == '.' && src[j+2] == '.':
						j += 3
						tok = tokOther
					case j+1 < i && '0' <= src[j+1] && src[j+1] <= '9':
						j = skipNumber(src, j, i)
						tok = tokEnd
					default:
						j++
						tok = tokSep
					}
				case '0' <= c && c <= '9':
					j = skipNumber(src, j, i)
					tok = tokEnd
				case isNameByte(c) || c >= utf8.RuneSelf:
					k := j
					for k < i && (isNameByte(src[k]) || src[k] >= utf8.RuneSelf) {
						k++
					}
					if j != r.escEnd || !(tok == tokName || tok == tokProp || tok == tokKey) { // not the rest of an escaped name
						tok = nameTok(src[j:k], tok, level)
						r.tokAt = j
					}
					j = k
				case (c == '+' || c == '-') && j+1 < i && src[j+1] == c:
					j += 2
					tok = tokEnd
				default:
					j++
					tok = tokOther
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
		if tok == tokParen {
			r.tokAt = start
		}
		r.pos, r.prev, r.tok = i, prev, tok
	}
	return nil
}

// skipNumber skips a number in src[j:end] (a run of ordinary bytes): digits, letters
// (hex, exponents, suffixes), dots and the sign of an exponent.
func skipNumber(src string, j, end int) int {
	for j++; j < end; j++ {
		c := src[j]
		if (c == '+' || c == '-') && (src[j-1] == 'e' || src[j-1] == 'E') {
			continue
		}
		if !isNameByte(c) && c != '.' {
			break
		}
	}
	return j
}

// statementKeywords end what waits for a ':' in their bracket (goja's parser resumes
// at most of them after a syntax error); compoundKeywords say what follows them.
var (
	statementKeywords = map[string]bool{"break": true, "continue": true, "for": true, "if": true, "return": true,
		"switch": true, "var": true, "do": true, "try": true, "with": true, "while": true, "throw": true, "catch": true,
		"finally": true, "else": true, "const": true, "debugger": true, "default": true, "case": true}
	headKeywords  = map[string]bool{"if": true, "while": true, "for": true, "with": true, "switch": true, "catch": true}
	bodyKeywords  = map[string]bool{"do": true, "else": true, "try": true, "finally": true}
	valueKeywords = map[string]bool{"this": true, "null": true, "true": true, "false": true, "super": true}
	// reservedWords are never a label (the contextual keywords, yield, let, async and
	// the like, can be).
	reservedWords = map[string]bool{"break": true, "case": true, "catch": true, "class": true, "const": true,
		"continue": true, "debugger": true, "default": true, "delete": true, "do": true, "else": true, "enum": true,
		"export": true, "extends": true, "false": true, "finally": true, "for": true, "function": true, "if": true,
		"import": true, "in": true, "instanceof": true, "new": true, "null": true, "return": true, "super": true,
		"switch": true, "this": true, "throw": true, "true": true, "try": true, "typeof": true, "var": true,
		"void": true, "while": true, "with": true}
)

// nameTok is the kind of a name after a token of kind prev, for checkNesting; a
// statement keyword updates level.
func nameTok(name string, prev byte, level *scanLevel) byte {
	switch prev {
	case tokSep:
		return tokProp
	case tokObj:
		return tokKey
	}
	if !reservedWords[name] {
		return tokName
	}
	if statementKeywords[name] {
		level.ternaries = 0
		if name != "case" {
			level.cases = 0
		} else if prev != tokHead && prev != tokBody {
			level.cases++
		}
	}
	switch {
	case headKeywords[name]:
		return tokHead
	case bodyKeywords[name]:
		return tokBody
	case valueKeywords[name]:
		return tokEnd
	}
	return tokOther
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
