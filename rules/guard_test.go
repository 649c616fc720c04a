package rules

import (
	"net/netip"
	"testing"
)

// TestGuardNameOnly: a flow known only by name is checked by the metadata guard once
// the relay has resolved it, and the relay resolves it when NeedsAddr says so. A policy
// that can send a flow through the node's own network (gateway) must say so even without
// cidr rules, or a name resolving to 169.254.169.254 leaves unchecked. Upstreams and the
// attach side resolve names on their own side (a name may resolve only there), so they
// need no lookup on the node.
func TestGuardNameOnly(t *testing.T) {
	for _, tc := range []struct {
		name string
		src  string
		o    LoadOptions
		want bool
	}{
		{"default gateway", "default: gateway\n", LoadOptions{AllowGateway: true}, true},
		{"gateway rule", "rules:\n  - domain: a.example\n    action: gateway\n", LoadOptions{AllowGateway: true}, true},
		{"default proxy", "default: proxy\n", LoadOptions{}, false},
		{"default client", "default: client\n", LoadOptions{}, false},
		{"domain rule to proxy", "rules:\n  - domain: a.example\n    action: proxy\n", LoadOptions{}, false},
		{"label rule to a named exit", "rules:\n  - label: a=b\n    exit: egress-b\n", LoadOptions{}, false},
		{"pattern form without prefixes", "default: cluster\nrules:\n  - pattern: \"*.corp.example\"\n    route: client\n", LoadOptions{}, true},
		{"script without gateway", "script: |\n  function FindProxyForURL(url, host) { return \"DIRECT\"; }\n", LoadOptions{}, false},
		{"script with gateway", "script: |\n  function FindProxyForURL(url, host) { return \"DIRECT\"; }\n", LoadOptions{AllowGateway: true}, true},
		{"direct and deny only", "rules:\n  - domain: a.example\n    action: deny\n", LoadOptions{}, false},
		{"detached script without gateway", "script: |\n  function FindProxyForURL(url, host) { return \"DIRECT\"; }\n", LoadOptions{Detached: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := mustParse(t, tc.src, tc.o)
			if got := p.NeedsAddr(); got != tc.want {
				t.Fatalf("NeedsAddr() = %v, want %v (exits %v)", got, tc.want, p.Exits())
			}
			if !tc.want {
				return
			}
			// What the relay does next: the name resolved to the metadata address.
			f := Flow{Host: "metadata.example", Dst: netip.MustParseAddrPort("169.254.169.254:80")}
			if d := p.Decide(&f); d.Exit != ExitDirect || d.Dimension != DimGuard {
				t.Errorf("Decide(%+v) = %s by %s, want direct by guard", f, d.Exit, d.Dimension)
			}
		})
	}
}

// TestGuardLiteralForms: an IP-literal host in any form a resolver answers with the
// address itself is the address, for the guard (and cidr rules) alike.
func TestGuardLiteralForms(t *testing.T) {
	for _, src := range []string{
		"default: gateway\n",
		"default: gateway\nrules:\n  - cidr: 10.0.0.0/8\n    action: deny\n",
		"default: gateway\nrules:\n  - pattern: \"*.corp.example\"\n    route: deny\n",
	} {
		p := mustParse(t, src, LoadOptions{AllowGateway: true})
		for _, h := range []string{
			"169.254.169.254", "169.254.169.254.", "[::ffff:169.254.169.254]", "[::ffff:169.254.169.254].",
			"::ffff:169.254.169.254.", "::ffff:a9fe:a9fe",
		} {
			f := Flow{Host: h, Dst: netip.AddrPortFrom(netip.Addr{}, 80)}
			if d := p.Decide(&f); d.Exit != ExitDirect || d.Dimension != DimGuard {
				t.Errorf("%q: Decide(host %q) = %s by %s, want direct by guard", src, h, d.Exit, d.Dimension)
			}
			if d := p.walk(&f); d.Exit != ExitDirect || d.Dimension != DimGuard {
				t.Errorf("%q: walk(host %q) = %s by %s, want direct by guard", src, h, d.Exit, d.Dimension)
			}
		}
	}
	// The trailing dot makes a literal an address for cidr rules too, and one dot only.
	p := mustParse(t, "default: gateway\nrules:\n  - cidr: 10.0.0.0/8\n    action: deny\n", LoadOptions{AllowGateway: true})
	for _, tc := range []struct {
		host string
		want string
	}{
		{"10.1.2.3.", ExitDeny},
		{"[fd00::1].", ExitGateway},
		{"10.1.2.3..", ExitGateway}, // not a literal: a name (that no resolver answers)
		{"a.example.", ExitGateway},
	} {
		f := Flow{Host: tc.host}
		if d := p.Decide(&f); d.Exit != tc.want {
			t.Errorf("Decide(host %q) = %s by %s, want %s", tc.host, d.Exit, d.Dimension, tc.want)
		}
		if got := p.Matches(&f); (len(got) == 1) != (tc.want == ExitDeny) {
			t.Errorf("Matches(host %q) = %v", tc.host, got)
		}
	}
}

// TestIPv6LiteralHosts: an IPv6 literal is an address whatever character it starts
// with. Only those starting with a digit, '[' or ':' used to be tried as one, so
// fd00:ec2::254 (AWS's IPv6 metadata address) passed the guard as a name, and fe80::1
// or fd12::1 missed cidr rules. A host decides as its address given as the
// destination does, in every form, on both the index and the walk.
func TestIPv6LiteralHosts(t *testing.T) {
	for _, src := range []string{
		"default: proxy\nrules:\n  - cidr: 'fd00::/8,fe80::/10,2001:db8::/32'\n    action: deny\n",
		"default: cluster\nrules:\n  - pattern: 'fd00::/8'\n    route: block\n  - pattern: '*.example'\n    route: client\n",
		"default: gateway\n",
	} {
		p := mustParse(t, src, LoadOptions{AllowGateway: true})
		for _, tc := range []struct {
			host, addr string
		}{
			{"fd00:ec2::254", "fd00:ec2::254"},
			{"FD00:EC2::254", "fd00:ec2::254"},
			{"[fd00:ec2::254]", "fd00:ec2::254"},
			{"fd00:ec2::254.", "fd00:ec2::254"},
			{"fe80::1", "fe80::1"},
			{"fe80::1%eth0", "fe80::1"},
			{"[fe80::1%25eth0]", "fe80::1"},
			{"fd12::1", "fd12::1"},
			{"abcd::1", "abcd::1"},
			{"Face:b00c::1", "face:b00c::1"},
			{"2001:db8::1", "2001:db8::1"},
		} {
			byHost := Flow{Host: tc.host, Dst: netip.AddrPortFrom(netip.Addr{}, 443)}
			byAddr := Flow{Dst: netip.AddrPortFrom(netip.MustParseAddr(tc.addr), 443)}
			want := p.Decide(&byAddr)
			if got := p.Decide(&byHost); got != want {
				t.Errorf("%q: Decide(host %q) = %+v, want %+v (as Decide(dst %s))", src, tc.host, got, want, tc.addr)
			}
			if got := p.walk(&byHost); got != want {
				t.Errorf("%q: walk(host %q) = %+v, want %+v (as Decide(dst %s))", src, tc.host, got, want, tc.addr)
			}
		}
	}
	// Names that start with a hex letter but hold no colon stay names.
	p := mustParse(t, "default: proxy\nrules:\n  - domain: 'face.example,fd00.example,abc'\n    action: deny\n", LoadOptions{})
	for _, h := range []string{"face.example", "FD00.example", "abc"} {
		if d := p.Decide(&Flow{Host: h}); d.Exit != ExitDeny || d.Dimension != DimDomain {
			t.Errorf("Decide(host %q) = %s by %s, want deny by domain", h, d.Exit, d.Dimension)
		}
	}
}
