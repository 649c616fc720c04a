package pac

import (
	"errors"
	"strconv"

	"github.com/dop251/goja"
)

// Run-time guards of the inline path (see inline.go). The natives an inline script can
// reach whose cost per byte of input is well above a copy's get their input measured
// first, on inline calls only: past these bounds the inline attempt stops (an
// Interrupt, which the script cannot catch) and the call runs again on the hand-off
// path, whose abandonment copes with anything. Real PAC calls stay far below them: a
// host name is at most 253 bytes. The bounds keep the slowest guarded native (split
// of an 8 Ki-character UTF-16 string) to a few milliseconds, which is how late past its
// deadline an inline call can be stopped.
const (
	maxInlineString  = 8 << 10 // a string into a guarded native or a PAC built-in, or made by + (concat.go)
	maxInlineArray   = 1 << 16 // elements of an array searched by indexOf/includes or sliced
	maxInlineJoin    = 1 << 12 // elements of an array turned into a string
	maxInlineSearch  = 4 << 10 // a string searched for in an array
	maxInlineRegexIn = 1 << 10 // the input of /re/.test
	maxInlineShexp   = 1 << 10 // shExpMatch's subject
	maxInlineShexpP  = 256     // shExpMatch's pattern (compiled to a Go regexp)
)

// errHandoff interrupts an inline call that reached a guard.
var errHandoff = errors.New("input past the inline bound")

// trip stops the inline attempt: the call is run again on the hand-off path.
func (w *worker) trip() goja.Value {
	w.tripped = true
	w.vm.Interrupt(errHandoff)
	return goja.Undefined()
}

// guardLen is s, or "" after tripping when s is past n bytes on an inline call (so
// that the built-in it goes to returns at once).
func (w *worker) guardLen(s string, n int) string {
	if w.inlineCall && len(s) > n {
		w.trip()
		return ""
	}
	return s
}

// installGuards wraps the guarded natives of an inline pool's runtime. The wrappers
// cost a type switch when the call is not inline.
func (w *worker) installGuards() error {
	vm := w.vm
	proto := func(ctor string) (*goja.Object, error) { return builtinProto(vm, ctor) }
	wrap := func(o *goja.Object, name string, ok func(fc goja.FunctionCall) bool) error {
		return wrapNative(vm, o, name, func(orig native) native {
			return func(fc goja.FunctionCall) goja.Value {
				if w.inlineCall && !ok(fc) {
					return w.trip()
				}
				return orig(fc)
			}
		})
	}
	strLen := func(v goja.Value) int {
		if s, ok := v.(goja.String); ok {
			return s.Length()
		}
		return 0
	}
	// Strings: the receiver and every string argument.
	stringOK := func(fc goja.FunctionCall) bool {
		if strLen(fc.This) > maxInlineString {
			return false
		}
		for _, a := range fc.Arguments {
			if strLen(a) > maxInlineString {
				return false
			}
		}
		return true
	}
	sp, err := proto("String")
	if err != nil {
		return err
	}
	for _, m := range []string{"toLowerCase", "toUpperCase", "split", "indexOf", "lastIndexOf", "includes"} {
		if err := wrap(sp, m, stringOK); err != nil {
			return err
		}
	}
	// Arrays: searches compare every element with the argument.
	ap, err := proto("Array")
	if err != nil {
		return err
	}
	arrayLen := func(v goja.Value) int64 {
		o, ok := v.(*goja.Object)
		if !ok {
			return 0
		}
		l := o.Get("length")
		if l == nil {
			return 0
		}
		return l.ToInteger()
	}
	searchOK := func(fc goja.FunctionCall) bool {
		return arrayLen(fc.This) <= maxInlineArray && strLen(fc.Argument(0)) <= maxInlineSearch
	}
	for _, m := range []string{"indexOf", "lastIndexOf", "includes"} {
		if err := wrap(ap, m, searchOK); err != nil {
			return err
		}
	}
	// slice visits every index from start to end: on a sparse array (a[4e9] = 1 makes
	// one of length 4e9 out of a single element) that is a loop of up to 2^32 steps in
	// goja's Go code, which Interrupt cannot stop. Strings have their own slice, which
	// costs the size of its result.
	if err := wrap(ap, "slice", func(fc goja.FunctionCall) bool {
		return arrayLen(fc.This) <= maxInlineArray
	}); err != nil {
		return err
	}
	// join is what turns an array into a string ("" + a, shExpMatch(a, ...)): its
	// output is measured before it is built, and nested objects (whose own joins would
	// multiply it) take the hand-off path.
	if err := wrap(ap, "join", func(fc goja.FunctionCall) bool {
		o, ok := fc.This.(*goja.Object)
		if !ok {
			return true
		}
		n := arrayLen(o)
		if n > maxInlineJoin || strLen(fc.Argument(0)) > 64 {
			return false
		}
		total := int(n) * (strLen(fc.Argument(0)) + 1)
		for i := int64(0); i < n; i++ {
			switch v := o.Get(strconv.FormatInt(i, 10)).(type) {
			case goja.String:
				total += v.Length()
			case *goja.Object:
				return false
			default:
				total += 24 // a number, a boolean, null or undefined
			}
			if total > maxInlineString {
				return false
			}
		}
		return true
	}); err != nil {
		return err
	}
	// /re/.test(s): Go's regexp is linear, in the input times the pattern. The input
	// is converted first (an object's conversion is itself guarded), then measured.
	rp, err := proto("RegExp")
	if err != nil {
		return err
	}
	return wrapNative(vm, rp, "test", func(orig native) native {
		return func(fc goja.FunctionCall) goja.Value {
			if !w.inlineCall {
				return orig(fc)
			}
			if s, ok := fc.Argument(0).(goja.String); ok { // the usual case: no conversion
				if s.Length() > maxInlineRegexIn {
					return w.trip()
				}
				return orig(fc)
			}
			s := fc.Argument(0).ToString()
			if w.tripped || strLen(s) > maxInlineRegexIn {
				return w.trip()
			}
			return orig(goja.FunctionCall{This: fc.This, Arguments: []goja.Value{s}})
		}
	})
}
