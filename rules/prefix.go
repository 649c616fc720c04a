package rules

import "math/bits"

// globSet holds globs bucketed by their whole literal prefix (the text before the
// first wildcard). A lookup considers only the prefix lengths that occur; for each it
// first tests four bytes of the value's prefix (first, middle, the last two) against a small
// per-length set of the same bytes of the stored prefixes, which rules out most
// lengths without hashing anything, then a key filter, then the bucket. Globs with a
// literal prefix of 64 bytes or more go to a trie.
type globSet struct {
	buckets map[string][]globRule
	lengths uint64         // bit L set: some glob has a literal prefix of L bytes
	sample  [64][16]uint64 // per length L: a 1024-bit set of sampleKey of those prefixes
	filter  keyFilter
	long    globTree
}

// sampleKey mixes the first, middle, next to last and last byte of a non-empty prefix
// into 10 bits.
func sampleKey(p string) uint32 {
	n := len(p)
	x := uint32(p[0]) | uint32(p[n/2])<<8 | uint32(p[max(n-2, 0)])<<16 | uint32(p[n-1])<<24
	return (x * 0x9e3779b1) >> 22
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
	if lp != "" {
		k := sampleKey(lp)
		x.sample[len(lp)][k>>6] |= 1 << (k & 63)
	}
}

func (x *globSet) seal() {
	x.filter = filterKeys(x.buckets)
}

// first returns the lowest index below best of a glob matching s.
func (x *globSet) first(s string, best int32) int32 {
	for l := x.lengths; l != 0; l &= l - 1 {
		n := bits.TrailingZeros64(l)
		if n > len(s) {
			break
		}
		if n > 0 {
			if k := sampleKey(s[:n]); x.sample[n][k>>6]&(1<<(k&63)) == 0 {
				continue
			}
		}
		if x.filter.maybe(s[:n]) {
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
