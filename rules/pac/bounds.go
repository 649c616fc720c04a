package pac

import (
	"errors"
	"fmt"
	"math"
	"strconv"

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

// installBounds wraps repeat, padStart, padEnd and Array join (maxStringChars),
// Function.prototype.apply, Reflect.apply and Reflect.construct (maxArguments), and
// Array sort and map (maxCopy). The
// string ones convert their receiver and arguments once and hand the converted values
// on, so that a script's toString or valueOf runs once, as without the wrapper.
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
	fail := func(n float64) {
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
	native := func(o *goja.Object, name string) (func(goja.FunctionCall) goja.Value, error) {
		f, ok := o.Get(name).Export().(func(goja.FunctionCall) goja.Value)
		if !ok {
			return nil, errors.New(name + " is not a native function")
		}
		return f, nil
	}
	proto := func(ctor string) (*goja.Object, error) {
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
	sp, err := proto("String")
	if err != nil {
		return err
	}
	repeat, err := native(sp, "repeat")
	if err != nil {
		return err
	}
	if err := sp.Set("repeat", func(fc goja.FunctionCall) goja.Value {
		if goja.IsUndefined(fc.This) || goja.IsNull(fc.This) {
			return repeat(fc) // goja's own TypeError
		}
		s, sl := str(fc.This)
		count := fc.Argument(0).ToNumber()
		if n := float64(sl) * count.ToFloat(); n > maxStringChars && !math.IsInf(n, 1) {
			fail(n)
		}
		return repeat(goja.FunctionCall{This: s, Arguments: []goja.Value{count}})
	}); err != nil {
		return err
	}
	for _, name := range []string{"padStart", "padEnd"} {
		pad, err := native(sp, name)
		if err != nil {
			return err
		}
		if err := sp.Set(name, func(fc goja.FunctionCall) goja.Value {
			if goja.IsUndefined(fc.This) || goja.IsNull(fc.This) {
				return pad(fc)
			}
			s, sl := str(fc.This)
			n := fc.Argument(0).ToNumber()
			if f := n.ToFloat(); f > maxStringChars && f > float64(sl) {
				fail(f)
			}
			args := []goja.Value{n}
			if len(fc.Arguments) > 1 {
				args = append(args, fc.Arguments[1])
			}
			return pad(goja.FunctionCall{This: s, Arguments: args})
		}); err != nil {
			return err
		}
	}
	// apply, Reflect.apply and Reflect.construct make an argument list of the
	// array-like's length in one piece (f.apply(null, {length: 2**32 - 1}) asked for
	// 64 GiB). Browsers bound it too (SpiderMonkey: 500 000 arguments).
	tooMany := func(v goja.Value) {
		if o, ok := v.(*goja.Object); ok {
			if l := o.Get("length"); l != nil {
				if n := l.ToFloat(); n > maxArguments {
					throw("too many arguments: %.0f, the bound is %d", n, maxArguments)
				}
			}
		}
	}
	fp, err := proto("Function")
	if err != nil {
		return err
	}
	apply, err := native(fp, "apply")
	if err != nil {
		return err
	}
	if err := fp.Set("apply", func(fc goja.FunctionCall) goja.Value {
		tooMany(fc.Argument(1))
		return apply(fc)
	}); err != nil {
		return err
	}
	reflect, ok := vm.Get("Reflect").(*goja.Object)
	if !ok {
		return errors.New("no Reflect")
	}
	for name, arg := range map[string]int{"apply": 2, "construct": 1} {
		f, err := native(reflect, name)
		if err != nil {
			return err
		}
		if err := reflect.Set(name, func(fc goja.FunctionCall) goja.Value {
			tooMany(fc.Argument(arg))
			return f(fc)
		}); err != nil {
			return err
		}
	}
	ap, err := proto("Array")
	if err != nil {
		return err
	}
	// sort copies a sparse array or an array-like into a list of its length first
	// (new Array(2**32 - 1).sort() asked for 64 GiB), and map makes its result of the
	// source's length at once.
	for _, name := range []string{"sort", "map"} {
		f, err := native(ap, name)
		if err != nil {
			return err
		}
		if err := ap.Set(name, func(fc goja.FunctionCall) goja.Value {
			if o, ok := fc.This.(*goja.Object); ok {
				if l := o.Get("length"); l != nil {
					if n := l.ToFloat(); n > maxCopy {
						throw("too long to %s: %.0f elements, the bound is %d", name, n, maxCopy)
					}
				}
			}
			return f(fc)
		}); err != nil {
			return err
		}
	}
	join, err := native(ap, "join")
	if err != nil {
		return err
	}
	return ap.Set("join", func(fc goja.FunctionCall) goja.Value {
		o, ok := fc.This.(*goja.Object)
		if !ok {
			return join(fc)
		}
		l := o.Get("length")
		if l == nil {
			return join(fc)
		}
		n := l.ToInteger()
		sep := fc.Argument(0)
		sepLen := 1
		if !goja.IsUndefined(sep) {
			sep, sepLen = str(sep)
		}
		// The separators, then the elements that are strings (one of a few bytes
		// otherwise; an object's own join is bounded when it runs).
		total := float64(max(n-1, 0)) * float64(sepLen)
		for i := int64(0); i < n && total <= maxStringChars; i++ {
			if s, ok := o.Get(strconv.FormatInt(i, 10)).(goja.String); ok {
				total += float64(s.Length())
			}
		}
		if total > maxStringChars {
			fail(total)
		}
		return join(goja.FunctionCall{This: fc.This, Arguments: []goja.Value{sep}})
	})
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
