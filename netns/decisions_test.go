package netns

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// A sample of every decision shape: the guard mark, an address stage mixing marks and
// relay ranges in both families (nested prefixes, adjacent results), a port stage, an
// address-and-port entry, and a marking catch-all that replaces the redirect.
var goldenDecisions = []struct {
	name string
	c    Capture
	d    Decisions
}{
	{"decisions-mixed", goldenCaptures[0].c, Decisions{
		Guard: 0x6b010000,
		List: []Decision{
			{Prefixes: prefixes("10.1.2.0/24", "fd00::/64"), Mark: 0x6b010003},
			{Prefixes: prefixes("10.0.0.0/8", "2001:db8::/32"), Mark: 0},
			{Prefixes: prefixes("10.1.0.0/16", "192.0.2.0/24"), Mark: 0x6b010004},
			{Ports: []PortRange{{443, 443}, {8000, 8999}}, Mark: 0x6b010005},
			{Ports: []PortRange{{22, 22}, {8080, 8080}}},
			{Prefixes: prefixes("198.51.100.0/24", "fd00:1::/48"), Ports: []PortRange{{5432, 5432}}, Mark: 0x6b010006},
			{Prefixes: prefixes("203.0.113.0/24"), Ports: []PortRange{{1, 1024}, {2000, 3000}}},
			{Mark: 0x6b010007},
			{Prefixes: prefixes("10.9.0.0/16"), Mark: 0x6b010008}, // unreachable
		},
	}},
	{"decisions-relay-default-ipv4-only", goldenCaptures[3].c, Decisions{
		List: []Decision{
			{Prefixes: prefixes("0.0.0.0/1", "fd00::/8"), Mark: 0x6b020001},
			{Ports: []PortRange{{1, 65535}}, Mark: 0},
		},
	}},
}

func TestDecisionsGolden(t *testing.T) {
	for _, tc := range goldenDecisions {
		t.Run(tc.name, func(t *testing.T) {
			p, err := tc.c.ProgramWith(tc.d)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, "render-"+tc.name, p.Render())
		})
	}
}

func TestDecisionsShape(t *testing.T) {
	c := goldenCaptures[1].c
	all := Decisions{List: []Decision{{Mark: 7}}}
	p, err := c.ProgramWith(all)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(p.Render(), "redirect") {
		t.Errorf("a pod whose every flow is decided still has a redirect:\n%s", p.Render())
	}
	none, err := c.ProgramWith(Decisions{})
	if err != nil {
		t.Fatal(err)
	}
	if none.Render() != c.Render() {
		t.Errorf("no decisions changed the program:\n%s", none.Render())
	}
	bad := Decisions{List: []Decision{{Prefixes: []netip.Prefix{}}, {Ports: []PortRange{{0, 3}}}, {Prefixes: prefixes("::ffff:10.0.0.0/104")}}}
	if _, err := c.ProgramWith(bad); err == nil || !strings.Contains(err.Error(), "entry 0") || !strings.Contains(err.Error(), "entry 1") || !strings.Contains(err.Error(), "entry 2") {
		t.Errorf("ProgramWith(bad) = %v, want errors naming entries 0, 1 and 2", err)
	}
}

// Verify checks the capture underneath whatever decisions are installed (CNI CHECK does
// not know them), VerifyDecisions checks them too.
func TestVerifyWithDecisions(t *testing.T) {
	f := NewFake()
	for _, tc := range goldenDecisions {
		if err := InstallDecisionsWith(f, "/ns", tc.c, tc.d); err != nil {
			t.Fatal(err)
		}
		if err := VerifyWith(f, "/ns", tc.c); err != nil {
			t.Errorf("%s: Verify: %v", tc.name, err)
		}
		if err := VerifyDecisionsWith(f, "/ns", tc.c, tc.d); err != nil {
			t.Errorf("%s: VerifyDecisions: %v", tc.name, err)
		}
		other := tc.d
		other.List = append([]Decision{{Prefixes: prefixes("192.0.2.9/32"), Mark: 99}}, tc.d.List...)
		if err := VerifyDecisionsWith(f, "/ns", tc.c, other); err == nil {
			t.Errorf("%s: VerifyDecisions with other decisions passed", tc.name)
		}
		// A capture rule deleted by hand is still caught under decisions.
		tb := f.Tables["/ns"]
		nat := &tb.Chains[0]
		nat.Rules = nat.Rules[1:]
		if err := VerifyWith(f, "/ns", tc.c); err == nil || !strings.Contains(err.Error(), "meta mark") {
			t.Errorf("%s: Verify after deleting the mark exemption = %v", tc.name, err)
		}
	}
}

// resolveAddrs against a brute-force first match over generated nested prefixes.
func TestResolveAddrs(t *testing.T) {
	for seed := range 200 {
		r := rand.New(rand.NewPCG(uint64(seed), 1))
		var list []Decision
		for i := 0; i < 1+r.IntN(6); i++ {
			var ps []netip.Prefix
			for j := 0; j < 1+r.IntN(3); j++ {
				if r.IntN(4) == 0 {
					ps = append(ps, netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, byte(r.IntN(2))}), 8+r.IntN(9)).Masked())
					continue
				}
				a := netip.AddrFrom4([4]byte{10, byte(r.IntN(3)), byte(r.IntN(3)), byte(r.IntN(256))})
				ps = append(ps, netip.PrefixFrom(a, []int{0, 8, 16, 23, 24, 30, 32}[r.IntN(7)]).Masked())
			}
			list = append(list, Decision{Prefixes: ps, Mark: uint32(r.IntN(3))})
		}
		for _, v4 := range []bool{true, false} {
			ranges, marks := resolveAddrs(list, v4)
			for k := 1; k < len(ranges); k++ {
				if ranges[k-1].To.Compare(ranges[k].From) >= 0 {
					t.Fatalf("seed %d: ranges overlap or unsorted: %v", seed, ranges)
				}
				if ranges[k-1].To.Next() == ranges[k].From && marks[k-1] == marks[k] {
					t.Fatalf("seed %d: adjacent ranges with one mark not merged: %v %v", seed, ranges, marks)
				}
			}
			var probes []netip.Addr
			for _, e := range list {
				for _, p := range e.Prefixes {
					if p.Addr().Is4() != v4 {
						continue
					}
					lo, hi := p.Addr(), lastAddr(p)
					probes = append(probes, lo, hi, lo.Prev(), hi.Next())
				}
			}
			for _, a := range probes {
				if !a.IsValid() {
					continue
				}
				want, wantIn := uint32(0), false
				for _, e := range list {
					for _, p := range e.Prefixes {
						if p.Contains(a) {
							want, wantIn = e.Mark, true
							break
						}
					}
					if wantIn {
						break
					}
				}
				got, gotIn := uint32(0), false
				for k, rg := range ranges {
					if rg.From.Compare(a) <= 0 && a.Compare(rg.To) <= 0 {
						got, gotIn = marks[k], true
					}
				}
				if got != want || gotIn != wantIn {
					t.Fatalf("seed %d: %s: resolved (%d, %v), first match (%d, %v)\nlist %v\nranges %v %v", seed, a, got, gotIn, want, wantIn, list, ranges, marks)
				}
			}
		}
	}
}

func TestResolvePorts(t *testing.T) {
	list := []Decision{
		{Ports: []PortRange{{443, 443}}, Mark: 1},
		{Ports: []PortRange{{1, 1024}}, Mark: 2},
		{Ports: []PortRange{{1000, 2000}, {65535, 65535}}, Mark: 0},
		{Ports: []PortRange{{2001, 3000}}, Mark: 0},
	}
	rs, ms := resolvePorts(list)
	got := fmt.Sprint(rs, ms)
	want := "[1-442 443 444-1024 1025-3000 65535] [2 1 2 0 0]"
	if got != want {
		t.Errorf("resolvePorts = %s, want %s", got, want)
	}
}

func BenchmarkProgramWith10k(b *testing.B) {
	d := bigDecisions(10000)
	c := goldenCaptures[1].c
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.ProgramWith(d); err != nil {
			b.Fatal(err)
		}
	}
}

// bigDecisions is what a 10k-rule dimension-form policy compiles to: the cidr tier in
// file order (/24s, some shadowed by earlier /16s, v6 /64s), then the port tier, then
// the default.
func bigDecisions(n int) Decisions {
	var d Decisions
	var ports []Decision
	for i := 0; i < n; i++ {
		switch i % 8 {
		case 7:
			ports = append(ports, Decision{Ports: []PortRange{{uint16(1 + i%60000), uint16(1 + i%60000)}}, Mark: uint32(0x6b000000 | i)})
		case 6:
			d.List = append(d.List, Decision{Prefixes: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, byte(i >> 8), byte(i)}), 64)}, Mark: uint32(0x6b000000 | i)})
		case 5:
			d.List = append(d.List, Decision{Prefixes: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), 0, 0}), 16)}, Mark: 0})
		default:
			mark := uint32(0x6b000000 | i)
			if i%3 == 0 {
				mark = 0
			}
			d.List = append(d.List, Decision{Prefixes: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24)}, Mark: mark})
		}
	}
	d.List = append(d.List, ports...)
	d.List = append(d.List, Decision{Mark: 0x6b00ffff})
	return d
}

// Installed reads back the capture under decisions, for every golden capture.
func TestInstalled(t *testing.T) {
	f := NewFake()
	for _, tc := range goldenCaptures {
		for _, d := range []Decisions{{}, goldenDecisions[0].d, {List: []Decision{{Mark: 5}}}} {
			if err := InstallDecisionsWith(f, "/ns", tc.c, d); err != nil {
				t.Fatal(err)
			}
			got, err := InstalledWith(f, "/ns")
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if len(d.List) == 1 {
				if got.RedirectPort != 0 {
					t.Errorf("%s: a table without a redirect gave port %d", tc.name, got.RedirectPort)
				}
				got.RedirectPort = tc.c.RedirectPort
			}
			if got.Render() != tc.c.Render() {
				t.Errorf("%s: Installed renders\n%s\nwant\n%s", tc.name, got.Render(), tc.c.Render())
			}
		}
	}
	if _, err := InstalledWith(f, "/nothing"); err == nil {
		t.Error("Installed on a netns without a table passed")
	}
	// A table an earlier kl wrote (before the filter chain's blocks were for new flows
	// only; also before the live check existed) still reads as its capture; one that lost
	// only part of what came later does not.
	c := goldenCaptures[4].c
	for _, tc := range []struct {
		name string
		edit func(*Table)
		ok   bool
	}{
		{"blocks for every flow", func(t *Table) { *t = *withoutNewOnly(t) }, true},
		{"blocks for every flow, no live set or rule", func(t *Table) { *t = *withoutLive(withoutNewOnly(t)) }, true},
		{"blocks for every flow but the QUIC live check", func(t *Table) {
			for i := range t.Chains {
				t.Chains[i].Rules = slices.DeleteFunc(t.Chains[i].Rules, func(r Rule) bool { return r.String() == "ct state != new return" })
			}
		}, false},
		{"live set without its rule", func(t *Table) {
			t.Chains[0].Rules = slices.DeleteFunc(t.Chains[0].Rules, func(r Rule) bool { return r.String() == liveRule.String() })
		}, false},
		{"live rule without its set", func(t *Table) {
			t.Sets = slices.DeleteFunc(t.Sets, func(s Set) bool { return s.Name == LiveSet })
		}, false},
	} {
		if err := InstallWith(f, "/ns", c); err != nil {
			t.Fatal(err)
		}
		tc.edit(f.Tables["/ns"])
		got, err := InstalledWith(f, "/ns")
		if tc.ok && (err != nil || got.Render() != c.Render()) {
			t.Errorf("%s: Installed = %v, %v; want the capture", tc.name, got, err)
		}
		if !tc.ok && err == nil {
			t.Errorf("%s: Installed passed", tc.name)
		}
	}
}

func TestRangePrefixes(t *testing.T) {
	r := AddrRange{From: netip.MustParseAddr("10.0.0.1"), To: netip.MustParseAddr("10.0.1.0")}
	got := fmt.Sprint(rangePrefixes(r))
	want := "[10.0.0.1/32 10.0.0.2/31 10.0.0.4/30 10.0.0.8/29 10.0.0.16/28 10.0.0.32/27 10.0.0.64/26 10.0.0.128/25 10.0.1.0/32]"
	if got != want {
		t.Errorf("rangePrefixes = %s, want %s", got, want)
	}
	all := AddrRange{From: netip.MustParseAddr("::"), To: netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")}
	if got := fmt.Sprint(rangePrefixes(all)); got != "[::/0]" {
		t.Errorf("whole space = %s", got)
	}
}

// FuzzDecisions feeds arbitrary decision lists through ProgramWith: nothing panics; a
// valid list gives a program that round-trips through a backend, that Verify accepts
// under the capture, and whose mark maps and relay sets are sorted and disjoint.
func FuzzDecisions(f *testing.F) {
	f.Add("10.0.0.0/8=7 10.1.0.0/16=0 fd00::/8=9", "443=5 1-1024=0", uint8(1))
	f.Add("0.0.0.0/0=1 ::/0=0", "65535=3", uint8(0))
	f.Add("192.0.2.0/24:443=4 *=2", "", uint8(3))
	f.Fuzz(func(t *testing.T, addrs, ports string, flags uint8) {
		c := Capture{RedirectPort: 15001, Mark: 0x539, IPv6: flags&1 != 0, RejectQUIC: flags&2 != 0}
		var d Decisions
		if flags&4 != 0 {
			d.Guard = 0x6b000001
		}
		for _, f := range strings.Fields(addrs) {
			spec, mark, _ := strings.Cut(f, "=")
			m, _ := strconv.ParseUint(mark, 10, 32)
			e := Decision{Mark: uint32(m)}
			host, port, hasPort := strings.Cut(spec, ":")
			if strings.Count(spec, ":") > 1 {
				host, hasPort = spec, false
			}
			if host != "*" {
				p, err := netip.ParsePrefix(host)
				if err != nil {
					continue
				}
				e.Prefixes = []netip.Prefix{p}
			}
			if hasPort {
				if n, err := strconv.ParseUint(port, 10, 16); err == nil {
					e.Ports = []PortRange{{uint16(n), uint16(n)}}
				}
			}
			d.List = append(d.List, e)
		}
		for _, f := range strings.Fields(ports) {
			spec, mark, _ := strings.Cut(f, "=")
			m, _ := strconv.ParseUint(mark, 10, 32)
			lo, hi, isRange := strings.Cut(spec, "-")
			a, err1 := strconv.ParseUint(lo, 10, 16)
			b := a
			var err2 error
			if isRange {
				b, err2 = strconv.ParseUint(hi, 10, 16)
			}
			if err1 != nil || err2 != nil {
				continue
			}
			d.List = append(d.List, Decision{Ports: []PortRange{{uint16(a), uint16(b)}}, Mark: uint32(m)})
		}
		p, err := c.ProgramWith(d)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error")
			}
			return
		}
		for _, s := range p.Sets {
			for i := 1; i < len(s.Addrs); i++ {
				if s.Addrs[i-1].To.Compare(s.Addrs[i].From) >= 0 {
					t.Fatalf("set %s: ranges overlap: %v", s.Name, s.Addrs)
				}
			}
			for i := 1; i < len(s.PortRanges); i++ {
				if s.PortRanges[i-1].To >= s.PortRanges[i].From {
					t.Fatalf("set %s: port ranges overlap: %v", s.Name, s.PortRanges)
				}
			}
			if s.Map && len(s.Marks) != len(s.Addrs)+len(s.PortRanges) {
				t.Fatalf("map %s: %d marks for %d elements", s.Name, len(s.Marks), len(s.Addrs)+len(s.PortRanges))
			}
		}
		fk := NewFake()
		if err := InstallDecisionsWith(fk, "/ns", c, d); err != nil {
			t.Fatal(err)
		}
		if err := VerifyWith(fk, "/ns", c); err != nil {
			t.Fatalf("Verify under decisions: %v", err)
		}
		if err := VerifyDecisionsWith(fk, "/ns", c, d); err != nil {
			t.Fatalf("VerifyDecisions: %v", err)
		}
	})
}

// InstalledMarks names every mark the installed decisions can set (the guard's, the
// marking rules' and the mark maps' values), none for a plain capture or a netns without
// a table: what a new kl-relayd must not take for marks of its own tables.
func TestInstalledMarks(t *testing.T) {
	want := map[string][]uint32{
		"decisions-mixed":                   {0x6b010000, 0x6b010003, 0x6b010004, 0x6b010005, 0x6b010006, 0x6b010007},
		"decisions-relay-default-ipv4-only": {0x6b020001},
	}
	f := NewFake()
	if got, err := InstalledMarksWith(f, "/ns"); err != nil || len(got) != 0 {
		t.Errorf("InstalledMarks without a table = %#x, %v; want none, nil", got, err)
	}
	for _, tc := range goldenDecisions {
		if err := InstallDecisionsWith(f, "/ns", tc.c, tc.d); err != nil {
			t.Fatal(err)
		}
		got, err := InstalledMarksWith(f, "/ns")
		slices.Sort(got)
		if err != nil || !slices.Equal(got, want[tc.name]) {
			t.Errorf("%s: InstalledMarks = %#x, %v; want %#x", tc.name, got, err, want[tc.name])
		}
		if err := InstallWith(f, "/ns", tc.c); err != nil {
			t.Fatal(err)
		}
		if got, err := InstalledMarksWith(f, "/ns"); err != nil || len(got) != 0 {
			t.Errorf("%s: InstalledMarks of the plain capture = %#x, %v; want none", tc.name, got, err)
		}
	}
}
