package pac

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/dop251/goja"
	"github.com/dop251/goja/ast"
	"github.com/dop251/goja/file"
	"github.com/dop251/goja/parser"
	"github.com/dop251/goja/token"
	"github.com/dop251/goja/unistring"
)

// A script runs inline (on the caller's goroutine, stopped at its deadline by goja's
// Interrupt) only when it provably cannot reach anything Interrupt cannot stop: native
// code whose running time is not bounded by a small constant. classify decides this
// once, at load, from the syntax tree:
//
//   - every global it names is a PAC built-in or in inlineGlobals, and every property it
//     reads is either one no built-in object has (the script's own) or in inlineProps:
//     so eval, Function, constructor, RegExp, repeat, join, replace, sort... are out of
//     reach, by any path;
//   - a computed member access x[k] has a key that is a string literal (checked like a
//     property name) or provably a number (x[i] with a numeric loop counter);
//   - a regex literal appears only as /re/.test(s), with flags among "ims", a short
//     ASCII pattern that goja hands to Go's linear-time regexp (never to regexp2, its
//     backtracking engine);
//   - no with, for-in/of, classes, generators, async, spread or destructuring (they run
//     native iteration or change how names resolve).
//
// The natives that remain reachable and cost more than a copy per byte of their input
// (toLowerCase, split, indexOf, Array join and slice, RegExp test, the PAC built-ins),
// or that loop over an array's length rather than its elements (on a sparse array,
// up to 2^32 steps), are guarded
// at run time on inline calls: an input past a small bound (guard.go) abandons the
// inline attempt and the call is run again on the hand-off path, which copes with
// anything. Every other script always takes the hand-off path.

// Inline-path bounds.
const (
	maxInlinePattern = 128 // bytes of a regex literal's pattern
	maxInlineIndex   = 1 << 12
)

// inlineGlobals are the non-PAC globals an inline script may name.
var inlineGlobals = map[string]bool{"undefined": true, "NaN": true, "Infinity": true, "Math": true}

// pacGlobals are the names install defines (plus what a PAC script defines itself).
var pacGlobals = map[string]bool{
	"isPlainHostName": true, "dnsDomainIs": true, "localHostOrDomainIs": true, "isResolvable": true,
	"isInNet": true, "dnsResolve": true, "convert_addr": true, "myIpAddress": true, "dnsDomainLevels": true,
	"shExpMatch": true, "weekdayRange": true, "dateRange": true, "timeRange": true, "alert": true,
	"isResolvableEx": true, "isInNetEx": true, "dnsResolveEx": true, "myIpAddressEx": true,
	"sortIpAddressList": true, "getClientVersion": true,
}

// inlineProps are the built-in property names an inline script may use. Each is O(1),
// O(size of its result), or guarded (guard.go).
var inlineProps = map[string]bool{
	// strings
	"length": true, "toLowerCase": true, "toUpperCase": true, "indexOf": true, "lastIndexOf": true,
	"includes": true, "startsWith": true, "endsWith": true, "substring": true, "substr": true,
	"slice": true, "charAt": true, "charCodeAt": true, "trim": true, "split": true,
	// arrays (indexOf, lastIndexOf, includes and slice above, guarded for arrays too;
	// TestInlineNatives lists what each name reaches)
	"push": true, "pop": true,
	// regex literals: /re/.test(s)
	"test": true,
	// Math
	"floor": true, "ceil": true, "round": true, "abs": true, "min": true, "max": true, "random": true,
	"PI": true,
}

// instanceProps are property names built-in objects carry on their instances rather
// than their prototypes, so the walk in builtinNames does not see them.
var instanceProps = []string{"lastIndex", "index", "input", "groups", "length", "name", "message", "stack",
	"callee", "caller", "arguments", "prototype", "constructor", "__proto__", "cause", "errors"}

var builtinOnce struct {
	sync.Once
	globals, props map[string]bool
}

// builtinNames lists the names of the global object's properties, and of every
// property of every built-in object reachable from it, in a fresh goja runtime.
func builtinNames() (globals, props map[string]bool) {
	builtinOnce.Do(func() {
		vm := goja.New()
		v, err := vm.RunString(`(function () {
	var globals = Object.getOwnPropertyNames(globalThis);
	var seen = new Set(), names = new Set(), q = [globalThis, "", 0, true, Symbol()];
	while (q.length) {
		var o = q.pop();
		if (o === null || o === undefined) continue;
		if (typeof o !== "object" && typeof o !== "function") { q.push(Object.getPrototypeOf(o)); continue; }
		if (seen.has(o)) continue;
		seen.add(o);
		q.push(Object.getPrototypeOf(o));
		Object.getOwnPropertyNames(o).forEach(function (n) {
			names.add(n);
			var d = Object.getOwnPropertyDescriptor(o, n);
			if (d && "value" in d) q.push(d.value);
		});
	}
	return [globals, Array.from(names)];
})()`)
		if err != nil {
			panic(fmt.Sprintf("pac: listing goja's built-ins: %v", err)) // a fixed program: cannot fail
		}
		var lists [][]string
		if err := vm.ExportTo(v, &lists); err != nil || len(lists) != 2 {
			panic(fmt.Sprintf("pac: listing goja's built-ins: %v", err))
		}
		builtinOnce.globals, builtinOnce.props = map[string]bool{}, map[string]bool{}
		for _, n := range lists[0] {
			builtinOnce.globals[n] = true
		}
		for _, n := range append(lists[1], instanceProps...) {
			builtinOnce.props[n] = true
		}
	})
	return builtinOnce.globals, builtinOnce.props
}

// classify reports whether a parsed script may run inline, and if not, why (the first
// construct that rules it out, with its line). For an inline script, numeric reports
// whether an expression's value is always a number (or undefined), which the rules of
// the inline path make sound (guardConcat leaves such a + alone).
//
// For an inline script it also rewrites each /re/.test(s) into R.test(s), where R is a
// global (regexGlobal) that each runtime of the pool sets once to that literal's RegExp
// (returned in regexes, in order): evaluating the literal would make a new RegExp object
// on every call, a good part of a call's cost and of its garbage. Nothing can tell the
// difference: the object is never seen by the script, and a test without the g or y
// flag neither reads nor writes its lastIndex.
func classify(prog *ast.Program) (inline bool, why string, regexes []string, numeric func(ast.Expression) bool) {
	c := &classifier{file: prog.File, numeric: map[string]bool{}, notNumeric: map[string]bool{}}
	c.globals, c.props = builtinNames()
	// First pass: which names only ever hold numbers (or undefined), so that x[i] is a
	// numeric index and never a property name.
	c.collect = true
	c.stmts(prog.Body)
	c.collect = false
	c.settleNumeric()
	c.why = ""
	c.stmts(prog.Body)
	if c.why != "" {
		return false, c.why, nil, nil
	}
	for i, d := range c.regexSites {
		re := d.Left.(*ast.RegExpLiteral)
		regexes = append(regexes, re.Literal)
		d.Left = &ast.Identifier{Name: unistring.String(regexGlobal(i)), Idx: re.Idx}
	}
	return true, "", regexes, c.isNumeric
}

// regexGlobal names the global holding an inline script's i'th regex literal. The
// name starts with a NUL, which no identifier in a script can, and classify refuses
// it as a property name.
func regexGlobal(i int) string { return "\x00re" + strconv.Itoa(i) }

type classifier struct {
	file           *file.File
	globals, props map[string]bool
	why            string

	// collect is the first pass: record the assignments of every name.
	collect bool
	// assigned[name] are the expressions ever assigned to name (nil: undefined).
	assigned map[string][]ast.Expression
	// notNumeric names are also parameters, functions, catch bindings or properties
	// assigned through a member expression (this.i = ...).
	notNumeric map[string]bool
	numeric    map[string]bool

	regexSites []*ast.DotExpression // the /re/.test callees, in order
}

func (c *classifier) fail(n ast.Node, format string, a ...any) {
	if c.why != "" || c.collect {
		return
	}
	msg := fmt.Sprintf(format, a...)
	if c.file != nil && n != nil {
		if l := c.file.Position(int(n.Idx0())).Line; l > 0 {
			msg += fmt.Sprintf(" (line %d)", l)
		}
	}
	c.why = msg
}

func (c *classifier) assign(name string, e ast.Expression) {
	if c.assigned == nil {
		c.assigned = map[string][]ast.Expression{}
	}
	c.assigned[name] = append(c.assigned[name], e)
}

// settleNumeric finds the names whose every assignment is numeric, assuming the
// others are not, until nothing changes (a greatest fixed point).
func (c *classifier) settleNumeric() {
	for n := range c.assigned {
		if !c.notNumeric[n] {
			c.numeric[n] = true
		}
	}
	for changed := true; changed; {
		changed = false
		for n := range c.numeric {
			for _, e := range c.assigned[n] {
				if e != nil && !c.isNumeric(e) {
					delete(c.numeric, n)
					changed = true
					break
				}
			}
		}
	}
}

// isNumeric: the expression's value is always a number (or undefined).
func (c *classifier) isNumeric(e ast.Expression) bool {
	switch e := e.(type) {
	case *ast.NumberLiteral:
		return true
	case *ast.Identifier:
		return c.numeric[e.Name.String()]
	case *ast.UnaryExpression:
		switch e.Operator {
		case token.MINUS, token.PLUS, token.BITWISE_NOT, token.INCREMENT, token.DECREMENT:
			return true
		}
	case *ast.BinaryExpression:
		if e.Operator == token.PLUS {
			return c.isNumeric(e.Left) && c.isNumeric(e.Right)
		}
		return numericOp(e.Operator)
	case *ast.AssignExpression:
		return c.isNumeric(&ast.BinaryExpression{Operator: e.Operator, Left: e.Left, Right: e.Right}) ||
			(e.Operator == token.ASSIGN && c.isNumeric(e.Right))
	case *ast.ConditionalExpression:
		return c.isNumeric(e.Consequent) && c.isNumeric(e.Alternate)
	case *ast.SequenceExpression:
		return len(e.Sequence) > 0 && c.isNumeric(e.Sequence[len(e.Sequence)-1])
	case *ast.DotExpression:
		// s.length, a.length: a number on strings and arrays; on the script's own
		// objects it is whatever the script put there, so only when nothing assigns a
		// property called length (checked by assignTarget).
		return e.Identifier.Name == "length"
	}
	return false
}

func (c *classifier) stmts(list []ast.Statement) {
	for _, s := range list {
		c.stmt(s)
	}
}

func (c *classifier) stmt(s ast.Statement) {
	if c.why != "" {
		return
	}
	switch s := s.(type) {
	case nil:
	case *ast.BlockStatement:
		if s != nil {
			c.stmts(s.List)
		}
	case *ast.EmptyStatement, *ast.BranchStatement:
	case *ast.ExpressionStatement:
		c.expr(s.Expression)
	case *ast.IfStatement:
		c.expr(s.Test)
		c.stmt(s.Consequent)
		c.stmt(s.Alternate)
	case *ast.ReturnStatement:
		c.expr(s.Argument)
	case *ast.ThrowStatement:
		c.expr(s.Argument)
	case *ast.VariableStatement:
		c.bindings(s.List)
	case *ast.LexicalDeclaration:
		c.bindings(s.List)
	case *ast.FunctionDeclaration:
		c.function(s.Function)
	case *ast.WhileStatement:
		c.expr(s.Test)
		c.stmt(s.Body)
	case *ast.DoWhileStatement:
		c.stmt(s.Body)
		c.expr(s.Test)
	case *ast.ForStatement:
		switch in := s.Initializer.(type) {
		case nil:
		case *ast.ForLoopInitializerExpression:
			c.expr(in.Expression)
		case *ast.ForLoopInitializerVarDeclList:
			c.bindings(in.List)
		case *ast.ForLoopInitializerLexicalDecl:
			c.bindings(in.LexicalDeclaration.List)
		default:
			c.fail(s, "a for loop initializer of type %T", in)
		}
		c.expr(s.Test)
		c.expr(s.Update)
		c.stmt(s.Body)
	case *ast.LabelledStatement:
		c.stmt(s.Statement)
	case *ast.SwitchStatement:
		c.expr(s.Discriminant)
		for _, cs := range s.Body {
			c.expr(cs.Test)
			c.stmts(cs.Consequent)
		}
	case *ast.TryStatement:
		c.stmt(s.Body)
		if s.Catch != nil {
			switch p := s.Catch.Parameter.(type) {
			case nil:
			case *ast.Identifier:
				c.declare(p)
			default:
				c.fail(s.Catch, "a destructuring catch parameter")
			}
			c.stmt(s.Catch.Body)
		}
		c.stmt(s.Finally)
	case *ast.ForInStatement:
		c.fail(s, "for-in")
	case *ast.ForOfStatement:
		c.fail(s, "for-of")
	case *ast.WithStatement:
		c.fail(s, "with")
	case *ast.ClassDeclaration:
		c.fail(s, "a class")
	case *ast.DebuggerStatement:
		c.fail(s, "debugger")
	default:
		c.fail(s, "a statement of type %T", s)
	}
}

func (c *classifier) bindings(list []*ast.Binding) {
	for _, b := range list {
		id, ok := b.Target.(*ast.Identifier)
		if !ok {
			c.fail(b, "destructuring")
			return
		}
		c.name(id)
		if c.collect {
			c.assign(id.Name.String(), b.Initializer)
		}
		c.expr(b.Initializer)
	}
}

// declare is a name bound to something that is not a number (parameters, functions,
// catch bindings), or any value at all.
func (c *classifier) declare(id *ast.Identifier) {
	c.name(id)
	if c.collect {
		c.notNumeric[id.Name.String()] = true
	}
}

// name checks an identifier: a global may only be a PAC built-in or in inlineGlobals.
func (c *classifier) name(id *ast.Identifier) {
	n := id.Name.String()
	if c.globals[n] && !inlineGlobals[n] && !pacGlobals[n] {
		c.fail(id, "the built-in %s", n)
	}
}

// prop checks a property name read or called through a member expression.
func (c *classifier) prop(n ast.Node, name string) {
	if strings.HasPrefix(name, "\x00") {
		c.fail(n, "a property name starting with NUL")
		return
	}
	if c.props[name] && !inlineProps[name] {
		c.fail(n, "the built-in property %s", name)
	}
}

func (c *classifier) function(f *ast.FunctionLiteral) {
	if f.Async || f.Generator {
		c.fail(f, "an async function or a generator")
		return
	}
	if f.Name != nil {
		c.declare(f.Name)
	}
	c.params(f.ParameterList)
	c.stmt(f.Body)
}

func (c *classifier) params(pl *ast.ParameterList) {
	if pl == nil {
		return
	}
	if pl.Rest != nil {
		c.fail(pl.Rest, "a rest parameter")
		return
	}
	for _, b := range pl.List {
		id, ok := b.Target.(*ast.Identifier)
		if !ok {
			c.fail(b, "a destructuring parameter")
			return
		}
		c.declare(id)
		c.expr(b.Initializer)
	}
}

func (c *classifier) exprs(list []ast.Expression) {
	for _, e := range list {
		if _, ok := e.(*ast.SpreadElement); ok {
			c.fail(e, "spread")
			return
		}
		c.expr(e)
	}
}

func (c *classifier) expr(e ast.Expression) {
	if c.why != "" {
		return
	}
	switch e := e.(type) {
	case nil:
	case *ast.NumberLiteral, *ast.StringLiteral, *ast.BooleanLiteral, *ast.NullLiteral, *ast.ThisExpression:
	case *ast.Identifier:
		c.name(e)
	case *ast.ArrayLiteral:
		c.exprs(e.Value)
	case *ast.ObjectLiteral:
		for _, p := range e.Value {
			switch p := p.(type) {
			case *ast.PropertyKeyed:
				if p.Computed {
					c.fail(p, "a computed property name")
					return
				}
				switch k := p.Key.(type) {
				case *ast.StringLiteral:
					// __proto__ sets the prototype; length would make o.length
					// something else than a number (isNumeric relies on it).
					if k.Value == "__proto__" || k.Value == "length" {
						c.fail(p, "the property key %s", k.Value)
						return
					}
				case *ast.NumberLiteral:
				default:
					c.fail(p, "a property key of type %T", k)
					return
				}
				c.expr(p.Value)
			case *ast.PropertyShort:
				if p.Initializer != nil {
					c.fail(p, "destructuring")
					return
				}
				c.name(&p.Name)
			default:
				c.fail(p, "an object literal element of type %T", p)
				return
			}
		}
	case *ast.FunctionLiteral:
		c.function(e)
	case *ast.ArrowFunctionLiteral:
		if e.Async {
			c.fail(e, "an async function")
			return
		}
		c.params(e.ParameterList)
		switch b := e.Body.(type) {
		case *ast.BlockStatement:
			c.stmt(b)
		case *ast.ExpressionBody:
			c.expr(b.Expression)
		default:
			c.fail(e, "an arrow function body of type %T", b)
		}
	case *ast.AssignExpression:
		c.assignTarget(e.Left, e)
		c.expr(e.Right)
	case *ast.UnaryExpression:
		if e.Operator == token.INCREMENT || e.Operator == token.DECREMENT || e.Operator == token.DELETE {
			c.assignTarget(e.Operand, nil)
			return
		}
		c.expr(e.Operand)
	case *ast.BinaryExpression:
		c.expr(e.Left)
		c.expr(e.Right)
	case *ast.ConditionalExpression:
		c.expr(e.Test)
		c.expr(e.Consequent)
		c.expr(e.Alternate)
	case *ast.SequenceExpression:
		c.exprs(e.Sequence)
	case *ast.DotExpression:
		c.prop(e, e.Identifier.Name.String())
		c.expr(e.Left)
	case *ast.BracketExpression:
		c.index(e)
		c.expr(e.Left)
	case *ast.CallExpression:
		if d, ok := e.Callee.(*ast.DotExpression); ok {
			if re, ok := d.Left.(*ast.RegExpLiteral); ok {
				if d.Identifier.Name != "test" {
					c.fail(e, "a regex literal used with %s (only /re/.test(s) runs inline)", d.Identifier.Name)
					return
				}
				c.regexp(re)
				if !c.collect {
					c.regexSites = append(c.regexSites, d)
				}
				c.exprs(e.ArgumentList)
				return
			}
		}
		c.expr(e.Callee)
		c.exprs(e.ArgumentList)
	case *ast.NewExpression:
		c.expr(e.Callee)
		c.exprs(e.ArgumentList)
	case *ast.TemplateLiteral:
		if e.Tag != nil {
			c.fail(e, "a tagged template")
			return
		}
		c.exprs(e.Expressions)
	case *ast.OptionalChain:
		c.expr(e.Expression)
	case *ast.Optional:
		c.expr(e.Expression)
	case *ast.RegExpLiteral:
		c.fail(e, "a regex literal other than /re/.test(s)")
	default:
		c.fail(e, "%s", describe(e))
	}
}

func describe(e ast.Expression) string {
	switch e.(type) {
	case *ast.ClassLiteral:
		return "a class"
	case *ast.YieldExpression:
		return "yield"
	case *ast.AwaitExpression:
		return "await"
	case *ast.SpreadElement:
		return "spread"
	case *ast.ObjectPattern, *ast.ArrayPattern:
		return "destructuring"
	case *ast.SuperExpression:
		return "super"
	case *ast.MetaProperty:
		return "new.target or import.meta"
	}
	return fmt.Sprintf("an expression of type %T", e)
}

// assignTarget checks the left side of an assignment (assign is the assignment, nil
// for ++, -- and delete, which keep a number a number).
func (c *classifier) assignTarget(t ast.Expression, assign *ast.AssignExpression) {
	switch t := t.(type) {
	case *ast.Identifier:
		c.name(t)
		if c.collect && assign != nil {
			c.assign(t.Name.String(), assign)
		}
	case *ast.DotExpression:
		name := t.Identifier.Name.String()
		// Writing a built-in property (a.length = 1e9, this.RegExp = ...) is never
		// inline; writing the script's own properties is, but such a name no longer
		// holds only numbers (this.i = "constructor" writes the global i).
		if c.props[name] || c.globals[name] {
			c.fail(t, "assigning the built-in property %s", name)
			return
		}
		if c.collect {
			c.notNumeric[name] = true
		}
		c.expr(t.Left)
	case *ast.BracketExpression:
		if s, ok := t.Member.(*ast.StringLiteral); ok {
			c.assignTarget(&ast.DotExpression{Left: t.Left, Identifier: ast.Identifier{Name: s.Value, Idx: s.Idx}}, assign)
			return
		}
		c.index(t)
		c.expr(t.Left)
	default:
		c.fail(t, "assigning to %s", describe(t))
	}
}

// index checks the key of x[k]: a string literal is a property name; otherwise the
// key must be a number, so that it names an element, never a property.
func (c *classifier) index(e *ast.BracketExpression) {
	switch k := e.Member.(type) {
	case *ast.StringLiteral:
		c.prop(e, k.Value.String())
		return
	case *ast.NumberLiteral:
		if f, ok := k.Value.(int64); ok && f >= 0 && f < maxInlineIndex {
			return
		}
		c.fail(e, "the index %s (only 0 to %d run inline)", k.Literal, maxInlineIndex-1)
		return
	}
	if c.collect {
		c.expr(e.Member)
		return
	}
	if !c.isNumeric(e.Member) {
		c.fail(e, "a computed member whose key is not provably a number")
		return
	}
	c.expr(e.Member)
}

// regexp checks that goja compiles a regex literal with Go's linear-time engine, the
// way goja's compileRegexp decides it, and that tests start at 0 (no g or y flag: with
// a lastIndex goja switches to its backtracking engine).
func (c *classifier) regexp(re *ast.RegExpLiteral) {
	if len(re.Pattern) > maxInlinePattern {
		c.fail(re, "a regex literal longer than %d bytes", maxInlinePattern)
		return
	}
	for i := 0; i < len(re.Pattern); i++ {
		if re.Pattern[i] >= 0x80 {
			c.fail(re, "a regex literal with non-ASCII characters")
			return
		}
	}
	dotAll, flags := false, ""
	for _, f := range re.Flags {
		switch f {
		case 'i', 'm':
			flags += string(f)
		case 's':
			dotAll = true
			flags += "s"
		default:
			c.fail(re, "a regex literal with the flag %c (only i, m and s run inline)", f)
			return
		}
	}
	pat, err := parser.TransformRegExp(re.Pattern, dotAll, false)
	if err != nil {
		c.fail(re, "a regex literal that needs goja's backtracking engine (%v)", err)
		return
	}
	if flags != "" {
		pat = "(?" + flags + ":" + pat + ")"
	}
	if _, err := regexp.Compile(pat); err != nil {
		c.fail(re, "a regex literal Go's regexp does not compile (%v)", err)
	}
}

// numericOp reports whether binary (or compound assignment) operator op always gives a
// number: every arithmetic and bitwise one but +.
func numericOp(op token.Token) bool {
	switch op {
	case token.MINUS, token.MULTIPLY, token.SLASH, token.REMAINDER, token.EXPONENT, token.SHIFT_LEFT,
		token.SHIFT_RIGHT, token.UNSIGNED_SHIFT_RIGHT, token.AND, token.OR, token.EXCLUSIVE_OR:
		return true
	}
	return false
}
