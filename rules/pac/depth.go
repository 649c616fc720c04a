package pac

import (
	"errors"
	"fmt"

	"github.com/dop251/goja"
)

// maxNativeDepth bounds goja's native functions running inside one another. A native
// that converts its receiver or an argument to a string calls that object's toString
// in Go, and when that toString is itself such a native (o.toString =
// String.prototype.trim; "" + o) the recursion never passes through JavaScript, so
// neither maxStack nor Interrupt sees it: it grew the goroutine's stack to Go's 1 GB
// limit, a fatal error that ended the whole process. Past the bound the innermost
// native throws a RangeError instead. A native called from JavaScript called from a
// native counts once per native, so ordinary callbacks (map inside forEach) stay far
// below it.
const maxNativeDepth = maxStack

// builtinRoots are the built-ins that the global object's properties do not reach:
// the prototypes of the iterators and of generator and async functions.
var builtinRoots = goja.MustCompile("roots.js", `[Object.getPrototypeOf([][Symbol.iterator]()),
	Object.getPrototypeOf(""[Symbol.iterator]()), Object.getPrototypeOf(new Map()[Symbol.iterator]()),
	Object.getPrototypeOf(new Set()[Symbol.iterator]()), Object.getPrototypeOf(/a/[Symbol.matchAll]("")),
	Object.getPrototypeOf(function* () {}), Object.getPrototypeOf(function* () {}()),
	Object.getPrototypeOf(async function () {})]`, false)

// installDepth wraps every native method, getter and setter of the built-ins that is
// not a constructor (goja's, the PAC functions, and the wrappers of bounds.go and
// guard.go, which convert their arguments before calling the native they wrap) with a
// count of the natives running (w.depth), which throws a RangeError past
// maxNativeDepth. eval keeps its identity (goja tells a direct eval by it). A function
// reachable under two names (Array.prototype.values and [Symbol.iterator]) gets one
// wrapper, so the two stay the same function.
func (w *worker) installDepth() error {
	vm := w.vm
	rangeError, ok := goja.AssertConstructor(vm.Get("RangeError"))
	if !ok {
		return errors.New("no RangeError")
	}
	tooDeep := fmt.Sprintf("native calls nested deeper than %d (a toString or valueOf that calls itself?)", maxNativeDepth)
	evalFn := vm.Get("eval")
	wrapped := map[*goja.Object]goja.Value{}
	wrap := func(f goja.Value) goja.Value {
		fo, ok := f.(*goja.Object)
		if !ok || fo.SameAs(evalFn) {
			return f
		}
		if _, ok := goja.AssertConstructor(fo); ok {
			return f
		}
		orig, ok := fo.Export().(native)
		if !ok {
			return f
		}
		if wf, ok := wrapped[fo]; ok {
			return wf
		}
		wf := vm.ToValue(func(fc goja.FunctionCall) goja.Value {
			if w.depth >= maxNativeDepth {
				o, err := rangeError(nil, vm.ToValue(tooDeep))
				if err != nil {
					panic(err)
				}
				panic(o)
			}
			w.depth++
			defer func() { w.depth-- }()
			return orig(fc)
		}).(*goja.Object)
		for _, p := range []string{"length", "name"} {
			if err := wf.DefineDataProperty(p, fo.Get(p), goja.FLAG_FALSE, goja.FLAG_TRUE, goja.FLAG_FALSE); err != nil {
				panic(err)
			}
		}
		wrapped[fo] = wf
		return wf
	}
	flag := func(d *goja.Object, name string) goja.Flag {
		if d.Get(name).ToBoolean() {
			return goja.FLAG_TRUE
		}
		return goja.FLAG_FALSE
	}
	// redefine puts the wrappers of property key of o in place, and queues the
	// objects its value and accessors are.
	redefine := func(o *goja.Object, key goja.Value, d *goja.Object, queue *[]*goja.Object) error {
		sym, isSym := key.(*goja.Symbol)
		name := key.String()
		enum, conf := flag(d, "enumerable"), flag(d, "configurable")
		if val := d.Get("value"); val != nil {
			if vo, ok := val.(*goja.Object); ok {
				*queue = append(*queue, vo)
			}
			nv := wrap(val)
			if nv == val || conf == goja.FLAG_FALSE { // Function.prototype[Symbol.hasInstance] converts nothing
				return nil
			}
			if isSym {
				return o.DefineDataPropertySymbol(sym, nv, flag(d, "writable"), conf, enum)
			}
			return o.DefineDataProperty(name, nv, flag(d, "writable"), conf, enum)
		}
		g, s := d.Get("get"), d.Get("set")
		ng, ns := wrap(g), wrap(s)
		if ng == g && ns == s || conf == goja.FLAG_FALSE {
			return nil
		}
		if isSym {
			return o.DefineAccessorPropertySymbol(sym, ng, ns, conf, enum)
		}
		return o.DefineAccessorProperty(name, ng, ns, conf, enum)
	}
	rv, err := vm.RunProgram(builtinRoots)
	if err != nil {
		return err
	}
	var queue []*goja.Object
	if err := vm.ExportTo(rv, &queue); err != nil {
		return err
	}
	gopd, ok := goja.AssertFunction(vm.Get("Object").(*goja.Object).Get("getOwnPropertyDescriptor"))
	if !ok {
		return errors.New("no Object.getOwnPropertyDescriptor")
	}
	queue = append(queue, vm.GlobalObject())
	seen := map[*goja.Object]bool{}
	for len(queue) > 0 {
		o := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		if o == nil || seen[o] {
			continue
		}
		seen[o] = true
		queue = append(queue, o.Prototype())
		var keys []goja.Value
		for _, k := range o.GetOwnPropertyNames() {
			keys = append(keys, vm.ToValue(k))
		}
		for _, k := range o.Symbols() {
			keys = append(keys, k)
		}
		for _, key := range keys {
			// Most are methods: read and replaced as they are (Set keeps the
			// attributes). The rest (constants, objects, accessors, and what cannot
			// be replaced) are looked at through their descriptor, which costs an
			// object each. A built-in getter read on its prototype returns no
			// function, or throws.
			sym, isSym := key.(*goja.Symbol)
			var v goja.Value
			if vm.Try(func() {
				if isSym {
					v = o.GetSymbol(sym)
				} else {
					v = o.Get(key.String())
				}
			}) == nil {
				if nv := wrap(v); nv != v {
					var err error
					if isSym {
						err = o.SetSymbol(sym, nv)
					} else {
						err = o.Set(key.String(), nv)
					}
					if err == nil {
						continue
					}
				}
			}
			dv, err := gopd(goja.Undefined(), o, key)
			if err != nil {
				return err
			}
			d, ok := dv.(*goja.Object)
			if !ok {
				continue
			}
			if err := redefine(o, key, d, &queue); err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
		}
	}
	return nil
}
