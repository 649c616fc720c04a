package pac

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dop251/goja"
)

// TestInlineSparseSlice: Array.prototype.slice on a sparse array loops over its length
// in goja's Go code, which Interrupt cannot stop: one element at index 1e7 kept an
// inline call with a 50 ms deadline running for seconds (at 4e9, minutes). The guard
// hands the call off, and the caller gets deny at its deadline.
func TestInlineSparseSlice(t *testing.T) {
	const deadline = 50 * time.Millisecond
	s := mustCompile(t, `function FindProxyForURL(url, host) {
	var a = [];
	var i = 10000000;
	a[i] = 1;
	var b = a.slice(0);
	return "DIRECT";
}`, Options{Deadline: deadline})
	if p, why := s.Path(); p != PathInline {
		t.Fatalf("Path() = %q (%s), want inline", p, why)
	}
	r, took := evalTimed(s, "x.example")
	if took > deadline+slack {
		t.Errorf("Eval returned after %v, deadline %v", took, deadline)
	}
	if n := s.p.handoffs.Load(); n != 1 {
		t.Errorf("%d calls handed off, want 1 (the slice guard)", n)
	}
	if !r.Failed || r.Exit != "deny" {
		t.Errorf("Eval = %+v, want a deadline deny", r)
	}
	waitAbandoned(t, s) // the handed-off runtime is still slicing: let it finish
}

// inlineNatives says, for every native function an inline script can reach by a name
// in inlineProps, why its running time is bounded. guarded: guard.go measures its
// input on inline calls. A name that comes to reach another native (a goja upgrade, a
// name added to inlineProps) fails TestInlineNatives until it is reviewed here.
var inlineNatives = map[string]string{
	"Array.prototype.includes":     "guarded",
	"Array.prototype.indexOf":      "guarded",
	"Array.prototype.lastIndexOf":  "guarded",
	"Array.prototype.slice":        "guarded",
	"Array.prototype.pop":          "one element, and the length",
	"Array.prototype.push":         "one step per argument, and the length",
	"String.prototype.includes":    "guarded",
	"String.prototype.indexOf":     "guarded",
	"String.prototype.lastIndexOf": "guarded",
	"String.prototype.split":       "guarded",
	"String.prototype.toLowerCase": "guarded",
	"String.prototype.toUpperCase": "guarded",
	"String.prototype.charAt":      "constant",
	"String.prototype.charCodeAt":  "constant",
	"String.prototype.startsWith":  "at most its argument's length",
	"String.prototype.endsWith":    "at most its argument's length",
	"String.prototype.slice":       "the size of its result",
	"String.prototype.substring":   "the size of its result",
	"String.prototype.substr":      "the size of its result",
	"String.prototype.trim":        "one pass over the string",
	"RegExp.prototype.test":        "guarded (only /re/.test(s) is inline, with Go's linear regexp)",
	"Math.abs":                     "constant", "Math.ceil": "constant", "Math.floor": "constant",
	"Math.round": "constant", "Math.random": "constant",
	"Math.max": "one step per argument (written in the source: no spread or apply)",
	"Math.min": "one step per argument (written in the source: no spread or apply)",
	// Only reachable through globals an inline script may not name.
	"ArrayBuffer.prototype.slice":      "unreachable",
	"TypedArray.prototype.includes":    "unreachable",
	"TypedArray.prototype.indexOf":     "unreachable",
	"TypedArray.prototype.lastIndexOf": "unreachable",
	"TypedArray.prototype.slice":       "unreachable",
}

// TestInlineNatives lists every native function of goja's built-ins that a name in
// inlineProps reaches and checks that each has been reviewed (inlineNatives).
func TestInlineNatives(t *testing.T) {
	vm := goja.New()
	var props []string
	for n := range inlineProps {
		props = append(props, n)
	}
	if err := vm.Set("props", props); err != nil {
		t.Fatal(err)
	}
	v, err := vm.RunString(`(function () {
	var out = [], seen = new Set(), q = [];
	Object.getOwnPropertyNames(globalThis).forEach(function (n) { q.push([n, globalThis[n]]); });
	q.push(["TypedArray", Object.getPrototypeOf(Uint8Array)]);
	while (q.length) {
		var e = q.shift(), path = e[0], o = e[1];
		if (o === null || (typeof o !== "object" && typeof o !== "function") || seen.has(o)) continue;
		seen.add(o);
		Object.getOwnPropertyNames(o).forEach(function (n) {
			var d = Object.getOwnPropertyDescriptor(o, n);
			if (!d || !("value" in d)) return;
			if (typeof d.value === "function" && props.indexOf(n) >= 0) out.push(path + "." + n);
			if (n === "prototype" || typeof d.value === "object") q.push([path + "." + n, d.value]);
		});
	}
	return out;
})()`)
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	if err := vm.ExportTo(v, &found); err != nil {
		t.Fatal(err)
	}
	slices.Sort(found)
	for _, n := range found {
		if inlineNatives[n] == "" {
			t.Errorf("%s is reachable on the inline path and not reviewed: guard it (guard.go) or say in inlineNatives why its running time is bounded", n)
		}
	}
	for n, why := range inlineNatives {
		if !slices.Contains(found, n) {
			t.Errorf("inlineNatives lists %s (%s), which no name in inlineProps reaches", n, why)
		}
	}
	// Each guarded one is wrapped in an inline pool's runtimes.
	s := mustCompile(t, `function FindProxyForURL(url, host) { return null; }`, Options{})
	w, put := borrow(t, s)
	defer put()
	for n, why := range inlineNatives {
		if !strings.HasPrefix(why, "guarded") || strings.HasPrefix(n, "RegExp") {
			continue
		}
		i := strings.LastIndexByte(n, '.')
		orig, err := vm.RunString(n)
		if err != nil {
			t.Fatal(err)
		}
		got, err := w.vm.RunString(n)
		if err != nil {
			t.Fatal(err)
		}
		if reflect.ValueOf(got.Export()).Pointer() == reflect.ValueOf(orig.Export()).Pointer() {
			t.Errorf("%s is not guarded in an inline pool's runtime (%s is still goja's own)", n, n[i+1:])
		}
		// The wrapper looks like the original: a script that reads its length or name
		// gets the same answer on both paths (FuzzClassify found h.split.length).
		for _, p := range []string{"length", "name"} {
			o, g := orig.ToObject(vm).Get(p), got.ToObject(w.vm).Get(p)
			if o.String() != g.String() {
				t.Errorf("%s.%s = %v in an inline pool's runtime, %v in goja's own", n, p, g, o)
			}
		}
	}
}
