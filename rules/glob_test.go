package rules

import "testing"

func TestGlobMatch(t *testing.T) {
	tests := []struct {
		name, pattern, s string
		want             bool
	}{
		{"literal", "pip", "pip", true},
		{"whole value", "pip", "pip3", false},
		{"whole value prefix", "pip3", "pip", false},
		{"star any", "*", "anything/at/all", true},
		{"star empty", "*", "", true},
		{"empty pattern", "", "", true},
		{"empty pattern nonempty s", "", "a", false},
		{"star crosses slash", "registry/acme/*", "registry/acme/builder/x:1", true},
		{"star in middle", "a*c", "abbbc", true},
		{"star in middle no", "a*c", "abbbd", false},
		{"question one", "pip?", "pip3", true},
		{"question not zero", "pip?", "pip", false},
		{"question not two", "pip?", "pip33", false},
		{"two stars", "*.*", "a.b", true},
		{"backtrack", "*ab*ab", "xxabyyab", true},
		{"backtrack fail", "*ab*ab", "xxabyyac", false},
		{"suffix domain", "*.example.com", "a.example.com", true},
		{"suffix domain apex", "*.example.com", "example.com", false},
		{"suffix domain deep", "*.example.com", "a.b.example.com", true},
		{"trailing star", "abc*", "abc", true},
		{"many stars", "**a**", "a", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := globMatch(tt.pattern, tt.s); got != tt.want {
				t.Errorf("globMatch(%q, %q) = %v, want %v", tt.pattern, tt.s, got, tt.want)
			}
		})
	}
}

func TestGlobCovers(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"*", "anything*", true},
		{"a*", "ab*", true},
		{"ab*", "a*", false},
		{"*.x", "*.a.x", true},
		{"*.a.x", "*.x", false},
		{"a?c", "a*c", false},
		{"a?c", "abc", true},
		{"*.x", "x", false},
		{"pip", "pip", true},
		{"pip", "pip3", false},
	}
	for _, tt := range tests {
		if got := globCovers(tt.a, tt.b); got != tt.want {
			t.Errorf("globCovers(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
	}
}
