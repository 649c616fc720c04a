package rules

import (
	"fmt"
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
