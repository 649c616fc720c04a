package netns

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

// FuzzCapture feeds arbitrary configurations (as a CNI conflist would carry them) through
// Validate, Program and Render: nothing panics, output is deterministic, and the exclusion
// sets cover exactly the excluded prefixes.
func FuzzCapture(f *testing.F) {
	f.Add(uint16(15001), uint32(0x539), uint8(3), "10.0.0.0/8 10.96.0.0/12 fd00::/8", "22 5432 22")
	f.Add(uint16(0), uint32(0), uint8(0), "0.0.0.0/0 ::/0 bogus 1.2.3.4/33", "0 65535")
	f.Add(uint16(1), uint32(1), uint8(1), "255.255.255.255/32 255.255.255.254/32 ffff::/16", "")
	f.Fuzz(func(t *testing.T, port uint16, mark uint32, flags uint8, cidrs, ports string) {
		c := Capture{RedirectPort: port, Mark: mark, IPv6: flags&1 != 0, RejectQUIC: flags&2 != 0}
		for _, s := range strings.Fields(cidrs) {
			if p, err := netip.ParsePrefix(s); err == nil {
				c.ExcludeCIDRs = append(c.ExcludeCIDRs, p)
			}
		}
		for _, s := range strings.Fields(ports) {
			if n, err := strconv.ParseUint(s, 10, 16); err == nil {
				c.ExcludePorts = append(c.ExcludePorts, uint16(n))
			}
		}
		if err := c.Validate(); err != nil {
			if err.Error() == "" {
				t.Fatal("empty validation error")
			}
			return
		}
		text := c.Render()
		if text != c.Render() {
			t.Fatal("Render is not deterministic")
		}
		if d := Diff(c.Program(), c.Program()); len(d) != 0 {
			t.Fatalf("a program differs from itself: %v", d)
		}
		p := c.Program()
		for _, s := range p.Sets {
			if s.Type != SetIPv4 && s.Type != SetIPv6 {
				continue
			}
			var in []netip.Prefix
			for _, x := range c.ExcludeCIDRs {
				if x.Addr().Is4() == (s.Type == SetIPv4) {
					in = append(in, x)
				}
			}
			checkRanges(t, s.Addrs, in)
		}
	})
}

// checkRanges asserts that rs are sorted, disjoint and non-adjacent, contain every prefix,
// and contain nothing else: a gap in the prefixes always starts right after one of them.
func checkRanges(t *testing.T, rs []AddrRange, in []netip.Prefix) {
	t.Helper()
	inRanges := func(a netip.Addr) bool {
		for _, r := range rs {
			if r.From.Compare(a) <= 0 && a.Compare(r.To) <= 0 {
				return true
			}
		}
		return false
	}
	inPrefixes := func(a netip.Addr) bool {
		for _, p := range in {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	for i, r := range rs {
		if r.From.Compare(r.To) > 0 {
			t.Fatalf("range %d %s is reversed", i, r)
		}
		if i > 0 {
			if next := rs[i-1].To.Next(); !next.IsValid() || next.Compare(r.From) >= 0 {
				t.Fatalf("ranges %s and %s overlap or touch", rs[i-1], r)
			}
		}
		if !inPrefixes(r.From) || !inPrefixes(r.To) {
			t.Fatalf("range %s reaches outside the prefixes %v", r, in)
		}
	}
	for _, p := range in {
		first, last := p.Masked().Addr(), lastAddr(p)
		if !inRanges(first) || !inRanges(last) {
			t.Fatalf("prefix %s is not covered by %v", p, rs)
		}
		if n := last.Next(); n.IsValid() && inRanges(n) && !inPrefixes(n) {
			t.Fatalf("address %s after %s is covered by %v but excluded by nothing", n, p, rs)
		}
	}
}
