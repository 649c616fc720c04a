package pac

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"
)

type exprCase struct {
	name string
	expr string
	want string
}

func runExprs(t *testing.T, w *worker, c Call, cases []exprCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := w.evalString(c, tc.expr); got != tc.want {
				t.Errorf("%s = %q, want %q", tc.expr, got, tc.want)
			}
		})
	}
}

func TestHostBuiltins(t *testing.T) {
	w := testWorker(t, Options{})
	runExprs(t, w, Call{}, []exprCase{
		{"plain", `isPlainHostName("www")`, "true"},
		{"plain dotted", `isPlainHostName("www.example.com")`, "false"},
		{"plain empty", `isPlainHostName("")`, "true"},
		{"plain ipv6 literal (Chromium)", `isPlainHostName("::1")`, "false"},
		{"plain missing arg throws", `isPlainHostName()`, "EXC: TypeError: isPlainHostName: argument 1 is undefined"},
		{"domainIs", `dnsDomainIs("www.example.com", ".example.com")`, "true"},
		{"domainIs plain suffix test", `dnsDomainIs("www.badexample.com", "example.com")`, "true"},
		{"domainIs no dot", `dnsDomainIs("www", ".example.com")`, "false"},
		{"domainIs case-sensitive", `dnsDomainIs("WWW.EXAMPLE.COM", ".example.com")`, "false"},
		{"domainIs empty domain", `dnsDomainIs("www", "")`, "true"},
		{"domainIs longer domain", `dnsDomainIs("a.com", "xa.com")`, "false"},
		{"localHostOrDomainIs exact", `localHostOrDomainIs("www.example.com", "www.example.com")`, "true"},
		{"localHostOrDomainIs plain", `localHostOrDomainIs("www", "www.example.com")`, "true"},
		{"localHostOrDomainIs other domain", `localHostOrDomainIs("www.mcom.com", "www.example.com")`, "false"},
		{"localHostOrDomainIs other host", `localHostOrDomainIs("home", "www.example.com")`, "false"},
		{"levels plain", `dnsDomainLevels("www")`, "0"},
		{"levels", `dnsDomainLevels("www.example.com")`, "2"},
		{"levels trailing dot", `dnsDomainLevels("a.b.")`, "2"},
		{"convert_addr", `convert_addr("104.16.41.2")`, "1745889538"},
		{"convert_addr negative int32", `convert_addr("255.255.255.255")`, "-1"},
		{"convert_addr short", `convert_addr("1.2")`, "16908288"},
		{"convert_addr masks octets", `convert_addr("256.1.1.1")`, "65793"},
		{"convert_addr ToNumber", `convert_addr("0x10. 2 .x.1e1")`, "268566538"},
		{"isInNet", `isInNet("198.95.249.79", "198.95.249.79", "255.255.255.255")`, "true"},
		{"isInNet /16", `isInNet("198.95.6.8", "198.95.0.0", "255.255.0.0")`, "true"},
		{"isInNet outside", `isInNet("198.96.6.8", "198.95.0.0", "255.255.0.0")`, "false"},
		{"isInNet octet over 255", `isInNet("256.1.1.1", "0.0.0.0", "0.0.0.0")`, "false"},
		{"isInNet unresolvable name", `isInNet("nowhere.example", "0.0.0.0", "0.0.0.0")`, "false"},
		{"isInNetEx v4", `isInNetEx("198.95.249.79", "198.95.249.79/32")`, "true"},
		{"isInNetEx v4 /16", `isInNetEx("198.95.6.8", "198.95.0.0/16")`, "true"},
		{"isInNetEx v6", `isInNetEx("3ffe:8311:ffff:abcd:1234:dead:beef:101", "3ffe:8311:ffff::/48")`, "true"},
		{"isInNetEx v6 outside", `isInNetEx("3ffe:8312::1", "3ffe:8311:ffff::/48")`, "false"},
		{"isInNetEx family mismatch", `isInNetEx("1.2.3.4", "::/0")`, "false"},
		{"isInNetEx name is not resolved", `isInNetEx("example.com", "0.0.0.0/0")`, "false"},
		{"isInNetEx bad prefix", `isInNetEx("1.2.3.4", "1.2.3.4")`, "false"},
		{"sortIpAddressList", `sortIpAddressList("10.2.3.9;2001:4898:28:3:201:2ff:feea:fc14;::1;10.2.3.10;::9")`,
			"::1;::9;2001:4898:28:3:201:2ff:feea:fc14;10.2.3.9;10.2.3.10"},
		{"sortIpAddressList spaces", `sortIpAddressList(" 2.2.2.2 ;\t1.1.1.1;")`, "1.1.1.1;2.2.2.2"},
		{"sortIpAddressList bad entry", `sortIpAddressList("1.1.1.1;example.com")`, "false"},
		{"sortIpAddressList empty", `sortIpAddressList(";")`, "false"},
		{"getClientVersion", `getClientVersion()`, "1.0"},
		{"alert is a no-op", `alert("hello")`, "undefined"},
	})
}

func TestShExpMatch(t *testing.T) {
	w := testWorker(t, Options{})
	runExprs(t, w, Call{}, []exprCase{
		{"star", `shExpMatch("http://home.netscape.com/people/ari/index.html", "*/ari/*")`, "true"},
		{"star miss", `shExpMatch("http://home.netscape.com/people/montulli/index.html", "*/ari/*")`, "false"},
		{"dot is literal", `shExpMatch("wwwXexample.com", "www.example.com")`, "false"},
		{"question", `shExpMatch("abc", "a?c")`, "true"},
		{"question one char", `shExpMatch("abbc", "a?c")`, "false"},
		{"anchored", `shExpMatch("xabc", "abc")`, "false"},
		{"star empty", `shExpMatch("", "*")`, "true"},
		{"star suffix", `shExpMatch("a.corp.example", "*.corp.example")`, "true"},
		{"star does not match bare domain", `shExpMatch("corp.example", "*.corp.example")`, "false"},
		{"alternation", `shExpMatch("a.bar.com", "*.(foo|bar).com")`, "true"},
		{"alternation miss", `shExpMatch("a.baz.com", "*.(foo|bar).com")`, "false"},
		{"class", `shExpMatch("api3.x", "api[0-9].x")`, "true"},
		{"class miss", `shExpMatch("apiX.x", "api[0-9].x")`, "false"},
		{"plus", `shExpMatch("aaa", "a+")`, "true"},
		{"case-sensitive", `shExpMatch("A", "a")`, "false"},
		{"star stops at newline", `shExpMatch("a\nb", "a*b")`, "false"},
		{"glob path with newline", `shExpMatch("ab\n", "ab*")`, "false"},
		{"invalid regex throws", `(function(){ try { shExpMatch("a", "(a"); return "no" } catch (e) { return "threw" } })()`, "threw"},
		{"catastrophic pattern is linear", `shExpMatch("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!", "(a+)+")`, "false"},
		{"many stars", `shExpMatch("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab", "*a*a*a*a*a*a*a*a*a*a*a*c")`, "false"},
		{"non-ASCII subject", `shExpMatch("bücher.example", "b?cher.*")`, "true"},
	})
}

// TestShExpMatchJSDot: the wildcards are JavaScript's '.', which matches one UTF-16
// unit other than a line terminator (\n, \r, U+2028, U+2029), where Go's matches any
// character but \n, a whole astral character included. Each answer is node's for
// Mozilla's shExpMatch (a RegExp without the u flag).
func TestShExpMatchJSDot(t *testing.T) {
	w := testWorker(t, Options{})
	runExprs(t, w, Call{}, []exprCase{
		{"? and CR", `shExpMatch("a\rb", "a?b")`, "false"},
		{"* and CR", `shExpMatch("a\rb", "a*b")`, "false"},
		{"? and CR on the regex path", `shExpMatch("a\rb", "a(x|?)b")`, "false"},
		{"? and U+2028", `shExpMatch("a\u2028b", "a?b")`, "false"},
		{"* and U+2029", `shExpMatch("a\u2029b", "a*")`, "false"},
		{"* and LF on the regex path", `shExpMatch("a\nb", "(a)*b")`, "false"},
		{"class and CR", `shExpMatch("a\rb", "a[^x]b")`, "true"},
		{"[^] and CR", `shExpMatch("a\rb", "a[^]b")`, "true"},
		{"astral ?", `shExpMatch("\ud83d\ude00", "?")`, "false"},
		{"astral ??", `shExpMatch("\ud83d\ude00", "??")`, "true"},
		{"astral *", `shExpMatch("\ud83d\ude00", "*")`, "true"},
		{"astral in the middle", `shExpMatch("x\ud83d\ude00y", "x?y")`, "false"},
		{"astral in the middle ??", `shExpMatch("x\ud83d\ude00y", "x??y")`, "true"},
		{"astral on the regex path", `shExpMatch("\ud83d\ude00x", "?(x)")`, "false"},
		{"astral on the regex path ??", `shExpMatch("\ud83d\ude00x", "??(x)")`, "true"},
		{"astral literal", `shExpMatch("\ud83d\ude00\ud83d\ude00", "(\ud83d\ude00)+")`, "true"},
		{"astral in a class", `shExpMatch("a\ud83d\ude00", "a[\ud83d\ude00]+")`, "true"},
		{"astral and a class of one unit", `shExpMatch("a\ud83d\ude00", "a[^x]?")`, "true"},
		{"BMP non-ASCII is one unit", `shExpMatch("\u00e9", "?")`, "true"},
		{"escaped backslash then a literal dot", `shExpMatch("a\\\rb", "a\\\\.b")`, "false"},
		{"escaped backslash then ? and CR", `shExpMatch("a\\\rb", "a\\\\?b")`, "false"},
		{"escaped backslash then ?", `shExpMatch("a\\xb", "a\\\\?b")`, "true"},
	})
}

func TestGlobMatchAgreesWithRegexp(t *testing.T) {
	subjects := []string{"", "a", "ab", "abc", "a.b.c", "www.example.com", "x.y", "aaa", "a*b", "a?b"}
	patterns := []string{"", "*", "?", "a*", "*c", "a?c", "*.*", "*.example.com", "a*b*c", "**", "*?", "?*?", "www.*", "a.b.c"}
	var c shexpCache
	for _, s := range subjects {
		for _, p := range patterns {
			re, err := c.compile(p)
			if err != nil {
				t.Fatalf("compile %q: %v", p, err)
			}
			if g, r := globMatch(s, p), re.re.MatchString(s); g != r {
				t.Errorf("globMatch(%q, %q) = %v, regexp says %v", s, p, g, r)
			}
		}
	}
}

func TestResolveBuiltins(t *testing.T) {
	w := testWorker(t, Options{})
	v4 := Call{Host: "www.Example.com", Dst: netip.MustParseAddr("192.0.2.7"), MyIP: netip.MustParseAddr("10.0.0.5")}
	runExprs(t, w, v4, []exprCase{
		{"dnsResolve flow host", `dnsResolve("www.example.com")`, "192.0.2.7"},
		{"dnsResolve case-insensitive", `dnsResolve("WWW.EXAMPLE.COM")`, "192.0.2.7"},
		{"dnsResolve other host", `dnsResolve("other.example.com")`, "null"},
		{"dnsResolve literal", `dnsResolve("198.51.100.1")`, "198.51.100.1"},
		{"dnsResolve v6 literal", `dnsResolve("::1")`, "null"},
		{"isResolvable", `isResolvable("www.example.com")`, "true"},
		{"isResolvable other", `isResolvable("other.example.com")`, "false"},
		{"isInNet resolves flow host", `isInNet("www.example.com", "192.0.2.0", "255.255.255.0")`, "true"},
		{"myIpAddress", `myIpAddress()`, "10.0.0.5"},
		{"myIpAddressEx", `myIpAddressEx()`, "10.0.0.5"},
		{"dnsResolveEx", `dnsResolveEx("www.example.com")`, "192.0.2.7"},
		{"dnsResolveEx other", `dnsResolveEx("other.example.com")`, ""},
		{"dnsResolveEx v6 literal", `dnsResolveEx("2001:db8::1")`, "2001:db8::1"},
		{"isResolvableEx", `isResolvableEx("www.example.com")`, "true"},
		{"isResolvableEx other", `isResolvableEx("nope")`, "false"},
	})
	v6 := Call{Host: "v6.example", Dst: netip.MustParseAddr("fd00::7"), MyIP: netip.MustParseAddr("fd00::1")}
	runExprs(t, w, v6, []exprCase{
		{"dnsResolve v6 dst is IPv4-only", `dnsResolve("v6.example")`, "null"},
		{"dnsResolveEx v6 dst", `dnsResolveEx("v6.example")`, "fd00::7"},
		{"myIpAddress without v4 falls back", `myIpAddress()`, "127.0.0.1"},
		{"myIpAddressEx v6", `myIpAddressEx()`, "fd00::1"},
	})
	none := Call{Host: "x.example"}
	runExprs(t, w, none, []exprCase{
		{"dnsResolve unknown dst", `dnsResolve("x.example")`, "null"},
		{"myIpAddress unknown", `myIpAddress()`, "127.0.0.1"},
		{"myIpAddressEx unknown", `myIpAddressEx()`, ""},
	})
}

func TestTimeBuiltins(t *testing.T) {
	w := testWorker(t, Options{})
	// Wednesday 2026-03-18 14:30:15 UTC.
	at := Call{At: time.Date(2026, 3, 18, 14, 30, 15, 0, time.UTC)}
	runExprs(t, w, at, []exprCase{
		{"weekday", `weekdayRange("WED")`, "true"},
		{"weekday other", `weekdayRange("THU")`, "false"},
		{"weekday range", `weekdayRange("MON", "FRI")`, "true"},
		{"weekday wraps", `weekdayRange("FRI", "MON")`, "false"},
		{"weekday wraps in", `weekdayRange("SAT", "WED")`, "true"},
		{"weekday GMT", `weekdayRange("WED", "GMT")`, "true"},
		{"weekday range GMT", `weekdayRange("MON", "TUE", "GMT")`, "false"},
		{"weekday lower case is unknown", `weekdayRange("wed")`, "false"},
		{"weekday none", `weekdayRange()`, "false"},
		{"weekday only GMT", `weekdayRange("GMT")`, "false"},
		{"date day", `dateRange(18)`, "true"},
		{"date day string", `dateRange("18")`, "true"},
		{"date day other", `dateRange(1)`, "false"},
		{"date month", `dateRange("MAR")`, "true"},
		{"date month other", `dateRange("APR")`, "false"},
		{"date year", `dateRange(2026)`, "true"},
		{"date year other", `dateRange(1995)`, "false"},
		{"date days", `dateRange(1, 18)`, "true"},
		{"date days before", `dateRange(19, 31)`, "false"},
		{"date months", `dateRange("JAN", "MAR")`, "true"},
		{"date months end of month", `dateRange("FEB", "MAR")`, "true"},
		{"date months wrap", `dateRange("OCT", "MAR")`, "true"},
		{"date months wrap out", `dateRange("APR", "FEB")`, "false"},
		{"date years", `dateRange(1995, 2026)`, "true"},
		{"date years out", `dateRange(2027, 2030)`, "false"},
		{"date day month", `dateRange(1, "MAR", 18, "MAR")`, "true"},
		{"date day month out", `dateRange(19, "MAR", 1, "APR")`, "false"},
		{"date month year", `dateRange("OCT", 2025, "MAR", 2026)`, "true"},
		{"date month year out", `dateRange("APR", 2026, "DEC", 2026)`, "false"},
		{"date full", `dateRange(1, "JAN", 2026, 18, "MAR", 2026)`, "true"},
		{"date full out", `dateRange(19, "MAR", 2026, 1, "JAN", 2027)`, "false"},
		{"date GMT", `dateRange("MAR", "GMT")`, "true"},
		{"date unknown month", `dateRange("XYZ", "MAR")`, "false"},
		{"date none", `dateRange()`, "false"},
		{"time hour", `timeRange(14)`, "true"},
		{"time hour other", `timeRange(15)`, "false"},
		{"time hours", `timeRange(9, 17)`, "true"},
		{"time hours inclusive end", `timeRange(12, 14)`, "true"},
		{"time two args never wrap", `timeRange(22, 15)`, "false"},
		{"time two args reversed", `timeRange(15, 9)`, "false"},
		{"time minutes", `timeRange(14, 0, 14, 30)`, "true"},
		{"time minutes out", `timeRange(14, 31, 15, 0)`, "false"},
		{"time minutes wrap", `timeRange(22, 0, 14, 45)`, "true"},
		{"time seconds", `timeRange(14, 30, 15, 14, 30, 15)`, "true"},
		{"time seconds out", `timeRange(14, 30, 16, 14, 31, 0)`, "false"},
		{"time GMT", `timeRange(14, "GMT")`, "true"},
		{"time string args", `timeRange("9", "17")`, "true"},
		{"time bad arg count throws", `(function(){ try { timeRange(1, 2, 3); return "no" } catch (e) { return "threw" } })()`, "threw"},
		{"time none", `timeRange()`, "false"},
		// Mozilla: "GMT" alone leaves no arguments, which is none of 1, 2, 4 or 6.
		{"time GMT alone throws", `(function(){ try { timeRange("GMT"); return "no" } catch (e) { return "threw" } })()`, "threw"},
	})
}

func TestTimeBuiltinsZone(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatalf("load zone: %v", err)
	}
	w := testWorker(t, Options{Location: ny})
	// 2026-03-18 02:30 UTC is Tuesday 22:30 in New York (EDT, UTC-4).
	at := Call{At: time.Date(2026, 3, 18, 2, 30, 0, 0, time.UTC)}
	runExprs(t, w, at, []exprCase{
		{"local hour", `timeRange(22)`, "true"},
		{"GMT hour", `timeRange(2, "GMT")`, "true"},
		{"local weekday", `weekdayRange("TUE")`, "true"},
		{"GMT weekday", `weekdayRange("WED", "GMT")`, "true"},
		{"local day", `dateRange(17)`, "true"},
		{"GMT day", `dateRange(18, "GMT")`, "true"},
		{"Date getHours", `new Date().getHours()`, "22"},
		{"Date getUTCHours", `new Date().getUTCHours()`, "2"},
		{"Date getDay", `new Date().getDay()`, "2"},
		{"Date getTimezoneOffset", `new Date().getTimezoneOffset()`, "240"},
		{"Date toString", `String(new Date())`, "Tue Mar 17 2026 22:30:00 GMT-0400 (EDT)"},
		{"Date()", `Date()`, "Tue Mar 17 2026 22:30:00 GMT-0400 (EDT)"},
		{"Date components are local", `new Date(2026, 0, 1, 12).getTime()`, "1767286800000"},
		{"Date setHours is local", `(function () { var d = new Date(); d.setHours(9); return d.toISOString(); })()`, "2026-03-17T13:30:00.000Z"},
		{"Date instanceof", `new Date() instanceof Date`, "true"},
		{"Date.now", `Date.now()`, "1773801000000"},
	})
}

func TestDeterminism(t *testing.T) {
	w := testWorker(t, Options{})
	// A call without a timestamp sees the fixed time top-level code sees, never the
	// clock (it saw time.Now()).
	runExprs(t, w, Call{}, []exprCase{
		{"Date.now without At", `Date.now()`, "0"},
		{"new Date without At", `new Date().toISOString()`, "1970-01-01T00:00:00.000Z"},
		{"Date() without At", `Date()`, "Thu Jan 01 1970 00:00:00 GMT+0000 (UTC)"},
		{"dateRange without At", `dateRange(1970)`, "true"},
	})
	c := Call{Seed: 42, At: time.Unix(1700000000, 0)}
	a := w.evalString(c, `[Math.random(), Math.random(), Date.now()].join()`)
	b := w.evalString(c, `[Math.random(), Math.random(), Date.now()].join()`)
	if a != b {
		t.Errorf("same seed and time gave %q then %q", a, b)
	}
	c.Seed = 43
	if d := w.evalString(c, `[Math.random(), Math.random(), Date.now()].join()`); d == a {
		t.Errorf("seeds 42 and 43 gave the same %q", d)
	}
	if r := w.evalString(c, `(function () { var ok = true; for (var i = 0; i < 1000; i++) { var x = Math.random(); if (!(x >= 0 && x < 1)) ok = false; } return ok; })()`); r != "true" {
		t.Errorf("Math.random out of [0, 1)")
	}
}

func TestBuildURL(t *testing.T) {
	tests := []struct {
		name      string
		c         Call
		url, host string
	}{
		{"https default", Call{Host: "www.example.com", Port: 443}, "https://www.example.com/", "www.example.com"},
		{"no port", Call{Host: "www.example.com"}, "https://www.example.com/", "www.example.com"},
		{"other port", Call{Host: "www.example.com", Port: 8443}, "https://www.example.com:8443/", "www.example.com"},
		{"lower case", Call{Host: "WWW.Example.COM"}, "https://www.example.com/", "www.example.com"},
		{"http", Call{Host: "a.example", Scheme: "http", Port: 80}, "http://a.example/", "a.example"},
		{"http other port", Call{Host: "a.example", Scheme: "http", Port: 443}, "http://a.example:443/", "a.example"},
		{"ipv6 dst only", Call{Dst: netip.MustParseAddr("2001:db8::1")}, "https://[2001:db8::1]/", "2001:db8::1"},
		{"ipv6 bracketed host", Call{Host: "[2001:DB8::1]", Port: 8443}, "https://[2001:db8::1]:8443/", "2001:db8::1"},
		{"ipv4 dst only", Call{Dst: netip.MustParseAddr("::ffff:192.0.2.1")}, "https://192.0.2.1/", "192.0.2.1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			url, host := BuildURL(tc.c)
			if url != tc.url || host != tc.host {
				t.Errorf("BuildURL(%+v) = %q, %q, want %q, %q", tc.c, url, host, tc.url, tc.host)
			}
		})
	}
}

func TestConvertAddrToNumber(t *testing.T) {
	tests := []struct {
		in   string
		want float64
	}{
		{"12", 12}, {" 12\t", 12}, {"", 0}, {"0x1f", 31}, {"0b11", 3}, {"0o17", 15},
		{"1e2", 100}, {".5", 0.5}, {"5.", 5}, {"-3", -3}, {"+4", 4},
	}
	for _, tc := range tests {
		if got := jsStringToNumber(tc.in); got != tc.want {
			t.Errorf("jsStringToNumber(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
	for _, nan := range []string{"x", "1x", "0x", "0xg", "1e", "e1", ".", "+", "1_0", "inf", "0x1p2"} {
		if got := jsStringToNumber(nan); got == got {
			t.Errorf("jsStringToNumber(%q) = %v, want NaN", nan, got)
		}
	}
}

func TestNullArguments(t *testing.T) {
	w := testWorker(t, Options{})
	runExprs(t, w, Call{Host: "x.example"}, []exprCase{
		{"isInNet of unresolved", `isInNet(dnsResolve("nope"), "10.0.0.0", "255.0.0.0")`, "false"},
		{"isInNetEx of unresolved", `isInNetEx(dnsResolveEx("nope"), "10.0.0.0/8")`, "false"},
		{"shExpMatch null subject", `shExpMatch(null, "nu*")`, "true"},
		{"dnsResolve null", `dnsResolve(null)`, "null"},
		{"dnsDomainIs null throws", `(function(){ try { dnsDomainIs(null, "x"); return "no" } catch (e) { return e.name } })()`, "TypeError"},
	})
}

func TestExtendedGlobAgreesWithRegexp(t *testing.T) {
	subjects := []string{"", "a", "b", "ab", "abc", "a.b.c", "www.example.com", "api3.payments.example", "apix.payments.example",
		"x.torrent.y", "x.warez.y", "x.other.y", "a-b", "a]", "^", "x.com", "x.net", "x.org", "[", "-", "5"}
	patterns := []string{"*.(torrent|warez).*", "api[0-9].payments.example", "*.(com|net)", "[a-c]*", "[^a]*", "(a|b)", "(|a)b",
		"(a|b)(c|)", "[-a]", "[a-]", "[]a]", "[^]", "[b-a]", "(a|(b))", "a|b", "(a", "[a", "[.]", "*[0-9]*", "(www|api3).*", "[!-/]"}
	var c shexpCache
	for _, p := range patterns {
		x, err := c.compile(p)
		if err != nil {
			continue // invalid for the regex too: the glob is never consulted
		}
		for _, s := range subjects {
			want := x.reMatch(s)
			got, err := c.match(s, p)
			if err != nil || got != want {
				t.Errorf("shExpMatch(%q, %q) = %v, %v; the regex says %v (glob form %v)", s, p, got, err, want, x.alts != nil)
			}
		}
	}
}

func TestExtendedGlobUsed(t *testing.T) {
	var c shexpCache
	for _, p := range []string{"*.(torrent|warez).*", "api[0-9].payments.example", "[^a]*", "(www|api3).*"} {
		if x, err := c.compile(p); err != nil || x.alts == nil {
			t.Errorf("pattern %q does not take the glob path (err %v)", p, err)
		}
	}
	for _, p := range []string{"a+", "(a|b)+", "^a", `a\.b`, "a{2}", "[]", "(a|(b))"} {
		if x, err := c.compile(p); err == nil && x.alts != nil {
			t.Errorf("pattern %q takes the glob path", p)
		}
	}
}

// TestShExpCacheBounded: long patterns are not kept in a runtime's pattern cache (512 of
// them, each with its compiled regex, could hold gigabytes).
func TestShExpCacheBounded(t *testing.T) {
	var c shexpCache
	long := strings.Repeat("a(b|c)", 2000)
	for i := range 100 {
		if _, err := c.match("abc", long+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	cached := 0
	for p := range c.m {
		cached += len(p)
	}
	if cached > shexpCacheMax*maxCachedPattern {
		t.Errorf("%d bytes of patterns cached", cached)
	}
	// Short ones are.
	if _, err := c.match("abc", "a(b|c)*"); err != nil || c.m["a(b|c)*"] == nil {
		t.Errorf("a short pattern is not cached (%v)", err)
	}
}
