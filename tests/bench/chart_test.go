package main

import (
	"bytes"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// synthetic rows in the shapes relay.go, fastpath.go, attach.go and rules.go produce.
func syntheticResults() []sectionRows {
	return []sectionRows{
		{"attach", []Row{
			{Name: "setup p50 (connect to first byte)", Cols: []Col{{"direct", "310 µs"}, {"client", "620 µs"}, {"client/direct", "2.0x"}}},
			{Name: "throughput (one flow, 256 MiB)", Cols: []Col{{"direct", "1200 MiB/s"}, {"client", "300 MiB/s"}, {"client/direct", "0.25x"}}},
		}},
		{"fastpath", []Row{
			{Name: "direct", Cols: []Col{{"throughput", "19.80 Gbit/s"}, {"vs direct", "1.0x"}, {"conn/s", "11300"}, {"conn vs direct", "1.0x"}}},
			{Name: "kernel-decided", Cols: []Col{{"throughput", "19.50 Gbit/s"}, {"vs direct", "1.0x"}, {"conn/s", "10900"}, {"conn vs direct", "1.0x"}}},
			{Name: "10k-rule table", Cols: []Col{{"throughput", "plan 2.1ms, compile 3.0ms, install 9ms"}, {"vs direct", "20000 set elements"}}},
		}},
		{"relay", []Row{
			{Name: "direct", Cols: []Col{{"throughput", "19.80 Gbit/s"}, {"vs direct", "1.0x"}, {"conn/s", "11300"}, {"conn vs direct", "1.0x"}}},
			{Name: "kl, direct exit", Cols: []Col{{"throughput", "13.10 Gbit/s"}, {"vs direct", "0.7x"}, {"conn/s", "5200"}, {"conn vs direct", "0.5x"}}},
			{Name: "kl via SOCKS5", Cols: []Col{{"throughput", "4.20 Gbit/s"}, {"conn/s", "1700"}, {"vs redsocks", "3.1x thr, 1.0x conn/s"}}},
			{Name: "redsocks via SOCKS5", Cols: []Col{{"throughput", "error: iperf3 exited"}}},
		}},
		{"rules", []Row{
			{Name: "Decide, 10 rules", Cols: []Col{{"index ns/op", "149"}, {"walk / index", "1.4x"}}},
			{Name: "Load", Cols: []Col{{"load time", "654ms"}}},
		}},
	}
}

func TestChartData(t *testing.T) {
	thr, conn := chartData(syntheticResults())
	want := []chartBar{
		{"attach: direct route", 1200 * 8 * (1 << 20) / 1e9}, {"attach: client route", 300 * 8 * (1 << 20) / 1e9},
		{"fastpath: direct", 19.8}, {"fastpath: kernel-decided", 19.5},
		{"relay: direct", 19.8}, {"relay: kl, direct exit", 13.1}, {"relay: kl via SOCKS5", 4.2},
	}
	if len(thr) != len(want) {
		t.Fatalf("throughput bars %+v, want %+v", thr, want)
	}
	for i := range want {
		if thr[i] != want[i] {
			t.Errorf("throughput bar %d = %+v, want %+v", i, thr[i], want[i])
		}
	}
	wantConn := []string{"fastpath: direct", "fastpath: kernel-decided", "relay: direct", "relay: kl, direct exit", "relay: kl via SOCKS5"}
	if len(conn) != len(wantConn) {
		t.Fatalf("conn bars %+v, want labels %v", conn, wantConn)
	}
	for i, l := range wantConn {
		if conn[i].Label != l {
			t.Errorf("conn bar %d = %+v, want %s", i, conn[i], l)
		}
	}
	if conn[3].Value != 5200 {
		t.Errorf("relay kl conn/s = %v, want 5200", conn[3].Value)
	}
}

func TestWriteChart(t *testing.T) {
	dir := t.TempDir()
	thr, conn := chartData(syntheticResults())
	path := filepath.Join(dir, "REPORT.png")
	drawn, err := writeChart(path, thr, conn)
	if err != nil || !drawn {
		t.Fatalf("writeChart = %v, %v", drawn, err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if r := img.Bounds(); r.Dx() < 600 || r.Dy() < 200 {
		t.Errorf("chart is %v, want a readable size", r)
	}
	if os.Getenv("KL_BENCH_KEEP_CHART") != "" {
		os.WriteFile(os.Getenv("KL_BENCH_KEEP_CHART"), b, 0o644)
	}
	// Nothing to draw: no file.
	empty := filepath.Join(dir, "none.png")
	if drawn, err := writeChart(empty, nil, nil); err != nil || drawn {
		t.Errorf("writeChart(nothing) = %v, %v", drawn, err)
	}
	if _, err := os.Stat(empty); err == nil {
		t.Error("writeChart(nothing) wrote a file")
	}
}

func TestReportHead(t *testing.T) {
	dir := t.TempDir()
	report := filepath.Join(dir, "REPORT.md")
	head, err := reportHead(report, syntheticResults(), time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"on 2026-11-30T06:00:00Z",
		"![Throughput and connection rate of each variant](REPORT.png)",
		"| attach | throughput (one flow, 256 MiB) | client/direct | 0.25x |",
		"| relay | kl via SOCKS5 | vs redsocks | 3.1x thr, 1.0x conn/s |",
		"| rules | Decide, 10 rules | walk / index | 1.4x |",
	} {
		if !strings.Contains(head, want) {
			t.Errorf("report head lacks %q:\n%s", want, head)
		}
	}
	for _, not := range []string{"20000 set elements", "654ms", "11300"} {
		if strings.Contains(head, not) {
			t.Errorf("ratio summary lists %q, which is no ratio:\n%s", not, head)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "REPORT.png")); err != nil {
		t.Errorf("chart not written next to the report: %v", err)
	}
	// Only the rules section ran: no chart, no link.
	head, err = reportHead(filepath.Join(dir, "R2.md"), syntheticResults()[3:], time.Now())
	if err != nil || strings.Contains(head, "![") {
		t.Errorf("rules only: %v\n%s", err, head)
	}
}
