package pac

import (
	"strings"
	"testing"
	"time"
)

// TestCallsIndependent: what a call does never changes what the next computes (SPEC
// §4.3, §7). Each script tries to carry something from one call to the next; the same
// call must get the same answer every time, after calls for other hosts too, on both
// paths. Before sealing, the counter alternated between client and direct.
func TestCallsIndependent(t *testing.T) {
	tests := []struct {
		name, src string
		want      string // the exit every call gets ("deny!" for a script failure)
	}{
		{"counter", `var n = 0;
function FindProxyForURL(u, h) { n++; return n % 2 ? "PROXY x:1" : "DIRECT"; }`, "client"},
		{"strict counter", `"use strict"; var n = 0;
function FindProxyForURL(u, h) { n += 1; return n == 1 ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"forgotten var", `function FindProxyForURL(u, h) {
	if (typeof first == "undefined") first = h;
	return first == h ? "DIRECT" : "BLOCK";
}`, "direct"},
		{"global assigned then read in one call", `var last;
function remember(h) { last = h; }
function FindProxyForURL(u, h) { var before = last; remember(h); return before === undefined && last == h ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"object through a helper", `var cache = {};
function table() { return cache; }
function FindProxyForURL(u, h) { var c = table(); if (c[h]) return "BLOCK"; c[h] = 1; return "DIRECT"; }`, "direct"},
		{"nested object", `var cfg = {seen: {n: 0}};
function get() { return cfg.seen; }
function FindProxyForURL(u, h) { var s = get(); s.n = s.n + 1; return s.n == 0 ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"array push", `var seen = [];
function list() { return seen; }
function FindProxyForURL(u, h) { list().push(h); return "DIRECT"; }`, "deny!"},
		{"global regex lastIndex", `var re = /a/g;
function FindProxyForURL(u, h) { return re.test(h) ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"global date", `var d = new Date(0);
function FindProxyForURL(u, h) { d.setTime(d.getTime() + 1); return d.getTime() == 1 ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"this property", `function FindProxyForURL(u, h) { this.k = (this.k || 0) + 1; return this.k === undefined ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"built-in replaced through this", `function FindProxyForURL(u, h) {
	var first = shExpMatch(h, "*.example");
	this.shExpMatch = function () { return false; };
	return first ? "DIRECT" : "BLOCK";
}`, "direct"},
		{"function property", `function helper() { return helper.count; }
function bump(f) { f.count = (f.count || 0) + 1; }
function FindProxyForURL(u, h) { bump(helper); return helper() === undefined ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"property top-level code added", `this.seen = "";
function FindProxyForURL(u, h) { var was = this.seen; this.seen = h; return was === "" ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"function replaced through this", `function pick() { return "DIRECT"; }
function FindProxyForURL(u, h) { var r = pick(); this.pick = function () { return "BLOCK"; }; return r; }`, "direct"},
		// Built-in objects a call reaches through a local name: checkState cannot see
		// these writes, and the first four run inline. Before the built-ins an inline script
		// can reach were frozen, the second call saw the first one's mark and blocked.
		{"Math through a local", `function FindProxyForURL(u, h) {
	var m = Math; if (m.seen) return "BLOCK"; m.seen = h; return "DIRECT"; }`, "direct"},
		{"PAC built-in's property", `function FindProxyForURL(u, h) {
	var f = dnsDomainIs; if (f.seen) return "BLOCK"; f.seen = h; return "DIRECT"; }`, "direct"},
		{"string method's property", `function FindProxyForURL(u, h) {
	var f = h.split; if (f.seen) return "BLOCK"; f.seen = h; return "DIRECT"; }`, "direct"},
		{"array method's property", `function FindProxyForURL(u, h) {
	var f = [].push; if (f.seen) return "BLOCK"; f.seen = h; return "DIRECT"; }`, "direct"},
		{"Math function replaced through a local", `function FindProxyForURL(u, h) {
	var r = Math.floor(1.5); var m = Math; m.floor = function () { return 7; }; return r == 1 ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"strict write to a frozen built-in", `"use strict";
function FindProxyForURL(u, h) { var m = Math; m.seen = h; return "DIRECT"; }`, "deny!"},
		{"regex compile", `var re = /a/;
function get() { return re; }
function FindProxyForURL(u, h) { get().compile(h); return "DIRECT"; }`, "deny!"},
		// Built-in globals a call replaces or deletes: each call sees them as top-level
		// code left them. Before, the first call's change reached the next call, which
		// saw the first call's host or a missing Math and blocked. The first three run
		// inline.
		{"Math assigned", `function FindProxyForURL(u, h) {
	var p = Math; if (h == "a.example") Math = 1; return p === 1 ? "BLOCK" : "DIRECT"; }`, "direct"},
		{"Math deleted", `function FindProxyForURL(u, h) {
	var p = typeof Math; if (h == "a.example") delete Math; return p == "object" ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"Math incremented", `function FindProxyForURL(u, h) {
	var p = typeof Math; Math++; return p == "object" ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"escape assigned", `function FindProxyForURL(u, h) {
	var p = typeof escape == "string" ? escape : ""; escape = h; return p == "" ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"String assigned", `function FindProxyForURL(u, h) {
	var p = typeof String == "string" ? String : ""; String = h; return p == "" ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"parseFloat compound-assigned", `function FindProxyForURL(u, h) {
	var p = typeof parseFloat; parseFloat += h; return p == "function" ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"destructured into a built-in", `function FindProxyForURL(u, h) {
	var p = typeof decodeURI; [decodeURI] = [h]; return p == "function" ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"strict assignment", `"use strict";
function FindProxyForURL(u, h) { var p = typeof isFinite; isFinite = h; return p == "function" ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"through this", `function FindProxyForURL(u, h) {
	var p = this.escape; this.escape = h; return typeof p == "function" ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"through this with a literal key", `function FindProxyForURL(u, h) {
	var p = this["unescape"]; this["unescape"] = h; return typeof p == "function" ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"deleted through this", `function FindProxyForURL(u, h) {
	var p = typeof this.encodeURI; delete this.encodeURI; return p == "function" ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"through this with a computed key", `function FindProxyForURL(u, h) {
	var k = "esc" + "ape", p = this[k]; this[k] = h; return typeof p == "function" ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"deleted with a computed key", `function FindProxyForURL(u, h) {
	var k = "Ma" + "th", p = typeof this[k]; delete this[k]; return p == "object" ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"through an alias of the global object", `function FindProxyForURL(u, h) {
	var g = this, p = g.encodeURIComponent; g.encodeURIComponent = h; return typeof p == "function" ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"redefined through the global object", `function FindProxyForURL(u, h) {
	var p = typeof parseInt; Object.defineProperty(this, "parseInt", {value: h}); return p == "function" ? "DIRECT" : "BLOCK"; }`, "deny!"},
		{"top-level var of a built-in's name", `var escape = "top";
function FindProxyForURL(u, h) { var p = escape; escape = h; return p == "top" ? "DIRECT" : "BLOCK"; }`, "direct"},
		{"top-level function of a built-in's name", `function escape(s) { return s; }
function FindProxyForURL(u, h) { var p = this.escape; this.escape = h; return typeof p == "function" ? "DIRECT" : "BLOCK"; }`, "direct"},
	}
	hosts := []string{"a.example", "b.example", "a.example", "c.example", "a.example"}
	for _, tc := range tests {
		for _, inline := range []bool{true, false} {
			name := tc.name + "/handoff"
			if inline {
				name = tc.name + "/inline-if-it-can"
			}
			t.Run(name, func(t *testing.T) {
				s, err := compile("t.pac", tc.src, Options{Deadline: 10 * time.Second}, inline)
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				for i, h := range hosts {
					r := s.Eval(Call{Host: h, Port: 443})
					got := r.Exit
					if r.Failed {
						got = "deny!"
					}
					if got != tc.want {
						t.Fatalf("call %d (%s): Eval = %+v, want %s every time", i+1, h, r, tc.want)
					}
				}
			})
		}
	}
}

// TestCallsIndependentPool: every runtime of the pool starts each call from the same
// state, with calls from many goroutines.
func TestCallsIndependentPool(t *testing.T) {
	s := mustCompile(t, `var n = 0, hosts = [];
function FindProxyForURL(u, h) { n++; if (n > 1) return "BLOCK"; return "DIRECT"; }`, Options{})
	done := make(chan string, 400)
	for g := 0; g < 4; g++ {
		go func() {
			for i := 0; i < 100; i++ {
				done <- s.Eval(Call{Host: "x.example"}).Exit
			}
		}()
	}
	for i := 0; i < 400; i++ {
		if e := <-done; e != "direct" {
			t.Fatalf("call %d: %s, want direct", i, e)
		}
	}
}

// TestStateRefusedAtLoad: the ways a call could keep state that sealing cannot undo, or
// that would silently do nothing, are load errors naming the line; shadowing names,
// top-level code and functions called on the spot are not.
func TestStateRefusedAtLoad(t *testing.T) {
	fn := "\nfunction FindProxyForURL(u, h) { return \"DIRECT\"; }"
	tests := []struct {
		name, src string
		line      int    // 0: loads
		msg       string // part of the error
	}{
		{"let counter", "let n = 0;\nfunction FindProxyForURL(u, h) {\n n++; return null; }", 3, "assigns the top-level n"},
		{"class rebound", "class A {}\nfunction FindProxyForURL(u, h) { A = null; return null; }", 2, "assigns the top-level A"},
		{"function rebound", "function f() {}\nfunction FindProxyForURL(u, h) { f = null; return null; }", 2, "assigns the top-level f"},
		{"object cache", "var cache = {};\nfunction FindProxyForURL(u, h) { cache[h] = 1; return null; }", 2, "property of the top-level cache"},
		{"nested property", "var o = {a: {}};\nfunction FindProxyForURL(u, h) { o.a.b++; return null; }", 2, "property of the top-level o"},
		{"built-in", "function FindProxyForURL(u, h) { Math.last = h; return null; }", 1, "property of the top-level Math"},
		{"prototype", "function FindProxyForURL(u, h) { String.prototype.x = h; return null; }", 1, "property of the top-level String"},
		{"arrow", "var o = {};\nvar f = (h) => { o.x = h; };" + fn, 2, "property of the top-level o"},
		{"destructuring", "let a;\nfunction FindProxyForURL(u, h) { [a] = [h]; return null; }", 2, "assigns the top-level a"},
		{"Map", "var m = new Map();" + fn, 0, "a Map is reachable from m"},
		{"Set inside an object", "var o = {s: new Set()};" + fn, 0, "a Set is reachable from o"},
		{"Proxy", "var p = new Proxy({}, {});" + fn, 0, "a Proxy is reachable from p"},
		{"iterator", "var it = [1, 2][Symbol.iterator]();" + fn, 0, "an iterator is reachable from it"},
		{"built-in through globalThis", "function FindProxyForURL(u, h) { globalThis.escape = h; return null; }", 1, "property of the top-level globalThis"},
		{"built-in through a top-level alias", "var g = this;\nfunction FindProxyForURL(u, h) { g.Math = h; return null; }", 2, "property of the top-level g"},

		{"var counter", "var n = 0;\nfunction FindProxyForURL(u, h) { n++; return null; }", 0, ""},
		{"shadowed let", "let n = 0;\nfunction FindProxyForURL(u, h) { var n = 1; n++; return null; }", 0, ""},
		{"shadowed by a parameter", "var o = {};\nfunction FindProxyForURL(u, o) { o.x = 1; return null; }", 0, ""},
		{"shadowed in an inner function", "let n = 0;\nfunction FindProxyForURL(u, h) { var n = 0; [1].forEach(function () { n++; }); return null; }", 0, ""},
		{"top-level code", "var o = {};\no.a = 1;\nlet n = 0;\nn++;" + fn, 0, ""},
		{"IIFE", "var t = (function () { var o = {}; o.a = 1; return o; })();\nvar u = (() => { var o = {}; o.b = 2; return o; })();" + fn, 0, ""},
		{"local object", "function FindProxyForURL(u, h) { var o = {}; o.x = h; return o.x ? \"DIRECT\" : null; }", 0, ""},
		{"global regex and date", "var re = /a/g, d = new Date(0);" + fn, 0, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Compile("t.pac", tc.src, Options{})
			if tc.msg == "" {
				if err != nil {
					t.Fatalf("Compile: %v, want it to load", err)
				}
				return
			}
			ce, ok := err.(*CompileError)
			if !ok || ce.Code != CodeScript || !strings.Contains(ce.Msg, tc.msg) || ce.Line != tc.line {
				t.Fatalf("Compile = %v, want E_SCRIPT naming %q at line %d", err, tc.msg, tc.line)
			}
		})
	}
}

// TestSealKnowsGoja: sealing finds goja's object kinds through reflection (implType);
// if goja's layout changes, this says so.
func TestSealKnowsGoja(t *testing.T) {
	w := testWorker(t, Options{})
	for expr, want := range map[string]string{
		"({})": "*goja.baseObject", "[]": "*goja.arrayObject", "(function () {})": "*goja.funcObject",
		"/a/g": "*goja.regexpObject", "new Date(0)": "*goja.dateObject", "new Map()": "*goja.mapObject",
		"new Proxy({}, {})": "*goja.proxyObject",
	} {
		v, err := w.eval(Call{}, expr)
		if err != nil {
			t.Fatal(err)
		}
		if got := implType(v.ToObject(w.vm)); got != want {
			t.Errorf("implType(%s) = %q, want %q", expr, got, want)
		}
	}
}

// TestScriptsIsolated: scripts (one per policy, so per pod) have runtimes of their own:
// what one does to the built-ins, at load or in its calls, never reaches another.
func TestScriptsIsolated(t *testing.T) {
	bad := mustCompile(t, `String.prototype.toLowerCase = function () { return "evil"; };
Object.prototype.polluted = "yes";
Math.floor = function () { return 7; };
function FindProxyForURL(u, h) { Object.getPrototypeOf("").y = h; Object.getPrototypeOf({}).z = h; return "BLOCK"; }`, Options{})
	good := mustCompile(t, `function FindProxyForURL(u, h) {
	return "A".toLowerCase() == "a" && ({}).polluted === undefined && "".y === undefined && ({}).z === undefined &&
		Math.floor(1.5) == 1 ? "DIRECT" : "BLOCK";
}`, Options{})
	done := make(chan string, 200)
	for g := 0; g < 4; g++ {
		go func() {
			for i := 0; i < 50; i++ {
				bad.Eval(Call{Host: "x.example"})
				done <- good.Eval(Call{Host: "x.example"}).Exit
			}
		}()
	}
	for i := 0; i < 200; i++ {
		if e := <-done; e != "direct" {
			t.Fatalf("call %d of the other script: %s, want direct", i, e)
		}
	}
}
