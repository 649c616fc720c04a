package pac

import (
	"math"
	"net/netip"
	"slices"
	"strings"

	"github.com/dop251/goja"
	"github.com/dop251/goja/ast"
)

// The PAC utility functions, natively in Go with the semantics of Mozilla's and
// Chromium's PAC libraries (pac_utils.js / pac_js_library.h). Native code cannot be
// interrupted by goja, so every function here is linear in its input and does no I/O.

// arg returns argument i as a string. A missing, undefined or null argument throws a
// TypeError, as the browsers' JavaScript versions do when they call a string method on it.
func (w *worker) arg(fc goja.FunctionCall, i int, fn string) string {
	v := fc.Argument(i)
	if goja.IsUndefined(v) || goja.IsNull(v) {
		panic(w.vm.NewTypeError("%s: argument %d is %s", fn, i+1, v.String()))
	}
	return w.guardLen(v.String(), maxInlineString)
}

// looseArg is argument i through ToString, for the parameters where the browsers'
// code accepts anything (isInNet(dnsResolve(host), ...) with a null answer is the
// common case: it is false, not an error).
func (w *worker) looseArg(fc goja.FunctionCall, i int) string {
	return w.guardLen(fc.Argument(i).String(), maxInlineString)
}

func (w *worker) install() {
	vm := w.vm
	w.vTrue, w.vFalse = vm.ToValue(true), vm.ToValue(false)
	set := func(name string, f func(goja.FunctionCall) goja.Value) {
		if err := vm.Set(name, f); err != nil {
			panic(err) // Set only fails on a frozen global object, which cannot happen here
		}
	}
	set("isPlainHostName", func(fc goja.FunctionCall) goja.Value {
		return w.boolean(isPlainHostName(w.arg(fc, 0, "isPlainHostName")))
	})
	set("dnsDomainIs", func(fc goja.FunctionCall) goja.Value {
		return w.boolean(strings.HasSuffix(w.arg(fc, 0, "dnsDomainIs"), w.arg(fc, 1, "dnsDomainIs")))
	})
	set("localHostOrDomainIs", func(fc goja.FunctionCall) goja.Value {
		return w.boolean(localHostOrDomainIs(w.looseArg(fc, 0), w.arg(fc, 1, "localHostOrDomainIs")))
	})
	set("dnsDomainLevels", func(fc goja.FunctionCall) goja.Value {
		return vm.ToValue(strings.Count(w.arg(fc, 0, "dnsDomainLevels"), "."))
	})
	set("convert_addr", func(fc goja.FunctionCall) goja.Value {
		return vm.ToValue(convertAddr(w.arg(fc, 0, "convert_addr")))
	})
	set("shExpMatch", func(fc goja.FunctionCall) goja.Value {
		subject, pattern := w.looseArg(fc, 0), w.arg(fc, 1, "shExpMatch")
		if w.inlineCall && (len(subject) > maxInlineShexp || len(pattern) > maxInlineShexpP) {
			return w.trip()
		}
		ok, err := w.shexp.match(subject, pattern)
		if err != nil {
			panic(vm.NewGoError(err))
		}
		return w.boolean(ok)
	})
	set("isInNet", func(fc goja.FunctionCall) goja.Value {
		return w.boolean(isInNet(w.looseArg(fc, 0), w.arg(fc, 1, "isInNet"), w.arg(fc, 2, "isInNet"), w.dnsResolve))
	})
	set("dnsResolve", func(fc goja.FunctionCall) goja.Value {
		if s, ok := w.dnsResolve(w.looseArg(fc, 0)); ok {
			return vm.ToValue(s)
		}
		return goja.Null()
	})
	set("isResolvable", func(fc goja.FunctionCall) goja.Value {
		_, ok := w.dnsResolve(w.looseArg(fc, 0))
		return w.boolean(ok)
	})
	set("myIpAddress", func(goja.FunctionCall) goja.Value {
		if a := w.call.MyIP.Unmap(); a.Is4() {
			return vm.ToValue(a.String())
		}
		return vm.ToValue("127.0.0.1")
	})
	set("dnsResolveEx", func(fc goja.FunctionCall) goja.Value {
		return vm.ToValue(w.dnsResolveEx(w.looseArg(fc, 0)))
	})
	set("isResolvableEx", func(fc goja.FunctionCall) goja.Value {
		return w.boolean(w.dnsResolveEx(w.looseArg(fc, 0)) != "")
	})
	set("myIpAddressEx", func(goja.FunctionCall) goja.Value {
		if a := w.call.MyIP; a.IsValid() {
			return vm.ToValue(a.Unmap().WithZone("").String())
		}
		return vm.ToValue("")
	})
	set("isInNetEx", func(fc goja.FunctionCall) goja.Value {
		return w.boolean(isInNetEx(w.looseArg(fc, 0), w.looseArg(fc, 1)))
	})
	set("sortIpAddressList", func(fc goja.FunctionCall) goja.Value {
		if s, ok := sortIPAddressList(w.arg(fc, 0, "sortIpAddressList")); ok {
			return vm.ToValue(s)
		}
		return vm.ToValue(false)
	})
	set("getClientVersion", func(goja.FunctionCall) goja.Value { return vm.ToValue("1.0") })
	set("weekdayRange", func(fc goja.FunctionCall) goja.Value {
		return w.boolean(weekdayRange(w.now(), w.loc, fc.Arguments))
	})
	set("dateRange", func(fc goja.FunctionCall) goja.Value {
		return w.boolean(dateRange(w.now(), w.loc, fc.Arguments))
	})
	set("timeRange", func(fc goja.FunctionCall) goja.Value {
		ok, err := timeRange(w.now(), w.loc, fc.Arguments)
		if err != nil {
			panic(vm.NewGoError(err))
		}
		return w.boolean(ok)
	})
	set("alert", func(fc goja.FunctionCall) goja.Value {
		if w.log != nil {
			// Debug only: a script's messages may name the destination (SPEC §5).
			w.log.Debug("pac alert", "script", w.p.name, "message", w.looseArg(fc, 0))
		}
		return goja.Undefined()
	})
}

func (w *worker) boolean(b bool) goja.Value {
	if b {
		return w.vTrue
	}
	return w.vFalse
}

// isPlainHostName follows Chromium: a name with a dot, or an IPv6 literal (a colon),
// is not plain. (Mozilla and pacparser only look for the dot.)
func isPlainHostName(h string) bool { return !strings.ContainsAny(h, ".:") }

func localHostOrDomainIs(host, hostdom string) bool {
	return host == hostdom || strings.HasPrefix(hostdom, host+".")
}

// convertAddr is Mozilla's convert_addr: each dot-separated part goes through
// JavaScript's ToNumber and `& 0xff`; missing parts count as 0; the result is a signed
// 32-bit integer.
func convertAddr(s string) int32 {
	if v, ok := quadValue(s); ok {
		return int32(v)
	}
	var r uint32
	for i := 0; i < 4; i++ {
		part := s
		if j := strings.IndexByte(s, '.'); j >= 0 {
			part, s = s[:j], s[j+1:]
		} else {
			s = ""
		}
		r |= (uint32(toInt32(jsStringToNumber(part))) & 0xff) << (24 - 8*uint(i))
		if s == "" {
			// Missing parts are undefined (NaN & 0xff = 0), like an empty last part.
			break
		}
	}
	return int32(r)
}

// quadValue is the fast path of convertAddr for a plain dotted quad of 1-3 digit
// decimal parts (any value: each part is masked with 0xff as in the slow path).
func quadValue(s string) (uint32, bool) {
	var r uint32
	for i := 0; i < 4; i++ {
		n, v := 0, uint32(0)
		for n < len(s) && n < 3 && s[n] >= '0' && s[n] <= '9' {
			v = v*10 + uint32(s[n]-'0')
			n++
		}
		if n == 0 {
			return 0, false
		}
		s = s[n:]
		r |= (v & 0xff) << (24 - 8*uint(i))
		if i < 3 {
			if s == "" || s[0] != '.' {
				return 0, false
			}
			s = s[1:]
		}
	}
	return r, s == ""
}

// isDottedQuad matches /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/ and reports
// whether every part is at most 255.
func isDottedQuad(s string) (match, valid bool) {
	valid = true
	parts := 0
	for len(s) > 0 || parts < 4 {
		n, v := 0, 0
		for n < len(s) && n < 4 && s[n] >= '0' && s[n] <= '9' {
			v = v*10 + int(s[n]-'0')
			n++
		}
		if n == 0 || n > 3 {
			return false, false
		}
		if v > 255 {
			valid = false
		}
		s = s[n:]
		parts++
		if parts == 4 {
			return s == "", valid && s == ""
		}
		if s == "" || s[0] != '.' {
			return false, false
		}
		s = s[1:]
	}
	return false, false
}

func isInNet(ipaddr, pattern, mask string, resolve func(string) (string, bool)) bool {
	match, valid := isDottedQuad(ipaddr)
	if !match {
		r, ok := resolve(ipaddr)
		if !ok {
			return false
		}
		ipaddr = r
	} else if !valid {
		return false
	}
	m := convertAddr(mask)
	return convertAddr(ipaddr)&m == convertAddr(pattern)&m
}

// hostKey is how a host is compared with the flow's host: ASCII case-insensitive,
// without IPv6 brackets.
func sameHost(a, b string) bool {
	a = strings.TrimSuffix(strings.TrimPrefix(a, "["), "]")
	return a != "" && strings.EqualFold(a, b)
}

// dnsResolve answers without any I/O: an IPv4 literal resolves to itself, the flow's
// own host to the destination address the caller already knows (IPv4 only, as in the
// browsers); anything else does not resolve.
func (w *worker) dnsResolve(h string) (string, bool) {
	if a, err := netip.ParseAddr(h); err == nil {
		if a.Is4() {
			return a.String(), true
		}
		return "", false
	}
	if d := w.call.Dst.Unmap(); d.Is4() && sameHost(h, w.host) {
		return d.String(), true
	}
	return "", false
}

// addrBuiltins are the built-ins whose answer can come from Call.Dst: dnsResolve and
// dnsResolveEx answer the flow's own host with it, isResolvable and isResolvableEx
// say whether they did, and isInNet resolves a name through dnsResolve. (myIpAddress
// answers with the workload's address, isInNetEx and convert_addr take literals.)
var addrBuiltins = map[string]bool{"dnsResolve": true, "dnsResolveEx": true, "isResolvable": true,
	"isResolvableEx": true, "isInNet": true}

// needsAddr reports whether a script can call one of addrBuiltins (Script.NeedsAddr):
// it names one (as a variable, a property or a string, which covers this.isInNet and
// this["dnsResolve"]), or it can hold the global object as a value (globalValue, from
// globalAsValue), and so look one up under a name it computes. A name a script
// declares for itself counts too: more often true is the safe side, since the only
// cost is a lookup.
func needsAddr(prog *ast.Program, globalValue bool) bool {
	found := globalValue
	walkAST(prog, func(n ast.Node) bool {
		if found {
			return false
		}
		switch n := n.(type) {
		case *ast.Identifier:
			found = addrBuiltins[n.Name.String()]
		case *ast.StringLiteral:
			found = addrBuiltins[n.Value.String()]
		}
		return !found
	})
	return found
}

// dnsResolveEx is the Microsoft extension: IPv4 or IPv6, "" when nothing resolves.
func (w *worker) dnsResolveEx(h string) string {
	hh := strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if a, err := netip.ParseAddr(hh); err == nil && a.Zone() == "" {
		return a.String()
	}
	if d := w.call.Dst; d.IsValid() && sameHost(h, w.host) {
		return d.Unmap().WithZone("").String()
	}
	return ""
}

// isInNetEx follows Chromium: an IP literal (no resolution) inside a CIDR block of the
// same family; false on anything unparsable.
func isInNetEx(ip, prefix string) bool {
	a, err := netip.ParseAddr(ip)
	if err != nil || a.Zone() != "" {
		return false
	}
	p, err := netip.ParsePrefix(prefix)
	if err != nil {
		return false
	}
	if a.Is4() != p.Addr().Is4() {
		return false
	}
	return p.Contains(a)
}

// sortIPAddressList follows Chromium: spaces and tabs are removed, entries are split at
// ';' (empty ones skipped), every entry must be an IP literal, and the result lists IPv6
// before IPv4, each ascending. ok is false (the script sees false) on any failure.
func sortIPAddressList(list string) (string, bool) {
	list = strings.NewReplacer(" ", "", "\t", "").Replace(list)
	var addrs []netip.Addr
	for _, s := range strings.Split(list, ";") {
		if s == "" {
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return "", false
		}
		addrs = append(addrs, a)
	}
	if len(addrs) == 0 {
		return "", false
	}
	slices.SortStableFunc(addrs, func(x, y netip.Addr) int {
		if x.Is6() != y.Is6() {
			if x.Is6() {
				return -1
			}
			return 1
		}
		return x.Compare(y)
	})
	var b strings.Builder
	for i, a := range addrs {
		if i > 0 {
			b.WriteByte(';')
		}
		b.WriteString(a.String())
	}
	return b.String(), true
}

// jsStringToNumber is JavaScript's ToNumber applied to a string.
func jsStringToNumber(s string) float64 {
	s = strings.TrimFunc(s, isJSSpace)
	if s == "" {
		return 0
	}
	if len(s) > 2 && s[0] == '0' {
		base := 0
		switch s[1] {
		case 'x', 'X':
			base = 16
		case 'o', 'O':
			base = 8
		case 'b', 'B':
			base = 2
		}
		if base != 0 {
			v := 0.0
			for _, c := range s[2:] {
				d := digitVal(c)
				if d < 0 || d >= base {
					return math.NaN()
				}
				v = v*float64(base) + float64(d)
			}
			return v
		}
	}
	switch s {
	case "Infinity", "+Infinity":
		return math.Inf(1)
	case "-Infinity":
		return math.Inf(-1)
	}
	// StrDecimalLiteral: [+-] digits [. digits] [e [+-] digits], or . digits ...
	i := 0
	if s[i] == '+' || s[i] == '-' {
		i++
	}
	digits := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
		digits++
	}
	if i < len(s) && s[i] == '.' {
		i++
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
			digits++
		}
	}
	if digits == 0 {
		return math.NaN()
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		ed := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
			ed++
		}
		if ed == 0 {
			return math.NaN()
		}
	}
	if i != len(s) {
		return math.NaN()
	}
	return parseDecimal(s)
}

func digitVal(c rune) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'z':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'Z':
		return int(c-'A') + 10
	}
	return -1
}

// isJSSpace is JavaScript's WhiteSpace and LineTerminator.
func isJSSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0xa0, 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000, 0xfeff:
		return true
	}
	return r >= 0x2000 && r <= 0x200a
}

// toInt32 is JavaScript's ToInt32.
func toInt32(f float64) int32 {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0
	}
	f = math.Trunc(f)
	f = math.Mod(f, 1<<32)
	if f < 0 {
		f += 1 << 32
	}
	return int32(uint32(f))
}
