package relay_test

import (
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

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/relayd/relay"
	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/tests/testutil"
)

// loopNet is a pod netns with kl's capture and a server netns behind a veth: 192.0.2.2
// echoes on :80 (then writes "bye" after the client's half-close), holds connections
// silently on :82 and drops SYNs to :83; nothing listens on :81.
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

func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
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
	loops := 1
	if os.Getenv("KL_TEST_NOLOOP") != "" {
		loops = -1
	}
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
			defer r.Shutdown(context.Background())
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
			for deadline := time.Now().Add(5 * time.Second); len(recs) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				recs = aud.Recent(8)
			}
			if len(recs) != 1 || recs[0].Exit != tc.exit || !strings.Contains(recs[0].Reason, tc.reason) {
				t.Errorf("audit %+v, want one record for exit %s with reason %q", recs, tc.exit, tc.reason)
			}
			if h := named.Load() - before; h != tc.handoffs {
				t.Errorf("%d dials through the named exit, want %d", h, tc.handoffs)
			}
			for deadline := time.Now().Add(5 * time.Second); r.Stats().Active != 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			}
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
		r := relay.New(relay.Options{RedirectPort: loopRedirect, Mark: loopMark, Loops: 1, IdleTimeout: idle,
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
		defer r.Shutdown(context.Background())
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
		defer r.Shutdown(context.Background())
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
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Error("flow still open after Close")
		}
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
