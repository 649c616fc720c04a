package attach

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/relayd/proxy"
	"github.com/kl-egress/kl/relayd/relay"
	"github.com/kl-egress/kl/relayd/upstream"
	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/tests/testutil"
)

const testToken = "alice-token-0123456789"

type fixture struct {
	t      *testing.T
	pki    *testutil.PKI
	srv    *Server
	addr   string
	policy atomic.Pointer[rules.Policy]
	// policyHook, when set, is the server's live policy instead of policy.
	policyHook atomic.Pointer[func() *rules.Policy]
	log        *testutil.Buffer
	audit      *audit.Log
	// stop ends the server's Serve and waits until it returned (also at the test's end).
	stop func()
}

func mustPolicy(t testing.TB, src string) *rules.Policy {
	t.Helper()
	p, err := rules.Parse("rules.yaml", []byte(src), rules.LoadOptions{AllowGateway: true})
	if err != nil {
		t.Fatalf("policy: %v", err)
	}
	return p
}

func newFixture(t *testing.T, policy string, creds ...Credential) *fixture {
	t.Helper()
	f := &fixture{t: t, pki: testutil.NewPKI(t), log: &testutil.Buffer{}}
	f.policy.Store(mustPolicy(t, policy))
	if len(creds) == 0 {
		creds = []Credential{{Name: "alice", Token: testToken, Selector: "team=pay"}}
	}
	var err error
	if f.audit, err = audit.New("", 0, 0, 64); err != nil {
		t.Fatal(err)
	}
	f.srv, err = NewServer(ServerOptions{
		Settings: &Settings{Listen: "127.0.0.1:0", Cert: f.pki.Cert, Key: f.pki.Key, ClientCA: f.pki.CAFile, Credentials: creds},
		Policy: func() *rules.Policy {
			if h := f.policyHook.Load(); h != nil {
				return (*h)()
			}
			return f.policy.Load()
		},
		Log:   slog.New(slog.NewTextHandler(f.log, nil)),
		Audit: f.audit,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.srv.Serve(ctx, ln); close(done) }()
	f.stop = func() { cancel(); <-done }
	t.Cleanup(f.stop)
	return f
}

// attach starts a client with these options (server, CA filled in) and waits until its
// session is live for w.
func (f *fixture) attach(o ClientOptions, w *api.Workload) (*Client, context.CancelFunc) {
	f.t.Helper()
	o.Server, o.CAFile = f.addr, f.pki.CAFile
	if o.Getenv == nil {
		o.Getenv = func(string) string { return "" }
	}
	if o.dialDest == nil {
		// The tests' destinations listen on loopback, which the real dialer refuses
		// (TestThisMachineRefused).
		o.dialDest = (&net.Dialer{}).DialContext
	}
	c, err := NewClient(o)
	if err != nil {
		f.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Keep(ctx); close(done) }()
	stop := func() { cancel(); <-done }
	f.t.Cleanup(stop)
	f.waitLive(w, true)
	return c, stop
}

func (f *fixture) waitLive(w *api.Workload, want bool) {
	f.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for f.srv.Live(w) != want {
		if time.Now().After(deadline) {
			f.t.Fatalf("Live(%s) stayed %v\nlog:\n%s", w.ID, !want, f.log.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// echoServer answers each connection with "hello from <name>\n" and then echoes.
func echoServer(t *testing.T, name string) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Serve(t, ln, func(c net.Conn) {
		fmt.Fprintf(c, "hello from %s\n", name)
		io.Copy(c, c)
	})
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

func roundTrip(t *testing.T, c net.Conn, want string) {
	t.Helper()
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, len(want))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != want {
		t.Fatalf("greeting = %q, %v; want %q", buf, err, want)
	}
	c.Write([]byte("ping"))
	buf = buf[:4]
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo = %q, %v", buf, err)
	}
}

var payWorkload = &api.Workload{ID: "pod-pay", Labels: map[string]string{"team": "pay"}, Image: "nginx"}

const clientAll = "default: client\n"

func TestClientFlow(t *testing.T) {
	f := newFixture(t, clientAll)
	dst := echoServer(t, "corp")
	c, _ := f.attach(ClientOptions{Token: testToken}, payWorkload)
	conn, err := f.srv.Dial(context.Background(), payWorkload, rules.Flow{Labels: payWorkload.Labels, Dst: dst}, nil)
	if err != nil {
		t.Fatalf("Dial: %v\n%s", err, f.log.String())
	}
	roundTrip(t, conn, "hello from corp\n")
	deadline := time.Now().Add(2 * time.Second)
	for (c.Stats().BytesIn < uint64(len("hello from corp\nping")) || c.Stats().BytesOut < 4) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	st := c.Stats()
	if st.Flows != 1 || st.Refused != 0 || st.BytesOut != 4 || st.BytesIn != uint64(len("hello from corp\nping")) || !st.Connected {
		t.Errorf("Stats = %+v", st)
	}
	if s := f.srv.Sessions(); len(s) != 1 || s[0].Credential != "alice" || s[0].Flows != 1 {
		t.Errorf("Sessions = %+v", s)
	}
}

func TestCredentials(t *testing.T) {
	f := newFixture(t, clientAll,
		Credential{Name: "alice", Token: testToken, Selector: "team=pay"},
		Credential{Name: "bob", Subject: "bob@laptop", Workloads: []string{"pod-pay"}})
	bobCert, bobKey := f.pki.Issue("bob@laptop", false)
	eveCert, eveKey := f.pki.Issue("eve@laptop", false)
	other := testutil.NewPKI(t)
	strayCert, strayKey := other.Issue("bob@laptop", false)
	tests := []struct {
		name    string
		o       ClientOptions
		wantErr string // "" = accepted
		logged  string
	}{
		{"token", ClientOptions{Token: testToken}, "", "auth=token"},
		{"certificate", ClientOptions{CertFile: bobCert, KeyFile: bobKey}, "", "auth=certificate"},
		{"wrong token", ClientOptions{Token: "not-the-token-at-all"}, "authentication failed", "reason=\"wrong token\""},
		{"certificate of nobody", ClientOptions{CertFile: eveCert, KeyFile: eveKey}, "authentication failed", "matches no credential"},
		{"certificate of another CA", ClientOptions{CertFile: strayCert, KeyFile: strayKey}, "before welcoming", "TLS handshake failed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.o.Server, tt.o.CAFile = f.addr, f.pki.CAFile
			c, err := NewClient(tt.o)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if tt.wantErr == "" {
				done := make(chan error, 1)
				go func() { done <- c.Run(ctx) }()
				f.waitLive(payWorkload, true)
				cancel()
				if err := <-done; err != nil {
					t.Fatalf("Run = %v", err)
				}
				f.waitLive(payWorkload, false)
			} else {
				err := c.Run(ctx)
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Run = %v, want an error containing %q", err, tt.wantErr)
				}
				if strings.Contains(tt.wantErr, "authentication") {
					var ae *AuthError
					if !errors.As(err, &ae) {
						t.Errorf("Run = %T, want *AuthError (no reconnecting)", err)
					}
				}
			}
			deadline := time.Now().Add(2 * time.Second)
			for !strings.Contains(f.log.String(), tt.logged) {
				if time.Now().After(deadline) {
					t.Fatalf("log lacks %q:\n%s", tt.logged, f.log.String())
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	t.Run("missing credentials", func(t *testing.T) {
		if _, err := NewClient(ClientOptions{Server: f.addr}); err == nil {
			t.Fatal("NewClient without credentials succeeded")
		}
		// A client that sends no token at all is refused by the daemon too.
		c, _ := NewClient(ClientOptions{Server: f.addr, CAFile: f.pki.CAFile, Token: "x"})
		c.o.Token = ""
		if err := c.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "authentication failed") {
			t.Fatalf("Run without a token = %v", err)
		}
		if !strings.Contains(f.log.String(), "no token and no client certificate") {
			t.Errorf("refusal not logged:\n%s", f.log.String())
		}
	})
}

// TestScope: a session only ever receives flows of workloads its credential (narrowed
// by the session's own request) covers; others find no session.
func TestScope(t *testing.T) {
	f := newFixture(t, clientAll,
		Credential{Name: "alice", Token: testToken, Selector: "team=pay"},
		Credential{Name: "carol", Token: "carol-token-0123456789", Workloads: []string{"pod-web"}})
	dst := echoServer(t, "corp")
	web := &api.Workload{ID: "pod-web", Labels: map[string]string{"team": "web"}}
	ops := &api.Workload{ID: "pod-ops", Labels: map[string]string{"team": "pay", "env": "prod"}}
	dev := &api.Workload{ID: "pod-dev", Labels: map[string]string{"team": "pay", "env": "dev"}}
	alice, _ := f.attach(ClientOptions{Token: testToken, Selector: "env=dev"}, dev)

	for _, tt := range []struct {
		w    *api.Workload
		live bool
	}{{dev, true}, {ops, false}, {web, false}, {payWorkload, false}} {
		_, err := f.srv.Dial(context.Background(), tt.w, rules.Flow{Labels: tt.w.Labels, Dst: dst}, nil)
		if tt.live && err != nil {
			t.Errorf("Dial(%s) = %v, want carried", tt.w.ID, err)
		}
		if !tt.live && !errors.Is(err, ErrNoSession) {
			t.Errorf("Dial(%s) = %v, want ErrNoSession", tt.w.ID, err)
		}
	}
	if got := alice.Stats().Flows; got != 1 {
		t.Errorf("alice received %d flows, want only pod-dev's", got)
	}
	carol, _ := f.attach(ClientOptions{Token: "carol-token-0123456789"}, web)
	if _, err := f.srv.Dial(context.Background(), web, rules.Flow{Labels: web.Labels, Dst: dst}, nil); err != nil {
		t.Errorf("Dial(pod-web) with carol attached = %v", err)
	}
	// A daemon that sent alice a flow outside what her session asked for (env=dev) would
	// still be refused by her side.
	se := f.srv.pick(dev)
	st, err := se.mux.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	writeFrame(st, Header{Flow: 7, At: time.Now(), Workload: ops.ID, Labels: ops.Labels, Dst: dst, Port: dst.Port(), Policy: f.policy.Load().Hash(), Exit: "client"})
	var v Verdict
	st.SetDeadline(time.Now().Add(5 * time.Second))
	if err := readFrame(bufioReader(st), maxSmallFrame, &v); err != nil || v.OK || v.Code != RefuseScope {
		t.Errorf("verdict on a flow outside the session's selector = %+v, %v; want %s", v, err, RefuseScope)
	}
	st.Close()
	if alice.Stats().Flows != 2 || carol.Stats().Flows != 1 {
		t.Errorf("flows alice %d carol %d, want 1 each", alice.Stats().Flows, carol.Stats().Flows)
	}
	recs := f.audit.Recent(10)
	found := false
	for _, r := range recs {
		if r.Exit == "client" && strings.Contains(r.Reason, ErrNoSession.Error()) {
			found = true
		}
	}
	if !found {
		t.Errorf("no audit record for the refused flows: %+v", recs)
	}
}

// TestNoSession: without a session a client flow is refused and audited with the reason;
// when the session comes back, the same flow is carried.
func TestNoSession(t *testing.T) {
	f := newFixture(t, clientAll)
	dst := echoServer(t, "corp")
	flow := rules.Flow{Labels: payWorkload.Labels, Dst: dst}
	_, err := f.srv.Dial(context.Background(), payWorkload, flow, nil)
	var oe *net.OpError
	if !errors.Is(err, ErrNoSession) || !errors.As(err, &oe) || strings.Contains(err.Error(), "127.0.0.1") {
		t.Fatalf("Dial without a session = %v, want an OpError with ErrNoSession and no destination", err)
	}
	if r := f.audit.Recent(1); len(r) != 1 || r[0].Exit != "client" || r[0].Reason != ErrNoSession.Error() || r[0].Dimension != "default" {
		t.Errorf("audit = %+v", r)
	}
	_, stop := f.attach(ClientOptions{Token: testToken}, payWorkload)
	conn, err := f.srv.Dial(context.Background(), payWorkload, flow, nil)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, conn, "hello from corp\n")
	stop()
	f.waitLive(payWorkload, false)
	if _, err := f.srv.Dial(context.Background(), payWorkload, flow, nil); !errors.Is(err, ErrNoSession) {
		t.Fatalf("Dial after the session stopped = %v", err)
	}
	f.attach(ClientOptions{Token: testToken}, payWorkload)
	conn, err = f.srv.Dial(context.Background(), payWorkload, flow, nil)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, conn, "hello from corp\n")
}

// consistencyPolicy mixes every input a decision can depend on; the script uses Date and
// Math.random, which must come out the same at every hop.
const consistencyRules = `default: direct
rules:
  - label: kl.route=client
    action: client
  - image: "corp/*"
    action: client
  - domain: "*.corp.example"
    action: client
  - cidr: 203.0.113.0/24
    action: client
  - port: "8443"
    action: deny
`

const consistencyScript = `default: direct
script: |
  function FindProxyForURL(url, host) {
    if (dnsDomainIs(host, ".corp.example")) return "CLIENT";
    var d = new Date();
    if (host == "time.example") return (d.getUTCSeconds() % 2 == 0) ? "CLIENT" : "DIRECT";
    if (host == "dice.example") return (Math.random() < 0.5) ? "CLIENT" : "DIRECT";
    if (host == "squid.example") return "PROXY PROXYADDR";
    if (isInNet(host, "203.0.113.0", "255.255.255.0")) return "CLIENT";
    return "DIRECT";
  }
`

// TestThreeHops decides a table of flows at the three hops (the relay's decision, the
// daemon's attach server, the attach side) and checks they agree; a flow the policy does
// not route to the client, pushed over the session as if it were, is refused by the
// attach side.
func TestThreeHops(t *testing.T) {
	dst := echoServer(t, "corp")
	corp := netip.MustParseAddr("203.0.113.7")
	prox := startProxy(t, dst)
	base := time.Date(2026, 11, 30, 5, 0, 0, 0, time.UTC)
	for _, pol := range []struct{ name, src string }{
		{"rules", consistencyRules},
		{"script", strings.Replace(consistencyScript, "PROXYADDR", prox.addr, 1)},
	} {
		t.Run(pol.name, func(t *testing.T) {
			f := newFixture(t, pol.src, Credential{Name: "alice", Token: testToken, Selector: "team"})
			w := &api.Workload{ID: "w", Labels: map[string]string{"team": "x"}}
			c, _ := f.attach(ClientOptions{Token: testToken}, w)
			// Every flow really goes to the echo server: the attach side's dial seam maps
			// the table's destinations onto it.
			c.o.dialNet = func(ctx context.Context, network, addr string) (net.Conn, error) {
				if addr == prox.addr {
					return (&net.Dialer{}).DialContext(ctx, network, addr)
				}
				return (&net.Dialer{}).DialContext(ctx, network, dst.String())
			}
			c.o.dialDest = c.o.dialNet
			clientSide := c.pols.wait(f.policy.Load().Hash(), time.Second)
			if clientSide == nil {
				t.Fatal("the attach side holds no policy")
			}
			type row struct {
				labels map[string]string
				image  string
				host   string
				dst    netip.AddrPort
			}
			var flows []row
			for _, h := range []string{"", "git.corp.example", "time.example", "dice.example", "squid.example", "www.example.org"} {
				for _, a := range []netip.AddrPort{netip.AddrPortFrom(corp, 443), netip.MustParseAddrPort("192.0.2.9:8443"), netip.MustParseAddrPort("198.51.100.4:80")} {
					flows = append(flows, row{labels: map[string]string{"team": "x"}, host: h, dst: a})
				}
			}
			flows = append(flows, row{labels: map[string]string{"team": "x", "kl.route": "client"}, dst: netip.MustParseAddrPort("192.0.2.1:22")},
				row{labels: map[string]string{"team": "x"}, image: "corp/api:1", dst: netip.MustParseAddrPort("192.0.2.1:22")})
			var clientN, refusedN int
			var table strings.Builder
			fmt.Fprintf(&table, "%-4s %-17s %-18s %-10s %-5s %-8s %-8s %-8s %-23s %s\n", "row", "host", "dst", "at(m:s)", "id", "relay", "by", "attach", "proxy", "client claim")
			for i, r := range flows {
				for k := range 4 {
					fl := rules.Flow{Labels: r.labels, Image: r.image, Host: r.host, Dst: r.dst, At: base.Add(time.Duration(i*4+k) * 1500 * time.Millisecond), ID: uint64(1000 + i*4 + k)}
					relay := f.policy.Load().Decide(&fl) // hop 1: the relay
					attachSide := clientSide.Decide(&fl) // hop 3, evaluated here as a table
					if relay != attachSide {
						t.Errorf("flow %d (%+v): relay %+v, attach side %+v", i, r, relay, attachSide)
					}
					verdict := "carried"
					if relay.Exit != rules.ExitClient {
						verdict = "claim refused"
					}
					fmt.Fprintf(&table, "%-4d %-17s %-18s %-10s %-5d %-8s %-8s %-8s %-23s %s\n", i, orDash(r.host), r.dst, fl.At.Format("04:05.0"), fl.ID,
						relay.Exit, relay.Dimension, attachSide.Exit, orDash(strings.Replace(relay.Proxy, prox.addr, "PROXY:PORT", 1)), verdict)
					// Hop 2 carries the relay's decision; when it says client the attach
					// side must accept, otherwise a crafted claim of client must be refused.
					claim := relay
					if relay.Exit != rules.ExitClient {
						claim = rules.Decision{Exit: rules.ExitClient, Dimension: relay.Dimension}
					}
					conn, err := f.srv.Dial(context.Background(), w, fl, &claim)
					if relay.Exit == rules.ExitClient {
						clientN++
						if err != nil {
							t.Errorf("flow %d routed client was refused: %v", i, err)
							continue
						}
						roundTrip(t, conn, "hello from corp\n")
						continue
					}
					refusedN++
					var re *RefusedError
					if !errors.As(err, &re) || re.Code != RefuseRoute {
						t.Errorf("flow %d routed %s, claimed client: Dial = %v, want a %s refusal", i, relay.Exit, err, RefuseRoute)
					}
				}
			}
			checkGolden(t, "three-hops-"+pol.name+".golden", table.String())
			if clientN == 0 || refusedN == 0 {
				t.Errorf("table has %d client and %d other flows; it must have both", clientN, refusedN)
			}
			if st := c.Stats(); st.ByCode[RefuseRoute] != uint64(refusedN) {
				t.Errorf("attach side counted %d route refusals, want %d", st.ByCode[RefuseRoute], refusedN)
			}
			if pol.name == "script" && prox.n.Load() == 0 {
				t.Error("no flow went through the PAC's proxy")
			}
		})
	}
}

type testProxy struct {
	addr string
	n    atomic.Int64
}

// startProxy runs kl's own HTTP CONNECT proxy on loopback, counting tunnels; every
// tunnel goes to the address to (the test's echo server stands for every destination).
func startProxy(t *testing.T, to netip.AddrPort) *testProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &testProxy{addr: ln.Addr().String()}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go proxy.ServeHTTP(ctx, ln, func(ctx context.Context, tg upstream.Target) (net.Conn, error) {
		p.n.Add(1)
		return (&net.Dialer{}).DialContext(ctx, "tcp", to.String())
	}, slog.New(slog.DiscardHandler))
	return p
}

func TestProxies(t *testing.T) {
	echo := echoServer(t, "corp")
	prox := startProxy(t, echo)
	// Loopback is never proxied (as in curl and Go); the flows go to a corp address that
	// only the proxy can reach.
	dst := netip.MustParseAddrPort("203.0.113.7:443")
	t.Run("environment", func(t *testing.T) {
		f := newFixture(t, clientAll)
		env := map[string]string{"https_proxy": "http://" + prox.addr, "NO_PROXY": "skip.example"}
		c, _ := f.attach(ClientOptions{Token: testToken, Getenv: func(k string) string { return env[k] }}, payWorkload)
		before := prox.n.Load()
		conn, err := f.srv.Dial(context.Background(), payWorkload, rules.Flow{Labels: payWorkload.Labels, Dst: dst}, nil)
		if err != nil {
			t.Fatal(err)
		}
		roundTrip(t, conn, "hello from corp\n")
		if prox.n.Load() != before+1 {
			t.Errorf("HTTPS_PROXY not used: %d tunnels", prox.n.Load()-before)
		}
		// NO_PROXY: a flow to that host dials directly (here: fails to resolve). The flow
		// is known by its name alone (proxy mode): with an address next to a name that
		// decided nothing, the attach side dials the address (TestDialsWhatDecided).
		_, err = f.srv.Dial(context.Background(), payWorkload, rules.Flow{Labels: payWorkload.Labels, Host: "skip.example", Dst: netip.AddrPortFrom(netip.Addr{}, dst.Port())}, nil)
		if prox.n.Load() != before+1 {
			t.Errorf("NO_PROXY ignored")
		}
		var re *RefusedError
		if !errors.As(err, &re) || re.Code != RefuseDial {
			t.Errorf("unresolvable host: %v, want %s", err, RefuseDial)
		}
		if strings.Contains(err.Error(), "skip.example") {
			t.Errorf("the refusal names the destination: %v", err)
		}
		if c.Stats().ByCode[RefuseDial] != 1 {
			t.Errorf("stats: %+v", c.Stats())
		}
	})
	t.Run("to the daemon", func(t *testing.T) {
		f := newFixture(t, clientAll)
		// The daemon's listener is on loopback, which is never proxied; name it by a host
		// that resolves there so the environment applies.
		serverProxy := startProxy(t, netip.MustParseAddrPort(f.addr))
		_, port, _ := net.SplitHostPort(f.addr)
		env := map[string]string{"HTTPS_PROXY": "http://" + serverProxy.addr}
		c, err := NewClient(ClientOptions{Server: "kl-relayd.test:" + port, ServerName: "localhost", CAFile: f.pki.CAFile, Token: testToken,
			Getenv: func(k string) string { return env[k] }})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		f.waitLive(payWorkload, true)
		cancel()
		<-done
		if serverProxy.n.Load() != 1 {
			t.Errorf("the session went around HTTPS_PROXY (%d tunnels)", serverProxy.n.Load())
		}
	})
	t.Run("bad environment fails closed", func(t *testing.T) {
		f := newFixture(t, clientAll)
		env := map[string]string{"ALL_PROXY": "ftp://" + prox.addr}
		f.attach(ClientOptions{Token: testToken, Getenv: func(k string) string { return env[k] }}, payWorkload)
		_, err := f.srv.Dial(context.Background(), payWorkload, rules.Flow{Labels: payWorkload.Labels, Dst: dst}, nil)
		var re *RefusedError
		if !errors.As(err, &re) || re.Code != RefuseProxy {
			t.Fatalf("Dial = %v, want %s", err, RefuseProxy)
		}
	})
}

// TestReload: a reloaded policy reaches the session and flows decided under it are
// carried; a flow claiming a version the attach side never got is refused.
func TestReload(t *testing.T) {
	f := newFixture(t, "default: direct\n")
	dst := echoServer(t, "corp")
	c, _ := f.attach(ClientOptions{Token: testToken}, payWorkload)
	flow := rules.Flow{Labels: payWorkload.Labels, Dst: dst}
	if _, err := f.srv.Dial(context.Background(), payWorkload, flow, nil); !errors.Is(err, ErrNotClient) {
		t.Fatalf("Dial under a direct policy = %v", err)
	}
	f.policy.Store(mustPolicy(t, clientAll))
	f.srv.Reload()
	conn, err := f.srv.Dial(context.Background(), payWorkload, flow, nil)
	if err != nil {
		t.Fatalf("Dial after reload: %v", err)
	}
	roundTrip(t, conn, "hello from corp\n")
	if c.Stats().Policy != f.policy.Load().Hash() {
		t.Errorf("attach side holds %s", c.Stats().Policy)
	}
	// A header naming an unknown version, written straight onto a stream.
	se := f.srv.pick(payWorkload)
	st, err := se.mux.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	writeFrame(st, Header{Flow: 9, At: time.Now(), Workload: payWorkload.ID, Dst: dst, Port: dst.Port(), Policy: strings.Repeat("ab", 32), Exit: "client"})
	var v Verdict
	st.SetDeadline(time.Now().Add(5 * time.Second))
	if err := readFrame(bufioReader(st), maxSmallFrame, &v); err != nil || v.OK || v.Code != RefusePolicy {
		t.Fatalf("verdict = %+v, %v; want %s", v, err, RefusePolicy)
	}
}

func TestSettings(t *testing.T) {
	tests := []struct {
		name string
		s    Settings
		want string // "" = valid
	}{
		{"off", Settings{}, ""},
		{"ok", Settings{Listen: ":7443", Cert: "/c", Key: "/k", Credentials: []Credential{{Name: "a", Token: testToken, Selector: "team=pay"}}}, ""},
		{"no tls", Settings{Listen: ":7443", Credentials: []Credential{{Name: "a", Token: testToken, Workloads: []string{"x"}}}}, "cert and key"},
		{"no creds", Settings{Listen: ":7443", Cert: "/c", Key: "/k"}, "no credentials"},
		{"short token", Settings{Listen: ":7443", Cert: "/c", Key: "/k", Credentials: []Credential{{Name: "a", Token: "abc", Workloads: []string{"x"}}}}, "shorter than 16"},
		{"two kinds", Settings{Listen: ":7443", Cert: "/c", Key: "/k", Credentials: []Credential{{Name: "a", Token: testToken, Subject: "a", Workloads: []string{"x"}}}}, "exactly one"},
		{"grants nothing", Settings{Listen: ":7443", Cert: "/c", Key: "/k", Credentials: []Credential{{Name: "a", Token: testToken}}}, "carry nothing"},
		{"bad selector", Settings{Listen: ":7443", Cert: "/c", Key: "/k", Credentials: []Credential{{Name: "a", Token: testToken, Selector: "=x"}}}, "credentials[0] (a): selector"},
		{"subject without CA", Settings{Listen: ":7443", Cert: "/c", Key: "/k", Credentials: []Credential{{Name: "a", Subject: "a", Workloads: []string{"x"}}}}, "needs clientCA"},
		{"relative cert", Settings{Listen: ":7443", Cert: "c", Key: "/k", Credentials: []Credential{{Name: "a", Token: testToken, Workloads: []string{"x"}}}}, "not an absolute path"},
		{"bad hash", Settings{Listen: ":7443", Cert: "/c", Key: "/k", Credentials: []Credential{{Name: "a", TokenSHA256: "zz", Workloads: []string{"x"}}}}, "64 hex"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.s.Validate()
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Errorf("Validate() = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestSelector(t *testing.T) {
	tests := []struct {
		sel    string
		labels map[string]string
		want   bool
	}{
		{"team=pay", map[string]string{"team": "pay"}, true},
		{"team=pay", map[string]string{"team": "payx"}, false},
		{"team", map[string]string{"team": ""}, true},
		{"team=pay,env=dev", map[string]string{"team": "pay"}, false},
		{" env = dev , team ", map[string]string{"team": "pay", "env": "dev"}, true},
		{"", map[string]string{"team": "pay"}, false},
	}
	for _, tt := range tests {
		s, err := ParseSelector(tt.sel)
		if err != nil {
			t.Fatalf("ParseSelector(%q): %v", tt.sel, err)
		}
		if got := s.Matches(tt.labels); got != tt.want {
			t.Errorf("ParseSelector(%q).Matches(%v) = %v, want %v", tt.sel, tt.labels, got, tt.want)
		}
	}
}

func TestTokenSHA256(t *testing.T) {
	sum := sha256.Sum256([]byte(testToken))
	c := Credential{TokenSHA256: hex.EncodeToString(sum[:])}
	if !c.tokenMatches(testToken) {
		t.Error("the token does not match its own hash")
	}
	for _, tok := range []string{"", testToken + "x", strings.ToUpper(testToken)} {
		if c.tokenMatches(tok) {
			t.Errorf("token %q matched", tok)
		}
	}
}

func bufioReader(r io.Reader) *bufio.Reader { return bufio.NewReader(r) }

func TestAgentControl(t *testing.T) {
	f := newFixture(t, clientAll)
	c, _ := f.attach(ClientOptions{Token: testToken}, payWorkload)
	path := filepath.Join(t.TempDir(), "ctl", "attach.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopped := make(chan struct{})
	done := make(chan error, 1)
	// The stop callback is slow to return, as a real one may be: the answer to the stop
	// request is written all the same.
	go func() {
		done <- ServeControl(ctx, path, c, func() { close(stopped); cancel(); time.Sleep(100 * time.Millisecond) })
	}()
	deadline := time.Now().Add(5 * time.Second)
	var st AgentStatus
	var err error
	for {
		if st, err = AgentRequest(context.Background(), path, "status"); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil || !st.Stats.Connected || st.PID == 0 || st.Server != f.addr {
		t.Fatalf("status = %+v, %v", st, err)
	}
	if err := ServeControl(context.Background(), path, c, func() {}); err == nil || !strings.Contains(err.Error(), "another attach agent") {
		t.Errorf("second agent on the same socket: %v", err)
	}
	if _, err := AgentRequest(context.Background(), path, "stop"); err != nil {
		t.Fatal(err)
	}
	<-stopped
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := AgentRequest(context.Background(), path, "status"); !errors.Is(err, ErrNoAgent) {
		t.Errorf("status after stop = %v, want ErrNoAgent", err)
	}
}

// TestReconnect: when the session drops, Keep reconnects with backoff and the flows of
// the workload are carried again.
func TestReconnect(t *testing.T) {
	f := newFixture(t, clientAll)
	dst := echoServer(t, "corp")
	c, _ := f.attach(ClientOptions{Token: testToken}, payWorkload)
	first := c.Stats().Session
	f.srv.pick(payWorkload).mux.Close()
	f.waitLive(payWorkload, true)
	conn, err := f.srv.Dial(context.Background(), payWorkload, rules.Flow{Labels: payWorkload.Labels, Dst: dst}, nil)
	if err != nil {
		t.Fatalf("Dial after reconnect: %v", err)
	}
	roundTrip(t, conn, "hello from corp\n")
	st := c.Stats()
	if st.Reconnects < 1 || st.Sessions < 2 || st.Session == first {
		t.Errorf("Stats after a dropped session = %+v", st)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// checkGolden compares got with testdata/name (KL_UPDATE_GOLDEN=1 rewrites it).
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if os.Getenv("KL_UPDATE_GOLDEN") == "1" {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (KL_UPDATE_GOLDEN=1 creates it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs (KL_UPDATE_GOLDEN=1 rewrites it):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// TestHostOnlyFlow: a flow known only by name and port (proxy mode) keeps its port across
// the session, so port rules decide the same on both sides.
func TestHostOnlyFlow(t *testing.T) {
	f := newFixture(t, "default: direct\nrules:\n  - pattern: \"*:8443\"\n    route: client\n")
	echo := echoServer(t, "corp")
	c, _ := f.attach(ClientOptions{Token: testToken}, payWorkload)
	c.o.dialDest = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr != "git.corp.example:8443" {
			return nil, fmt.Errorf("dialled %s", addr)
		}
		return (&net.Dialer{}).DialContext(ctx, network, echo.String())
	}
	conn, err := f.srv.Exit()(context.Background(), payWorkload, relay.Dest{Host: "git.corp.example", Port: 8443})
	if err != nil {
		t.Fatalf("host-only flow: %v", err)
	}
	roundTrip(t, conn, "hello from corp\n")
	if _, err := f.srv.Exit()(context.Background(), payWorkload, relay.Dest{Host: "git.corp.example", Port: 443}); !errors.Is(err, ErrNotClient) {
		t.Errorf("port 443 = %v, want ErrNotClient", err)
	}
}

func TestLoadSettings(t *testing.T) {
	dir := t.TempDir()
	good := "listen: \":7443\"\ncert: /etc/kl/attach.crt\nkey: /etc/kl/attach.key\ncredentials:\n  - name: alice\n    token: " + testToken + "\n    selector: team=pay\n"
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	tests := []struct {
		name     string
		path     string
		required bool
		want     string // "" = loads
		enabled  bool
	}{
		{"good", write("good.yaml", good, 0o600), true, "", true},
		{"missing, default", filepath.Join(dir, "none.yaml"), false, "", false},
		{"missing, named", filepath.Join(dir, "none.yaml"), true, "no such file", false},
		{"readable by others", write("open.yaml", good, 0o644), true, "chmod 600", false},
		{"unknown key", write("typo.yaml", good+"listn: x\n", 0o600), true, "field listn not found", false},
		{"invalid", write("bad.yaml", "listen: \":7443\"\n", 0o600), true, "cert and key", false},
		{"empty", write("empty.yaml", "", 0o600), true, "", false},
		// Settings yaml would skip (a second document) are refused, never silently off.
		{"empty documents first", write("docs.yaml", "---\n---\n"+good, 0o600), true, "more than one YAML document", false},
		{"second document", write("docs2.yaml", "listen: \"\"\n---\n"+good, 0o600), true, "more than one YAML document", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := LoadSettings(tt.path, tt.required)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("LoadSettings = %v, want %q", err, tt.want)
			}
			if err == nil && s.Enabled() != tt.enabled {
				t.Errorf("Enabled() = %v, want %v", s.Enabled(), tt.enabled)
			}
		})
	}
}

// TestAbort: when the daemon ends a flow abnormally (the workload reset it) while the
// destination is still sending, the attach side drops its connection to the destination
// instead of pushing bytes into a stream nobody reads.
func TestAbort(t *testing.T) {
	f := newFixture(t, clientAll)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ended := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 32<<10)
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			c.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := c.Write(buf); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				close(ended)
				return
			}
		}
	}()
	c, _ := f.attach(ClientOptions{Token: testToken}, payWorkload)
	dst := ln.Addr().(*net.TCPAddr).AddrPort()
	conn, err := f.srv.Dial(context.Background(), payWorkload, rules.Flow{Labels: payWorkload.Labels, Dst: dst}, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadFull(conn, make([]byte, 64<<10))
	conn.Close()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the destination is still being read after the daemon aborted the flow")
	}
	deadline := time.Now().Add(5 * time.Second)
	for c.Stats().Active != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("flow still active: %+v", c.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPeerReset: a destination that resets the connection on the attach side makes the
// daemon's side of the flow fail with ECONNRESET (the relay then resets the workload's
// connection), not end cleanly.
func TestPeerReset(t *testing.T) {
	f := newFixture(t, clientAll)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		c.Write([]byte("hi\n"))
		time.Sleep(100 * time.Millisecond)
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}()
	f.attach(ClientOptions{Token: testToken}, payWorkload)
	dst := ln.Addr().(*net.TCPAddr).AddrPort()
	conn, err := f.srv.Dial(context.Background(), payWorkload, rules.Flow{Labels: payWorkload.Labels, Dst: dst}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 3)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "hi\n" {
		t.Fatalf("greeting %q, %v", buf, err)
	}
	// The relay's copy keeps moving its read deadline; a reset must win anyway.
	conn.SetReadDeadline(time.Now().Add(time.Minute))
	_, err = conn.Read(buf)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after the destination reset = %v, want ECONNRESET", err)
	}
}

// TestSessionDropEndsFlows: when the session drops while a flow to a silent destination
// is being carried, the attach side ends that flow and reconnects, rather than waiting
// for the destination to speak or close first.
func TestSessionDropEndsFlows(t *testing.T) {
	f := newFixture(t, clientAll)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		// Silent: it never writes, and it keeps its end open (a half-close from the
		// attach side is not the end of it).
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	defer func() {
		select {
		case c := <-accepted:
			c.Close()
		default:
		}
	}()
	c, _ := f.attach(ClientOptions{Token: testToken}, payWorkload)
	first := c.Stats().Session
	dst := ln.Addr().(*net.TCPAddr).AddrPort()
	conn, err := f.srv.Dial(context.Background(), payWorkload, rules.Flow{Labels: payWorkload.Labels, Dst: dst}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	deadline := time.Now().Add(5 * time.Second)
	for c.Stats().Active != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("flow not carried: %+v", c.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	f.srv.pick(payWorkload).mux.Close()
	deadline = time.Now().Add(5 * time.Second)
	for st := c.Stats(); st.Session == first || !st.Connected || st.Active != 0; st = c.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("after the session dropped: %+v; want a new session and no active flow", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestThisMachineRefused: the attach side dials from its network, never into the machine
// it runs on: a flow to its loopback (by address or by name) or to 0.0.0.0 is refused,
// also when the policy routes every flow to the client, and the refusal names no
// destination. A PAC proxy is not asked to reach them either. (Link-local addresses are
// refused the same way; the daemon's metadata guard keeps them from this test.)
func TestThisMachineRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var reached atomic.Int64
	testutil.Serve(t, ln, func(c net.Conn) { reached.Add(1) })
	local := ln.Addr().(*net.TCPAddr).AddrPort()
	port := local.Port()
	prox := startProxy(t, local)
	for _, pol := range []struct{ name, src string }{
		{"direct", clientAll},
		{"pac proxy", "default: direct\nscript: |\n  function FindProxyForURL(url, host) { return \"PROXY " + prox.addr + "\"; }\n"},
	} {
		t.Run(pol.name, func(t *testing.T) {
			f := newFixture(t, pol.src)
			keepRealClient(t, f, false)
			for _, fl := range []rules.Flow{
				{Dst: local},
				{Dst: netip.AddrPortFrom(netip.IPv4Unspecified(), port)},
				{Host: "localhost", Dst: netip.AddrPortFrom(netip.Addr{}, port)},
				{Host: "127.0.0.1", Dst: netip.AddrPortFrom(netip.Addr{}, port)},
			} {
				fl.Labels = payWorkload.Labels
				conn, err := f.srv.Dial(context.Background(), payWorkload, fl, nil)
				if err == nil {
					conn.Close()
					t.Errorf("flow to %s %s was carried into the attach side's own machine", fl.Host, fl.Dst)
					continue
				}
				var re *RefusedError
				if !errors.As(err, &re) {
					t.Errorf("flow to %s %s: %v, want a refusal by the attach side", fl.Host, fl.Dst, err)
				}
				if re != nil && re.Code != RefuseLocal {
					t.Errorf("flow to %s %s: code %s, want %s", fl.Host, fl.Dst, re.Code, RefuseLocal)
				}
				if strings.Contains(err.Error(), "127.0.0.1") || strings.Contains(err.Error(), "localhost") {
					t.Errorf("the refusal names the destination: %v", err)
				}
			}
		})
	}
	time.Sleep(50 * time.Millisecond)
	if n := reached.Load(); n != 0 {
		t.Errorf("the attach side's loopback listener was reached %d times", n)
	}
	if n := prox.n.Load(); n != 0 {
		t.Errorf("the PAC proxy was asked %d times for the attach side's own machine", n)
	}
}

// TestThisMachineAllowed: with AllowLocal (kl-ctl attach --allow-local) the operator lends
// the machine's own services too, a tunnel on its loopback for one.
func TestThisMachineAllowed(t *testing.T) {
	local := echoServer(t, "loopback")
	f := newFixture(t, clientAll)
	keepRealClient(t, f, true)
	for _, fl := range []rules.Flow{
		{Dst: local},
		{Host: "localhost", Dst: netip.AddrPortFrom(netip.Addr{}, local.Port())},
	} {
		fl.Labels = payWorkload.Labels
		conn, err := f.srv.Dial(context.Background(), payWorkload, fl, nil)
		if err != nil {
			t.Errorf("flow to %s %s with AllowLocal: %v", fl.Host, fl.Dst, err)
			continue
		}
		roundTrip(t, conn, "hello from loopback\n")
	}
}

// keepRealClient keeps an attach session to f with the dialer kl-ctl attach runs (not the
// fixture's), until the test ends.
func keepRealClient(t *testing.T, f *fixture, allowLocal bool) {
	t.Helper()
	f.attach(ClientOptions{Token: testToken, AllowLocal: allowLocal, dialDest: destDialer(10*time.Second, allowLocal)}, payWorkload)
}

func TestOnThisMachine(t *testing.T) {
	tests := []struct {
		name string
		h    Header
		want bool
	}{
		{"loopback", Header{Dst: netip.MustParseAddrPort("127.0.0.2:22"), Port: 22}, true},
		{"v6 loopback", Header{Dst: netip.MustParseAddrPort("[::1]:22"), Port: 22}, true},
		{"mapped loopback", Header{Dst: netip.MustParseAddrPort("[::ffff:127.0.0.1]:22"), Port: 22}, true},
		{"unspecified", Header{Dst: netip.MustParseAddrPort("0.0.0.0:22"), Port: 22}, true},
		{"this network", Header{Dst: netip.MustParseAddrPort("0.1.2.3:22"), Port: 22}, true},
		{"metadata", Header{Dst: netip.MustParseAddrPort("169.254.169.254:80"), Port: 80}, true},
		{"v6 link-local", Header{Dst: netip.MustParseAddrPort("[fe80::1]:80"), Port: 80}, true},
		{"localhost", Header{Host: "LocalHost.", Port: 22}, true},
		{"under localhost", Header{Host: "db.localhost", Port: 22}, true},
		{"literal host", Header{Host: "[::1]", Port: 22}, true},
		{"short loopback", Header{Host: "127.1", Port: 22}, true},
		{"decimal loopback", Header{Host: "2130706433", Port: 22}, true},
		{"hex loopback", Header{Host: "0x7f000001", Port: 22}, true},
		{"octal loopback", Header{Host: "0177.0.0.1", Port: 22}, true},
		{"short unspecified", Header{Host: "0", Port: 22}, true},
		{"hex metadata", Header{Host: "0xa9fea9fe", Port: 80}, true},
		{"hosts file alias", Header{Host: "ip6-localhost", Port: 22}, true},
		{"own name", Header{Host: "Laptop7", Port: 22}, true},
		{"own full name", Header{Host: "laptop7.corp.example.", Port: 22}, true},
		{"short corp address", Header{Host: "10.1", Port: 22}, false},
		{"corp address", Header{Dst: netip.MustParseAddrPort("10.1.2.3:22"), Port: 22}, false},
		{"corp name", Header{Host: "git.corp.example", Dst: netip.MustParseAddrPort("127.0.0.1:22"), Port: 22}, false},
		{"name like localhost", Header{Host: "localhost.corp.example", Port: 22}, false},
	}
	defer func(h func() string) { hostname = h }(hostname)
	hostname = func() string { return "laptop7.corp.example" }
	for _, tt := range tests {
		if got := tt.h.namesThisMachine(); got != tt.want {
			t.Errorf("%s: namesThisMachine(%+v) = %v, want %v", tt.name, tt.h, got, tt.want)
		}
	}
	for _, addr := range []string{"127.0.0.1:1", "[::1]:1", "0.0.0.0:1"} {
		if _, err := destDialer(time.Second, false)(context.Background(), "tcp", addr); !errors.Is(err, errThisMachine) {
			t.Errorf("destDialer(%s) = %v, want errThisMachine", addr, err)
		}
	}
}

// TestExtraStreams: the attach side opens one stream, the control stream. The daemon
// never reads another, so each one a peer opened (before authenticating or after) would
// hold up to a window of data for nothing: the daemon ends such a session at once.
func TestExtraStreams(t *testing.T) {
	f := newFixture(t, clientAll)
	for _, authenticate := range []bool{false, true} {
		t.Run(fmt.Sprint("authenticated=", authenticate), func(t *testing.T) {
			mux := rawPeer(t, f, "", authenticate)
			if authenticate {
				f.waitLive(payWorkload, true)
			}
			// A stream the daemon keeps without reading it would sit there with whatever
			// the peer sent: the peer's read of it would wait until the deadline. Ending the
			// session or resetting the stream (yamux does that to one that finds the accept
			// backlog full) ends the read at once. The daemon may even end the session
			// before OpenStream returns.
			if extra, err := mux.OpenStream(); err == nil {
				extra.SetDeadline(time.Now().Add(3 * time.Second))
				extra.Write(make([]byte, 64<<10))
				if _, err := extra.Read(make([]byte, 1)); errors.Is(err, yamux.ErrTimeout) {
					t.Fatal("the daemon kept a second stream from the peer, unread")
				}
			}
			if authenticate {
				select {
				case <-mux.CloseChan():
				case <-time.After(3 * time.Second):
					t.Fatal("the daemon kept a session whose peer opened a stream it never reads")
				}
				f.waitLive(payWorkload, false)
			}
		})
	}
}

// TestRefusal: what the daemon keeps of an attach side's refusal. A code it does not
// know reads E_UNKNOWN, with the code in the reason; the reason loses control bytes and
// is cut to maxRefusalReason.
func TestRefusal(t *testing.T) {
	long := strings.Repeat("x", 300)
	tests := []struct {
		name       string
		v          Verdict
		code, want string
	}{
		{"known", Verdict{Code: RefuseDial, Reason: "connection refused"}, RefuseDial, "connection refused"},
		{"duplicate flow", Verdict{Code: RefuseDuplicate, Reason: "flow 7 is already live on this session"}, RefuseDuplicate, "flow 7 is already live on this session"},
		{"no code", Verdict{Reason: "no"}, RefuseUnknown, `code "": no`},
		{"unknown code", Verdict{Code: "E_NEW", Reason: "later"}, RefuseUnknown, `code "E_NEW": later`},
		{"control bytes", Verdict{Code: RefuseProxy, Reason: "bad\nline\x1b[31m\u00e9"}, RefuseProxy, "badline[31m"},
		{"long", Verdict{Code: RefuseDial, Reason: long}, RefuseDial, long[:maxRefusalReason]},
	}
	for _, tt := range tests {
		got := refusal(tt.v)
		if got.Code != tt.code || got.Reason != tt.want {
			t.Errorf("%s: refusal(%+v) = %s %q, want %s %q", tt.name, tt.v, got.Code, got.Reason, tt.code, tt.want)
		}
	}
}

// NewClient refuses a server address it could never reach, naming what is wrong, and
// never echoes credentials written into it.
func TestNewClientServerAddress(t *testing.T) {
	for _, tt := range []struct{ server, want string }{
		{"alice:S3CRET@node.example:15443", "holds credentials"},
		{"node.example:99999", `port "99999" is not 1-65535`},
		{"node.example:0", `port "0" is not 1-65535`},
		{"node.example", "is not host:port"},
	} {
		_, err := NewClient(ClientOptions{Server: tt.server, Token: testToken, Getenv: func(string) string { return "" }})
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "S3CRET") {
			t.Errorf("NewClient(%q) = %v, want an error saying %q (and no password)", tt.server, err, tt.want)
		}
	}
}
