package rules

import "math/bits"

// globSet holds globs bucketed by their whole literal prefix (the text before the
// first wildcard). A lookup probes only the prefix lengths that occur, each through a
// key filter first, so it costs a few hashes however many globs there are. Globs with
// a literal prefix of 64 bytes or more go to a trie.
type globSet struct {
	buckets map[string][]globRule
	lengths uint64 // bit L set: some glob has a literal prefix of L bytes
	filter  keyFilter
	long    globTree
}

func (x *globSet) add(glob string, idx int32) {
	lp := literalPrefix(glob)
	if len(lp) >= 64 {
		x.long.add(glob, idx)
		return
	}
	if x.buckets == nil {
		x.buckets = map[string][]globRule{}
	}
	x.buckets[lp] = append(x.buckets[lp], globRule{glob, idx})
	x.lengths |= 1 << len(lp)
}

func (x *globSet) seal() {
	x.filter = newKeyFilter(len(x.buckets))
	for k := range x.buckets {
		x.filter.addH(prefixHash(k))
	}
}

// first returns the lowest index below best of a glob matching s.
func (x *globSet) first(s string, best int32) int32 {
	// One pass over s hashes every prefix whose length occurs (prefixHash), instead
	// of hashing each of them from its start.
	h, done := prefixSeed, 0
	for l := x.lengths; l != 0; l &= l - 1 {
		n := bits.TrailingZeros64(l)
		if n > len(s) {
			break
		}
		maybe := true
		if x.filter.bits != nil {
			for ; done < n; done++ {
				h = prefixStep(h, s[done])
			}
			maybe = x.filter.maybeH(prefixFinish(h))
		}
		if maybe {
			if b := x.buckets[s[:n]]; b != nil {
				best = firstGlob(b, s, best)
			}
		}
	}
	if x.long.empty() {
		return best
	}
	return x.long.first(s, best)
}
