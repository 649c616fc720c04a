package pac

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"
)

func FuzzParseResult(f *testing.F) {
	for _, s := range []string{"DIRECT", "PROXY a:1; DIRECT", "SOCKS5 [::1]:1080", "proxy client", "BLOCK", "",
		"HTTPS h", "PROXY user@h:1", "PROXY [::1", "PROXY h:99999", "\tdirect\t;", "PROXY\u00a0h:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r := ParseResult(s)
		switch r.Exit {
		case "", "direct", "deny", "client", "gateway":
		default:
			t.Fatalf("ParseResult(%q).Exit = %q", s, r.Exit)
		}
		if r.Failed || r.Reason != "" {
			t.Fatalf("ParseResult(%q) failed: %+v", s, r)
		}
		if strings.Contains(r.Directive, ";") || strings.TrimSpace(r.Directive) != r.Directive && strings.Trim(r.Directive, " \t\r\n") != r.Directive {
			t.Fatalf("ParseResult(%q).Directive = %q: not the trimmed first directive", s, r.Directive)
		}
		if r.Proxy == "" {
			return
		}
		if r.Exit != "client" {
			t.Fatalf("ParseResult(%q) = %+v: a proxy with exit %q", s, r, r.Exit)
		}
		u, err := url.Parse(r.Proxy)
		if err != nil {
			t.Fatalf("ParseResult(%q).Proxy = %q: %v", s, r.Proxy, err)
		}
		if (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "socks5") || u.User != nil || u.Path != "" ||
			u.RawQuery != "" || u.Fragment != "" || u.Hostname() == "" || u.Port() == "" {
			t.Fatalf("ParseResult(%q).Proxy = %q: not a plain scheme://host:port", s, r.Proxy)
		}
	})
}

func FuzzCompile(f *testing.F) {
	for _, s := range []string{
		`function FindProxyForURL(url, host) { return "DIRECT"; }`,
		`function FindProxyForURL(url, host) { if (shExpMatch(host, "*.a")) return "PROXY p:1"; return null; }`,
		`function FindProxyForURL(url, host) { return isInNet(dnsResolve(host), "10.0.0.0", "255.0.0.0") ? "DENY" : "CLIENT"; }`,
		`function FindProxyForURL(url, host) { return dateRange("JAN", "MAR") + timeRange(1, 2) + weekdayRange("MON"); }`,
		`var FindProxyForURL = function (u, h) { return u; };`,
		`function FindProxyForURL(u, h) { while (true) {} }`,
		`function FindProxyForURL(u, h) { return 1; }`,
		`function FindProxyForURL(u, h) {`,
		`throw 1`,
		``,
		`var n = 0; function FindProxyForURL(u, h) { n++; return n % 2 ? "PROXY x:1" : "DIRECT"; }`,
		`var c = {}; function t() { return c; } function FindProxyForURL(u, h) { var o = t(); o.h = o.h || h; return o.h == h ? "DIRECT" : "BLOCK"; }`,
		`var re = /a/g, d = new Date(0); function FindProxyForURL(u, h) { d.setTime(d.getTime() + 1); return re.test(h) + "" + d.getTime(); }`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, src string) {
		s, err := Compile("fuzz.pac", src, Options{Deadline: 20 * time.Millisecond, MaxAbandoned: 2})
		if err != nil {
			var ce *CompileError
			if !errors.As(err, &ce) || (ce.Code != CodeScript && ce.Code != CodeTooLarge) || ce.Line < 0 {
				t.Fatalf("Compile error %#v is not a CompileError with a known code", err)
			}
			return
		}
		defer s.Close()
		r := s.Eval(Call{Host: "www.example.com", Port: 443})
		switch r.Exit {
		case "", "direct", "deny", "client", "gateway":
		default:
			t.Fatalf("Eval exit %q", r.Exit)
		}
		if r.Failed && r.Exit != "deny" {
			t.Fatalf("a failed Eval that does not deny: %+v", r)
		}
		// Calls are independent: the same call again gets the same answer.
		if r2 := s.Eval(Call{Host: "www.example.com", Port: 443}); r2 != r && !timedOut(r) && !timedOut(r2) {
			t.Fatalf("the same call twice: %+v, then %+v", r, r2)
		}
	})
}

// FuzzShExpMatch checks the glob matchers against the regex they stand in for.
func FuzzShExpMatch(f *testing.F) {
	for _, s := range [][2]string{{"a.b.c", "*.(b|c).*"}, {"api3.x", "api[0-9].x"}, {"ab", "[^a]?"}, {"x", "(|x)"},
		{"a-b", "[-a]-?"}, {"abc", "a*c"}, {"", "*"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, subject, pattern string) {
		var c shexpCache
		x, err := c.compile(pattern)
		got, merr := c.match(subject, pattern)
		if err != nil {
			if merr == nil {
				t.Fatalf("shExpMatch(%q, %q) = %v: the pattern does not compile (%v) but matching succeeded", subject, pattern, got, err)
			}
			return
		}
		if merr != nil {
			t.Fatalf("shExpMatch(%q, %q): %v", subject, pattern, merr)
		}
		if want := x.reMatch(subject); got != want {
			t.Fatalf("shExpMatch(%q, %q) = %v, the regex %q says %v", subject, pattern, got, x.re, want)
		}
	})
}

// timedOut: the call ran out of time or runtimes (a busy machine, an endless loop).
func timedOut(r Result) bool {
	return r.Failed && (strings.Contains(r.Reason, "within") || strings.Contains(r.Reason, "stuck") || strings.Contains(r.Reason, "interrupted"))
}
