package rules

import (
	"encoding/binary"
	"math"
	"math/bits"
	"net/netip"
	"strings"

	"github.com/gaissmai/bart"

	"github.com/kl-egress/kl/rules/imageref"
)

// The per-dimension indexes built when a policy loads. Each answers "the lowest rule
// index of its tier that matches", 0 for none, without allocating. Rule indexes are
// 1-based positions in the file; rules are added in file order, so the first index
// stored under a key is already the lowest.

const none = int32(math.MaxInt32)

func lower(a, b int32) int32 {
	if b < a {
		return b
	}
	return a
}

func found(i int32) int32 {
	if i == none {
		return 0
	}
	return i
}

// globRule is one glob of a rule, kept in file order within its bucket.
type globRule struct {
	glob string
	idx  int32
}

// firstGlob returns the lowest index in list (sorted by idx) below best whose glob
// matches s.
func firstGlob(list []globRule, s string, best int32) int32 {
	for _, g := range list {
		if g.idx >= best {
			break
		}
		if globMatch(g.glob, s) {
			return g.idx
		}
	}
	return best
}

func setMin(m map[string]int32, k string, idx int32) {
	if _, ok := m[k]; !ok {
		m[k] = idx
	}
}

// labelIndex: one hash probe per workload label finds both the presence selector and
// the key=value selectors of that key.
type labelIndex struct {
	keys   map[string]*labelKey
	list   []string // the same keys, for probing the flow's labels when there are few
	filter keyFilter
}

type labelKey struct {
	presence int32 // lowest rule selecting the key alone; none when there is none
	values   map[string]int32
	vfilter  keyFilter // over values, when there are many
}

// value returns the lowest rule selecting key=v, none when there is none.
func (e *labelKey) value(v string) int32 {
	if e.values == nil || !e.vfilter.maybe(v) {
		return none
	}
	if i, ok := e.values[v]; ok {
		return i
	}
	return none
}

func (x *labelIndex) add(m *labelMatcher, idx int32) {
	if x.keys == nil {
		x.keys = map[string]*labelKey{}
	}
	k := x.keys[m.key]
	if k == nil {
		k = &labelKey{presence: none}
		x.keys[m.key] = k
		x.list = append(x.list, m.key)
	}
	if m.presence {
		k.presence = lower(k.presence, idx)
		return
	}
	if k.values == nil {
		k.values = map[string]int32{}
	}
	setMin(k.values, m.val, idx)
}

func (x *labelIndex) lookup(labels map[string]string, keys []string) int32 {
	if x.keys == nil || len(labels) == 0 {
		return 0
	}
	best := none
	if keys != nil && len(keys) <= len(x.list) {
		for _, k := range keys {
			if !x.filter.maybe(k) {
				continue
			}
			if e := x.keys[k]; e != nil {
				if v, ok := labels[k]; ok {
					best = lower(best, lower(e.presence, e.value(v)))
				}
			}
		}
		return found(best)
	}
	if len(x.list) < len(labels) {
		for _, k := range x.list {
			if v, ok := labels[k]; ok {
				e := x.keys[k]
				best = lower(best, lower(e.presence, e.value(v)))
			}
		}
		return found(best)
	}
	for k, v := range labels {
		if !x.filter.maybe(k) {
			continue
		}
		if e := x.keys[k]; e != nil {
			best = lower(best, lower(e.presence, e.value(v)))
		}
	}
	return found(best)
}

// imageIndex: wildcard-free references (in both spellings) in a hash; globs in a
// literal-prefix trie.
type imageIndex struct {
	exact  map[string]int32
	filter keyFilter
	globs  globSet
}

func (x *imageIndex) add(m *imageMatcher, idx int32) {
	if x.exact == nil {
		x.exact = map[string]int32{}
	}
	if m.norm != "" {
		setMin(x.exact, m.glob, idx)
		setMin(x.exact, m.norm, idx)
		return
	}
	x.globs.add(m.glob, idx)
}

func (x *imageIndex) lookup(image string) int32 {
	if x.exact == nil || image == "" {
		return 0
	}
	best := x.find(image)
	if !imageref.IsNormal(image) {
		best = x.findNorm(image, best)
	}
	return found(best)
}

// findNorm looks up the normalized form of a reference that is not in it (the caller
// checked IsNormal). Its buffer is zeroed only on this path.
func (x *imageIndex) findNorm(image string, best int32) int32 {
	var buf [maxImageLen]byte
	if norm := appendNormal(image, &buf); norm != image {
		best = lower(best, x.find(norm))
	}
	return best
}

func (x *imageIndex) find(s string) int32 {
	best := none
	if x.filter.maybe(s) {
		if i, ok := x.exact[s]; ok {
			best = i
		}
	}
	return x.globs.first(s, best)
}

// processIndex: wildcard-free names in a hash, globs in a literal-prefix trie.
type processIndex struct {
	exact  map[string]int32
	filter keyFilter
	globs  globSet
}

func (x *processIndex) add(m *processMatcher, idx int32) {
	if x.exact == nil {
		x.exact = map[string]int32{}
	}
	for _, a := range m.alts {
		if hasWild(a) {
			x.globs.add(a, idx)
		} else {
			setMin(x.exact, a, idx)
		}
	}
}

func (x *processIndex) lookup(p *Process) int32 {
	if x.exact == nil || !p.Known {
		return 0
	}
	best := none
	for i, n := range [3]string{p.Comm, p.Exe, p.Argv0} {
		if n == "" || i > 0 && n == p.Comm || i == 2 && n == p.Exe {
			continue
		}
		if x.filter.maybe(n) {
			if i, ok := x.exact[n]; ok {
				best = lower(best, i)
			}
		}
		best = x.globs.first(n, best)
	}
	return found(best)
}

// domainIndex: exact names in a hash; `*.suffix` globs and the other globs with a
// label-aligned literal tail (`api-*.example.com` under example.com) in a hash keyed by
// that suffix, so a lookup costs one probe for the name and one per label of it; globs
// without such a tail (`*`, `foo*`) in a literal-prefix trie.
type domainIndex struct {
	exact    map[string]int32
	suffixes map[string]*domainSuffix
	xfilter  keyFilter // over the keys of exact
	filter   keyFilter // over the keys of suffixes, by suffixHash
	depths   uint64    // bit d set: some suffix key has d labels (d capped at 63)
	maxLen   int       // the longest suffix key
	rest     globSet
}

// labelCount is the number of dot-separated labels of a name, capped at 63.
func labelCount(s string) int { return min(strings.Count(s, ".")+1, 63) }

type domainSuffix struct {
	wild  int32      // lowest rule with `*.suffix`; none when there is none
	globs []globRule // other globs ending in `.suffix`, in file order
}

func (x *domainIndex) suffix(k string) *domainSuffix {
	e := x.suffixes[k]
	if e == nil {
		e = &domainSuffix{wild: none}
		x.suffixes[k] = e
	}
	return e
}

func (x *domainIndex) add(glob string, idx int32) {
	if x.exact == nil {
		x.exact = map[string]int32{}
		x.suffixes = map[string]*domainSuffix{}
	}
	switch {
	case !hasWild(glob):
		setMin(x.exact, glob, idx)
	case strings.HasPrefix(glob, "*.") && len(glob) > 2 && !hasWild(glob[2:]):
		e := x.suffix(glob[2:])
		e.wild = lower(e.wild, idx)
	default:
		tail := literalSuffix(glob)
		if d := strings.IndexByte(tail, '.'); d >= 0 && d+1 < len(tail) {
			e := x.suffix(tail[d+1:])
			e.globs = append(e.globs, globRule{glob, idx})
			return
		}
		x.rest.add(glob, idx)
	}
}

func (x *domainIndex) lookup(host string) int32 {
	if x.exact == nil || host == "" {
		return 0
	}
	best := none
	if x.filter.bits == nil && x.xfilter.bits == nil {
		// A small index: no filter, nothing to hash.
		if i, ok := x.exact[host]; ok {
			best = i
		}
		if len(x.suffixes) > 0 {
			for j := 0; j < len(host); j++ {
				if host[j] == '.' {
					if e := x.suffixes[host[j+1:]]; e != nil {
						best = lower(best, e.wild)
						if e.globs != nil {
							best = firstGlob(e.globs, host, best)
						}
					}
				}
			}
		}
		return found(x.rest.first(host, best))
	}
	// One pass from the end hashes every suffix of the name (suffixHash), probing
	// the suffixes after a dot that have a label count some key has, and, last, the
	// whole name against the exact names (their filter is built by suffixHash too).
	h, labels := prefixSeed, 1
	for j := len(host) - 1; j >= 0; j-- {
		if host[j] == '.' && len(host)-j <= x.maxLen+1 {
			if x.depths&(1<<labels) != 0 && x.filter.maybeH(prefixFinish(h)) {
				if e := x.suffixes[host[j+1:]]; e != nil {
					best = lower(best, e.wild)
					if e.globs != nil {
						best = firstGlob(e.globs, host, best)
					}
				}
			}
			labels = min(labels+1, 63)
		}
		h = prefixStep(h, host[j])
	}
	if x.xfilter.nlens&lenBit(host) == 0 && x.xfilter.maybeH(prefixFinish(h)) {
		if i, ok := x.exact[host]; ok {
			best = lower(best, i)
		}
	}
	return found(x.rest.first(host, best))
}

// cidrIndex is a BART prefix table. Each stored prefix carries the lowest rule index
// among itself and every stored prefix containing it, so the longest-prefix match of an
// address yields the lowest rule index of all the prefixes that contain it.
//
// v4blocks has bit k set when some IPv4 prefix overlaps block k, the addresses that
// share their top v4bits bits: an IPv4 address whose block has no bit cannot match, and
// one bit test answers most misses without walking the table. The block size follows
// the number of prefixes (from /12 for a few to /20, 128 KiB, for tens of thousands)
// so that the bitmap stays sparse and small enough for the caches.
type cidrIndex struct {
	t        *bart.Table[int32]
	v4blocks []uint64
	v4bits   int
}

func (x *cidrIndex) build(prefixes map[netip.Prefix]int32) {
	if len(prefixes) == 0 {
		return
	}
	x.t = new(bart.Table[int32])
	x.v4bits = min(max(bits.Len(uint(len(prefixes)))+6, 12), 20)
	x.v4blocks = make([]uint64, 1<<x.v4bits/64)
	for p, i := range prefixes {
		x.t.Insert(p, i)
		if p.Addr().Is4() {
			b := p.Addr().As4()
			lo := binary.BigEndian.Uint32(b[:]) >> (32 - x.v4bits)
			n := uint32(1)
			if p.Bits() < x.v4bits {
				n = 1 << (x.v4bits - p.Bits())
				lo &^= n - 1
			}
			for k := lo; k < lo+n; k++ {
				x.v4blocks[k/64] |= 1 << (k % 64)
			}
		}
	}
	type upd struct {
		p netip.Prefix
		i int32
	}
	var fix []upd
	for p, i := range prefixes {
		m := i
		for _, j := range x.t.Supernets(p) {
			m = lower(m, j)
		}
		if m != i {
			fix = append(fix, upd{p, m})
		}
	}
	for _, u := range fix {
		x.t.Insert(u.p, u.i)
	}
}

func (x *cidrIndex) lookup(a netip.Addr) int32 {
	if x.t == nil || !a.IsValid() {
		return 0
	}
	if a.Is4() {
		b := a.As4()
		if k := binary.BigEndian.Uint32(b[:]) >> (32 - x.v4bits); x.v4blocks[k/64]&(1<<(k%64)) == 0 {
			return 0
		}
	}
	i, _ := x.t.Lookup(a)
	return i
}

// portIndex maps every port to the lowest rule index that lists it. The map is 256 KiB;
// the 8 KiB bitmap of ports with a rule answers most misses from cache.
type portIndex struct {
	first *[65536]int32
	some  *[1024]uint64
}

func (x *portIndex) build(rs []rule) {
	if len(rs) == 0 {
		return
	}
	x.first = new([65536]int32)
	// next[i] is the lowest port >= i not yet assigned (65536: none), with path
	// halving, so filling overlapping ranges costs O(65536) in all.
	var next [65537]int32
	for i := range next {
		next[i] = int32(i)
	}
	find := func(i int32) int32 {
		for next[i] != i {
			next[i] = next[next[i]]
			i = next[i]
		}
		return i
	}
	for _, r := range rs {
		for _, pr := range r.m.(*portMatcher).ranges {
			for p := find(int32(pr.lo)); p <= int32(pr.hi); p = find(p) {
				x.first[p] = int32(r.idx)
				next[p] = p + 1
			}
		}
	}
	x.some = new([1024]uint64)
	for p, i := range x.first {
		if i != 0 {
			x.some[p/64] |= 1 << (p % 64)
		}
	}
}

func (x *portIndex) lookup(port uint16) int32 {
	if x.first == nil || x.some[port/64]&(1<<(port%64)) == 0 {
		return 0
	}
	return x.first[port]
}

// seal builds the key filters once every rule is in.
func (x *labelIndex) seal() {
	x.filter = filterKeys(x.keys)
	for _, e := range x.keys {
		e.vfilter = filterKeys(e.values)
	}
}
func (x *imageIndex) seal()   { x.filter = filterKeys(x.exact); x.globs.seal() }
func (x *processIndex) seal() { x.filter = filterKeys(x.exact); x.globs.seal() }
func (x *domainIndex) seal() {
	x.rest.seal()
	x.xfilter = newKeyFilter(len(x.exact))
	for k := range x.exact {
		x.xfilter.nlens &^= lenBit(k)
		x.xfilter.addH(suffixHash(k))
	}
	x.filter = newKeyFilter(len(x.suffixes))
	x.depths, x.maxLen = 0, 0
	for k := range x.suffixes {
		x.filter.addH(suffixHash(k))
		x.depths |= 1 << labelCount(k)
		x.maxLen = max(x.maxLen, len(k))
	}

}
