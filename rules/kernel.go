package rules

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// KernelPlan is the part of a policy the kernel can decide for one workload: an ordered,
// first-match list of entries over a flow's destination address and port, the only
// facts a packet filter sees when a connection opens. Each entry either decides in the
// kernel (exit direct: the flow is accepted and never reaches the relay) or sends the
// flow to the relay (a non-direct exit, which needs the relay to carry it, or a region
// where a flow-dependent rule — process, domain, host pattern, script — could match,
// which only the relay can tell).
//
// The plan is exact: for every flow to an address and port, an entry with Relay false
// carries the very Decision that Decide returns for that flow whatever its hostname
// and process are. Flows an entry sends to the relay are decided there by Decide.
type KernelPlan struct {
	// Entries are tried in order; the first whose Prefixes and Ports both match decides.
	// The first entry is the metadata guard; the last always matches (nil Prefixes and
	// Ports), so every flow is decided by exactly one entry.
	Entries []KernelEntry
	// Whole is true when a label or image rule (or a rule-less default that nothing
	// flow-dependent can override) decides every flow of the workload but the guard's.
	Whole bool
}

// KernelEntry is one decision of a KernelPlan.
type KernelEntry struct {
	// Prefixes is the destination addresses the entry matches (IPv4 and IPv6, in rule
	// order, unmerged); nil matches any address.
	Prefixes []netip.Prefix
	// Ports is the destination ports the entry matches; nil matches any port.
	Ports []PortRange
	// Relay is true when the flows this entry matches go to the relay. When false the
	// kernel accepts them: Decision.Exit is direct.
	Relay bool
	// Decision is what Decide answers for every flow this entry matches, when one rule
	// decides them all (Known); for an entry that only says "a flow-dependent rule could
	// match here" Known is false and Decision is empty.
	Decision Decision
	Known    bool
	// Why says in words why the entry is where it is (for status and explain).
	Why string
}

// PortRange is an inclusive range of destination ports.
type PortRange struct{ From, To uint16 }

func (r PortRange) String() string {
	if r.From == r.To {
		return fmt.Sprint(r.From)
	}
	return fmt.Sprintf("%d-%d", r.From, r.To)
}

// Kernel reports whether the kernel decides the entry's flows (accepts them, exit direct).
func (e *KernelEntry) Kernel() bool { return !e.Relay }

// Matches reports whether the entry matches a destination (address unmapped).
func (e *KernelEntry) Matches(dst netip.AddrPort) bool {
	a := dst.Addr().Unmap().WithZone("")
	if e.Prefixes != nil {
		in := false
		for _, p := range e.Prefixes {
			if p.Contains(a) {
				in = true
				break
			}
		}
		if !in {
			return false
		}
	}
	if e.Ports != nil {
		port := dst.Port()
		for _, r := range e.Ports {
			if port >= r.From && port <= r.To {
				return true
			}
		}
		return false
	}
	return true
}

func (e *KernelEntry) String() string {
	var b strings.Builder
	switch {
	case e.Prefixes == nil && e.Ports == nil:
		b.WriteString("any")
	default:
		if e.Prefixes != nil {
			b.WriteString("daddr {")
			for i, p := range e.Prefixes {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString(prefixString(p))
			}
			b.WriteString("}")
		}
		if e.Ports != nil {
			if e.Prefixes != nil {
				b.WriteString(" ")
			}
			b.WriteString("dport {")
			for i, r := range e.Ports {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString(r.String())
			}
			b.WriteString("}")
		}
	}
	if e.Relay {
		b.WriteString(" -> relay")
	} else {
		b.WriteString(" -> kernel accept")
	}
	if e.Known {
		fmt.Fprintf(&b, " (%s rule %d priority %d exit %s)", e.Decision.Dimension, e.Decision.Rule, e.Decision.Priority, e.Decision.Exit)
	}
	if e.Why != "" {
		b.WriteString(": " + e.Why)
	}
	return b.String()
}

// Lookup returns the entry that decides flows to dst (the first that matches).
func (k *KernelPlan) Lookup(dst netip.AddrPort) *KernelEntry {
	for i := range k.Entries {
		if k.Entries[i].Matches(dst) {
			return &k.Entries[i]
		}
	}
	return nil // unreachable: the last entry matches everything
}

// Share is the fraction of the plan's entries, the guard excluded, that the kernel
// decides: 1 when no flow of the workload needs the relay, 0 when every flow does.
func (k *KernelPlan) Share() float64 {
	n, kern := 0, 0
	for i := range k.Entries {
		if i == 0 {
			continue // the guard
		}
		n++
		if !k.Entries[i].Relay {
			kern++
		}
	}
	if n == 0 {
		return 0
	}
	return float64(kern) / float64(n)
}

// AllKernel reports whether no flow of the workload goes to the relay.
func (k *KernelPlan) AllKernel() bool {
	for i := range k.Entries {
		if k.Entries[i].Relay {
			return false
		}
	}
	return true
}

// AllRelay reports whether every flow but the guard's goes to the relay.
func (k *KernelPlan) AllRelay() bool {
	for i := 1; i < len(k.Entries); i++ {
		if !k.Entries[i].Relay {
			return false
		}
	}
	return true
}

// Plan computes the kernel plan of the workload with these labels and image. Labels and
// image must be the ones the relay hands Decide for the same workload.
func (p *Policy) Plan(labels map[string]string, image string) *KernelPlan {
	k := &KernelPlan{}
	k.Entries = append(k.Entries, KernelEntry{
		Prefixes: slices.Clone(metadata),
		Decision: guardDecision,
		Known:    true,
		Why:      "metadata guard",
	})
	add := func(e KernelEntry) {
		if e.Known && e.Decision.Exit != ExitDirect {
			e.Relay = true
		}
		k.Entries = append(k.Entries, e)
	}
	ruleEntry := func(r *rule, prefixes []netip.Prefix, ports []PortRange, why string) {
		add(KernelEntry{Prefixes: prefixes, Ports: ports, Decision: p.decisionOf(r), Known: true, Why: why})
	}
	relayAll := func(why string) {
		add(KernelEntry{Relay: true, Why: why})
	}
	switch {
	case p.script != nil:
		relayAll("a script decides every flow")
		return k
	case p.pattern:
		p.planPatterns(ruleEntry, add)
		return k
	}
	if i := p.label.lookup(labels, nil); i > 0 {
		k.Whole = true
		ruleEntry(&p.rules[i-1], nil, nil, "label rule decides every flow of the workload")
		return k
	}
	if i := p.image.lookup(image); i > 0 {
		k.Whole = true
		ruleEntry(&p.rules[i-1], nil, nil, "image rule decides every flow of the workload")
		return k
	}
	for _, r := range p.tiered {
		switch r.dim {
		case DimProcess:
			relayAll(fmt.Sprintf("process rule %d can match any flow", r.idx))
			return k
		case DimDomain:
			relayAll(fmt.Sprintf("domain rule %d can match any flow (its name is unknown to the kernel)", r.idx))
			return k
		}
	}
	for _, r := range p.tiered {
		switch m := r.m.(type) {
		case *cidrMatcher:
			ruleEntry(r, m.prefixes, nil, "")
		case *portMatcher:
			ports := make([]PortRange, len(m.ranges))
			for i, pr := range m.ranges {
				ports[i] = PortRange{pr.lo, pr.hi}
			}
			ruleEntry(r, nil, ports, "")
		}
	}
	d := p.defaultDecision()
	add(KernelEntry{Decision: d, Known: true, Why: "default"})
	k.Whole = len(k.Entries) == 2
	return k
}

// planPatterns lays out the pattern form: ordered patterns, the first match wins.
func (p *Policy) planPatterns(ruleEntry func(r *rule, prefixes []netip.Prefix, ports []PortRange, why string), add func(KernelEntry)) {
	for i := range p.rules {
		r := &p.rules[i]
		m := r.m.(*patternMatcher)
		var ports []PortRange
		if m.ports.lo != 0 {
			ports = []PortRange{{m.ports.lo, m.ports.hi}}
		}
		switch {
		case m.glob != "":
			add(KernelEntry{Ports: ports, Relay: true, Why: fmt.Sprintf("host pattern %d can match any address (its name is unknown to the kernel)", r.idx)})
		case m.any:
			ruleEntry(r, nil, ports, "")
		default:
			ruleEntry(r, []netip.Prefix{m.prefix}, ports, "")
		}
		if ports == nil && !m.prefix.IsValid() {
			return // matches every flow: later patterns and the default are unreachable
		}
	}
	add(KernelEntry{Decision: p.defaultDecision(), Known: true, Why: "default"})
}

func (p *Policy) decisionOf(r *rule) Decision {
	if p.pattern {
		return Decision{Exit: r.exit, Rule: r.idx, Dimension: DimPattern, Note: r.note}
	}
	return Decision{Exit: r.exit, Rule: r.idx, Priority: tierPriority(r.dim), Dimension: r.dim, Note: r.note}
}
