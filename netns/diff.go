package netns

import (
	"fmt"
	"slices"
	"strings"
)

// Diff compares a wanted table with one read back and returns one line per difference:
// missing, different or unexpected sets, chains and rules, in the nft syntax Render uses.
// An empty result means the kernel holds exactly the wanted program.
func Diff(want, got *Table) []string {
	var d []string
	if got == nil {
		return []string{fmt.Sprintf("table inet %s is missing", want.Name)}
	}
	gotSets := map[string]Set{}
	for _, s := range got.Sets {
		gotSets[s.Name] = s
	}
	for _, w := range want.Sets {
		g, ok := gotSets[w.Name]
		delete(gotSets, w.Name)
		switch {
		case !ok:
			d = append(d, fmt.Sprintf("set %s is missing", w.Name))
		case g.Type != w.Type || g.Map != w.Map:
			d = append(d, fmt.Sprintf("set %s has type %s, want %s", w.Name, g.Type, w.Type))
		default:
			we, ge := elements(w), elements(g)
			wm, gm := setOf(we), setOf(ge)
			for _, e := range we {
				if !gm[e] {
					d = append(d, fmt.Sprintf("set %s is missing element %s", w.Name, e))
				}
			}
			for _, e := range ge {
				if !wm[e] {
					d = append(d, fmt.Sprintf("set %s has unexpected element %s", w.Name, e))
				}
			}
		}
	}
	for _, name := range sortedKeys(gotSets) {
		d = append(d, fmt.Sprintf("unexpected set %s", name))
	}

	gotChains := map[string]Chain{}
	for _, c := range got.Chains {
		gotChains[c.Name] = c
	}
	for _, w := range want.Chains {
		g, ok := gotChains[w.Name]
		delete(gotChains, w.Name)
		if !ok {
			d = append(d, fmt.Sprintf("chain %s is missing", w.Name))
			continue
		}
		if g.Type != w.Type || g.Priority != w.Priority {
			d = append(d, fmt.Sprintf("chain %s is type %s priority %d, want type %s priority %d",
				w.Name, g.Type, g.Priority, w.Type, w.Priority))
		}
		d = append(d, diffRules(w.Name, w.Rules, g.Rules)...)
	}
	for _, name := range sortedKeys(gotChains) {
		d = append(d, fmt.Sprintf("unexpected chain %s", name))
	}
	return d
}

// diffRules aligns two rule lists in order (longest common subsequence of their texts) so
// that one deleted or inserted rule is reported as exactly that.
func diffRules(chain string, want, got []Rule) []string {
	ws, gs := ruleStrings(want), ruleStrings(got)
	n, m := len(ws), len(gs)
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if ws[i] == gs[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var d []string
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && ws[i] == gs[j]:
			i, j = i+1, j+1
		case j < m && (i == n || lcs[i][j+1] >= lcs[i+1][j]):
			d = append(d, fmt.Sprintf("chain %s has unexpected rule %d: %s", chain, j+1, gs[j]))
			j++
		default:
			d = append(d, fmt.Sprintf("chain %s is missing rule %d: %s", chain, i+1, ws[i]))
			i++
		}
	}
	return d
}

func ruleStrings(rs []Rule) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.String()
	}
	return out
}

func elements(s Set) []string {
	var out []string
	for _, r := range s.Addrs {
		out = append(out, r.String())
	}
	for _, p := range s.Ports {
		out = append(out, fmt.Sprint(p))
	}
	for _, r := range s.PortRanges {
		out = append(out, r.String())
	}
	if s.Map {
		for i := range out {
			m := "?"
			if i < len(s.Marks) {
				m = fmt.Sprintf("0x%08x", s.Marks[i])
			}
			out[i] += " : " + m
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// String renders a table for error messages; nil prints as absent.
func (t *Table) String() string {
	if t == nil {
		return "<no table>"
	}
	return strings.TrimSpace(t.Render())
}

func setOf(es []string) map[string]bool {
	m := make(map[string]bool, len(es))
	for _, e := range es {
		m[e] = true
	}
	return m
}
