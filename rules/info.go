package rules

// RuleInfo describes one rule of a loaded policy, for explanations and tools.
type RuleInfo struct {
	Index     int       `json:"rule"`      // 1-based position in the file
	Line      int       `json:"line"`      // line in the file (0 for --egress-route rules)
	Dimension Dimension `json:"dimension"` // the match field's dimension (pattern in the pattern form)
	Priority  int       `json:"priority"`  // the tier (0 in the pattern form)
	Field     string    `json:"field"`     // the match field: label, image, ..., pattern
	Value     string    `json:"value"`     // the match value in canonical form
	Exit      string    `json:"exit"`      // canonical or named exit
	Note      string    `json:"note,omitempty"`
}

// MatchesName reports whether rule i (1-based) matches on the flow's hostname: a domain
// rule, or a pattern whose HOST is a name glob (not `*`, an address or a prefix). A
// decision such a rule made rested on the name.
func (p *Policy) MatchesName(i int) bool {
	switch m := p.rules[i-1].m.(type) {
	case *domainMatcher:
		return true
	case *patternMatcher:
		return m.glob != ""
	}
	return false
}

// Rule describes rule i (1-based). It panics when i is out of range, like an index.
func (p *Policy) Rule(i int) RuleInfo {
	r := &p.rules[i-1]
	return RuleInfo{
		Index:     r.idx,
		Line:      r.line,
		Dimension: r.dim,
		Priority:  tierPriority(r.dim),
		Field:     r.dim.String(),
		Value:     r.m.String(),
		Exit:      r.exit,
		Note:      r.note,
	}
}
