package rules

import (
	"errors"
	"testing"
)

var fuzzFlows = []Flow{
	{},
	{Host: "a.example.com", Dst: ap("10.1.2.3:443"), Labels: map[string]string{"kl.route": "proxy"}, Image: "nginx", Process: Process{Known: true, Comm: "npm", Exe: "node", Argv0: "npm"}},
	{Host: "GIT.corp.example.", Dst: ap("[2001:db8::1]:8080")},
	{Dst: ap("169.254.169.254:80")},
	{Host: "10.0.0.1"},
	{Host: "fd00:ec2::254"},
	{Host: "Fe80::1%eth0", Dst: ap("[2001:db8::1]:443")},
}

// FuzzParse feeds arbitrary files to the loader: it never panics, every refusal is a
// *Error with a reason code, and a policy that loads decides like the reference walk.
func FuzzParse(f *testing.F) {
	f.Add([]byte("default: direct\nrules:\n  - domain: \"*.example.com\"\n    action: proxy\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		func() {
			defer func(a, b int) { chunkMinBytes, chunkItems = a, b }(chunkMinBytes, chunkItems)
			chunkMinBytes, chunkItems = 0, 2
			sameRules(t, data)
		}()
		for _, o := range []LoadOptions{{}, {AllowGateway: true, Detached: true}} {
			p, err := Parse("fuzz.yaml", data, o)
			if err != nil {
				var e *Error
				if !errors.As(err, &e) || e.Code == "" || e.Msg == "" {
					t.Fatalf("Parse error without a reason code: %#v", err)
				}
				continue
			}
			if p.HasScript() {
				continue // scripts are fuzzed in rules/pac
			}
			for i := range fuzzFlows {
				if d, w := p.Decide(&fuzzFlows[i]), p.walk(&fuzzFlows[i]); d != w {
					t.Fatalf("Decide = %+v, walk = %+v", d, w)
				}
			}
			Lint(p, LintOptions{Detached: o.Detached})
		}
	})
}

// FuzzPattern feeds arbitrary HOST[:PORT] patterns to the parser: it never panics,
// refusals carry E_BAD_PATTERN, and an accepted pattern's canonical form parses back to
// the same matcher.
func FuzzPattern(f *testing.F) {
	f.Add("*.corp.example:443")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := parsePattern(s)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Code != CodeBadPattern {
				t.Fatalf("parsePattern(%q) error %#v, want E_BAD_PATTERN", s, err)
			}
			return
		}
		again, err := parsePattern(m.String())
		if err != nil {
			t.Fatalf("parsePattern(%q) = %s, which does not parse again: %v", s, m, err)
		}
		if *again != *m {
			t.Fatalf("parsePattern(%q) = %+v, but its form %q parses to %+v", s, *m, m.String(), *again)
		}
		for i := range fuzzFlows {
			fl := &fuzzFlows[i]
			var hb [maxHostLen + 1]byte
			var ib [maxImageLen]byte
			host, lit := normHost(fl.Host, &hb)
			v := makeView(fl, host, flowAddr(fl, lit), &ib)
			m.Match(&v)
		}
	})
}
