package rules

import (
	"errors"
	"net/netip"
	"testing"
	"time"
)

func TestFromScript(t *testing.T) {
	const src = `function FindProxyForURL(url, host) {
  if (dnsDomainIs(host, ".corp.example")) return "PROXY client";
  if (shExpMatch(host, "*.blocked.example")) return "DENY";
  return "";
}
`
	p, err := FromScript("egress.pac", []byte(src), "deny", LoadOptions{})
	if err != nil {
		t.Fatalf("FromScript: %v", err)
	}
	if !p.HasScript() {
		t.Fatal("FromScript: the policy has no script")
	}
	// The equivalent rules file loads as the same policy (same version on every hop).
	q, err := Parse("copy", p.Source(), LoadOptions{})
	if err != nil {
		t.Fatalf("Parse(Source()): %v", err)
	}
	if p.Hash() != q.Hash() {
		t.Errorf("hash of FromScript %s != hash of its Source %s", p.Hash(), q.Hash())
	}
	at := time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, host, exit string
	}{
		{"client route", "git.corp.example", ExitClient},
		{"deny", "x.blocked.example", ExitDeny},
		{"empty result takes the default", "example.org", ExitDeny},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &Flow{Host: tc.host, Dst: netip.MustParseAddrPort("192.0.2.1:443"), At: at, ID: 7}
			for _, pol := range []*Policy{p, q} {
				if got := pol.Decide(f); got.Exit != tc.exit || got.Dimension != DimScript {
					t.Errorf("Decide(%s) = %+v, want exit %s by script", tc.host, got, tc.exit)
				}
			}
		})
	}
}

func TestFromScriptErrors(t *testing.T) {
	for _, tc := range []struct {
		name, src, def string
		code           Code
		line           int
	}{
		{"syntax error on line 2", "function FindProxyForURL(url, host) {\n  return (;\n}\n", "", CodeScript, 2},
		{"no FindProxyForURL", "var x = 1;\n", "", CodeScript, 0},
		{"bad default", "function FindProxyForURL(u, h) { return \"DIRECT\"; }\n", "sideways", CodeBadAction, 0},
		{"gateway default without the opt-in", "function FindProxyForURL(u, h) { return \"DIRECT\"; }\n", "gateway", CodeGatewayOff, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := FromScript("egress.pac", []byte(tc.src), tc.def, LoadOptions{})
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("FromScript = %v, want a *rules.Error", err)
			}
			if e.Code != tc.code || (tc.line != 0 && e.Line != tc.line) {
				t.Errorf("FromScript = %v (code %s, line %d), want code %s line %d", err, e.Code, e.Line, tc.code, tc.line)
			}
		})
	}
}
