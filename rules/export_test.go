package rules

// Walk exposes the reference first-match walk to the external tests and benchmarks.
func (p *Policy) Walk(f *Flow) Decision { return p.walk(f) }
