package netns

import (
	"fmt"
	"net/netip"
	"strings"
)

// Table is an nftables table of family inet as kl programs it: the data a Backend applies
// in one transaction and reads back. Capture.Program builds it; Render prints it.
type Table struct {
	Name   string
	Sets   []Set
	Chains []Chain
}

// SetType is the key type of a set.
type SetType uint8

const (
	SetIPv4      SetType = iota + 1 // ipv4_addr, flags interval
	SetIPv6                         // ipv6_addr, flags interval
	SetPort                         // inet_service
	SetPortRange                    // inet_service, flags interval
)

func (t SetType) String() string {
	switch t {
	case SetIPv4:
		return "ipv4_addr"
	case SetIPv6:
		return "ipv6_addr"
	case SetPort, SetPortRange:
		return "inet_service"
	}
	return fmt.Sprintf("settype(%d)", uint8(t))
}

// Set is a named set. Address sets hold disjoint, sorted, non-adjacent ranges (see
// mergeRanges); port sets hold sorted unique ports.
type Set struct {
	Name  string
	Type  SetType
	Addrs []AddrRange
	Ports []uint16
	// PortRanges are the elements of a SetPortRange set: sorted, disjoint ranges.
	PortRanges []PortRange
	// Map makes the set a map to conntrack marks: Marks[i] is the value of the i-th
	// element (of Addrs or PortRanges). Map ranges may be adjacent (with different marks).
	Map   bool
	Marks []uint32
}

// PortRange is an inclusive range of ports.
type PortRange struct{ From, To uint16 }

func (r PortRange) String() string {
	if r.From == r.To {
		return fmt.Sprint(r.From)
	}
	return fmt.Sprintf("%d-%d", r.From, r.To)
}

// AddrRange is an inclusive address range, one interval element of a set.
type AddrRange struct{ From, To netip.Addr }

func (r AddrRange) String() string {
	if r.From == r.To {
		return r.From.String()
	}
	if p, ok := r.prefix(); ok {
		return p.String()
	}
	return r.From.String() + "-" + r.To.String()
}

// prefix returns the range as a CIDR prefix when it is exactly one.
func (r AddrRange) prefix() (netip.Prefix, bool) {
	bits := r.From.BitLen()
	for l := 0; l <= bits; l++ {
		p := netip.PrefixFrom(r.From, l)
		if p.Masked().Addr() == r.From && lastAddr(p) == r.To {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// Chain is a base chain hooked at output with policy accept.
type Chain struct {
	Name     string
	Type     ChainType
	Priority int32
	Rules    []Rule
}

// ChainType is the nftables chain type.
type ChainType string

const (
	ChainNAT    ChainType = "nat"
	ChainFilter ChainType = "filter"
)

// Rule is a conjunction of matches followed by one action.
type Rule struct {
	Match  []Match
	Action Action
}

func (r Rule) String() string {
	var b strings.Builder
	for _, m := range r.Match {
		b.WriteString(m.String())
		b.WriteByte(' ')
	}
	b.WriteString(r.Action.String())
	return b.String()
}

// Match is one condition of a rule. The set of implementations is closed: each one has a
// kernel encoding in the nftables backend.
type Match interface {
	fmt.Stringer
	isMatch()
}

// Action is the statement that ends a rule.
type Action interface {
	fmt.Stringer
	isAction()
}

// Protocol numbers used by matches.
const (
	ProtoTCP uint8 = 6
	ProtoUDP uint8 = 17
)

func protoName(p uint8) string {
	switch p {
	case ProtoTCP:
		return "tcp"
	case ProtoUDP:
		return "udp"
	}
	return fmt.Sprint(p)
}

// MatchMark matches the packet mark exactly (meta mark).
type MatchMark struct{ Mark uint32 }

// MatchOif matches the output interface by index; Name is how nft prints it.
type MatchOif struct {
	Index uint32
	Name  string
}

// MatchNFProto matches the packet's family (meta nfproto), 4 or 6.
type MatchNFProto struct{ Family int }

// MatchL4Proto matches the transport protocol (meta l4proto).
type MatchL4Proto struct{ Proto uint8 }

// MatchDaddr matches the destination address against one prefix.
type MatchDaddr struct{ Prefix netip.Prefix }

// MatchDaddrSet matches the destination address against a named address set.
type MatchDaddrSet struct {
	Family int
	Set    string
}

// MatchDport matches the destination port of one transport protocol.
type MatchDport struct {
	Proto uint8
	Port  uint16
}

// MatchDportSet matches the transport destination port (th dport) against a port set.
type MatchDportSet struct{ Set string }

// MatchDportNotInSet matches packets of one transport protocol whose destination port is
// not in a port set.
type MatchDportNotInSet struct {
	Proto uint8
	Set   string
}

// MatchDportRange matches the destination port of one transport protocol against an
// inclusive range.
type MatchDportRange struct {
	Proto    uint8
	From, To uint16
}

func (MatchDportRange) isMatch() {}
func (m MatchDportRange) String() string {
	return fmt.Sprintf("%s dport %d-%d", protoName(m.Proto), m.From, m.To)
}

// MatchCTNotNew matches packets of a connection conntrack has seen before (ct state !=
// new): established and related ones, replies, and untracked ones.
type MatchCTNotNew struct{}

func (MatchCTNotNew) isMatch()       {}
func (MatchCTNotNew) String() string { return "ct state != new" }

// Counter counts the packets that reach it (it always matches). nft lists it with its
// current values; Render and Verify ignore them.
type Counter struct{}

func (Counter) isMatch()       {}
func (Counter) String() string { return "counter" }

func (MatchMark) isMatch()          {}
func (MatchOif) isMatch()           {}
func (MatchNFProto) isMatch()       {}
func (MatchL4Proto) isMatch()       {}
func (MatchDaddr) isMatch()         {}
func (MatchDaddrSet) isMatch()      {}
func (MatchDport) isMatch()         {}
func (MatchDportSet) isMatch()      {}
func (MatchDportNotInSet) isMatch() {}

func (m MatchMark) String() string    { return fmt.Sprintf("meta mark 0x%08x", m.Mark) }
func (m MatchOif) String() string     { return fmt.Sprintf("oif %q", m.Name) }
func (m MatchL4Proto) String() string { return "meta l4proto " + protoName(m.Proto) }
func (m MatchNFProto) String() string {
	if m.Family == 6 {
		return "meta nfproto ipv6"
	}
	return "meta nfproto ipv4"
}
func (m MatchDaddr) String() string {
	s := m.Prefix.String()
	if m.Prefix.IsSingleIP() {
		s = m.Prefix.Addr().String()
	}
	return familyKeyword(m.Prefix.Addr().Is4()) + " daddr " + s
}
func (m MatchDaddrSet) String() string {
	return familyKeyword(m.Family == 4) + " daddr @" + m.Set
}
func (m MatchDport) String() string    { return fmt.Sprintf("%s dport %d", protoName(m.Proto), m.Port) }
func (m MatchDportSet) String() string { return "th dport @" + m.Set }
func (m MatchDportNotInSet) String() string {
	return fmt.Sprintf("%s dport != @%s", protoName(m.Proto), m.Set)
}

func familyKeyword(v4 bool) string {
	if v4 {
		return "ip"
	}
	return "ip6"
}

// Verdict ends a rule with a plain verdict.
type Verdict string

const (
	Return Verdict = "return"
	Accept Verdict = "accept"
	Drop   Verdict = "drop"
)

// Redirect rewrites the destination to the local host, port Port (nat chains only).
type Redirect struct{ Port uint16 }

// RejectKind says how a rule rejects.
type RejectKind uint8

const (
	// RejectPortUnreachable answers with ICMP(v6) port unreachable (nft's plain `reject`):
	// a UDP client sees ECONNREFUSED at once.
	RejectPortUnreachable RejectKind = iota + 1
	// RejectAdminProhibited answers with ICMP(v6) administratively prohibited: a TCP client
	// sees EACCES at once.
	RejectAdminProhibited
	// RejectTCPReset answers a TCP packet with a reset.
	RejectTCPReset
)

// Reject refuses the packet with an answer the sender sees immediately.
type Reject struct{ Kind RejectKind }

// SetMark sets the connection's conntrack mark, then ends with Then (accept or return).
// It also restricts the connection's conntrack events to NEW (`ct event set new`): the
// audit watcher needs exactly that one event per marked connection, and no DESTROY or
// update event is built or sent for it. (A NEW event the kernel could not deliver goes
// out later, folded into the next event it sends for that connection, at worst its
// DESTROY; see relayd/fastpath.)
type SetMark struct {
	Mark uint32
	Then Verdict
}

// MapKey is what a mark map is looked up by.
type MapKey uint8

const (
	KeyDaddr4 MapKey = iota + 1 // ip daddr
	KeyDaddr6                   // ip6 daddr
	KeyDport                    // th dport
)

func (k MapKey) String() string {
	switch k {
	case KeyDaddr4:
		return "ip daddr"
	case KeyDaddr6:
		return "ip6 daddr"
	case KeyDport:
		return "th dport"
	}
	return fmt.Sprintf("mapkey(%d)", uint8(k))
}

// MapMark looks Key up in the mark map Map: when found, the connection's conntrack mark
// is set to the element's value, its conntrack events restricted to NEW (as SetMark
// does) and the rule accepts; when not found the rule does not match and the chain
// goes on.
type MapMark struct {
	Key MapKey
	Map string
}

func (SetMark) isAction() {}
func (MapMark) isAction() {}
func (a SetMark) String() string {
	return fmt.Sprintf("ct mark set 0x%08x ct event set new %s", a.Mark, a.Then)
}
func (a MapMark) String() string {
	return fmt.Sprintf("ct mark set %s map @%s ct event set new accept", a.Key, a.Map)
}

func (Verdict) isAction()  {}
func (Redirect) isAction() {}
func (Reject) isAction()   {}

func (v Verdict) String() string  { return string(v) }
func (r Redirect) String() string { return fmt.Sprintf("redirect to :%d", r.Port) }
func (r Reject) String() string {
	switch r.Kind {
	case RejectPortUnreachable:
		return "reject"
	case RejectAdminProhibited:
		return "reject with icmpx admin-prohibited"
	case RejectTCPReset:
		return "reject with tcp reset"
	}
	return fmt.Sprintf("reject kind %d", r.Kind)
}

// Render prints the table in the layout of `nft list table inet NAME`, so a golden file
// reads like what an operator sees on a node. It is deterministic: equal tables render to
// equal text.
func (t *Table) Render() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n", t.Name)
	first := true
	sep := func() {
		if !first {
			b.WriteString("\n")
		}
		first = false
	}
	for _, s := range t.Sets {
		sep()
		if s.Map {
			fmt.Fprintf(&b, "\tmap %s {\n\t\ttype %s : mark\n", s.Name, s.Type)
		} else {
			fmt.Fprintf(&b, "\tset %s {\n\t\ttype %s\n", s.Name, s.Type)
		}
		if s.Type != SetPort {
			b.WriteString("\t\tflags interval\n")
		}
		el := elements(s)
		if len(el) > 0 {
			fmt.Fprintf(&b, "\t\telements = { %s }\n", strings.Join(el, ", "))
		}
		b.WriteString("\t}\n")
	}
	for _, c := range t.Chains {
		sep()
		fmt.Fprintf(&b, "\tchain %s {\n\t\ttype %s hook output priority %s; policy accept;\n",
			c.Name, c.Type, priorityName(c.Type, c.Priority))
		for _, r := range c.Rules {
			fmt.Fprintf(&b, "\t\t%s\n", r)
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

// priorityName prints a priority as nft 1.0 does for the hooks kl uses.
func priorityName(t ChainType, p int32) string {
	if t == ChainFilter && p == 0 {
		return "filter"
	}
	return fmt.Sprint(p)
}
