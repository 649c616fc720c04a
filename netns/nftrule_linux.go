package netns

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"reflect"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Every match loads into register 1 and compares there, like nft does.
const reg = 1

func nfproto(family int) []byte {
	if family == 6 {
		return []byte{unix.NFPROTO_IPV6}
	}
	return []byte{unix.NFPROTO_IPV4}
}

func loadMeta(k expr.MetaKey) *expr.Meta { return &expr.Meta{Key: k, Register: reg} }
func cmpEq(data []byte) *expr.Cmp        { return &expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: data} }
func loadPayload(base expr.PayloadBase, off, n uint32) *expr.Payload {
	return &expr.Payload{OperationType: expr.PayloadLoad, DestRegister: reg, Base: base, Offset: off, Len: n}
}

// daddrOffset is where the destination address sits in the network header.
func daddrOffset(v4 bool) uint32 {
	if v4 {
		return 16
	}
	return 24
}

// encodeRule compiles one rule to kernel expressions; sets resolves set references.
func encodeRule(r Rule, sets map[string]*nftables.Set) ([]expr.Any, error) {
	var out []expr.Any
	for _, m := range r.Match {
		switch m := m.(type) {
		case MatchMark:
			out = append(out, loadMeta(expr.MetaKeyMARK), cmpEq(binaryutil.NativeEndian.PutUint32(m.Mark)))
		case MatchOif:
			out = append(out, loadMeta(expr.MetaKeyOIF), cmpEq(binaryutil.NativeEndian.PutUint32(m.Index)))
		case MatchNFProto:
			out = append(out, loadMeta(expr.MetaKeyNFPROTO), cmpEq(nfproto(m.Family)))
		case MatchL4Proto:
			out = append(out, loadMeta(expr.MetaKeyL4PROTO), cmpEq([]byte{m.Proto}))
		case MatchDaddr:
			p := m.Prefix.Masked()
			v4 := p.Addr().Is4()
			fam := 6
			if v4 {
				fam = 4
			}
			if p.Bits() == 0 {
				return nil, fmt.Errorf("prefix %s matches every address of its family; use meta nfproto", p)
			}
			// Like nft: a byte-aligned prefix loads only its bytes, any other loads the
			// whole address and masks it.
			n := uint32(p.Bits() / 8)
			if p.Bits()%8 != 0 {
				n = uint32(p.Addr().BitLen() / 8)
			}
			addr := p.Addr().AsSlice()[:n]
			out = append(out, loadMeta(expr.MetaKeyNFPROTO), cmpEq(nfproto(fam)),
				loadPayload(expr.PayloadBaseNetworkHeader, daddrOffset(v4), n))
			if p.Bits()%8 != 0 {
				mask := make([]byte, n)
				for i := 0; i < p.Bits(); i++ {
					mask[i/8] |= 0x80 >> (i % 8)
				}
				out = append(out, &expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: n, Mask: mask, Xor: make([]byte, n)})
			}
			out = append(out, cmpEq(addr))
		case MatchDaddrSet:
			s, ok := sets[m.Set]
			if !ok {
				return nil, fmt.Errorf("set %s is not in the table", m.Set)
			}
			v4 := m.Family == 4
			n := uint32(16)
			if v4 {
				n = 4
			}
			out = append(out, loadMeta(expr.MetaKeyNFPROTO), cmpEq(nfproto(m.Family)),
				loadPayload(expr.PayloadBaseNetworkHeader, daddrOffset(v4), n),
				&expr.Lookup{SourceRegister: reg, SetName: s.Name, SetID: s.ID})
		case MatchDport:
			out = append(out, loadMeta(expr.MetaKeyL4PROTO), cmpEq([]byte{m.Proto}),
				loadPayload(expr.PayloadBaseTransportHeader, 2, 2),
				cmpEq(binaryutil.BigEndian.PutUint16(m.Port)))
		case MatchDportRange:
			out = append(out, loadMeta(expr.MetaKeyL4PROTO), cmpEq([]byte{m.Proto}),
				loadPayload(expr.PayloadBaseTransportHeader, 2, 2),
				&expr.Range{Op: expr.CmpOpEq, Register: reg,
					FromData: binaryutil.BigEndian.PutUint16(m.From), ToData: binaryutil.BigEndian.PutUint16(m.To)})
		case Counter:
			out = append(out, &expr.Counter{})
		case MatchCTNotNew:
			// As nft compiles it: the state is one bit, so "not new" is "not exactly new".
			out = append(out, &expr.Ct{Register: reg, Key: expr.CtKeySTATE},
				&expr.Cmp{Op: expr.CmpOpNeq, Register: reg, Data: binaryutil.NativeEndian.PutUint32(ctStateNew)})
		case MatchDportSet:
			s, ok := sets[m.Set]
			if !ok {
				return nil, fmt.Errorf("set %s is not in the table", m.Set)
			}
			out = append(out, loadPayload(expr.PayloadBaseTransportHeader, 2, 2),
				&expr.Lookup{SourceRegister: reg, SetName: s.Name, SetID: s.ID})
		case MatchDportNotInSet:
			s, ok := sets[m.Set]
			if !ok {
				return nil, fmt.Errorf("set %s is not in the table", m.Set)
			}
			out = append(out, loadMeta(expr.MetaKeyL4PROTO), cmpEq([]byte{m.Proto}),
				loadPayload(expr.PayloadBaseTransportHeader, 2, 2),
				&expr.Lookup{SourceRegister: reg, SetName: s.Name, SetID: s.ID, Invert: true})
		default:
			return nil, fmt.Errorf("match %s has no kernel encoding", m)
		}
	}
	switch a := r.Action.(type) {
	case Verdict:
		k, ok := verdictKinds[a]
		if !ok {
			return nil, fmt.Errorf("verdict %q has no kernel encoding", a)
		}
		out = append(out, &expr.Verdict{Kind: k})
	case SetMark:
		k, ok := verdictKinds[a.Then]
		if !ok {
			return nil, fmt.Errorf("verdict %q has no kernel encoding", a.Then)
		}
		out = append(out, &expr.Immediate{Register: reg, Data: binaryutil.NativeEndian.PutUint32(a.Mark)},
			&expr.Ct{Register: reg, SourceRegister: true, Key: expr.CtKeyMARK})
		out = append(out, eventNewOnly()...)
		out = append(out, &expr.Verdict{Kind: k})
	case MapMark:
		s, ok := sets[a.Map]
		if !ok {
			return nil, fmt.Errorf("map %s is not in the table", a.Map)
		}
		switch a.Key {
		case KeyDaddr4, KeyDaddr6:
			fam, n := 4, uint32(4)
			if a.Key == KeyDaddr6 {
				fam, n = 6, 16
			}
			out = append(out, loadMeta(expr.MetaKeyNFPROTO), cmpEq(nfproto(fam)),
				loadPayload(expr.PayloadBaseNetworkHeader, daddrOffset(fam == 4), n))
		case KeyDport:
			out = append(out, loadPayload(expr.PayloadBaseTransportHeader, 2, 2))
		default:
			return nil, fmt.Errorf("map key %v has no kernel encoding", a.Key)
		}
		out = append(out, &expr.Lookup{SourceRegister: reg, DestRegister: reg, IsDestRegSet: true, SetName: s.Name, SetID: s.ID},
			&expr.Ct{Register: reg, SourceRegister: true, Key: expr.CtKeyMARK})
		out = append(out, eventNewOnly()...)
		out = append(out, &expr.Verdict{Kind: expr.VerdictAccept})
	case Redirect:
		out = append(out, &expr.Immediate{Register: reg, Data: binaryutil.BigEndian.PutUint16(a.Port)},
			&expr.Redir{RegisterProtoMin: reg, RegisterProtoMax: reg, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED})
	case Reject:
		switch a.Kind {
		case RejectPortUnreachable:
			out = append(out, &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH})
		case RejectAdminProhibited:
			out = append(out, &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED})
		case RejectTCPReset:
			out = append(out, &expr.Reject{Type: unix.NFT_REJECT_TCP_RST})
		default:
			return nil, fmt.Errorf("reject kind %d has no kernel encoding", a.Kind)
		}
	default:
		return nil, fmt.Errorf("action %v has no kernel encoding", r.Action)
	}
	return out, nil
}

// ipctNew is the conntrack event mask bit of NEW events (1 << IPCT_NEW).
const ipctNew uint32 = 1 << 0

// ctStateNew is ct state's value for a packet that starts a connection (NF_CT_STATE_BIT
// of IP_CT_NEW).
const ctStateNew uint32 = 1 << 3

// eventNewOnly is `ct event set new`: the connection's conntrack events are limited to
// NEW (the kernel then builds no DESTROY or update event for it).
func eventNewOnly() []expr.Any {
	return []expr.Any{&expr.Immediate{Register: reg, Data: binaryutil.NativeEndian.PutUint32(ipctNew)},
		&expr.Ct{Register: reg, SourceRegister: true, Key: expr.CtKeyEVENTMASK}}
}

// isCtMarkSet recognizes a `ct mark set` statement. google/nftables does not decode the
// source register the kernel echoes, so a read-back set has neither register nor flag.
func isCtMarkSet(e expr.Any) bool { return isCtSet(e, expr.CtKeyMARK) }

func isCtSet(e expr.Any, k expr.CtKey) bool {
	c, ok := e.(*expr.Ct)
	return ok && c.Key == k && (c.SourceRegister || c.Register == 0)
}

// isEventNewOnly recognizes eventNewOnly at es[i:].
func isEventNewOnly(es []expr.Any, i int) bool {
	if i+1 >= len(es) {
		return false
	}
	im, ok := es[i].(*expr.Immediate)
	return ok && len(im.Data) == 4 && binaryutil.NativeEndian.Uint32(im.Data) == ipctNew && isCtSet(es[i+1], expr.CtKeyEVENTMASK)
}

var verdictKinds = map[Verdict]expr.VerdictKind{
	Return: expr.VerdictReturn,
	Accept: expr.VerdictAccept,
	Drop:   expr.VerdictDrop,
}

// rawRule stands for a kernel rule kl cannot read as one of its own: it renders the
// expressions so a diff shows what is there.
type rawRule struct{ text string }

func (r rawRule) isMatch()       {}
func (r rawRule) isAction()      {}
func (r rawRule) String() string { return r.text }

// decodeRule reads a kernel rule back. It parses the expression patterns encodeRule
// writes, then re-encodes the result and requires the same expressions, so any field it
// does not model (an operator, a register, a mask) makes the rule raw instead of silently
// equal.
func decodeRule(nr *nftables.Rule) Rule {
	r, ok := parseRule(nr.Exprs)
	if ok {
		// Set references decode by name; give the encoder stand-in sets of those names.
		sets := map[string]*nftables.Set{}
		for _, e := range nr.Exprs {
			if l, isLookup := e.(*expr.Lookup); isLookup {
				sets[l.SetName] = &nftables.Set{Name: l.SetName}
			}
		}
		again, err := encodeRule(r, sets)
		if err == nil && sameExprs(again, nr.Exprs) {
			return r
		}
	}
	return Rule{Action: rawRule{fmt.Sprintf("[handle %d] %s", nr.Handle, describeExprs(nr.Exprs))}}
}

func parseRule(es []expr.Any) (Rule, bool) {
	var r Rule
	i := 0
	at := func(k int) expr.Any {
		if i+k < len(es) {
			return es[i+k]
		}
		return nil
	}
	for i < len(es) {
		switch e := es[i].(type) {
		case *expr.Meta:
			c, ok := at(1).(*expr.Cmp)
			if !ok {
				return r, false
			}
			switch e.Key {
			case expr.MetaKeyMARK:
				if len(c.Data) != 4 {
					return r, false
				}
				r.Match = append(r.Match, MatchMark{binaryutil.NativeEndian.Uint32(c.Data)})
				i += 2
			case expr.MetaKeyOIF:
				if len(c.Data) != 4 {
					return r, false
				}
				idx := binaryutil.NativeEndian.Uint32(c.Data)
				name := fmt.Sprint(idx)
				if idx == 1 {
					name = "lo"
				}
				r.Match = append(r.Match, MatchOif{Index: idx, Name: name})
				i += 2
			case expr.MetaKeyL4PROTO:
				if len(c.Data) != 1 {
					return r, false
				}
				l, lookup := at(3).(*expr.Lookup)
				if p, ok := at(2).(*expr.Payload); ok && p.Base == expr.PayloadBaseTransportHeader && lookup && l.Invert {
					r.Match = append(r.Match, MatchDportNotInSet{Proto: c.Data[0], Set: l.SetName})
					i += 4
					continue
				}
				if p, ok := at(2).(*expr.Payload); ok && p.Base == expr.PayloadBaseTransportHeader && !lookup {
					if rg, ok := at(3).(*expr.Range); ok && len(rg.FromData) == 2 && len(rg.ToData) == 2 {
						r.Match = append(r.Match, MatchDportRange{Proto: c.Data[0],
							From: binary.BigEndian.Uint16(rg.FromData), To: binary.BigEndian.Uint16(rg.ToData)})
						i += 4
						continue
					}
					c2, ok := at(3).(*expr.Cmp)
					if !ok || len(c2.Data) != 2 {
						return r, false
					}
					r.Match = append(r.Match, MatchDport{Proto: c.Data[0], Port: binary.BigEndian.Uint16(c2.Data)})
					i += 4
					continue
				}
				r.Match = append(r.Match, MatchL4Proto{c.Data[0]})
				i += 2
			case expr.MetaKeyNFPROTO:
				if len(c.Data) != 1 {
					return r, false
				}
				fam := 4
				if c.Data[0] == unix.NFPROTO_IPV6 {
					fam = 6
				}
				p, ok := at(2).(*expr.Payload)
				if !ok || p.Base != expr.PayloadBaseNetworkHeader {
					r.Match = append(r.Match, MatchNFProto{fam})
					i += 2
					continue
				}
				if l, ok := at(3).(*expr.Lookup); ok && l.IsDestRegSet {
					if !isCtMarkSet(at(4)) {
						return r, false
					}
					key := KeyDaddr4
					if fam == 6 {
						key = KeyDaddr6
					}
					if !isEventNewOnly(es, i+5) {
						return r, false
					}
					r.Action = MapMark{Key: key, Map: l.SetName}
					i += 8 // meta, cmp, payload, lookup, ct, immediate, ct, verdict
					continue
				}
				if l, ok := at(3).(*expr.Lookup); ok {
					r.Match = append(r.Match, MatchDaddrSet{Family: fam, Set: l.SetName})
					i += 4
					continue
				}
				j := 3
				bits := int(p.Len) * 8
				if b, ok := at(3).(*expr.Bitwise); ok {
					bits = 0
					for _, m := range b.Mask {
						for ; m&0x80 != 0; m <<= 1 {
							bits++
						}
					}
					j++
				}
				c2, ok := at(j).(*expr.Cmp)
				if !ok {
					return r, false
				}
				full := make([]byte, 16)
				if fam == 4 {
					full = full[:4]
				}
				if len(c2.Data) > len(full) {
					return r, false
				}
				copy(full, c2.Data)
				a, _ := netip.AddrFromSlice(full)
				pre, err := a.Prefix(bits)
				if err != nil {
					return r, false
				}
				r.Match = append(r.Match, MatchDaddr{pre})
				i += j + 1
			default:
				return r, false
			}
		case *expr.Payload:
			l, ok := at(1).(*expr.Lookup)
			if !ok || e.Base != expr.PayloadBaseTransportHeader {
				return r, false
			}
			if l.IsDestRegSet {
				if !isCtMarkSet(at(2)) || !isEventNewOnly(es, i+3) {
					return r, false
				}
				r.Action = MapMark{Key: KeyDport, Map: l.SetName}
				i += 6 // payload, lookup, ct, immediate, ct, verdict
				continue
			}
			r.Match = append(r.Match, MatchDportSet{l.SetName})
			i += 2
		case *expr.Counter:
			r.Match = append(r.Match, Counter{})
			i++
		case *expr.Ct:
			c, ok := at(1).(*expr.Cmp)
			if !ok || e.Key != expr.CtKeySTATE || e.SourceRegister || c.Op != expr.CmpOpNeq || len(c.Data) != 4 ||
				binaryutil.NativeEndian.Uint32(c.Data) != ctStateNew {
				return r, false
			}
			r.Match = append(r.Match, MatchCTNotNew{})
			i += 2
		case *expr.Verdict:
			for v, k := range verdictKinds {
				if k == e.Kind {
					r.Action = v
				}
			}
			i++
		case *expr.Immediate:
			if isCtMarkSet(at(1)) {
				v, ok := at(4).(*expr.Verdict)
				if !ok || len(e.Data) != 4 || !isEventNewOnly(es, i+2) {
					return r, false
				}
				sm := SetMark{Mark: binaryutil.NativeEndian.Uint32(e.Data)}
				for vv, k := range verdictKinds {
					if k == v.Kind {
						sm.Then = vv
					}
				}
				r.Action = sm
				i += 5 // immediate, ct, immediate, ct, verdict
				continue
			}
			if _, ok := at(1).(*expr.Redir); !ok || len(e.Data) != 2 {
				return r, false
			}
			r.Action = Redirect{binary.BigEndian.Uint16(e.Data)}
			i += 2
		case *expr.Reject:
			switch {
			case e.Type == unix.NFT_REJECT_ICMPX_UNREACH && e.Code == unix.NFT_REJECT_ICMPX_PORT_UNREACH:
				r.Action = Reject{RejectPortUnreachable}
			case e.Type == unix.NFT_REJECT_ICMPX_UNREACH && e.Code == unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED:
				r.Action = Reject{RejectAdminProhibited}
			case e.Type == unix.NFT_REJECT_TCP_RST:
				r.Action = Reject{RejectTCPReset}
			default:
				return r, false
			}
			i++
		default:
			return r, false
		}
		if r.Action != nil && i != len(es) {
			return r, false // an action must come last
		}
	}
	return r, r.Action != nil
}

// sameExprs compares expressions ignoring what the kernel does not echo (set IDs).
func sameExprs(a, b []expr.Any) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := normalize(a[i]), normalize(b[i])
		if !reflect.DeepEqual(x, y) {
			return false
		}
	}
	return true
}

func normalize(e expr.Any) expr.Any {
	switch e := e.(type) {
	case *expr.Lookup:
		c := *e
		c.SetID = 0
		return &c
	case *expr.Counter:
		return &expr.Counter{}
	case *expr.Ct:
		if isCtSet(e, e.Key) {
			return &expr.Ct{Key: e.Key, SourceRegister: true, Register: reg}
		}
	}
	return e
}

func describeExprs(es []expr.Any) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = strings.TrimPrefix(fmt.Sprintf("%T%+v", e, e), "*expr.")
	}
	return strings.Join(parts, " ")
}
