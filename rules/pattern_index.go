package rules

import "net/netip"

// patternIndex compiles the pattern form: patterns are grouped by their port range
// (files use few distinct ones), and each group indexes its host globs like domain
// rules and its addresses and prefixes in a prefix table. The answer is the lowest
// matching rule over the groups whose ports admit the flow, which is exactly the first
// match of the ordered list.
type patternIndex struct {
	groups   []patternGroup
	anyPorts portIndex // `*:PORT` patterns, by port
}

type patternGroup struct {
	ports  portRange // {0,0}: any port
	any    int32     // lowest `*` pattern; none when there is none
	hosts  domainIndex
	prefix cidrIndex
}

// maxPatternGroups bounds the groups; a file with more distinct port specs is decided
// by walking its list (still first match, just not indexed).
const maxPatternGroups = 16

func (x *patternIndex) build(rs []rule) bool {
	byPorts := map[portRange]int{}
	prefixes := []map[netip.Prefix]int32{}
	var anyPorts []rule
	for i := range rs {
		m := rs[i].m.(*patternMatcher)
		if m.any && m.ports.lo != 0 {
			anyPorts = append(anyPorts, rule{idx: rs[i].idx, m: &portMatcher{ranges: []portRange{m.ports}}})
			continue
		}
		g, ok := byPorts[m.ports]
		if !ok {
			if len(x.groups) == maxPatternGroups {
				x.groups = nil
				return false
			}
			g = len(x.groups)
			byPorts[m.ports] = g
			x.groups = append(x.groups, patternGroup{ports: m.ports, any: none})
			prefixes = append(prefixes, map[netip.Prefix]int32{})
		}
		grp := &x.groups[g]
		idx := int32(rs[i].idx)
		switch {
		case m.any:
			grp.any = lower(grp.any, idx)
		case m.glob != "":
			grp.hosts.add(m.glob, idx)
		default:
			if _, ok := prefixes[g][m.prefix]; !ok {
				prefixes[g][m.prefix] = idx
			}
		}
	}
	for g := range x.groups {
		x.groups[g].hosts.seal()
		x.groups[g].prefix.build(prefixes[g])
	}
	x.anyPorts.build(anyPorts)
	return true
}

func (x *patternIndex) lookup(host string, addr netip.Addr, port uint16) int32 {
	best := none
	if host != "" || addr.IsValid() {
		if i := x.anyPorts.lookup(port); i > 0 {
			best = i
		}
	}
	for g := range x.groups {
		grp := &x.groups[g]
		if grp.ports.lo != 0 && (port < grp.ports.lo || port > grp.ports.hi) {
			continue
		}
		if host != "" || addr.IsValid() {
			best = lower(best, grp.any)
		}
		if i := grp.hosts.lookup(host); i > 0 {
			best = lower(best, i)
		}
		if i := grp.prefix.lookup(addr); i > 0 {
			best = lower(best, i)
		}
	}
	return found(best)
}
