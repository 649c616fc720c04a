package main

import (
	"fmt"
	"image/color"
	"os"
	"regexp"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// sectionRows is one section's result as the report shows it.
type sectionRows struct {
	Name string
	Rows []Row
}

// chartBar is one bar of the chart: a variant and its figure.
type chartBar struct {
	Label string
	Value float64
}

// chartSections are the sections whose rows carry throughput and connection rates.
var chartSections = map[string]bool{"relay": true, "fastpath": true, "attach": true}

// chartData picks the throughput (Gbit/s) and connection rate (conn/s) of every variant
// of the relay, fastpath and attach sections from their rows, in report order. Cells
// that are not a figure (errors, build costs in the same column) are left out.
func chartData(results []sectionRows) (thr, conn []chartBar) {
	for _, s := range results {
		if !chartSections[s.Name] {
			continue
		}
		for _, r := range s.Rows {
			if s.Name == "attach" {
				// One row per measurement, one column per route.
				if !strings.HasPrefix(r.Name, "throughput") {
					continue
				}
				for _, route := range []string{"direct", "client"} {
					if g, ok := gbits(cell(r, route)); ok {
						thr = append(thr, chartBar{s.Name + ": " + route + " route", g})
					}
				}
				continue
			}
			label := s.Name + ": " + r.Name
			if g, ok := gbits(cell(r, "throughput")); ok {
				thr = append(thr, chartBar{label, g})
			}
			if c, err := strconv.ParseFloat(strings.TrimSpace(cell(r, "conn/s")), 64); err == nil {
				conn = append(conn, chartBar{label, c})
			}
		}
	}
	return thr, conn
}

// gbits reads a throughput cell ("19.81 Gbit/s", "850 MiB/s") in Gbit/s.
func gbits(s string) (float64, bool) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, false
	}
	switch f[1] {
	case "Gbit/s":
		return v, true
	case "Mbit/s":
		return v / 1e3, true
	case "MiB/s":
		return v * 8 * (1 << 20) / 1e9, true
	}
	return 0, false
}

// writeChart draws the throughput and connection-rate bars side by side into a PNG at
// path. It reports false, writing nothing, when there is nothing to draw.
func writeChart(path string, thr, conn []chartBar) (bool, error) {
	var plots []*plot.Plot
	for _, panel := range []struct {
		title, unit string
		bars        []chartBar
		col         color.RGBA
	}{
		{"Throughput (one flow)", "Gbit/s", thr, color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}},
		{"Connection rate (connect, 1 byte, echo, close)", "connections/s", conn, color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}},
	} {
		if len(panel.bars) == 0 {
			continue
		}
		p, err := barPlot(panel.title, panel.unit, panel.bars, panel.col)
		if err != nil {
			return false, err
		}
		plots = append(plots, p)
	}
	if len(plots) == 0 {
		return false, nil
	}
	rows := max(len(thr), len(conn))
	w, h := vg.Length(len(plots))*5.5*vg.Inch, vg.Length(1.4+0.32*float64(rows))*vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: len(plots), PadX: vg.Inch / 4, PadTop: vg.Inch / 8, PadBottom: vg.Inch / 8, PadLeft: vg.Inch / 8, PadRight: vg.Inch / 4}
	canvases := plot.Align([][]*plot.Plot{plots}, tiles, dc)
	for i, p := range plots {
		p.Draw(canvases[0][i])
	}
	f, err := os.Create(path)
	if err != nil {
		return false, fmt.Errorf("write chart: %w", err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return false, fmt.Errorf("write chart %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return false, fmt.Errorf("write chart %s: %w", path, err)
	}
	return true, nil
}

// barPlot is one panel: horizontal bars, the first variant on top, each labelled with
// its figure.
func barPlot(title, unit string, bars []chartBar, col color.RGBA) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = unit
	n := len(bars)
	vals := make(plotter.Values, n)
	names := make([]string, n)
	xys := make(plotter.XYs, n)
	texts := make([]string, n)
	top := 0.0
	for i, b := range bars {
		j := n - 1 - i // plotted bottom-up
		vals[j], names[j] = b.Value, b.Label
		xys[j] = plotter.XY{X: b.Value, Y: float64(j)}
		texts[j] = " " + strconv.FormatFloat(b.Value, 'f', decimals(b.Value), 64)
		top = max(top, b.Value)
	}
	bc, err := plotter.NewBarChart(vals, vg.Points(14))
	if err != nil {
		return nil, fmt.Errorf("chart %q: %w", title, err)
	}
	bc.Horizontal = true
	bc.Color = col
	bc.LineStyle.Width = 0
	labels, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: texts})
	if err != nil {
		return nil, fmt.Errorf("chart %q: %w", title, err)
	}
	for i := range labels.TextStyle {
		labels.TextStyle[i].YAlign = draw.YCenter
	}
	grid := plotter.NewGrid()
	grid.Horizontal.Width = 0
	p.Add(grid, bc, labels)
	p.NominalY(names...)
	p.X.Min = 0
	p.X.Max = top * 1.2 // room for the figures
	if p.X.Max == 0 {
		p.X.Max = 1
	}
	return p, nil
}

func decimals(v float64) int {
	if v >= 100 {
		return 0
	}
	return 2
}

// ratioCell finds ratios in a cell: "0.65x", "3.1x thr, 1.2x conn/s".
var ratioCell = regexp.MustCompile(`(^|[^0-9.])[0-9]+(\.[0-9]+)?x($|[^0-9a-z])`)

// ratioSummary is a table of every ratio the sections printed, for the top of the
// report: section, row, column and value.
func ratioSummary(results []sectionRows) string {
	var b strings.Builder
	for _, s := range results {
		for _, r := range s.Rows {
			for _, k := range header(s.Rows) {
				v := cell(r, k)
				if !ratioCell.MatchString(v) {
					continue
				}
				if b.Len() == 0 {
					b.WriteString("| section | row | column | ratio |\n|---|---|---|---:|\n")
				}
				fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", s.Name, r.Name, k, v)
			}
		}
	}
	return b.String()
}
