package relay

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/upstream"
	"github.com/kl-egress/kl/tests/testutil"
)

// The flows below go to this destination through the "proxy" exit, an HTTP CONNECT
// upstream that plays the destination itself: nothing dials the address.
var bannerDst = netip.MustParseAddrPort("192.0.2.1:7")

// connectUpstream starts an HTTP CONNECT upstream that answers with a 200 followed, in
// the same write, by banner (the start of a server-first protocol), then serves the
// tunnel with serve. It returns an exit that dials through it and checks that the
// banner came with the answer, so the exit hands the relay a connection holding it.
func connectUpstream(t *testing.T, banner string, serve func(net.Conn)) DialFunc {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Serve(t, ln, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if l == "\r\n" {
				break
			}
		}
		if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"+banner); err != nil {
			return
		}
		serve(c)
	})
	d, err := upstream.New("http://"+ln.Addr().String(), 5*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	return func(ctx context.Context, _ *api.Workload, dst Dest) (net.Conn, error) {
		c, err := d.Dial(ctx, upstream.Target{Host: dst.Host, Addr: dst.Addr, Port: dst.Port})
		if _, plain := c.(*net.TCPConn); plain {
			t.Error("the banner did not arrive with the CONNECT answer: the upstream connection holds nothing")
		}
		return c, err
	}
}

// bannerFlow opens a flow to bannerDst through h, a relay whose "proxy" exit is a
// connectUpstream: transparent, or through the HTTP proxy (the relay's own CONNECT
// answer is read, and nothing after it). It returns the client's connection.
func bannerFlow(t *testing.T, h *harness, proxyMode bool) *net.TCPConn {
	t.Helper()
	w, addr := workload("a"), "/ns/a"
	if proxyMode {
		w.Mode, addr = api.ModeProxy, "/ns/a:15080"
	}
	h.setDst(bannerDst)
	if _, err := h.r.Open(w); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp4", h.addr(t, addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if proxyMode {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if err := testutil.ConnectThrough(c, bannerDst.String()); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Time{})
	}
	return c.(*net.TCPConn)
}

// TestBufferedUpstreamHalfClosedIdle: a flow through an HTTP CONNECT upstream that sent
// bytes with its answer, whose client half-closes and then reads nothing while the
// upstream keeps sending, ends after the idle timeout like any other flow (it used to be
// copied through the upstream connection's own WriteTo, with no write deadline, and
// hung for good).
func TestBufferedUpstreamHalfClosedIdle(t *testing.T) {
	const idle = 300 * time.Millisecond
	for _, mode := range []struct {
		name  string
		proxy bool
	}{{"transparent", false}, {"proxy", true}} {
		t.Run(mode.name, func(t *testing.T) {
			ended := make(chan struct{})
			exit := connectUpstream(t, "SSH-2.0-banner\r\n", func(c net.Conn) {
				defer close(ended)
				serveStream(c, 0) // until a write fails: the relay closed the flow
			})
			h := newHarness(t, fakeDecider{bannerDst.Port(): "proxy"}, idle, map[string]DialFunc{"proxy": exit})
			c := bannerFlow(t, h, mode.proxy)
			// A small receive buffer: the relay's writes block soon.
			if err := c.SetReadBuffer(32 << 10); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if _, err := c.Write([]byte("GET")); err != nil {
				t.Fatal(err)
			}
			if err := c.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			select {
			case <-ended:
			case <-time.After(5 * time.Second):
				t.Fatalf("flow still carried %v after the client half-closed and stopped reading (idle timeout %v)", time.Since(start), idle)
			}
			if !waitFor(func() bool { return h.r.Stats().Active == 0 }) {
				t.Errorf("active flows = %d after the flow ended, want 0", h.r.Stats().Active)
			}
			if b := relayedBytes(h, "proxy"); b["up"] != 3 {
				t.Errorf("relayed bytes %v, want up 3", b)
			}
			// The client's side is closed too: what it had not read, then the end.
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.Copy(io.Discard, c); errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("client connection still open after the flow ended")
			}
		})
	}
}

// TestBufferedUpstreamBannerFirst: the bytes an HTTP CONNECT upstream sent with its
// answer reach the client first, followed in order by the rest of the stream, and count
// in the flow's bytes.
func TestBufferedUpstreamBannerFirst(t *testing.T) {
	const banner = "SSH-2.0-banner\r\n"
	for _, mode := range []struct {
		name  string
		proxy bool
	}{{"transparent", false}, {"proxy", true}} {
		t.Run(mode.name, func(t *testing.T) {
			exit := connectUpstream(t, banner, func(c net.Conn) {
				// More server-first bytes at once, which the relay reads from the
				// connection while the banner is still to be delivered; then an echo.
				io.WriteString(c, "more\r\n")
				io.Copy(c, c)
				c.Write([]byte("bye"))
			})
			h := newHarness(t, fakeDecider{bannerDst.Port(): "proxy"}, time.Minute, map[string]DialFunc{"proxy": exit})
			c := bannerFlow(t, h, mode.proxy)
			c.SetDeadline(time.Now().Add(5 * time.Second))
			first := make([]byte, len(banner+"more\r\n"))
			if _, err := io.ReadFull(c, first); err != nil || string(first) != banner+"more\r\n" {
				t.Fatalf("client read %q (%v) first, want %q", first, err, banner+"more\r\n")
			}
			c.Write([]byte("hello"))
			c.CloseWrite()
			rest, err := io.ReadAll(c)
			if err != nil || string(rest) != "hellobye" {
				t.Errorf("then %q (%v), want %q", rest, err, "hellobye")
			}
			want := map[string]float64{"up": 5, "down": float64(len(first) + len("hellobye"))}
			if !waitFor(func() bool {
				b := relayedBytes(h, "proxy")
				return b["up"] == want["up"] && b["down"] == want["down"] && h.r.Stats().Active == 0
			}) {
				t.Errorf("relayed bytes %v, active %d; want %v, active 0", relayedBytes(h, "proxy"), h.r.Stats().Active, want)
			}
		})
	}
}
