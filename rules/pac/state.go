package pac

import (
	"fmt"
	"reflect"
	"slices"

	"github.com/dop251/goja"
	"github.com/dop251/goja/ast"
	"github.com/dop251/goja/file"
	"github.com/dop251/goja/token"
)

// Calls are independent (SPEC §4.3, §7): a runtime serves many flows one after the
// other, and nothing a call does may change what the next one computes, or let it see
// the last flow's host. A fresh runtime per call would cost hundreds of times a call, so a
// runtime is instead sealed once its top-level code has run:
//
//   - The script's global variables (its top-level var names, every name it assigns or
//     deletes without declaring it, which sloppy code makes a global, and the built-in
//     globals it assigns or deletes by name or as this.x, this["x"]: Math = 1, escape =
//     h, delete Math, this.escape = h) are accessors kept by the worker: top-level code
//     sets their value (a built-in's starts as the built-in); during a call an
//     assignment holds until the call ends, and the next call starts from the top-level
//     value again. So `var n = 0; ... n++` counts within a call only, a forgotten `var`
//     works as in a browser, per call, and each call sees the built-ins top-level code
//     left. Deleting one has no effect (it throws in strict code).
//   - Every object the script's top-level code left reachable (from its variables, its
//     let, const and class bindings, its functions, what it put on the global object) is
//     frozen, and so are the properties it added to the global object (also those that
//     replaced a built-in: function escape() {...}), the PAC built-ins, Math and the
//     string, array and regex methods an inline script may call (freezeBuiltins); the
//     global object takes no new properties. A script that can hold the global object
//     as a value (globalAsValue: this[k] = ..., var g = this) could reach any of its
//     properties under a name it computes, so for it every property of the global
//     object becomes read-only (fixAll: it builds the built-ins not yet built, some
//     0.6 ms more to set up a runtime, of some 4 ms, which only such scripts pay). A call that writes to any of
//     them has no effect (in strict code, through push, defineProperty and the like,
//     it throws, and the call decides deny).
//   - Objects whose state is not in properties are reset before each call (a RegExp's
//     lastIndex with the g or y flag, a Date's time) or refused at load (Map, Set,
//     WeakMap, WeakSet, Proxy, generators, iterators, promises), and
//     RegExp.prototype.compile, which rewrites a RegExp in place, is removed (so are
//     typed arrays and buffers, for another reason: bounds.go).
//
// At load, checkState refuses what sealing cannot undo or would silently ignore: a
// function that assigns a top-level let, const, class or function binding, or writes a
// property of a top-level binding's value or of a built-in global (Math.x = ...,
// String.prototype.x = ...).
//
// Not covered, and documented as such: goja's other built-in objects are not frozen
// (that would build every built-in in every runtime: some 15 ms each, against 50 µs),
// so a script that changes one indirectly (Object.getPrototypeOf("").x = ...,
// var p = String.prototype; p.x = ..., which only the hand-off path can reach) shares
// it between calls; so does one that keeps state in the local variables of a function
// its top-level code called (a closure over an IIFE's var).

// globalVar is one of the script's global variables (see above).
type globalVar struct {
	base, cur goja.Value // the top-level value; the current call's, when gen is the call's
	gen       uint64     // the call that set cur (calls count from 1)
}

// stateNameLists are the names stateNames finds, and whether the script can hold the
// global object as a value (globalAsValue).
type stateNameLists struct {
	globals, lexicals, props []string
	globalValue              bool
}

// reset is an object whose state is outside its properties, put back before each call.
type reset struct {
	o    *goja.Object
	date bool    // a Date: setTime(time), else a RegExp: lastIndex = 0
	time float64 // the Date's time value at load
}

// sealHelpersJS captures, before the script runs, the built-ins that sealing uses, so that
// top-level code that replaces them (Object.freeze = ...) changes nothing. children
// calls emit for an object's prototype and every object or function its own properties
// hold (values, getters, setters); it reads only own properties of fresh objects and
// calls only captured functions.
const sealHelpersJS = `(function () {
	var O = Object, gOPN = O.getOwnPropertyNames, gOPS = O.getOwnPropertySymbols, gOPD = O.getOwnPropertyDescriptor,
		gPO = O.getPrototypeOf, hasOwn = O.hasOwn, R = RegExp.prototype;
	function obj(v) { return (typeof v === "object" && v !== null) || typeof v === "function"; }
	function children(o, emit) {
		var p = gPO(o), keys, i, d;
		if (p !== null) emit(p);
		for (var k = 0; k < 2; k++) {
			keys = k === 0 ? gOPN(o) : gOPS(o);
			for (i = 0; i < keys.length; i++) {
				d = gOPD(o, keys[i]);
				if (hasOwn(d, "value")) { if (obj(d.value)) emit(d.value); continue; }
				if (obj(d.get)) emit(d.get);
				if (obj(d.set)) emit(d.set);
			}
		}
	}
	var defineProperty = O.defineProperty;
	// fix makes a property the script's top-level code added to the global object
	// read-only, and returns what it holds (the getter of an accessor).
	function fix(g, k) {
		var d = gOPD(g, k);
		if (hasOwn(d, "value")) {
			defineProperty(g, k, {writable: false, configurable: false});
			return d.value;
		}
		defineProperty(g, k, {configurable: false});
		return d.get;
	}
	// fixAll makes every property of the global object that is not yet fixed
	// read-only.
	function fixAll(g) {
		for (var k = 0; k < 2; k++) {
			var keys = k === 0 ? gOPN(g) : gOPS(g);
			for (var i = 0; i < keys.length; i++) {
				var d = gOPD(g, keys[i]);
				if (d.configurable) {
					defineProperty(g, keys[i], hasOwn(d, "value") ? {writable: false, configurable: false} : {configurable: false});
				}
			}
		}
	}
	// replaceable says whether a global property can be made an accessor.
	function replaceable(g, k) { var d = gOPD(g, k); return !d || d.configurable; }
	return {
		children: children, fix: fix, fixAll: fixAll, replaceable: replaceable, freeze: O.freeze, preventExtensions: O.preventExtensions,
		global: gOPD(R, "global").get, sticky: gOPD(R, "sticky").get,
		getTime: Date.prototype.getTime, setTime: Date.prototype.setTime
	};
})()`

var sealHelpersProg = goja.MustCompile("kl-seal.js", sealHelpersJS, true)

// sealer holds what sealHelpersJS captured.
type sealer struct {
	children, fix, fixAll, replaceable, freeze, preventExtensions, global, sticky, getTime, setTime goja.Callable
}

// prepareState runs before the script's top-level code: it captures the sealing
// helpers, removes RegExp.prototype.compile and makes the script's global variables
// accessors.
func (w *worker) prepareState() (*sealer, error) {
	vm := w.vm
	v, err := vm.RunProgram(sealHelpersProg)
	if err != nil {
		return nil, err
	}
	h := v.ToObject(vm)
	s := &sealer{}
	for name, f := range map[string]*goja.Callable{"children": &s.children, "fix": &s.fix, "fixAll": &s.fixAll,
		"replaceable": &s.replaceable, "freeze": &s.freeze, "preventExtensions": &s.preventExtensions,
		"global": &s.global, "sticky": &s.sticky, "getTime": &s.getTime, "setTime": &s.setTime} {
		fn, ok := goja.AssertFunction(h.Get(name))
		if !ok {
			return nil, fmt.Errorf("no %s", name)
		}
		*f = fn
	}
	rp := vm.Get("RegExp").ToObject(vm).Get("prototype").ToObject(vm)
	if err := rp.Delete("compile"); err != nil {
		return nil, err
	}
	g := vm.GlobalObject()
	w.globals = make([]*globalVar, len(w.p.globals))
	for i, name := range w.p.globals {
		gv := &globalVar{}
		if v := g.Get(name); v != nil {
			// A built-in's name. The PAC built-ins are made read-only at seal. Others
			// start as the built-in, unless they cannot be replaced: NaN, undefined
			// and Infinity are read-only already.
			if pacGlobals[name] {
				continue
			}
			ok, err := s.replaceable(goja.Undefined(), g, vm.ToValue(name))
			if err != nil {
				return nil, err
			}
			if !ok.ToBoolean() {
				continue
			}
			gv.base = v
		}
		w.globals[i] = gv
		get := vm.ToValue(func(goja.FunctionCall) goja.Value {
			v := gv.base
			if gv.gen == w.gen && gv.gen != 0 { // assigned in this call
				v = gv.cur
			}
			if v == nil {
				return goja.Undefined()
			}
			return v
		})
		set := vm.ToValue(func(fc goja.FunctionCall) goja.Value {
			if w.loading {
				gv.base = fc.Argument(0)
			} else {
				gv.cur, gv.gen = fc.Argument(0), w.gen
			}
			return goja.Undefined()
		})
		if err := g.DefineAccessorProperty(name, get, set, goja.FLAG_FALSE, goja.FLAG_TRUE); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// refused are goja's objects whose state is outside their properties and that a call
// could change (freezing does not stop it); a script whose top-level code leaves one
// reachable is refused at load.
var refused = map[string]string{
	"*goja.mapObject": "a Map", "*goja.setObject": "a Set", "*goja.weakMapObject": "a WeakMap",
	"*goja.weakSetObject": "a WeakSet", "*goja.proxyObject": "a Proxy", "*goja.generatorObject": "a generator", "*goja.Promise": "a promise",
	"*goja.arrayIterObject": "an iterator", "*goja.mapIterObject": "an iterator",
	"*goja.setIterObject": "an iterator", "*goja.stringIterObject": "an iterator",
	"*goja.regExpStringIterObject": "an iterator",
}

// implType names the Go type behind a goja object ("*goja.mapObject"), which goja does
// not export: its Object keeps it in the unexported field self. "" if goja's layout
// changed (TestSealKnowsGoja fails, to say so).
func implType(o *goja.Object) string {
	f := reflect.ValueOf(o).Elem().FieldByName("self")
	if !f.IsValid() || f.Kind() != reflect.Interface || f.IsNil() {
		return ""
	}
	return f.Elem().Type().String()
}

// scriptTypes are goja's kinds of object that script code makes (and a few built-ins,
// such as Error.prototype, share): sealing freezes those it reaches and follows their
// properties. goja's lazily built intrinsics (the global object, Object.prototype,
// Array.prototype, Math, the native functions) are other kinds: sealing stops there,
// because freezing them would build every built-in in every runtime (about 40 times the
// cost of loading a script). checkState refuses the direct ways of changing them.
var scriptTypes = map[string]bool{
	"*goja.baseObject": true, "*goja.arrayObject": true, "*goja.sparseArrayObject": true,
	"*goja.funcObject": true, "*goja.arrowFuncObject": true, "*goja.methodFuncObject": true,
	"*goja.classFuncObject": true, "*goja.asyncFuncObject": true, "*goja.asyncArrowFuncObject": true,
	"*goja.asyncMethodFuncObject": true, "*goja.generatorFuncObject": true,
	"*goja.generatorMethodFuncObject": true, "*goja.boundFuncObject": true, "*goja.regexpObject": true,
	"*goja.dateObject": true, "*goja.errorObject": true, "*goja.argumentsObject": true,
	"*goja.primitiveValueObject": true, "*goja.stringObject": true,
}

// seal freezes what the script's top-level code left (see above), after it ran.
func (w *worker) seal(s *sealer) error {
	vm := w.vm
	g := vm.GlobalObject()
	type item struct {
		o    *goja.Object
		root string // the binding it was reached from, for messages
	}
	var stack []item
	push := func(v goja.Value, root string) {
		if o, ok := v.(*goja.Object); ok {
			stack = append(stack, item{o, root})
		}
	}
	for _, name := range w.p.lexicals {
		v, err := vm.RunString(name)
		if err != nil {
			return err
		}
		push(v, name)
	}
	for i, name := range w.p.globals {
		if gv := w.globals[i]; gv != nil {
			push(gv.base, name)
		}
	}
	// What top-level code added to the global object other than through its variables
	// (its functions, this.x = ...) becomes read-only, also where it replaced a
	// built-in (function escape() {...}). The PAC built-ins follow below.
	for _, name := range w.p.props {
		if !pacGlobals[name] && g.Get(name) != nil {
			v, err := s.fix(goja.Undefined(), g, vm.ToValue(name))
			if err != nil {
				return err
			}
			push(v, name)
		}
	}
	seen := map[*goja.Object]bool{}
	var cur item
	emit := vm.ToValue(func(fc goja.FunctionCall) goja.Value {
		if o, ok := fc.Argument(0).(*goja.Object); ok && !seen[o] {
			stack = append(stack, item{o, cur.root})
		}
		return goja.Undefined()
	})
	var visited []*goja.Object
	for len(stack) > 0 {
		cur = stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		o := cur.o
		if seen[o] {
			continue
		}
		seen[o] = true
		t := implType(o)
		if what, ok := refused[t]; ok {
			return fmt.Errorf("%s is reachable from %s after top-level code: a call could change it for the next one", what, cur.root)
		}
		if !scriptTypes[t] {
			continue
		}
		if _, err := s.children(goja.Undefined(), o, emit); err != nil {
			return err
		}
		visited = append(visited, o)
	}
	for _, o := range visited {
		switch implType(o) {
		case "*goja.regexpObject":
			g, err1 := s.global(o)
			y, err2 := s.sticky(o)
			if err1 == nil && err2 == nil && (g.ToBoolean() || y.ToBoolean()) {
				// test and exec move its lastIndex: keep it writable, set it back to 0
				// before each call.
				if _, err := s.preventExtensions(goja.Undefined(), o); err != nil {
					return err
				}
				w.resets = append(w.resets, reset{o: o})
				continue
			}
		case "*goja.dateObject":
			t, err := s.getTime(o)
			if err != nil {
				return err
			}
			w.resets = append(w.resets, reset{o: o, date: true, time: t.ToFloat()})
		}
		if _, err := s.freeze(goja.Undefined(), o); err != nil {
			return err
		}
	}
	// The global object takes no new properties, and the PAC built-ins stay what
	// they are.
	for name := range pacGlobals {
		if v := g.Get(name); v != nil {
			if err := g.DefineDataProperty(name, v, goja.FLAG_FALSE, goja.FLAG_FALSE, goja.FLAG_TRUE); err != nil {
				return err
			}
		}
	}
	if err := w.freezeBuiltins(s); err != nil {
		return err
	}
	if w.p.globalValue {
		if _, err := s.fixAll(goja.Undefined(), g); err != nil {
			return err
		}
	}
	if _, err := s.preventExtensions(goja.Undefined(), g); err != nil {
		return err
	}
	w.setTime = s.setTime
	return nil
}

// freezeBuiltins freezes the built-in objects that any script, also an inline one, can
// reach and write through a local name (var m = Math; m.x = h, dnsDomainIs.x = h,
// h.split.x = h), which checkState cannot see: the PAC built-ins, Math, and the
// functions inlineProps names on Math and the String, Array and RegExp prototypes. The
// prototypes themselves and the other built-ins are left alone (see above).
func (w *worker) freezeBuiltins(s *sealer) error {
	vm := w.vm
	g := vm.GlobalObject()
	var objs []*goja.Object
	add := func(v goja.Value) *goja.Object {
		o, ok := v.(*goja.Object)
		if ok {
			objs = append(objs, o)
		}
		return o
	}
	for name := range pacGlobals {
		add(g.Get(name))
	}
	holders := []*goja.Object{add(g.Get("Math"))}
	for _, ctor := range []string{"String", "Array", "RegExp"} {
		if c, ok := g.Get(ctor).(*goja.Object); ok {
			if p, ok := c.Get("prototype").(*goja.Object); ok {
				holders = append(holders, p)
			}
		}
	}
	for _, h := range holders {
		if h == nil {
			continue
		}
		for name := range inlineProps {
			if v := h.Get(name); v != nil {
				if _, ok := goja.AssertFunction(v); ok {
					add(v)
				}
			}
		}
	}
	for _, o := range objs {
		if _, err := s.freeze(goja.Undefined(), o); err != nil {
			return err
		}
	}
	return nil
}

// resetState starts a call: the global variables go back to their top-level values and
// the objects in resets to their state at load. It fails only when the script made a
// RegExp's lastIndex read-only, which no later call can undo: the runtime is retired.
func (w *worker) resetState() error {
	w.gen++
	for _, r := range w.resets {
		var err error
		if r.date {
			_, err = w.setTime(r.o, w.vm.ToValue(r.time))
		} else {
			err = r.o.Set("lastIndex", 0)
		}
		if err != nil {
			w.broken = true
			return err
		}
	}
	return nil
}

// stateNames lists, from the syntax tree, the script's global variables (its top-level
// var names and every name it assigns without a declaration anywhere in sight: sloppy
// code makes those globals; a name that is in fact local somewhere only gets an unused
// global; and the built-in globals it assigns through the global object, this.escape =
// ...), its top-level let, const and class names, and the other properties it can add
// to the global object (its functions, this.x = ...). It also says whether the script
// can hold the global object as a value (globalAsValue).
func stateNames(prog *ast.Program) (names stateNameLists) {
	vars, fixed, props := map[string]bool{}, map[string]bool{}, map[string]bool{}
	top := topLevel(prog)
	for _, n := range top.vars {
		vars[n] = true
	}
	names.lexicals = top.lexicals
	for _, n := range top.lexicals {
		fixed[n] = true
	}
	for _, n := range top.funcs {
		fixed[n], props[n] = true, true
	}
	walkAST(prog, func(n ast.Node) bool {
		forTargets(n, func(t ast.Expression) {
			switch t := t.(type) {
			case *ast.Identifier:
				vars[t.Name.String()] = true
			case *ast.DotExpression: // this.x, globalThis.x
				if onGlobal(t.Left) {
					props[t.Identifier.Name.String()] = true
				}
			case *ast.BracketExpression: // this["x"]
				if k, ok := t.Member.(*ast.StringLiteral); ok && onGlobal(t.Left) {
					props[k.Value.String()] = true
				}
			}
		})
		return true
	})
	// A built-in replaced through the global object is per call as it is by name.
	builtins, _ := builtinNames()
	for n := range props {
		if builtins[n] && !fixed[n] {
			vars[n] = true
		}
	}
	for n := range vars {
		if !fixed[n] {
			names.globals = append(names.globals, n)
		}
	}
	for n := range props {
		if !vars[n] || fixed[n] {
			names.props = append(names.props, n)
		}
	}
	slices.Sort(names.globals)
	slices.Sort(names.props)
	names.globalValue = globalAsValue(prog)
	return names
}

// topLevelNames are a script's top-level declarations.
type topLevelNames struct {
	vars     []string // var names (in any top-level block)
	lexicals []string // let, const and class names, in source order
	funcs    []string // function declaration names
}

// topLevel lists prog's top-level declarations (stateNames and checkState).
func topLevel(prog *ast.Program) (t topLevelNames) {
	for _, d := range prog.DeclarationList {
		for _, b := range d.List {
			t.vars = append(t.vars, boundNames(b.Target)...)
		}
	}
	for _, st := range prog.Body {
		switch st := st.(type) {
		case *ast.LexicalDeclaration:
			for _, b := range st.List {
				t.lexicals = append(t.lexicals, boundNames(b.Target)...)
			}
		case *ast.ClassDeclaration:
			if st.Class.Name != nil {
				t.lexicals = append(t.lexicals, st.Class.Name.Name.String())
			}
		case *ast.FunctionDeclaration:
			if st.Function.Name != nil {
				t.funcs = append(t.funcs, st.Function.Name.Name.String())
			}
		}
	}
	return t
}

// onGlobal: the expression may be the global object (this, globalThis, window, self).
func onGlobal(e ast.Expression) bool {
	switch e := e.(type) {
	case *ast.ThisExpression:
		return true
	case *ast.Identifier:
		switch e.Name {
		case "globalThis", "window", "self":
			return true
		}
	}
	return false
}

// globalAsValue reports whether a script can hold the global object as a value, and
// so reach any global by a name it computes or through a variable: this, globalThis
// (or window and self) anywhere but as the object of a property access by a literal
// name (this.x, globalThis["x"]). Any function's this counts, since a plain call of
// a function gives it the global object.
func globalAsValue(prog *ast.Program) bool {
	literal := map[ast.Node]bool{} // nodes used as the object of a literal access
	found := false
	walkAST(prog, func(n ast.Node) bool {
		if found {
			return false
		}
		switch n := n.(type) {
		case *ast.DotExpression:
			literal[n.Left] = true
			literal[&n.Identifier] = true // a property name, not a reference
		case *ast.BracketExpression:
			switch n.Member.(type) {
			case *ast.StringLiteral, *ast.NumberLiteral:
				literal[n.Left] = true
			}
		case *ast.ThisExpression:
			found = !literal[n]
		case *ast.Identifier:
			found = onGlobal(n) && !literal[n]
		}
		return !found
	})
	return found
}

// forTargets calls fn for each simple target (an identifier or a member expression)
// that the node assigns: =, op=, ++, --, delete, for-in/of into an expression, and the
// targets inside a destructuring assignment.
func forTargets(n ast.Node, fn func(ast.Expression)) {
	switch n := n.(type) {
	case *ast.AssignExpression:
		patternTargets(n.Left, fn)
	case *ast.UnaryExpression:
		if n.Operator == token.INCREMENT || n.Operator == token.DECREMENT || n.Operator == token.DELETE {
			fn(n.Operand)
		}
	case *ast.ForInStatement:
		if in, ok := n.Into.(*ast.ForIntoExpression); ok {
			patternTargets(in.Expression, fn)
		}
	case *ast.ForOfStatement:
		if in, ok := n.Into.(*ast.ForIntoExpression); ok {
			patternTargets(in.Expression, fn)
		}
	}
}

func patternTargets(e ast.Expression, fn func(ast.Expression)) {
	switch e := e.(type) {
	case *ast.ArrayPattern:
		for _, el := range e.Elements {
			patternTargets(el, fn)
		}
		patternTargets(e.Rest, fn)
	case *ast.ObjectPattern:
		for _, p := range e.Properties {
			switch p := p.(type) {
			case *ast.PropertyShort:
				fn(&p.Name)
			case *ast.PropertyKeyed:
				patternTargets(p.Value, fn)
			}
		}
		patternTargets(e.Rest, fn)
	case *ast.AssignExpression: // a target with its default value
		patternTargets(e.Left, fn)
	case *ast.SpreadElement:
		patternTargets(e.Expression, fn)
	case nil:
	default:
		fn(e)
	}
}

// boundNames lists the identifiers in a binding target (a name or a pattern). Names in
// default values come along: callers use it where more names is the safe side.
func boundNames(t ast.Node) []string {
	var out []string
	walkAST(t, func(n ast.Node) bool {
		if id, ok := n.(*ast.Identifier); ok {
			out = append(out, id.Name.String())
		}
		return true
	})
	return out
}

// checkState refuses a script whose calls would change state that sealing does not
// reach or that would silently not change (see above): code in a function (other than
// one top-level code calls on the spot, an IIFE) that assigns a top-level let, const,
// class or function binding, or writes a property of a top-level binding's value or of
// a built-in global. Names declared in the function or around it shadow them.
func checkState(prog *ast.Program) *CompileError {
	c := &stateCheck{file: prog.File, lexical: map[string]bool{}, top: map[string]bool{}}
	c.globals, _ = builtinNames()
	top := topLevel(prog)
	for _, n := range top.vars {
		c.top[n] = true
	}
	for _, n := range slices.Concat(top.lexicals, top.funcs) {
		c.lexical[n], c.top[n] = true, true
	}
	for _, st := range prog.Body {
		c.walk(st, nil, false)
	}
	return c.err
}

type stateCheck struct {
	file    *file.File
	lexical map[string]bool // top-level let, const, class and function names
	top     map[string]bool // every top-level name
	globals map[string]bool // goja's built-in globals
	err     *CompileError
}

// walk checks the code under n. scopes are the names declared by the enclosing
// functions; call: the code runs during a call (in a function), not at load.
func (c *stateCheck) walk(n ast.Node, scopes []map[string]bool, call bool) {
	walkAST(n, func(n ast.Node) bool {
		if c.err != nil {
			return false
		}
		switch n := n.(type) {
		case *ast.FunctionLiteral, *ast.ArrowFunctionLiteral:
			c.function(n, scopes, true)
			return false
		case *ast.CallExpression:
			if !call && c.loadTimeCall(n.Callee, n.ArgumentList, scopes) {
				return false
			}
		case *ast.NewExpression:
			if !call && c.loadTimeCall(n.Callee, n.ArgumentList, scopes) {
				return false
			}
		}
		if call {
			forTargets(n, func(t ast.Expression) { c.target(t, scopes) })
		}
		return true
	})
}

// loadTimeCall walks a function that top-level code calls at once (an IIFE, plain or
// with new) as load-time code, and its arguments; it reports whether callee was one.
func (c *stateCheck) loadTimeCall(callee ast.Expression, args []ast.Expression, scopes []map[string]bool) bool {
	f := iife(callee)
	if f == nil {
		return false
	}
	c.function(f, scopes, false)
	for _, a := range args {
		c.walk(a, scopes, false)
	}
	return true
}

// function walks a function literal or arrow function with its own names in scope.
func (c *stateCheck) function(f ast.Node, scopes []map[string]bool, call bool) {
	var (
		params *ast.ParameterList
		body   ast.Node
		name   *ast.Identifier
	)
	switch f := f.(type) {
	case *ast.FunctionLiteral:
		params, body, name = f.ParameterList, f.Body, f.Name
	case *ast.ArrowFunctionLiteral:
		params, body = f.ParameterList, f.Body
	}
	decl := declared(params, body)
	if name != nil {
		decl[name.Name.String()] = true
	}
	inner := append(slices.Clip(scopes), decl)
	if params != nil {
		c.walk(params, inner, call)
	}
	c.walk(body, inner, call)
}

// target checks one assignment target in code that runs during a call.
func (c *stateCheck) target(t ast.Expression, scopes []map[string]bool) {
	local := func(name string) bool {
		for _, s := range scopes {
			if s[name] {
				return true
			}
		}
		return false
	}
	switch t := t.(type) {
	case *ast.Identifier:
		if n := t.Name.String(); c.lexical[n] && !local(n) {
			c.fail(t, "a function assigns the top-level %s", n)
		}
		return
	}
	base := t
	for {
		switch e := base.(type) {
		case *ast.DotExpression:
			base = e.Left
			continue
		case *ast.BracketExpression:
			base = e.Left
			continue
		case *ast.PrivateDotExpression:
			base = e.Left
			continue
		}
		break
	}
	if id, ok := base.(*ast.Identifier); ok && base != t {
		if n := id.Name.String(); (c.top[n] || c.globals[n] || pacGlobals[n]) && !local(n) {
			c.fail(t, "a function changes a property of the top-level %s", n)
		}
	}
}

func (c *stateCheck) fail(n ast.Node, format string, a ...any) {
	if c.err != nil {
		return
	}
	c.err = &CompileError{Code: CodeScript, Msg: fmt.Sprintf(format, a...) +
		": a call must not leave state for the next one (compute it in top-level code, or in the call)"}
	if c.file != nil {
		c.err.Line = c.file.Position(int(n.Idx0())).Line
	}
}

// iife is the function a call expression calls on the spot: (function () {...})(),
// (() => ...)(), and their .call(...) and .apply(...) forms.
func iife(callee ast.Expression) ast.Node {
	if d, ok := callee.(*ast.DotExpression); ok && (d.Identifier.Name == "call" || d.Identifier.Name == "apply") {
		callee = d.Left
	}
	switch f := callee.(type) {
	case *ast.FunctionLiteral:
		return f
	case *ast.ArrowFunctionLiteral:
		return f
	}
	return nil
}

// declared lists the names a function declares: its parameters, and every var, let,
// const, class, function and catch binding in its body outside nested functions (a
// block's let counts for the whole function: more names is the safe side).
func declared(params *ast.ParameterList, body ast.Node) map[string]bool {
	out := map[string]bool{}
	add := func(t ast.Node) {
		for _, n := range boundNames(t) {
			out[n] = true
		}
	}
	if params != nil {
		add(params)
	}
	walkAST(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FunctionLiteral, *ast.ArrowFunctionLiteral, *ast.ClassLiteral:
			return false
		case *ast.FunctionDeclaration:
			if n.Function.Name != nil {
				out[n.Function.Name.Name.String()] = true
			}
			return false
		case *ast.ClassDeclaration:
			if n.Class.Name != nil {
				out[n.Class.Name.Name.String()] = true
			}
			return false
		case *ast.Binding:
			add(n.Target)
		case *ast.CatchStatement:
			if n.Parameter != nil {
				add(n.Parameter)
			}
		case *ast.ForDeclaration:
			add(n.Target)
		}
		return true
	})
	return out
}

var (
	nodeType = reflect.TypeFor[ast.Node]()
	fileType = reflect.TypeFor[*file.File]()
)

// walkAST calls fn for every node under n (n included), depth first; when fn returns
// false the node's children are skipped. goja's ast package has no walker: this one
// follows every field by reflection, so that no kind of node is missed.
func walkAST(n ast.Node, fn func(ast.Node) bool) {
	walkASTDepth(n, func(n ast.Node, _ int) bool { return fn(n) })
}

// walkASTDepth is walkAST telling fn how many nodes are above each (0 for n).
func walkASTDepth(n ast.Node, fn func(ast.Node, int) bool) {
	if n == nil {
		return
	}
	v := reflect.ValueOf(n)
	if v.Kind() == reflect.Pointer && v.IsNil() {
		return
	}
	walkValue(v, 0, fn)
}

func walkValue(v reflect.Value, depth int, fn func(ast.Node, int) bool) {
	switch v.Kind() {
	case reflect.Interface:
		if !v.IsNil() {
			walkValue(v.Elem(), depth, fn)
		}
	case reflect.Pointer:
		if v.IsNil() || v.Type() == fileType {
			return
		}
		below := depth
		if v.Type().Implements(nodeType) {
			if !fn(v.Interface().(ast.Node), depth) {
				return
			}
			below++
		}
		if v.Elem().Kind() == reflect.Struct {
			walkFields(v.Elem(), below, fn)
		}
	case reflect.Struct:
		// A node held by value (PropertyShort.Name, a LexicalDeclaration in a for
		// loop): visit it through its address.
		below := depth
		if v.CanAddr() && v.Addr().Type().Implements(nodeType) {
			if !fn(v.Addr().Interface().(ast.Node), depth) {
				return
			}
			below++
		}
		walkFields(v, below, fn)
	case reflect.Slice:
		for i := 0; i < v.Len(); i++ {
			walkValue(v.Index(i), depth, fn)
		}
	}
}

func walkFields(v reflect.Value, depth int, fn func(ast.Node, int) bool) {
	for i := 0; i < v.NumField(); i++ {
		if f := v.Field(i); f.CanInterface() {
			walkValue(f, depth, fn)
		}
	}
}
