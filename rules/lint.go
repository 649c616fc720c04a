package rules

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/gaissmai/bart"

	"github.com/kl-egress/kl/rules/pac"
)

// Warning codes of Lint. Like reason codes they are stable and documented in
// docs/reason-codes.md.
const (
	WarnShadowed       = "W_SHADOWED"        // a rule that can never win
	WarnOrder          = "W_ORDER"           // file order disagrees with the tier order
	WarnMetadata       = "W_METADATA"        // a rule tries to send a metadata address elsewhere than direct
	WarnClientDetached = "W_CLIENT_DETACHED" // client in a policy for detached use
	WarnScriptRules    = "W_SCRIPT_RULES"    // rules next to a script, which replaces them
	WarnScriptHandoff  = "W_SCRIPT_HANDOFF"  // the script cannot run inline (slower, still exact)
)

// Warning is something legal but probably wrong in a policy.
type Warning struct {
	Code string `json:"code"`
	Rule int    `json:"rule"` // 1-based; 0 when not about one rule
	Line int    `json:"line"`
	Msg  string `json:"message"`
}

func (w Warning) String() string {
	s := w.Code + ": "
	if w.Rule > 0 {
		s += fmt.Sprintf("rule %d: ", w.Rule)
	}
	s += w.Msg
	if w.Line > 0 {
		s += fmt.Sprintf(" (line %d)", w.Line)
	}
	return s
}

// LintOptions say how the policy is meant to be used.
type LintOptions struct {
	Detached bool // report every use of client (a detached policy cannot use it)
}

// maxPairwise bounds the pattern form's pairwise shadow check; beyond it only exact
// duplicates are reported.
const maxPairwise = 5000

// Lint reports what is legal but probably wrong in a loaded policy, in rule order.
func Lint(p *Policy, o LintOptions) []Warning {
	var ws []Warning
	add := func(code string, r *rule, format string, a ...any) {
		w := Warning{Code: code, Msg: fmt.Sprintf(format, a...)}
		if r != nil {
			w.Rule, w.Line = r.idx, r.line
		}
		ws = append(ws, w)
	}
	if p.script != nil {
		if len(p.rules) > 0 {
			ws = append(ws, Warning{Code: WarnScriptRules, Line: p.scriptLine, Msg: fmt.Sprintf("the script decides every flow; the %d rules are never used", len(p.rules))})
		}
		if o.Detached {
			ws = append(ws, Warning{Code: WarnClientDetached, Line: p.scriptLine, Msg: "a script that returns client in a detached policy has its flows denied"})
		}
		if path, why := p.script.Path(); path == pac.PathHandoff {
			ws = append(ws, Warning{Code: WarnScriptHandoff, Line: p.scriptLine, Msg: "the script runs handed off to its own runtime, slower than inline: " + why})
		}
		return ws
	}
	if o.Detached && p.def == ExitClient {
		ws = append(ws, Warning{Code: WarnClientDetached, Msg: "default: client needs a live attach session; a detached policy cannot use it"})
	}
	shadow := newShadowCheck()
	var pats []*rule
	patSeen := map[string]int{}
	latest := -1 // index into p.rules of the earliest rule with the highest tier so far
	for i := range p.rules {
		r := &p.rules[i]
		if o.Detached && r.exit == ExitClient {
			add(WarnClientDetached, r, "client needs a live attach session; a detached policy cannot use it")
		}
		if r.exit != ExitDirect && touchesMetadata(r) {
			add(WarnMetadata, r, "sends addresses in %s to %s, but the metadata guard always sends them direct", metadataNames, r.exit)
		}
		if p.pattern {
			key := r.m.String()
			if j, dup := patSeen[key]; dup {
				add(WarnShadowed, r, "never wins: rule %d has the same pattern %q", j, key)
			} else if len(p.rules) <= maxPairwise {
				m := r.m.(*patternMatcher)
				for _, q := range pats {
					if q.m.(*patternMatcher).covers(m) {
						add(WarnShadowed, r, "never wins: rule %d (%s) matches everything it matches and comes first", q.idx, q.m.String())
						break
					}
				}
			}
			if _, dup := patSeen[key]; !dup {
				patSeen[key] = r.idx
			}
			pats = append(pats, r)
			continue
		}
		if latest >= 0 && tierPriority(p.rules[latest].dim) > tierPriority(r.dim) {
			q := &p.rules[latest]
			add(WarnOrder, r, "comes after rule %d (%s, tier %d) in the file but is tried first: its %s tier (%d) is tried before %s (%d)",
				q.idx, q.dim, tierPriority(q.dim), r.dim, tierPriority(r.dim), q.dim, tierPriority(q.dim))
		}
		if latest < 0 || tierPriority(r.dim) > tierPriority(p.rules[latest].dim) {
			latest = i
		}
		if by, why := shadow.check(r); why != "" {
			if by > 0 {
				add(WarnShadowed, r, "never wins: %s (rule %d comes first in the %s tier)", why, by, r.dim)
			} else {
				add(WarnShadowed, r, "never wins: %s", why)
			}
		}
		shadow.add(r)
	}
	return ws
}

func touchesMetadata(r *rule) bool {
	switch m := r.m.(type) {
	case *cidrMatcher:
		return slices.ContainsFunc(m.prefixes, overlapsMetadata)
	case *patternMatcher:
		return m.prefix.IsValid() && overlapsMetadata(m.prefix)
	}
	return false
}

func overlapsMetadata(pf netip.Prefix) bool {
	return slices.ContainsFunc(metadata, pf.Overlaps)
}

// inMetadata says whether every address of pf is a destination of the metadata guard.
func inMetadata(pf netip.Prefix) bool {
	return slices.ContainsFunc(metadata, func(m netip.Prefix) bool { return m.Bits() <= pf.Bits() && m.Contains(pf.Addr()) })
}

// shadowCheck holds the rules seen so far, per tier, in forms that answer "is this new
// rule covered by the earlier ones" without comparing every pair.
type shadowCheck struct {
	labels  labelIndex
	images  imageIndex
	imgSame map[string]int // image globs as written
	procs   processIndex
	domains domainIndex
	glob    map[string]int // process and domain globs as written, by dimension prefix
	pure    []globRule     // "*", "P*" and "*S" globs (process and domain, prefixed)
	cidrs   *bart.Table[int32]
	ports   [1024]uint64
	portBy  *[65536]int32
}

func newShadowCheck() *shadowCheck {
	return &shadowCheck{imgSame: map[string]int{}, glob: map[string]int{}, cidrs: new(bart.Table[int32])}
}

func isPure(g string) bool {
	i := strings.IndexAny(g, "*?")
	j := strings.LastIndexAny(g, "*?")
	return i == j && g[i] == '*' && (i == 0 || i == len(g)-1)
}

// globCovered reports which earlier rule (of the dimension with prefix dp) covers glob
// g; find answers for a wildcard-free g from the dimension's index.
func (s *shadowCheck) globCovered(dp, g string, find func(string) int32) int {
	if !hasWild(g) {
		if i := find(g); i != none {
			return int(i)
		}
		return 0
	}
	if i, ok := s.glob[dp+g]; ok {
		return i
	}
	for _, pg := range s.pure {
		if strings.HasPrefix(pg.glob, dp) && globCovers(pg.glob[len(dp):], g) {
			return int(pg.idx)
		}
	}
	if dp == "d:" {
		// `*.S` covers any glob whose literal tail ends in `.S`.
		tail := literalSuffix(g)
		for j := 0; j < len(tail); j++ {
			if tail[j] == '.' {
				if e := s.domains.suffixes[tail[j+1:]]; e != nil && e.wild != none {
					return int(e.wild)
				}
			}
		}
	}
	return 0
}

func (s *shadowCheck) check(r *rule) (by int, why string) {
	switch m := r.m.(type) {
	case *labelMatcher:
		if e := s.labels.keys[m.key]; e != nil {
			if e.presence != none {
				return int(e.presence), fmt.Sprintf("label %q is present whenever %q matches", m.key, m.String())
			}
			if i, ok := e.values[m.val]; ok && !m.presence {
				return int(i), "the same label selector"
			}
		}
	case *imageMatcher:
		if m.norm != "" {
			if s.images.exact != nil {
				if i := s.images.find(m.norm); i != none {
					return int(i), fmt.Sprintf("an earlier image rule matches %s", m.norm)
				}
			}
		} else if i, ok := s.imgSame[m.glob]; ok {
			return i, "the same image glob"
		} else {
			for _, pg := range s.pure {
				if strings.HasPrefix(pg.glob, "i:") && globCovers(pg.glob[2:], m.glob) {
					return int(pg.idx), fmt.Sprintf("%q covers %q", pg.glob[2:], m.glob)
				}
			}
		}
	case *processMatcher:
		last := 0
		for _, a := range m.alts {
			i := s.globCovered("p:", a, func(n string) int32 {
				if s.procs.exact == nil {
					return none
				}
				best := none
				if j, ok := s.procs.exact[n]; ok {
					best = j
				}
				return s.procs.globs.first(n, best)
			})
			if i == 0 {
				return 0, ""
			}
			last = max(last, i)
		}
		return last, "every name it lists is matched by an earlier process rule"
	case *domainMatcher:
		last := 0
		for _, g := range m.globs {
			i := s.globCovered("d:", g, func(n string) int32 {
				if i := s.domains.lookup(n); i > 0 {
					return i
				}
				return none
			})
			if i == 0 {
				return 0, ""
			}
			last = max(last, i)
		}
		return last, "every name it matches is matched by an earlier domain rule"
	case *cidrMatcher:
		last, inGuard := 0, true
		for _, pf := range m.prefixes {
			if !inMetadata(pf) {
				inGuard = false
			}
		}
		if inGuard {
			if r.exit == ExitDirect {
				return 0, "all its addresses are in " + metadataNames + ", which the metadata guard sends direct before any rule (harmless: so would this rule)"
			}
			return 0, "all its addresses are in " + metadataNames + ", which the metadata guard always sends direct"
		}
		for _, pf := range m.prefixes {
			_, i, ok := s.cidrs.LookupPrefixLPM(pf)
			if !ok {
				return 0, ""
			}
			last = max(last, int(i))
		}
		return last, "every address it lists is in an earlier cidr rule"
	case *portMatcher:
		if s.portBy == nil {
			return 0, ""
		}
		last := 0
		for _, pr := range m.ranges {
			for p := int(pr.lo); p <= int(pr.hi); p++ {
				if p%64 == 0 && p+63 <= int(pr.hi) && s.ports[p/64] == ^uint64(0) {
					last = max(last, int(s.portBy[p]))
					p += 63
					continue
				}
				if s.ports[p/64]&(1<<(p%64)) == 0 {
					return 0, ""
				}
				last = max(last, int(s.portBy[p]))
			}
		}
		return last, "every port it lists is in an earlier port rule"
	}
	return 0, ""
}

func (s *shadowCheck) add(r *rule) {
	idx := int32(r.idx)
	switch m := r.m.(type) {
	case *labelMatcher:
		s.labels.add(m, idx)
	case *imageMatcher:
		s.images.add(m, idx)
		if m.norm == "" {
			if _, ok := s.imgSame[m.glob]; !ok {
				s.imgSame[m.glob] = r.idx
			}
			if isPure(m.glob) {
				s.pure = append(s.pure, globRule{"i:" + m.glob, idx})
			}
		}
	case *processMatcher:
		s.procs.add(m, idx)
		for _, a := range m.alts {
			s.addGlob("p:", a, idx)
		}
	case *domainMatcher:
		for _, g := range m.globs {
			s.domains.add(g, idx)
			s.addGlob("d:", g, idx)
		}
	case *cidrMatcher:
		for _, pf := range m.prefixes {
			if _, ok := s.cidrs.Get(pf); !ok {
				s.cidrs.Insert(pf, idx)
			}
		}
	case *portMatcher:
		if s.portBy == nil {
			s.portBy = new([65536]int32)
		}
		for _, pr := range m.ranges {
			for p := int(pr.lo); p <= int(pr.hi); p++ {
				if p%64 == 0 && s.ports[p/64] == ^uint64(0) {
					p += 63
					continue
				}
				if s.ports[p/64]&(1<<(p%64)) == 0 {
					s.ports[p/64] |= 1 << (p % 64)
					s.portBy[p] = idx
				}
			}
		}
	}
}

func (s *shadowCheck) addGlob(dp, g string, idx int32) {
	if !hasWild(g) {
		return
	}
	if _, ok := s.glob[dp+g]; !ok {
		s.glob[dp+g] = int(idx)
	}
	if isPure(g) {
		s.pure = append(s.pure, globRule{dp + g, idx})
	}
}
