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

// builtinNatives lists every own property of the built-ins (the global object, what
// it reaches, and the iterator and generator prototypes) whose value, getter or setter
// is a function: [holder, key, descriptor] triples. It runs in a fresh runtime before
// anything else, so it sees goja's own built-ins.
var builtinNatives = goja.MustCompile("natives.js", `(function () {
	var out = [], seen = new Set(), q = [globalThis,
		Object.getPrototypeOf([][Symbol.iterator]()), Object.getPrototypeOf(""[Symbol.iterator]()),
		Object.getPrototypeOf(new Map()[Symbol.iterator]()), Object.getPrototypeOf(new Set()[Symbol.iterator]()),
		Object.getPrototypeOf(/a/[Symbol.matchAll]("")), Object.getPrototypeOf(function* () {}),
		Object.getPrototypeOf(function* () {}()), Object.getPrototypeOf(async function () {})];
	while (q.length) {
		var o = q.pop();
		if (o === null || (typeof o !== "object" && typeof o !== "function") || seen.has(o)) continue;
		seen.add(o);
		q.push(Object.getPrototypeOf(o));
		Reflect.ownKeys(o).forEach(function (k) {
			var d = Object.getOwnPropertyDescriptor(o, k);
			if (typeof d.value === "function" || typeof d.get === "function" || typeof d.set === "function") out.push([o, k, d]);
			q.push(d.value, d.get, d.set);
		});
	}
	return out;
})()`, false)

// installDepth wraps every native method, getter and setter of the built-ins that is
// not a constructor with a count of the natives running (w.depth), which throws a
// RangeError past maxNativeDepth. eval keeps its identity (goja tells a direct eval by
// it). A function reachable under two names (Array.prototype.values and
// [Symbol.iterator]) gets one wrapper, so the two stay the same function. It runs
// before the PAC built-ins are installed: those are Go code that calls no script.
func (w *worker) installDepth() error {
	vm := w.vm
	v, err := vm.RunProgram(builtinNatives)
	if err != nil {
		return err
	}
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
	var list []*goja.Object
	if err := vm.ExportTo(v, &list); err != nil {
		return err
	}
	for _, e := range list {
		o, _ := e.Get("0").(*goja.Object)
		key, d := e.Get("1"), e.Get("2").(*goja.Object)
		if o == nil {
			return errors.New("a built-in's holder is not an object")
		}
		sym, isSym := key.(*goja.Symbol)
		name := key.String()
		enum, conf := flag(d, "enumerable"), flag(d, "configurable")
		if conf == goja.FLAG_FALSE {
			continue // Function.prototype[Symbol.hasInstance]: it converts nothing
		}
		if val := d.Get("value"); val != nil {
			nv := wrap(val)
			if nv == val {
				continue
			}
			if isSym {
				err = o.DefineDataPropertySymbol(sym, nv, flag(d, "writable"), conf, enum)
			} else {
				err = o.DefineDataProperty(name, nv, flag(d, "writable"), conf, enum)
			}
		} else {
			g, s := d.Get("get"), d.Get("set")
			ng, ns := wrap(g), wrap(s)
			if ng == g && ns == s {
				continue
			}
			if isSym {
				err = o.DefineAccessorPropertySymbol(sym, ng, ns, conf, enum)
			} else {
				err = o.DefineAccessorProperty(name, ng, ns, conf, enum)
			}
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}
