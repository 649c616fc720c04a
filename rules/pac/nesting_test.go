package pac

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestCheckNesting: the scan counts every bracket goja's parser nests, wherever a
// script tries to hide the closers that would make it count less (strings, comments,
// template text, regular expressions, a / that may be either), and refuses past
// maxNesting; real scripts pass.
func TestCheckNesting(t *testing.T) {
	deep := maxNesting + 1
	for _, tc := range []struct {
		name, src string
		refused   bool
	}{
		{"arrays", "var a = " + strings.Repeat("[", deep), true},
		{"parens", "var a = " + strings.Repeat("(", deep) + "1" + strings.Repeat(")", deep), true},
		{"blocks", strings.Repeat("{", deep) + strings.Repeat("}", deep), true},
		{"mixed", strings.Repeat("[({", deep/3+1), true},
		{"at the bound", "var a = " + strings.Repeat("[", maxNesting) + strings.Repeat("]", maxNesting), false},
		{"closer in a string", "var a = " + strings.Repeat(`["]", `, deep), true},
		{"closer in a single-quoted string", "var a = " + strings.Repeat(`[']', `, deep), true},
		{"closer after an escaped quote", "var a = " + strings.Repeat(`["\"]", `, deep), true},
		{"closer after an escaped backslash", "var a = " + strings.Repeat(`["\\", `, deep), true},
		{"closer in a continued string", "var a = " + strings.Repeat("[\"\\\n]\", ", deep), true},
		{"closer in a string with U+2028", "var a = " + strings.Repeat("[\"\u2028]\", ", deep), true},
		{"unterminated string ends at the line", "var a = " + strings.Repeat("[\"]\n", deep), true},
		{"closer in a line comment", "var a = " + strings.Repeat("[ // ]\n", deep), true},
		{"closer in a line comment ended by U+2028", "var a = " + strings.Repeat("[ // ]\u2028", deep), true},
		{"closer in a block comment", "var a = " + strings.Repeat("[ /* ] */ ", deep), true},
		{"closer in a template", "var a = " + strings.Repeat("[`]`, ", deep), true},
		{"closer in template text after a substitution", "var a = " + strings.Repeat("[`${1}]`, ", deep), true},
		{"nested substitutions", "var a = " + strings.Repeat("`${", deep), true},
		{"substitution closing a bracket", "var a = " + strings.Repeat("[`${]}`, ", deep), true},
		{"closer in a regex", "var a = " + strings.Repeat("[/]/, ", deep), true},
		{"closer in a regex class", "var a = " + strings.Repeat("[/[/]]/, ", deep), true},
		{"closer after an escaped slash", "var a = " + strings.Repeat(`[/\/]/, `, deep), true},
		{"closer in a regex after if", strings.Repeat("if(1)/]/;{", deep), true},
		{"closers in a regex after a paren", strings.Repeat("(function(){if(1)/)}]/;", deep/2+1), true},
		{"quote in a regex", "var a = " + strings.Repeat(`[/"/, "]", `, deep), true},
		{"quote after a division", "var a = " + strings.Repeat(`[1 / "/]", `, deep), true},
		{"regex or comment", "var a = " + strings.Repeat("[x /[/*]/ ] */, ", deep), true},
		{"backtick in a regex", "var a = " + strings.Repeat("[/`/, `]`, ", deep), true},
		{"mismatched closers", "var a = " + strings.Repeat("[)}", deep), true},
		{"division", "var a = " + strings.Repeat("[a / b / c, ", deep), true},
		{"quote after a slash after a paren", strings.Repeat(`x = (a) / "/" + [`, deep), true},
		{"quote after a slash after a brace", strings.Repeat(`{} / "/"; [`, deep), true},
		{"closer in a regex after a keyword and a no-break space", "var a = " + strings.Repeat("[function(){return\u00a0/]/}, ", deep), true},
		{"closer in a regex after ++", "var a = " + strings.Repeat("[x++ /]/ ", deep), true},
		{"property named like a keyword", "var a = " + strings.Repeat(`[x.return / "/]", `, deep), true},
		// Arrow functions with an expression body nest as brackets do.
		{"arrows", "var f = " + strings.Repeat("a => ", deep) + "1;", true},
		{"arrows and brackets", "var f = " + strings.Repeat("a => (", deep/2+1), true},
		{"arrows across lines", "var f = " + strings.Repeat("a =>\n", deep) + "1;", true},
		{"arrows at the bound", "var f = " + strings.Repeat("a=>", maxNesting) + "1;", false},
		{"arrows in a list", "var f = [" + strings.Repeat("a => 1, ", 5*deep) + "];", false},
		{"arrows in statements", strings.Repeat("f(a => a + 1);\n", 5*deep), false},
		{"arrows with block bodies", strings.Repeat("var f = a => { return a; }\n", 5*deep), false},
		// Real scripts: regexes, divisions, templates and comments by the thousand.
		{"many regexes and divisions", strings.Repeat("if (/^(a|b)\\.\"x/i.test(h) && n / 2 > m / 3) { r = `${h}/${[n]}`; } // ) ] }\n", 3000), false},
		{"many groups", "var a = " + strings.Repeat("[[1], (2), {a: 3}], ", 20000) + "0;", false},
		{"corporate", corporatePAC(t), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ce := checkNesting("t.pac", tc.src)
			switch {
			case tc.refused && (ce == nil || !strings.Contains(ce.Msg, "nested deeper than 1000")):
				t.Errorf("checkNesting = %v, want refused", ce)
			case !tc.refused && ce != nil:
				t.Errorf("checkNesting = %v, want accepted", ce)
			}
			if ce != nil && (ce.Code != CodeScript || ce.Line < 1 || ce.Column < 1) {
				t.Errorf("checkNesting = %#v: no code, line or column", ce)
			}
		})
	}
}

// TestCompileDeepNesting: half a million nested brackets made goja's parser recurse
// until Go's stack limit, a fatal error that ended the process at Compile. Now Compile
// refuses the script, naming where.
func TestCompileDeepNesting(t *testing.T) {
	for _, tc := range []struct {
		name, src    string
		line, column int
	}{
		{"arrays", "var a = \n  " + strings.Repeat("[", 500000), 2, 3 + maxNesting},
		{"parens", "var a = " + strings.Repeat("(", 500000), 1, 9 + maxNesting},
		{"hidden closers", "var a = " + strings.Repeat(`["]",`, 200000), 1, 9 + 5*maxNesting},
		{"arrows", "var f = " + strings.Repeat("a=>", 300000) + "1", 1, 10 + 3*maxNesting},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Compile("deep.pac", tc.src, Options{})
			var ce *CompileError
			if !errors.As(err, &ce) || ce.Code != CodeScript || ce.Line != tc.line || ce.Column != tc.column ||
				!strings.Contains(ce.Error(), "nested deeper than 1000 levels") {
				t.Errorf("Compile = %#v, want E_SCRIPT at line %d column %d", err, tc.line, tc.column)
			}
		})
	}
}

// TestCompileDeepExpressions: goja's compiler takes time in the square of how deeply
// a script's tree nests, brackets or not: a megabyte of "1 + 1 + ..." compiled for
// minutes while the reload waited. Compile refuses a tree deeper than maxDepth at
// once, naming where, and compiles one just within it.
func TestCompileDeepExpressions(t *testing.T) {
	const fn = "function FindProxyForURL(url, host) {\n  var x = "
	for _, tc := range []struct {
		name, src string
		refused   bool
	}{
		{"sum", fn + "1" + strings.Repeat(" + 1", 250000) + ";\n  return 'DIRECT';\n}", true},
		{"or", fn + "host == 'a'" + strings.Repeat(" || host == 'a'", 60000) + ";\n  return 'DIRECT';\n}", true},
		{"unary", fn + strings.Repeat("- ", 300000) + "1;\n  return 'DIRECT';\n}", true},
		{"not", fn + strings.Repeat("!", 500000) + "1;\n  return 'DIRECT';\n}", true},
		{"assignments", fn + strings.Repeat("x = ", 200000) + "1;\n  return 'DIRECT';\n}", true},
		{"conditionals", fn + strings.Repeat("host ? 1 : ", 90000) + "1;\n  return 'DIRECT';\n}", true},
		{"else if", "function FindProxyForURL(url, host) {\n  " + strings.Repeat("if (host) x = 1; else ", 40000) + "x = 2;\n  return 'DIRECT';\n}", true},
		{"or within the bound", fn + "host == 'a'" + strings.Repeat(" || host == 'a'", maxDepth-10) + ";\n  return 'DIRECT';\n}", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			_, err := Compile("deep.pac", tc.src, Options{})
			took := time.Since(start)
			var ce *CompileError
			switch {
			case !tc.refused && err != nil:
				t.Fatalf("Compile = %v, want compiled", err)
			case tc.refused && (!errors.As(err, &ce) || ce.Code != CodeScript || ce.Line != 2 ||
				!strings.Contains(ce.Error(), fmt.Sprintf("nested deeper than %d levels", maxDepth))):
				t.Fatalf("Compile = %#v, want E_SCRIPT at line 2", err)
			}
			t.Logf("%v (%v)", took, err) // no bound asserted: the machine is shared
		})
	}
}
