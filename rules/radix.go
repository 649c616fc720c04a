package rules

import "bytes"

// globTree holds globs by their literal prefix (the text before the first wildcard) in
// a compressed trie, so a lookup only tries the globs whose literal prefix is a prefix
// of the value: one step per trie node along the value, not one per glob.
type globTree struct {
	root radixNode
}

type radixNode struct {
	edge  string     // label of the edge from the parent
	globs []globRule // globs whose literal prefix ends here, in file order
	first []byte     // first byte of each kid's edge, searched with IndexByte
	kids  []*radixNode
}

func lcp(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

func (n *radixNode) child(c byte) (int, *radixNode) {
	if i := bytes.IndexByte(n.first, c); i >= 0 {
		return i, n.kids[i]
	}
	return -1, nil
}

// add stores a glob; globs must be added in file order.
func (t *globTree) add(glob string, idx int32) {
	key := literalPrefix(glob)
	n := &t.root
	for key != "" {
		i, c := n.child(key[0])
		if c == nil {
			c = &radixNode{edge: key}
			n.kids = append(n.kids, c)
			n.first = append(n.first, key[0])
			n = c
			break
		}
		k := lcp(c.edge, key)
		if k < len(c.edge) {
			mid := &radixNode{edge: c.edge[:k], kids: []*radixNode{c}, first: []byte{c.edge[k]}}
			c.edge = c.edge[k:]
			n.kids[i] = mid
			c = mid
		}
		n, key = c, key[k:]
	}
	n.globs = append(n.globs, globRule{glob, idx})
}

func (t *globTree) empty() bool { return t.root.globs == nil && t.root.kids == nil }

// first returns the lowest index below best of a glob matching s.
func (t *globTree) first(s string, best int32) int32 {
	n := &t.root
	rest := s
	for {
		if n.globs != nil {
			best = firstGlob(n.globs, s, best)
		}
		if rest == "" {
			return best
		}
		_, c := n.child(rest[0])
		if c == nil || len(c.edge) > len(rest) || rest[:len(c.edge)] != c.edge {
			return best
		}
		n, rest = c, rest[len(c.edge):]
	}
}
