package relay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/relayd/metrics"
	"github.com/kl-egress/kl/relayd/relay"
	"github.com/kl-egress/kl/relayd/upstream"
	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/tests/testutil"
)

// eventually polls cond for up to 5 s (the test's assertions follow it).
func eventually(cond func() bool) {
	for deadline := time.Now().Add(5 * time.Second); !cond() && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
}

// testLoops is the relay's Loops for the tests of this file: KL_TEST_NOLOOP=1 runs them
// on the goroutine path, which must behave alike.
func testLoops() int {
	if os.Getenv("KL_TEST_NOLOOP") != "" {
		return -1
	}
	return 1
}

// loopNet is a pod netns with kl's capture and a server netns behind a veth: 192.0.2.2
// echoes on :80 (then writes "bye" after the client's half-close), holds connections
// silently on :82 and drops SYNs to :83; nothing listens on :81 (:88 and :89:
// newLoopNet).
type loopNet struct {
	pod, srv *testutil.Netns
}

const (
	loopMark     = 0x4b4c
	loopRedirect = 15911
)

func newLoopNet(t *testing.T) *loopNet {
	testutil.RequireTool(t, "nft")
	n := &loopNet{pod: testutil.NewNetns(t, "kllp"), srv: testutil.NewNetns(t, "kllps")}
	testutil.Link(t, n.pod, []string{"192.0.2.1/24", "fd00:4c::1/64"}, n.srv, []string{"192.0.2.2/24", "fd00:4c::2/64"})
	if err := netns.Install(n.pod.Path, netns.Capture{RedirectPort: loopRedirect, Mark: loopMark, IPv6: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Remove(n.pod.Path) })
	n.srv.Exec(t, "nft", "add table inet kltest; add chain inet kltest in { type filter hook input priority 0; }; add rule inet kltest in tcp dport 83 drop")
	for _, a := range []string{"192.0.2.2:80", "[fd00:4c::2]:80"} {
		ln, err := netns.Listen(n.srv.Path, "tcp", a)
		if err != nil {
			t.Fatal(err)
		}
		testutil.Serve(t, ln, func(c net.Conn) {
			io.Copy(c, c)
			c.Write([]byte("bye"))
		})
	}
	ln, err := netns.Listen(n.srv.Path, "tcp", "192.0.2.2:82")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Serve(t, ln, func(c net.Conn) { io.Copy(io.Discard, c) })
	// :88 speaks first, then echoes as :80 does; :89 reads nothing for 300 ms, then
	// everything, and answers with the count.
	ln, err = netns.Listen(n.srv.Path, "tcp", "192.0.2.2:88")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Serve(t, ln, func(c net.Conn) {
		c.Write([]byte("hello"))
		io.Copy(c, c)
		c.Write([]byte("bye"))
	})
	ln, err = netns.Listen(n.srv.Path, "tcp", "192.0.2.2:89")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Serve(t, ln, func(c net.Conn) {
		time.Sleep(300 * time.Millisecond)
		k, _ := io.Copy(io.Discard, c)
		fmt.Fprint(c, k)
	})
	// A fresh veth may lose the first packets (IPv6 while the link comes up): wait until
	// both families reach the server, as the relay's marked sockets do.
	for _, a := range []string{"192.0.2.2:80", "[fd00:4c::2]:80"} {
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			c, err := netns.Dial(ctx, n.pod.Path, loopMark, "tcp", a)
			cancel()
			if err == nil {
				c.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s unreachable from the pod: %v", a, err)
			}
		}
	}
	return n
}

// dial connects from the pod (unmarked: captured).
func (n *loopNet) dial(t *testing.T, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := netns.Dial(ctx, n.pod.Path, 0, "tcp", addr)
	if err == nil {
		c.SetDeadline(time.Now().Add(10 * time.Second))
	}
	return c, err
}

// exchange writes "x", half-closes and reads to the end: "xbye" when carried, or the
// error that ended it (a reset surfaces at the write, the half-close or the read).
func exchange(c net.Conn) (string, error) {
	defer c.Close()
	if _, err := c.Write([]byte("x")); err != nil {
		return "", err
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return "", err
	}
	got, err := io.ReadAll(c)
	return string(got), err
}

// isReset reports an error a reset from the relay causes: at a write or read, or at a
// half-close that comes after it (the socket is then no longer connected).
func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ENOTCONN)
}

// hostPolicy needs hostnames (so its flows are peeked on the goroutine path).
type hostPolicy struct{ *rules.Policy }

func (hostPolicy) NeedsHost() bool { return true }

// TestLoop runs transparent flows through the relay's event loop as the daemon builds it
// (real netns, capture, sockets): carried with half-close both ways over IPv4 and IPv6,
// denied, refused by the destination, connect timeout, an exit the relay lacks, exits
// and policies that hand the flow to the goroutine path, then the idle timeout, Close
// and Shutdown's drain.
func TestLoop(t *testing.T) {
	loops := testLoops()
	n := newLoopNet(t)
	var named atomic.Int32
	exits := map[string]relay.DialFunc{
		"named": func(ctx context.Context, w *api.Workload, dst relay.Dest) (net.Conn, error) {
			named.Add(1)
			// The echo server, wherever the flow was going.
			return relay.NetnsFrom(ctx).DialAddrPort(ctx, loopMark, netip.AddrPortFrom(dst.Addr.Addr(), 80))
		},
	}
	policy := `default: direct
rules:
  - port: "84"
    action: deny
  - port: "85"
    exit: named
  - port: "86"
    exit: nowhere
`
	pol, err := rules.Parse("t", []byte(policy), rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		policy   relay.Decider
		to       string
		want     string // "" : reset
		reason   string // in the audit record
		exit     string
		handoffs int32
	}{
		{"direct", pol, "192.0.2.2:80", "xbye", "", "direct", 0},
		{"direct ipv6", pol, "[fd00:4c::2]:80", "xbye", "", "direct", 0},
		{"deny", pol, "192.0.2.2:84", "", "", "deny", 0},
		{"refused", pol, "192.0.2.2:81", "", "connection refused", "direct", 0},
		{"connect timeout", pol, "192.0.2.2:83", "", "i/o timeout", "direct", 0},
		{"exit on goroutines", pol, "192.0.2.2:85", "xbye", "", "named", 1},
		{"exit not available", pol, "192.0.2.2:86", "", "not available", "nowhere", 0},
		{"policy needs the host", hostPolicy{pol}, "192.0.2.2:80", "xbye", "", "direct", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			aud, err := audit.New("", 0, 0, 8)
			if err != nil {
				t.Fatal(err)
			}
			before := named.Load()
			r := relay.New(relay.Options{
				RedirectPort: loopRedirect, Mark: loopMark, Loops: loops,
				ConnectTimeout: 300 * time.Millisecond, SniffWait: 50 * time.Millisecond,
				Policy: func() relay.Decider { return tc.policy },
				Exits:  map[string]relay.DialFunc{"named": exits["named"]},
				Audit:  aud,
			})
			defer testutil.Shutdown(t, r)
			if _, err := r.Open(api.Workload{ID: "w", Netns: n.pod.Path, Mode: api.ModeTransparent}); err != nil {
				t.Fatal(err)
			}
			c, err := n.dial(t, tc.to)
			var got string
			if err == nil {
				got, err = exchange(c)
			}
			if tc.want != "" && (got != tc.want || err != nil) {
				t.Fatalf("got %q, %v; want %q (audit %+v)", got, err, tc.want, aud.Recent(8))
			}
			if tc.want == "" && !isReset(err) {
				t.Fatalf("got %q, %v; want a reset", got, err)
			}
			var recs []audit.Record
			eventually(func() bool { recs = aud.Recent(8); return len(recs) > 0 })
			if len(recs) != 1 || recs[0].Exit != tc.exit || !strings.Contains(recs[0].Reason, tc.reason) {
				t.Errorf("audit %+v, want one record for exit %s with reason %q", recs, tc.exit, tc.reason)
			}
			if h := named.Load() - before; h != tc.handoffs {
				t.Errorf("%d dials through the named exit, want %d", h, tc.handoffs)
			}
			eventually(func() bool { return r.Stats().Active == 0 })
			if s := r.Stats(); s.Active != 0 || s.Total != 1 {
				t.Errorf("stats %+v, want 1 flow, none active", s)
			}
		})
	}
}

// TestLoopLifecycle: an idle flow is reset after the idle timeout while a busy one goes
// on; Close ends the pod's flows; Shutdown stops accepting, lets an established flow
// finish, and closes what is left when its context ends.
func TestLoopLifecycle(t *testing.T) {
	n := newLoopNet(t)
	pol, err := rules.Parse("t", []byte("default: direct\n"), rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	newRelay := func(idle time.Duration) *relay.Relay {
		r := relay.New(relay.Options{RedirectPort: loopRedirect, Mark: loopMark, Loops: testLoops(), IdleTimeout: idle,
			Policy: func() relay.Decider { return pol }})
		if _, err := r.Open(api.Workload{ID: "w", Netns: n.pod.Path, Mode: api.ModeTransparent}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	echo := func(c net.Conn, s string) error {
		if _, err := io.WriteString(c, s); err != nil {
			return err
		}
		b := make([]byte, len(s))
		_, err := io.ReadFull(c, b)
		if err == nil && string(b) != s {
			err = fmt.Errorf("echoed %q, want %q", b, s)
		}
		return err
	}

	t.Run("idle timeout", func(t *testing.T) {
		r := newRelay(300 * time.Millisecond)
		defer testutil.Shutdown(t, r)
		idle, err := n.dial(t, "192.0.2.2:80")
		if err != nil {
			t.Fatal(err)
		}
		busy, err := n.dial(t, "192.0.2.2:80")
		if err != nil {
			t.Fatal(err)
		}
		for range 10 { // 1 s of traffic, more than three idle timeouts
			if err := echo(busy, "ping"); err != nil {
				t.Fatalf("busy flow: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if _, err := idle.Read(make([]byte, 1)); !isReset(err) {
			t.Errorf("idle flow: %v, want a reset", err)
		}
		if got, err := exchange(busy); got != "xbye" || err != nil {
			t.Errorf("busy flow: %q %v, want xbye", got, err)
		}
	})

	t.Run("close", func(t *testing.T) {
		r := newRelay(time.Minute)
		defer testutil.Shutdown(t, r)
		c, err := n.dial(t, "192.0.2.2:80")
		if err != nil {
			t.Fatal(err)
		}
		if err := echo(c, "a"); err != nil {
			t.Fatal(err)
		}
		if !r.Close("w") {
			t.Fatal("Close: not open")
		}
		if _, err := c.Read(make([]byte, 1)); !isReset(err) {
			t.Errorf("read after Close: %v, want a reset (cut, not a clean end of stream)", err)
		}
		// (The goroutine path counts a flow out once its copies have returned.)
		eventually(func() bool { return r.Stats().Active == 0 })
		if r.Stats().Active != 0 {
			t.Errorf("stats %+v after Close, want none active", r.Stats())
		}
		// The port is free again: the pod can be opened anew.
		if _, err := r.Open(api.Workload{ID: "w", Netns: n.pod.Path, Mode: api.ModeTransparent}); err != nil {
			t.Fatal(err)
		}
		c, err = n.dial(t, "192.0.2.2:80")
		if err != nil {
			t.Fatal(err)
		}
		if got, err := exchange(c); got != "xbye" || err != nil {
			t.Errorf("after reopening: %q %v", got, err)
		}
	})

	t.Run("shutdown drains", func(t *testing.T) {
		r := newRelay(time.Minute)
		c, err := n.dial(t, "192.0.2.2:80")
		if err != nil {
			t.Fatal(err)
		}
		if err := echo(c, "a"); err != nil {
			t.Fatal(err)
		}
		held, err := n.dial(t, "192.0.2.2:82")
		if err != nil {
			t.Fatal(err)
		}
		// Both flows accepted (a connection still in the backlog is reset by the drain).
		eventually(func() bool { return r.Stats().Active == 2 })
		ctx, cancel := context.WithCancel(context.Background())
		shut := make(chan error, 1)
		go func() { shut <- r.Shutdown(ctx) }()
		time.Sleep(100 * time.Millisecond)
		if err := echo(c, "during drain"); err != nil {
			t.Errorf("established flow during the drain: %v", err)
		}
		if c2, err := n.dial(t, "192.0.2.2:80"); err == nil {
			if _, err := exchange(c2); err == nil {
				t.Error("a new flow was carried during the drain")
			}
		}
		if got, err := exchange(c); got != "xbye" || err != nil {
			t.Errorf("established flow's end: %q %v", got, err)
		}
		select {
		case err := <-shut:
			t.Fatalf("Shutdown returned %v with a flow still open", err)
		case <-time.After(100 * time.Millisecond):
		}
		cancel()
		if err := <-shut; !errors.Is(err, context.Canceled) {
			t.Errorf("Shutdown: %v, want context.Canceled", err)
		}
		if _, err := held.Read(make([]byte, 1)); err == nil {
			t.Error("held flow still open after Shutdown")
		}
	})
}

// fakeUpstreams serves, in the server netns, the upstream answers TestLoopUpstreams
// needs: a SOCKS5 server (no auth) that tunnels to the echo server on :1080, one that
// refuses every CONNECT on :1081, an HTTP proxy on :3128 that tunnels and sends tunnel
// bytes right behind its answer, and one on :3129 that never answers.
func fakeUpstreams(t *testing.T, n *loopNet) {
	serve := func(addr string, handle func(c net.Conn)) {
		ln, err := netns.Listen(n.srv.Path, "tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		testutil.Serve(t, ln, handle)
	}
	tunnel := func(c net.Conn) {
		e, err := netns.Dial(context.Background(), n.srv.Path, 0, "tcp", "192.0.2.2:80")
		if err != nil {
			return
		}
		defer e.Close()
		go func() { io.Copy(e, c); e.(*net.TCPConn).CloseWrite() }()
		io.Copy(c, e)
	}
	socks := func(reply byte) func(net.Conn) {
		return func(c net.Conn) {
			defer c.Close()
			var greet [3]byte
			var req [10]byte // an IPv4 CONNECT
			if _, err := io.ReadFull(c, greet[:]); err != nil {
				return
			}
			c.Write([]byte{5, 0})
			if _, err := io.ReadFull(c, req[:]); err != nil || req[3] != 1 {
				return
			}
			c.Write([]byte{5, reply, 0, 1, 0, 0, 0, 0, 0, 0})
			if reply == 0 {
				tunnel(c)
			}
		}
	}
	serve("192.0.2.2:1080", socks(0))
	serve("192.0.2.2:1081", socks(2))
	serve("192.0.2.2:3128", func(c net.Conn) {
		defer c.Close()
		b := make([]byte, 512)
		var head []byte
		for !strings.Contains(string(head), "\r\n\r\n") {
			n, err := c.Read(b)
			if err != nil {
				return
			}
			head = append(head, b[:n]...)
		}
		if !strings.HasPrefix(string(head), "CONNECT 192.0.2.2:") {
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			return
		}
		c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n>"))
		tunnel(c)
	})
	serve("192.0.2.2:3129", func(c net.Conn) { io.Copy(io.Discard, c) })
}

// TestLoopUpstreams carries flows to upstream exits on the event loop: the SOCKS5 and
// HTTP CONNECT handshakes (with the tunnel bytes an HTTP proxy sends with its answer
// delivered first), an upstream that refuses, one that is down, one that never answers,
// and one named by hostname (dialed on the goroutine path). Each failure resets the
// workload's connection and is recorded with the upstream's words.
func TestLoopUpstreams(t *testing.T) {
	n := newLoopNet(t)
	fakeUpstreams(t, n)
	pol, err := rules.Parse("t", []byte(`default: direct
rules:
  - port: "90"
    exit: socks
  - port: "91"
    exit: http
  - port: "92"
    exit: refusing
  - port: "93"
    exit: down
  - port: "94"
    exit: silent
  - port: "95"
    exit: byname
`), rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ups := map[string]upstream.Handshaker{}
	exits := map[string]relay.DialFunc{}
	var byName atomic.Int32
	for name, url := range map[string]string{
		"socks": "socks5://192.0.2.2:1080", "http": "http://192.0.2.2:3128", "refusing": "socks5://192.0.2.2:1081",
		"down": "socks5://192.0.2.2:1082", "silent": "http://192.0.2.2:3129", "byname": "socks5://localhost:1080",
	} {
		base := func(ctx context.Context, network, addr string) (net.Conn, error) {
			if name == "byname" {
				byName.Add(1)
				addr = "192.0.2.2:1080"
			}
			return relay.NetnsFrom(ctx).Dial(ctx, loopMark, network, addr)
		}
		d, err := upstream.New(url, 300*time.Millisecond, base)
		if err != nil {
			t.Fatal(err)
		}
		ups[name] = d.(upstream.Handshaker)
		exits[name] = func(ctx context.Context, w *api.Workload, dst relay.Dest) (net.Conn, error) {
			return d.Dial(ctx, upstream.Target{Host: dst.Host, Addr: dst.Addr, Port: dst.Port})
		}
	}
	aud, err := audit.New("", 0, 0, 16)
	if err != nil {
		t.Fatal(err)
	}
	r := relay.New(relay.Options{
		RedirectPort: loopRedirect, Mark: loopMark, Loops: testLoops(),
		Policy: func() relay.Decider { return pol },
		Exits:  exits, Upstreams: ups, Audit: aud,
	})
	defer testutil.Shutdown(t, r)
	if _, err := r.Open(api.Workload{ID: "w", Netns: n.pod.Path, Mode: api.ModeTransparent}); err != nil {
		t.Fatal(err)
	}
	// The upstreams share the destinations' address, which records never hold.
	for _, tc := range []struct {
		name, to, want, reason string // want "": reset
	}{
		{"socks5", "192.0.2.2:90", "xbye", ""},
		{"http connect, bytes with the answer", "192.0.2.2:91", ">xbye", ""},
		{"refused by the upstream", "192.0.2.2:92", "", "upstream socks5://<address>:1081: refused by upstream: SOCKS reply 0x02 (connection not allowed by ruleset)"},
		{"upstream down", "192.0.2.2:93", "", "upstream socks5://<address>:1082: connect: connection refused"},
		{"upstream silent", "192.0.2.2:94", "", "upstream http://<address>:3129: read CONNECT reply: timed out after 300ms"},
		{"upstream by name", "192.0.2.2:95", "xbye", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := n.dial(t, tc.to)
			var got string
			if err == nil {
				got, err = exchange(c)
			}
			if tc.want != "" && (got != tc.want || err != nil) {
				t.Fatalf("got %q, %v; want %q (audit %+v)", got, err, tc.want, aud.Recent(1))
			}
			if tc.want == "" && !isReset(err) {
				t.Fatalf("got %q, %v; want a reset", got, err)
			}
			var rec []audit.Record
			eventually(func() bool {
				rec = aud.Recent(1)
				return len(rec) == 1 && rec[0].At.After(time.Now().Add(-3*time.Second)) && rec[0].Rule > 0
			})
			if len(rec) != 1 || !strings.HasPrefix(rec[0].Reason, tc.reason) {
				t.Errorf("audit %+v, want reason %q", rec, tc.reason)
			}
		})
	}
	if byName.Load() != 1 {
		t.Errorf("%d dials of the upstream named by hostname, want 1 (on the goroutine path)", byName.Load())
	}
	if s := r.Stats(); s.ByExit["socks"] != 1 || s.ByExit["http"] != 1 || s.ByExit["down"] != 1 {
		t.Errorf("stats %+v, want one flow per exit", s)
	}
}

// TestLoopPipelinedConnect: an http upstream with pipeline gets the workload's first
// bytes (here a request the peek for its hostname waited for) in the same write as the
// CONNECT request on the event loop; without it (and on the goroutine path) they follow
// the answer. Either way the target gets them intact, once.
func TestLoopPipelinedConnect(t *testing.T) {
	n := newLoopNet(t)
	ahead := make(chan bool, 1) // per CONNECT: tunnel bytes came with the request
	ln, err := netns.Listen(n.srv.Path, "tcp", "192.0.2.2:3130")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Serve(t, ln, func(c net.Conn) {
		defer c.Close()
		b := make([]byte, 4096)
		var head []byte
		for !bytes.Contains(head, []byte("\r\n\r\n")) {
			k, err := c.Read(b)
			if err != nil {
				return
			}
			head = append(head, b[:k]...)
		}
		end := bytes.Index(head, []byte("\r\n\r\n")) + 4
		ahead <- end < len(head)
		e, err := netns.Dial(context.Background(), n.srv.Path, 0, "tcp", "192.0.2.2:80")
		if err != nil {
			return
		}
		defer e.Close()
		c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n"))
		e.Write(head[end:])
		go func() { io.Copy(e, c); e.(*net.TCPConn).CloseWrite() }()
		io.Copy(c, e)
	})
	pol, err := rules.Parse("t", []byte(`default: direct
rules:
  - domain: pipelined.example
    exit: pipelined
  - domain: plain.example
    exit: plain
`), rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ups, exits := pipelineExits(t, "http://192.0.2.2:3130", time.Second)
	r := relay.New(relay.Options{RedirectPort: loopRedirect, Mark: loopMark, Loops: testLoops(),
		SniffWait: time.Second, Policy: func() relay.Decider { return pol }, Exits: exits, Upstreams: ups})
	defer testutil.Shutdown(t, r)
	if _, err := r.Open(api.Workload{ID: "w", Netns: n.pod.Path, Mode: api.ModeTransparent}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		host      string
		wantAhead bool
	}{
		{"pipelined.example", testLoops() > 0},
		{"plain.example", false},
	} {
		t.Run(tc.host, func(t *testing.T) {
			c, err := n.dial(t, "192.0.2.2:80")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			req := "GET / HTTP/1.1\r\nHost: " + tc.host + "\r\n\r\n"
			if _, err := io.WriteString(c, req); err != nil {
				t.Fatal(err)
			}
			if err := c.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(c)
			if string(got) != req+"bye" || err != nil {
				t.Errorf("got %q, %v; want the request echoed intact", got, err)
			}
			select {
			case a := <-ahead:
				if a != tc.wantAhead {
					t.Errorf("request bytes with the CONNECT: %v, want %v", a, tc.wantAhead)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the upstream got no CONNECT")
			}
		})
	}
}

// TestLoopSniff decides flows by the hostname the client sends (HTTP Host here; the
// parsers have their own tests) with the peek on the event loop: nothing of the request
// is consumed, a denied name is reset, and a client that waits for the server first is
// decided without a name once the wait is over.
func TestLoopSniff(t *testing.T) {
	n := newLoopNet(t)
	pol, err := rules.Parse("t", []byte("default: direct\nrules:\n  - domain: blocked.example\n    action: deny\n"), rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	aud, err := audit.New("", 0, 0, 8)
	if err != nil {
		t.Fatal(err)
	}
	r := relay.New(relay.Options{RedirectPort: loopRedirect, Mark: loopMark, Loops: testLoops(),
		SniffWait: 100 * time.Millisecond, Policy: func() relay.Decider { return pol }, Audit: aud})
	defer testutil.Shutdown(t, r)
	if _, err := r.Open(api.Workload{ID: "w", Netns: n.pod.Path, Mode: api.ModeTransparent}); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		name      string
		pause     time.Duration // before the client's first byte
		send      string
		carried   bool
		dimension string
	}{
		{"allowed name", 0, "GET / HTTP/1.1\r\nHost: ok.example\r\n\r\n", true, "default"},
		{"denied name", 0, "GET / HTTP/1.1\r\nHost: blocked.example\r\n\r\n", false, "domain"},
		{"request in pieces", 0, "GET / HTTP/1.1\r\nHo", false, "domain"},
		{"server first", 300 * time.Millisecond, "GET / HTTP/1.1\r\nHost: blocked.example\r\n\r\n", true, "default"},
	} {

		t.Run(tc.name, func(t *testing.T) {
			c, err := n.dial(t, "192.0.2.2:80")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			time.Sleep(tc.pause)
			_, err = io.WriteString(c, tc.send)
			if err == nil && tc.name == "request in pieces" {
				time.Sleep(20 * time.Millisecond)
				_, err = io.WriteString(c, "st: blocked.example\r\n\r\n")
				tc.send += "st: blocked.example\r\n\r\n"
			}
			if err == nil {
				err = c.(*net.TCPConn).CloseWrite()
			}
			var got []byte
			if err == nil {
				got, err = io.ReadAll(c)
			}
			if tc.carried && (string(got) != tc.send+"bye" || err != nil) {
				t.Errorf("got %q, %v; want the request echoed intact", got, err)
			}
			if !tc.carried && !isReset(err) {
				t.Errorf("got %q, %v; want a reset", got, err)
			}
			var rec []audit.Record
			eventually(func() bool { rec = aud.Recent(8); return len(rec) > i })
			if len(rec) != i+1 || rec[i].Dimension != tc.dimension {
				t.Errorf("audit %+v, want a record with dimension %s", rec, tc.dimension)
			}
		})
	}
}

// TestLoopClosePeeking: a flow still waiting for its hostname when its pod closes is
// refused (a reset, and counted), as on the goroutine path, whose peek fails when the
// connection closes.
func TestLoopClosePeeking(t *testing.T) {
	n := newLoopNet(t)
	pol, err := rules.Parse("t", []byte("default: direct\nrules:\n  - domain: blocked.example\n    action: deny\n"), rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := relay.New(relay.Options{RedirectPort: loopRedirect, Mark: loopMark, Loops: testLoops(),
		SniffWait: time.Minute, Policy: func() relay.Decider { return pol }})
	defer testutil.Shutdown(t, r)
	if _, err := r.Open(api.Workload{ID: "w", Netns: n.pod.Path, Mode: api.ModeTransparent}); err != nil {
		t.Fatal(err)
	}
	c, err := n.dial(t, "192.0.2.2:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	eventually(func() bool { return r.Stats().Active == 1 })
	r.Close("w")
	if _, err := c.Read(make([]byte, 1)); !isReset(err) {
		t.Errorf("read: %v, want a reset", err)
	}
	eventually(func() bool { s := r.Stats(); return s.ByExit["refused"] == 1 && s.Active == 0 })
	if s := r.Stats(); s.ByExit["refused"] != 1 || s.Active != 0 {
		t.Errorf("stats %+v, want one refused flow and none active", s)
	}
}

// TestLoopCloseConnecting closes a pod (Close, or Shutdown past its context) while a
// flow's connect is under way (its SYNs are dropped): the decision was taken, so the
// audit has its record (one per decision) with the reason it was not carried, as on the
// goroutine path, whose dial goes on and is recorded.
func TestLoopCloseConnecting(t *testing.T) {
	n := newLoopNet(t)
	pol, err := rules.Parse("t", []byte("default: direct\n"), rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		close func(r *relay.Relay)
	}{
		{"close", func(r *relay.Relay) { r.Close("w") }},
		{"shutdown", func(r *relay.Relay) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			r.Shutdown(ctx)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			aud, err := audit.New("", 0, 0, 8)
			if err != nil {
				t.Fatal(err)
			}
			r := relay.New(relay.Options{RedirectPort: loopRedirect, Mark: loopMark, Loops: testLoops(),
				ConnectTimeout: 300 * time.Millisecond, Policy: func() relay.Decider { return pol }, Audit: aud})
			defer testutil.Shutdown(t, r)
			if _, err := r.Open(api.Workload{ID: "w", Netns: n.pod.Path, Mode: api.ModeTransparent}); err != nil {
				t.Fatal(err)
			}
			c, err := n.dial(t, "192.0.2.2:83")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			eventually(func() bool { return r.Stats().Active == 1 })
			tc.close(r)
			var recs []audit.Record
			eventually(func() bool { recs = aud.Recent(8); return len(recs) > 0 })
			if len(recs) != 1 || recs[0].Exit != "direct" || recs[0].Reason == "" {
				t.Errorf("audit %+v, want one record for exit direct with the reason it was not carried", recs)
			}
			eventually(func() bool { return r.Stats().Active == 0 })
			if s := r.Stats(); s.Active != 0 {
				t.Errorf("stats %+v, want none active", s)
			}
		})
	}
}

// TestLoopUpstreamConnectTimeout: the relay's ConnectTimeout bounds an upstream exit's
// connect and handshake too when it is the shorter bound, as the goroutine path's dial
// context does: a silent upstream with a long timeout of its own is given up after the
// relay's, the workload reset, and the record names the relay's bound, the one that
// expired.
func TestLoopUpstreamConnectTimeout(t *testing.T) {
	n := newLoopNet(t)
	fakeUpstreams(t, n)
	pol, err := rules.Parse("t", []byte("default: direct\nrules:\n  - port: \"94\"\n    exit: silent\n"), rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	base := func(ctx context.Context, network, addr string) (net.Conn, error) {
		return relay.NetnsFrom(ctx).Dial(ctx, loopMark, network, addr)
	}
	d, err := upstream.New("http://192.0.2.2:3129", time.Minute, base)
	if err != nil {
		t.Fatal(err)
	}
	aud, err := audit.New("", 0, 0, 8)
	if err != nil {
		t.Fatal(err)
	}
	r := relay.New(relay.Options{
		RedirectPort: loopRedirect, Mark: loopMark, Loops: testLoops(), ConnectTimeout: 300 * time.Millisecond,
		Policy: func() relay.Decider { return pol }, Audit: aud,
		Exits: map[string]relay.DialFunc{"silent": func(ctx context.Context, w *api.Workload, dst relay.Dest) (net.Conn, error) {
			return d.Dial(ctx, upstream.Target{Host: dst.Host, Addr: dst.Addr, Port: dst.Port})
		}},
		Upstreams: map[string]upstream.Handshaker{"silent": d.(upstream.Handshaker)},
	})
	defer func() { // not held for the upstream's minute when the test fails
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r.Shutdown(ctx)
	}()
	if _, err := r.Open(api.Workload{ID: "w", Netns: n.pod.Path, Mode: api.ModeTransparent}); err != nil {
		t.Fatal(err)
	}
	c, err := n.dial(t, "192.0.2.2:94") // the client gives up after 10 s (dial)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := exchange(c); !isReset(err) {
		t.Errorf("got %q, %v; want a reset once the relay's connect timeout is over", got, err)
	}
	var recs []audit.Record
	eventually(func() bool { recs = aud.Recent(8); return len(recs) > 0 })
	if want := "read CONNECT reply: timed out after 300ms"; len(recs) != 1 || !strings.Contains(recs[0].Reason, want) {
		t.Errorf("audit %+v, want one record whose reason says %q", recs, want)
	}
}

// scriptPolicy decides by the hostname as a script would (the name sends the flow to
// the named exit) and counts its runs.
type scriptPolicy struct{ runs atomic.Int32 }

func (p *scriptPolicy) NeedsHost() bool { return true }

func (p *scriptPolicy) Decide(f *rules.Flow) rules.Decision {
	p.runs.Add(1)
	if f.Host != "" {
		return rules.Decision{Exit: "named", Dimension: rules.DimScript}
	}
	return rules.Decision{Exit: rules.ExitDirect, Dimension: rules.DimScript}
}

// TestLoopHandoffDecidesOnce: a flow the loop decides and hands to the goroutine path
// for its exit is not decided again there: the script runs twice (the decision, and
// once without the name to learn that the name decided it), not three times.
func TestLoopHandoffDecidesOnce(t *testing.T) {
	n := newLoopNet(t)
	pol := &scriptPolicy{}
	r := relay.New(relay.Options{RedirectPort: loopRedirect, Mark: loopMark, Loops: testLoops(),
		Policy: func() relay.Decider { return pol },
		Exits: map[string]relay.DialFunc{"named": func(ctx context.Context, w *api.Workload, dst relay.Dest) (net.Conn, error) {
			return relay.NetnsFrom(ctx).DialAddrPort(ctx, loopMark, netip.MustParseAddrPort("192.0.2.2:80"))
		}}})
	defer testutil.Shutdown(t, r)
	if _, err := r.Open(api.Workload{ID: "w", Netns: n.pod.Path, Mode: api.ModeTransparent}); err != nil {
		t.Fatal(err)
	}
	c, err := n.dial(t, "192.0.2.2:80")
	if err != nil {
		t.Fatal(err)
	}
	req := "GET / HTTP/1.1\r\nHost: ok.example\r\n\r\n"
	io.WriteString(c, req)
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	c.Close()
	if string(got) != req+"bye" || err != nil {
		t.Fatalf("got %q, %v; want the request echoed through the named exit", got, err)
	}
	if runs := pol.runs.Load(); runs != 2 {
		t.Errorf("the policy ran %d times for one flow, want 2", runs)
	}
}

// TestLoopSizes: a direction's small transfers go through the loop's buffer and a read
// that fills it switches the direction to splice; the bytes arrive whole and in order on
// either side of that switch, both ways (the echo sends back what it got).
func TestLoopSizes(t *testing.T) {
	n := newLoopNet(t)
	relayDirect(t, n)
	for _, size := range []int{1, 4095, 4096, 4097, 3 * 4096, 64<<10 + 1, 4<<20 + 3} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			c, err := n.dial(t, "192.0.2.2:80")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			payload := make([]byte, size)
			for i := range payload {
				payload[i] = byte(i*7 + i>>8)
			}
			wrote := make(chan error, 1)
			go func() {
				// Small writes first, so the relay sees a few short reads before a long one.
				_, err := c.Write(payload[:min(size, 10)])
				if err == nil && size > 10 {
					_, err = c.Write(payload[10:])
				}
				if err == nil {
					err = c.(*net.TCPConn).CloseWrite()
				}
				wrote <- err
			}()
			got, err := io.ReadAll(c)
			if werr := <-wrote; werr != nil {
				t.Fatalf("write: %v", werr)
			}
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if want := string(payload) + "bye"; string(got) != want {
				t.Fatalf("got %d bytes, want %d: the relay changed the stream", len(got), len(want))
			}
		})
	}
}

// TestLoopReadiness: a loop direction reads its source only after an event said it had
// something, and stops at a read that does not fill its buffer; a hang-up it was told
// of while it could not read (waiting for its destination, or before the relaying
// started) must still be read to the end. Small exchanges whose last bytes and
// half-close arrive together, a server that speaks first (its bytes may be there when
// the connect completes), and a destination that takes nothing for a while as the
// workload sends 4 MiB and half-closes: every stream arrives whole and ends.
func TestLoopReadiness(t *testing.T) {
	n := newLoopNet(t)
	relayDirect(t, n)
	// exchange1 writes payload in pieces (the last one and the half-close back to back),
	// then reads to the end.
	exchange1 := func(to, first string, payload []byte, pieces int) error {
		c, err := n.dial(t, to)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second)) // a stalled stream fails soon
		if first != "" {
			got := make([]byte, len(first))
			if _, err := io.ReadFull(c, got); err != nil || string(got) != first {
				return fmt.Errorf("server's greeting: got %q, %v", got, err)
			}
		}
		for i := range pieces {
			if _, err := c.Write(payload[i*len(payload)/pieces : (i+1)*len(payload)/pieces]); err != nil {
				return err
			}
		}
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			return err
		}
		got, err := io.ReadAll(c)
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		if want := string(payload) + "bye"; string(got) != want {
			return fmt.Errorf("got %q, want %q", got, want)
		}
		return nil
	}
	for _, tc := range []struct {
		name, to, first string
	}{
		{"small exchanges", "192.0.2.2:80", ""},
		{"server speaks first", "192.0.2.2:88", "hello"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const conns, parallel = 240, 6
			var failed atomic.Pointer[error]
			sem := make(chan struct{}, parallel)
			for i := 0; i < conns && failed.Load() == nil; i++ {
				sem <- struct{}{}
				go func() {
					defer func() { <-sem }()
					payload := []byte(strings.Repeat(string(rune('a'+i%26)), 1+i*37%300))
					if err := exchange1(tc.to, tc.first, payload, 1+i%3); err != nil {
						failed.CompareAndSwap(nil, &err)
					}
				}()
			}
			for range parallel {
				sem <- struct{}{}
			}
			if err := failed.Load(); err != nil {
				t.Fatal(*err)
			}
		})
	}
	t.Run("destination slow to read", func(t *testing.T) {
		c, err := n.dial(t, "192.0.2.2:89")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		const size = 4 << 20
		if _, err := c.Write(make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c)
		if err != nil || string(got) != fmt.Sprint(size) {
			t.Fatalf("server counted %q (%v), want %d", got, err, size)
		}
	})
}

// relayDirect runs a relay (on a loop unless KL_TEST_NOLOOP) carrying n's pod to the
// direct exit until the test ends.
func relayDirect(t *testing.T, n *loopNet) {
	pol, err := rules.Parse("t", []byte("default: direct\n"), rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := relay.New(relay.Options{RedirectPort: loopRedirect, Mark: loopMark, Loops: testLoops(), Policy: func() relay.Decider { return pol }})
	t.Cleanup(func() { testutil.Shutdown(t, r) })
	if _, err := r.Open(api.Workload{ID: "w", Netns: n.pod.Path, Mode: api.ModeTransparent}); err != nil {
		t.Fatal(err)
	}
}

// TestLoopWorkloadResetDuringHandshake: a workload that resets its connection while the
// relay is still reaching an http upstream is recorded the same way whether the upstream
// takes early data (pipeline: the loop reads the workload during the handshake and
// meets the reset there) or not (the reset is met once the tunnel is open): the upstream
// was reached and answered, so the flow is recorded as carried and its dial counted as
// a success, not as an unreachable upstream; and the tunnel the upstream opened is cut
// with a reset, as the workload's connection was.
func TestLoopWorkloadResetDuringHandshake(t *testing.T) {
	n := newLoopNet(t)
	ends := make(chan error, 1) // how the tunnel the upstream opened ended
	ln, err := netns.Listen(n.srv.Path, "tcp", "192.0.2.2:3131")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Serve(t, ln, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 4096)
		var head []byte
		for !bytes.Contains(head, []byte("\r\n\r\n")) {
			k, err := c.Read(b)
			if err != nil {
				ends <- fmt.Errorf("before the answer: %w", err)
				return
			}
			head = append(head, b[:k]...)
		}
		c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n"))
		_, err := io.Copy(io.Discard, c)
		ends <- err
	})
	pol, err := rules.Parse("t", []byte("default: direct\nrules:\n  - port: \"96\"\n    exit: pipelined\n  - port: \"97\"\n    exit: plain\n"), rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ups, exits := pipelineExits(t, "http://192.0.2.2:3131", 5*time.Second)
	reg := prometheus.NewRegistry()
	met, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	aud, err := audit.New("", 0, 0, 8)
	if err != nil {
		t.Fatal(err)
	}
	r := relay.New(relay.Options{RedirectPort: loopRedirect, Mark: loopMark, Loops: testLoops(), ConnectTimeout: 5 * time.Second,
		Policy: func() relay.Decider { return pol }, Exits: exits, Upstreams: ups, Metrics: met, Audit: aud})
	defer testutil.Shutdown(t, r)
	if _, err := r.Open(api.Workload{ID: "w", Netns: n.pod.Path, Mode: api.ModeTransparent}); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct{ exit, to string }{{"pipelined", "192.0.2.2:96"}, {"plain", "192.0.2.2:97"}} {
		t.Run(tc.exit, func(t *testing.T) {
			// The upstream's first SYN is dropped: the relay's connect completes with
			// the SYN's retransmission a second later, long after the workload's reset.
			n.srv.Exec(t, "nft", "add chain inet kltest syn { type filter hook input priority -1; }; add rule inet kltest syn tcp dport 3131 drop")
			c, err := n.dial(t, tc.to)
			if err != nil {
				t.Fatal(err)
			}
			eventually(func() bool { return r.Stats().Active == 1 })
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
			time.Sleep(200 * time.Millisecond) // the reset is in before the connect ends
			n.srv.Exec(t, "nft", "delete chain inet kltest syn")
			var recs []audit.Record
			eventually(func() bool { recs = aud.Recent(8); return len(recs) > i })
			if len(recs) != i+1 || recs[i].Exit != tc.exit || recs[i].Reason != "" {
				t.Errorf("audit %+v, want a record for exit %s with no reason (carried)", recs, tc.exit)
			}
			if got := dialResults(t, reg, tc.exit); got["error"] != 0 || got["ok"] != 1 {
				t.Errorf("dials through %s: %v, want one that succeeded", tc.exit, got)
			}
			select {
			case err := <-ends:
				if !isReset(err) {
					t.Errorf("the tunnel ended with %v, want a reset", err)
				}
			case <-time.After(5 * time.Second):
				t.Error("the upstream opened no tunnel")
			}
			eventually(func() bool { return r.Stats().Active == 0 })
		})
	}
}

// dialResults counts kl_dial_duration_seconds observations of one exit by result.
func dialResults(t *testing.T, reg *prometheus.Registry, exit string) map[string]uint64 {
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "kl_dial_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var e, result string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "exit":
					e = l.GetValue()
				case "result":
					result = l.GetValue()
				}
			}
			if e == exit {
				got[result] += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return got
}

// pipelineExits makes two exits through the HTTP upstream at url, dialled from the pod's
// netns with the loop's mark: "pipelined" (pipeline: true) and "plain".
func pipelineExits(t *testing.T, url string, timeout time.Duration) (map[string]upstream.Handshaker, map[string]relay.DialFunc) {
	t.Helper()
	ups := map[string]upstream.Handshaker{}
	exits := map[string]relay.DialFunc{}
	for name, opts := range map[string][]upstream.Option{"pipelined": {upstream.Pipeline()}, "plain": nil} {
		base := func(ctx context.Context, network, addr string) (net.Conn, error) {
			return relay.NetnsFrom(ctx).Dial(ctx, loopMark, network, addr)
		}
		d, err := upstream.New(url, timeout, base, opts...)
		if err != nil {
			t.Fatal(err)
		}
		ups[name] = d.(upstream.Handshaker)
		exits[name] = func(ctx context.Context, w *api.Workload, dst relay.Dest) (net.Conn, error) {
			return d.Dial(ctx, upstream.Target{Host: dst.Host, Addr: dst.Addr, Port: dst.Port})
		}
	}
	return ups, exits
}
