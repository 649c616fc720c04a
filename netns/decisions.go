package netns

import (
	"container/heap"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Decisions are a pod's kernel decisions: which captured TCP flows the kernel accepts
// itself (tagging the connection with a conntrack mark that says which decision it was)
// and which it redirects to the relay. They sit in the nat chain after the exemptions
// and before the catch-all redirect. The package knows nothing of policies: a caller
// turns its own decision list into this neutral form.
type Decisions struct {
	// Guard, when not 0, is the conntrack mark given to TCP flows to Metadata (exempt from
	// capture anyway; the mark lets them be audited).
	Guard uint32
	// List is tried in order; the first entry whose Prefixes and Ports both match decides.
	// Flows no entry matches are redirected to the relay.
	List []Decision
}

// Decision is one entry of Decisions.List.
type Decision struct {
	Prefixes []netip.Prefix // destination prefixes, both families; nil: any address
	Ports    []PortRange    // destination ports; nil: any port
	Mark     uint32         // accept with this conntrack mark; 0: redirect to the relay
}

// DecisionSetPrefix starts the name of every set and map the decisions add.
const DecisionSetPrefix = "kd"

// Validate checks the decisions; errors name the entry.
func (d Decisions) Validate() error {
	var errs []error
	for i, e := range d.List {
		if e.Prefixes != nil && len(e.Prefixes) == 0 {
			errs = append(errs, fmt.Errorf("decisions: entry %d: empty prefix list (nil means any address)", i))
		}
		if e.Ports != nil && len(e.Ports) == 0 {
			errs = append(errs, fmt.Errorf("decisions: entry %d: empty port list (nil means any port)", i))
		}
		for j, p := range e.Prefixes {
			switch {
			case !p.IsValid():
				errs = append(errs, fmt.Errorf("decisions: entry %d prefix %d: invalid", i, j))
			case p.Addr().Is4In6():
				errs = append(errs, fmt.Errorf("decisions: entry %d prefix %d %s: IPv4-mapped; write the IPv4 prefix", i, j, p))
			case p.Addr().Zone() != "":
				errs = append(errs, fmt.Errorf("decisions: entry %d prefix %d %s: zoned address", i, j, p))
			}
		}
		for j, r := range e.Ports {
			if r.From == 0 || r.To < r.From {
				errs = append(errs, fmt.Errorf("decisions: entry %d port range %d %s: want 1 <= from <= to", i, j, r))
			}
		}
	}
	return errors.Join(errs...)
}

// ProgramWith builds the capture table with the decisions in place.
//
// Consecutive entries that match addresses only become one stage: a mark map per family
// (first match resolved into disjoint intervals, so one lookup decides) and a set of the
// intervals that go to the relay; consecutive port-only entries likewise become one port
// stage; an entry that matches both addresses and ports is a rule of its own with named
// sets. A catch-all entry ends the list: with a mark it replaces the redirect, so a pod
// whose every flow is decided in the kernel has no redirect at all.
func (c Capture) ProgramWith(d Decisions) (*Table, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return c.build(c.compile(d)), nil
}

func (c Capture) compile(d Decisions) extension {
	var ext extension
	tcp := []Match{MatchL4Proto{ProtoTCP}}
	if !c.IPv6 {
		tcp = []Match{MatchNFProto{4}, MatchL4Proto{ProtoTCP}}
	}
	ext.guard = d.Guard
	redirect := Redirect{c.RedirectPort}
	stage := 0
	name := func(kind string) string { return fmt.Sprintf("%s%d_%s", DecisionSetPrefix, stage, kind) }
	with := func(ms ...Match) []Match { return append(slices.Clone(tcp), ms...) }

	list := d.List
	for i := 0; i < len(list); {
		e := list[i]
		stage++
		switch {
		case e.Prefixes == nil && e.Ports == nil:
			if e.Mark != 0 {
				ext.final = &Rule{Match: slices.Clone(tcp), Action: SetMark{e.Mark, Accept}}
			}
			return ext // later entries are unreachable
		case e.Ports == nil:
			j := i
			for j < len(list) && list[j].Ports == nil && list[j].Prefixes != nil {
				j++
			}
			for _, fam := range []int{4, 6} {
				if fam == 6 && !c.IPv6 {
					continue
				}
				ranges, marks := resolveAddrs(list[i:j], fam == 4)
				c.addrStage(&ext, fam, ranges, marks, name, with, redirect)
			}
			i = j
		case e.Prefixes == nil:
			j := i
			for j < len(list) && list[j].Prefixes == nil && list[j].Ports != nil {
				j++
			}
			ranges, marks := resolvePorts(list[i:j])
			var relay []PortRange
			var mapR []PortRange
			var mapM []uint32
			for k, r := range ranges {
				if marks[k] == 0 {
					relay = appendPortRange(relay, r)
				} else {
					mapR, mapM = append(mapR, r), append(mapM, marks[k])
				}
			}
			if len(relay) > 0 {
				ext.sets = append(ext.sets, Set{Name: name("relay_ports"), Type: SetPortRange, PortRanges: relay})
				ext.decisions = append(ext.decisions, Rule{Match: with(MatchDportSet{name("relay_ports")}), Action: redirect})
			}
			if len(mapR) > 0 {
				ext.sets = append(ext.sets, Set{Name: name("mark_ports"), Type: SetPortRange, PortRanges: mapR, Map: true, Marks: mapM})
				ext.decisions = append(ext.decisions, Rule{Match: with(), Action: MapMark{KeyDport, name("mark_ports")}})
			}
			i = j
		default:
			ports := mergePortRanges(e.Ports)
			var portMatch Match
			if len(ports) == 1 {
				portMatch = MatchDportRange{ProtoTCP, ports[0].From, ports[0].To}
				if ports[0].From == ports[0].To {
					portMatch = MatchDport{ProtoTCP, ports[0].From}
				}
			} else {
				ext.sets = append(ext.sets, Set{Name: name("ports"), Type: SetPortRange, PortRanges: ports})
				portMatch = MatchDportSet{name("ports")}
			}
			var action Action = redirect
			if e.Mark != 0 {
				action = SetMark{e.Mark, Accept}
			}
			for _, fam := range []int{4, 6} {
				if fam == 6 && !c.IPv6 {
					continue
				}
				var ps []netip.Prefix
				for _, p := range e.Prefixes {
					if p.Addr().Is4() == (fam == 4) {
						ps = append(ps, p)
					}
				}
				if len(ps) == 0 {
					continue
				}
				typ, set := SetIPv4, name("v4")
				if fam == 6 {
					typ, set = SetIPv6, name("v6")
				}
				ext.sets = append(ext.sets, Set{Name: set, Type: typ, Addrs: mergeRanges(ps)})
				ext.decisions = append(ext.decisions, Rule{Match: with(MatchDaddrSet{fam, set}, portMatch), Action: action})
			}
			i++
		}
	}
	return ext
}

// addrStage adds one family's address stage: a relay set redirected and a mark map.
func (c Capture) addrStage(ext *extension, fam int, ranges []AddrRange, marks []uint32, name func(string) string, with func(...Match) []Match, redirect Redirect) {
	var relay, mapR []AddrRange
	var mapM []uint32
	for k, r := range ranges {
		if marks[k] == 0 {
			relay = appendAddrRange(relay, r)
		} else {
			mapR, mapM = append(mapR, r), append(mapM, marks[k])
		}
	}
	typ, key, sfx := SetIPv4, KeyDaddr4, "4"
	if fam == 6 {
		typ, key, sfx = SetIPv6, KeyDaddr6, "6"
	}
	if len(relay) > 0 {
		ext.sets = append(ext.sets, Set{Name: name("relay_v" + sfx), Type: typ, Addrs: relay})
		ext.decisions = append(ext.decisions, Rule{Match: with(MatchDaddrSet{fam, name("relay_v" + sfx)}), Action: redirect})
	}
	if len(mapR) > 0 {
		ext.sets = append(ext.sets, Set{Name: name("mark_v" + sfx), Type: typ, Addrs: mapR, Map: true, Marks: mapM})
		ext.decisions = append(ext.decisions, Rule{Match: with(), Action: MapMark{key, name("mark_v" + sfx)}})
	}
}

func appendAddrRange(rs []AddrRange, r AddrRange) []AddrRange {
	if n := len(rs); n > 0 && rs[n-1].To.Next() == r.From {
		rs[n-1].To = r.To
		return rs
	}
	return append(rs, r)
}

func appendPortRange(rs []PortRange, r PortRange) []PortRange {
	if n := len(rs); n > 0 && uint32(rs[n-1].To)+1 == uint32(r.From) {
		rs[n-1].To = r.To
		return rs
	}
	return append(rs, r)
}

// resolveAddrs turns ordered address-only entries into disjoint sorted ranges of one
// family, each with the mark of the first entry that contains it, adjacent ranges of
// the same mark merged. It sweeps the prefixes' boundaries with a heap of the entries
// covering the current point (prefixes nest or are disjoint, but entries hold several),
// O(n log n) in the number of prefixes.
func resolveAddrs(list []Decision, v4 bool) ([]AddrRange, []uint32) {
	type event struct {
		at    netip.Addr
		end   bool // the prefix ends just before at (at invalid: at the end of the space)
		order int
	}
	var evs []event
	for i, e := range list {
		for _, p := range e.Prefixes {
			if p.Addr().Is4() != v4 {
				continue
			}
			p = p.Masked()
			evs = append(evs, event{at: p.Addr(), order: i})
			evs = append(evs, event{at: lastAddr(p).Next(), end: true, order: i})
		}
	}
	// Sort by position (the end of the space last), ends before starts at one position.
	slices.SortFunc(evs, func(a, b event) int {
		switch {
		case !a.at.IsValid() && !b.at.IsValid():
			return 0
		case !a.at.IsValid():
			return 1
		case !b.at.IsValid():
			return -1
		}
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		switch {
		case a.end && !b.end:
			return -1
		case !a.end && b.end:
			return 1
		}
		return 0
	})
	active := &orderHeap{}
	count := map[int]int{} // how many of an entry's prefixes cover the point
	var out []AddrRange
	var marks []uint32
	emit := func(from, to netip.Addr, mark uint32) {
		if n := len(out); n > 0 && marks[n-1] == mark && out[n-1].To.Next() == from {
			out[n-1].To = to
			return
		}
		out = append(out, AddrRange{from, to})
		marks = append(marks, mark)
	}
	for k := 0; k < len(evs); {
		at := evs[k].at
		for ; k < len(evs) && evs[k].at == at; k++ {
			if evs[k].end {
				count[evs[k].order]--
			} else {
				if count[evs[k].order] == 0 {
					heap.Push(active, evs[k].order)
				}
				count[evs[k].order]++
			}
		}
		for active.Len() > 0 && count[(*active)[0]] == 0 {
			heap.Pop(active)
		}
		if !at.IsValid() || active.Len() == 0 {
			continue
		}
		// The winner covers [at, next event).
		var to netip.Addr
		if k < len(evs) && evs[k].at.IsValid() {
			to = evs[k].at.Prev()
		} else {
			to = lastAddr(netip.PrefixFrom(at, 0))
		}
		emit(at, to, list[(*active)[0]].Mark)
	}
	return out, marks
}

type orderHeap []int

func (h orderHeap) Len() int           { return len(h) }
func (h orderHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h orderHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *orderHeap) Push(x any)        { *h = append(*h, x.(int)) }
func (h *orderHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// resolvePorts is resolveAddrs for port-only entries: disjoint sorted port ranges with
// the mark of the first entry listing them.
func resolvePorts(list []Decision) ([]PortRange, []uint32) {
	const unset = -1
	var first [65536]int32
	for i := range first {
		first[i] = unset
	}
	for i := len(list) - 1; i >= 0; i-- {
		for _, r := range list[i].Ports {
			for p := uint32(r.From); p <= uint32(r.To); p++ {
				first[p] = int32(i)
			}
		}
	}
	var out []PortRange
	var marks []uint32
	for p := 1; p < 65536; {
		if first[p] == unset {
			p++
			continue
		}
		q := p
		m := list[first[p]].Mark
		for q+1 < 65536 && first[q+1] != unset && list[first[q+1]].Mark == m {
			q++
		}
		out = append(out, PortRange{uint16(p), uint16(q)})
		marks = append(marks, m)
		p = q + 1
	}
	return out, marks
}

// mergePortRanges sorts and merges overlapping or adjacent ranges.
func mergePortRanges(rs []PortRange) []PortRange {
	s := slices.Clone(rs)
	slices.SortFunc(s, func(a, b PortRange) int { return int(a.From) - int(b.From) })
	var out []PortRange
	for _, r := range s {
		if n := len(out); n > 0 && uint32(r.From) <= uint32(out[n-1].To)+1 {
			out[n-1].To = max(out[n-1].To, r.To)
			continue
		}
		out = append(out, r)
	}
	return out
}

// isDecisionRule reports whether a nat chain rule is part of the kernel decisions (or
// the guard's marking rule) rather than of the capture program itself.
func isDecisionRule(r Rule) bool {
	switch r.Action.(type) {
	case SetMark, MapMark:
		return true
	}
	for _, m := range r.Match {
		switch m := m.(type) {
		case MatchDaddrSet:
			if strings.HasPrefix(m.Set, DecisionSetPrefix) {
				return true
			}
		case MatchDportSet:
			if strings.HasPrefix(m.Set, DecisionSetPrefix) {
				return true
			}
		}
	}
	return false
}

// withoutDecisions returns a copy of t with the kernel decisions taken out, so that the
// capture program underneath can be verified on its own: decision sets and rules are
// dropped and, where a marking catch-all replaced the redirect, the redirect put back.
func (c Capture) withoutDecisions(t *Table) *Table {
	out := &Table{Name: t.Name}
	for _, s := range t.Sets {
		if !strings.HasPrefix(s.Name, DecisionSetPrefix) {
			out.Sets = append(out.Sets, s)
		}
	}
	for _, ch := range t.Chains {
		if ch.Name != NATChain {
			out.Chains = append(out.Chains, ch)
			continue
		}
		n := ch
		n.Rules = nil
		final := false
		for _, r := range ch.Rules {
			if !isDecisionRule(r) {
				n.Rules = append(n.Rules, r)
				continue
			}
			if sm, ok := r.Action.(SetMark); ok && sm.Then == Accept && onlyProto(r) {
				final = true
			}
		}
		if final {
			n.Rules = append(n.Rules, c.redirect())
		}
		out.Chains = append(out.Chains, n)
	}
	return out
}

func onlyProto(r Rule) bool {
	for _, m := range r.Match {
		switch m.(type) {
		case MatchNFProto, MatchL4Proto:
		default:
			return false
		}
	}
	return true
}
