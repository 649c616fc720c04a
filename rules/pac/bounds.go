package pac

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/dop251/goja"
)

// maxStringChars bounds the strings that repeat, padStart, padEnd and Array join
// build, in every runtime. Those natives size their result from a number the script
// passes ("x".repeat(2**40), new Array(2**32 - 1).join("x")) and allocate it in one
// piece or grow towards it in a loop that goja's Interrupt cannot stop; an allocation
// the machine cannot make is a fatal error in Go, which would end the whole process,
// not just the call. Past the bound they throw a RangeError, as browsers do past
// theirs (V8: 2^29 - 24 characters). PAC scripts handle host names: 16 Mi characters
// is far more than any needs.
//
// Memory is still not bounded in general (docs/pac.md): these are the natives that
// turn a small script into an allocation of any size at once.
const maxStringChars = 1 << 24

// maxArguments bounds the argument lists apply and Reflect build, maxCopy the arrays
// sort and map take (see installBounds).
const (
	maxArguments = 1 << 16
	maxCopy      = 1 << 20
)

// native is a Go function goja's built-ins are made of.
type native = func(goja.FunctionCall) goja.Value

// builtinProto returns vm's ctor.prototype.
func builtinProto(vm *goja.Runtime, ctor string) (*goja.Object, error) {
	c, ok := vm.Get(ctor).(*goja.Object)
	if !ok {
		return nil, errors.New("no " + ctor)
	}
	p, ok := c.Get("prototype").(*goja.Object)
	if !ok {
		return nil, errors.New("no " + ctor + ".prototype")
	}
	return p, nil
}

// wrapNative replaces the native function o[key] (key a string or a *goja.Symbol) with
// wrap(the original), with the original's length and name: a script sees the same
// function either way (otherwise h.split.length was 0 in an inline pool and 2
// elsewhere, and h.split.name a Go path).
func wrapNative(vm *goja.Runtime, o *goja.Object, key any, wrap func(orig native) native) error {
	get := func() goja.Value {
		if sym, ok := key.(*goja.Symbol); ok {
			return o.GetSymbol(sym)
		}
		return o.Get(key.(string))
	}
	name := fmt.Sprint(key)
	origObj, ok := get().(*goja.Object)
	if !ok {
		return errors.New(name + " is not a function")
	}
	orig, ok := origObj.Export().(native)
	if !ok {
		return errors.New(name + " is not a native function")
	}
	f := vm.ToValue(wrap(orig)).(*goja.Object)
	for _, p := range []string{"length", "name"} {
		if err := f.DefineDataProperty(p, origObj.Get(p), goja.FLAG_FALSE, goja.FLAG_TRUE, goja.FLAG_FALSE); err != nil {
			return err
		}
	}
	if sym, ok := key.(*goja.Symbol); ok {
		return o.SetSymbol(sym, f)
	}
	return o.Set(name, f)
}

// maxMatches bounds the strings a regex searches all through (match, matchAll,
// replace and split with a regex): each match is an object of its own, about 150
// bytes, and a regex may match at every position ("x".repeat(2**24).match(/(?:)/g)
// took gigabytes). PAC scripts search URLs and host names.
const maxMatches = 1 << 18

// installBounds wraps the natives that allocate in proportion to a number the script
// passes, in one call that goja's Interrupt cannot stop, and removes three that PAC
// scripts have no use for (JSON, String.raw, Array.prototype.toLocaleString). Past a
// bound each throws a RangeError naming it: strings past maxStringChars, argument lists
// past maxArguments, arrays and array-likes past maxCopy elements, regex searches past
// maxMatches characters. The string ones convert their receiver and arguments once and
// hand the converted values on, so that a script's toString or valueOf runs once, as
// without the wrapper.
func (w *worker) installBounds() error {
	vm := w.vm
	// Captured before the script runs, which may replace the global RangeError.
	rangeError, ok := goja.AssertConstructor(vm.Get("RangeError"))
	if !ok {
		return errors.New("no RangeError")
	}
	throw := func(format string, a ...any) {
		o, err := rangeError(nil, vm.ToValue(fmt.Sprintf(format, a...)))
		if err != nil {
			panic(err)
		}
		panic(o)
	}
	tooLong := func(n float64) {
		throw("Invalid string length: %.0f characters, the bound is %d", n, maxStringChars)
	}
	// str is ToString(v) and its length in UTF-16 units.
	str := func(v goja.Value) (goja.Value, int) {
		s := v.ToString()
		if gs, ok := s.(goja.String); ok {
			return s, gs.Length()
		}
		return s, len(s.String())
	}
	// length is the length of a string, or the length property of an object.
	length := func(v goja.Value) float64 {
		switch v := v.(type) {
		case goja.String:
			return float64(v.Length())
		case *goja.Object:
			if l := v.Get("length"); l != nil {
				return l.ToFloat()
			}
		}
		return 0
	}
	unit := func(v goja.Value) string {
		if _, ok := v.(goja.String); ok {
			return "characters"
		}
		return "elements"
	}
	// limit bounds a native by the length of its receiver (i < 0) or argument i.
	limit := func(what string, i int, bound int) func(native) native {
		return func(orig native) native {
			return func(fc goja.FunctionCall) goja.Value {
				v := fc.This
				if i >= 0 {
					v = fc.Argument(i)
				}
				if n := length(v); n > float64(bound) {
					throw("too long to %s: %.0f %s, the bound is %d", what, n, unit(v), bound)
				}
				return orig(fc)
			}
		}
	}
	isArray := func(v goja.Value) (*goja.Object, bool) {
		o, ok := v.(*goja.Object)
		return o, ok && o.ClassName() == "Array"
	}
	sp, err := builtinProto(vm, "String")
	if err != nil {
		return err
	}
	fp, err := builtinProto(vm, "Function")
	if err != nil {
		return err
	}
	ap, err := builtinProto(vm, "Array")
	if err != nil {
		return err
	}
	rp, err := builtinProto(vm, "RegExp")
	if err != nil {
		return err
	}
	var objs [3]*goja.Object
	for i, n := range []string{"Reflect", "Object", "Array"} {
		if objs[i], ok = vm.Get(n).(*goja.Object); !ok {
			return errors.New("no " + n)
		}
	}
	reflect, object, array := objs[0], objs[1], objs[2]
	// replaceBound bounds a replacement's result: at most every position of the
	// string matches, and each $ in the replacement inserts at most the whole string.
	replaceBound := func(sl, matches int, repl goja.Value) {
		if _, ok := repl.(*goja.Object); ok {
			return // a function: JavaScript, which Interrupt stops
		}
		r := repl.String()
		if n := float64(sl) + float64(matches)*float64(len(r)+strings.Count(r, "$")*sl); n > maxStringChars {
			tooLong(n)
		}
	}
	// regexBound bounds a regex method that searches its whole argument 0.
	regexBound := func(what string) func(native) native {
		return func(orig native) native {
			return func(fc goja.FunctionCall) goja.Value {
				s, sl := str(fc.Argument(0))
				if sl > maxMatches {
					throw("too long to %s: %d characters, the bound is %d", what, sl, maxMatches)
				}
				args := append([]goja.Value{s}, fc.Arguments[min(1, len(fc.Arguments)):]...)
				if what == "replace" && len(args) > 1 {
					if _, ok := args[1].(*goja.Object); !ok {
						args[1] = args[1].ToString()
					}
					replaceBound(sl, sl+1, args[1])
				}
				return orig(goja.FunctionCall{This: fc.This, Arguments: args})
			}
		}
	}
	type wrapT struct {
		o    *goja.Object
		key  any
		wrap func(orig native) native
	}
	wraps := []wrapT{
		{sp, "repeat", func(orig native) native {
			return func(fc goja.FunctionCall) goja.Value {
				if goja.IsUndefined(fc.This) || goja.IsNull(fc.This) {
					return orig(fc) // goja's own TypeError
				}
				s, sl := str(fc.This)
				count := fc.Argument(0).ToNumber()
				if n := float64(sl) * count.ToFloat(); n > maxStringChars && !math.IsInf(n, 1) {
					tooLong(n)
				}
				return orig(goja.FunctionCall{This: s, Arguments: []goja.Value{count}})
			}
		}},
		{sp, "padStart", padBound(str, tooLong)},
		{sp, "padEnd", padBound(str, tooLong)},
		// concat adds up its receiver and any number of strings.
		{sp, "concat", func(orig native) native {
			return func(fc goja.FunctionCall) goja.Value {
				if goja.IsUndefined(fc.This) || goja.IsNull(fc.This) {
					return orig(fc)
				}
				s, total := str(fc.This)
				args := make([]goja.Value, len(fc.Arguments))
				for i, a := range fc.Arguments {
					var n int
					args[i], n = str(a)
					if total += n; total > maxStringChars {
						tooLong(float64(total))
					}
				}
				return orig(goja.FunctionCall{This: s, Arguments: args})
			}
		}},
		// split makes an array of one string per piece: "x".repeat(2**24).split("").
		{sp, "split", func(orig native) native {
			return func(fc goja.FunctionCall) goja.Value {
				sep := fc.Argument(0)
				if _, ok := sep.(*goja.Object); ok || goja.IsUndefined(fc.This) || goja.IsNull(fc.This) {
					return orig(fc) // a regex's split is bounded by regexBound
				}
				s, sl := str(fc.This)
				if sl > maxCopy && !goja.IsUndefined(sep) {
					pieces := sl
					if sep = sep.ToString(); sep.String() != "" {
						pieces = strings.Count(s.String(), sep.String()) + 1
					}
					if lim := fc.Argument(1); !goja.IsUndefined(lim) {
						pieces = min(pieces, int(uint32(lim.ToInteger())))
					}
					if pieces > maxCopy {
						throw("too long to split: %d pieces, the bound is %d", pieces, maxCopy)
					}
				}
				return orig(goja.FunctionCall{This: s, Arguments: append([]goja.Value{sep}, fc.Arguments[min(1, len(fc.Arguments)):]...)})
			}
		}},
		{sp, "replace", stringReplaceBound(str, replaceBound, false)},
		{sp, "replaceAll", stringReplaceBound(str, replaceBound, true)},
		// The string iterator: [..."x".repeat(2**24)] and Array.from(s) make one element
		// per character.
		{sp, goja.SymIterator, limit("iterate", -1, maxCopy)},
		{rp, goja.SymMatch, regexBound("match")},
		{rp, goja.SymMatchAll, regexBound("match")},
		{rp, goja.SymReplace, regexBound("replace")},
		{rp, goja.SymSplit, regexBound("split")},
		// apply, Reflect.apply and Reflect.construct make an argument list of the
		// array-like's length in one piece (f.apply(null, {length: 2**32 - 1}) asked
		// for 64 GiB). Browsers bound it too (SpiderMonkey: 500 000 arguments).
		{fp, "apply", argsBound(1, length, throw)},
		{reflect, "apply", argsBound(2, length, throw)},
		{reflect, "construct", argsBound(1, length, throw)},
		// Lists of a string's or an array-like's properties, one per index.
		{reflect, "ownKeys", limit("list the keys of", 0, maxCopy)},
		{array, "from", limit("make an array of", 0, maxCopy)},
		// concat copies its receiver and every array argument.
		{ap, "concat", func(orig native) native {
			return func(fc goja.FunctionCall) goja.Value {
				total := 1.0
				if o, ok := isArray(fc.This); ok {
					total = length(o)
				}
				for _, a := range fc.Arguments {
					n := 1.0
					if o, ok := a.(*goja.Object); ok {
						if sp := o.GetSymbol(goja.SymIsConcatSpreadable); sp != nil && !goja.IsUndefined(sp) {
							if sp.ToBoolean() {
								n = length(o)
							}
						} else if _, ok := isArray(o); ok {
							n = length(o)
						}
					}
					if total += n; total > maxCopy {
						throw("too long to concat: %.0f elements, the bound is %d", total, maxCopy)
					}
				}
				return orig(fc)
			}
		}},
		// flat recurses in Go once per level, and its result is every element it
		// reaches: counted first, up to maxCopy.
		{ap, "flat", func(orig native) native {
			return func(fc goja.FunctionCall) goja.Value {
				depth := 1.0
				if d := fc.Argument(0); !goja.IsUndefined(d) {
					depth = d.ToNumber().ToFloat()
				}
				o, ok := fc.This.(*goja.Object)
				if !ok {
					return orig(fc)
				}
				budget := float64(maxCopy)
				var count func(o *goja.Object, depth float64, level int)
				count = func(o *goja.Object, depth float64, level int) {
					if level > maxNativeDepth {
						throw("too deep to flat: nested deeper than %d", maxNativeDepth)
					}
					n := length(o)
					if depth < 1 {
						n, budget = 0, budget-n
					}
					for i := 0.0; i < n && budget >= 0; i++ {
						budget--
						if e, ok := isArray(o.Get(strconv.FormatFloat(i, 'f', -1, 64))); ok {
							count(e, depth-1, level+1)
						}
					}
					if budget < 0 {
						throw("too long to flat: more than %d elements, the bound is %d", maxCopy, maxCopy)
					}
				}
				count(o, depth, 0)
				return orig(fc)
			}
		}},
		{ap, "join", func(orig native) native { return w.join(length, str, tooLong, throw) }},
	}
	for _, m := range []string{"keys", "values", "entries", "getOwnPropertyNames", "getOwnPropertyDescriptors"} {
		wraps = append(wraps, wrapT{object, m, limit("list the properties of", 0, maxCopy)})
	}
	// Array methods that copy their receiver (sort copies a sparse array into a list of
	// its length first: new Array(2**32 - 1).sort() asked for 64 GiB; fill on the same
	// array makes it dense) or visit every index of it in Go (2**32 steps that Interrupt
	// cannot stop); the iterators feed spread, Array.from and for-of.
	for _, m := range []string{"sort", "map", "fill", "slice", "splice", "flatMap", "copyWithin", "reverse",
		"toReversed", "toSorted", "toSpliced", "with", "filter", "every", "some", "forEach", "reduce",
		"reduceRight", "find", "findIndex", "findLast", "findLastIndex", "indexOf", "lastIndexOf", "includes",
		"shift", "unshift", "keys", "entries", "values"} {
		wraps = append(wraps, wrapT{ap, m, limit(m, -1, maxCopy)})
	}
	for _, x := range wraps {
		if err := wrapNative(vm, x.o, x.key, x.wrap); err != nil {
			return err
		}
	}
	// Object.assign copies the properties of its sources.
	if err := wrapNative(vm, object, "assign", func(orig native) native {
		return func(fc goja.FunctionCall) goja.Value {
			for _, a := range fc.Arguments[min(1, len(fc.Arguments)):] {
				if n := length(a); n > maxCopy {
					throw("too long to list the properties of: %.0f %s, the bound is %d", n, unit(a), maxCopy)
				}
			}
			return orig(fc)
		}
	}); err != nil {
		return err
	}
	// values is also the arrays' iterator: one function under both names, as before.
	if err := ap.SetSymbol(goja.SymIterator, ap.Get("values")); err != nil {
		return err
	}
	if err := w.installConcatGuard(sp, throw); err != nil {
		return err
	}
	// JSON.stringify and JSON.parse recurse in Go once per level of nesting (a value
	// nested a million deep reached Go's stack limit), and stringify writes every hole
	// of a sparse array; String.raw joins every element of an array-like of any
	// length; toLocaleString calls each element's. PAC scripts need none of them (an
	// array's toLocaleString is now Object.prototype's: its toString, which is join).
	for _, d := range []struct {
		o    *goja.Object
		name string
	}{{vm.GlobalObject(), "JSON"}, {vm.Get("String").(*goja.Object), "raw"}, {ap, "toLocaleString"}} {
		if err := d.o.Delete(d.name); err != nil {
			return err
		}
	}
	return nil
}

// join is Array.prototype.join, which turns every element into a string: converted
// and measured here, one at a time, so that the result never passes maxStringChars,
// whatever the elements' own toString return (an array of a million copies of an
// array holding a 16 Mi-character string). Past maxCopy elements it throws too. An
// array that contains itself joins as "" where it recurs, as goja's own does.
func (w *worker) join(length func(goja.Value) float64, str func(goja.Value) (goja.Value, int), tooLong func(float64), throw func(string, ...any)) native {
	return func(fc goja.FunctionCall) goja.Value {
		o := fc.This.ToObject(w.vm)
		for _, j := range w.joining {
			if j.SameAs(o) {
				return w.vm.ToValue("")
			}
		}
		w.joining = append(w.joining, o)
		defer func() { w.joining = w.joining[:len(w.joining)-1] }()
		n := length(o)
		sep, sepLen := goja.Value(w.vm.ToValue(",")), 1
		if s := fc.Argument(0); !goja.IsUndefined(s) {
			sep, sepLen = str(s)
		}
		if n <= 0 {
			return w.vm.ToValue("")
		}
		if total := (n - 1) * float64(sepLen); total > maxStringChars {
			tooLong(total)
		}
		if n > maxCopy {
			throw("too long to join: %.0f elements, the bound is %d", n, maxCopy)
		}
		var b goja.StringBuilder
		total := 0
		for i := 0; i < int(n); i++ {
			if i > 0 {
				write(&b, sep)
			}
			e := o.Get(strconv.Itoa(i))
			if e == nil || goja.IsUndefined(e) || goja.IsNull(e) {
				continue
			}
			s, sl := str(e)
			if total += sl + sepLen; total > maxStringChars {
				tooLong(float64(total))
			}
			write(&b, s)
		}
		return b.String()
	}
}

// write appends the string v to b.
func write(b *goja.StringBuilder, v goja.Value) {
	if s, ok := v.(goja.String); ok {
		b.WriteString(s)
		return
	}
	b.WriteUTF8String(v.String())
}

// stringReplaceBound bounds String.prototype.replace and replaceAll with a string
// pattern (a regex's are bounded by regexBound).
func stringReplaceBound(str func(goja.Value) (goja.Value, int), bound func(sl, matches int, repl goja.Value), all bool) func(native) native {
	return func(orig native) native {
		return func(fc goja.FunctionCall) goja.Value {
			pat := fc.Argument(0)
			if _, ok := pat.(*goja.Object); ok || goja.IsUndefined(fc.This) || goja.IsNull(fc.This) {
				return orig(fc)
			}
			s, sl := str(fc.This)
			pat = pat.ToString()
			repl := fc.Argument(1)
			if _, ok := repl.(*goja.Object); !ok {
				repl = repl.ToString()
			}
			matches := 1
			if all {
				matches = sl + 1
			}
			bound(sl, matches, repl)
			return orig(goja.FunctionCall{This: s, Arguments: []goja.Value{pat, repl}})
		}
	}
}

// padBound bounds padStart and padEnd: their result has the length they are given.
func padBound(str func(goja.Value) (goja.Value, int), tooLong func(float64)) func(native) native {
	return func(orig native) native {
		return func(fc goja.FunctionCall) goja.Value {
			if goja.IsUndefined(fc.This) || goja.IsNull(fc.This) {
				return orig(fc)
			}
			s, sl := str(fc.This)
			n := fc.Argument(0).ToNumber()
			if f := n.ToFloat(); f > maxStringChars && f > float64(sl) {
				tooLong(f)
			}
			args := []goja.Value{n}
			if len(fc.Arguments) > 1 {
				args = append(args, fc.Arguments[1])
			}
			return orig(goja.FunctionCall{This: s, Arguments: args})
		}
	}
}

// argsBound bounds a native whose argument i is an array-like it copies into an
// argument list.
func argsBound(i int, length func(goja.Value) float64, throw func(string, ...any)) func(native) native {
	return func(orig native) native {
		return func(fc goja.FunctionCall) goja.Value {
			if n := length(fc.Argument(i)); n > maxArguments {
				throw("too many arguments: %.0f, the bound is %d", n, maxArguments)
			}
			return orig(fc)
		}
	}
}

// unallocatable are the globals removed from every runtime: ArrayBuffer and the typed
// arrays allocate their whole size at once (new ArrayBuffer(2**40) was a fatal error,
// as above), and PAC scripts have no use for them. Nothing else in goja makes one.
var unallocatable = []string{"ArrayBuffer", "SharedArrayBuffer", "DataView", "Int8Array", "Uint8Array",
	"Uint8ClampedArray", "Int16Array", "Uint16Array", "Int32Array", "Uint32Array", "Float16Array",
	"Float32Array", "Float64Array", "BigInt64Array", "BigUint64Array"}

// removeUnallocatable deletes the globals in unallocatable, before the script runs.
func (w *worker) removeUnallocatable() error {
	g := w.vm.GlobalObject()
	for _, name := range unallocatable {
		if err := g.Delete(name); err != nil {
			return err
		}
		if g.Get(name) != nil {
			return errors.New("cannot remove " + name)
		}
	}
	return nil
}
