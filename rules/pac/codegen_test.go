package pac

import (
	"strings"
	"testing"
)

// TestNoCodeGeneration: goja's parser recursed in Go once per level of nesting of the
// source it was given, so eval("[".repeat(1e6)) or new Function("[".repeat(1e6)) in a
// call ended the process (fatal error: stack overflow). The sandbox has no eval and no
// constructor that compiles source, by any path a script can take to one; each throws.
func TestNoCodeGeneration(t *testing.T) {
	w := testWorker(t, Options{})
	for _, tc := range []struct{ expr, want string }{
		{`eval("1")`, "ReferenceError"},
		{`(0, eval)("1")`, "ReferenceError"},
		{`globalThis.eval("1")`, "TypeError"},
		{`this["ev" + "al"]("1")`, "TypeError"},
		{`Function("return 1")()`, "TypeError: Function: code generation"},
		{`new Function("return 1")()`, "TypeError"},
		{`Function.call(null, "return 1")()`, "TypeError: Function: code generation"},
		{`Function.apply(null, ["return 1"])()`, "TypeError: Function: code generation"},
		{`Function.bind(null, "return 1")()()`, "TypeError: Function: code generation"},
		{`(function () {}).constructor("return 1")()`, "TypeError: Function: code generation"},
		{`(() => 1).constructor("return 1")()`, "TypeError: Function: code generation"},
		{`isInNet.constructor("return 1")()`, "TypeError: Function: code generation"},
		{`[].map.constructor("return 1")()`, "TypeError: Function: code generation"},
		{`({}).constructor.constructor("return 1")()`, "TypeError: Function: code generation"},
		{`"".constructor.constructor("return 1")()`, "TypeError: Function: code generation"},
		{`Function.prototype.constructor("return 1")()`, "TypeError: Function: code generation"},
		{`Object.getOwnPropertyDescriptor(Function.prototype, "constructor").value("return 1")()`, "TypeError: Function: code generation"},
		{`Object.getPrototypeOf(Object.getPrototypeOf(function () {})).constructor.constructor("return 1")()`, "TypeError: Function: code generation"},
		{`(function* () {}).constructor("yield 1")().next().value`, "TypeError: GeneratorFunction: code generation"},
		{`Object.getPrototypeOf(function* () {}).constructor("yield 1")().next().value`, "TypeError: GeneratorFunction: code generation"},
		{`({*m() {}}).m.constructor("yield 1")().next().value`, "TypeError: GeneratorFunction: code generation"},
		{`(async function () {}).constructor("return 1")`, "TypeError: AsyncFunction: code generation"},
		{`(async () => 1).constructor("return 1")`, "TypeError: AsyncFunction: code generation"},
		{`Reflect.construct(Function, ["return 1"])()`, "TypeError"},
		{`Reflect.construct((function* () {}).constructor, ["yield 1"])`, "TypeError"},
		{`Reflect.construct((async function () {}).constructor, ["return 1"])`, "TypeError"},
		{`Reflect.construct(Object, [], Function)`, "TypeError"},
		{`Reflect.apply(Function, null, ["return 1"])()`, "TypeError: Function: code generation"},
		{`(function () { class X extends Function {} return new X("return 1")(); })()`, "TypeError"},
		{`new (Function.prototype.constructor)("return 1")()`, "TypeError"},
	} {
		if got := w.evalString(Call{}, tc.expr); !strings.HasPrefix(got, "EXC: ") || !strings.Contains(got, tc.want) {
			t.Errorf("%s = %q, want an exception saying %q", tc.expr, got, tc.want)
		}
	}
	// What scripts do with functions still works.
	for _, expr := range []string{`(function () {}) instanceof Function`, `(function () {}).constructor === Function`,
		`typeof Function === "function" && typeof Function.prototype.call === "function"`,
		`isInNet instanceof Function && (function* () {}) instanceof Function`} {
		if got := w.evalString(Call{}, expr); got != "true" {
			t.Errorf("%s = %q, want true", expr, got)
		}
	}
	// A call that tries denies, naming why; the process survives the input that crashed it.
	for _, body := range []string{`return eval("[".repeat(1e6))`, `return new Function("[".repeat(1e6))()`,
		`return (function () {}).constructor("[".repeat(1e6))()`} {
		s := mustCompile(t, "function FindProxyForURL(url, host) { "+body+" }", Options{})
		if r := s.Eval(Call{Host: "a.example"}); !r.Failed || r.Exit != "deny" || !strings.Contains(r.Reason, "Error") {
			t.Errorf("%s: Eval = %+v, want a deny naming the error", body, r)
		}
	}
}
