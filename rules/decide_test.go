package rules

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func mustParse(t *testing.T, src string, o LoadOptions) *Policy {
	t.Helper()
	p, err := Parse("test.yaml", []byte(src), o)
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, src)
	}
	return p
}

type decideCase struct {
	name      string
	flow      Flow
	exit      string
	rule      int
	dimension Dimension
}

func runDecide(t *testing.T, p *Policy, tests []decideCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := p.Decide(&tt.flow)
			if d.Exit != tt.exit || d.Rule != tt.rule || d.Dimension != tt.dimension {
				t.Errorf("Decide(%+v) = %s rule %d (%s), want %s rule %d (%s)", tt.flow, d.Exit, d.Rule, d.Dimension, tt.exit, tt.rule, tt.dimension)
			}
			if w := p.walk(&tt.flow); w != d {
				t.Errorf("walk = %+v, Decide = %+v", w, d)
			}
			if want := tierPriority(tt.dimension); d.Priority != want && tt.dimension != DimPattern {
				t.Errorf("priority = %d, want %d", d.Priority, want)
			}
		})
	}
}

func TestDecideDimensions(t *testing.T) {
	p := mustParse(t, `
default: deny
rules:
  - port: "443,8000-8999"       # 1
    action: proxy
  - cidr: "10.0.0.0/8, 2001:db8::/32, 192.0.2.7"   # 2
    action: direct
  - domain: "*.Example.COM., api.example.org"  # 3
    action: proxy
  - process: "npm | pip|gradle*" # 4
    action: proxy
  - image: "registry.example/acme/*"  # 5
    action: proxy
  - image: "nginx"              # 6
    action: client
  - label: kl.route=proxy       # 7
    action: proxy
  - label: kl.special           # 8
    action: block
  - domain: "example.com"       # 9
    action: cluster
  - cidr: "10.1.0.0/16"         # 10: never wins over rule 2
    action: deny
  - domain: "a?c.example.net, x-*.dev.example.net, *"  # 11
    exit: egress-b
`, LoadOptions{})
	runDecide(t, p, []decideCase{
		{"nothing known", Flow{}, "deny", 0, DimDefault},
		{"port hit", Flow{Dst: ap("198.51.100.1:443")}, "proxy", 1, DimPort},
		{"port range low", Flow{Dst: ap("198.51.100.1:8000")}, "proxy", 1, DimPort},
		{"port range high", Flow{Dst: ap("198.51.100.1:8999")}, "proxy", 1, DimPort},
		{"port outside", Flow{Dst: ap("198.51.100.1:9000")}, "deny", 0, DimDefault},
		{"cidr beats port", Flow{Dst: ap("10.2.3.4:443")}, "direct", 2, DimCIDR},
		{"cidr lowest index not longest prefix", Flow{Dst: ap("10.1.2.3:80")}, "direct", 2, DimCIDR},
		{"cidr v6", Flow{Dst: ap("[2001:db8::1]:80")}, "direct", 2, DimCIDR},
		{"cidr bare address", Flow{Dst: ap("192.0.2.7:80")}, "direct", 2, DimCIDR},
		{"cidr bare address neighbour", Flow{Dst: ap("192.0.2.8:80")}, "deny", 0, DimDefault},
		{"cidr v4-mapped v6 dst", Flow{Dst: ap("[::ffff:10.9.9.9]:80")}, "direct", 2, DimCIDR},
		{"domain suffix", Flow{Host: "a.example.com", Dst: ap("10.0.0.1:443")}, "proxy", 3, DimDomain},
		{"domain suffix deep", Flow{Host: "x.y.example.com"}, "proxy", 3, DimDomain},
		{"domain case and trailing dot", Flow{Host: "WWW.Example.Com."}, "proxy", 3, DimDomain},
		{"domain apex not matched by *.", Flow{Host: "example.com"}, "direct", 9, DimDomain},
		{"domain exact", Flow{Host: "api.example.org"}, "proxy", 3, DimDomain},
		{"domain whole value", Flow{Host: "api.example.org.evil"}, "egress-b", 11, DimDomain},
		{"domain question mark", Flow{Host: "abc.example.net"}, "egress-b", 11, DimDomain},
		{"domain bucketed glob", Flow{Host: "x-1.dev.example.net"}, "egress-b", 11, DimDomain},
		{"domain IP literal host is an address", Flow{Host: "10.3.3.3"}, "direct", 2, DimCIDR},
		{"domain bracketed v6 literal", Flow{Host: "[2001:db8::5]"}, "direct", 2, DimCIDR},
		{"process comm", Flow{Process: Process{Known: true, Comm: "npm"}, Host: "a.example.com"}, "proxy", 4, DimProcess},
		{"process exe", Flow{Process: Process{Known: true, Comm: "node", Exe: "pip"}}, "proxy", 4, DimProcess},
		{"process argv0 glob", Flow{Process: Process{Known: true, Comm: "java", Argv0: "gradlew"}}, "proxy", 4, DimProcess},
		{"process whole value", Flow{Process: Process{Known: true, Comm: "pip3"}}, "deny", 0, DimDefault},
		{"process unknown never matches", Flow{Process: Process{Comm: "npm"}}, "deny", 0, DimDefault},
		{"image glob", Flow{Image: "registry.example/acme/builder:1", Process: Process{Known: true, Comm: "npm"}}, "proxy", 5, DimImage},
		{"image glob crosses slash", Flow{Image: "registry.example/acme/a/b/c"}, "proxy", 5, DimImage},
		{"image short name", Flow{Image: "nginx"}, "client", 6, DimImage},
		{"image normalized", Flow{Image: "docker.io/library/nginx:latest"}, "client", 6, DimImage},
		{"image normalized partial", Flow{Image: "docker.io/nginx"}, "client", 6, DimImage},
		{"image other tag", Flow{Image: "nginx:1.25"}, "deny", 0, DimDefault},
		{"label exact", Flow{Labels: map[string]string{"kl.route": "proxy"}, Image: "nginx"}, "proxy", 7, DimLabel},
		{"label other value", Flow{Labels: map[string]string{"kl.route": "proxy-b"}}, "deny", 0, DimDefault},
		{"label presence", Flow{Labels: map[string]string{"kl.special": ""}}, "deny", 8, DimLabel},
		{"label lowest index", Flow{Labels: map[string]string{"kl.special": "x", "kl.route": "proxy"}}, "proxy", 7, DimLabel},
		{"guard beats label", Flow{Labels: map[string]string{"kl.route": "proxy"}, Dst: ap("169.254.169.254:80")}, "direct", 0, DimGuard},
		{"guard by host literal", Flow{Host: "169.254.169.254"}, "direct", 0, DimGuard},
		{"ipv6 guard beats label", Flow{Labels: map[string]string{"kl.route": "proxy"}, Dst: ap("[fd00:ec2::254]:80")}, "direct", 0, DimGuard},
		{"ipv6 guard by host literal", Flow{Host: "[fd00:ec2::254]"}, "direct", 0, DimGuard},
		{"ipv6 guard is one address", Flow{Labels: map[string]string{"kl.route": "proxy"}, Dst: ap("[fd00:ec2::253]:80")}, "proxy", 7, DimLabel},
		{"domain star needs a host", Flow{Dst: ap("198.51.100.1:80")}, "deny", 0, DimDefault},
		{"domain star", Flow{Host: "anything.test"}, "egress-b", 11, DimDomain},
	})
}

func TestDecidePattern(t *testing.T) {
	p := mustParse(t, `
rules:
  - pattern: "*.corp.example"    # 1
    route: client
  - pattern: "10.0.0.0/8"        # 2
    route: cluster
  - pattern: "api.example.com:443"  # 3
    route: deny
  - pattern: "[2001:db8::/32]:8000-8999"  # 4
    route: block
  - pattern: "2001:db8::1"       # 5
    route: proxy
  - pattern: "*:22"              # 6
    route: deny
  - pattern: "*"                 # 7
    route: proxy
`, LoadOptions{})
	runDecide(t, p, []decideCase{
		{"nothing known", Flow{}, "direct", 0, DimDefault},
		{"host glob", Flow{Host: "git.corp.example", Dst: ap("10.0.0.1:22")}, "client", 1, DimPattern},
		{"host glob not apex", Flow{Host: "corp.example"}, "proxy", 7, DimPattern},
		{"cidr", Flow{Dst: ap("10.1.1.1:22")}, "direct", 2, DimPattern},
		{"host and port", Flow{Host: "api.example.com", Dst: ap("192.0.2.1:443")}, "deny", 3, DimPattern},
		{"host wrong port", Flow{Host: "api.example.com", Dst: ap("192.0.2.1:80")}, "proxy", 7, DimPattern},
		{"v6 prefix port range", Flow{Dst: ap("[2001:db8::1]:8080")}, "deny", 4, DimPattern},
		{"v6 bare address", Flow{Dst: ap("[2001:db8::1]:80")}, "proxy", 5, DimPattern},
		{"any host port", Flow{Dst: ap("198.51.100.1:22")}, "deny", 6, DimPattern},
		{"any", Flow{Dst: ap("198.51.100.1:80")}, "proxy", 7, DimPattern},
		{"guard", Flow{Dst: ap("169.254.169.254:80")}, "direct", 0, DimGuard},
		{"ipv6 guard", Flow{Dst: ap("[fd00:ec2::254]:80")}, "direct", 0, DimGuard},
	})
}

func TestDecideDefaults(t *testing.T) {
	for _, tt := range []struct{ src, want string }{
		{"default: proxy\n", "proxy"},
		{"default: cluster\n", "direct"},
		{"default: block\n", "deny"},
		{"mode: proxy\n", "direct"},
		{"rules: []\n", "direct"},
	} {
		p := mustParse(t, tt.src, LoadOptions{})
		if d := p.Decide(&Flow{Host: "x.test"}); d.Exit != tt.want || d.Dimension != DimDefault || d.Priority != PriorityDefault {
			t.Errorf("%q: Decide = %+v, want default %s", tt.src, d, tt.want)
		}
	}
}

func TestDecideNoAllocs(t *testing.T) {
	srcs := map[string]string{
		"dimension": `
default: proxy
rules:
  - label: a=b
    action: direct
  - image: "registry.example/x/*"
    action: direct
  - image: nginx
    action: direct
  - process: "npm|g*"
    action: direct
  - domain: "*.example.com,x-*.example.net,*z"
    action: direct
  - cidr: "10.0.0.0/8,2001:db8::/32"
    action: direct
  - port: "443,8000-8100"
    action: direct
`,
		"pattern": `
rules:
  - pattern: "*.corp.example:443"
    route: client
  - pattern: "10.0.0.0/8"
    route: deny
`,
	}
	flows := []Flow{
		{Labels: map[string]string{"a": "b", "c": "d"}},
		{Image: "nginx:1"},
		{Image: "a-very-long/image/" + string(make([]byte, 100))},
		{Process: Process{Known: true, Comm: "gcc", Exe: "x", Argv0: "y"}},
		{Host: "WWW.EXAMPLE.COM.", Dst: ap("192.0.2.1:443")},
		{Host: "q.corp.example", Dst: ap("192.0.2.1:443")},
		{Host: "10.1.2.3"},
		{Dst: ap("[2001:db8::1]:8050")},
		{Dst: ap("169.254.169.254:80")},
	}
	for name, src := range srcs {
		p := mustParse(t, src, LoadOptions{})
		for i := range flows {
			f := &flows[i]
			if n := testing.AllocsPerRun(100, func() { p.Decide(f) }); n != 0 {
				t.Errorf("%s: Decide(%+v) allocates %v times per run, want 0", name, *f, n)
			}
		}
	}
}

// TestCIDRBlockBitmap checks the /16-block shortcut of the CIDR index against the walk
// for prefixes shorter than, equal to and longer than /16, at and around their edges.
func TestCIDRBlockBitmap(t *testing.T) {
	// Padded with many /32s in 10/8, the bitmap's blocks shrink from /12 to /20.
	for _, pad := range []int{0, 9_000} {
		var b strings.Builder
		for k := 0; k < pad; k++ {
			fmt.Fprintf(&b, "  - cidr: \"10.%d.%d.1/32\"\n    action: proxy\n", k>>8&255, k&255)
		}
		t.Run(fmt.Sprint("pad=", pad), func(t *testing.T) { testCIDRBlocks(t, b.String()) })
	}
}

func testCIDRBlocks(t *testing.T, pad string) {
	p := mustParse(t, `default: deny
rules:
  - cidr: "172.16.0.0/12"
    action: proxy
  - cidr: "100.64.0.0/15"
    action: direct
  - cidr: "198.18.0.0/16"
    action: proxy
  - cidr: "203.0.113.128/25"
    action: direct
  - cidr: "0.0.0.0/1"
    action: deny
`+pad, LoadOptions{})
	addrs := []string{
		"172.15.255.255", "172.16.0.0", "172.31.255.255", "172.32.0.0",
		"100.63.255.255", "100.64.0.1", "100.65.255.255", "100.66.0.0",
		"198.17.255.255", "198.18.0.0", "198.18.255.255", "198.19.0.0",
		"203.0.113.127", "203.0.113.128", "203.0.113.255", "203.0.114.0",
		"127.255.255.255", "128.0.0.0", "1.2.3.4", "255.255.255.255",
	}
	hits := 0
	for _, a := range addrs {
		f := Flow{Dst: ap(a + ":80")}
		d := p.Decide(&f)
		if w := p.walk(&f); d != w {
			t.Errorf("%s: Decide = %+v, walk = %+v", a, d, w)
		}
		if d.Dimension == DimCIDR {
			hits++
		}
	}
	if hits < 10 || hits == len(addrs) {
		t.Errorf("%d of %d addresses hit a cidr rule; the cases do not cover both sides", hits, len(addrs))
	}
}

// TestDecideManyOutcomes covers a file with more distinct (exit, note, dimension)
// outcomes than a byte can number: every rule still decides with its own note.
func TestDecideManyOutcomes(t *testing.T) {
	for _, n := range []int{200, 300} {
		var b strings.Builder
		b.WriteString("default: direct\nrules:\n")
		for i := 1; i <= n; i++ {
			fmt.Fprintf(&b, "  - port: %d\n    action: proxy\n    note: rule %d\n", 1000+i, i)
		}
		p, err := Parse("many", []byte(b.String()), LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i <= n; i++ {
			f := Flow{Dst: netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), uint16(1000+i))}
			d := p.Decide(&f)
			if d.Rule != i || d.Note != fmt.Sprintf("rule %d", i) || d.Exit != ExitProxy || d != p.walk(&f) {
				t.Fatalf("%d rules, port %d: %+v (walk %+v)", n, 1000+i, d, p.walk(&f))
			}
		}
	}
}
