// Command bench is kl's benchmark harness (`make bench`, i.e. `go run ./tests/bench`).
//
// Each area of kl registers a Section in an init function of its own file here
// (rules.go, pac.go, relay.go, ...). The harness runs the selected sections, prints one
// table per section and writes all of them to tests/bench/REPORT.md. Sections measure
// and report; they never fail a build because a figure missed its target. A section
// that cannot run (a missing tool, no privileges) returns an error, which the report
// records in place of its table.
//
// It is not a test suite: nothing here is run by `go test`.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Section is one area's measurements.
type Section struct {
	Name string // short, unique; also what -only selects on
	Doc  string // one paragraph for the report: what is measured, against what, targets
	Run  func(ctx context.Context) ([]Row, error)
}

// Row is one line of a section's table. Cols are shown in order; the table's header is
// the union of all rows' column keys in order of first appearance.
type Row struct {
	Name string
	Cols []Col
}

// Col is one cell of a Row.
type Col struct {
	Key string
	Val string
}

var sections []Section

// children are helper modes of this same binary, run in a child process to measure
// something in isolation (peak memory of a load, say): KL_BENCH_CHILD=name selects one.
var children = map[string]func(args []string) error{}

// register adds a section; call it from an init function.
func register(s Section) {
	for _, o := range sections {
		if o.Name == s.Name {
			panic("bench: section registered twice: " + s.Name)
		}
	}
	sections = append(sections, s)
}

// runChild runs the child mode KL_BENCH_CHILD names, when the bench started this
// binary as one of its relays (startRelayChild), and exits with its result; it returns
// false when there is no child mode to run.
func runChild() bool {
	name := os.Getenv("KL_BENCH_CHILD")
	if name == "" {
		return false
	}
	child, ok := children[name]
	if !ok {
		fmt.Fprintln(os.Stderr, "bench: unknown child mode", name)
		os.Exit(2)
	}
	if err := child(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "bench child:", err)
		os.Exit(1)
	}
	os.Exit(0)
	return true
}

func main() {
	if runChild() {
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	only := fs.String("only", "", "run only sections whose name contains this (comma-separated)")
	report := fs.String("report", "", "write the report here (default tests/bench/REPORT.md in the module; with -only, kl-bench-REPORT.md in the temp dir)")
	list := fs.Bool("list", false, "list the sections and exit")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	sort.SliceStable(sections, func(i, j int) bool { return sections[i].Name < sections[j].Name })
	if *list {
		for _, s := range sections {
			fmt.Fprintf(out, "%-12s %s\n", s.Name, s.Doc)
		}
		return nil
	}
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	if err := os.Chdir(root); err != nil {
		return fmt.Errorf("enter module root: %w", err)
	}
	if *report == "" {
		// The checked-in report is the whole run's: a partial run (-only) writes its own
		// file, so it never replaces sections it did not measure.
		*report = filepath.Join(root, "tests", "bench", "REPORT.md")
		if *only != "" {
			*report = filepath.Join(os.TempDir(), "kl-bench-REPORT.md")
		}
	}

	var md strings.Builder
	var results []sectionRows
	ran := 0
	for _, s := range sections {
		if !selected(s.Name, *only) {
			continue
		}
		ran++
		fmt.Fprintf(out, "== %s\n", s.Name)
		start := time.Now()
		rows, err := s.Run(ctx)
		fmt.Fprintf(&md, "\n## %s\n\n%s\n\n", s.Name, s.Doc)
		if err != nil {
			fmt.Fprintf(out, "   error: %v\n", err)
			fmt.Fprintf(&md, "**Not measured:** %v\n", err)
			continue
		}
		printTable(out, rows)
		results = append(results, sectionRows{s.Name, rows})
		md.WriteString(markdownTable(rows))
		fmt.Fprintf(&md, "\n_Section took %s._\n", time.Since(start).Round(time.Second))
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	if ran == 0 && *only != "" {
		return fmt.Errorf("no section matches -only %q", *only)
	}
	doc, err := reportHead(*report, results, time.Now())
	if err != nil {
		return err
	}
	if err := os.WriteFile(*report, []byte(doc+md.String()), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	fmt.Fprintf(out, "report written to %s\n", *report)
	return nil
}

// reportHead is the top of the report: when and where it was measured, every ratio
// the sections printed, and the chart of throughput and connection rates (drawn next
// to the report, as REPORT.png, when the relay, fastpath or attach sections ran).
func reportHead(report string, results []sectionRows, at time.Time) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "# kl benchmark report\n\nGenerated by `make bench` (`go run ./tests/bench`) on %s; do not edit, rerun.\n",
		at.UTC().Format(time.RFC3339))
	fmt.Fprintf(&b, "Machine: %s. Figures are from one run; rerun to compare.\n", machine())
	thr, conn := chartData(results)
	png := strings.TrimSuffix(report, filepath.Ext(report)) + ".png"
	drawn, err := writeChart(png, thr, conn)
	if err != nil {
		return "", err
	}
	if drawn {
		fmt.Fprintf(&b, "\n![Throughput and connection rate of each variant](%s)\n", filepath.Base(png))
	}
	if sum := ratioSummary(results); sum != "" {
		b.WriteString("\n## Ratios\n\nEvery ratio of the sections below, in one place.\n\n")
		b.WriteString(sum)
	}
	return b.String(), nil
}

func selected(name, only string) bool {
	if only == "" {
		return true
	}
	for _, o := range strings.Split(only, ",") {
		if o != "" && strings.Contains(name, o) {
			return true
		}
	}
	return false
}

func header(rows []Row) []string {
	var keys []string
	seen := map[string]bool{}
	for _, r := range rows {
		for _, c := range r.Cols {
			if !seen[c.Key] {
				seen[c.Key] = true
				keys = append(keys, c.Key)
			}
		}
	}
	return keys
}

func cell(r Row, key string) string {
	for _, c := range r.Cols {
		if c.Key == key {
			return c.Val
		}
	}
	return ""
}

func printTable(w io.Writer, rows []Row) {
	keys := header(rows)
	width := make([]int, len(keys)+1)
	for _, r := range rows {
		width[0] = max(width[0], len(r.Name))
		for i, k := range keys {
			width[i+1] = max(width[i+1], len(k), len(cell(r, k)))
		}
	}
	fmt.Fprintf(w, "   %-*s", width[0], "")
	for i, k := range keys {
		fmt.Fprintf(w, "  %*s", width[i+1], k)
	}
	fmt.Fprintln(w)
	for _, r := range rows {
		fmt.Fprintf(w, "   %-*s", width[0], r.Name)
		for i, k := range keys {
			fmt.Fprintf(w, "  %*s", width[i+1], cell(r, k))
		}
		fmt.Fprintln(w)
	}
}

func markdownTable(rows []Row) string {
	keys := header(rows)
	var b strings.Builder
	b.WriteString("| |")
	for _, k := range keys {
		b.WriteString(" " + k + " |")
	}
	b.WriteString("\n|---|")
	for range keys {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for _, r := range rows {
		b.WriteString("| " + r.Name + " |")
		for _, k := range keys {
			b.WriteString(" " + cell(r, k) + " |")
		}
		b.WriteString("\n")
	}
	return b.String()
}
