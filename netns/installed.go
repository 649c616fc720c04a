package netns

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// Installed reads the capture program installed in nsPath back as the Capture that
// produced it (kernel decisions, if any, set aside), so that a component that did not
// install it — the relay daemon adding kernel decisions to a table kl-cni wrote — can
// rebuild the same capture without knowing the plugin's configuration. It fails when
// the table is missing or is not exactly a capture program. When kernel decisions
// leave no flow to redirect, the table no longer says the relay's port: RedirectPort is
// then 0 and the caller fills it in (it is the relay's own listener port).
func Installed(nsPath string) (Capture, error) { return InstalledWith(defaultBackend, nsPath) }

// InstalledWith is Installed on a given backend.
func InstalledWith(b Backend, nsPath string) (Capture, error) {
	if nsPath == "" {
		return Capture{}, fmt.Errorf("read nftables table inet %s: %w", TableName, errNoPath)
	}
	got, err := b.Get(nsPath, TableName)
	if err != nil {
		return Capture{}, fmt.Errorf("read nftables table inet %s in %s: %w", TableName, nsPath, err)
	}
	c, err := captureOf(got)
	if err != nil {
		return Capture{}, fmt.Errorf("nftables table inet %s in %s: %w", TableName, nsPath, err)
	}
	plain := c.withoutDecisions(got)
	want := c.Program()
	d := Diff(want, plain)
	if len(d) == 0 {
		return c, nil
	}
	// A program an earlier kl wrote is still a capture: an upgraded daemon takes over the
	// pods the previous version set up (the table it writes then is today's program).
	for _, older := range olderPrograms(want) {
		if len(Diff(older, plain)) == 0 {
			return c, nil
		}
	}
	return Capture{}, &VerifyError{NS: nsPath, Diffs: d}
}

// olderPrograms are the forms of program t that earlier kl versions wrote, newest first:
// before the filter chain's blocks applied to new flows only, and also before the live
// check existed.
func olderPrograms(t *Table) []*Table {
	allFlows := withoutNewOnly(t)
	return []*Table{allFlows, withoutLive(allFlows)}
}

// withoutNewOnly is t without the filter chain's rules that keep its blocks to new flows
// (MatchCTNotNew's return and the QUIC block's live check).
func withoutNewOnly(t *Table) *Table {
	out := &Table{Name: t.Name, Sets: t.Sets}
	for _, ch := range t.Chains {
		if ch.Name == FilterChain {
			ch.Rules = slices.DeleteFunc(slices.Clone(ch.Rules), func(r Rule) bool {
				return slices.Contains(r.Match, Match(MatchCTNotNew{})) || slices.Contains(r.Match, Match(MatchDportNotInSet{ProtoUDP, LiveSet}))
			})
		}
		out.Chains = append(out.Chains, ch)
	}
	return out
}

// InstalledMarks returns the conntrack marks the kernel decisions of the table installed
// in nsPath set (the marking rules' and the mark maps' values, each once, in table
// order): none for a plain capture or when the netns has no table. A process that takes
// over a table another one installed (kl-relayd after a restart) learns from them which
// marks that table gives the flows it decides, before it has installed its own.
func InstalledMarks(nsPath string) ([]uint32, error) {
	return InstalledMarksWith(defaultBackend, nsPath)
}

// InstalledMarksWith is InstalledMarks on a given backend.
func InstalledMarksWith(b Backend, nsPath string) ([]uint32, error) {
	if nsPath == "" {
		return nil, fmt.Errorf("read nftables table inet %s: %w", TableName, errNoPath)
	}
	got, err := b.Get(nsPath, TableName)
	if errors.Is(err, ErrNoTable) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read nftables table inet %s in %s: %w", TableName, nsPath, err)
	}
	var marks []uint32
	add := func(m uint32) {
		if m != 0 && !slices.Contains(marks, m) {
			marks = append(marks, m)
		}
	}
	for _, ch := range got.Chains {
		for _, r := range ch.Rules {
			if sm, ok := r.Action.(SetMark); ok {
				add(sm.Mark)
			}
		}
	}
	for _, s := range got.Sets {
		if s.Map {
			for _, m := range s.Marks {
				add(m)
			}
		}
	}
	return marks, nil
}

// withoutLive is t without the live set and its rule: the program as kl wrote it before
// it had them. Reading such a table back still gives its capture, so that an upgraded
// daemon can add kernel decisions to a pod set up by the previous version (the table it
// then writes has the live check).
func withoutLive(t *Table) *Table {
	out := &Table{Name: t.Name}
	out.Sets = slices.DeleteFunc(slices.Clone(t.Sets), func(s Set) bool { return s.Name == LiveSet })
	for _, ch := range t.Chains {
		ch.Rules = slices.DeleteFunc(slices.Clone(ch.Rules), func(r Rule) bool { return r.String() == liveRule.String() })
		out.Chains = append(out.Chains, ch)
	}
	return out
}

// captureOf infers the Capture fields from a table; the caller checks that the inferred
// capture renders to the same table.
func captureOf(t *Table) (Capture, error) {
	var c Capture
	var nat, filter *Chain
	for i := range t.Chains {
		switch t.Chains[i].Name {
		case NATChain:
			nat = &t.Chains[i]
		case FilterChain:
			filter = &t.Chains[i]
		}
	}
	if nat == nil || len(nat.Rules) == 0 {
		return c, errors.New("no nat chain: not a capture program")
	}
	if m, ok := firstMatch(nat.Rules[0]).(MatchMark); ok {
		c.Mark = m.Mark
	}
	c.IPv6 = true
	for _, r := range nat.Rules {
		switch a := r.Action.(type) {
		case Redirect:
			c.RedirectPort = a.Port
		}
		if !isDecisionRule(r) {
			if _, ok := r.Action.(Redirect); ok {
				for _, m := range r.Match {
					if f, ok := m.(MatchNFProto); ok && f.Family == 4 {
						c.IPv6 = false
					}
				}
			}
		}
	}
	if filter != nil {
		for _, r := range filter.Rules {
			if m, ok := firstMatch(r).(MatchDport); ok && m.Proto == ProtoUDP && m.Port == 443 {
				c.RejectQUIC = true
			}
			if m, ok := firstMatch(r).(MatchNFProto); ok && m.Family == 6 {
				c.IPv6 = false
			}
		}
	}
	for _, s := range t.Sets {
		switch s.Name {
		case ExcludeV4Set, ExcludeV6Set:
			for _, r := range s.Addrs {
				c.ExcludeCIDRs = append(c.ExcludeCIDRs, rangePrefixes(r)...)
			}
		case ExcludePortSet:
			c.ExcludePorts = append(c.ExcludePorts, s.Ports...)
		}
	}
	return c, nil
}

func firstMatch(r Rule) Match {
	if len(r.Match) == 0 {
		return nil
	}
	return r.Match[0]
}

// rangePrefixes splits an inclusive range into the fewest prefixes that cover it.
func rangePrefixes(r AddrRange) []netip.Prefix {
	var out []netip.Prefix
	from := r.From
	for from.IsValid() && from.Compare(r.To) <= 0 {
		bits := from.BitLen()
		// The shortest prefix starting at from that stays within the range.
		best := netip.PrefixFrom(from, bits)
		for l := bits - 1; l >= 0; l-- {
			p := netip.PrefixFrom(from, l)
			if p.Masked().Addr() != from || lastAddr(p).Compare(r.To) > 0 {
				break
			}
			best = p
		}
		out = append(out, best)
		from = lastAddr(best).Next()
	}
	return out
}
