package rules

import (
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/rules/pac"
)

// slow keeps script deadlines out of the way on a loaded test machine.
var slow = pac.Options{Deadline: 10 * time.Second}

const pacPolicy = `default: proxy
script: |
  function FindProxyForURL(url, host) {
    if (dnsDomainIs(host, ".corp.example")) return "PROXY client";
    if (shExpMatch(host, "*.blocked.example")) return "DENY";
    if (host == "squid.example") return "PROXY squid.corp.example:3128; DIRECT";
    if (host == "gw.example") return "GATEWAY";
    if (host == "nothing.example") return "";
    if (host == "broken.example") throw new Error("boom");
    if (isInNet(host, "10.0.0.0", "255.0.0.0")) return "DIRECT";
    return null;
  }
`

func TestDecideScript(t *testing.T) {
	p := mustParse(t, pacPolicy, LoadOptions{PAC: slow})
	tests := []struct {
		name             string
		flow             Flow
		exit, directive  string
		proxy, reasonHas string
	}{
		{"proxy client", Flow{Host: "git.corp.example"}, "client", "PROXY client", "", ""},
		{"deny", Flow{Host: "ads.blocked.example"}, "deny", "DENY", "", ""},
		{"real proxy goes to client", Flow{Host: "squid.example", Dst: ap("192.0.2.1:443")}, "client", "PROXY squid.corp.example:3128", "http://squid.corp.example:3128", ""},
		{"empty is the default", Flow{Host: "nothing.example"}, "proxy", "", "", ""},
		{"null is the default", Flow{Host: "other.example"}, "proxy", "", "", ""},
		{"exception fails closed", Flow{Host: "broken.example"}, "deny", "", "", "boom"},
		{"gateway off fails closed", Flow{Host: "gw.example"}, "deny", "GATEWAY", "", "gateway"},
		{"address only", Flow{Dst: ap("10.1.2.3:80")}, "direct", "DIRECT", "", ""},
		{"host literal", Flow{Host: "10.1.2.3"}, "direct", "DIRECT", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := p.Decide(&tt.flow)
			if d.Exit != tt.exit || d.Directive != tt.directive || d.Proxy != tt.proxy || d.Dimension != DimScript || d.Rule != 0 || d.Priority != 0 {
				t.Errorf("Decide(%+v) = %+v, want exit %s directive %q proxy %q", tt.flow, d, tt.exit, tt.directive, tt.proxy)
			}
			if tt.reasonHas != "" && !strings.Contains(d.Reason, tt.reasonHas) {
				t.Errorf("Decide(%+v).Reason = %q, want it to mention %q", tt.flow, d.Reason, tt.reasonHas)
			}
		})
	}
	if d := p.Decide(&Flow{Host: "git.corp.example", Dst: ap("169.254.169.254:80")}); d.Dimension != DimGuard || d.Exit != ExitDirect {
		t.Errorf("guard before script: Decide = %+v", d)
	}
	if !p.NeedsHost() || p.NeedsProcess() || !p.HasScript() {
		t.Errorf("NeedsHost %v NeedsProcess %v HasScript %v", p.NeedsHost(), p.NeedsProcess(), p.HasScript())
	}
	gw := mustParse(t, pacPolicy, LoadOptions{AllowGateway: true, PAC: slow})
	if d := gw.Decide(&Flow{Host: "gw.example"}); d.Exit != ExitGateway {
		t.Errorf("gateway allowed: Decide = %+v", d)
	}
	det := mustParse(t, pacPolicy, LoadOptions{Detached: true, PAC: slow})
	if d := det.Decide(&Flow{Host: "git.corp.example"}); d.Exit != ExitDeny || d.Reason == "" {
		t.Errorf("detached client: Decide = %+v, want deny with a reason", d)
	}
}

func TestScriptErrors(t *testing.T) {
	for _, tt := range []struct {
		name, src string
		code      Code
		line      int
	}{
		{"syntax", "default: direct\nscript: |\n  function FindProxyForURL(url, host) {\n    return (;\n  }\n", CodeScript, 4},
		{"no function", "script: |\n  var x = 1;\n", CodeScript, 0},
		{"not a string", "script: [a]\n", CodeBadValue, 1},
		{"too large", "script: \"" + strings.Repeat("x", 1<<20+1) + "\"\n", CodeTooLarge, 1},
		{"label chain", labelChain, CodeScript, 4},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("s.yaml", []byte(tt.src), LoadOptions{})
			e, ok := err.(*Error)
			if !ok || e.Code != tt.code || (tt.line != 0 && e.Line != tt.line) {
				t.Errorf("Parse = %v, want %s at line %d", err, tt.code, tt.line)
			}
		})
	}
}

// TestScriptNeedsAddr: a script whose answer can depend on the destination address
// (dnsResolve and the built-ins that resolve through it answer from it) says so, so
// that the relay resolves a name in proxy mode before deciding, as transparent mode
// knows the address anyway. Without it, docs/pac.md's example sent names of the
// 10/8 network to the proxy in proxy mode and direct in transparent mode.
func TestScriptNeedsAddr(t *testing.T) {
	script := func(body string) string {
		return "default: direct\nscript: |\n  function FindProxyForURL(url, host) {\n    " + body + "\n  }\n"
	}
	for _, tc := range []struct {
		name, src string
		want      bool
	}{
		{"docs example", script(`if (isInNet(dnsResolve(host), "10.0.0.0", "255.0.0.0")) return "CLUSTER";
    return "PROXY proxy.corp.example.com:3128; DIRECT";`), true},
		{"isInNet on the host", script(`return isInNet(host, "10.0.0.0", "255.0.0.0") ? "DENY" : "DIRECT";`), true},
		{"isResolvable", script(`return isResolvable(host) ? "DIRECT" : "DENY";`), true},
		{"dnsResolveEx", script(`return dnsResolveEx(host) == "" ? "DENY" : "DIRECT";`), true},
		{"names only", script(`return dnsDomainIs(host, ".corp.example") ? "DIRECT" : "PROXY p:1";`), false},
		{"own address", script(`return isInNetEx(myIpAddressEx(), "10.0.0.0/8") ? "DIRECT" : "DENY";`), false},
		{"mentioned in a comment only", script("// dnsResolve(host) is not needed here\n    return \"DIRECT\";"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := mustParse(t, tc.src, LoadOptions{PAC: slow})
			if got := p.NeedsAddr(); got != tc.want {
				t.Fatalf("NeedsAddr() = %v, want %v", got, tc.want)
			}
		})
	}
	// What the relay does with it: in proxy mode the name alone, once resolved the
	// address; the two decide differently, which is why the relay must resolve.
	p := mustParse(t, script(`if (isInNet(dnsResolve(host), "10.0.0.0", "255.0.0.0")) return "CLUSTER";
    return "PROXY proxy.corp.example.com:3128; DIRECT";`), LoadOptions{PAC: slow})
	byName := p.Decide(&Flow{Host: "db.internal", Dst: netip.AddrPortFrom(netip.Addr{}, 443)})
	byAddr := p.Decide(&Flow{Host: "db.internal", Dst: ap("10.1.2.3:443")})
	if byName.Exit != ExitClient || byAddr.Exit != ExitDirect {
		t.Errorf("Decide by name = %s, with the address = %s; want client, then direct", byName.Exit, byAddr.Exit)
	}
}

// labelChain is the reviewer's file: 16 KB of labels after FindProxyForURL.
var labelChain = "default: direct\nscript: |\n  function FindProxyForURL(url, host) { return 'DIRECT'; }\n  " +
	strings.Repeat("a:", 8000) + ";\n"

// TestScriptLabelChain: loading labelChain took 28 s and 3 GB in goja's parser, during
// which a reload waited. It is refused at once, naming its line, with little memory.
func TestScriptLabelChain(t *testing.T) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	_, err := Parse("s.yaml", []byte(labelChain), LoadOptions{})
	took := time.Since(start)
	runtime.ReadMemStats(&after)
	e, ok := err.(*Error)
	if !ok || e.Code != CodeScript || e.Line != 4 || !strings.Contains(e.Msg, "labels") {
		t.Fatalf("Parse = %v, want E_SCRIPT at line 4 for its labels", err)
	}
	// Generous bounds: the machine is shared.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 || took > 5*time.Second {
		t.Errorf("Parse took %v and allocated %d MiB", took, alloc>>20)
	}
}
