package attach

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/kl-egress/kl/rules"
)

// TestProxyNotAskedForThisMachine: a proxy (named by the PAC or by the environment)
// resolves the destination itself, and getaddrinfo reads "127.1", "2130706433",
// "0x7f000001" and "0177.0.0.1" as 127.0.0.1 (inet_aton). The attach side refuses them
// with E_LOCAL without asking the proxy, as it refuses 127.0.0.1 and localhost, and also
// every name that is not well-formed; a well-formed name is still asked for.
func TestProxyNotAskedForThisMachine(t *testing.T) {
	corp := echoServer(t, "corp")
	prox := startProxy(t, corp)
	refused := []string{
		"127.1", "2130706433", "0x7f000001", "0X7F000001", "0177.0.0.1", "127.0.0.1", "127.0.0.1.",
		"0x7f.1", "0", "::1", "localhost", "localhost.localdomain",
		"1.2.3.4.5", "256.1", "corp.12", "bad name.example",
	}
	for _, via := range []string{"environment", "pac"} {
		t.Run(via, func(t *testing.T) {
			pol, env := clientAll, map[string]string{}
			if via == "pac" {
				pol = "default: direct\nscript: |\n  function FindProxyForURL(url, host) { return \"PROXY " + prox.addr + "\"; }\n"
			} else {
				env["HTTPS_PROXY"] = "http://" + prox.addr
			}
			f := newFixture(t, pol)
			f.attach(ClientOptions{Token: testToken, Getenv: func(k string) string { return env[k] }, dialDest: destDialer(5*time.Second, false)}, payWorkload)
			flow := func(host string) rules.Flow {
				return rules.Flow{Labels: payWorkload.Labels, Host: host, Dst: netip.AddrPortFrom(netip.Addr{}, 22)}
			}
			for _, host := range refused {
				before := prox.n.Load()
				conn, err := f.srv.Dial(context.Background(), payWorkload, flow(host), nil)
				if err == nil {
					conn.Close()
				}
				if n := prox.n.Load() - before; n != 0 {
					t.Errorf("host %q: the proxy was asked to reach it (Dial error %v)", host, err)
				}
				var re *RefusedError
				if !errors.As(err, &re) || re.Code != RefuseLocal {
					t.Errorf("host %q: Dial = %v, want a refusal with %s", host, err, RefuseLocal)
				}
			}
			before := prox.n.Load()
			conn, err := f.srv.Dial(context.Background(), payWorkload, flow("git.corp.example"), nil)
			if err != nil {
				t.Fatalf("a well-formed name: Dial = %v, want it carried through the proxy", err)
			}
			roundTrip(t, conn, "hello from corp\n")
			if n := prox.n.Load() - before; n != 1 {
				t.Errorf("a well-formed name: the proxy was asked %d times, want 1", n)
			}
		})
	}
}

// TestProxyAllowLocal: with AllowLocal the operator lends this machine too, and the
// forms above go to the proxy as they are.
func TestProxyAllowLocal(t *testing.T) {
	corp := echoServer(t, "loopback")
	prox := startProxy(t, corp)
	f := newFixture(t, clientAll)
	env := map[string]string{"HTTPS_PROXY": "http://" + prox.addr}
	f.attach(ClientOptions{Token: testToken, AllowLocal: true, Getenv: func(k string) string { return env[k] }}, payWorkload)
	for _, host := range []string{"127.1", "0x7f000001", "1.2.3.4.5"} {
		conn, err := f.srv.Dial(context.Background(), payWorkload, rules.Flow{Labels: payWorkload.Labels, Host: host, Dst: netip.AddrPortFrom(netip.Addr{}, 22)}, nil)
		if err != nil {
			t.Errorf("host %q with AllowLocal: Dial = %v, want it carried", host, err)
			continue
		}
		roundTrip(t, conn, "hello from loopback\n")
	}
}

func TestParseInetAton(t *testing.T) {
	tests := []struct {
		in   string
		want string // "" = not an address
	}{
		{"127.0.0.1", "127.0.0.1"},
		{"127.1", "127.0.0.1"},
		{"127.0.1", "127.0.0.1"},
		{"2130706433", "127.0.0.1"},
		{"0x7f000001", "127.0.0.1"},
		{"0X7F000001", "127.0.0.1"},
		{"0177.0.0.1", "127.0.0.1"},
		{"0x7f.0.0.01", "127.0.0.1"},
		{"10.0x10203", "10.1.2.3"},
		{"0", "0.0.0.0"},
		{"0x", "0.0.0.0"},
		{"4294967295", "255.255.255.255"},
		{"4294967296", ""},
		{"256.1", ""},
		{"1.2.3.256", ""},
		{"1.2.65536", ""},
		{"1.2.3.4.5", ""},
		{"08", ""},
		{"0x1g", ""},
		{"1..2", ""},
		{"", ""},
		{".1", ""},
		{"1.", ""},
		{"-1", ""},
		{"+1", ""},
		{"127.1 ", ""},
		{"corp.example", ""},
	}
	for _, tt := range tests {
		a, ok := parseInetAton(tt.in)
		got := ""
		if ok {
			got = a.String()
		}
		if got != tt.want {
			t.Errorf("parseInetAton(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestProxyNameable(t *testing.T) {
	tests := []struct {
		host string
		want bool
	}{
		{"git.corp.example", true},
		{"git.corp.example.", true},
		{"_sip._tcp.corp.example", true},
		{"x--y.example", true},
		{"1password.com", true},
		{"10.1.2.3", true},
		{"127.1", true}, // an address: namesThisMachine decides
		{"[2001:db8::1]", true},
		{"corp.12", false},
		{"1.2.3.4.5", false},
		{"256.1", false},
		{"a..b", false},
		{".", false},
		{"a b.example", false},
		{"a/b.example", false},
		{"a%00.example", false},
		{"ünicode.example", false},
		{"[not-an-address]", false},
	}
	for _, tt := range tests {
		h := Header{Host: tt.host, Port: 443}
		if got := h.proxyNameable(); got != tt.want {
			t.Errorf("proxyNameable(%q) = %v, want %v", tt.host, got, tt.want)
		}
	}
}
