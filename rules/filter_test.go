package rules

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestKeyFilter(t *testing.T) {
	keys := map[string]int{}
	for i := 0; i < 5000; i++ {
		keys[fmt.Sprintf("host%d.example", i)] = i
	}
	f := filterKeys(keys)
	for k := range keys {
		if !f.maybe(k) {
			t.Fatalf("filter says %q is not a key", k)
		}
	}
	fp := 0
	for i := 0; i < 10000; i++ {
		if f.maybe(fmt.Sprintf("other%d.example", i)) {
			fp++
		}
	}
	if fp > 1000 {
		t.Errorf("%d of 10000 non-keys pass the filter; it filters almost nothing", fp)
	}
	small := filterKeys(map[string]int{"a": 1})
	if !small.maybe("a") || !small.maybe("b") {
		t.Error("a filter over few keys must pass everything")
	}
}

// TestKeyFilterLengths: a string of a length no key has is refused, by small filters
// (no bits) too, and the zero filter refuses nothing.
func TestKeyFilterLengths(t *testing.T) {
	for _, n := range []int{3, 2_000} {
		keys := map[string]int{}
		for i := 0; i < n; i++ {
			keys[fmt.Sprintf("k%05d", i)] = i
		}
		f := filterKeys(keys)
		if !f.maybe("k00001") {
			t.Errorf("%d keys: a key is refused", n)
		}
		if f.maybe("k0001") || f.maybe("") || f.maybe(strings.Repeat("k", 100)) {
			t.Errorf("%d keys: a string of a length no key has passes", n)
		}
	}
	var zero keyFilter
	if !zero.maybe("") || !zero.maybe("anything") {
		t.Error("the zero filter must pass everything")
	}
}

// TestGlobSetFirst compares globSet.first (sampled lengths, filter, buckets, trie)
// with a plain walk over the same globs, sealed and unsealed (lint uses it unsealed).
func TestGlobSetFirst(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	word := func() string {
		parts := []string{"reg", "istry", ".example", "/team", "/", "-", "tool", "ab", "x"}
		var b strings.Builder
		for k := r.IntN(5); k >= 0; k-- {
			b.WriteString(parts[r.IntN(len(parts))])
			if r.IntN(3) == 0 {
				fmt.Fprint(&b, r.IntN(30))
			}
		}
		return b.String()
	}
	for _, tc := range []struct {
		n   int
		two bool // every literal prefix and value starts with one of a few two-byte leads
	}{{5, false}, {300, false}, {3_000, false}, {300, true}, {3_000, true}} {
		n := tc.n
		lead := func(opts ...string) string {
			if !tc.two {
				return ""
			}
			return opts[r.IntN(len(opts))]
		}
		var sealed, open globSet
		var all []globRule
		for i := 1; i <= n; i++ {
			g := lead("re", "to", "gh") + word() + []string{"*", "?", "*-builder:*", "*x"}[r.IntN(4)]
			if r.IntN(20) == 0 {
				g = strings.Repeat("long/", 14) + g // a literal prefix of 64 bytes or more
			}
			sealed.add(g, int32(i))
			open.add(g, int32(i))
			all = append(all, globRule{g, int32(i)})
		}
		sealed.seal()
		hits := 0
		for k := 0; k < 3_000; k++ {
			s := lead("re", "pr", "to", "sh") + word() + word()
			if r.IntN(20) == 0 {
				s = strings.Repeat("long/", 14) + s
			}
			want := firstGlob(all, s, none)
			if got := sealed.first(s, none); got != want {
				t.Fatalf("%+v: sealed first(%q) = %d, want %d", tc, s, got, want)
			}
			if got := open.first(s, none); got != want {
				t.Fatalf("%+v: unsealed first(%q) = %d, want %d", tc, s, got, want)
			}
			if want != none {
				hits++
			}
		}
		if hits == 0 {
			t.Errorf("%+v: no value matched a glob; the comparison proves nothing", tc)
		}
	}
}
