package pac

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// mustCompile compiles a script for a test. Tests that are not about the deadline get
// a generous one: the machine running them may be busy.
func mustCompile(t testing.TB, src string, o Options) *Script {
	t.Helper()
	if o.Deadline == 0 {
		o.Deadline = 10 * time.Second
	}
	s, err := Compile("test.pac", src, o)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

func TestEvalResults(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		exit   string
		failed bool
		reason string
	}{
		{"direct", `return "DIRECT"`, "direct", false, ""},
		{"proxy list", `return "PROXY p.corp:8080; DIRECT"`, "client", false, ""},
		{"null is the default", `return null`, "", false, ""},
		{"undefined is the default", `return`, "", false, ""},
		{"empty is the default", `return ""`, "", false, ""},
		{"unrecognised is the default", `return "WHATEVER"`, "", false, ""},
		{"number fails", `return 42`, "deny", true, "returned a number"},
		{"boolean fails", `return true`, "deny", true, "returned a boolean"},
		{"object fails", `return {}`, "deny", true, "returned an object"},
		{"array fails", `return ["DIRECT"]`, "deny", true, "returned an object"},
		{"String object fails", `return new String("DIRECT")`, "deny", true, "returned an object"},
		{"function fails", `return function () { return "DIRECT" }`, "deny", true, "returned a function"},
		{"symbol fails", `return Symbol("DIRECT")`, "deny", true, "returned a symbol"},
		{"bigint fails", `return 10n`, "deny", true, "returned a bigint"},
		{"exception fails", `throw new Error("boom")`, "deny", true, "script threw: Error: boom"},
		{"thrown string fails", `throw "boom"`, "deny", true, "script threw: boom"},
		{"reference error fails", `return nosuch(host)`, "deny", true, "ReferenceError"},
		{"deep recursion fails", `function f(n) { return f(n + 1) } return f(0)`, "deny", true, "recursion deeper than 1000 calls"},
		{"deep recursion is not caught", `function f(n) { try { return f(n + 1) } catch (e) { return "DIRECT" } } return f(0)`, "deny", true, "recursion deeper than 1000 calls"},
		{"long exception is cut", `throw "x".repeat(10000)`, "deny", true, "xxx…"},
		{"bad shExpMatch pattern fails", `return shExpMatch(host, "(") ? "DIRECT" : "DENY"`, "deny", true, "shExpMatch"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := mustCompile(t, "function FindProxyForURL(url, host) {"+tc.body+"}", Options{})
			r := s.Eval(Call{Host: "www.example.com"})
			if r.Exit != tc.exit || r.Failed != tc.failed || !strings.Contains(r.Reason, tc.reason) || len(r.Reason) > maxReason+len("…") {
				t.Errorf("Eval = %+v, want exit %q failed %v reason containing %q", r, tc.exit, tc.failed, tc.reason)
			}
		})
	}
}

func TestEvalArguments(t *testing.T) {
	s := mustCompile(t, `function FindProxyForURL(url, host) { return url + " " + host; }`, Options{})
	c := Call{Host: `evil"); throw 1; ("`, Port: 8443}
	got := rawEval(t, s, c)
	want := `https://evil"); throw 1; (":8443/ evil"); throw 1; ("`
	if got != want {
		t.Errorf("FindProxyForURL saw %q, want %q (arguments are values, not source)", got, want)
	}
	r := s.Eval(c)
	if r.Failed {
		t.Errorf("Eval with a quoting host failed: %+v", r)
	}
}

func TestEvalCorporate(t *testing.T) {
	s := mustCompile(t, corporatePAC(t), Options{})
	office := time.Date(2026, 3, 18, 10, 0, 0, 0, time.UTC)
	night := time.Date(2026, 3, 18, 22, 0, 0, 0, time.UTC)
	tests := []struct {
		host  string
		at    time.Time
		exit  string
		proxy string
	}{
		{"intranet", office, "direct", ""},
		{"10.1.2.3", office, "direct", ""},
		{"100.64.1.1", office, "direct", ""},
		{"a.corp.example.com", office, "direct", ""},
		{"x.svc.cluster.local", office, "direct", ""},
		{"ads.example.com", office, "deny", ""},
		{"www.doubleclick.net", office, "deny", ""},
		{"files.torrent.example", office, "deny", ""},
		{"api.partner-a.example", office, "gateway", ""},
		{"api7.payments.example", office, "gateway", ""},
		{"a.b.c.d.e.f.g.example", office, "gateway", ""},
		{"eu1.salesforce.com", office, "client", "http://sfdc-proxy.corp.example.com:8080"},
		{"x.sharepoint.com", office, "client", "https://o365-proxy.corp.example.com:8443"},
		{"api.github.com", office, "client", "socks5://dev-socks.corp.example.com:1080"},
		{"updates.vendor.example", office, "client", "http://updates-proxy.corp.example.com:3128"},
		{"updates.vendor.example", night, "client", "http://proxy.corp.example.com:3128"},
		{"www.example.org", office, "client", "http://proxy.corp.example.com:3128"},
	}
	for _, tc := range tests {
		r := s.Eval(Call{Host: tc.host, At: tc.at})
		if r.Exit != tc.exit || r.Proxy != tc.proxy || r.Failed {
			t.Errorf("Eval(%s at %s) = %+v, want exit %q proxy %q", tc.host, tc.at.Format(time.Kitchen), r, tc.exit, tc.proxy)
		}
	}
}

func TestCompileErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		code string
		line int
		msg  string
	}{
		{"too large", strings.Repeat(" ", MaxScriptBytes+1), CodeTooLarge, 0, "bound"},
		{"syntax", "function FindProxyForURL(url, host) {\n  return 'DIRECT'\n  if (\n}", CodeScript, 4, "Unexpected token } (column 1)"},
		{"syntax mid-line", "function FindProxyForURL(url, host) {\n  return 'DIRECT' +* 1;\n}", CodeScript, 2, "(column 20)"},
		{"syntax found by the compiler", "function FindProxyForURL(url, host) {\n  let a; let a;\n}", CodeScript, 2, "(column 14)"},
		{"missing function", "var x = 1;", CodeScript, 0, "FindProxyForURL"},
		{"not a function", "var FindProxyForURL = 'DIRECT';", CodeScript, 0, "FindProxyForURL"},
		{"top-level throw", "\n\nthrow new Error('nope');\nfunction FindProxyForURL() {}", CodeScript, 3, "nope"},
		{"top-level endless loop", "for (;;) {}\nfunction FindProxyForURL() {}", CodeScript, 0, "did not finish"},
		{"top-level deep recursion", "function f(n) { return f(n + 1) }\nf(0);\nfunction FindProxyForURL() {}", CodeScript, 1, "recursion deeper than 1000 calls"},
		{"require absent", "var fs = require('fs');\nfunction FindProxyForURL() {}", CodeScript, 1, "require"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Compile("test.pac", tc.src, Options{Deadline: 50 * time.Millisecond})
			var ce *CompileError
			if !errors.As(err, &ce) {
				t.Fatalf("Compile error = %v, want a *CompileError", err)
			}
			if ce.Code != tc.code || (tc.line != 0 && ce.Line != tc.line) || !strings.Contains(ce.Msg, tc.msg) {
				t.Errorf("Compile error = %+v, want code %s line %d msg containing %q", ce, tc.code, tc.line, tc.msg)
			}
		})
	}
	if _, err := Compile("ok.pac", strings.Repeat(" ", MaxScriptBytes-40)+"function FindProxyForURL(){}", Options{}); err != nil {
		t.Errorf("a script of exactly the bound: %v", err)
	}
}

func TestEvalMixedDst(t *testing.T) {
	s := mustCompile(t, `function FindProxyForURL(url, host) {
		if (isInNet(dnsResolve(host), "192.0.2.0", "255.255.255.0")) return "DENY";
		if (isInNetEx(dnsResolveEx(host), "fd00::/8")) return "GATEWAY";
		return "DIRECT";
	}`, Options{})
	for _, tc := range []struct {
		dst  string
		exit string
	}{{"192.0.2.9", "deny"}, {"fd00::9", "gateway"}, {"198.51.100.1", "direct"}} {
		if r := s.Eval(Call{Host: "svc.example", Dst: netip.MustParseAddr(tc.dst)}); r.Exit != tc.exit {
			t.Errorf("Eval(dst %s) = %+v, want %s", tc.dst, r, tc.exit)
		}
	}
}

func TestTopLevelDeterministic(t *testing.T) {
	s := mustCompile(t, `var loaded = new Date().toISOString() + " " + Math.random();
		function FindProxyForURL(url, host) { return loaded; }`, Options{})
	got := rawEval(t, s, Call{Host: "a", At: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)})
	if !strings.HasPrefix(got, "1970-01-01T00:00:00.000Z ") {
		t.Errorf("top-level code saw %q, want the fixed load time", got)
	}
}

// TestLongResults: a script that returns long strings neither fills its runtimes'
// result cache with them (256 entries of a MiB each per runtime) nor hands them whole
// to the decision record.
func TestLongResults(t *testing.T) {
	s, err := compile("t.pac", `function FindProxyForURL(url, host) { return "PROXY " + host + "x".repeat(1 << 20); }`,
		Options{Deadline: 10 * time.Second}, false)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := 0; i < 100; i++ {
		r := s.Eval(Call{Host: fmt.Sprintf("h%d.example", i)})
		if r.Failed || r.Exit != "" || len(r.Directive) > maxDirective+len("…") {
			t.Fatalf("Eval = %.80v..., want the default with a directive cut to %d bytes", r, maxDirective)
		}
	}
	cached := 0
	for range cap(s.p.idle) {
		select {
		case w := <-s.p.idle:
			for k := range w.results {
				cached += len(k)
			}
			defer func() { s.p.idle <- w }()
		default:
		}
	}
	if cached > resultCacheMax*maxCachedResult {
		t.Errorf("the runtimes cache %d bytes of results", cached)
	}
}

// TestNeedsAddr: a script needs the destination address when it can call a built-in
// that answers from Call.Dst (dnsResolve, dnsResolveEx, isResolvable, isResolvableEx,
// isInNet, which resolves a name through dnsResolve), by name or through the global
// object under a name it computes. Scripts that use the host name only, or their own
// address (myIpAddress), do not.
func TestNeedsAddr(t *testing.T) {
	fn := func(body string) string {
		return "function FindProxyForURL(url, host) {\n  " + body + "\n}\n"
	}
	for _, tc := range []struct {
		name, src string
		want      bool
	}{
		{"names only", fn(`return shExpMatch(host, "*.corp.example") ? "DIRECT" : "DENY";`), false},
		{"isInNet on an address (counted all the same)", fn(`return isInNet(myIpAddress(), "10.0.0.0", "255.0.0.0") ? "DIRECT" : "DENY";`), true},
		{"own address, Ex", fn(`return isInNetEx(myIpAddressEx(), "10.0.0.0/8") ? "DIRECT" : "DENY";`), false},
		{"address literals", fn(`return convert_addr("10.1.2.3") > 0 && sortIpAddressList("::1;1.1.1.1") ? "DIRECT" : "DENY";`), false},
		{"in a comment or a string", fn("// dnsResolve(host)\n  return \"isInNet: no\";"), false},
		{"dnsResolve", fn(`return dnsResolve(host) ? "DIRECT" : "DENY";`), true},
		{"dnsResolveEx", fn(`return dnsResolveEx(host) ? "DIRECT" : "DENY";`), true},
		{"isResolvable", fn(`return isResolvable(host) ? "DIRECT" : "DENY";`), true},
		{"isResolvableEx", fn(`return isResolvableEx(host) ? "DIRECT" : "DENY";`), true},
		{"isInNet", fn(`return isInNet(host, "10.0.0.0", "255.0.0.0") ? "DIRECT" : "DENY";`), true},
		{"a top-level alias", "var r = dnsResolve;\n" + fn(`return r(host) ? "DIRECT" : "DENY";`), true},
		{"a property of this", fn(`return this.dnsResolve(host) ? "DIRECT" : "DENY";`), true},
		{"a literal key", fn(`return globalThis["isInNet"](host, "10.0.0.0", "255.0.0.0") ? "DIRECT" : "DENY";`), true},
		{"a computed key", fn(`return this["dns" + "Resolve"](host) ? "DIRECT" : "DENY";`), true},
		{"the global object in a variable", fn(`var g = this, k = "dnsRes" + "olve"; return g[k](host) ? "DIRECT" : "DENY";`), true},
		{"a template key", fn("return globalThis[`dnsResolve`](host) ? \"DIRECT\" : \"DENY\";"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := mustCompile(t, tc.src, Options{})
			if got := s.NeedsAddr(); got != tc.want {
				t.Errorf("NeedsAddr() = %v, want %v", got, tc.want)
			}
		})
	}
}
