package netns

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
)

// TableName is the one nftables table kl owns in a pod netns (family inet).
const TableName = "kl"

// Chain and set names of the capture program.
const (
	NATChain       = "nat_output"
	FilterChain    = "filter_output"
	ExcludeV4Set   = "exclude_v4"
	ExcludeV6Set   = "exclude_v6"
	ExcludePortSet = "exclude_ports"
	LiveSet        = "live"
)

// Chain priorities: the nat chain runs where dstnat runs, the filter chain at filter.
const (
	NATPriority    = -100
	FilterPriority = 0
)

// Capture is the pod's capture program, the one "inet kl" table of its netns.
//
// What it does, for packets the pod sends (hook output):
//   - exempt (never redirected or rejected): sockets marked Mark (the relay's own dials),
//     anything leaving through lo, 127.0.0.0/8, ::1, 169.254.0.0/16 (link-local and cloud
//     metadata), fe80::/10, fd00:ec2::254 (the IPv6 cloud metadata address: Metadata),
//     ExcludeCIDRs, and destination ports in ExcludePorts (TCP and UDP);
//   - other IPv4 TCP (and IPv6 TCP when IPv6) is redirected to RedirectPort on the pod's
//     loopback, where the relay listens. When the relay is not listening the redirected SYN
//     gets a reset: capture fails closed;
//   - when IPv6 is false, IPv6 TCP that would have been captured is reset (connect fails
//     at once with ECONNREFUSED) rather than let out uncaptured; dual-stack clients fall
//     back to IPv4, which is captured;
//   - when RejectQUIC, UDP to port 443 is rejected (the send fails at once with EPERM, or
//     ECONNREFUSED from the ICMP answer) so clients fall back to TCP, which is captured.
//     Other UDP (DNS included) is neither captured nor blocked. Both blocks apply to new
//     flows only (a packet that starts a connection): the replies of the pod's own
//     servers and flows already established are never rejected.
//
// A new TCP flow that arrives while a new table is being committed, before every set of
// the table is usable, is dropped (its SYN is retransmitted a second later and decided by
// the complete table): see liveRule; so is a new UDP/443 flow to an excluded destination.
//
// Both reject rules count what they reject. Exemptions come first in both chains, so what
// is not captured is exactly what is not rejected. The mark must match exactly (the relay
// sets SO_MARK to Mark). Capture holds against unprivileged pods: a process with
// CAP_NET_ADMIN in the pod netns can set the mark itself or delete the table (Verify, run
// by CNI CHECK, notices the latter).
type Capture struct {
	RedirectPort uint16
	Mark         uint32
	IPv6         bool
	RejectQUIC   bool
	ExcludeCIDRs []netip.Prefix
	ExcludePorts []uint16
}

// Validate checks the configuration; each error names the field and, for lists, the index.
func (c Capture) Validate() error {
	var errs []error
	if c.RedirectPort == 0 {
		errs = append(errs, errors.New("capture: RedirectPort must not be 0"))
	}
	if c.Mark == 0 {
		errs = append(errs, errors.New("capture: Mark must not be 0 (the relay's sockets would be captured again)"))
	}
	for i, p := range c.ExcludeCIDRs {
		switch {
		case !p.IsValid():
			errs = append(errs, fmt.Errorf("capture: ExcludeCIDRs[%d]: invalid prefix", i))
		case p.Addr().Is4In6():
			errs = append(errs, fmt.Errorf("capture: ExcludeCIDRs[%d] %s: IPv4-mapped IPv6 prefix; write the IPv4 prefix", i, p))
		case p.Addr().Zone() != "":
			errs = append(errs, fmt.Errorf("capture: ExcludeCIDRs[%d] %s: zoned address", i, p))
		case p.Bits() == 0:
			errs = append(errs, fmt.Errorf("capture: ExcludeCIDRs[%d] %s: excluding a whole family turns capture off; use the pod's mode instead", i, p))
		case p.Masked() != p:
			errs = append(errs, fmt.Errorf("capture: ExcludeCIDRs[%d] %s: host bits set (did you mean %s?)", i, p, p.Masked()))
		}
	}
	for i, p := range c.ExcludePorts {
		if p == 0 {
			errs = append(errs, fmt.Errorf("capture: ExcludePorts[%d]: port 0", i))
		}
	}
	return errors.Join(errs...)
}

// Render returns the canonical text of the program (the layout of `nft list table inet kl`)
// for golden files and logs. It does not validate: an invalid config renders what it would
// install, which Install refuses.
func (c Capture) Render() string { return c.Program().Render() }

// Program builds the table Install applies.
func (c Capture) Program() *Table { return c.build(extension{}) }

// extension is what a later stage adds to the program: its own sets (accept sets, verdict
// maps) after the exclusion sets, and decision rules in the nat chain after the exemptions
// that no policy may override and before the catch-all redirect. Kernel-decided flows
// (issue 9) plug in here; today nothing does.
type extension struct {
	sets      []Set
	decisions []Rule
	guard     uint32 // not 0: TCP to Metadata gets this conntrack mark, in the nat chain only, just before each metadata exemption
	final     *Rule  // replaces the catch-all redirect (a pod whose every flow is decided)
}

// build lays the nat chain out in three parts: exemptions, decisions, redirect.
func (c Capture) build(ext extension) *Table {
	t := &Table{Name: TableName}
	var v4, v6 []netip.Prefix
	for _, p := range c.ExcludeCIDRs {
		if !p.IsValid() {
			continue
		}
		if p.Addr().Is4() {
			v4 = append(v4, p.Masked())
		} else {
			v6 = append(v6, p.Masked())
		}
	}
	if len(v4) > 0 {
		t.Sets = append(t.Sets, Set{Name: ExcludeV4Set, Type: SetIPv4, Addrs: mergeRanges(v4)})
	}
	if len(v6) > 0 {
		t.Sets = append(t.Sets, Set{Name: ExcludeV6Set, Type: SetIPv6, Addrs: mergeRanges(v6)})
	}
	var ports []uint16
	for _, p := range c.ExcludePorts {
		if p != 0 {
			ports = append(ports, p)
		}
	}
	slices.Sort(ports)
	ports = slices.Compact(ports)
	if len(ports) > 0 {
		t.Sets = append(t.Sets, Set{Name: ExcludePortSet, Type: SetPort, Ports: ports})
	}

	t.Sets = append(t.Sets, ext.sets...)
	// Written last (see liveRule).
	t.Sets = append(t.Sets, Set{Name: LiveSet, Type: SetPortRange, PortRanges: []PortRange{{0, 65535}}})

	literal := c.literalExemptions()
	excluded := c.setExemptions(len(v4) > 0, len(v6) > 0, len(ports) > 0)

	nat := Chain{Name: NATChain, Type: ChainNAT, Priority: NATPriority}
	for _, r := range literal {
		if pf, ok := metadataExemption(r); ok && ext.guard != 0 {
			nat.Rules = append(nat.Rules, Rule{Match: []Match{MatchL4Proto{ProtoTCP}, MatchDaddr{pf}}, Action: SetMark{ext.guard, Return}})
		}
		nat.Rules = append(nat.Rules, r)
	}
	nat.Rules = append(nat.Rules, liveRule)
	nat.Rules = append(nat.Rules, excluded...)
	nat.Rules = append(nat.Rules, ext.decisions...)
	if ext.final != nil {
		nat.Rules = append(nat.Rules, *ext.final)
	} else {
		nat.Rules = append(nat.Rules, c.redirect())
	}
	t.Chains = append(t.Chains, nat)

	if c.RejectQUIC || !c.IPv6 {
		filter := Chain{Name: FilterChain, Type: ChainFilter, Priority: FilterPriority}
		// This chain sees every packet the pod sends, and its blocks below can match no
		// IPv4 TCP packet (no TCP at all when IPv6 is relayed too): those return at the
		// first rule instead of walking every exemption, with the same outcome.
		if c.IPv6 {
			filter.Rules = append(filter.Rules, Rule{Match: []Match{MatchL4Proto{ProtoTCP}}, Action: Return})
		} else {
			filter.Rules = append(filter.Rules, Rule{Match: []Match{MatchNFProto{4}, MatchL4Proto{ProtoTCP}}, Action: Return})
		}
		// The blocks below are for new flows only. The chain sees every packet the pod
		// sends, replies of its own servers and established flows too: without this an
		// IPv6 server in a pod whose IPv6 is not captured would have its SYN-ACKs reset,
		// and, while a reinstall commits (liveRule), a flow to an excluded destination
		// would find the exclusion sets empty and be cut.
		filter.Rules = append(filter.Rules, Rule{Match: []Match{MatchCTNotNew{}}, Action: Return})
		filter.Rules = append(filter.Rules, literal...)
		if c.RejectQUIC && len(excluded) > 0 {
			// liveRule for the QUIC block: a new UDP/443 flow to an excluded destination
			// is dropped, not refused, while the exclusion sets may be empty (QUIC sends
			// again). New TCP never gets here in that moment: the nat chain, earlier, drops it.
			filter.Rules = append(filter.Rules, Rule{Match: []Match{MatchDport{ProtoUDP, 443}, MatchDportNotInSet{ProtoUDP, LiveSet}}, Action: Drop})
		}
		filter.Rules = append(filter.Rules, excluded...)
		if c.RejectQUIC {
			filter.Rules = append(filter.Rules, Rule{
				Match:  []Match{MatchDport{ProtoUDP, 443}, Counter{}},
				Action: Reject{RejectPortUnreachable},
			})
		}
		if !c.IPv6 {
			filter.Rules = append(filter.Rules, Rule{
				// The counter also keeps nft from hiding "meta nfproto ipv6" when it lists
				// the rule (it drops it as a dependency of the reject otherwise).
				Match:  []Match{MatchNFProto{6}, MatchL4Proto{ProtoTCP}, Counter{}},
				Action: Reject{RejectTCPReset},
			})
		}
		t.Chains = append(t.Chains, filter)
	}
	return t
}

// redirect is the catch-all rule that sends captured TCP to the relay.
func (c Capture) redirect() Rule {
	r := Rule{Match: []Match{MatchL4Proto{ProtoTCP}}, Action: Redirect{c.RedirectPort}}
	if !c.IPv6 {
		r.Match = append([]Match{MatchNFProto{4}}, r.Match...)
	}
	return r
}

// Metadata are the cloud instance metadata destinations, one per family: 169.254.0.0/16
// (IPv4 link-local, where 169.254.169.254 serves metadata) and fd00:ec2::254 (AWS's IPv6
// metadata address). They are exempt from capture like loopback (SPEC §4.4, the metadata
// guard), whatever the pod's IPv6 setting: an IPv6 metadata flow goes direct, as an IPv4
// one does, rather than to the relay or a reset.
var Metadata = []netip.Prefix{netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("fd00:ec2::254/128")}

// metadataExemption says whether r is the exemption of one of the Metadata prefixes, and
// which.
func metadataExemption(r Rule) (netip.Prefix, bool) {
	if len(r.Match) != 1 || r.Action != Return {
		return netip.Prefix{}, false
	}
	m, ok := r.Match[0].(MatchDaddr)
	if !ok || !slices.Contains(Metadata, m.Prefix) {
		return netip.Prefix{}, false
	}
	return m.Prefix, true
}

// liveRule drops a new TCP flow that the table's sets cannot decide yet. A table is
// replaced in one transaction, yet while the kernel commits it there is a moment (tens of
// microseconds, seen on 6.18) when the new rules are live and the new table's interval
// sets still match nothing: `ip daddr @relay_v4 redirect` then lets the flow fall through
// to a later rule, such as a kernel accept that neither the old nor the new table would
// have given it. Measured before this rule: about one flow in 2000 to a /24 that both
// tables relayed left direct during back-to-back reloads (tests/fastpath
// TestReloadKeepsRelayedFlowsRelayed). Literal matches and hash sets did not show it.
//
// The live set is an interval set holding every port, so it matches nothing in that
// same moment; its rule comes before any rule that looks up a set, the operator's
// exclusions included, so a flow that passes it finds every set of the table complete.
// (It is written last, so that were the sets to become usable one by one, it would be
// the last; with it first the tests saw no difference.) A dropped SYN is retransmitted a
// second later and decided by the whole new table: a reload may delay a connection, but
// never decides one with a half-installed table.
var liveRule = Rule{Match: []Match{MatchDportNotInSet{ProtoTCP, LiveSet}}, Action: Drop}

// literalExemptions are the exemptions that need no set; setExemptions the ones that look
// up the operator's exclusions. Both chains have them, in this order, so that what is not
// captured is exactly what is not rejected.
func (c Capture) literalExemptions() []Rule {
	return []Rule{
		exemption(MatchMark{c.Mark}),
		exemption(MatchOif{Index: 1, Name: "lo"}),
		exemption(MatchDaddr{netip.MustParsePrefix("127.0.0.0/8")}),
		exemption(MatchDaddr{Metadata[0]}),
		exemption(MatchDaddr{netip.MustParsePrefix("::1/128")}),
		exemption(MatchDaddr{netip.MustParsePrefix("fe80::/10")}),
		exemption(MatchDaddr{Metadata[1]}),
	}
}

func exemption(m ...Match) Rule { return Rule{Match: m, Action: Return} }

func (c Capture) setExemptions(v4set, v6set, portset bool) []Rule {
	var rules []Rule
	if v4set {
		rules = append(rules, exemption(MatchDaddrSet{4, ExcludeV4Set}))
	}
	if v6set {
		rules = append(rules, exemption(MatchDaddrSet{6, ExcludeV6Set}))
	}
	if portset {
		rules = append(rules, exemption(MatchDportSet{ExcludePortSet}))
	}
	return rules
}

// mergeRanges turns prefixes of one family into sorted, disjoint, non-adjacent inclusive
// ranges: the kernel refuses overlapping interval elements, and merging makes the set
// canonical whatever order or redundancy the config has.
func mergeRanges(ps []netip.Prefix) []AddrRange {
	rs := make([]AddrRange, 0, len(ps))
	for _, p := range ps {
		rs = append(rs, AddrRange{From: p.Masked().Addr(), To: lastAddr(p)})
	}
	slices.SortFunc(rs, func(a, b AddrRange) int { return a.From.Compare(b.From) })
	out := rs[:0]
	for _, r := range rs {
		if n := len(out); n > 0 {
			last := &out[n-1]
			next := last.To.Next()
			if r.From.Compare(last.To) <= 0 || (next.IsValid() && r.From == next) {
				if r.To.Compare(last.To) > 0 {
					last.To = r.To
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// lastAddr is the highest address of a prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr()
	b := a.AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	out, _ := netip.AddrFromSlice(b)
	return out
}
