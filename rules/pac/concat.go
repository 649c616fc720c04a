package pac

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"

	"github.com/dop251/goja"
	"github.com/dop251/goja/ast"
	"github.com/dop251/goja/file"
	"github.com/dop251/goja/token"
	"github.com/dop251/goja/unistring"
)

// String concatenation is bounded like the natives of bounds.go: + and += copy both
// strings into a new one, and a template literal copies all its parts at once, in one
// step of goja's machine that Interrupt cannot stop. `for (;;) s += s` doubled a string
// at each turn; its last copies took hundreds of milliseconds past an inline call's
// deadline, and a template of many long strings allocated their sum in one piece. goja
// has no bound of its own, so guardConcat rewrites the syntax tree before it is
// compiled:
//
//   - a + b becomes ""["\x00concat"](a + b): a result past maxStringChars throws the
//     natives' RangeError before anything holds it. In a chain ("PROXY " + h + ":" +
//     p) the sums within need no check of their own until two operands that are not
//     literals went into them unchecked (see expr): one check where three were;
//   - x += v becomes x = ""["\x00concat"](x + v) when x is a name or a property of
//     names and literals, which evaluate the same twice; another target (a[i++] += v)
//     keeps its += and is checked after it stored the result;
//   - each substitution of a template literal is converted to a string as the
//     template would, and checked against maxStringChars shared among the template's
//     substitutions, so that their sum stays within it (plus the template's own text).
//
// A call that catches the RangeError and goes past the bound again is stopped: the
// second time the check interrupts it, which nothing can catch, so a result stored
// before its check (or a string that an object's toString made) grows no further
// than twice the bound. On an inline call a result past maxInlineString is a guard
// (guard.go): the call runs again handed off, where the caller leaves at its deadline
// however long the copies up to the bound take (tens of milliseconds, more when Go's
// collector runs meanwhile). A + of values that are never strings (1 + 2, i * 2 + 1,
// and on the inline path names that only ever hold numbers) is left alone: a check
// costs a native call, some 0.1 µs.
//
// The checks are natives on String.prototype, called on "" (so that no name a script
// or a with statement binds can stand in for them), and read-only before the script
// runs (installConcatGuard, lockConcatGuard).
const (
	concatCheck   = "\x00concat"
	templateCheck = "\x00template"
)

// guardConcat rewrites prog in place (see above). numeric, when not nil, reports
// expressions whose value is always a number (classify's, for an inline script).
func guardConcat(prog *ast.Program, numeric func(ast.Expression) bool) {
	g := &concatGuard{seen: map[any]bool{}, notString: map[*ast.BinaryExpression]bool{}, numeric: numeric,
		sums: map[ast.Expression]sum{}, raw: map[*ast.BinaryExpression]int{}}
	g.value(reflect.ValueOf(prog))
}

type concatGuard struct {
	seen      map[any]bool                   // structs already rewritten, by pointer (goja shares a var's bindings)
	notString map[*ast.BinaryExpression]bool // a + left alone: both sides are never strings
	numeric   func(ast.Expression) bool
	sums      map[ast.Expression]sum        // the checks of sums, by the call that checks
	raw       map[*ast.BinaryExpression]int // every sum's count of unchecked operands
}

// sum is a checked sum and how many operands of any length went into it unchecked.
type sum struct {
	e *ast.BinaryExpression
	n int
}

// inner is an operand of a sum: a sum that needs no check of its own (see expr) loses
// it.
func (g *concatGuard) inner(e ast.Expression) ast.Expression {
	if s, ok := g.sums[e]; ok && s.n < 2 {
		delete(g.sums, e)
		return s.e
	}
	return e
}

// weight is how many operands of any length went into e unchecked: none for a string
// literal, a template without substitutions or a value that is never a string, one
// for a checked sum or any other value.
func (g *concatGuard) weight(e ast.Expression) int {
	switch e := e.(type) {
	case *ast.StringLiteral:
		return 0
	case *ast.TemplateLiteral:
		if e.Tag == nil && len(e.Expressions) == 0 {
			return 0
		}
	case *ast.BinaryExpression:
		if n, ok := g.raw[e]; ok { // a sum without a check
			return n
		}
	}
	if g.isNotString(e) {
		return 0
	}
	return 1
}

var exprType = reflect.TypeFor[ast.Expression]()

// value rewrites the expressions under v, innermost first, replacing them in the
// fields and slices of type ast.Expression that hold them.
func (g *concatGuard) value(v reflect.Value) {
	switch v.Kind() {
	case reflect.Interface:
		if v.IsNil() {
			return
		}
		g.value(v.Elem())
		if v.Type() == exprType && v.CanSet() {
			e := v.Interface().(ast.Expression)
			if r := g.expr(e); r != e {
				v.Set(reflect.ValueOf(&r).Elem())
			}
		}
	case reflect.Pointer:
		if v.IsNil() || v.Type() == fileType || v.Elem().Kind() != reflect.Struct {
			return
		}
		p := v.Interface()
		if g.seen[p] {
			return
		}
		g.seen[p] = true
		g.value(v.Elem())
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if f := v.Field(i); f.CanSet() {
				g.value(f)
			}
		}
	case reflect.Slice:
		for i := 0; i < v.Len(); i++ {
			g.value(v.Index(i))
		}
	}
}

// expr returns what replaces e (e itself when nothing does).
func (g *concatGuard) expr(e ast.Expression) ast.Expression {
	switch e := e.(type) {
	case *ast.BinaryExpression:
		if e.Operator != token.PLUS {
			return e
		}
		if g.isNotString(e.Left) && g.isNotString(e.Right) {
			g.notString[e] = true
			return e
		}
		// Within a chain (a + b + c is (a + b) + c) a sum needs its own check only
		// once two operands of any length went into it unchecked: the operands that
		// are literals are bounded by the script's size. The outermost sum is checked
		// whenever one did, or s = s + "x" would grow without end: each sum is
		// checked as if outermost, and the check of an inner one is taken off again
		// here when it is not needed.
		e.Left, e.Right = g.inner(e.Left), g.inner(e.Right)
		n := g.weight(e.Left) + g.weight(e.Right)
		g.raw[e] = n
		if n == 0 {
			return e
		}
		c := check(e, concatCheck, e.Left.Idx0())
		g.sums[c] = sum{e, n}
		return c
	case *ast.AssignExpression:
		if e.Operator != token.PLUS || g.isNotString(e.Right) && g.isNotString(e.Left) {
			return e
		}
		e.Right = g.inner(e.Right) // checked with the sum
		if !pure(e.Left) {
			return check(e, concatCheck, e.Left.Idx0())
		}
		sum := &ast.BinaryExpression{Operator: token.PLUS, Left: e.Left, Right: e.Right}
		return &ast.AssignExpression{Operator: token.ASSIGN, Left: e.Left, Right: check(sum, concatCheck, e.Left.Idx0())}
	case *ast.TemplateLiteral:
		if e.Tag != nil {
			return e
		}
		n := &ast.NumberLiteral{Idx: e.OpenQuote, Literal: strconv.Itoa(len(e.Expressions)), Value: int64(len(e.Expressions))}
		for i, x := range e.Expressions {
			e.Expressions[i] = check(x, templateCheck, x.Idx0(), n)
		}
		return e
	}
	return e
}

// check is ""[name](args...), at idx for stack traces.
func check(arg ast.Expression, name string, idx file.Idx, more ...ast.Expression) ast.Expression {
	return &ast.CallExpression{
		Callee: &ast.DotExpression{
			Left:       &ast.StringLiteral{Idx: idx, Literal: `""`},
			Identifier: ast.Identifier{Name: unistring.String(name), Idx: idx},
		},
		LeftParenthesis:  idx,
		ArgumentList:     append([]ast.Expression{arg}, more...),
		RightParenthesis: idx,
	}
}

// isNotString: the expression's value is never a string, nor an object that + would
// make one of (a number, a boolean, null, undefined, a BigInt).
func (g *concatGuard) isNotString(e ast.Expression) bool {
	if g.numeric != nil && g.numeric(e) {
		return true
	}
	switch e := e.(type) {
	case *ast.NumberLiteral, *ast.BooleanLiteral, *ast.NullLiteral:
		return true
	case *ast.UnaryExpression:
		switch e.Operator {
		case token.MINUS, token.PLUS, token.BITWISE_NOT, token.NOT, token.INCREMENT, token.DECREMENT, token.VOID, token.DELETE:
			return true
		}
	case *ast.BinaryExpression:
		switch e.Operator {
		case token.PLUS:
			return g.notString[e]
		case token.EQUAL, token.NOT_EQUAL, token.STRICT_EQUAL, token.STRICT_NOT_EQUAL, token.LESS, token.GREATER,
			token.LESS_OR_EQUAL, token.GREATER_OR_EQUAL, token.IN, token.INSTANCEOF:
			return true
		}
		return numericOp(e.Operator)
	case *ast.AssignExpression:
		return numericOp(e.Operator)
	}
	return false
}

// pure: evaluating e twice does what evaluating it once does, so that x += v may
// become x = x + v: a name, this, a literal, or a property of those by name or by a
// name or literal key.
func pure(e ast.Expression) bool {
	switch e := e.(type) {
	case *ast.Identifier, *ast.ThisExpression, *ast.StringLiteral, *ast.NumberLiteral:
		return true
	case *ast.DotExpression:
		return pure(e.Left)
	case *ast.BracketExpression:
		return pure(e.Left) && pure(e.Member)
	}
	return false
}

// errConcat interrupts a call that went past maxStringChars by concatenation a second
// time, after catching the RangeError of the first (see above).
var errConcat = errors.New("concatenation past the bound again")

// concatMsg says why such a call failed.
var concatMsg = fmt.Sprintf("Invalid string length: past %d characters again after catching the RangeError", maxStringChars)

// installConcatGuard defines templateCheck on String.prototype (sp), writable until
// lockConcatGuard, so that installDepth wraps it: it converts objects, whose toString
// may be a native that converts again.
func (w *worker) installConcatGuard(sp *goja.Object, throw func(string, ...any)) error {
	vm := w.vm
	w.throwRange = throw
	return sp.Set(templateCheck, func(fc goja.FunctionCall) goja.Value {
		// The template's own conversion (ToString), which refuses a Symbol.
		v := fc.Argument(0)
		switch v.(type) {
		case goja.String: // as it is: ToString would box it again
		case *goja.Symbol:
		default:
			v = v.ToString()
		}
		if _, ok := v.(*goja.Symbol); ok {
			panic(vm.NewTypeError("Cannot convert a Symbol value to a string"))
		}
		return w.checkLen(v, int(max(fc.Argument(1).ToInteger(), 1)))
	})
}

// lockConcatGuard makes templateCheck (wrapped by installDepth by now) read-only and
// defines concatCheck, read-only too, before the script runs: no script can replace
// them. concatCheck calls nothing, so it needs no depth wrapper.
func (w *worker) lockConcatGuard() error {
	sp, err := builtinProto(w.vm, "String")
	if err != nil {
		return err
	}
	if err := sp.DefineDataProperty(templateCheck, sp.Get(templateCheck), goja.FLAG_FALSE, goja.FLAG_FALSE, goja.FLAG_FALSE); err != nil {
		return err
	}
	check := w.vm.ToValue(func(fc goja.FunctionCall) goja.Value {
		return w.checkLen(fc.Argument(0), 1)
	})
	return sp.DefineDataProperty(concatCheck, check, goja.FLAG_FALSE, goja.FLAG_FALSE, goja.FLAG_FALSE)
}

// checkLen returns v, a string no longer than its share of maxStringChars (parts
// strings share it: a template's substitutions), or of maxInlineString on an inline
// call, past which the call is handed off; see above for what happens past them.
func (w *worker) checkLen(v goja.Value, parts int) goja.Value {
	s, ok := v.(goja.String)
	if !ok {
		return v
	}
	switch n := s.Length(); {
	case n > maxInlineString/parts && w.inlineCall:
		// Past the inline bounds (guard.go): the next copies could be long, and an
		// inline call cannot be abandoned. Handed off, the caller leaves at its
		// deadline whatever the copies take.
		return w.trip()
	case n > maxStringChars/parts:
		if w.concatOver == w.gen+1 {
			w.vm.Interrupt(errConcat)
			return goja.Undefined()
		}
		w.concatOver = w.gen + 1
		if parts > 1 {
			w.throwRange("Invalid string length: a substitution of %d characters in a template of %d, the bound is %d", n, parts, maxStringChars)
		}
		w.throwRange("Invalid string length: %d characters, the bound is %d", n, maxStringChars)
	}
	return v
}
