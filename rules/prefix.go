package rules

import (
	"encoding/binary"
	"math/bits"
)

// globSet holds globs bucketed by their whole literal prefix (the text before the
// first wildcard). A lookup considers only the prefix lengths that occur; for each it
// first tests a 64-bit sample of the value's prefix (its first and last eight bytes,
// so every byte of a prefix of up to 16) against a per-length bit set of the same
// samples of the stored prefixes, sized at about 16 bits per prefix of that length, which
// rules out most lengths without hashing anything; then a key filter, then the bucket.
// Globs with a literal prefix of 64 bytes or more go to a trie.
type globSet struct {
	buckets map[string][]globRule
	lengths uint64        // bit L set: some glob has a literal prefix of L bytes
	sample  [64]sampleSet // per length L: the samples of those prefixes
	filter  keyFilter
	long    globTree
}

// sampleSet is a bit set indexed by the top bits of a sample.
type sampleSet struct {
	bits  []uint64
	shift uint8 // 64 - log2(len(bits)*64)
}

func (x *sampleSet) init(n int) {
	size := 1024
	for size < 16*n {
		size <<= 1
	}
	x.bits, x.shift = make([]uint64, size/64), uint8(64-bits.TrailingZeros(uint(size)))
}

func (x *sampleSet) add(k uint64) {
	i := k >> x.shift
	x.bits[i/64] |= 1 << (i % 64)
}

func (x *sampleSet) has(k uint64) bool {
	i := k >> x.shift
	return x.bits[i/64]&(1<<(i%64)) != 0
}

// sampleKey mixes the first and the last eight bytes of a non-empty prefix (all of its
// bytes when it is shorter) into 64 well-spread bits.
func sampleKey(p string) uint64 {
	var a, b uint64
	if n := len(p); n >= 8 {
		a, b = binary.LittleEndian.Uint64([]byte(p[:8])), binary.LittleEndian.Uint64([]byte(p[n-8:]))
	} else {
		for i := 0; i < n; i++ {
			a = a<<8 | uint64(p[i])
		}
		b = uint64(n)
	}
	return (a*0x9e3779b97f4a7c15 ^ bits.RotateLeft64(b*0xc2b2ae3d27d4eb4f, 31)) * 0x165667b19e3779f9
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
		if x.sample[len(lp)].bits == nil {
			x.sample[len(lp)].init(0)
		}
		x.sample[len(lp)].add(sampleKey(lp))
	}
}

// seal builds the key filter and resizes each length's sample set to the number of
// prefixes of that length, so that it stays selective in a large set.
func (x *globSet) seal() {
	x.filter = filterKeys(x.buckets)
	var count [64]int
	for lp := range x.buckets {
		count[len(lp)]++
	}
	for n := 1; n < 64; n++ {
		if count[n] == 0 {
			continue
		}
		x.sample[n].init(count[n])
	}
	for lp := range x.buckets {
		if lp != "" {
			x.sample[len(lp)].add(sampleKey(lp))
		}
	}
}

// first returns the lowest index below best of a glob matching s.
func (x *globSet) first(s string, best int32) int32 {
	for l := x.lengths; l != 0; l &= l - 1 {
		n := bits.TrailingZeros64(l)
		if n > len(s) {
			break
		}
		if n > 0 {
			if !x.sample[n].has(sampleKey(s[:n])) {
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
