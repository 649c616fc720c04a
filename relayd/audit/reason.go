package audit

import (
	"net"
	"net/netip"
	"strings"
)

// Reason turns an error into a Record.Reason without the destination: the text of any
// *net.OpError in the chain loses its addresses ("dial tcp 203.0.113.7:443: connect:
// connection refused" becomes "dial tcp: connect: connection refused"), a *net.DNSError
// loses the name it looked up and a *net.AddrError the address it names. Every branch of
// a joined error is cleaned, not only the first. Upstream proxy addresses (the
// operator's configuration, not the flow's) are kept.
//
// Only those errors carry the destination in a form Reason can find: an error that
// formats a destination into its own text must not be given to it. As a last guard, an
// IP address literal left anywhere else in the text becomes "<address>" (one in a URL,
// as in an upstream's name "socks5://192.0.2.1:1080", stays); host names cannot be
// recognised that way.
func Reason(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	walk(err, func(e error) bool {
		switch v := e.(type) {
		case *net.OpError:
			clean := v.Op
			if v.Net != "" {
				clean += " " + v.Net
			}
			if v.Err != nil {
				clean += ": " + Reason(v.Err)
			}
			s = strings.Replace(s, v.Error(), clean, 1)
		case *net.DNSError:
			clean := "lookup failed: " + v.Err
			if v.IsNotFound {
				clean = "lookup failed: no such host"
			}
			s = strings.Replace(s, v.Error(), clean, 1)
		case *net.AddrError:
			s = strings.Replace(s, v.Error(), v.Err, 1)
		default:
			return true
		}
		return false // its text is replaced whole: nothing below it is left to clean
	})
	return scrubAddrs(s)
}

// walk calls fn for err and, depth first, for every error it wraps (all of a joined
// error's) while fn returns true.
func walk(err error, fn func(error) bool) {
	if err == nil || !fn(err) {
		return
	}
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			walk(e, fn)
		}
	case interface{ Unwrap() error }:
		walk(u.Unwrap(), fn)
	}
}

// scrubAddrs replaces IP address literals (with or without a port, IPv6 with or without
// brackets and a zone) with "<address>", except inside a URL ("scheme://" right before it).
func scrubAddrs(s string) string {
	isAddrByte := func(c byte) bool {
		return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' ||
			c == '.' || c == ':' || c == '[' || c == ']'
	}
	var b strings.Builder
	last := 0 // s[:last] is written to b
	for i := 0; i < len(s); {
		if !isAddrByte(s[i]) {
			i++
			continue
		}
		j := i
		for j < len(s) && isAddrByte(s[j]) {
			j++
		}
		// An IPv6 address may carry a zone ("fe80::1%eth0", "[fe80::1%eth0]:443"): the
		// zone belongs to the address and goes with it, so the run takes it in, and the
		// "]:port" after it.
		if j < len(s) && s[j] == '%' && strings.Count(s[i:j], ":") >= 2 {
			k := j + 1
			for k < len(s) && isZoneByte(s[k]) {
				k++
			}
			if k > j+1 {
				j = k
				for j < len(s) && isAddrByte(s[j]) {
					j++
				}
			}
		}
		// An address may be glued to the text around it ("to:203.0.113.7:443",
		// "host_203.0.113.7", "203.0.113.7:443:x"): a leaked destination costs more than
		// a run of hex digits and dots taken for one, so no word boundary is asked for.
		start, lit := literalIn(s[i:j])
		start += i
		if lit != "" && !strings.HasSuffix(s[:start], "//") {
			b.WriteString(s[last:start])
			b.WriteString("<address>")
			last = start + len(lit)
		}
		i = j
	}
	if last == 0 {
		return s
	}
	b.WriteString(s[last:])
	return b.String()
}

// isZoneByte reports whether c may be part of an IPv6 zone: an interface name or index.
// Linux allows almost any byte in one, so only what ends a word in an error's text ends
// the zone (a ":" too, for the port or the message after it).
func isZoneByte(c byte) bool {
	return c > ' ' && c < 0x7f && !strings.ContainsRune(`%:/\[](){}<>"'`+"`,;", rune(c))
}

// literalIn finds the address literal in run, a run of the bytes one is made of: the run
// itself, or what is left once the colons that join it to a word before are dropped and
// the ":…" parts after it (a port, then whatever followed) are cut one by one. It
// returns the literal's offset in run and the literal, "" when there is none.
func literalIn(run string) (int, string) {
	start := 0
	for {
		lit := strings.TrimRight(run[start:], ".:") // "…:443: connect" ends at 443
		for lit != "" {
			if isAddrLiteral(lit) {
				return start, lit
			}
			k := strings.LastIndexByte(lit, ':')
			if k <= 0 || strings.Count(lit, ":") > 2 {
				break // no more to cut, or IPv6 (whose colons are its own)
			}
			lit = lit[:k]
		}
		if start >= len(run) || run[start] != ':' {
			return 0, ""
		}
		start++
	}
}

// isAddrLiteral reports whether s is an IP address or an address with a port.
func isAddrLiteral(s string) bool {
	if !strings.ContainsAny(s, ".:") {
		return false
	}
	if _, err := netip.ParseAddrPort(s); err == nil {
		return true
	}
	_, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
	return err == nil
}

// Redacted wraps err so that its text is Reason(err) (no destination) while errors.Is and
// errors.As still see the whole chain (a caller can still tell a refused connection or a
// timeout apart). nil stays nil.
func Redacted(err error) error {
	if err == nil {
		return nil
	}
	return &redacted{msg: Reason(err), err: err}
}

type redacted struct {
	msg string
	err error
}

func (e *redacted) Error() string { return e.msg }
func (e *redacted) Unwrap() error { return e.err }
