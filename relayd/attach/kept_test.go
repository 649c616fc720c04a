package attach

import (
	"slices"
	"testing"
)

// TestKept: the policies an attach side keeps (and the daemon's record of them): the
// last maxKept added, an earlier one never becomes current, and the current one is never
// dropped for an earlier one.
func TestKept(t *testing.T) {
	type add struct {
		h       string
		earlier bool
	}
	tests := []struct {
		name        string
		adds        []add
		wantHashes  []string
		wantCur     string
		wantDropped string // by the last add
	}{
		{"reloads keep the last four", []add{{"a", false}, {"b", false}, {"c", false}, {"d", false}, {"e", false}},
			[]string{"b", "c", "d", "e"}, "e", "a"},
		{"a policy added again stays where it was", []add{{"a", false}, {"b", false}, {"a", false}},
			[]string{"a", "b"}, "a", ""},
		{"an earlier one is kept, not current", []add{{"b", false}, {"a", true}},
			[]string{"b", "a"}, "b", ""},
		{"earlier ones never drop the current one", []add{{"c", false}, {"a", true}, {"b", true}, {"d", true}, {"e", true}},
			[]string{"c", "b", "d", "e"}, "c", "a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var k kept
			var dropped string
			for _, a := range tt.adds {
				dropped = k.add(a.h, a.earlier)
			}
			if !slices.Equal(k.hashes, tt.wantHashes) || k.cur != tt.wantCur || dropped != tt.wantDropped {
				t.Errorf("kept %q current %q dropped %q, want %q %q %q", k.hashes, k.cur, dropped, tt.wantHashes, tt.wantCur, tt.wantDropped)
			}
		})
	}
}
