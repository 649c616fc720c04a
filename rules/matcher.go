package rules

import (
	"net/netip"
	"strings"
	"unsafe"
)

// matcher is one rule's match field, parsed and validated by its constructor. Match
// answers for one flow; String gives the value back in canonical form (for explain and
// lint). The compiled indexes answer Decide; matchers answer the reference walk,
// `explain` (which other rules matched) and lint.
type matcher interface {
	Match(v *view) bool
	String() string
}

// view is a Flow normalized once per decision: the hostname lower-cased without its
// trailing dot, the address unmapped, the image also in normalized form.
type view struct {
	labels    map[string]string
	image     string // as given; "" unknown
	imageNorm string // normalized reference; "" unknown
	proc      Process
	host      string     // "" unknown (or an IP literal, which lands in addr)
	addr      netip.Addr // invalid when unknown
	port      uint16     // 0 when unknown
}

const maxHostLen = 255

// splitHost drops one trailing dot from a hostname and reports whether it still has
// upper-case letters to fold. A host that is an IP literal (also in brackets) comes
// back as an address instead, also with one trailing dot ("169.254.169.254.",
// "[fe80::1]."): a resolver answers such a name with the address itself, so the
// metadata guard and cidr rules must see it as one.
//
// Only a host that can be a literal is parsed as one: one starting with a digit, '['
// or ':', or with a group of hex digits and a ':' (fd00:ec2::254, fe80::1), which no
// host name does. An IPv6 group has at most four digits, so that costs a look at five
// bytes at most, and one for most names (api.example.com stops at the p).
func splitHost(h string) (host string, lit netip.Addr, fold bool) {
	if h == "" {
		return "", netip.Addr{}, false
	}
	if c := h[0]; c >= '0' && c <= '9' || c == '[' || c == ':' || c|0x20 >= 'a' && c|0x20 <= 'f' && hexGroup(h) {
		if a, ok := ipLiteral(h); ok {
			return "", a, false
		}
		if len(h) > 1 && h[len(h)-1] == '.' {
			if a, ok := ipLiteral(h[:len(h)-1]); ok {
				return "", a, false
			}
		}
	}
	h = strings.TrimSuffix(h, ".")
	for i := 0; i < len(h); i++ {
		if c := h[i]; c >= 'A' && c <= 'Z' {
			return h, netip.Addr{}, true
		}
	}
	return h, netip.Addr{}, false
}

// hexGroup reports whether h, which starts with a hex digit, goes on with up to three
// more and a ':', as an IPv6 address does.
func hexGroup(h string) bool {
	for i := 1; i < len(h) && i <= 4; i++ {
		switch c := h[i]; {
		case c == ':':
			return true
		case c >= '0' && c <= '9', c|0x20 >= 'a' && c|0x20 <= 'f':
		default:
			return false
		}
	}
	return false
}

// ipLiteral parses an IP address, also in brackets, without its zone.
func ipLiteral(s string) (netip.Addr, bool) {
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		s = s[1 : len(s)-1]
	}
	a, err := netip.ParseAddr(s)
	return a.WithZone(""), err == nil
}

// foldHost lower-cases h into buf (allocating only for names longer than any DNS name).
func foldHost(h string, buf *[maxHostLen + 1]byte) string {
	if len(h) > len(buf) {
		return strings.ToLower(h)
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		buf[i] = c
	}
	return unsafe.String(&buf[0], len(h))
}

// normHost is splitHost followed by foldHost when needed.
func normHost(h string, buf *[maxHostLen + 1]byte) (string, netip.Addr) {
	host, lit, fold := splitHost(h)
	if fold {
		host = foldHost(host, buf)
	}
	return host, lit
}

// flowAddr is the flow's destination address, unmapped and without zone, or the
// address of an IP-literal host when the flow has none.
func flowAddr(f *Flow, lit netip.Addr) netip.Addr {
	a := f.Dst.Addr()
	if !a.IsValid() {
		a = lit
	}
	return a.Unmap().WithZone("")
}

// makeView normalizes a flow. The buffers live in the caller's frame.
func makeView(f *Flow, host string, addr netip.Addr, ib *[maxImageLen]byte) view {
	return view{
		labels:    f.Labels,
		image:     f.Image,
		imageNorm: normalizeImage(f.Image, ib),
		proc:      f.Process,
		host:      host,
		addr:      addr,
		port:      f.Dst.Port(),
	}
}
