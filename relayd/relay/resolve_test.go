package relay

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/rules"
)

// TestProxyResolvesOnce: with cidr rules, a hostname-only proxy request is resolved once,
// decided on the address, and a direct dial goes to that address (the harness's dialer
// cannot resolve the made-up names: a second lookup would fail the request).
func TestProxyResolvesOnce(t *testing.T) {
	backend := echoServer(t)
	for _, tc := range []struct {
		name      string
		policy    string
		lookups   int
		badDenied bool
	}{
		{"cidr rules", "default: direct\nrules:\n  - cidr: 127.0.0.2/32\n    action: deny\n", 2, true},
		{"no cidr rules", "default: direct\nrules:\n  - port: \"1\"\n    action: deny\n", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pol, err := rules.Parse("test", []byte(tc.policy), rules.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var lookups []string
			var dialed []string
			h := newHarnessWith(t, nil, time.Minute, nil, func(o *Options) {
				o.Policy = func() Decider { return pol }
				o.resolve = func(_ context.Context, host string) ([]netip.Addr, error) {
					mu.Lock()
					lookups = append(lookups, host)
					mu.Unlock()
					switch host {
					case "good.example":
						return []netip.Addr{backend.Addr()}, nil
					case "bad.example":
						return []netip.Addr{netip.MustParseAddr("127.0.0.2")}, nil
					}
					return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
				}
				recordDials(o, &mu, &dialed)
			})
			w := workload("p")
			w.Mode = api.ModeProxy
			if _, err := h.r.Open(w); err != nil {
				t.Fatal(err)
			}
			connect := func(host string) string {
				c, err := net.Dial("tcp4", h.addr(t, "/ns/p:15080"))
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				target := fmt.Sprintf("%s:%d", host, backend.Port())
				fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
				line, _ := bufio.NewReader(c).ReadString('\n')
				return line
			}
			good := connect("good.example")
			bad := connect("bad.example")
			mu.Lock()
			defer mu.Unlock()
			if len(lookups) != tc.lookups {
				t.Errorf("lookups %q, want %d (one per request when cidr rules exist)", lookups, tc.lookups)
			}
			if tc.badDenied {
				if !strings.Contains(good, " 200") || !strings.Contains(bad, " 403") {
					t.Errorf("good.example: %q, bad.example: %q; want 200 and 403", good, bad)
				}
				if len(dialed) != 1 || dialed[0] != backend.String() {
					t.Errorf("dialed %q, want only the checked address %v", dialed, backend)
				}
				recs := h.aud.Recent(2)
				if len(recs) != 2 || recs[1].Dimension != "cidr" || recs[1].Exit != "deny" {
					t.Errorf("records %+v, want bad.example denied by the cidr rule", recs)
				}
			} else if len(dialed) != 2 || !strings.HasPrefix(dialed[0], "good.example:") {
				t.Errorf("dialed %q, want the names as asked (nothing resolved them)", dialed)
			}
		})
	}
}

// recordDials makes o's dials note their address in *dialed (under mu) before they go
// on, and answers a dial by name without asking the machine's resolver (no test traffic
// leaves loopback).
func recordDials(o *Options, mu *sync.Mutex, dialed *[]string) {
	inner := o.dial
	o.dial = func(ctx context.Context, ns string, mark uint32, network, addr string) (net.Conn, error) {
		mu.Lock()
		*dialed = append(*dialed, addr)
		mu.Unlock()
		if _, err := netip.ParseAddrPort(addr); err != nil {
			return nil, &net.DNSError{Err: "not resolved in this test", Name: addr, IsNotFound: true}
		}
		return inner(ctx, ns, mark, network, addr)
	}
}
