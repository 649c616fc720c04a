package pac

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/dlclark/regexp2/v2"
	"github.com/dop251/goja/parser"
)

func classifySrc(t testing.TB, src string) (bool, string) {
	t.Helper()
	prog, err := parser.ParseFile(nil, "t.pac", src, 0)
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	inline, why, _, _ := classify(prog)
	return inline, why
}

func TestClassify(t *testing.T) {
	fn := func(body string) string { return "function FindProxyForURL(url, host) {\n" + body + "\n}" }
	tests := []struct {
		name   string
		src    string
		inline bool
		why    string // part of the reason, for the hand-off ones
	}{
		{"trivial", fn(`return "DIRECT";`), true, ""},
		{"PAC built-ins", fn(`if (shExpMatch(host, "*.a") || dnsDomainIs(host, ".b") || isInNet(dnsResolve(host), "10.0.0.0", "255.0.0.0")) return "PROXY p:1"; return timeRange(8, 18) ? null : "DIRECT";`), true, ""},
		{"string methods", fn(`var h = host.toLowerCase(); if (h.indexOf("x") >= 0 || h.split(".").length > 3 || h.substring(0, 3) == "api") return "DIRECT";`), true, ""},
		{"Go-compatible regex", fn(`if (/^\d+\.\d+\.\d+\.\d+$/.test(host)) return "DIRECT";`), true, ""},
		{"regex flags i m s", fn(`return /^A.b$/ims.test(host) ? "DIRECT" : null;`), true, ""},
		{"array loop", fn(`var l = ["a", "b"]; for (var i = 0; i < l.length; i++) { if (dnsDomainIs(host, l[i])) return "DIRECT"; } return null;`), true, ""},
		{"index arithmetic", fn(`var p = host.split("."); return p[p.length - 1] == "com" ? "DIRECT" : null;`), true, ""},
		{"object map", fn(`var m = {corp: "DIRECT", "ads": "BLOCK"}; return m.corp;`), true, ""},
		{"helper function and closure", `function f(h) { return function () { return h + "x"; }; } function FindProxyForURL(u, h) { return f(h)() ? "DIRECT" : null; }`, true, ""},
		{"Math", fn(`return Math.floor(Math.random() * 2) ? "DIRECT" : null;`), true, ""},
		{"switch try throw", fn(`switch (host) { case "a": return "DIRECT"; } try { throw "x"; } catch (e) { return e; } finally { }`), true, ""},

		{"lookahead needs regexp2", fn(`if (/^(?=a)(a+)+$/.test(host)) return "DIRECT";`), false, "backtracking"},
		{"backreference", fn(`return /(a)\1/.test(host) ? "DIRECT" : null;`), false, "backtracking"},
		{"global flag", fn(`return /a/g.test(host) ? "DIRECT" : null;`), false, "flag g"},
		{"sticky flag", fn(`return /a/y.test(host) ? "DIRECT" : null;`), false, "flag y"},
		{"regex exec", fn(`return /a/.exec(host) ? "DIRECT" : null;`), false, "exec"},
		{"regex stored", fn(`var re = /a/; return re.test(host) ? "DIRECT" : null;`), false, "regex literal"},
		{"regex argument", fn(`return host.split(/\./).length ? "DIRECT" : null;`), false, "regex literal"},
		{"long regex", fn(`return /` + strings.Repeat("a", maxInlinePattern+1) + `/.test(host) ? "DIRECT" : null;`), false, "longer"},
		{"match", fn(`return host.match("a") ? "DIRECT" : null;`), false, "match"},
		{"replace", fn(`return host.replace("a", "b");`), false, "replace"},
		{"repeat", fn(`return host.repeat(3);`), false, "repeat"},
		{"join", fn(`return ["a"].join(",");`), false, "join"},
		{"sort", fn(`return [2, 1].sort()[0] ? "DIRECT" : null;`), false, "sort"},
		// The array natives that loop over a sparse array's length are out of reach
		// (slice, indexOf, lastIndexOf and includes are guarded: TestInlineGuards).
		{"concat", fn(`var a = []; var i = 4000000000; a[i] = 1; return a.concat([1]).length ? "DIRECT" : null;`), false, "concat"},
		{"splice", fn(`var a = []; var i = 4000000000; a[i] = 1; a.splice(0, 1); return null;`), false, "splice"},
		{"fill", fn(`var a = []; var i = 4000000000; a[i] = 1; a.fill(0); return null;`), false, "fill"},
		{"reverse", fn(`var a = []; var i = 4000000000; a[i] = 1; a.reverse(); return null;`), false, "reverse"},
		{"shift", fn(`var a = []; var i = 4000000000; a[i] = 1; a.shift(); return null;`), false, "shift"},
		{"unshift", fn(`var a = []; var i = 4000000000; a[i] = 1; a.unshift(0); return null;`), false, "unshift"},
		{"copyWithin", fn(`var a = []; var i = 4000000000; a[i] = 1; a.copyWithin(0, 1); return null;`), false, "copyWithin"},
		{"forEach", fn(`var a = []; var i = 4000000000; a[i] = 1; a.forEach(function () {}); return null;`), false, "forEach"},
		{"findLast", fn(`var a = []; var i = 4000000000; a[i] = 1; a.findLast(function () {}); return null;`), false, "findLast"},
		{"at", fn(`return [1].at(0) ? "DIRECT" : null;`), false, "at"},
		{"padEnd", fn(`return host.padEnd(1e9);`), false, "padEnd"},
		{"normalize", fn(`return host.normalize();`), false, "normalize"},
		{"localeCompare", fn(`return host.localeCompare("a") ? "DIRECT" : null;`), false, "localeCompare"},
		{"padStart", fn(`return host.padStart(10);`), false, "padStart"},
		{"RegExp", fn(`return new RegExp("a").test(host) ? "DIRECT" : null;`), false, "RegExp"},
		{"eval", fn(`return eval("1") ? "DIRECT" : null;`), false, "eval"},
		{"Function", fn(`return Function("return 1")() ? "DIRECT" : null;`), false, "Function"},
		{"constructor", fn(`return host.constructor.constructor("return 1")();`), false, "constructor"},
		{"__proto__", fn(`return host.__proto__;`), false, "__proto__"},
		{"Array", fn(`return Array(5).length ? "DIRECT" : null;`), false, "Array"},
		{"JSON", fn(`return JSON.stringify(host);`), false, "stringify"},
		{"Date", fn(`return new Date().getHours() > 8 ? "DIRECT" : null;`), false, "getHours"},
		{"globalThis", fn(`return globalThis.x;`), false, "globalThis"},
		{"this dot builtin", fn(`return this.RegExp;`), false, "RegExp"},
		{"string key builtin", fn(`return host["constructor"];`), false, "constructor"},
		{"string key computed", fn(`var k = "constr" + "uctor"; return host[k];`), false, "not provably a number"},
		{"parameter as key", fn(`return host[url];`), false, "not provably a number"},
		{"numeric var made a string", fn(`var i = 0; i = "constructor"; return host[i];`), false, "not provably a number"},
		{"numeric var plus string", fn(`var i = 0; i += "x"; return host[i];`), false, "not provably a number"},
		{"numeric var via this", fn(`var i = 0; this.i = "constructor"; return host[i];`), false, "not provably a number"},
		{"length key in literal", fn(`var o = {length: "constructor"}; return host[o.length];`), false, "length"},
		{"assigning length", fn(`var a = []; a.length = 1e9; return a.indexOf(1) ? "DIRECT" : null;`), false, "assigning"},
		{"big literal index", fn(`var a = []; a[100000000] = 1; return null;`), false, "index"},
		{"with", fn(`with (host) { return length; }`), false, "with"},
		{"for-in", fn(`for (var k in host) {} return null;`), false, "for-in"},
		{"for-of", fn(`for (var c of host) {} return null;`), false, "for-of"},
		{"spread", fn(`return Math.max(...[1, 2]) ? "DIRECT" : null;`), false, "spread"},
		{"destructuring", fn(`var [a, b] = [1, 2]; return null;`), false, "destructuring"},
		{"class", `class A {} function FindProxyForURL() { return null; }`, false, "class"},
		{"generator", `function* g() {} function FindProxyForURL() { return null; }`, false, "generator"},
		{"async", `async function g() {} function FindProxyForURL() { return null; }`, false, "async"},
		{"tagged template", fn("return String.raw`x`;"), false, "tagged template"},
		{"hoisted name", fn(`return this["\u0000re0"];`), false, "NUL"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inline, why := classifySrc(t, tc.src)
			if inline != tc.inline {
				t.Fatalf("classify = %v (%q), want %v", inline, why, tc.inline)
			}
			if !tc.inline && (!strings.Contains(why, tc.why) || !strings.Contains(why, "(line ")) {
				t.Errorf("reason %q, want it to name %q and a line", why, tc.why)
			}
		})
	}
}

// TestCorporateIsInline: the benchmark's realistic PAC file takes the fast path, and
// Path says so; a script with a backtracking regex does not.
func TestCorporateIsInline(t *testing.T) {
	s := mustCompile(t, corporatePAC(t), Options{})
	if path, why := s.Path(); path != PathInline || why != "" {
		t.Errorf("corporate.pac: Path() = %q, %q; want inline", path, why)
	}
	s = mustCompile(t, stuckPAC, Options{})
	if path, why := s.Path(); path != PathHandoff || !strings.Contains(why, "line 4") {
		t.Errorf("stuckPAC: Path() = %q, %q; want handoff because of line 4", path, why)
	}
}

// TestInlineSameAnswers evaluates scripts on both paths and compares every result.
func TestInlineSameAnswers(t *testing.T) {
	scripts := map[string]string{
		"corporate": corporatePAC(t),
		"loops and maps": `var doms = [".a.example", ".b.example", "c.example"];
var m = {direct: "DIRECT", block: "BLOCK"};
function FindProxyForURL(url, host) {
	for (var i = 0; i < doms.length; i++) { if (dnsDomainIs(host, doms[i])) return i % 2 ? m.block : m.direct; }
	var p = host.split(".");
	if (p.length > 2 && p[p.length - 2] == "svc") return "CLUSTER";
	if (/^api\d+\./i.test(host)) return "PROXY api-proxy:3128";
	return "PROXY p" + (host.length % 3) + ":8080; DIRECT";
}`,
	}
	hosts := []string{"www.example.com", "x.a.example", "y.b.example", "c.example", "a.b.svc.local", "API7.x.com",
		"10.1.2.3", "intranet", "updates.vendor.example", "x.sharepoint.com", "ads.example.com", "", "a.b.c.d.e.f.g.h"}
	for name, src := range scripts {
		t.Run(name, func(t *testing.T) {
			in := mustCompile(t, src, Options{})
			out, err := compile("t.pac", src, Options{Deadline: 10 * time.Second}, false)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(out.Close)
			if p, _ := in.Path(); p != PathInline {
				t.Fatalf("Path() = %q, want inline", p)
			}
			if p, _ := out.Path(); p != PathHandoff {
				t.Fatalf("Path() of the forced hand-off = %q", p)
			}
			for _, h := range hosts {
				c := Call{Host: h, Port: 443, At: time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC)}
				if a, b := in.Eval(c), out.Eval(c); a != b {
					t.Errorf("%q: inline %+v, hand-off %+v", h, a, b)
				}
			}
		})
	}
}

// TestInlineGuards: an inline script whose input grows past a guard's bound gets the
// same answer as on the hand-off path: the call is run again there.
func TestInlineGuards(t *testing.T) {
	big := func(expr string) string {
		return `function FindProxyForURL(url, host) {
	var s = host;
	for (var i = 0; i < 14; i++) s = s + s; // 16 bytes * 2^14 = 256 KiB
	return (` + expr + `) ? "DIRECT" : "PROXY p:1";
}`
	}
	tests := []struct{ name, src string }{
		{"toLowerCase", big(`s.toLowerCase().length > 0`)},
		{"split", big(`s.split(".").length > 1`)},
		{"indexOf", big(`s.indexOf("zz") < 0`)},
		{"regex test", big(`/^[a-z.]+$/.test(s)`)},
		{"shExpMatch", big(`shExpMatch(s, "*.example*")`)},
		{"dnsDomainIs", big(`dnsDomainIs(s, "example.com.")`)},
		{"array join", big(`("" + [s, s]).length > 0`)},
		{"array search", big(`[s].indexOf(s) == 0`)},
		// A sparse array as long as s: one element, but these loop over its length.
		{"sparse array slice", big(`(function () { var a = []; a[s.length] = 1; return a.slice(0).length > 0; })()`)},
		{"sparse array lastIndexOf", big(`(function () { var a = []; a[s.length] = 1; return a.lastIndexOf(2) < 0; })()`)},
		{"sparse array includes", big(`(function () { var a = []; a[s.length] = 1; return !a.includes(2); })()`)},
		{"sparse array join", big(`(function () { var a = []; a[s.length] = 1; return ("" + a).length > 0; })()`)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := mustCompile(t, tc.src, Options{})
			if p, why := s.Path(); p != PathInline {
				t.Fatalf("Path() = %q (%s), want inline", p, why)
			}
			r := s.Eval(Call{Host: "www.example.com."})
			if r.Failed || r.Exit != "direct" {
				t.Errorf("Eval = %+v, want direct", r)
			}
			if n := s.p.handoffs.Load(); n != 1 {
				t.Errorf("%d calls handed off, want 1", n)
			}
			// A small input stays inline.
			small := mustCompile(t, strings.Replace(tc.src, "i < 14", "i < 2", 1), Options{})
			if r := small.Eval(Call{Host: "www.example.com."}); r.Failed || small.p.handoffs.Load() != 0 {
				t.Errorf("small input: %+v, %d handed off", r, small.p.handoffs.Load())
			}
		})
	}
}

// TestInlineRegexIsLinear: goja runs a Go-compatible regex literal with Go's linear
// regexp, never with regexp2: this pattern backtracks for minutes in regexp2 on 30
// characters. (The test would hit its 10 s deadline and deny if it did.)
func TestInlineRegexIsLinear(t *testing.T) {
	s := mustCompile(t, `function FindProxyForURL(url, host) { return /^(a+)+$/.test(host) ? "DIRECT" : "PROXY p:1"; }`, Options{})
	if p, why := s.Path(); p != PathInline {
		t.Fatalf("Path() = %q (%s), want inline", p, why)
	}
	if r := s.Eval(Call{Host: strings.Repeat("a", 30) + "b"}); r.Failed || r.Exit != "client" {
		t.Errorf("Eval = %+v, want the proxy", r)
	}
	if r := s.Eval(Call{Host: strings.Repeat("a", 30)}); r.Failed || r.Exit != "direct" {
		t.Errorf("Eval = %+v, want direct", r)
	}
}

// TestRegexp2TimeoutIsSilent shows why regexp2's MatchTimeout cannot put backtracking
// regexes on the inline path: goja turns the timeout into "no match", so the script
// carries on with a wrong answer instead of failing. The first alternative backtracks
// catastrophically, the second matches.
func TestRegexp2TimeoutIsSilent(t *testing.T) {
	old := regexp2.DefaultMatchTimeout
	regexp2.DefaultMatchTimeout = 50 * time.Millisecond // read when goja compiles the literal
	s, err := compile("t.pac", `function FindProxyForURL(url, host) {
	return /^(?=a)(a+)+c$|^a+b$/.test(host) ? "DIRECT" : "PROXY p:1";
}`, Options{Deadline: 30 * time.Second}, false)
	regexp2.DefaultMatchTimeout = old
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	host := strings.Repeat("a", 40) + "b"
	if ok, err := regexp2.MustCompile(`^a+b$`, regexp2.ECMAScript).MatchString(host); !ok || err != nil {
		t.Fatal("the second alternative should match")
	}
	if r := s.Eval(Call{Host: host}); r.Failed || r.Exit != "client" {
		t.Errorf("Eval = %+v: expected the silent wrong answer (no match) after regexp2's timeout", r)
	}
}

// TestStackReuse: with goja's stack lent back between calls, an Eval of the corporate
// script does not allocate a new stack (two allocations, about 400 bytes) every time.
func TestStackReuse(t *testing.T) {
	if !stackReuse.on {
		t.Fatal("goja's Runtime.vm.stack was not found: calls allocate a new stack each time")
	}
	s := mustCompile(t, corporatePAC(t), Options{})
	c := Call{Host: "www.example.org", Port: 443}
	s.Eval(c)
	// AllocsPerRun counts the whole process's allocations: a parallel test's, and a
	// garbage collection emptying the runtimes' sync.Pool mid-run (CI saw 15 once),
	// only ever add to them. The least of a few measurements is the Eval's own.
	least := func() float64 {
		n := math.Inf(1)
		for range 5 {
			n = min(n, testing.AllocsPerRun(200, func() { s.Eval(c) }))
		}
		return n
	}
	with := least()
	stackReuse.on = false
	without := least()
	stackReuse.on = true
	t.Logf("allocations per Eval: %.1f with the stack lent, %.1f without", with, without)
	if raceEnabled {
		return // the race detector's own allocations make the counts vary from run to run
	}
	if with > without-2 || with > 4 {
		t.Errorf("%.1f allocations per Eval with the stack lent, %.1f without: want at most 4, and 2 fewer", with, without)
	}
}

// FuzzClassify: the classifier takes any parsed script without panicking, and a script
// it sends inline gives the same answers on both paths.
func FuzzClassify(f *testing.F) {
	for _, s := range []string{
		`function FindProxyForURL(url, host) { return "DIRECT"; }`,
		`function FindProxyForURL(url, host) { if (/^\d+$/.test(host)) return "DIRECT"; return null; }`,
		`var l = ["a"]; function FindProxyForURL(u, h) { for (var i = 0; i < l.length; i++) if (h == l[i]) return "DIRECT"; }`,
		`function FindProxyForURL(u, h) { var i = 0; i = "constructor"; return h[i]; }`,
		`function FindProxyForURL(u, h) { return h.split(".")[h.split(".").length - 1]; }`,
		`function FindProxyForURL(u, h) { var o = {a: 1}; return o.a ? "DIRECT" : "BLOCK"; }`,
		`function FindProxyForURL(u, h) { return ("" + [h, h]).toUpperCase(); }`,
		`function FindProxyForURL(u, h) { while (true) {} }`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		if len(src) > 4096 {
			return
		}
		prog, err := parser.ParseFile(nil, "fuzz.pac", src, 0)
		if err != nil {
			return
		}
		inline, why, _, _ := classify(prog)
		if inline != (why == "") {
			t.Fatalf("classify = %v, %q", inline, why)
		}
		if !inline {
			return
		}
		o := Options{Deadline: 200 * time.Millisecond, MaxAbandoned: 2}
		in, err1 := compile("fuzz.pac", src, o, true)
		out, err2 := compile("fuzz.pac", src, o, false)
		if (err1 == nil) != (err2 == nil) {
			t.Fatalf("compile: inline %v, hand-off %v", err1, err2)
		}
		if err1 != nil {
			return
		}
		defer in.Close()
		defer out.Close()
		c := Call{Host: "www.example.com", Port: 443, At: time.Unix(1e9, 0)}
		a, b := in.Eval(c), out.Eval(c)
		if a.Failed && b.Failed && strings.Contains(a.Reason+b.Reason, "within") {
			return // one of them ran out of time: a busy machine, or an endless loop
		}
		if a != b {
			t.Fatalf("inline %+v, hand-off %+v", a, b)
		}
	})
}
