package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/rules/rulegen"
)

func init() {
	register(Section{
		Name: "rules",
		Doc: "Rule engine. `BenchmarkDecide` (package rules) decides generated mixed flows against generated " +
			"dimension-form files of every tier (10, 1k, 10k, 100k rules) with the compiled per-dimension " +
			"indexes, side by side with a plain first-match walk over the same rules in tier order (how a " +
			"rule list is matched without indexes). ns/op is wall clock; cpu-ns/op is the process's CPU time " +
			"per decision, less distorted when other processes share the machine. Targets: at 10k rules <= 250 ns and 0 allocs per " +
			"decision and >= 40x faster than the walk; at 100k rules at most 3x slower than at 10. " +
			"Load: parse and compile a 100k-rule file in a fresh process; targets <= 1 s and <= 150 MB peak " +
			"(whole-process maximum RSS, Go runtime included).",
		Run: runRulesBench,
	})
	children["rules-load"] = loadChild
}

func runRulesBench(ctx context.Context) ([]Row, error) {
	res, err := goBench(ctx, "./rules", "^BenchmarkDecide(Pattern)?$", "-benchtime=1s")
	if err != nil {
		return nil, err
	}
	byName := map[string]GoBench{}
	for _, r := range res {
		byName[r.Name] = r
	}
	base := byName["Decide/rules=10/engine=index"].NsOp
	baseCPU := byName["Decide/rules=10/engine=index"].Metrics["cpu-ns/op"]
	var rows []Row
	for _, n := range []int{10, 1_000, 10_000, 100_000} {
		idx, ok := byName[fmt.Sprintf("Decide/rules=%d/engine=index", n)]
		if !ok {
			continue
		}
		walk := byName[fmt.Sprintf("Decide/rules=%d/engine=walk", n)]
		rows = append(rows, Row{Name: fmt.Sprintf("Decide, %d rules", n), Cols: []Col{
			{"index ns/op", fmt.Sprintf("%.0f", idx.NsOp)},
			{"index cpu-ns/op", fmt.Sprintf("%.0f", idx.Metrics["cpu-ns/op"])},
			{"index allocs/op", fmt.Sprintf("%.0f", idx.Allocs)},
			{"walk ns/op", fmt.Sprintf("%.0f", walk.NsOp)},
			{"walk cpu-ns/op", fmt.Sprintf("%.0f", walk.Metrics["cpu-ns/op"])},
			{"walk / index", ratio(walk.NsOp, idx.NsOp)},
			{"walk / index (cpu)", ratio(walk.Metrics["cpu-ns/op"], idx.Metrics["cpu-ns/op"])},
			{"vs 10 rules", ratio(idx.NsOp, base)},
			{"vs 10 rules (cpu)", ratio(idx.Metrics["cpu-ns/op"], baseCPU)},
		}})
	}
	for _, n := range []int{10, 10_000} {
		idx, ok := byName[fmt.Sprintf("DecidePattern/rules=%d/engine=index", n)]
		if !ok {
			continue
		}
		walk := byName[fmt.Sprintf("DecidePattern/rules=%d/engine=walk", n)]
		rows = append(rows, Row{Name: fmt.Sprintf("Decide pattern form, %d rules", n), Cols: []Col{
			{"index ns/op", fmt.Sprintf("%.0f", idx.NsOp)},
			{"index allocs/op", fmt.Sprintf("%.0f", idx.Allocs)},
			{"walk ns/op", fmt.Sprintf("%.0f", walk.NsOp)},
			{"walk / index", ratio(walk.NsOp, idx.NsOp)},
		}})
	}
	load, err := measureLoad(ctx, 100_000)
	if err != nil {
		return rows, fmt.Errorf("load: %w", err)
	}
	return append(rows, load...), nil
}

// measureLoad writes a generated file and loads it in a child process (this binary in
// child mode), which reports the load time; the child's maximum RSS is its peak.
func measureLoad(ctx context.Context, n int) ([]Row, error) {
	dir, err := os.MkdirTemp("", "kl-bench-rules")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "rules.yaml")
	src := rulegen.File(n, 42)
	if err := os.WriteFile(path, src, 0o644); err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	var rows []Row
	for try := 0; try < 3; try++ {
		cmd := exec.CommandContext(ctx, self, path)
		cmd.Env = append(os.Environ(), "KL_BENCH_CHILD=rules-load")
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("child: %w: %s", err, errb.String())
		}
		f := strings.Fields(out.String())
		if len(f) != 2 {
			return nil, fmt.Errorf("child said %q", out.String())
		}
		ns, _ := strconv.ParseFloat(f[0], 64)
		heap, _ := strconv.ParseFloat(f[1], 64)
		rss, cpu := 0.0, 0.0
		if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			rss = float64(ru.Maxrss) * 1024 // kilobytes on Linux
			cpu = float64(ru.Utime.Nano() + ru.Stime.Nano())
		}
		rows = append(rows, Row{Name: fmt.Sprintf("Load %d rules (%.1f MB), run %d", n, float64(len(src))/1e6, try+1), Cols: []Col{
			{"load time", fmtNs(ns)},
			{"process CPU", fmtNs(cpu)},
			{"peak RSS", mib(rss)},
			{"heap after load", mib(heap)},
		}})
	}
	return rows, nil
}

// loadChild loads the file named by args[0] and prints the load time in ns and the live
// heap afterwards in bytes.
func loadChild(args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("want one file")
	}
	start := time.Now()
	p, err := rules.Load(args[0], rules.LoadOptions{})
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fmt.Printf("%d %d\n", elapsed.Nanoseconds(), ms.HeapAlloc)
	runtime.KeepAlive(p)
	return nil
}
