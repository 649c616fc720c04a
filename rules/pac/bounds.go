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

// wrapNative replaces the native function o[name] with wrap(the original), with the
// original's length and name: a script sees the same function either way (otherwise
// h.split.length was 0 in an inline pool and 2 elsewhere, and h.split.name a Go path).
func wrapNative(vm *goja.Runtime, o *goja.Object, name string, wrap func(orig native) native) error {
	origObj, ok := o.Get(name).(*goja.Object)
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
	return o.Set(name, f)
}

// installBounds wraps repeat, padStart, padEnd and Array join (maxStringChars),
// Function.prototype.apply, Reflect.apply and Reflect.construct (maxArguments), and
// Array sort and map (maxCopy). The string ones convert their receiver and arguments
// once and hand the converted values on, so that a script's toString or valueOf runs
// once, as without the wrapper.
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
	// length is the length property of v when v is an object.
	length := func(v goja.Value) float64 {
		if o, ok := v.(*goja.Object); ok {
			if l := o.Get("length"); l != nil {
				return l.ToFloat()
			}
		}
		return 0
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
	reflect, ok := vm.Get("Reflect").(*goja.Object)
	if !ok {
		return errors.New("no Reflect")
	}
	wraps := []struct {
		o    *goja.Object
		name string
		wrap func(orig native) native
	}{
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
		// apply, Reflect.apply and Reflect.construct make an argument list of the
		// array-like's length in one piece (f.apply(null, {length: 2**32 - 1}) asked
		// for 64 GiB). Browsers bound it too (SpiderMonkey: 500 000 arguments).
		{fp, "apply", argsBound(1, length, throw)},
		{reflect, "apply", argsBound(2, length, throw)},
		{reflect, "construct", argsBound(1, length, throw)},
		// sort copies a sparse array or an array-like into a list of its length first
		// (new Array(2**32 - 1).sort() asked for 64 GiB), and map makes its result of
		// the source's length at once.
		{ap, "sort", copyBound("sort", length, throw)},
		{ap, "map", copyBound("map", length, throw)},
		{ap, "join", func(orig native) native {
			return func(fc goja.FunctionCall) goja.Value {
				o, ok := fc.This.(*goja.Object)
				if !ok {
					return orig(fc)
				}
				n := int64(length(o))
				sep, sepLen := fc.Argument(0), 1
				if !goja.IsUndefined(sep) {
					sep, sepLen = str(sep)
				}
				// The separators, then the elements that are strings (one of a few
				// bytes otherwise; an object's own join is bounded when it runs).
				total := float64(max(n-1, 0)) * float64(sepLen)
				for i := int64(0); i < n && total <= maxStringChars; i++ {
					if s, ok := o.Get(strconv.FormatInt(i, 10)).(goja.String); ok {
						total += float64(s.Length())
					}
				}
				if total > maxStringChars {
					tooLong(total)
				}
				return orig(goja.FunctionCall{This: fc.This, Arguments: []goja.Value{sep}})
			}
		}},
	}
	for _, x := range wraps {
		if err := wrapNative(vm, x.o, x.name, x.wrap); err != nil {
			return err
		}
	}
	return nil
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

// copyBound bounds an array method that copies its receiver whole.
func copyBound(name string, length func(goja.Value) float64, throw func(string, ...any)) func(native) native {
	return func(orig native) native {
		return func(fc goja.FunctionCall) goja.Value {
			if n := length(fc.This); n > maxCopy {
				throw("too long to %s: %.0f elements, the bound is %d", name, n, maxCopy)
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
