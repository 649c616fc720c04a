package rules

import "testing"

// TestSpecDecisionRecord pins the SPEC §4.1/§4.4/§5 points the other decide tests leave
// implicit: the literal priority of each tier, the note, an exit: name with action: proxy,
// image `?`, process globs, the guard also when a rule would send the flow direct anyway,
// and a label/image/process file order that disagrees with the tiers.
func TestSpecDecisionRecord(t *testing.T) {
	p := mustParse(t, `
default: proxy
rules:
  - port: "80"                     # 1
    action: deny
    note: port rule
  - cidr: "169.254.0.0/16"         # 2: would send the metadata range direct
    action: direct
    note: meta
  - cidr: "198.51.100.0/24"        # 3
    action: cluster
  - domain: "*.corp.example"       # 4
    action: proxy
    exit: egress-b
    note: via b
  - process: "cur?|w*t"            # 5
    action: block
  - image: "ghcr.io/acme/app:?"    # 6
    action: direct
  - label: team                    # 7
    action: deny
`, LoadOptions{})
	tests := []struct {
		name string
		flow Flow
		want Decision
	}{
		{"port", Flow{Dst: ap("192.0.2.1:80")}, Decision{Exit: "deny", Rule: 1, Priority: 600, Dimension: DimPort, Note: "port rule"}},
		{"port whole value", Flow{Dst: ap("192.0.2.1:8080")}, Decision{Exit: "proxy", Priority: 999, Dimension: DimDefault}},
		{"cidr beats port, canonical direct", Flow{Dst: ap("198.51.100.9:80")}, Decision{Exit: "direct", Rule: 3, Priority: 500, Dimension: DimCIDR}},
		{"guard even when a rule says direct", Flow{Dst: ap("169.254.1.1:80")}, Decision{Exit: "direct", Rule: 0, Priority: 0, Dimension: DimGuard, Note: guardDecision.Note}},
		{"guard over label", Flow{Labels: map[string]string{"team": "a"}, Dst: ap("169.254.169.254:80")}, Decision{Exit: "direct", Rule: 0, Priority: 0, Dimension: DimGuard, Note: guardDecision.Note}},
		{"domain named exit", Flow{Host: "git.corp.example", Dst: ap("198.51.100.9:80")}, Decision{Exit: "egress-b", Rule: 4, Priority: 400, Dimension: DimDomain, Note: "via b"}},
		{"domain apex", Flow{Host: "corp.example"}, Decision{Exit: "proxy", Priority: 999, Dimension: DimDefault}},
		{"process ? glob, canonical deny", Flow{Process: Process{Known: true, Comm: "curl"}, Host: "a.corp.example"}, Decision{Exit: "deny", Rule: 5, Priority: 300, Dimension: DimProcess}},
		{"process * glob on exe", Flow{Process: Process{Known: true, Comm: "x", Exe: "wget"}}, Decision{Exit: "deny", Rule: 5, Priority: 300, Dimension: DimProcess}},
		{"process ? is one char", Flow{Process: Process{Known: true, Comm: "curly"}}, Decision{Exit: "proxy", Priority: 999, Dimension: DimDefault}},
		{"image ? one char", Flow{Image: "ghcr.io/acme/app:1", Process: Process{Known: true, Comm: "curl"}}, Decision{Exit: "direct", Rule: 6, Priority: 200, Dimension: DimImage}},
		{"image ? not two", Flow{Image: "ghcr.io/acme/app:12"}, Decision{Exit: "proxy", Priority: 999, Dimension: DimDefault}},
		{"label presence beats image despite file order", Flow{Labels: map[string]string{"team": ""}, Image: "ghcr.io/acme/app:1"}, Decision{Exit: "deny", Rule: 7, Priority: 100, Dimension: DimLabel}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if d := p.Decide(&tt.flow); d != tt.want {
				t.Errorf("Decide = %+v, want %+v", d, tt.want)
			}
		})
	}
}

// TestSpecPatternRecord: pattern rules report priority 0 and the 1-based rule number, the
// guard wins over a pattern routing the metadata range, and `block`/`cluster` are reported
// by their canonical names.
func TestSpecPatternRecord(t *testing.T) {
	p := mustParse(t, `
rules:
  - pattern: "169.254.0.0/16"
    route: client
  - pattern: "[2001:db8::1]:443"
    route: block
  - pattern: "*"
    route: proxy
default: block
`, LoadOptions{})
	tests := []struct {
		name string
		flow Flow
		want Decision
	}{
		{"guard over pattern", Flow{Dst: ap("169.254.169.254:80")}, Decision{Exit: "direct", Rule: 0, Priority: 0, Dimension: DimGuard, Note: guardDecision.Note}},
		{"bracketed v6 with port", Flow{Dst: ap("[2001:db8::1]:443")}, Decision{Exit: "deny", Rule: 2, Dimension: DimPattern}},
		{"v6 other port falls to *", Flow{Dst: ap("[2001:db8::1]:80")}, Decision{Exit: "proxy", Rule: 3, Dimension: DimPattern}},
		{"* matches a name only", Flow{Host: "x.test"}, Decision{Exit: "proxy", Rule: 3, Dimension: DimPattern}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if d := p.Decide(&tt.flow); d != tt.want {
				t.Errorf("Decide = %+v, want %+v", d, tt.want)
			}
		})
	}
	if d := p.Decide(&Flow{}); d.Exit != "deny" || d.Dimension != DimDefault || d.Priority != 999 {
		t.Errorf("nothing known: %+v, want default deny", d)
	}
}
