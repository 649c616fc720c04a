package netns

import (
	"errors"
	"flag"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", os.Getenv("KL_UPDATE_GOLDEN") == "1", "rewrite testdata/*.golden")

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// goldenCaptures are the configurations whose programs are pinned in testdata; the
// privileged tests install the same ones and compare with what nft lists.
var goldenCaptures = []struct {
	name string
	c    Capture
}{
	{"default", Capture{RedirectPort: 15001, Mark: 0x539, IPv6: true, RejectQUIC: true}},
	{"ipv4-only", Capture{RedirectPort: 15001, Mark: 0x539, RejectQUIC: true}},
	{"no-quic", Capture{RedirectPort: 15001, Mark: 0x539, IPv6: true}},
	{"no-quic-ipv4-only", Capture{RedirectPort: 15006, Mark: 0xdead}},
	{"exclusions", Capture{
		RedirectPort: 15001, Mark: 0x539, IPv6: true, RejectQUIC: true,
		// Unordered, nested, adjacent and IPv6 entries: the sets come out merged and sorted.
		ExcludeCIDRs: prefixes("10.96.0.0/12", "10.0.0.0/8", "198.51.100.0/25", "198.51.100.128/25",
			"203.0.113.7/32", "fd00:10::/64", "fd00::/16", "240.0.0.0/4"),
		ExcludePorts: []uint16{5432, 22, 5432, 8443},
	}},
	{"exclusions-ipv4-only", Capture{
		RedirectPort: 15001, Mark: 0x539,
		ExcludeCIDRs: prefixes("192.0.2.0/24", "fd00::/8", "ffff::/16"),
		ExcludePorts: []uint16{2222},
	}},
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with KL_UPDATE_GOLDEN=1 to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from %s (KL_UPDATE_GOLDEN=1 rewrites it):\n--- got\n%s\n--- want\n%s", name, path, got, want)
	}
}

func TestRenderGolden(t *testing.T) {
	for _, tc := range goldenCaptures {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.c.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			got := tc.c.Render()
			if again := tc.c.Render(); again != got {
				t.Fatalf("Render is not deterministic:\n%s\n---\n%s", got, again)
			}
			golden(t, "render-"+tc.name, got)
		})
	}
}

func TestProgramShape(t *testing.T) {
	for _, tc := range goldenCaptures {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.c.Program()
			text := p.Render()
			nat := p.Chains[0]
			last := nat.Rules[len(nat.Rules)-1]
			if last.Action != (Redirect{tc.c.RedirectPort}) {
				t.Errorf("last nat rule = %s, want a redirect to %d", last, tc.c.RedirectPort)
			}
			if got, want := slices.Contains(last.Match, Match(MatchNFProto{4})), !tc.c.IPv6; got != want {
				t.Errorf("redirect limited to IPv4 = %v, want %v (IPv6 %v)", got, want, tc.c.IPv6)
			}
			if got, want := strings.Contains(text, "udp dport 443 counter reject\n"), tc.c.RejectQUIC; got != want {
				t.Errorf("QUIC rejected = %v, want %v", got, want)
			}
			if got, want := strings.Contains(text, "meta nfproto ipv6 meta l4proto tcp counter reject with tcp reset\n"), !tc.c.IPv6; got != want {
				t.Errorf("uncaptured IPv6 TCP rejected = %v, want %v", got, want)
			}
			if got, want := len(p.Chains) == 2, tc.c.RejectQUIC || !tc.c.IPv6; got != want {
				t.Errorf("filter chain present = %v, want %v", got, want)
			}
			// What is not captured is exactly what is not rejected: after a first rule that
			// returns the TCP packets no block can match (all TCP when IPv6 is captured, IPv4
			// TCP when it is not) and one that returns every packet but a connection's first
			// (the blocks are for new flows), the filter chain has the nat chain's exemptions,
			// its live checks aside.
			if len(p.Chains) == 2 {
				filter := p.Chains[1]
				fast := "meta l4proto tcp return"
				if !tc.c.IPv6 {
					fast = "meta nfproto ipv4 meta l4proto tcp return"
				}
				if filter.Rules[0].String() != fast {
					t.Errorf("first filter rule %s, want %s", filter.Rules[0], fast)
				}
				if got, want := filter.Rules[1].String(), "ct state != new return"; got != want {
					t.Errorf("second filter rule %s, want %s", got, want)
				}
				isLive := func(r Rule) bool { return strings.Contains(r.String(), "!= @"+LiveSet) }
				exempt := slices.DeleteFunc(slices.Clone(nat.Rules[:len(nat.Rules)-1]), isLive)
				rest := slices.DeleteFunc(slices.Clone(filter.Rules[2:]), isLive)
				n := len(exempt)
				if len(rest) < n || !slices.EqualFunc(exempt, rest[:n], func(a, b Rule) bool { return a.String() == b.String() }) {
					t.Errorf("filter chain does not go on with the nat chain's exemptions:\n%s", text)
				}
			}
			if !strings.HasPrefix(nat.Rules[0].String(), "meta mark ") {
				t.Errorf("first rule %s, want the relay mark exemption first", nat.Rules[0])
			}
			// The live check comes before the first rule that looks up a set, and its set
			// is written last (see liveRule).
			live := slices.IndexFunc(nat.Rules, func(r Rule) bool { return r.String() == liveRule.String() })
			firstSet := slices.IndexFunc(nat.Rules, func(r Rule) bool { return strings.Contains(r.String(), "@") && r.String() != liveRule.String() })
			if live < 0 || (firstSet >= 0 && firstSet < live) {
				t.Errorf("live check at nat rule %d, first set lookup at %d:\n%s", live, firstSet, text)
			}
			if last := p.Sets[len(p.Sets)-1]; last.Name != LiveSet || len(last.PortRanges) != 1 || last.PortRanges[0] != (PortRange{0, 65535}) {
				t.Errorf("last set %+v, want %s with every port", last, LiveSet)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	ok := Capture{RedirectPort: 15001, Mark: 0x539}
	tests := []struct {
		name string
		edit func(*Capture)
		want []string // substrings of the error; nil: valid
	}{
		{"valid", func(*Capture) {}, nil},
		{"no port", func(c *Capture) { c.RedirectPort = 0 }, []string{"RedirectPort"}},
		{"no mark", func(c *Capture) { c.Mark = 0 }, []string{"Mark"}},
		{"both", func(c *Capture) { c.Mark, c.RedirectPort = 0, 0 }, []string{"Mark", "RedirectPort"}},
		{"zero prefix", func(c *Capture) { c.ExcludeCIDRs = []netip.Prefix{{}} }, []string{"ExcludeCIDRs[0]", "invalid"}},
		{"host bits", func(c *Capture) { c.ExcludeCIDRs = prefixes("10.0.0.0/8", "192.0.2.1/24") }, []string{"ExcludeCIDRs[1]", "192.0.2.0/24"}},
		{"everything", func(c *Capture) { c.ExcludeCIDRs = prefixes("0.0.0.0/0") }, []string{"ExcludeCIDRs[0]", "whole family"}},
		{"mapped", func(c *Capture) { c.ExcludeCIDRs = prefixes("::ffff:10.0.0.0/104") }, []string{"ExcludeCIDRs[0]", "IPv4-mapped"}},
		{"port zero", func(c *Capture) { c.ExcludePorts = []uint16{22, 0} }, []string{"ExcludePorts[1]"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.edit(&c)
			err := c.Validate()
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want an error naming %v", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, want it to mention %q", err, w)
				}
			}
			if ierr := InstallWith(NewFake(), "/x", c); ierr == nil {
				t.Errorf("InstallWith accepted an invalid capture")
			}
		})
	}
}

func TestMergeRanges(t *testing.T) {
	tests := []struct {
		in   []string
		want string
	}{
		{[]string{"10.0.0.0/8"}, "10.0.0.0/8"},
		{[]string{"10.1.0.0/16", "10.0.0.0/8"}, "10.0.0.0/8"},
		{[]string{"10.0.0.0/9", "10.128.0.0/9"}, "10.0.0.0/8"},
		{[]string{"192.0.2.0/25", "192.0.2.128/26"}, "192.0.2.0-192.0.2.191"},
		{[]string{"198.51.100.0/24", "192.0.2.0/24"}, "192.0.2.0/24 198.51.100.0/24"},
		{[]string{"255.255.255.255/32", "255.255.255.254/32"}, "255.255.255.254/31"},
		{[]string{"fd00::/8", "fd00:1::/32", "fe00::/8"}, "fd00::-feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
		{[]string{"fc00::/8", "fd00:1::/32", "fd00::/8"}, "fc00::/7"},
		{[]string{"fd00::1/128", "fd00::3/128"}, "fd00::1 fd00::3"},
	}
	for _, tc := range tests {
		var got []string
		for _, r := range mergeRanges(prefixes(tc.in...)) {
			got = append(got, r.String())
		}
		if s := strings.Join(got, " "); s != tc.want {
			t.Errorf("mergeRanges(%v) = %s, want %s", tc.in, s, tc.want)
		}
	}
}

func TestFakeInstallVerifyRemove(t *testing.T) {
	f := NewFake()
	c := goldenCaptures[4].c
	const ns = "/var/run/netns/pod"
	if err := VerifyWith(f, ns, c); !errors.Is(err, ErrNoTable) {
		t.Fatalf("Verify before Install = %v, want ErrNoTable", err)
	}
	if err := InstallWith(f, ns, c); err != nil {
		t.Fatal(err)
	}
	if got := f.Tables[ns].Render(); got != c.Render() {
		t.Fatalf("fake recorded\n%s\nwant\n%s", got, c.Render())
	}
	if err := VerifyWith(f, ns, c); err != nil {
		t.Fatalf("Verify after Install: %v", err)
	}

	// Tamper with the recorded table the ways an operator could by hand.
	tamper := []struct {
		name string
		edit func(*Table)
		want string
	}{
		{"rule deleted", func(t *Table) { t.Chains[0].Rules = slices.Delete(t.Chains[0].Rules, 3, 4) },
			"chain nat_output is missing rule 4: ip daddr 169.254.0.0/16 return"},
		{"rule added", func(t *Table) {
			t.Chains[1].Rules = slices.Insert(t.Chains[1].Rules, 0, Rule{Action: Accept})
		}, "chain filter_output has unexpected rule 1: accept"},
		{"redirect port", func(t *Table) {
			r := &t.Chains[0].Rules[len(t.Chains[0].Rules)-1]
			r.Action = Redirect{9999}
		}, "chain nat_output has unexpected rule 12: meta l4proto tcp redirect to :9999\n" +
			"chain nat_output is missing rule 12: meta l4proto tcp redirect to :15001"},
		{"live check deleted", func(t *Table) {
			t.Chains[0].Rules = slices.DeleteFunc(t.Chains[0].Rules, func(r Rule) bool { return r.String() == liveRule.String() })
		}, "chain nat_output is missing rule 8: tcp dport != @live drop"},
		{"chain deleted", func(t *Table) { t.Chains = t.Chains[:1] }, "chain filter_output is missing"},
		{"chain moved", func(t *Table) { t.Chains[0].Priority = 0 }, "chain nat_output is type nat priority 0, want type nat priority -100"},
		{"element deleted", func(t *Table) { t.Sets[2].Ports = t.Sets[2].Ports[1:] }, "set exclude_ports is missing element 22"},
		{"element added", func(t *Table) {
			t.Sets[0].Addrs = append(t.Sets[0].Addrs, AddrRange{netip.MustParseAddr("8.8.8.8"), netip.MustParseAddr("8.8.8.8")})
		}, "set exclude_v4 has unexpected element 8.8.8.8"},
		{"set deleted", func(t *Table) { t.Sets = t.Sets[1:] }, "set exclude_v4 is missing"},
		{"extra set", func(t *Table) { t.Sets = append(t.Sets, Set{Name: "x", Type: SetPort}) }, "unexpected set x"},
	}
	for _, tc := range tamper {
		t.Run(tc.name, func(t *testing.T) {
			g := NewFake()
			if err := InstallWith(g, ns, c); err != nil {
				t.Fatal(err)
			}
			tc.edit(g.Tables[ns])
			err := VerifyWith(g, ns, c)
			var ve *VerifyError
			if !errors.As(err, &ve) {
				t.Fatalf("Verify = %v, want a *VerifyError", err)
			}
			if got := strings.Join(ve.Diffs, "\n"); got != tc.want {
				t.Errorf("Verify diffs:\n%s\nwant exactly:\n%s", got, tc.want)
			}
		})
	}

	// A different config is a difference too.
	other := c
	other.RedirectPort = 15002
	if err := VerifyWith(f, ns, other); err == nil {
		t.Errorf("Verify with another redirect port = nil")
	}
	for range 2 {
		if err := RemoveWith(f, ns); err != nil {
			t.Fatalf("Remove: %v", err)
		}
	}
	if len(f.Tables) != 0 {
		t.Errorf("tables left after Remove: %v", f.Tables)
	}
	for _, err := range []error{InstallWith(f, "", c), RemoveWith(f, ""), VerifyWith(f, "", c)} {
		if err == nil || !strings.Contains(err.Error(), "netns path is empty") {
			t.Errorf("empty netns path: %v, want a refusal", err)
		}
	}
	f.ApplyErr = errors.New("boom")
	if err := InstallWith(f, ns, c); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("Install with a failing backend = %v", err)
	}
}

// The extension point places a later stage's sets after the exclusion sets and its
// decisions between the exemptions and the redirect, in both what Render prints and what
// a backend receives.
func TestExtensionPlacement(t *testing.T) {
	c := goldenCaptures[4].c
	accept := Set{Name: "direct_v4", Type: SetIPv4, Addrs: mergeRanges(prefixes("203.0.113.0/24"))}
	decision := Rule{Match: []Match{MatchDaddrSet{4, "direct_v4"}}, Action: Accept}
	p := c.build(extension{sets: []Set{accept}, decisions: []Rule{decision}})
	if got := p.Sets[len(p.Sets)-2].Name; got != "direct_v4" {
		t.Errorf("last set but one = %s, want the extension's", got)
	}
	if got := p.Sets[len(p.Sets)-1].Name; got != LiveSet {
		t.Errorf("last set = %s, want %s", got, LiveSet)
	}
	nat := p.Chains[0].Rules
	if got := nat[len(nat)-2].String(); got != "ip daddr @direct_v4 accept" {
		t.Errorf("rule before the redirect = %q, want the decision", got)
	}
	base := c.Program()
	if len(nat) != len(base.Chains[0].Rules)+1 {
		t.Errorf("nat chain has %d rules, want %d", len(nat), len(base.Chains[0].Rules)+1)
	}
	if len(p.Chains[1].Rules) != len(base.Chains[1].Rules) {
		t.Errorf("the filter chain changed")
	}
	f := NewFake()
	if err := f.Apply("/ns", p); err != nil {
		t.Fatal(err)
	}
	if d := Diff(p, f.Tables["/ns"]); len(d) != 0 {
		t.Errorf("Diff = %v", d)
	}
	if d := Diff(base, f.Tables["/ns"]); len(d) != 2 {
		t.Errorf("Diff against the plain program = %q, want the extra set and rule", d)
	}
}

func TestHostLocal(t *testing.T) {
	tests := []struct {
		addr string
		want bool
	}{
		{"127.0.0.1", true},
		{"::1", true},
		{"169.254.169.254", true},
		{"::ffff:169.254.169.254", true},
		{"fe80::1", true},
		{"fd00:ec2::254", true},
		{"0.0.0.0", true},
		{"::", true},
		{"0.1.2.3", true},
		{"192.0.2.1", false},
		{"fd00:ec2::253", false},
		{"fd00::1", false},
		{"2001:db8::1", false},
	}
	for _, tt := range tests {
		if got := HostLocal(netip.MustParseAddr(tt.addr)); got != tt.want {
			t.Errorf("HostLocal(%s) = %v, want %v", tt.addr, got, tt.want)
		}
	}
}
