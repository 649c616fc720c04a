// Package rulegen generates synthetic rules files and flows for kl's tests and
// benchmarks: a mix of every dimension in realistic proportions, deterministic for a
// seed. It is not for production use.
package rulegen

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"

	"github.com/kl-egress/kl/rules"
)

var actions = []string{"proxy", "direct", "deny", "proxy", "direct"}

// File returns a dimension-form rules file of n rules, shuffled across tiers (so file
// order disagrees with tier order, as real files do), deterministic for seed.
func File(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 0x6b6c))
	var b strings.Builder
	b.Grow(n * 60)
	b.WriteString("default: direct\nrules:\n")
	for i := 0; i < n; i++ {
		field, value := Rule(r, i)
		fmt.Fprintf(&b, "  - %s: %q\n    action: %s\n", field, value, actions[r.IntN(len(actions))])
	}
	return []byte(b.String())
}

// Rule returns one random rule's match field and value; i makes values unique.
func Rule(r *rand.Rand, i int) (field, value string) {
	switch x := r.IntN(100); {
	case x < 5:
		if r.IntN(4) == 0 {
			return "label", fmt.Sprintf("team%d", i)
		}
		return "label", fmt.Sprintf("kl.route=%s%d", "grp", i)
	case x < 15:
		switch r.IntN(3) {
		case 0:
			return "image", fmt.Sprintf("registry%d.example/team%d/*", i%97, i)
		case 1:
			return "image", fmt.Sprintf("acme/app%d:%d", i, r.IntN(9))
		default:
			return "image", fmt.Sprintf("ghcr.io/org%d/*-builder:*", i)
		}
	case x < 20:
		if r.IntN(3) == 0 {
			return "process", fmt.Sprintf("tool%d*", i)
		}
		return "process", fmt.Sprintf("proc%d|bin%d", i, i)
	case x < 65:
		switch r.IntN(4) {
		case 0, 1:
			return "domain", fmt.Sprintf("host%d.zone%d.example", i, i%211)
		case 2:
			return "domain", fmt.Sprintf("*.corp%d.example,*.svc%d.example", i, i)
		default:
			return "domain", fmt.Sprintf("api-*.region%d.example", i)
		}
	case x < 90:
		if r.IntN(8) == 0 {
			return "cidr", fmt.Sprintf("2001:db8:%x::/48", i&0xffff)
		}
		a := netip.AddrFrom4([4]byte{byte(11 + r.IntN(100)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))})
		bits := 16 + r.IntN(17)
		p, _ := a.Prefix(bits)
		return "cidr", p.String()
	default:
		if r.IntN(3) == 0 {
			lo := 1024 + r.IntN(60000)
			return "port", fmt.Sprintf("%d-%d", lo, lo+r.IntN(50))
		}
		return "port", fmt.Sprintf("%d", 1024+r.IntN(64000))
	}
}

// Flows returns n flows that hit and miss the rules of File(size, seed) in a mix: some
// name hosts, images, processes and labels that exist in the file, others do not.
func Flows(n, size int, seed uint64) []rules.Flow {
	r := rand.New(rand.NewPCG(seed^0x5eed, 7))
	out := make([]rules.Flow, n)
	for k := range out {
		i := r.IntN(size + size/4 + 1)
		f := rules.Flow{
			Process: rules.Process{Known: true, Comm: fmt.Sprintf("proc%d", i), Exe: fmt.Sprintf("tool%dx", r.IntN(size+1)), Argv0: "sh"},
			Image:   fmt.Sprintf("registry%d.example/team%d/app:1", i%97, r.IntN(size+1)),
			Labels:  map[string]string{"app": "web", "kl.route": fmt.Sprintf("grp%d", r.IntN(4*size+1))},
		}
		switch r.IntN(4) {
		case 0:
			f.Host = fmt.Sprintf("host%d.zone%d.example", i, i%211)
		case 1:
			f.Host = fmt.Sprintf("a.b.corp%d.example", i)
		case 2:
			f.Host = fmt.Sprintf("api-v%d.region%d.example", r.IntN(3), i)
		}
		var a netip.Addr
		if r.IntN(8) == 0 {
			a = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, byte(i >> 8), byte(i), 15: 1})
		} else {
			a = netip.AddrFrom4([4]byte{byte(11 + r.IntN(100)), byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))})
		}
		f.Dst = netip.AddrPortFrom(a, uint16(1024+r.IntN(64000)))
		if r.IntN(2) == 0 {
			f.Labels = nil
		}
		f.LabelKeys = rules.KeysOf(f.Labels) // as the relay builds a flow of a registered workload
		if r.IntN(2) == 0 {
			f.Process = rules.Process{}
		}
		out[k] = f
	}
	return out
}

var routes = []string{"client", "cluster", "deny", "proxy", "direct"}

// PatternFile returns a pattern-form rules file of n patterns (host globs, names,
// addresses, IPv4 and IPv6 prefixes, `*`, a few port specs), deterministic for seed.
func PatternFile(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 0x7061))
	ports := []string{"", "", "", ":443", ":22", ":8000-8999"}
	var b strings.Builder
	b.WriteString("default: cluster\nrules:\n")
	for i := 0; i < n; i++ {
		var host string
		switch x := r.IntN(20); {
		case x < 6:
			host = fmt.Sprintf("*.corp%d.example", r.IntN(n+1))
		case x < 11:
			host = fmt.Sprintf("host%d.zone%d.example", r.IntN(n+1), r.IntN(50))
		case x < 12:
			host = fmt.Sprintf("api-*.region%d.example", r.IntN(n+1))
		case x < 17:
			a := netip.AddrFrom4([4]byte{10, byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))})
			p, _ := a.Prefix(8 + r.IntN(25))
			host = p.String()
		case x < 19:
			host = fmt.Sprintf("[2001:db8:%x::/48]", r.IntN(n+1))
		default:
			host = "*"
			if r.IntN(4) > 0 {
				host = "*:" + fmt.Sprint(1+r.IntN(1024))
				fmt.Fprintf(&b, "  - pattern: %q\n    route: %s\n", host, routes[r.IntN(len(routes))])
				continue
			}
		}
		port := ports[r.IntN(len(ports))]
		if port == "" && strings.HasPrefix(host, "[") {
			host = strings.Trim(host, "[]")
		}
		fmt.Fprintf(&b, "  - pattern: %q\n    route: %s\n", host+port, routes[r.IntN(len(routes))])
	}
	return []byte(b.String())
}

// PatternFlows returns n flows for PatternFile(size, seed): hostnames and addresses
// that hit and miss its patterns, on the ports it names and others.
func PatternFlows(n, size int, seed uint64) []rules.Flow {
	r := rand.New(rand.NewPCG(seed^0xf10, 3))
	ports := []uint16{443, 22, 8080, 80, 8999, 1000}
	out := make([]rules.Flow, n)
	for k := range out {
		var f rules.Flow
		switch r.IntN(4) {
		case 0:
			f.Host = fmt.Sprintf("a.b.corp%d.example", r.IntN(size+1))
		case 1:
			f.Host = fmt.Sprintf("host%d.zone%d.example", r.IntN(size+1), r.IntN(50))
		case 2:
			f.Host = fmt.Sprintf("api-v1.region%d.example", r.IntN(size+1))
		}
		var a netip.Addr
		if r.IntN(5) == 0 {
			a = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, byte(r.IntN(size+1) >> 8), byte(r.IntN(size + 1)), 15: 1})
		} else if r.IntN(4) > 0 {
			a = netip.AddrFrom4([4]byte{10, byte(r.IntN(256)), byte(r.IntN(256)), byte(r.IntN(256))})
		}
		f.Dst = netip.AddrPortFrom(a, ports[r.IntN(len(ports))])
		out[k] = f
	}
	return out
}
