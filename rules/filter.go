package rules

import "hash/maphash"

// keyFilter answers "certainly not a key" for most strings that are not keys of an
// index, from a bit array small enough to stay in cache, so that the common miss costs
// one hash and one bit test instead of a hash-table probe into memory that a large
// policy has long evicted from the CPU caches. It has false positives, never false
// negatives: a "maybe" goes on to the real table.
type keyFilter struct {
	bits []uint64
	mask uint64
}

var filterSeed = maphash.MakeSeed()

// filterMinKeys is the size below which a table stays in cache anyway and a filter
// would only add a hash to every probe.
const filterMinKeys = 512

// newKeyFilter sizes a filter for n keys at about 16 bits per key (two probes); for
// fewer than filterMinKeys keys it returns an empty filter, which says "maybe" to all.
func newKeyFilter(n int) keyFilter {
	if n < filterMinKeys {
		return keyFilter{}
	}
	size := uint64(1024)
	for size < uint64(n)*16 {
		size <<= 1
	}
	return keyFilter{bits: make([]uint64, size/64), mask: size - 1}
}

func (f *keyFilter) add(s string) {
	if f.bits == nil {
		return
	}
	h := maphash.String(filterSeed, s)
	a, b := h&f.mask, (h>>32)&f.mask
	f.bits[a/64] |= 1 << (a % 64)
	f.bits[b/64] |= 1 << (b % 64)
}

// maybe reports whether s may be a key. An empty filter (no bits) says yes.
func (f *keyFilter) maybe(s string) bool {
	if f.bits == nil {
		return true
	}
	h := maphash.String(filterSeed, s)
	a, b := h&f.mask, (h>>32)&f.mask
	return f.bits[a/64]&(1<<(a%64)) != 0 && f.bits[b/64]&(1<<(b%64)) != 0
}

// filterKeys builds a filter over the keys of a map.
func filterKeys[V any](m map[string]V) keyFilter {
	f := newKeyFilter(len(m))
	for k := range m {
		f.add(k)
	}
	return f
}
