package rules

import (
	"fmt"
	"strings"
	"testing"
)

func TestLint(t *testing.T) {
	tests := []struct {
		name string
		src  string
		o    LintOptions
		want []string // "CODE rule N"
	}{
		{"clean", "default: proxy\nrules:\n  - label: a=b\n    action: direct\n  - cidr: 10.0.0.0/8\n    action: direct\n", LintOptions{}, nil},
		{"order", "rules:\n  - port: 443\n    action: proxy\n  - domain: a.com\n    action: direct\n  - label: x\n    action: deny\n", LintOptions{}, []string{"W_ORDER 2", "W_ORDER 3"}},
		{"shadowed domain by suffix", "rules:\n  - domain: \"*.example.com\"\n    action: proxy\n  - domain: \"a.example.com,*.b.example.com\"\n    action: direct\n", LintOptions{}, []string{"W_SHADOWED 2"}},
		{"apex not shadowed", "rules:\n  - domain: \"*.example.com\"\n    action: proxy\n  - domain: example.com\n    action: direct\n", LintOptions{}, nil},
		{"domain union", "rules:\n  - domain: a.com\n    action: proxy\n  - domain: b.com\n    action: proxy\n  - domain: \"b.com,a.com\"\n    action: direct\n", LintOptions{}, []string{"W_SHADOWED 3"}},
		{"domain star", "rules:\n  - domain: \"*\"\n    action: proxy\n  - domain: \"x*.y\"\n    action: direct\n", LintOptions{}, []string{"W_SHADOWED 2"}},
		{"cidr", "rules:\n  - cidr: 10.0.0.0/8\n    action: proxy\n  - cidr: \"10.1.0.0/16,10.2.3.4\"\n    action: direct\n  - cidr: \"10.0.0.0/7\"\n    action: direct\n", LintOptions{}, []string{"W_SHADOWED 2"}},
		{"ports union", "rules:\n  - port: \"80-90\"\n    action: proxy\n  - port: 443\n    action: proxy\n  - port: \"85,443\"\n    action: direct\n  - port: \"85,444\"\n    action: direct\n", LintOptions{}, []string{"W_SHADOWED 3"}},
		{"ports full range", "rules:\n  - port: \"1-65535\"\n    action: proxy\n  - port: \"8000-9000\"\n    action: direct\n", LintOptions{}, []string{"W_SHADOWED 2"}},
		{"label presence", "rules:\n  - label: team\n    action: proxy\n  - label: team=a\n    action: direct\n  - label: other=a\n    action: direct\n", LintOptions{}, []string{"W_SHADOWED 2"}},
		{"label value does not cover presence", "rules:\n  - label: team=a\n    action: proxy\n  - label: team\n    action: direct\n", LintOptions{}, nil},
		{"process", "rules:\n  - process: \"npm|pip*\"\n    action: proxy\n  - process: \"pip3|npm\"\n    action: direct\n  - process: \"pip|node\"\n    action: direct\n", LintOptions{}, []string{"W_SHADOWED 2"}},
		{"image", "rules:\n  - image: \"docker.io/library/*\"\n    action: proxy\n  - image: nginx\n    action: direct\n  - image: \"nginx:1\"\n    action: direct\n  - image: \"ghcr.io/*\"\n    action: direct\n", LintOptions{}, []string{"W_SHADOWED 2", "W_SHADOWED 3"}},
		{"image same literal", "rules:\n  - image: nginx\n    action: proxy\n  - image: docker.io/library/nginx:latest\n    action: direct\n", LintOptions{}, []string{"W_SHADOWED 2"}},
		{"metadata", "rules:\n  - cidr: \"169.254.169.254\"\n    action: proxy\n  - cidr: \"169.254.0.0/16\"\n    action: direct\n  - cidr: \"0.0.0.0/0\"\n    action: proxy\n", LintOptions{}, []string{"W_METADATA 1", "W_SHADOWED 1", "W_SHADOWED 2", "W_METADATA 3"}},
		{"pattern shadow", "rules:\n  - pattern: \"*.corp.example\"\n    route: client\n  - pattern: \"git.corp.example:22\"\n    route: deny\n  - pattern: \"10.0.0.0/8\"\n    route: cluster\n  - pattern: \"10.1.0.0/16:443\"\n    route: deny\n  - pattern: \"*:443\"\n    route: deny\n  - pattern: \"a.example:443\"\n    route: deny\n  - pattern: \"10.0.0.0/8\"\n    route: deny\n", LintOptions{}, []string{"W_SHADOWED 2", "W_SHADOWED 4", "W_SHADOWED 6", "W_SHADOWED 7"}},
		{"ipv6 metadata", "rules:\n  - cidr: \"fd00:ec2::254\"\n    action: proxy\n  - cidr: \"fd00:ec2::/64\"\n    action: direct\n  - cidr: \"::/0\"\n    action: proxy\n", LintOptions{}, []string{"W_METADATA 1", "W_SHADOWED 1", "W_METADATA 3"}},
		{"pattern metadata", "rules:\n  - pattern: \"169.254.169.254:80\"\n    route: client\n", LintOptions{}, []string{"W_METADATA 1"}},
		{"script inline", "script: |\n  function FindProxyForURL(url, host) {\n    if (dnsDomainIs(host, \".corp.example\")) return \"DIRECT\";\n    return \"PROXY proxy.example:3128\";\n  }\n", LintOptions{}, nil},
		{"script handoff", "script: |\n  function FindProxyForURL(url, host) {\n    if (host.match(/^a+$/)) return \"DIRECT\";\n    return \"PROXY proxy.example:3128\";\n  }\n", LintOptions{}, []string{"W_SCRIPT_HANDOFF 0"}},
		{"detached", "default: client\nrules:\n  - pattern: a.com\n    route: client\n  - pattern: b.com\n    route: deny\n", LintOptions{Detached: true}, []string{"W_CLIENT_DETACHED 0", "W_CLIENT_DETACHED 1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustParse(t, tt.src, LoadOptions{})
			var got []string
			for _, w := range Lint(p, tt.o) {
				got = append(got, fmt.Sprintf("%s %d", w.Code, w.Rule))
				if w.Msg == "" {
					t.Errorf("warning without a message: %+v", w)
				}
			}
			if strings.Join(got, ", ") != strings.Join(tt.want, ", ") {
				t.Errorf("Lint = %v, want %v", got, tt.want)
				for _, w := range Lint(p, tt.o) {
					t.Log(w)
				}
			}
		})
	}
}
