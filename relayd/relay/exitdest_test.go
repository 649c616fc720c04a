package relay

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/rules/pac"
)

// TestExitGetsCheckedDestination: an exit (upstream, gateway, attach) is handed the
// hostname only when the name decided the flow; otherwise the address the policy checked,
// so a workload cannot send a flow decided for one address to whatever name it writes in
// SNI, Host or a CONNECT request. Proxy mode: a name that did not resolve, decided by a
// rule the address rules could have preempted, is refused rather than handed over.
func TestExitGetsCheckedDestination(t *testing.T) {
	backend := echoServer(t)
	const (
		cidrProxy = "default: deny\nrules:\n  - domain: \"*.allowed.example\"\n    action: direct\n  - cidr: 127.0.0.0/8\n    action: proxy\n"
		domain    = "default: deny\nrules:\n  - domain: \"*.allowed.example\"\n    action: proxy\n  - cidr: 192.0.2.0/24\n    action: deny\n"
		defProxy  = "default: proxy\nrules:\n  - domain: \"*.blocked.example\"\n    action: deny\n"
		defCIDR   = "default: proxy\nrules:\n  - cidr: 192.0.2.0/24\n    action: deny\n"
		label     = "default: deny\nrules:\n  - label: app=x\n    action: proxy\n  - domain: \"*.blocked.example\"\n    action: deny\n  - cidr: 192.0.2.0/24\n    action: deny\n"
		patGlob   = "default: deny\nrules:\n  - pattern: \"192.0.2.0/24\"\n    route: deny\n  - pattern: \"*.allowed.example\"\n    route: proxy\n"
		patAny    = "default: deny\nrules:\n  - pattern: \"*.blocked.example\"\n    route: deny\n  - pattern: \"192.0.2.0/24\"\n    route: deny\n  - pattern: \"*\"\n    route: proxy\n"
		pacName   = "default: deny\nscript: |\n  function FindProxyForURL(url, host) {\n    if (dnsDomainIs(host, \".allowed.example\")) return \"GATEWAY\";\n    return \"DENY\";\n  }\n"
		pacAddr   = "default: deny\nscript: |\n  function FindProxyForURL(url, host) {\n    if (isInNet(host, \"127.0.0.0\", \"255.0.0.0\")) return \"GATEWAY\";\n    return \"DENY\";\n  }\n"
	)
	tests := []struct {
		name     string
		policy   string
		proxy    bool   // proxy mode (CONNECT host:port) rather than transparent (Host header)
		host     string // the name the client writes
		wantExit bool   // the exit is dialed at all
		wantHost string // Dest.Host the exit gets ("": the checked address)
		wantAddr bool   // Dest.Addr is the checked address (backend)
	}{
		{"cidr decides: the address, not the sniffed name", cidrProxy, false, "exfil.evil.example", true, "", true},
		{"domain decides: the name", domain, false, "a.allowed.example", true, "a.allowed.example", true},
		{"default: the address", defProxy, false, "exfil.evil.example", true, "", true},
		{"label decides: the address", label, false, "exfil.evil.example", true, "", true},
		{"pattern host glob: the name", patGlob, false, "a.allowed.example", true, "a.allowed.example", true},
		{"pattern *: the address", patAny, false, "exfil.evil.example", true, "", true},
		{"script on the name: the name", pacName, false, "a.allowed.example", true, "a.allowed.example", true},
		{"script on the address: the address", pacAddr, false, "exfil.evil.example", true, "", true},

		{"proxy mode, default with cidr rules: the checked address", defCIDR, true, "evil.example", true, "", true},
		{"proxy mode, domain decides: the name", domain, true, "a.allowed.example", true, "a.allowed.example", true},
		// No address rule could decide otherwise (and the gateway is not reachable): the
		// name is not resolved on the node, and the exit resolves it on its side, where it
		// may be the only one that can (a VPN behind the attach side).
		{"proxy mode, no address rules: the name", defProxy, true, "evil.example", true, "evil.example", false},
		{"proxy mode, no address rules, a name only the far side knows: the name", defProxy, true, "nowhere.example", true, "nowhere.example", false},
		{"proxy mode, unresolved name, default: refused", defCIDR, true, "nowhere.example", false, "", false},
		{"proxy mode, unresolved name, label decides: the name", label, true, "nowhere.example", true, "nowhere.example", false},
		{"proxy mode, unresolved name, pattern *: refused", patAny, true, "nowhere.example", false, "", false},
		{"proxy mode, unresolved name, pattern host glob: the name", patGlob, true, "nowhere.allowed.example", true, "nowhere.allowed.example", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pol, err := rules.Parse("test", []byte(tc.policy), rules.LoadOptions{AllowGateway: true, PAC: pac.Options{Deadline: 10 * time.Second}})
			if err != nil {
				t.Fatal(err)
			}
			type got struct {
				dst      Dest
				flowHost string
			}
			gotc := make(chan got, 1)
			exit := func(ctx context.Context, _ *api.Workload, d Dest) (net.Conn, error) {
				f, _, _ := FlowFrom(ctx)
				gotc <- got{d, f.Host}
				return nil, errors.New("test exit: not connecting")
			}
			h := newHarnessWith(t, nil, time.Minute, map[string]DialFunc{rules.ExitProxy: exit, rules.ExitGateway: exit}, func(o *Options) {
				o.Policy = func() Decider { return pol }
				o.SniffWait = 2 * time.Second
				o.resolve = func(_ context.Context, host string) ([]netip.Addr, error) {
					if host == "nowhere.example" || strings.HasPrefix(host, "nowhere.") {
						return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
					}
					return []netip.Addr{backend.Addr()}, nil
				}
			})
			h.setDst(backend)
			w := workload("a")
			addr := "/ns/a"
			if tc.proxy {
				w.Mode = api.ModeProxy
				addr = "/ns/a:15080"
			}
			if _, err := h.r.Open(w); err != nil {
				t.Fatal(err)
			}
			c, err := net.Dial("tcp4", h.addr(t, addr))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if tc.proxy {
				target := fmt.Sprintf("%s:%d", tc.host, backend.Port())
				fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
			} else {
				fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", tc.host)
			}
			bufio.NewReader(c).ReadString('\n') // the answer (proxy mode) or the reset
			var g got
			var called bool
			select {
			case g = <-gotc:
				called = true
			default:
			}
			if called != tc.wantExit {
				t.Fatalf("exit dialed: %v, want %v", called, tc.wantExit)
			}
			if called {
				if g.dst.Host != tc.wantHost {
					t.Errorf("exit handed Host %q, want %q", g.dst.Host, tc.wantHost)
				}
				if g.flowHost != tc.wantHost {
					t.Errorf("FlowFrom Host %q, want %q (the attach side dials what it is handed)", g.flowHost, tc.wantHost)
				}
				if wantAddr := tc.wantAddr; (g.dst.Addr == backend) != wantAddr {
					t.Errorf("exit handed Addr %v, want the checked address: %v", g.dst.Addr, wantAddr)
				}
				if g.dst.Port != backend.Port() {
					t.Errorf("exit handed Port %d, want %d", g.dst.Port, backend.Port())
				}
			}
			recs := h.aud.Recent(4)
			if len(recs) != 1 {
				t.Fatalf("audit records %+v, want one", recs)
			}
			if s := fmt.Sprintf("%+v", recs); strings.Contains(s, tc.host) || strings.Contains(s, "127.0.0.1") {
				t.Errorf("audit record %s names the destination", s)
			}
		})
	}
}

// TestProxyDialsEveryCheckedAddress: a proxied name that policy checks by address is
// resolved once and decided for every address it has; the exit tries those decided the
// same way in the resolver's order: a direct dial, and an exit handed the address rather
// than the name (NameDecided), until one connects; each attempt's flow (FlowFrom) goes to
// its own address. One denied address denies the flow.
func TestProxyDialsEveryCheckedAddress(t *testing.T) {
	backend := echoServer(t) // 127.0.0.1; nothing listens on 127.0.0.3 or .4 at its port
	const (
		direct = "default: direct\nrules:\n  - cidr: 192.0.2.0/24\n    action: deny\n  - cidr: 127.0.0.3/32\n    action: proxy\n"
		proxy  = "default: proxy\nrules:\n  - cidr: 192.0.2.0/24\n    action: deny\n  - cidr: 127.0.0.3/32\n    action: direct\n"
	)
	at := func(s string) string { return netip.AddrPortFrom(netip.MustParseAddr(s), backend.Port()).String() }
	tests := []struct {
		name   string
		policy string
		addrs  []string
		status string   // of the CONNECT answer
		dialed []string // direct dials, in order
		handed []string // the addresses the proxy exit is handed, in order
	}{
		{"one address", direct, []string{"127.0.0.1"}, " 200", []string{at("127.0.0.1")}, nil},
		{"first refuses, second answers", direct, []string{"127.0.0.4", "127.0.0.1"}, " 200", []string{at("127.0.0.4"), at("127.0.0.1")}, nil},
		{"another exit's address is not dialed", direct, []string{"127.0.0.4", "127.0.0.3", "127.0.0.1"}, " 200", []string{at("127.0.0.4"), at("127.0.0.1")}, nil},
		{"none answers", direct, []string{"127.0.0.4", "127.0.0.5"}, " 50", []string{at("127.0.0.4"), at("127.0.0.5")}, nil},
		{"a denied second address denies", direct, []string{"127.0.0.1", "192.0.2.7"}, " 403", nil, nil},
		{"a denied first address denies", direct, []string{"192.0.2.7", "127.0.0.1"}, " 403", nil, nil},
		{"exit: one address", proxy, []string{"127.0.0.1"}, " 200", nil, []string{at("127.0.0.1")}},
		{"exit: the first fails, the second connects", proxy, []string{"127.0.0.4", "127.0.0.1"}, " 200", nil, []string{at("127.0.0.4"), at("127.0.0.1")}},
		{"exit: a direct address is not handed over", proxy, []string{"127.0.0.4", "127.0.0.3", "127.0.0.1"}, " 200", nil, []string{at("127.0.0.4"), at("127.0.0.1")}},
		{"exit: none connects", proxy, []string{"127.0.0.4", "127.0.0.5"}, " 50", nil, []string{at("127.0.0.4"), at("127.0.0.5")}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pol, err := rules.Parse("test", []byte(tc.policy), rules.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var dialed, handed []string
			lookups := 0
			// The proxy exit reaches the backend only, and only by its address. Like the
			// attach side, it could dial the flow it is handed (FlowFrom): that flow must
			// be the attempt's own, to the address of this attempt.
			exit := func(ctx context.Context, _ *api.Workload, d Dest) (net.Conn, error) {
				mu.Lock()
				handed = append(handed, d.Addr.String())
				mu.Unlock()
				if f, _, ok := FlowFrom(ctx); !ok || f.Dst != d.Addr {
					t.Errorf("exit handed %v, but FlowFrom says %v (ok %v)", d.Addr, f.Dst, ok)
				}
				if d.Host != "" || d.Addr != backend {
					return nil, errors.New("test exit: cannot reach it")
				}
				var nd net.Dialer
				return nd.DialContext(ctx, "tcp4", d.Addr.String())
			}
			h := newHarnessWith(t, nil, time.Minute, map[string]DialFunc{rules.ExitProxy: exit}, func(o *Options) {
				o.Policy = func() Decider { return pol }
				o.resolve = func(context.Context, string) ([]netip.Addr, error) {
					mu.Lock()
					lookups++
					mu.Unlock()
					var out []netip.Addr
					for _, a := range tc.addrs {
						out = append(out, netip.MustParseAddr(a))
					}
					return out, nil
				}
				recordDials(o, &mu, &dialed)
			})
			w := workload("p")
			w.Mode = api.ModeProxy
			if _, err := h.r.Open(w); err != nil {
				t.Fatal(err)
			}
			c, err := net.Dial("tcp4", h.addr(t, "/ns/p:15080"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "CONNECT multi.example:%d HTTP/1.1\r\nHost: multi.example\r\n\r\n", backend.Port())
			line, _ := bufio.NewReader(c).ReadString('\n')
			if !strings.Contains(line, tc.status) {
				t.Errorf("CONNECT to a name with addresses %v: %q, want status%s", tc.addrs, line, tc.status)
			}
			mu.Lock()
			defer mu.Unlock()
			if fmt.Sprint(dialed) != fmt.Sprint(tc.dialed) {
				t.Errorf("dialed %q, want %q", dialed, tc.dialed)
			}
			if fmt.Sprint(handed) != fmt.Sprint(tc.handed) {
				t.Errorf("exit handed %q, want %q", handed, tc.handed)
			}
			if lookups != 1 {
				t.Errorf("%d lookups, want one", lookups)
			}
			for _, rec := range h.aud.Recent(4) {
				if s := fmt.Sprintf("%+v", rec); strings.Contains(s, "multi.example") || strings.Contains(s, "127.0.0.") || strings.Contains(s, "192.0.2.") {
					t.Errorf("audit record %s names the destination", s)
				}
			}
		})
	}
}
