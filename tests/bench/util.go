package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// GoBench is one result line of `go test -bench`.
type GoBench struct {
	Name    string             // without the "Benchmark" prefix and the -GOMAXPROCS suffix
	N       int64              // iterations
	NsOp    float64            // ns/op
	BOp     float64            // B/op (with -benchmem)
	Allocs  float64            // allocs/op (with -benchmem)
	Metrics map[string]float64 // custom metrics reported with b.ReportMetric, by unit
}

// goBench runs `go test -run ^$ -bench PATTERN -benchmem` on one package and parses the
// results. Extra arguments (e.g. -benchtime=1s) are appended.
func goBench(ctx context.Context, pkg, pattern string, extra ...string) ([]GoBench, error) {
	args := append([]string{"test", "-run", "^$", "-bench", pattern, "-benchmem", "-count=1"}, extra...)
	args = append(args, pkg)
	cmd := exec.CommandContext(ctx, goTool(), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	res := parseGoBench(out.Bytes())
	if len(res) == 0 {
		return nil, fmt.Errorf("go %s: no benchmark results\n%s", strings.Join(args, " "), out.String())
	}
	return res, nil
}

func parseGoBench(out []byte) []GoBench {
	var res []GoBench
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		name := strings.TrimPrefix(f[0], "Benchmark")
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		g := GoBench{Name: name, N: n, Metrics: map[string]float64{}}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			switch f[i+1] {
			case "ns/op":
				g.NsOp = v
			case "B/op":
				g.BOp = v
			case "allocs/op":
				g.Allocs = v
			default:
				g.Metrics[f[i+1]] = v
			}
		}
		res = append(res, g)
	}
	return res
}

func goTool() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); fileExists(p) {
		return p
	}
	return "go"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func moduleRoot() (string, error) {
	out, err := exec.Command(goTool(), "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("find module root: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("find module root: not inside the kl module")
	}
	return filepath.Dir(gomod), nil
}

func machine() string {
	s := fmt.Sprintf("%s/%s, %d CPUs, %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version())
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				if i := strings.IndexByte(l, ':'); i > 0 {
					s += ", " + strings.TrimSpace(l[i+1:])
				}
				break
			}
		}
	}
	return s
}

// fmtNs formats a duration given in nanoseconds for a table cell.
func fmtNs(ns float64) string {
	switch {
	case ns < 10_000:
		return fmt.Sprintf("%.0f ns", ns)
	case ns < 10_000_000:
		return fmt.Sprintf("%.1f µs", ns/1e3)
	default:
		return time.Duration(ns).Round(time.Millisecond).String()
	}
}

// ratio formats a/b as "0.97x" below 10, "12.3x" from there ("-" when b is zero): the
// targets it is read against (0.97x, 0.45x) need the second digit.
func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	if r := a / b; r < 10 {
		return fmt.Sprintf("%.2fx", r)
	}
	return fmt.Sprintf("%.1fx", a/b)
}

// mib formats a byte count in MiB.
func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }

// needRoot refuses a section that needs network namespaces and nftables when not root.
func needRoot() error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces, nftables)")
	}
	return nil
}
