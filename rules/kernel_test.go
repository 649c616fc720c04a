package rules

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The kernel plan's contract: an entry the kernel decides carries exactly Decide's
// answer for every flow it matches, whatever hostname and process the flow has; and
// for a policy with nothing flow-dependent, every entry is known and relays exactly the
// flows whose exit is not direct.
func TestPlanDifferential(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 60
	}
	flows := 0
	for seed := 0; seed < seeds; seed++ {
		r := rand.New(rand.NewPCG(uint64(seed), 0x6b65726e))
		src, labels, image := genKernelPolicy(r, seed)
		p, err := Parse(fmt.Sprintf("gen-%d.yaml", seed), []byte(src), LoadOptions{})
		if err != nil {
			t.Fatalf("seed %d: %v\n%s", seed, err, src)
		}
		plan := p.Plan(labels, image)
		checkPlanShape(t, plan, src)
		dependent := p.script != nil
		for i := range p.rules {
			switch m := p.rules[i].m.(type) {
			case *processMatcher, *domainMatcher:
				dependent = true
			case *patternMatcher:
				dependent = dependent || m.glob != ""
			}
		}
		hosts, procs := flowVariants(p)
		for _, dst := range edgeDestinations(r, p) {
			flows++
			e := plan.Lookup(dst)
			if e == nil {
				t.Fatalf("seed %d: no entry for %s\n%s", seed, dst, src)
			}
			if !e.Relay && (!e.Known || e.Decision.Exit != ExitDirect) {
				t.Fatalf("seed %d: kernel entry %s is not a known direct decision", seed, e)
			}
			if !dependent && !e.Known {
				t.Fatalf("seed %d: policy without flow-dependent rules has an unknown entry %s\n%s", seed, e, src)
			}
			for _, h := range hosts {
				for _, pr := range procs {
					f := Flow{Labels: labels, Image: image, Host: h, Process: pr, Dst: dst}
					d := p.Decide(&f)
					if e.Known && d != e.Decision {
						t.Fatalf("seed %d: flow %s host %q process %+v: plan says %+v (entry %s), Decide says %+v\n%s",
							seed, dst, h, pr, e.Decision, e, d, src)
					}
					if !dependent && e.Relay != (d.Exit != ExitDirect) {
						t.Fatalf("seed %d: flow %s: relay=%v but Decide exit is %s\n%s", seed, dst, e.Relay, d.Exit, src)
					}
				}
			}
		}
	}
	t.Logf("%d policies, %d destinations", seeds, flows)
}

func checkPlanShape(t *testing.T, k *KernelPlan, src string) {
	t.Helper()
	if len(k.Entries) < 2 {
		t.Fatalf("plan has %d entries, want the guard and a catch-all\n%s", len(k.Entries), src)
	}
	if g := k.Entries[0]; g.Decision != guardDecision || g.Relay || !slices.Equal(g.Prefixes, metadata) {
		t.Fatalf("first entry is %s, want the guard", &g)
	}
	last := k.Entries[len(k.Entries)-1]
	if last.Prefixes != nil || last.Ports != nil {
		t.Fatalf("last entry %s is not a catch-all", &last)
	}
	for _, e := range k.Entries[1 : len(k.Entries)-1] {
		if e.Prefixes == nil && e.Ports == nil {
			t.Fatalf("catch-all entry %s before the end\n%s", &e, src)
		}
	}
	if s := k.Share(); s < 0 || s > 1 {
		t.Fatalf("share %v", s)
	}
}

var prefixPool = []string{
	"10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "10.1.2.3", "192.0.2.0/24", "192.0.2.128/25",
	"198.51.100.0/24", "198.51.100.7", "0.0.0.0/1", "128.0.0.0/1", "169.254.0.0/16", "169.254.169.254",
	"169.0.0.0/8", "203.0.113.0/24", "fd00::/8", "fd00::/64", "fd00::1", "2001:db8::/32",
	"2001:db8:1::/48", "::/1", "8000::/1", "::/96", "0.0.0.0/0", "::/0",
}

var portPool = []string{"443", "80", "1-1024", "8000-8999", "65535", "1", "22,443,5432", "1024-65535", "8080"}

var exitPool = []string{"direct", "direct", "proxy", "deny", "egress-b", "cluster", "block"}

// genKernelPolicy returns a random rules file, in either form, and a workload.
func genKernelPolicy(r *rand.Rand, seed int) (string, map[string]string, string) {
	labels := map[string]string{"app": "web"}
	if r.IntN(2) == 0 {
		labels["kl.route"] = "fast"
	}
	image := []string{"nginx", "docker.io/acme/api:1", ""}[r.IntN(3)]
	pick := func(pool []string) string { return pool[r.IntN(len(pool))] }
	var b strings.Builder
	n := r.IntN(8)
	if seed%3 == 2 {
		fmt.Fprintf(&b, "default: %s\nrules:\n", pick(exitPool[:4]))
		for i := 0; i < n; i++ {
			var pat string
			switch r.IntN(9) {
			case 0:
				pat = "*"
			case 1:
				pat = "*:" + strings.Split(pick(portPool), ",")[0]
			case 2:
				pat = "*.corp.example"
			case 3:
				pat = "api.example.com:443"
			default:
				pf := pick(prefixPool)
				pat = pf
				if r.IntN(2) == 0 {
					if strings.Contains(pf, ":") {
						pat = "[" + pf + "]"
					}
					pat += ":" + strings.Split(pick(portPool), ",")[0]
				}
			}
			if r.IntN(12) == 0 {
				continue // fewer glob-free catch-alls
			}
			fmt.Fprintf(&b, "  - pattern: %q\n    route: %s\n    note: n%d\n", pat, pick(exitPool[:4]), i)
		}
		if n == 0 {
			b.WriteString("  - pattern: \"10.0.0.0/8\"\n    route: direct\n")
		}
		return b.String(), labels, image
	}
	fmt.Fprintf(&b, "default: %s\nrules:\n", pick(exitPool[:4]))
	flowDependent := seed%5 == 0
	for i := 0; i < n+1; i++ {
		var field, value string
		switch x := r.IntN(20); {
		case x < 8:
			k := 1 + r.IntN(3)
			var ps []string
			for j := 0; j < k; j++ {
				ps = append(ps, pick(prefixPool))
			}
			field, value = "cidr", strings.Join(ps, ",")
		case x < 14:
			field, value = "port", pick(portPool)
		case x < 16:
			field, value = "label", []string{"kl.route=fast", "team", "app=db"}[r.IntN(3)]
		case x < 18:
			field, value = "image", []string{"nginx", "docker.io/acme/*", "redis"}[r.IntN(3)]
		default:
			if !flowDependent {
				field, value = "port", pick(portPool)
				break
			}
			if r.IntN(2) == 0 {
				field, value = "process", "curl|wget*"
			} else {
				field, value = "domain", "*.example.com,api.test"
			}
		}
		act := "action: " + pick(exitPool)
		if act == "action: egress-b" {
			act = "exit: egress-b"
		}
		fmt.Fprintf(&b, "  - %s: %q\n    %s\n    note: n%d\n", field, value, act, i)
	}
	return b.String(), labels, image
}

// edgeDestinations draws destinations from the policy's own edges: the first and last
// address of every prefix and the addresses just outside, the guard's, both families'
// extremes, with ports at every range end and just outside.
func edgeDestinations(r *rand.Rand, p *Policy) []netip.AddrPort {
	addrs := []netip.Addr{
		netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("169.254.0.0"), netip.MustParseAddr("169.254.255.255"),
		netip.MustParseAddr("169.253.255.255"), netip.MustParseAddr("169.255.0.0"),
		netip.MustParseAddr("0.0.0.1"), netip.MustParseAddr("255.255.255.255"), netip.MustParseAddr("192.0.2.1"),
		netip.MustParseAddr("::1"), netip.MustParseAddr("ffff::1"), netip.MustParseAddr("fd00::2"),
	}
	ports := []uint16{1, 2, 80, 443, 1023, 1024, 1025, 65534, 65535}
	addPrefix := func(pf netip.Prefix) {
		lo := pf.Masked().Addr()
		hi := lastOf(pf)
		addrs = append(addrs, lo, hi)
		if a := lo.Prev(); a.IsValid() {
			addrs = append(addrs, a)
		}
		if a := hi.Next(); a.IsValid() {
			addrs = append(addrs, a)
		}
	}
	addPorts := func(lo, hi uint16) {
		ports = append(ports, lo, hi, lo-1, hi+1)
	}
	for i := range p.rules {
		switch m := p.rules[i].m.(type) {
		case *cidrMatcher:
			for _, pf := range m.prefixes {
				addPrefix(pf)
			}
		case *portMatcher:
			for _, pr := range m.ranges {
				addPorts(pr.lo, pr.hi)
			}
		case *patternMatcher:
			if m.prefix.IsValid() {
				addPrefix(m.prefix)
			}
			if m.ports.lo != 0 {
				addPorts(m.ports.lo, m.ports.hi)
			}
		}
	}
	var out []netip.AddrPort
	for _, a := range addrs {
		for _, port := range ports {
			if port == 0 {
				continue // no TCP flow goes to port 0
			}
			if r.IntN(3) == 0 {
				continue // a sample, to keep the cross product bounded
			}
			out = append(out, netip.AddrPortFrom(a, port))
			if a.Is4() && r.IntN(8) == 0 {
				// An IPv4-mapped destination, as an IPv6 socket reports it.
				out = append(out, netip.AddrPortFrom(netip.AddrFrom16(a.As16()), port))
			}
		}
	}
	return out
}

func lastOf(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// flowVariants are hostnames and processes that make every domain, host pattern and
// process rule of p match, and ones that match none.
func flowVariants(p *Policy) ([]string, []Process) {
	hosts := []string{"", "unrelated.invalid"}
	procs := []Process{{}, {Known: true, Comm: "sh", Exe: "sh", Argv0: "sh"}}
	sub := func(g string) string { return strings.NewReplacer("*", "x", "?", "y").Replace(g) }
	for i := range p.rules {
		switch m := p.rules[i].m.(type) {
		case *domainMatcher:
			for _, g := range m.globs {
				hosts = append(hosts, sub(g))
			}
		case *patternMatcher:
			if m.glob != "" {
				hosts = append(hosts, sub(m.glob))
			}
		case *processMatcher:
			for _, a := range m.alts {
				procs = append(procs, Process{Known: true, Comm: sub(a)})
			}
		}
	}
	return hosts, procs
}

func TestPlanCases(t *testing.T) {
	tests := []struct {
		name   string
		src    string
		labels map[string]string
		image  string
		whole  bool
		share  float64
	}{
		{name: "cidr-port-default", src: "default: proxy\nrules:\n  - cidr: 10.0.0.0/8\n    action: direct\n  - port: 443\n    action: direct\n  - port: 22\n    action: deny\n", share: 0.5},
		{name: "all-direct", src: "default: direct\nrules:\n  - cidr: 10.0.0.0/8\n    action: direct\n", share: 1},
		{name: "label-decides", src: "default: direct\nrules:\n  - label: kl.route=proxy\n    action: proxy\n  - cidr: 10.0.0.0/8\n    action: direct\n", labels: map[string]string{"kl.route": "proxy"}, whole: true, share: 0},
		{name: "label-not-matching", src: "default: direct\nrules:\n  - label: kl.route=proxy\n    action: proxy\n  - cidr: 10.0.0.0/8\n    action: direct\n", labels: map[string]string{"kl.route": "other"}, share: 1},
		{name: "image-decides", src: "default: proxy\nrules:\n  - image: nginx\n    action: direct\n", image: "docker.io/library/nginx:latest", whole: true, share: 1},
		{name: "domain-relays-all", src: "default: direct\nrules:\n  - cidr: 10.0.0.0/8\n    action: direct\n  - domain: '*.example.com'\n    action: proxy\n", share: 0},
		{name: "process-relays-all", src: "default: direct\nrules:\n  - process: curl\n    action: deny\n", share: 0},
		{name: "script-relays-all", src: "default: direct\nscript: |\n  function FindProxyForURL(url, host) { return \"DIRECT\"; }\n", share: 0},
		{name: "pattern-glob-after-cidr", src: "default: direct\nrules:\n  - pattern: 10.0.0.0/8\n    route: cluster\n  - pattern: '*.corp.example:443'\n    route: client\n", share: 2.0 / 3},
		{name: "pattern-star", src: "default: direct\nrules:\n  - pattern: '*'\n    route: direct\n  - pattern: 10.0.0.0/8\n    route: deny\n", share: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustParse(t, tt.src, LoadOptions{})
			k := p.Plan(tt.labels, tt.image)
			checkPlanShape(t, k, tt.src)
			if k.Whole != tt.whole {
				t.Errorf("Whole = %v, want %v", k.Whole, tt.whole)
			}
			if got := k.Share(); fmt.Sprintf("%.3f", got) != fmt.Sprintf("%.3f", tt.share) {
				t.Errorf("Share = %v, want %v", got, tt.share)
			}
			golden := filepath.Join("testdata", "kernel-"+tt.name+".golden")
			var b strings.Builder
			for i := range k.Entries {
				fmt.Fprintf(&b, "%d %s\n", i, &k.Entries[i])
			}
			if os.Getenv("KL_UPDATE_GOLDEN") != "" {
				if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (KL_UPDATE_GOLDEN=1 writes it)", err)
			}
			if b.String() != string(want) {
				t.Errorf("plan differs from %s:\n%s\nwant:\n%s", golden, b.String(), want)
			}
		})
	}
}

func TestPlanAllKernel(t *testing.T) {
	p := mustParse(t, "default: direct\nrules:\n  - cidr: 10.0.0.0/8\n    action: direct\n", LoadOptions{})
	if k := p.Plan(nil, ""); !k.AllKernel() || k.AllRelay() {
		t.Errorf("all-direct policy: AllKernel %v AllRelay %v", k.AllKernel(), k.AllRelay())
	}
	p = mustParse(t, "default: proxy\nrules:\n  - process: curl\n    action: direct\n", LoadOptions{})
	if k := p.Plan(nil, ""); k.AllKernel() || !k.AllRelay() {
		t.Errorf("process policy: AllKernel %v AllRelay %v", k.AllKernel(), k.AllRelay())
	}
}

func BenchmarkPlan10k(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("default: proxy\nrules:\n")
	for i := 0; i < 10000; i++ {
		if i%4 == 3 {
			fmt.Fprintf(&sb, "  - port: \"%d\"\n    action: direct\n", 1+i)
			continue
		}
		fmt.Fprintf(&sb, "  - cidr: \"10.%d.%d.0/24\"\n    action: %s\n", i/256, i%256, []string{"direct", "proxy"}[i%2])
	}
	p, err := Parse("10k.yaml", []byte(sb.String()), LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		p.Plan(nil, "")
	}
}
