package pac

import (
	"errors"
	"fmt"

	"github.com/dop251/goja"
)

// noCodeGeneration says why a script cannot compile source at run time.
const noCodeGeneration = "code generation from strings is not available in PAC scripts"

// codeCompilers are the constructors that compile source text, as a script reaches
// them besides their global names: each function's constructor, and the constructors
// of generator and async functions, which have no global name.
var codeCompilers = goja.MustCompile("compilers.js", `[["Function", Function],
	["GeneratorFunction", Object.getPrototypeOf(function* () {}).constructor],
	["AsyncFunction", Object.getPrototypeOf(async function () {}).constructor]]`, false)

// removeCodeGeneration takes eval and the constructors that compile source out of the
// sandbox, before the script runs: goja's parser recurses in Go for each level of
// nesting, so eval("[".repeat(1e6)) or new Function(...) with such a string ended the
// process with a stack overflow, which the depth scan of Compile (depth.go) cannot see
// since the source is built at run time. eval is deleted (a call is a ReferenceError).
// Function, and the constructor property of the prototypes of ordinary, generator and
// async functions, become a function that throws a TypeError: no constructor, so new
// and Reflect.construct throw too. It keeps the original's prototype, so that
// f instanceof Function and f.constructor === Function still hold.
func (w *worker) removeCodeGeneration() error {
	vm := w.vm
	typeError, ok := goja.AssertConstructor(vm.Get("TypeError"))
	if !ok {
		return errors.New("no TypeError")
	}
	g := vm.GlobalObject()
	if err := g.Delete("eval"); err != nil {
		return err
	}
	v, err := vm.RunProgram(codeCompilers)
	if err != nil {
		return err
	}
	var list [][2]goja.Value
	if err := vm.ExportTo(v, &list); err != nil {
		return err
	}
	for _, c := range list {
		name := c[0].String()
		ctor, ok := c[1].(*goja.Object)
		if !ok {
			return fmt.Errorf("no %s", name)
		}
		proto, ok := ctor.Get("prototype").(*goja.Object)
		if !ok {
			return fmt.Errorf("no %s.prototype", name)
		}
		msg := vm.ToValue(name + ": " + noCodeGeneration)
		thrower := vm.ToValue(func(goja.FunctionCall) goja.Value {
			o, err := typeError(nil, msg)
			if err != nil {
				panic(err)
			}
			panic(o)
		}).(*goja.Object)
		for _, p := range []struct {
			name string
			v    goja.Value
		}{{"name", vm.ToValue(name)}, {"length", vm.ToValue(1)}, {"prototype", proto}} {
			if err := thrower.DefineDataProperty(p.name, p.v, goja.FLAG_FALSE, goja.FLAG_FALSE, goja.FLAG_FALSE); err != nil {
				return err
			}
		}
		if err := proto.DefineDataProperty("constructor", thrower, goja.FLAG_FALSE, goja.FLAG_FALSE, goja.FLAG_FALSE); err != nil {
			return err
		}
		if name == "Function" {
			if err := g.DefineDataProperty(name, thrower, goja.FLAG_TRUE, goja.FLAG_TRUE, goja.FLAG_FALSE); err != nil {
				return err
			}
		}
	}
	return nil
}
