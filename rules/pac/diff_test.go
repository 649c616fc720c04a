package pac

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/kl-egress/kl/tests/testutil"
)

// The differential test runs the same PAC program, a long list of built-in calls over
// generated hosts, patterns and addresses, in our sandbox and in Debian's
// python3-pacparser (SpiderMonkey with Mozilla's pac_utils.js), and compares every
// answer. Only built-ins that need neither DNS nor the clock take part: pacparser's
// dnsResolve does real lookups and its Date is the wall clock.

// pacparserPython returns a python3 that can import pacparser. Without one the test
// skips, or fails in CI (KL_E2E=1), like testutil.RequireTool.
func pacparserPython(t testing.TB) string {
	t.Helper()
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		if p, err := exec.LookPath(py); err == nil {
			if exec.Command(p, "-c", "import pacparser").Run() == nil {
				return p
			}
		}
	}
	testutil.RequireTool(t, "python3")
	testutil.Unavailable(t, "python3 cannot import pacparser (install python3-pacparser)")
	return ""
}

// pacparserEval returns FindProxyForURL's raw answer from pacparser.
func pacparserEval(t testing.TB, py, script, url, host, myip string) string {
	t.Helper()
	req, _ := json.Marshal(map[string]string{"script": script, "url": url, "host": host, "myip": myip})
	cmd := exec.Command(py, "testdata/pacparser_driver.py", "eval")
	cmd.Stdin = bytes.NewReader(req)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("pacparser: %v\n%s", err, errb.String())
	}
	return out.String()
}

type diffCase struct {
	fn   string
	args []string
}

func (c diffCase) js() string {
	var b strings.Builder
	b.WriteString(c.fn + "(")
	for i, a := range c.args {
		if i > 0 {
			b.WriteString(", ")
		}
		j, _ := json.Marshal(a)
		b.Write(j)
	}
	b.WriteString(")")
	return b.String()
}

var (
	labels   = []string{"www", "a", "b", "corp", "example", "com", "net", "x-y", "local", "1", "10", "255", "WWW", "Example", "ads", "api2", "", "_srv"}
	specials = []string{"", "localhost", "www", "..", ".", "a.", ".a", "::1", "fe80::1", "1.2.3.4", "www.example.com"}
)

func genHost(r *rand.Rand) string {
	if r.IntN(8) == 0 {
		return specials[r.IntN(len(specials))]
	}
	n := 1 + r.IntN(4)
	parts := make([]string, n)
	for i := range parts {
		parts[i] = labels[r.IntN(len(labels))]
	}
	return strings.Join(parts, ".")
}

// genPattern derives a pattern from a host: some characters become wildcards, and
// some patterns get the regex syntax real PAC files use.
func genPattern(r *rand.Rand, host string) string {
	var b strings.Builder
	for i := 0; i < len(host); i++ {
		switch r.IntN(10) {
		case 0:
			b.WriteByte('*')
		case 1:
			b.WriteByte('?')
		default:
			b.WriteByte(host[i])
		}
	}
	p := b.String()
	switch r.IntN(12) {
	case 0:
		p = "*." + p
	case 1:
		p += "*"
	case 2:
		p = "*(www|api2|corp).*"
	case 3:
		p = "[a-c]*" + p
	case 4:
		p = "*.(com|net)"
	case 5:
		p = "a+.*"
	case 6:
		p = "*[0-9]*"
	}
	return p
}

func genQuad(r *rand.Rand) string {
	oct := func() string {
		switch r.IntN(10) {
		case 0:
			return fmt.Sprint(256 + r.IntN(744))
		case 1:
			return fmt.Sprintf("%03d", r.IntN(256))
		default:
			return fmt.Sprint([]int{0, 10, 127, 172, 192, 168, 255, 1, 16}[r.IntN(9)] + r.IntN(2))
		}
	}
	return oct() + "." + oct() + "." + oct() + "." + oct()
}

func genMask(r *rand.Rand) string {
	bits := r.IntN(33)
	m := uint32(0)
	if bits > 0 {
		m = ^uint32(0) << (32 - bits)
	}
	if r.IntN(6) == 0 {
		m = r.Uint32() // not a contiguous mask: still plain bitwise AND in every implementation
	}
	return fmt.Sprintf("%d.%d.%d.%d", m>>24, m>>16&0xff, m>>8&0xff, m&0xff)
}

func genAddrish(r *rand.Rand) string {
	switch r.IntN(6) {
	case 0:
		return genHost(r)
	case 1:
		return "1.2"
	case 2:
		return " 12 .0x10.1e1.-1"
	}
	return genQuad(r)
}

func genCases(n int) []diffCase {
	r := rand.New(rand.NewPCG(1, 2))
	var cs []diffCase
	for len(cs) < n {
		h := genHost(r)
		switch r.IntN(9) {
		case 8:
			cs = append(cs, genInNetEx(r))
		case 0:
			cs = append(cs, diffCase{"isPlainHostName", []string{h}})
		case 1:
			d := genHost(r)
			if r.IntN(2) == 0 && strings.Contains(h, ".") {
				d = h[strings.IndexByte(h, '.'):]
			}
			cs = append(cs, diffCase{"dnsDomainIs", []string{h, d}})
		case 2:
			hd := genHost(r)
			if r.IntN(2) == 0 {
				hd = h + "." + genHost(r)
			}
			cs = append(cs, diffCase{"localHostOrDomainIs", []string{h, hd}})
		case 3:
			cs = append(cs, diffCase{"dnsDomainLevels", []string{h}})
		case 4, 5:
			cs = append(cs, diffCase{"shExpMatch", []string{h, genPattern(r, h)}})
		case 6:
			cs = append(cs, diffCase{"convert_addr", []string{genAddrish(r)}})
		case 7:
			// Only addresses that match the dotted-quad test: anything else would make
			// pacparser resolve it over DNS.
			ip, pat := genQuad(r), genQuad(r)
			if r.IntN(2) == 0 { // same network, different host part
				pat = ip[:strings.LastIndexByte(ip, '.')] + "." + fmt.Sprint(r.IntN(256))
			}
			cs = append(cs, diffCase{"isInNet", []string{ip, pat, genMask(r)}})
		}
	}
	return cs
}

// trickyPatterns exercise the regex syntax that survives shExpMatch's translation.
var trickyPatterns = []string{"a{2}", "a{", "a{1,", "]", `\\.`, "$", "^a", "a$", "(?:a)", "a|b", "(a)(b)", "[^a]", "[a-", "\\d",
	"\\w+", "\\s", "x\\b", "(a", "a)", "*", "?", "**", "a**b", ".", "a.b", "[.]", "a\\", "\\", "[]", "[]a]", "[^]", "[^]a", "a{0}", "(|a)", "a+?", "a*?b", "(?=a)a", "(a)\\1"}

func trickyCases() []diffCase {
	var cs []diffCase
	for _, p := range trickyPatterns {
		for _, h := range []string{"", "a", "aa", "ab", "b", "a.b", "axb", "1", "x b", "a]", "a{", "a\\", ".", "*"} {
			cs = append(cs, diffCase{"shExpMatch", []string{h, p}})
		}
	}
	return cs
}

var v6s = []string{"::1", "::", "2001:db8::1", "2001:db8:0:1::5", "3ffe:8311:ffff:abcd:1234:dead:beef:101", "fd00::7", "fe80::1:2"}

// genInNetEx makes isInNetEx calls on IPv4 (dotted quads only: anything else would go
// to pacparser's IPv6 code) and IPv6 literals, with prefixes from the same family,
// the other family and out-of-range lengths.
func genInNetEx(r *rand.Rand) diffCase {
	if r.IntN(2) == 0 {
		ip := genQuad(r)
		pfx := ip[:strings.LastIndexByte(ip, '.')] + ".0"
		if r.IntN(3) == 0 {
			pfx = genQuad(r)
		}
		return diffCase{"isInNetEx", []string{ip, fmt.Sprintf("%s/%d", pfx, r.IntN(36))}}
	}
	ip := v6s[r.IntN(len(v6s))]
	pfx := v6s[r.IntN(len(v6s))]
	if r.IntN(3) == 0 {
		pfx = ip
	}
	return diffCase{"isInNetEx", []string{ip, fmt.Sprintf("%s/%d", pfx, r.IntN(140))}}
}

func diffScript(cs []diffCase) string {
	var b strings.Builder
	b.WriteString("function T(f) { try { return String(f()); } catch (e) { return 'EXC'; } }\n")
	b.WriteString("function FindProxyForURL(url, host) {\n var o = [];\n")
	for _, c := range cs {
		fmt.Fprintf(&b, " o.push(T(function () { return %s; }));\n", c.js())
	}
	b.WriteString(" o.push(myIpAddress());\n return o.join('\\n');\n}\n")
	return b.String()
}

var leadingZero = regexp.MustCompile(`(^|\.)0[0-9]`)

func isAddr(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil
}

// knownDifference names the cases where the two implementations legitimately differ.
func knownDifference(c diffCase, ours, theirs string) string {
	switch c.fn {
	case "shExpMatch":
		if ours == "EXC" && (strings.Contains(c.args[1], "(?=") || strings.Contains(c.args[1], `\1`)) {
			return "lookahead and backreferences need a backtracking engine: refused (an exception, so deny), never run"
		}
	case "isInNetEx":
		ip := c.args[0]
		pfx, bits, _ := strings.Cut(c.args[1], "/")
		switch {
		case leadingZero.MatchString(ip) || leadingZero.MatchString(pfx):
			return "isInNetEx: an octet with a leading zero is octal to Chromium, decimal to Mozilla; not an address here (false)"
		case !isAddr(pfx) && ours == "false":
			return "isInNetEx: a prefix that is not an address (an octet over 255) is false here; pacparser masks it with & 0xff"
		case bits == "0" && ours == "true":
			return "isInNetEx: /0 contains every address of the family (Chromium); pacparser's isInNetEx4 answers false"
		}
	case "isPlainHostName":
		if strings.Contains(c.args[0], ":") && ours == "false" && theirs == "true" {
			return "Chromium: an IPv6 literal is not a plain host name; Mozilla/pacparser only look for a dot"
		}
	}
	return ""
}

func TestDifferentialPacparser(t *testing.T) {
	py := pacparserPython(t)
	cs := append(genCases(3000), trickyCases()...)
	script := diffScript(cs)
	const myip = "198.51.100.23"
	theirs := strings.Split(pacparserEval(t, py, script, "https://x.example/", "x.example", myip), "\n")

	s := mustCompile(t, script, Options{})
	ours := strings.Split(rawEval(t, s, Call{Host: "x.example", MyIP: mustAddr(myip)}), "\n")
	if len(ours) != len(cs)+1 || len(theirs) != len(cs)+1 {
		t.Fatalf("answers: ours %d, pacparser %d, want %d", len(ours), len(theirs), len(cs)+1)
	}
	if ours[len(cs)] != myip || theirs[len(cs)] != myip {
		t.Errorf("myIpAddress() = %q (ours), %q (pacparser), want %s", ours[len(cs)], theirs[len(cs)], myip)
	}
	explained := map[string]int{}
	perFn := map[string]int{}
	trues := map[string]int{}
	for i, c := range cs {
		perFn[c.fn]++
		if theirs[i] == "true" {
			trues[c.fn]++
		}
		if ours[i] == theirs[i] {
			continue
		}
		if why := knownDifference(c, ours[i], theirs[i]); why != "" {
			explained[why]++
			continue
		}
		t.Errorf("%s = %q here, %q in pacparser", c.js(), ours[i], theirs[i])
	}
	t.Logf("%d calls compared: %v", len(cs), perFn)
	// The generated cases must exercise both answers, or the comparison says little.
	for _, fn := range []string{"isPlainHostName", "dnsDomainIs", "localHostOrDomainIs", "shExpMatch", "isInNet"} {
		if n := trues[fn]; n < perFn[fn]/10 || n > perFn[fn]*9/10 {
			t.Errorf("%s: %d of %d cases are true; the generator needs a better mix", fn, n, perFn[fn])
		}
	}
	for why, n := range explained {
		t.Logf("%d known differences: %s", n, why)
	}
}

// TestDifferentialCorporate runs the benchmark's corporate PAC file in both engines
// over generated hosts (and IP literals) and compares the raw answers.
func TestDifferentialCorporate(t *testing.T) {
	py := pacparserPython(t)
	script := corporatePAC(t)
	r := rand.New(rand.NewPCG(3, 4))
	extra := []string{"intranet", "localhost", "a.corp.example.com", "wiki", "x.svc.cluster.local", "ads.example.com",
		"www.doubleclick.net", "files.torrent.example", "api.partner-b.example", "api7.payments.example",
		"a.b.c.d.e.f.g.example", "eu1.salesforce.com", "x.sharepoint.com", "api.github.com", "github.com",
		"10.1.2.3", "172.20.1.1", "192.168.9.9", "127.0.0.1", "100.64.1.1", "8.8.8.8", "WWW.Example.ORG"}
	hosts := append([]string(nil), extra...)
	for len(hosts) < 400 {
		h := genHost(r)
		if r.IntN(4) == 0 {
			h = genQuad(r) // pacparser would resolve anything else that looks like an address
		}
		if strings.HasPrefix(strings.ToLower(h), "updates.") || strings.Contains(h, ":") || h == "" {
			continue // timeRange reads pacparser's wall clock; URLs need a host
		}
		hosts = append(hosts, h)
	}
	s := mustCompile(t, script, Options{})
	calls := make([][2]string, len(hosts))
	var ours []string
	for i, h := range hosts {
		url, host := BuildURL(Call{Host: h})
		calls[i] = [2]string{url, host}
		ours = append(ours, rawEval(t, s, Call{Host: h}))
	}
	req, _ := json.Marshal(map[string]any{"script": script, "calls": calls})
	cmd := exec.Command(py, "testdata/pacparser_driver.py", "many")
	cmd.Stdin = bytes.NewReader(req)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("pacparser: %v", err)
	}
	theirs := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(theirs) != len(hosts) {
		t.Fatalf("pacparser gave %d answers for %d hosts", len(theirs), len(hosts))
	}
	kinds := map[string]bool{}
	for i := range hosts {
		kinds[strings.Fields(ours[i])[0]] = true
		if ours[i] != theirs[i] {
			t.Errorf("FindProxyForURL(%q, %q) = %q here, %q in pacparser", calls[i][0], calls[i][1], ours[i], theirs[i])
		}
	}
	if len(kinds) < 5 {
		t.Errorf("only %d kinds of answers over %d hosts: %v", len(kinds), len(hosts), kinds)
	}
}
