package rules

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func sameRules(t *testing.T, src []byte) {
	t.Helper()
	want, werr := parseDoc("x", src, LoadOptions{})
	got, ok := parseChunked("x", src, LoadOptions{})
	if !ok {
		return
	}
	if werr != nil {
		t.Fatalf("chunked parse accepted what the document parse refuses (%v):\n%s", werr, src)
	}
	if len(got.rules) != len(want.rules) || got.def != want.def || got.mode != want.mode || got.pattern != want.pattern {
		t.Fatalf("chunked: %d rules default %s mode %s; document: %d rules default %s mode %s", len(got.rules), got.def, got.mode, len(want.rules), want.def, want.mode)
	}
	for i := range got.rules {
		g, w := got.rules[i], want.rules[i]
		if g.idx != w.idx || g.line != w.line || g.dim != w.dim || g.value != w.value || g.exit != w.exit || g.note != w.note || !reflect.DeepEqual(g.m, w.m) {
			t.Fatalf("rule %d: chunked %+v, document %+v", i+1, g, w)
		}
	}
}

func TestChunkedParse(t *testing.T) {
	defer func(a, b int) { chunkMinBytes, chunkItems = a, b }(chunkMinBytes, chunkItems)
	chunkMinBytes, chunkItems = 0, 3
	var gen strings.Builder
	gen.WriteString("default: direct\nrules:\n")
	fields := []string{"label: \"k%d=v\"", "image: \"r/x%d/*\"", "process: \"p%d|q\"", "domain: \"*.d%d.example\"", "cidr: \"10.%d.0.0/16\"", "port: \"%d\""}
	for i := 1; i <= 50; i++ {
		fmt.Fprintf(&gen, "  - "+fields[i%len(fields)]+"\n    action: proxy\n", i)
	}
	sameRules(t, []byte(gen.String()))
	for _, src := range []string{
		"# head\ndefault: proxy\nrules:\n  # first\n  - domain: a.com\n    action: direct\n    note: |\n      two\n      - lines\n  - port: 443\n    action: proxy\n\n  - cidr: \"10.0.0.0/8\"\n    action: direct\n  - label: x\n    action: deny\nmode: proxy\n",
		"rules:\n- domain: a.com\n  action: direct\n- domain: b.com\n  action: direct\n- domain: c.com\n  action: direct\n- domain: d.com\n  action: direct\ndefault: deny\n",
		"rules:\n  - pattern: a.com\n    route: client\n  - pattern: \"b.com\n  - c\"\n    route: deny\n",
		"rules:\n  - {domain: a.com, action: direct}\n  - domain: b.com\n    action: [direct,\n  - x]\n",
	} {
		sameRules(t, []byte(src))
	}
	// Errors always come from the whole-document parse.
	bad := []byte("rules:\n  - domain: a.com\n    action: direct\n  - domain: b.com\n    action: direct\n  - domain: c.com\n    action: direct\n  - domain: d..com\n    action: direct\n")
	if _, ok := parseChunked("x", bad, LoadOptions{}); ok {
		t.Error("parseChunked accepted a bad rule")
	}
	_, err := parse("x", bad, LoadOptions{})
	if e, ok := err.(*Error); !ok || e.Rule != 4 || e.Line != 8 {
		t.Errorf("parse = %v, want rule 4 line 8", err)
	}
}
