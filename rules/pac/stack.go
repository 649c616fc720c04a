package pac

import (
	"reflect"
	"unsafe"

	"github.com/dop251/goja"
)

// goja drops its value stack whenever a top-level call returns (Runtime.leave sets
// vm.stack to nil), so every Eval allocated a new one and grew it once: about 400 bytes
// of the 450 a call of the corporate script allocates, and so most of its garbage
// collection, which is what kept two cores from doing twice the calls of one. A
// runtime of an inline pool keeps its own zeroed stack and gives it back to goja before
// each call, when goja has dropped its own. goja treats it as the fresh stack it would
// have allocated: same type, length 0, every slot nil.
//
// goja has no API for this. The field is found by name and type through reflection
// once; if goja's layout changes (no Runtime.vm pointer, no vm.stack of goja.Value)
// stackReuse stays off and calls allocate as before (TestStackReuse fails, to say so).
var stackReuse = func() (s struct {
	on              bool
	vmOff, stackOff uintptr
}) {
	vmf, ok := reflect.TypeFor[goja.Runtime]().FieldByName("vm")
	if !ok || vmf.Type.Kind() != reflect.Pointer || vmf.Type.Elem().Kind() != reflect.Struct {
		return s
	}
	sf, ok := vmf.Type.Elem().FieldByName("stack")
	if !ok || sf.Type.Kind() != reflect.Slice || sf.Type.Elem() != reflect.TypeFor[goja.Value]() {
		return s
	}
	s.on, s.vmOff, s.stackOff = true, vmf.Offset, sf.Offset
	return s
}()

// stackSlots is the size of a reused stack: enough for ordinary PAC functions (the
// corporate script uses about 25); deeper calls make goja grow its own, as before.
const stackSlots = 128

// lendStack gives the runtime w's stack if goja has none. Only between calls, on the
// goroutine that owns w.
func (w *worker) lendStack() {
	if !stackReuse.on {
		return
	}
	vm := *(*unsafe.Pointer)(unsafe.Add(unsafe.Pointer(w.vm), stackReuse.vmOff))
	if vm == nil {
		return
	}
	st := (*[]goja.Value)(unsafe.Add(vm, stackReuse.stackOff))
	if *st != nil {
		return
	}
	if w.stack == nil {
		w.stack = make([]goja.Value, stackSlots)
	} else {
		clear(w.stack) // what the last call left: goja expects a fresh, nil stack
	}
	*st = w.stack[:0]
}
