package rules_test

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/rules/rulegen"
)

var sizes = []int{10, 1_000, 10_000, 100_000}

// TestDecideAgreesWithWalk checks the compiled indexes against the plain first-match
// walk over generated files and flows: same decision for every flow.
func TestDecideAgreesWithWalk(t *testing.T) {
	for _, n := range []int{10, 300, 2_000, 8_000} { // 8k: big enough for every key filter
		for seed := uint64(1); seed <= 3; seed++ {
			p, err := rules.Parse("gen", rulegen.File(n, seed), rules.LoadOptions{})
			if err != nil {
				t.Fatalf("generated file of %d rules: %v", n, err)
			}
			hits := 0
			for _, f := range rulegen.Flows(1_000, n, seed) {
				d, w := p.Decide(&f), p.Walk(&f)
				if d != w {
					t.Fatalf("%d rules, seed %d: Decide(%+v) = %+v, walk = %+v", n, seed, f, d, w)
				}
				if f.LabelKeys != nil {
					nokeys := f
					nokeys.LabelKeys = nil
					if d2 := p.Decide(&nokeys); d2 != d {
						t.Fatalf("%d rules, seed %d: Decide(%+v) = %+v with LabelKeys, %+v without", n, seed, f, d, d2)
					}
				}
				if d.Rule > 0 {
					hits++
				}
			}
			if hits == 0 {
				t.Errorf("%d rules, seed %d: no flow hit a rule; the comparison proves nothing", n, seed)
			}
		}
	}
}

// TestPatternDecideAgreesWithWalk does the same for the compiled pattern form.
func TestPatternDecideAgreesWithWalk(t *testing.T) {
	for _, n := range []int{5, 100, 2_000} {
		for seed := uint64(1); seed <= 3; seed++ {
			p, err := rules.Parse("gen", rulegen.PatternFile(n, seed), rules.LoadOptions{})
			if err != nil {
				t.Fatalf("generated pattern file of %d rules: %v", n, err)
			}
			hits := 0
			for _, f := range rulegen.PatternFlows(1_000, n, seed) {
				d, w := p.Decide(&f), p.Walk(&f)
				if d != w {
					t.Fatalf("%d patterns, seed %d: Decide(%+v) = %+v, walk = %+v", n, seed, f, d, w)
				}
				if d.Rule > 0 {
					hits++
				}
			}
			if hits == 0 {
				t.Errorf("%d patterns, seed %d: no flow hit a pattern", n, seed)
			}
		}
	}
}

func TestDecideNoAllocsGenerated(t *testing.T) {
	p, err := rules.Parse("gen", rulegen.File(2_000, 9), rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	flows := rulegen.Flows(200, 2_000, 9)
	i := 0
	if n := testing.AllocsPerRun(1_000, func() {
		p.Decide(&flows[i%len(flows)])
		i++
	}); n != 0 {
		t.Errorf("Decide allocates %v times per call, want 0", n)
	}
}

// BenchmarkDecide compares the compiled policy (engine=index) with the plain
// first-match walk over the same rules (engine=walk) on generated mixed files.
func BenchmarkDecide(b *testing.B) {
	for _, n := range sizes {
		p, err := rules.Parse("gen", rulegen.File(n, 42), rules.LoadOptions{})
		if err != nil {
			b.Fatal(err)
		}
		flows := rulegen.Flows(4096, n, 42)
		for _, engine := range []string{"index", "walk"} {
			if engine == "walk" && n > 10_000 && testing.Short() {
				continue
			}
			b.Run(fmt.Sprintf("rules=%d/engine=%s", n, engine), func(b *testing.B) { benchDecide(b, p, engine, flows) })
		}
	}
}

// benchDecide decides the 4096 flows in turn with the engine named (index or walk).
func benchDecide(b *testing.B, p *rules.Policy, engine string, flows []rules.Flow) {
	decide := p.Decide
	if engine == "walk" {
		decide = p.Walk
	}
	b.ReportAllocs()
	cpu0 := cpuTime()
	i := 0
	for b.Loop() {
		decide(&flows[i&4095])
		i++
	}
	// The machine may be shared: CPU time per decision is less distorted by other
	// processes than the wall-clock ns/op.
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}

// BenchmarkLoad parses and compiles generated files. retained-MiB is the live heap
// after a GC with the last policy still held; the peak during a load is measured by
// the bench harness (tests/bench) from a child process's maximum RSS.
func BenchmarkLoad(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		src := rulegen.File(n, 42)
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(src)))
			var p *rules.Policy
			for b.Loop() {
				var err error
				if p, err = rules.Parse("gen", src, rules.LoadOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			b.ReportMetric(float64(ms.HeapAlloc)/(1<<20), "retained-MiB")
			runtime.KeepAlive(p)
		})
	}
}

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestDecideConcurrent decides from several goroutines at once (run with -race).
func TestDecideConcurrent(t *testing.T) {
	p, err := rules.Parse("gen", rulegen.File(1_000, 5), rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	flows := rulegen.Flows(500, 1_000, 5)
	want := make([]rules.Decision, len(flows))
	for i := range flows {
		want[i] = p.Decide(&flows[i])
	}
	done := make(chan string, 4)
	for g := 0; g < 4; g++ {
		go func() {
			for i := range flows {
				if d := p.Decide(&flows[i]); d != want[i] {
					done <- fmt.Sprintf("flow %d: %+v, want %+v", i, d, want[i])
					return
				}
			}
			done <- ""
		}()
	}
	for g := 0; g < 4; g++ {
		if msg := <-done; msg != "" {
			t.Error(msg)
		}
	}
}

// BenchmarkDecidePattern is BenchmarkDecide for the pattern form.
func BenchmarkDecidePattern(b *testing.B) {
	for _, n := range []int{10, 10_000} {
		p, err := rules.Parse("gen", rulegen.PatternFile(n, 42), rules.LoadOptions{})
		if err != nil {
			b.Fatal(err)
		}
		flows := rulegen.PatternFlows(4096, n, 42)
		for _, engine := range []string{"index", "walk"} {
			b.Run(fmt.Sprintf("rules=%d/engine=%s", n, engine), func(b *testing.B) { benchDecide(b, p, engine, flows) })
		}
	}
}
