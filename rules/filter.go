package rules

import "hash/maphash"

// keyFilter answers "certainly not a key" for most strings that are not keys of an
// index, from a bit array small enough to stay in cache, so that the common miss costs
// one hash and one bit test instead of a hash-table probe into memory that a large
// policy has long evicted from the CPU caches. It has false positives, never false
// negatives: a "maybe" goes on to the real table.
//
// It also keeps the set of key lengths (capped at 63): a string of a length no key has
// is refused by maybe without hashing. The zero keyFilter says "maybe" to all.
type keyFilter struct {
	bits  []uint64
	mask  uint64
	nlens uint64 // bit L set: no key has length L (lengths of 63 and more share bit 63)
}

func lenBit(s string) uint64 { return 1 << min(len(s), 63) }

var filterSeed = maphash.MakeSeed()

// filterMinKeys is the size below which a table stays in cache anyway and a filter
// would only add a hash to every probe.
const filterMinKeys = 512

// newKeyFilter sizes a filter for n keys at about 16 bits per key (two probes); for
// fewer than filterMinKeys keys it returns an empty filter, which says "maybe" to all.
func newKeyFilter(n int) keyFilter {
	if n < filterMinKeys {
		return keyFilter{nlens: ^uint64(0)}
	}
	size := uint64(1024)
	for size < uint64(n)*16 {
		size <<= 1
	}
	return keyFilter{bits: make([]uint64, size/64), mask: size - 1, nlens: ^uint64(0)}
}

// word picks a key's 64-bit word and its two bits in it: both probes of a key land in
// the same word, so a lookup costs one cache line, not two (a blocked Bloom filter).
func (f *keyFilter) word(s string) (w *uint64, m uint64) {
	return f.wordH(maphash.String(filterSeed, s))
}

func (f *keyFilter) wordH(h uint64) (w *uint64, m uint64) {
	return &f.bits[(h&f.mask)/64], 1<<(h>>52&63) | 1<<(h>>58)
}

// addH and maybeH are add and maybe for a filter whose keys are hashed by the caller
// (domainIndex hashes every suffix of a name in one pass with suffixHash); they do not
// track lengths.
func (f *keyFilter) addH(h uint64) {
	if f.bits == nil {
		return
	}
	w, m := f.wordH(h)
	*w |= m
}

func (f *keyFilter) maybeH(h uint64) bool {
	if f.bits == nil {
		return true
	}
	w, m := f.wordH(h)
	return *w&m == m
}

// prefixSeed, prefixStep and prefixFinish make an incremental hash: start with
// prefixSeed, step once per byte, and finish gives the hash of the bytes so far.
// Stepping is FNV-1a; finish mixes the bits so that the filter's word and bit choices
// are independent.
const prefixPrime = 1099511628211

var prefixSeed = uint64(14695981039346656037) ^ maphash.Comparable(filterSeed, 0)

func prefixStep(h uint64, c byte) uint64 { return (h ^ uint64(c)) * prefixPrime }

func prefixFinish(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	return h ^ h>>33
}

func prefixHash(s string) uint64 {
	h := prefixSeed
	for i := 0; i < len(s); i++ {
		h = prefixStep(h, s[i])
	}
	return prefixFinish(h)
}

func (f *keyFilter) add(s string) {
	f.nlens &^= lenBit(s)
	if f.bits == nil {
		return
	}
	w, m := f.word(s)
	*w |= m
}

// maybe reports whether s may be a key. A filter without bits only checks the length.
func (f *keyFilter) maybe(s string) bool {
	if f.nlens&lenBit(s) != 0 {
		return false
	}
	if f.bits == nil {
		return true
	}
	w, m := f.word(s)
	return *w&m == m
}

// filterKeys builds a filter over the keys of a map.
func filterKeys[V any](m map[string]V) keyFilter {
	f := newKeyFilter(len(m))
	for k := range m {
		f.add(k)
	}
	return f
}

// suffixHash is the incremental hash of s read backwards: a walk from the end of a
// name hashes each of its suffixes in one pass.
func suffixHash(s string) uint64 {
	h := prefixSeed
	for i := len(s) - 1; i >= 0; i-- {
		h = prefixStep(h, s[i])
	}
	return prefixFinish(h)
}
