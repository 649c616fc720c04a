package main

import (
	"testing"
	"time"
)

func TestParseGoBench(t *testing.T) {
	out := []byte(`goos: linux
BenchmarkDecide/rules=10/engine=index-2         	12345678	        95.3 ns/op	       0 B/op	       0 allocs/op
BenchmarkLoad-2   	       3	 412345678 ns/op	       95.5 peak-MiB	123 B/op	 4 allocs/op
PASS
`)
	got := parseGoBench(out)
	if len(got) != 2 {
		t.Fatalf("parseGoBench: %d results, want 2: %+v", len(got), got)
	}
	if g := got[0]; g.Name != "Decide/rules=10/engine=index" || g.N != 12345678 || g.NsOp != 95.3 || g.Allocs != 0 {
		t.Errorf("first result = %+v", g)
	}
	if g := got[1]; g.Name != "Load" || g.Metrics["peak-MiB"] != 95.5 || g.Allocs != 4 || g.BOp != 123 {
		t.Errorf("second result = %+v", g)
	}
}

func TestMarkdownTable(t *testing.T) {
	rows := []Row{
		{Name: "a", Cols: []Col{{"x", "1"}, {"y", "2"}}},
		{Name: "b", Cols: []Col{{"y", "3"}, {"z", "4"}}},
	}
	want := "| | x | y | z |\n|---|---:|---:|---:|\n| a | 1 | 2 |  |\n| b |  | 3 | 4 |\n"
	if got := markdownTable(rows); got != want {
		t.Errorf("markdownTable =\n%s\nwant\n%s", got, want)
	}
}

func TestCapacity(t *testing.T) {
	us := time.Microsecond
	for _, c := range []struct {
		relay, up, alone time.Duration
		want             string
	}{
		{124 * us, 168 * us, 154 * us, "1.35x: the upstream"},
		{250 * us, 200 * us, 0, "0.80x: the relay"},
		{120 * us, 0, 164 * us, "1.37x: the upstream (upstream alone's CPU/conn)"},
		{120 * us, 0, 0, ""}, // no upstream figure at all
		{0, 168 * us, 154 * us, ""},
	} {
		if got := capacity(c.relay, c.up, c.alone); got != c.want {
			t.Errorf("capacity(%v, %v, %v) = %q, want %q", c.relay, c.up, c.alone, got, c.want)
		}
	}
}
