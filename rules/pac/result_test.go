package pac

import (
	"strings"
	"testing"
)

func TestParseResult(t *testing.T) {
	tests := []struct {
		in   string
		want Result
	}{
		{"DIRECT", Result{Exit: "direct", Directive: "DIRECT"}},
		{"  direct  ", Result{Exit: "direct", Directive: "direct"}},
		{"Direct; PROXY a:1", Result{Exit: "direct", Directive: "Direct"}},
		{"DENY", Result{Exit: "deny", Directive: "DENY"}},
		{"block", Result{Exit: "deny", Directive: "block"}},
		{"CLIENT", Result{Exit: "client", Directive: "CLIENT"}},
		{"CLUSTER", Result{Exit: "direct", Directive: "CLUSTER"}},
		{"gateway", Result{Exit: "gateway", Directive: "gateway"}},
		{"PROXY client", Result{Exit: "client", Directive: "PROXY client"}},
		{"PROXY gateway", Result{Exit: "gateway", Directive: "PROXY gateway"}},
		{"proxy Cluster", Result{Exit: "direct", Directive: "proxy Cluster"}},
		{"PROXY proxy.corp:3128; DIRECT", Result{Exit: "client", Directive: "PROXY proxy.corp:3128", Proxy: "http://proxy.corp:3128"}},
		{"PROXY\tProxy.Corp:3128", Result{Exit: "client", Directive: "PROXY\tProxy.Corp:3128", Proxy: "http://proxy.corp:3128"}},
		{"PROXY proxy.corp", Result{Exit: "client", Directive: "PROXY proxy.corp", Proxy: "http://proxy.corp:80"}},
		{"HTTPS secure.corp:8443", Result{Exit: "client", Directive: "HTTPS secure.corp:8443", Proxy: "https://secure.corp:8443"}},
		{"HTTPS secure.corp", Result{Exit: "client", Directive: "HTTPS secure.corp", Proxy: "https://secure.corp:443"}},
		{"SOCKS s.corp:1080", Result{Exit: "client", Directive: "SOCKS s.corp:1080", Proxy: "socks5://s.corp:1080"}},
		{"socks5 10.0.0.1:9050", Result{Exit: "client", Directive: "socks5 10.0.0.1:9050", Proxy: "socks5://10.0.0.1:9050"}},
		{"SOCKS5 [2001:DB8::1]:1080", Result{Exit: "client", Directive: "SOCKS5 [2001:DB8::1]:1080", Proxy: "socks5://[2001:db8::1]:1080"}},
		{"PROXY [::1]", Result{Exit: "client", Directive: "PROXY [::1]", Proxy: "http://[::1]:80"}},
		{"", Result{}},
		{"   ", Result{}},
		{";DIRECT", Result{}},
		{"FOO", Result{Directive: "FOO"}},
		{"SOCKS4 s:1080", Result{Directive: "SOCKS4 s:1080"}},
		{"DIRECT now", Result{Directive: "DIRECT now"}},
		{"PROXY", Result{Directive: "PROXY"}},
		{"PROXY a:1 b:2", Result{Directive: "PROXY a:1 b:2"}},
		{"PROXY a:0", Result{Directive: "PROXY a:0"}},
		{"PROXY a:65536", Result{Directive: "PROXY a:65536"}},
		{"PROXY a:", Result{Directive: "PROXY a:"}},
		{"PROXY a:x", Result{Directive: "PROXY a:x"}},
		{"PROXY user:pw@evil:80", Result{Directive: "PROXY user:pw@evil:80"}},
		{"PROXY evil/path:80", Result{Directive: "PROXY evil/path:80"}},
		{"PROXY ::1:80", Result{Directive: "PROXY ::1:80"}},
		{"PROXY [1.2.3.4]:80", Result{Directive: "PROXY [1.2.3.4]:80"}},
		{"PROXY [::1]x", Result{Directive: "PROXY [::1]x"}},
		{"PROXY a..b:80", Result{Directive: "PROXY a..b:80"}},
	}
	// A directive goes into decision records as returned: a long one is cut (no valid
	// directive is longer than about 270 bytes: a keyword, a 253-byte host, a port).
	long := "PROXY " + strings.Repeat("a", 10000)
	tests = append(tests,
		struct {
			in   string
			want Result
		}{long + "; DIRECT", Result{Directive: long[:maxDirective] + "…"}},
		struct {
			in   string
			want Result
		}{"SOCKS5 " + strings.Repeat("a.", 126) + "a:65535", Result{Exit: "client", Directive: "SOCKS5 " + strings.Repeat("a.", 126) + "a:65535",
			Proxy: "socks5://" + strings.Repeat("a.", 126) + "a:65535"}})
	for _, tc := range tests {
		if got := ParseResult(tc.in); got != tc.want {
			t.Errorf("ParseResult(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}
