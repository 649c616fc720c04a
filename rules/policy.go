package rules

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/kl-egress/kl/rules/pac"
)

// rule is one entry of `rules`, parsed and validated.
type rule struct {
	idx   int // 1-based position in the file
	line  int
	dim   Dimension
	value string // the match value as written
	m     matcher
	exit  string // canonical or named exit
	note  string
}

// Policy is a loaded, compiled rules file. It is immutable and safe for concurrent use.
type Policy struct {
	name       string
	src        []byte
	hash       string
	mode       string
	def        string
	pattern    bool
	rules      []rule
	script     *pac.Script
	scriptLine int
	opts       LoadOptions

	label   labelIndex
	image   imageIndex
	process processIndex
	domain  domainIndex
	cidr    cidrIndex
	port    portIndex
	pats    patternIndex
	patIdx  bool    // the pattern form is indexed (few distinct port specs)
	tiered  []*rule // all rules in tier order, then file order (the walk's list)

	// What a rule decides, for the indexed path: outID[i] picks rule i+1's entry in
	// outs, the few distinct (exit, note, dimension) of the file, so that a decision
	// reads one byte of a dense array instead of a rule far out in a large file;
	// outID32 takes its place in a file with more than 256 distinct outcomes.
	outs    []ruleOut
	outID   []uint8
	outID32 []uint32

	// What decisions can depend on, found once when the file compiles (the relay asks
	// for every flow): NeedsHost, NeedsProcess, NeedsAddr.
	needsHost, needsProcess, needsAddr bool
}

type ruleOut struct {
	exit, note string
	dim        Dimension
}

// metadata are the cloud instance metadata destinations of the guard (SPEC §4.4), one per
// family: 169.254.0.0/16 and fd00:ec2::254 (AWS's IPv6 metadata address). The kernel
// exempts the same ones from capture (netns.Metadata).
var metadata = []netip.Prefix{netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("fd00:ec2::254/128")}

// metadataNames is how messages name the metadata destinations.
const metadataNames = "169.254.0.0/16 and fd00:ec2::254"

// isMetadata says whether addr is a destination of the metadata guard.
func isMetadata(addr netip.Addr) bool {
	for _, pf := range metadata {
		if pf.Contains(addr) {
			return true
		}
	}
	return false
}

func tierPriority(d Dimension) int {
	switch d {
	case DimLabel:
		return PriorityLabel
	case DimImage:
		return PriorityImage
	case DimProcess:
		return PriorityProcess
	case DimDomain:
		return PriorityDomain
	case DimCIDR:
		return PriorityCIDR
	case DimPort:
		return PriorityPort
	case DimDefault:
		return PriorityDefault
	}
	return 0
}

// tierOrder lists the dimension form's tiers from first tried to last.
var tierOrder = [...]Dimension{DimLabel, DimImage, DimProcess, DimDomain, DimCIDR, DimPort}

func (p *Policy) compile() error {
	p.summarize()
	cidrs := map[netip.Prefix]int32{}
	var ports []rule
	for i := range p.rules {
		r := &p.rules[i]
		idx := int32(r.idx)
		switch m := r.m.(type) {
		case *labelMatcher:
			p.label.add(m, idx)
		case *imageMatcher:
			p.image.add(m, idx)
		case *processMatcher:
			p.process.add(m, idx)
		case *domainMatcher:
			for _, g := range m.globs {
				p.domain.add(g, idx)
			}
		case *cidrMatcher:
			for _, pf := range m.prefixes {
				if _, ok := cidrs[pf]; !ok {
					cidrs[pf] = idx
				}
			}
		case *portMatcher:
			ports = append(ports, *r)
		}
	}
	if p.pattern {
		p.patIdx = p.pats.build(p.rules)
	}
	p.label.seal()
	p.image.seal()
	p.process.seal()
	p.domain.seal()
	p.cidr.build(cidrs)
	p.port.build(ports)
	seen := map[ruleOut]uint32{}
	ids := make([]uint32, len(p.rules))
	for i := range p.rules {
		r := &p.rules[i]
		o := ruleOut{r.exit, r.note, r.dim}
		id, ok := seen[o]
		if !ok {
			id = uint32(len(p.outs))
			p.outs = append(p.outs, o)
			seen[o] = id
		}
		ids[i] = id
	}
	if len(p.outs) <= 256 {
		p.outID = make([]uint8, len(ids))
		for i, id := range ids {
			p.outID[i] = uint8(id)
		}
	} else {
		p.outID32 = ids
	}
	p.tiered = make([]*rule, 0, len(p.rules))
	for i := range p.rules {
		p.tiered = append(p.tiered, &p.rules[i])
	}
	if !p.pattern {
		slices.SortStableFunc(p.tiered, func(a, b *rule) int { return tierPriority(a.dim) - tierPriority(b.dim) })
	}
	return nil
}

// Decide answers which exit a flow takes. For a policy without a script it allocates
// nothing.
func (p *Policy) Decide(f *Flow) Decision {
	host, lit, fold := splitHost(f.Host)
	if fold {
		// Only here does a decision need a buffer on its stack.
		var hb [maxHostLen + 1]byte
		return p.decide(f, foldHost(host, &hb), lit)
	}
	return p.decide(f, host, lit)
}

func (p *Policy) decide(f *Flow, host string, lit netip.Addr) Decision {
	addr := flowAddr(f, lit)
	if isMetadata(addr) {
		return guardDecision
	}
	if p.script != nil {
		return p.decideScript(f, host, addr, f.Dst.Port())
	}
	if p.patIdx {
		if i := p.pats.lookup(host, addr, f.Dst.Port()); i > 0 {
			r := &p.rules[i-1]
			return Decision{Exit: r.exit, Rule: r.idx, Dimension: DimPattern, Note: r.note}
		}
		return p.defaultDecision()
	}
	if p.pattern {
		v := view{host: host, addr: addr, port: f.Dst.Port()}
		for i := range p.rules {
			if r := &p.rules[i]; r.m.(*patternMatcher).Match(&v) {
				return Decision{Exit: r.exit, Rule: r.idx, Dimension: DimPattern, Note: r.note}
			}
		}
		return p.defaultDecision()
	}
	if i := p.label.lookup(f.Labels, f.LabelKeys); i > 0 {
		return p.tierDecision(i, PriorityLabel)
	}
	if i := p.image.lookup(f.Image); i > 0 {
		return p.tierDecision(i, PriorityImage)
	}
	if i := p.process.lookup(&f.Process); i > 0 {
		return p.tierDecision(i, PriorityProcess)
	}
	if i := p.domain.lookup(host); i > 0 {
		return p.tierDecision(i, PriorityDomain)
	}
	if i := p.cidr.lookup(addr); i > 0 {
		return p.tierDecision(i, PriorityCIDR)
	}
	if i := p.port.lookup(f.Dst.Port()); i > 0 {
		return p.tierDecision(i, PriorityPort)
	}
	return p.defaultDecision()
}

// tierDecision is ruleDecision for a rule of a tier the caller knows.
func (p *Policy) tierDecision(idx int32, prio int) Decision {
	var o *ruleOut
	if p.outID32 == nil {
		o = &p.outs[p.outID[idx-1]]
	} else {
		o = &p.outs[p.outID32[idx-1]]
	}
	return Decision{Exit: o.exit, Rule: int(idx), Priority: prio, Dimension: o.dim, Note: o.note}
}

var guardDecision = Decision{Exit: ExitDirect, Dimension: DimGuard, Note: "metadata guard: " + metadataNames + " always go direct"}

func (p *Policy) ruleDecision(idx int32) Decision {
	r := &p.rules[idx-1]
	return Decision{Exit: r.exit, Rule: r.idx, Priority: tierPriority(r.dim), Dimension: r.dim, Note: r.note}
}

func (p *Policy) defaultDecision() Decision {
	return Decision{Exit: p.def, Priority: PriorityDefault, Dimension: DimDefault}
}

// decideScript runs the script. vhost may point into Decide's stack buffer, so it is
// copied before it can reach the script.
func (p *Policy) decideScript(f *Flow, vhost string, addr netip.Addr, port uint16) Decision {
	var host string
	switch {
	case vhost != "":
		host = strings.Clone(vhost)
	case addr.IsValid():
		host = addr.String()
	}
	res := p.script.Eval(pac.Call{Host: host, Port: port, Dst: addr, MyIP: f.Src, At: f.At, Seed: f.ID})
	d := Decision{Exit: res.Exit, Dimension: DimScript, Directive: res.Directive, Proxy: res.Proxy, Reason: res.Reason}
	switch {
	case res.Failed:
		d.Exit = ExitDeny
	case res.Exit == "":
		d.Exit = p.def
	}
	switch {
	case d.Exit == ExitGateway && !p.opts.AllowGateway:
		d.Exit, d.Reason = ExitDeny, "script chose gateway, which is off on this node (KL_EGRESS_GATEWAY=1 enables it)"
	case d.Exit == ExitClient && p.opts.Detached:
		d.Exit, d.Reason = ExitDeny, "script chose client in a policy for detached use"
	}
	return d
}

// walk is the reference decision: a plain first-match walk over the rules in tier
// order, the way a rule list is matched without indexes. Decide must agree with it
// on every flow; the benchmarks compare the two.
func (p *Policy) walk(f *Flow) Decision {
	var hb [maxHostLen + 1]byte
	var ib [maxImageLen]byte
	host, lit := normHost(f.Host, &hb)
	addr := flowAddr(f, lit)
	if isMetadata(addr) {
		return guardDecision
	}
	if p.script != nil {
		return p.decideScript(f, host, addr, f.Dst.Port())
	}
	v := makeView(f, host, addr, &ib)
	for _, r := range p.tiered {
		if matchRule(r, &v) {
			if p.pattern {
				return Decision{Exit: r.exit, Rule: r.idx, Dimension: DimPattern, Note: r.note}
			}
			return p.ruleDecision(int32(r.idx))
		}
	}
	return p.defaultDecision()
}

// Matches lists every rule (1-based) whose match field matches the flow, in file order,
// regardless of tiers and of which one wins. `kl-ctl explain` uses it to show the rules
// that matched but lost. A script policy matches no rules.
func (p *Policy) Matches(f *Flow) []int {
	if p.script != nil {
		return nil
	}
	var hb [maxHostLen + 1]byte
	var ib [maxImageLen]byte
	host, lit := normHost(f.Host, &hb)
	v := makeView(f, host, flowAddr(f, lit), &ib)
	var out []int
	for i := range p.rules {
		if matchRule(&p.rules[i], &v) {
			out = append(out, p.rules[i].idx)
		}
	}
	return out
}

// summarize records what decisions can depend on.
func (p *Policy) summarize() {
	p.needsHost = p.script != nil
	// A script that can call dnsResolve and the built-ins that answer from it decides
	// a name on the address the name resolves to: without a lookup, proxy mode (which
	// knows only the name) would decide otherwise than transparent mode.
	p.needsAddr = p.pattern || p.script != nil && p.script.NeedsAddr()
	// The metadata guard (SPEC §4.4) decides on the address. A flow known only by name
	// that the gateway could take would be dialed from the node's own network, where
	// 169.254.169.254 is the node's metadata service: the name must be resolved here and
	// the guard must see it (the gateway also refuses such addresses when it dials). Every
	// other exit dials from the workload's netns (direct) or from another machine
	// (upstream, attach side), which resolves the name itself, perhaps through a network
	// only it reaches (a VPN): resolving there on the node would refuse names it alone
	// knows, so those need no lookup.
	for _, e := range p.Exits() {
		if e == ExitGateway {
			p.needsAddr = true
		}
	}
	for i := range p.rules {
		switch m := p.rules[i].m.(type) {
		case *domainMatcher:
			p.needsHost = true
		case *patternMatcher:
			if m.glob != "" {
				p.needsHost = true
			}
		case *processMatcher:
			p.needsProcess = p.script == nil
		case *cidrMatcher:
			p.needsAddr = true
		}
	}
}

// NeedsHost reports whether decisions can depend on the destination hostname: domain
// rules, host patterns or a script.
func (p *Policy) NeedsHost() bool { return p.needsHost }

// NeedsProcess reports whether the policy has process rules.
func (p *Policy) NeedsProcess() bool { return p.needsProcess }

// NeedsAddr reports whether a decision for a hostname-only flow could depend on the
// address the name resolves to: the policy has cidr rules, is in the pattern form
// (patterns may hold prefixes), has a script that can call dnsResolve or a built-in
// that resolves through it (pac.Script.NeedsAddr), or can choose the gateway (the
// metadata guard must see the address before a flow leaves through the node's
// network; see summarize).
func (p *Policy) NeedsAddr() bool { return p.needsAddr }

// Hash is the hex sha256 of the source bytes.
func (p *Policy) Hash() string { return p.hash }

// Mode is the file's `mode:` ("" when absent).
func (p *Policy) Mode() string { return p.mode }

// Source returns the exact bytes the policy was loaded from.
func (p *Policy) Source() []byte { return p.src }

// Name is the path or name the policy was loaded under.
func (p *Policy) Name() string { return p.name }

// Default is the exit of flows no rule matches.
func (p *Policy) Default() string { return p.def }

// HasScript reports whether a PAC script decides instead of the rules.
func (p *Policy) HasScript() bool { return p.script != nil }

// ScriptPath is how the script's calls run (pac.PathInline or pac.PathHandoff) and, for
// the hand-off path, the first construct that kept it off the inline one; "" without a
// script.
func (p *Policy) ScriptPath() (path, why string) {
	if p.script == nil {
		return "", ""
	}
	return p.script.Path()
}

// PatternForm reports whether the rules are in the pattern form.
func (p *Policy) PatternForm() bool { return p.pattern }

// Len is the number of rules.
func (p *Policy) Len() int { return len(p.rules) }

// Exits lists, sorted, every exit the policy can choose: the default, every rule's exit,
// direct (the metadata guard) and, for a script, every route a script can return.
func (p *Policy) Exits() []string {
	set := map[string]bool{ExitDirect: true, p.def: true}
	for i := range p.rules {
		if p.script == nil {
			set[p.rules[i].exit] = true
		}
	}
	if p.script != nil {
		set[ExitDeny] = true
		if !p.opts.Detached {
			set[ExitClient] = true
		}
		if p.opts.AllowGateway {
			set[ExitGateway] = true
		}
	}
	out := make([]string, 0, len(set))
	for e := range set {
		out = append(out, e)
	}
	slices.Sort(out)
	return out
}

// matchRule calls the rule's matcher through its concrete type, so that the view (and
// the buffers it points into) stays on the caller's stack.
func matchRule(r *rule, v *view) bool {
	switch m := r.m.(type) {
	case *labelMatcher:
		return m.Match(v)
	case *imageMatcher:
		return m.Match(v)
	case *processMatcher:
		return m.Match(v)
	case *domainMatcher:
		return m.Match(v)
	case *cidrMatcher:
		return m.Match(v)
	case *portMatcher:
		return m.Match(v)
	case *patternMatcher:
		return m.Match(v)
	}
	return false
}
