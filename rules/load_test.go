package rules

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		o    LoadOptions
		code Code
		rule int
		line int
	}{
		{"empty", "", LoadOptions{}, CodeSyntax, 0, 0},
		{"only comment", "# nothing\n", LoadOptions{}, CodeSyntax, 0, 0},
		{"yaml syntax", "default: direct\nrules:\n  - domain: [\n", LoadOptions{}, CodeSyntax, 0, 3},
		{"top level list", "- a\n", LoadOptions{}, CodeBadValue, 0, 1},
		{"unknown top key", "default: direct\nrulez: []\n", LoadOptions{}, CodeUnknownKey, 0, 2},
		{"duplicate top key", "default: direct\ndefault: proxy\n", LoadOptions{}, CodeSyntax, 0, 2},
		{"two documents", "default: direct\n---\ndefault: proxy\n", LoadOptions{}, CodeSyntax, 0, 2},
		{"bad default", "default: fast\n", LoadOptions{}, CodeBadAction, 0, 1},
		{"default list", "default: [direct]\n", LoadOptions{}, CodeBadValue, 0, 1},
		{"bad mode", "mode: magic\n", LoadOptions{}, CodeBadMode, 0, 1},
		{"rules not list", "rules: {a: b}\n", LoadOptions{}, CodeBadValue, 0, 1},
		{"rule not mapping", "rules:\n  - direct\n", LoadOptions{}, CodeBadValue, 1, 2},
		{"unknown rule key", "rules:\n  - domain: a.com\n    action: proxy\n    prio: 1\n", LoadOptions{}, CodeUnknownKey, 1, 4},
		{"no match", "rules:\n  - domain: a.com\n    action: proxy\n  - action: proxy\n", LoadOptions{}, CodeNoMatch, 2, 4},
		{"multi match", "rules:\n  - domain: a.com\n    cidr: 10.0.0.0/8\n    action: proxy\n", LoadOptions{}, CodeMultiMatch, 1, 3},
		{"mixed forms", "rules:\n  - domain: a.com\n    action: proxy\n  - pattern: b.com\n    route: client\n", LoadOptions{}, CodeMixedForms, 2, 4},
		{"mixed forms other way", "rules:\n  - pattern: b.com\n    route: client\n  - port: 443\n    action: proxy\n", LoadOptions{}, CodeMixedForms, 2, 4},
		{"route in dimension rule", "rules:\n  - domain: a.com\n    route: proxy\n", LoadOptions{}, CodeUnknownKey, 1, 3},
		{"action in pattern rule", "rules:\n  - pattern: a.com\n    action: proxy\n", LoadOptions{}, CodeUnknownKey, 1, 3},
		{"no action", "rules:\n  - domain: a.com\n    note: x\n", LoadOptions{}, CodeBadAction, 1, 2},
		{"bad action", "rules:\n  - domain: a.com\n    action: fast\n", LoadOptions{}, CodeBadAction, 1, 3},
		{"bad route", "rules:\n  - pattern: a.com\n    route: fast\n", LoadOptions{}, CodeBadAction, 1, 3},
		{"gateway off", "rules:\n  - domain: a.com\n    action: gateway\n", LoadOptions{}, CodeGatewayOff, 1, 3},
		{"gateway default off", "default: gateway\n", LoadOptions{}, CodeGatewayOff, 0, 1},
		{"gateway url", "rules:\n  - domain: a.com\n    action: http://gw:3128\n", LoadOptions{AllowGateway: true}, CodeGatewayOff, 1, 3},
		{"gateway key", "default: direct\ngateway: http://gw:3128\n", LoadOptions{AllowGateway: true}, CodeGatewayOff, 0, 2},
		{"gateway rule key", "rules:\n  - domain: a.com\n    action: gateway\n    gateway: http://x\n", LoadOptions{AllowGateway: true}, CodeGatewayOff, 1, 4},
		{"client detached", "rules:\n  - pattern: a.com\n    route: client\n", LoadOptions{Detached: true}, CodeClientDetached, 1, 3},
		{"client default detached", "default: client\n", LoadOptions{Detached: true}, CodeClientDetached, 0, 1},
		{"exit unknown to daemon", "rules:\n  - domain: a.com\n    exit: egress-c\n", LoadOptions{Exits: func(n string) bool { return n == "egress-b" }}, CodeBadExit, 1, 3},
		{"exit with direct", "rules:\n  - domain: a.com\n    action: direct\n    exit: egress-b\n", LoadOptions{}, CodeBadExit, 1, 4},
		{"exit reserved", "rules:\n  - domain: a.com\n    exit: proxy\n", LoadOptions{}, CodeBadExit, 1, 3},
		{"exit bad name", "rules:\n  - domain: a.com\n    exit: Egress B\n", LoadOptions{}, CodeBadExit, 1, 3},
		{"empty label", "rules:\n  - label: \"=x\"\n    action: proxy\n", LoadOptions{}, CodeBadLabel, 1, 2},
		{"label with space", "rules:\n  - label: \"a b=c\"\n    action: proxy\n", LoadOptions{}, CodeBadLabel, 1, 2},
		{"empty image", "rules:\n  - image: \"\"\n    action: proxy\n", LoadOptions{}, CodeBadGlob, 1, 2},
		{"image bad char", "rules:\n  - image: \"ngi nx\"\n    action: proxy\n", LoadOptions{}, CodeBadGlob, 1, 2},
		{"process empty alt", "rules:\n  - process: \"npm||pip\"\n    action: proxy\n", LoadOptions{}, CodeBadGlob, 1, 2},
		{"process path", "rules:\n  - process: \"/usr/bin/npm\"\n    action: proxy\n", LoadOptions{}, CodeBadGlob, 1, 2},
		{"domain leading dot", "rules:\n  - domain: \".example.com\"\n    action: proxy\n", LoadOptions{}, CodeBadGlob, 1, 2},
		{"domain empty entry", "rules:\n  - domain: \"a.com,,b.com\"\n    action: proxy\n", LoadOptions{}, CodeBadGlob, 1, 2},
		{"domain unicode", "rules:\n  - domain: \"bücher.de\"\n    action: proxy\n", LoadOptions{}, CodeBadGlob, 1, 2},
		{"cidr bad", "rules:\n  - cidr: \"10.0.0.0/33\"\n    action: proxy\n", LoadOptions{}, CodeBadCIDR, 1, 2},
		{"cidr not an address", "rules:\n  - cidr: \"example.com\"\n    action: proxy\n", LoadOptions{}, CodeBadCIDR, 1, 2},
		{"port zero", "rules:\n  - port: 0\n    action: proxy\n", LoadOptions{}, CodeBadPort, 1, 2},
		{"port too big", "rules:\n  - port: \"65536\"\n    action: proxy\n", LoadOptions{}, CodeBadPort, 1, 2},
		{"port backwards", "rules:\n  - port: \"9000-8000\"\n    action: proxy\n", LoadOptions{}, CodeBadPort, 1, 2},
		{"port words", "rules:\n  - port: https\n    action: proxy\n", LoadOptions{}, CodeBadPort, 1, 2},
		{"match value list", "rules:\n  - port: [443]\n    action: proxy\n", LoadOptions{}, CodeBadValue, 1, 2},
		{"pattern empty", "rules:\n  - pattern: \"\"\n    route: client\n", LoadOptions{}, CodeBadPattern, 1, 2},
		{"pattern bad port", "rules:\n  - pattern: \"a.com:http\"\n    route: client\n", LoadOptions{}, CodeBadPattern, 1, 2},
		{"pattern bad ip", "rules:\n  - pattern: \"10.0.0.256\"\n    route: client\n", LoadOptions{}, CodeBadPattern, 1, 2},
		{"pattern v6 unbracketed port", "rules:\n  - pattern: \"[2001:db8::1\"\n    route: client\n", LoadOptions{}, CodeBadPattern, 1, 2},
		{"pattern empty host", "rules:\n  - pattern: \":443\"\n    route: client\n", LoadOptions{}, CodeBadPattern, 1, 2},
		{"alias", "x: &a direct\ndefault: *a\n", LoadOptions{}, CodeSyntax, 0, 1},
		{"too large", "default: direct\n#" + strings.Repeat("x", MaxFileBytes), LoadOptions{}, CodeTooLarge, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(tt.src), tt.o)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Parse = %v, want *Error %s", err, tt.code)
			}
			if e.Code != tt.code || e.Rule != tt.rule || e.Line != tt.line {
				t.Errorf("Parse = %v (code %s rule %d line %d), want %s rule %d line %d", e, e.Code, e.Rule, e.Line, tt.code, tt.rule, tt.line)
			}
			if e.Msg == "" {
				t.Errorf("error without a message: %#v", e)
			}
		})
	}
}

func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "missing.yaml"), LoadOptions{}); !isCode(err, CodeUnreadable) {
		t.Errorf("Load(missing) = %v, want %s", err, CodeUnreadable)
	}
	if _, err := Load(dir, LoadOptions{}); !isCode(err, CodeUnreadable) {
		t.Errorf("Load(dir) = %v, want %s", err, CodeUnreadable)
	}
	src := []byte("mode: transparent\ndefault: proxy\nrules:\n  - domain: a.com\n    action: direct\n")
	path := filepath.Join(dir, "r.yaml")
	if err := os.WriteFile(path, src, 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := Load(path, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Mode() != "transparent" || string(p.Source()) != string(src) || len(p.Hash()) != 64 || !p.NeedsHost() || p.NeedsProcess() {
		t.Errorf("Load: mode %q hash %q needsHost %v needsProcess %v", p.Mode(), p.Hash(), p.NeedsHost(), p.NeedsProcess())
	}
	if got := strings.Join(p.Exits(), ","); got != "direct,proxy" {
		t.Errorf("Exits = %s, want direct,proxy", got)
	}
}

func isCode(err error, c Code) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == c
}

func TestNamedExitsAndGateway(t *testing.T) {
	src := "default: proxy\nrules:\n  - label: team=b\n    exit: egress-b\n  - domain: x.test\n    action: proxy\n    exit: egress-c\n  - port: 22\n    action: gateway\n"
	p := mustParse(t, src, LoadOptions{AllowGateway: true, Exits: func(n string) bool { return strings.HasPrefix(n, "egress-") }})
	if d := p.Decide(&Flow{Labels: map[string]string{"team": "b"}}); d.Exit != "egress-b" || d.Rule != 1 {
		t.Errorf("Decide(team=b) = %+v, want egress-b rule 1", d)
	}
	if d := p.Decide(&Flow{Host: "x.test"}); d.Exit != "egress-c" || d.Rule != 2 {
		t.Errorf("Decide(x.test) = %+v, want egress-c rule 2", d)
	}
	if got := strings.Join(p.Exits(), ","); got != "direct,egress-b,egress-c,gateway,proxy" {
		t.Errorf("Exits = %s", got)
	}
}

func TestFromRoutes(t *testing.T) {
	p, err := FromRoutes([]string{"*.corp.example=client", "10.0.0.0/8=cluster", "[2001:db8::1]:443=deny", "b.com=x"}, "deny", LoadOptions{})
	if err == nil || !isCode(err, CodeBadAction) {
		t.Fatalf("FromRoutes with a bad route = %v, %v; want %s", p, err, CodeBadAction)
	}
	if e := err.(*Error); e.Rule != 4 {
		t.Errorf("error names rule %d, want 4", e.Rule)
	}
	p, err = FromRoutes([]string{"*.corp.example=client", "10.0.0.0/8=cluster", "[2001:db8::1]:443=deny"}, "", LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d := p.Decide(&Flow{Host: "a.corp.example"}); d.Exit != "client" || d.Rule != 1 || d.Dimension != DimPattern {
		t.Errorf("Decide = %+v", d)
	}
	if d := p.Decide(&Flow{Dst: ap("[2001:db8::1]:443")}); d.Exit != "deny" || d.Rule != 3 {
		t.Errorf("Decide = %+v", d)
	}
	if d := p.Decide(&Flow{Host: "x.test"}); d.Exit != "direct" || d.Dimension != DimDefault {
		t.Errorf("Decide = %+v", d)
	}
	// The source is an equivalent rules file.
	q, err := Parse("again", p.Source(), LoadOptions{})
	if err != nil || q.Len() != 3 || !q.PatternForm() {
		t.Fatalf("Parse(Source()) = %v, %v", q, err)
	}
	for _, bad := range []struct {
		routes []string
		def    string
		code   Code
	}{
		{[]string{"nopattern"}, "", CodeBadPattern},
		{[]string{"a.com:99999=client"}, "", CodeBadPattern},
		{[]string{"a.com=gateway"}, "", CodeGatewayOff},
		{nil, "sideways", CodeBadAction},
	} {
		if _, err := FromRoutes(bad.routes, bad.def, LoadOptions{}); !isCode(err, bad.code) {
			t.Errorf("FromRoutes(%q, %q) = %v, want %s", bad.routes, bad.def, err, bad.code)
		}
	}
}

// TestNeeds checks what a policy says its decisions can depend on, for the relay.
func TestNeeds(t *testing.T) {
	for _, tc := range []struct {
		src                   string
		host, process, addrOK bool
	}{
		{"rules:\n  - port: 22\n    action: deny\n", false, false, false},
		{"rules:\n  - domain: a.com\n    action: deny\n", true, false, false},
		{"rules:\n  - process: curl\n    action: deny\n", false, true, false},
		{"rules:\n  - cidr: 10.0.0.0/8\n    action: deny\n", false, false, true},
		{"rules:\n  - pattern: \"10.0.0.0/8\"\n    route: deny\n", false, false, true},
		{"rules:\n  - pattern: \"*.a.com\"\n    route: deny\n", true, false, true},
		{"script: |\n  function FindProxyForURL(url, host) { return \"DIRECT\"; }\n", true, false, false},
		{"default: proxy\n", false, false, false},
	} {
		p := mustParse(t, tc.src, LoadOptions{})
		if p.NeedsHost() != tc.host || p.NeedsProcess() != tc.process || p.NeedsAddr() != tc.addrOK {
			t.Errorf("%q: NeedsHost %v NeedsProcess %v NeedsAddr %v, want %v %v %v", tc.src,
				p.NeedsHost(), p.NeedsProcess(), p.NeedsAddr(), tc.host, tc.process, tc.addrOK)
		}
	}
}

// TestIPv4ShapedGlobs: a host that is an IPv4 address is matched by address, never
// by name (splitHost), so a domain or pattern glob made of digits, dots and
// wildcards would load and never match. It is refused, naming the rule and its
// line, and pointing to the prefix that says what was meant; globs for real names
// with digits in them still load.
func TestIPv4ShapedGlobs(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		code      Code
		hint      string // in the message
	}{
		{"domain address", "rules:\n  - domain: \"10.1.2.3\"\n    action: deny\n", CodeBadGlob, "cidr: 10.1.2.3"},
		{"domain address pattern", "rules:\n  - domain: \"10.1.*\"\n    action: deny\n", CodeBadGlob, "cidr: 10.1.0.0/16"},
		{"domain second entry", "rules:\n  - domain: \"a.example, 192.168.?.1\"\n    action: deny\n", CodeBadGlob, "cidr"},
		{"domain address with a dot", "rules:\n  - domain: \"10.1.2.3.\"\n    action: deny\n", CodeBadGlob, "cidr: 10.1.2.3"},
		{"domain suffix", "rules:\n  - domain: \"*.3\"\n    action: deny\n", CodeBadGlob, "cidr"},
		{"pattern address pattern", "rules:\n  - pattern: \"10.1.2.*\"\n    route: block\n", CodeBadPattern, "(10.1.2.0/24)"},
		{"pattern address pattern with a port", "rules:\n  - pattern: \"10.*:443\"\n    route: block\n", CodeBadPattern, "(10.0.0.0/8:443)"},
		{"pattern question marks", "rules:\n  - pattern: \"10.0.0.?\"\n    route: block\n", CodeBadPattern, "prefix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(tc.src), LoadOptions{})
			var e *Error
			if !errors.As(err, &e) || e.Code != tc.code || e.Rule != 1 || e.Line != 2 || !strings.Contains(e.Msg, tc.hint) {
				t.Fatalf("Parse = %v, want %s for rule 1 at line 2 mentioning %q", err, tc.code, tc.hint)
			}
			// The prefix suggested for a pattern is one.
			if p, ok := strings.CutPrefix(tc.hint, "("); ok && tc.code == CodeBadPattern {
				if _, err := parsePattern(strings.TrimSuffix(p, ")")); err != nil {
					t.Errorf("the suggested pattern %s: %v", p, err)
				}
			}
		})
	}
	for _, g := range []string{"*.10.in-addr.arpa", "1password.com", "*.1e100.net", "10-1-2-3.nip.io", "123.example",
		"*", "*.*", "a1.b2.c3", "*.3com.example"} {
		src := "rules:\n  - domain: \"" + g + "\"\n    action: deny\n"
		if _, err := Parse("t.yaml", []byte(src), LoadOptions{}); err != nil {
			t.Errorf("domain %q: %v", g, err)
		}
		src = "rules:\n  - pattern: \"" + g + ":443\"\n    route: block\n"
		if _, err := Parse("t.yaml", []byte(src), LoadOptions{}); err != nil {
			t.Errorf("pattern %q: %v", g, err)
		}
	}
}

// ReadFile refuses a directory, a file over its bound without reading it, and a device
// that never ends once past the bound; it reads a pipe (kl-ctl lint /dev/stdin).
func TestReadFileBounds(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, 4<<30); err != nil { // sparse
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		path string
		code Code
	}{
		{big, CodeTooLarge},
		{"/dev/zero", CodeTooLarge},
		{dir, CodeUnreadable},
		{filepath.Join(dir, "none"), CodeUnreadable},
	} {
		_, err := ReadFile(tt.path, MaxFileBytes)
		var re *Error
		if !errors.As(err, &re) || re.Code != tt.code {
			t.Errorf("ReadFile(%s) = %v, want %s", tt.path, err, tt.code)
		}
	}
	// A pipe is read to its end, as kl-ctl lint /dev/stdin reads what is piped in.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w.WriteString("default: direct\n")
	w.Close()
	if data, err := ReadFile(fmt.Sprintf("/proc/self/fd/%d", r.Fd()), MaxFileBytes); err != nil || string(data) != "default: direct\n" {
		t.Errorf("ReadFile(pipe) = %q, %v; want what was written", data, err)
	}
	// A FIFO nobody writes to reads as empty at once, rather than holding the reader.
	if data, err := ReadFile(fifo, MaxFileBytes); err != nil || len(data) != 0 {
		t.Errorf("ReadFile(fifo without a writer) = %q, %v; want empty", data, err)
	}
}
