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
		// A comment is white space: a / after it is what it would be without it.
		{"closer in a regex after a comment", "var a = " + strings.Repeat("[/* c */ /]/, ", deep), true},
		{"closer in a regex after a line comment", "var a = " + strings.Repeat("[ // c\n /]/, ", deep), true},
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

// TestCheckLabels: goja's parser checks each label against every label around it, and
// records an error for each that has the same name, so a chain of labels took time
// and memory in the square of its length: `a:` 8000 times (16 KB) took 28 s and 3 GB
// at Compile, and 30 000 distinct labels over a second. The scan counts labels (a
// name or a parenthesized name, then ':') and refuses more than maxLabels, however the
// script hides them: through statements that nest without brackets (if, while, for,
// do, with, else), escapes, comments, the ? or case that a malformed script puts
// before them so that their ':' looks like a ternary's or a case's, and the closing
// brackets that goja's parser skips after a syntax error. The other colons of real
// scripts (ternaries, object literals, case and default) are not labels.
func TestCheckLabels(t *testing.T) {
	n := maxLabels + 1
	distinct := func(f string) string {
		var b strings.Builder
		for i := 0; i < n; i++ {
			fmt.Fprintf(&b, f, i)
		}
		return b.String() + ";"
	}
	for _, tc := range []struct {
		name, src string
		refused   bool
	}{
		{"chain", strings.Repeat("a:", n) + ";", true},
		{"distinct", distinct("l%d:"), true},
		{"spaced", strings.Repeat("a : ", n) + ";", true},
		{"across lines", strings.Repeat("a\n:", n) + ";", true},
		{"comments", strings.Repeat("a/* x */:// y\n", n) + ";", true},
		{"parenthesized", strings.Repeat("(a):", n) + ";", true},
		{"parenthesized twice", distinct("((l%d)):"), true},
		{"escaped", strings.Repeat(`\u0061:`, n) + ";", true},
		{"escaped with braces", strings.Repeat(`\u{61}:`, n) + ";", true},
		{"escape inside a name", strings.Repeat(`a\u0062c:`, n) + ";", true},
		{"non-ASCII", strings.Repeat("é:", n) + ";", true},
		{"contextual keywords", strings.Repeat("yield:let:async:of:get:", n/5+1) + ";", true},
		{"if", strings.Repeat("a:if(1)", n) + ";", true},
		{"while", strings.Repeat("a:while(1)", n) + ";", true},
		{"for", strings.Repeat("a:for(;;)", n) + ";", true},
		{"do", strings.Repeat("a:do ", n) + ";" + strings.Repeat("while(0)", n), true},
		{"with", strings.Repeat("a:with(1)", n) + ";", true},
		{"else", strings.Repeat("a:if(1);else ", n) + ";", true},
		{"else after a newline", strings.Repeat("a:if(1)x\nelse ", n) + ";", true},
		{"blocks", strings.Repeat("{a:", n) + ";" + strings.Repeat("}", n), true},
		{"cases", strings.Repeat("switch(1){case 1:a:", n) + ";" + strings.Repeat("}", n), true},
		{"in a function", "function f() {\n" + strings.Repeat("a:if(1)", n) + ";\n}", true},
		// Malformed: goja's parser takes the ? or case as a wrong token and goes on
		// with the labels after it.
		{"behind ? after a keyword", strings.Repeat("a: if ? (1)) ", n) + ";", true},
		{"behind case after a keyword", strings.Repeat("a: while case (1)) ", n) + ";", true},
		{"behind ? after a header", strings.Repeat("try {} catch (e) ? a: ", n) + ";", true},
		{"behind ? after a statement", strings.Repeat("x ? ? if(1) a:", n) + ";", true},
		{"closers the parser skips", strings.Repeat("{ a: if (x ? ) } if (1) ", n) + ";", true},
		{"one after the other", strings.Repeat("a: x;\n", n), true},
		{"nested object keys", "var o = " + strings.Repeat("{a: ", n) + "1" + strings.Repeat("}", n) + ";", true},

		{"at the bound", strings.Repeat("a:", maxLabels) + ";", false},
		{"labelled loops", strings.Repeat("outer: for (;;) { inner: for (;;) { if (x) continue outer; break inner; } }\n", 20), false},
		{"ternaries", strings.Repeat("var x = c ? a : b, y = c ? (a) : d ? e : f;\n", 5000), false},
		{"nested ternaries", "var x = " + strings.Repeat("c ? ", 1000) + "a" + strings.Repeat(" : b", 1000) + ";", false},
		{"ternaries over lines", strings.Repeat("x = c\n  ? a\n  : b\n", 3000), false},
		{"ternaries with calls and members", strings.Repeat("x = f(a) ? o.p : o[q] ? this : null ? 1 : `t` ? x++ : /r/;\n", 2000), false},
		{"optional chaining and ??", strings.Repeat("x = a?.b ? c : a ?? b ? d : c?.5:1;\n", 3000), false},
		{"object literals", strings.Repeat("var o = {a: 1, b: {c: 2, d: [e, {f: g}]}, \"h\": i, 2: j, [k]: l, if: m, case: n, default: p};\n", 3000), false},
		{"nested objects", "var o = " + strings.Repeat("{a: ", 50) + "1" + strings.Repeat("}", 50) + ";", false},
		{"destructuring", strings.Repeat("var {a: b, c: {d: e}} = o;\n", 3000), false},
		{"switch", "switch (h) {\n" + strings.Repeat("case a: x = 1; break;\ncase \"b\": case c.d: x = c ? d : e; break;\n", 3000) + "default: x = 2;\n}", false},
		{"switch cases in blocks", "switch (h) {\n" + strings.Repeat("case a: { x = 1; break; }\ncase b: return c ? d : e;\n", 3000) + "}", false},
		{"corporate", corporatePAC(t), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ce := checkNesting("t.pac", tc.src)
			switch {
			case tc.refused && (ce == nil || !strings.Contains(ce.Msg, "labels")):
				t.Errorf("checkNesting = %v, want refused for its labels", ce)
			case !tc.refused && ce != nil:
				t.Errorf("checkNesting = %v, want accepted", ce)
			}
			if ce != nil && (ce.Code != CodeScript || ce.Line < 1 || ce.Column < 1) {
				t.Errorf("checkNesting = %#v: no code, line or column", ce)
			}
		})
	}
}

// TestCompileLabelChain: the reviewer's script, a 16 KB chain of labels after
// FindProxyForURL, is refused at once with the line and column of the label past the
// bound, without the parser's gigabytes.
func TestCompileLabelChain(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		column    int
	}{
		{"same name", strings.Repeat("a:", 8000) + ";", 2*maxLabels + 1},
		{"distinct names", func() string {
			var b strings.Builder
			for i := 0; i < 100000; i++ {
				fmt.Fprintf(&b, "l%d:", i)
			}
			return b.String() + ";"
		}(), len(func() string {
			var b strings.Builder
			for i := 0; i < maxLabels; i++ {
				fmt.Fprintf(&b, "l%d:", i)
			}
			return b.String()
		}()) + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := "function FindProxyForURL(u, h) { return 'DIRECT'; }\n" + tc.src
			var err error
			start := time.Now()
			grew := peakGrowth(func() { _, err = Compile("t.pac", src, Options{}) })
			took := time.Since(start)
			var ce *CompileError
			if !errors.As(err, &ce) || ce.Code != CodeScript || ce.Line != 2 || ce.Column != tc.column || !strings.Contains(ce.Msg, "labels") {
				t.Fatalf("Compile = %#v, want E_SCRIPT for its labels at line 2 column %d", err, tc.column)
			}
			if grew > 64<<20 || took > 5*time.Second { // generous: the machine is shared
				t.Errorf("Compile took %v and grew the heap by %d MiB", took, grew>>20)
			}
			t.Logf("%v, %d MiB: %v", took, grew>>20, err)
		})
	}
}
