package rules_test

import (
	"bufio"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kl-egress/kl/rules"
)

// TestExamples loads every examples/*.yaml and checks it decides as the decision table
// in testdata/examples/NAME.decisions says (written by hand from SPEC §4).
func TestExamples(t *testing.T) {
	files, err := filepath.Glob("../examples/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples found: %v", err)
	}
	for _, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".yaml")
		t.Run(name, func(t *testing.T) {
			p, err := rules.Load(file, rules.LoadOptions{})
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			table, err := os.Open(filepath.Join("testdata", "examples", name+".decisions"))
			if err != nil {
				t.Fatalf("every example needs a decision table: %v", err)
			}
			defer table.Close()
			sc := bufio.NewScanner(table)
			n := 0
			for line := 1; sc.Scan(); line++ {
				text := strings.TrimSpace(sc.Text())
				if text == "" || text[0] == '#' {
					continue
				}
				flags, want, ok := strings.Cut(text, "|")
				if !ok {
					t.Fatalf("line %d: want FLAGS | EXIT RULE DIMENSION", line)
				}
				f, err := flowFromFlags(strings.Fields(flags))
				if err != nil {
					t.Fatalf("line %d: %v", line, err)
				}
				w := strings.Fields(want)
				if len(w) != 3 {
					t.Fatalf("line %d: want EXIT RULE DIMENSION", line)
				}
				d := p.Decide(&f)
				if got := d.Exit + " " + strconv.Itoa(d.Rule) + " " + d.Dimension.String(); got != strings.Join(w, " ") {
					t.Errorf("line %d: Decide(%s) = %s, want %s", line, strings.TrimSpace(flags), got, strings.Join(w, " "))
				}
				n++
			}
			if n == 0 {
				t.Fatal("empty decision table")
			}
		})
	}
}

// flowFromFlags reads the flow flags of kl-ctl explain.
func flowFromFlags(args []string) (rules.Flow, error) {
	var f rules.Flow
	var addr netip.Addr
	var port uint64
	for i := 0; i+1 < len(args); i += 2 {
		v := args[i+1]
		switch args[i] {
		case "--label":
			if f.Labels == nil {
				f.Labels = map[string]string{}
			}
			k, val, _ := strings.Cut(v, "=")
			f.Labels[k] = val
		case "--image":
			f.Image = v
		case "--process":
			f.Process = rules.Process{Known: true, Comm: v, Exe: v, Argv0: v}
		case "--host":
			f.Host = v
		case "--ip":
			a, err := netip.ParseAddr(v)
			if err != nil {
				return f, err
			}
			addr = a
		case "--port":
			p, err := strconv.ParseUint(v, 10, 16)
			if err != nil {
				return f, err
			}
			port = p
		default:
			return f, os.ErrInvalid
		}
	}
	f.Dst = netip.AddrPortFrom(addr, uint16(port))
	return f, nil
}
