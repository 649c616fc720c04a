package relay

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/tests/testutil"
)

// countingOrigin serves handle on loopback and counts every byte its connections read
// and wrote: what the relay relayed to it and back, to compare with what the relay
// counted.
type countingOrigin struct {
	addr      string
	in, out   atomic.Int64
	connected atomic.Int64
}

type countingConn struct {
	net.Conn
	o *countingOrigin
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.o.in.Add(int64(n))
	return n, err
}

func (c countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.o.out.Add(int64(n))
	return n, err
}

func newCountingOrigin(t *testing.T, handle func(c net.Conn, br *bufio.Reader)) *countingOrigin {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	o := &countingOrigin{addr: ln.Addr().String()}
	testutil.Serve(t, ln, func(c net.Conn) {
		o.connected.Add(1)
		cc := countingConn{c, o}
		handle(cc, bufio.NewReader(cc))
		io.Copy(io.Discard, cc) // to the relay's close: every byte it sent is counted
	})
	return o
}

// answerEach answers every request on a connection with body, after wait (if set)
// lets it.
func answerEach(body string, wait <-chan struct{}) func(net.Conn, *bufio.Reader) {
	return func(c net.Conn, br *bufio.Reader) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			if wait != nil {
				<-wait
			}
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		}
	}
}

// proxyHarness is a harness with one proxy-mode workload.
func proxyHarness(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t, fakeDecider{}, time.Minute, nil)
	w := workload("p")
	w.Mode = api.ModeProxy
	if _, err := h.r.Open(w); err != nil {
		t.Fatal(err)
	}
	return h
}

func dialProxy(t *testing.T, h *harness) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp4", h.addr(t, "/ns/p:15080"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// checkRelayedBytes waits for the relay's count of bytes through the direct exit to be
// what the origins read and wrote, each byte once.
func checkRelayedBytes(t *testing.T, h *harness, origins ...*countingOrigin) {
	t.Helper()
	var in, out int64
	var got map[string]float64
	ok := waitFor(func() bool {
		in, out = 0, 0
		for _, o := range origins {
			in, out = in+o.in.Load(), out+o.out.Load()
		}
		got = relayedBytes(h, "direct")
		return got["up"] == float64(in) && got["down"] == float64(out)
	})
	if !ok {
		t.Errorf("kl_relayed_bytes_total{exit=direct} = %v; the origins read %d bytes and wrote %d", got, in, out)
	}
}

// TestForwardAccounting: plain HTTP forwarding on one kept-alive client connection to
// A, B, then A again makes three origin connections, each a flow: decided, recorded and
// counted once, active while it is open, its bytes (requests, bodies and answers as they
// went to and came from the origin) counted once under its exit.
func TestForwardAccounting(t *testing.T) {
	body := strings.Repeat("x", 1000)
	hold := make(chan struct{})
	a := newCountingOrigin(t, answerEach(body, nil))
	b := newCountingOrigin(t, answerEach(body, hold))
	h := proxyHarness(t)
	c := dialProxy(t, h)
	br := bufio.NewReader(c)
	for i, o := range []*countingOrigin{a, b, a} {
		fmt.Fprintf(c, "POST http://%s/ HTTP/1.1\r\nHost: %s\r\nContent-Length: 5\r\n\r\nhello", o.addr, o.addr)
		if o == b {
			// The answer is held back: the exchange is a flow under way.
			if !waitFor(func() bool { return h.r.Stats().Active == 1 && metricSum(t, h.reg, "kl_active_flows", nil) == 1 }) {
				t.Errorf("request %d waiting for its answer: Stats().Active = %d, kl_active_flows = %v; want 1 and 1",
					i, h.r.Stats().Active, metricSum(t, h.reg, "kl_active_flows", nil))
			}
			close(hold)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := io.ReadAll(resp.Body); string(got) != body {
			t.Fatalf("request %d: body of %d bytes, want %d", i, len(got), len(body))
		}
	}
	c.Close()
	checkRelayedBytes(t, h, a, b)
	if !waitFor(func() bool { return h.r.Stats().Active == 0 }) || metricSum(t, h.reg, "kl_active_flows", nil) != 0 {
		t.Errorf("after the client left: Stats().Active = %d, kl_active_flows = %v; want 0", h.r.Stats().Active, metricSum(t, h.reg, "kl_active_flows", nil))
	}
	if n := a.connected.Load() + b.connected.Load(); n != 3 {
		t.Fatalf("%d origin connections, want 3", n)
	}
	if n := len(h.aud.Recent(10)); n != 3 {
		t.Errorf("%d audit records, want 3 (A, B, A again)", n)
	}
	if n := metricSum(t, h.reg, "kl_flows_total", nil); n != 3 {
		t.Errorf("kl_flows_total = %v, want 3", n)
	}
	if s := h.r.Stats(); s.Total != 3 || s.ByExit["direct"] != 3 {
		t.Errorf("Stats = %+v, want 3 flows, all direct", s)
	}
}

// TestTunnelEarlyBytesCounted: bytes a client sends right behind its CONNECT, and bytes
// either side sends right behind an upgrade request and its 101 answer, are relayed
// bytes of the tunnel like the rest, counted once.
func TestTunnelEarlyBytesCounted(t *testing.T) {
	t.Run("CONNECT", func(t *testing.T) {
		backend := echoServer(t)
		h := proxyHarness(t)
		c := dialProxy(t, h)
		early := strings.Repeat("e", 1000)
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n%s", backend, backend, early)
		br := bufio.NewReader(c)
		if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
			t.Fatalf("CONNECT: %v %v", resp, err)
		}
		if _, err := io.ReadFull(br, make([]byte, len(early))); err != nil { // echoed
			t.Fatal(err)
		}
		c.Write([]byte("hi"))
		c.(*net.TCPConn).CloseWrite()
		if got, _ := io.ReadAll(br); string(got) != "hibye" {
			t.Fatalf("tunnel carried %q after the early bytes, want %q", got, "hibye")
		}
		want := map[string]float64{"up": float64(len(early) + 2), "down": float64(len(early) + 5)}
		var got map[string]float64
		if !waitFor(func() bool { got = relayedBytes(h, "direct"); return fmt.Sprint(got) == fmt.Sprint(want) }) {
			t.Errorf("kl_relayed_bytes_total{exit=direct} = %v, want %v (the early bytes, hi, their echo and bye)", got, want)
		}
	})
	t.Run("upgrade", func(t *testing.T) {
		o := newCountingOrigin(t, func(c net.Conn, br *bufio.Reader) {
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\nearly-down")
			io.Copy(c, br) // echo, from the client's early bytes on
			c.(countingConn).Conn.(*net.TCPConn).CloseWrite()
		})
		h := proxyHarness(t)
		c := dialProxy(t, h)
		fmt.Fprintf(c, "GET http://%s/ HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\nearly-up", o.addr, o.addr)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("upgrade: %v %v", resp, err)
		}
		c.(*net.TCPConn).CloseWrite()
		if got, _ := io.ReadAll(br); string(got) != "early-downearly-up" {
			t.Fatalf("tunnel carried %q, want %q", got, "early-downearly-up")
		}
		checkRelayedBytes(t, h, o)
	})
}

// TestShutdownKeptAliveClient: an HTTP proxy client that keeps its connection after an
// answer (HTTP/1.1's default) carries no flow between requests: Shutdown closes it, and
// its kept origin connection, as the drain begins, rather than waiting the drain out.
// One in the middle of an exchange gets its answer first.
func TestShutdownKeptAliveClient(t *testing.T) {
	const drain = 6 * time.Second
	for _, midway := range []bool{false, true} {
		t.Run(fmt.Sprintf("midway=%v", midway), func(t *testing.T) {
			hold := make(chan struct{})
			if !midway {
				close(hold)
			}
			o := newCountingOrigin(t, answerEach("hello", hold))
			h := proxyHarness(t)
			c := dialProxy(t, h)
			fmt.Fprintf(c, "GET http://%s/ HTTP/1.1\r\nHost: %s\r\n\r\n", o.addr, o.addr)
			br := bufio.NewReader(c)
			shut := make(chan error, 1)
			start := time.Now()
			shutdown := func() {
				ctx, cancel := context.WithTimeout(context.Background(), drain)
				defer cancel()
				shut <- h.r.Shutdown(ctx)
			}
			if midway {
				// The request is at the origin, which holds its answer back.
				if !waitFor(func() bool { return o.in.Load() > 0 }) {
					t.Fatal("the request did not reach the origin")
				}
				go shutdown()
				if !waitFor(func() bool { return !h.r.Serving("p") }) {
					t.Fatal("Shutdown did not begin")
				}
				close(hold)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := io.ReadAll(resp.Body); string(got) != "hello" {
				t.Fatalf("answer %q, want hello", got)
			}
			if !midway {
				start = time.Now()
				go shutdown()
			}
			if _, err := br.ReadByte(); err != io.EOF {
				t.Errorf("kept-alive client connection after the drain began: %v, want it closed (EOF)", err)
			}
			if err := <-shut; err != nil || time.Since(start) > drain/2 {
				t.Errorf("Shutdown = %v after %v, want nil well within the %v drain", err, time.Since(start).Round(time.Millisecond), drain)
			}
		})
	}
}
