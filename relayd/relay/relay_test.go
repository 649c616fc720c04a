package relay

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/relayd/metrics"
	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/tests/testutil"
)

// fakeDecider answers by destination port.
type fakeDecider map[uint16]string

func (f fakeDecider) Decide(fl *rules.Flow) rules.Decision {
	if e, ok := f[fl.Dst.Port()]; ok {
		return rules.Decision{Exit: e, Rule: 1, Priority: rules.PriorityPort, Dimension: rules.DimPort}
	}
	return rules.Decision{Exit: rules.ExitDirect, Priority: rules.PriorityDefault}
}

// harness is a relay whose "pod netns" is the test's own: listeners on loopback, the
// original destination given by the test.
type harness struct {
	r    *Relay
	dst  atomic.Pointer[netip.AddrPort] // what origDst answers
	aud  *audit.Log
	reg  *prometheus.Registry
	mu   sync.Mutex
	lns  map[string]net.Listener
	dial int
}

func newHarness(t *testing.T, dec fakeDecider, idle time.Duration, exits map[string]DialFunc) *harness {
	t.Helper()
	return newHarnessWith(t, dec, idle, exits, nil)
}

// newHarnessWith lets a test adjust the options before the relay starts.
func newHarnessWith(t *testing.T, dec fakeDecider, idle time.Duration, exits map[string]DialFunc, mod func(*Options)) *harness {
	t.Helper()
	aud, err := audit.New("", 0, 0, 16)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	met, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{lns: map[string]net.Listener{}, aud: aud, reg: reg}
	h.setDst(netip.AddrPort{})
	o := Options{
		IdleTimeout: idle,
		Policy:      func() Decider { return dec },
		Exits:       exits,
		Audit:       h.aud,
		Metrics:     met,
		listen: func(nsPath, network, addr string) (net.Listener, error) {
			ln, err := net.Listen("tcp4", "127.0.0.1:0")
			if err == nil {
				h.mu.Lock()
				// Keyed by netns and the port asked for ("/ns/a:15080"); the redirect
				// listener also under the bare netns path.
				_, port, _ := net.SplitHostPort(addr)
				h.lns[nsPath+":"+port] = ln
				if _, ok := h.lns[nsPath]; !ok && network == "tcp" {
					h.lns[nsPath] = ln
				}
				h.mu.Unlock()
			}
			return ln, err
		},
		dial: func(ctx context.Context, nsPath string, mark uint32, network, addr string) (net.Conn, error) {
			h.mu.Lock()
			h.dial++
			h.mu.Unlock()
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
		origDst: func(*net.TCPConn) (netip.AddrPort, error) { return *h.dst.Load(), nil },
	}
	if mod != nil {
		mod(&o)
	}
	h.r = New(o)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		h.r.Shutdown(ctx)
	})
	return h
}

func (h *harness) setDst(a netip.AddrPort) { h.dst.Store(&a) }

func (h *harness) dials() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dial
}

func (h *harness) addr(t *testing.T, ns string) string {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	ln, ok := h.lns[ns]
	if !ok {
		t.Fatalf("no listener for %s", ns)
	}
	return ln.Addr().String()
}

// echoServer echoes, and after the client half-closes it writes "bye" and closes.
func echoServer(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Serve(t, ln, func(c net.Conn) {
		io.Copy(c, c)
		c.Write([]byte("bye"))
	})
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

func workload(id string) api.Workload {
	return api.Workload{ID: id, Netns: "/ns/" + id, Mode: api.ModeTransparent, Labels: map[string]string{"app": "x"}}
}

func TestDirectHalfClose(t *testing.T) {
	h := newHarness(t, fakeDecider{}, time.Minute, nil)
	h.setDst(echoServer(t))
	if _, err := h.r.Open(workload("a")); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp4", h.addr(t, "/ns/a"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("hello"))
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if string(got) != "hellobye" {
		t.Errorf("got %q, want %q (echo, then the server's reply after our half-close)", got, "hellobye")
	}
	s := h.r.Stats()
	if s.Total != 1 || s.ByExit["direct"] != 1 {
		t.Errorf("Stats = %+v", s)
	}
	// The flow's metrics are recorded when its copy ends, just after the client sees EOF.
	want := map[string]float64{"up": 5, "down": 8}
	deadline := time.Now().Add(2 * time.Second)
	for {
		got := map[string]float64{}
		mfs, _ := h.reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() != "kl_relayed_bytes_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "direction" {
						got[l.GetValue()] = m.GetCounter().GetValue()
					}
				}
			}
		}
		if reflect.DeepEqual(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("relayed bytes = %v, want %v", got, want)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// expectReset connects and expects a reset, either already at connect (on loopback the
// RST can beat Go's post-connect checks) or at the first read.
func expectReset(t *testing.T, addr string) {
	t.Helper()
	c, err := net.Dial("tcp4", addr)
	if err == nil {
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("connect+read = %v, want a connection reset", err)
	}
}

func TestRefusals(t *testing.T) {
	backend := echoServer(t)
	tests := []struct {
		name string
		dst  netip.AddrPort
		exit string
	}{
		{name: "deny", dst: netip.AddrPortFrom(backend.Addr(), 1), exit: "deny"},
		{name: "exit not built", dst: netip.AddrPortFrom(backend.Addr(), 2), exit: "refused"},
		{name: "named exit missing", dst: netip.AddrPortFrom(backend.Addr(), 3), exit: "refused"},
		{name: "dial fails", dst: netip.AddrPortFrom(backend.Addr(), 4), exit: "proxy"},
	}
	exits := map[string]DialFunc{"proxy": func(context.Context, *api.Workload, Dest) (net.Conn, error) {
		return nil, errors.New("upstream down")
	}}
	dec := fakeDecider{1: "deny", 2: "client", 3: "egress-b", 4: "proxy"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, dec, time.Minute, exits)
			h.setDst(tt.dst)
			if _, err := h.r.Open(workload("a")); err != nil {
				t.Fatal(err)
			}
			expectReset(t, h.addr(t, "/ns/a"))
			if s := h.r.Stats(); s.ByExit[tt.exit] != 1 {
				t.Errorf("Stats = %+v, want one %s", s, tt.exit)
			}
			recs := h.aud.Recent(10)
			if len(recs) != 1 || recs[0].Exit != dec[tt.dst.Port()] || recs[0].Rule != 1 || recs[0].Path != "relay" {
				t.Fatalf("audit records = %+v, want one for exit %s", recs, dec[tt.dst.Port()])
			}
			if wantReason := tt.exit != "deny"; (recs[0].Reason != "") != wantReason {
				t.Errorf("audit reason = %q", recs[0].Reason)
			}
			if h.dials() != 0 {
				t.Errorf("%d direct dials for a refused flow", h.dials())
			}
		})
	}
}

func TestNotRedirectedIsRefused(t *testing.T) {
	h := newHarness(t, fakeDecider{}, time.Minute, nil)
	if _, err := h.r.Open(workload("a")); err != nil {
		t.Fatal(err)
	}
	h.setDst(netip.MustParseAddrPort(h.addr(t, "/ns/a")))
	expectReset(t, h.addr(t, "/ns/a"))
	if h.dials() != 0 {
		t.Error("the relay dialled itself")
	}
}

func TestIdleTimeout(t *testing.T) {
	h := newHarness(t, fakeDecider{}, 300*time.Millisecond, nil)
	h.setDst(echoServer(t))
	h.r.Open(workload("a"))
	c, err := net.Dial("tcp4", h.addr(t, "/ns/a"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Keep it busy past the timeout: it must stay open.
	buf := make([]byte, 4)
	for i := 0; i < 6; i++ {
		if _, err := c.Write([]byte("ping")); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatalf("active flow closed at round %d: %v", i, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	_, err = c.Read(buf)
	if err == nil || errors.Is(err, syscall.ETIMEDOUT) || time.Since(start) > 2*time.Second {
		t.Fatalf("idle flow: read = %v after %v, want closed within ~450ms", err, time.Since(start))
	}
}

func TestCloseEndsFlowsAndReopen(t *testing.T) {
	h := newHarness(t, fakeDecider{}, time.Minute, nil)
	h.setDst(echoServer(t))
	base := runtime.NumGoroutine()
	if _, err := h.r.Open(workload("a")); err != nil {
		t.Fatal(err)
	}
	// Refresh with new labels keeps the listener.
	w := workload("a")
	w.Labels = map[string]string{"app": "y"}
	h.r.Open(w)
	addr := h.addr(t, "/ns/a")
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("x"))
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if !h.r.Close("a") || h.r.Close("a") {
		t.Error("Close should report true once, then false")
	}
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("flow survived Close of its workload")
	}
	if _, err := net.Dial("tcp4", addr); err == nil {
		t.Error("listener survived Close")
	}
	if h.r.Len() != 0 {
		t.Errorf("Len = %d", h.r.Len())
	}
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base {
		t.Errorf("%d goroutines after Close, %d before Open", n, base)
	}
}

func TestShutdown(t *testing.T) {
	h := newHarness(t, fakeDecider{}, time.Minute, nil)
	w := workload("e")
	w.Mode = api.ModeEnv
	if _, err := h.r.Open(w); err == nil {
		t.Error("Open(env mode) succeeded")
	}
	h.r.Shutdown(context.Background())
	if _, err := h.r.Open(workload("a")); !errors.Is(err, ErrClosed) {
		t.Errorf("Open after Shutdown = %v", err)
	}
}

func TestProxyMode(t *testing.T) {
	backend := echoServer(t)
	h := newHarness(t, fakeDecider{1: "deny"}, time.Minute, nil)
	w := workload("p")
	w.Mode = api.ModeProxy
	ls, err := h.r.Open(w)
	if err != nil {
		t.Fatal(err)
	}
	if ls.HTTP != api.DefaultHTTPPort || ls.SOCKS != api.DefaultSOCKSPort || ls.Redirect != 0 {
		t.Errorf("Listeners = %+v", ls)
	}
	connect := func(target string) (net.Conn, string) {
		t.Helper()
		c, err := net.Dial("tcp4", h.addr(t, "/ns/p:15080"))
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			t.Fatalf("CONNECT %s: %v", target, err)
		}
		return c, line
	}
	c, status := connect(backend.String())
	defer c.Close()
	if !strings.Contains(status, " 200") {
		t.Fatalf("CONNECT to an allowed destination: %q", status)
	}
	// The open tunnel is an active flow.
	if !waitFor(func() bool { return h.r.Stats().Active == 1 }) {
		t.Errorf("active flows with a tunnel open = %d, want 1", h.r.Stats().Active)
	}
	// Drain the rest of the response head, then echo.
	c.Write([]byte("hi"))
	c.(*net.TCPConn).CloseWrite()
	got, _ := io.ReadAll(c)
	if !strings.HasSuffix(string(got), "hibye") {
		t.Errorf("tunnel carried %q", got)
	}
	// Its bytes are counted under its exit when it ends.
	if !waitFor(func() bool {
		b := relayedBytes(h, "direct")
		return b["up"] == 2 && b["down"] == 5 && h.r.Stats().Active == 0
	}) {
		t.Errorf("after the tunnel: bytes %v, active %d; want up 2, down 5, active 0", relayedBytes(h, "direct"), h.r.Stats().Active)
	}
	d, status := connect(netip.AddrPortFrom(backend.Addr(), 1).String())
	defer d.Close()
	if !strings.Contains(status, " 403") {
		t.Errorf("CONNECT to a denied destination: %q, want 403", status)
	}
	if s := h.r.Stats(); s.ByExit["direct"] != 1 || s.ByExit["deny"] != 1 {
		t.Errorf("Stats = %+v", s)
	}
	// Closing the workload ends its listeners.
	h.r.Close("p")
	if _, err := net.Dial("tcp4", h.addr(t, "/ns/p:15081")); err == nil {
		t.Error("SOCKS listener survived Close")
	}
}

func TestBulkCopy(t *testing.T) {
	h := newHarness(t, fakeDecider{}, time.Minute, nil)
	h.setDst(echoServer(t))
	h.r.Open(workload("a"))
	c, err := net.Dial("tcp4", h.addr(t, "/ns/a"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	go func() {
		c.Write(data)
		c.(*net.TCPConn).CloseWrite()
	}()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, append(data, "bye"...)) {
		t.Errorf("got %d bytes, want %d", len(got), len(data)+3)
	}
}

// hostDecider denies one hostname and needs hosts.
type hostDecider struct{ deny string }

func (h hostDecider) NeedsHost() bool { return true }

func (h hostDecider) Decide(f *rules.Flow) rules.Decision {
	if f.Host == h.deny {
		return rules.Decision{Exit: rules.ExitDeny, Rule: 1, Priority: rules.PriorityDomain, Dimension: rules.DimDomain}
	}
	return rules.Decision{Exit: rules.ExitDirect, Priority: rules.PriorityDefault}
}

func TestSniffedHost(t *testing.T) {
	backend := echoServer(t)
	sniffing := func(skip []uint16) *harness {
		h := newHarnessWith(t, nil, time.Minute, nil, func(o *Options) {
			o.Policy = func() Decider { return hostDecider{deny: "blocked.example"} }
			o.SniffWait = 300 * time.Millisecond
			o.SniffSkipPorts = skip
		})
		h.setDst(backend)
		if _, err := h.r.Open(workload("a")); err != nil {
			t.Fatal(err)
		}
		return h
	}
	req := func(h *harness, host string) (string, error) {
		c, err := net.Dial("tcp4", h.addr(t, "/ns/a"))
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host)
		c.(*net.TCPConn).CloseWrite()
		b, err := io.ReadAll(c)
		return string(b), err
	}
	h := sniffing(nil)
	got, err := req(h, "ok.example")
	if err != nil || !strings.HasPrefix(got, "GET / HTTP/1.1\r\nHost: ok.example") {
		t.Errorf("allowed host: %q %v (the peek must consume nothing)", got, err)
	}
	if _, err := req(h, "blocked.example"); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("denied host: %v, want reset", err)
	}
	// A client that says nothing first (server-first protocol) waits at most SniffWait.
	c, err := net.Dial("tcp4", h.addr(t, "/ns/a"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	time.Sleep(500 * time.Millisecond)
	c.Write([]byte("late"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "late" {
		t.Errorf("silent client: %q %v", buf, err)
	}
	// Skipped ports are not peeked: no host is known, so the deny rule cannot match.
	h2 := sniffing([]uint16{backend.Port()})
	if got, err := req(h2, "blocked.example"); err != nil || got == "" {
		t.Errorf("skipped port: %q %v, want carried", got, err)
	}
}

// waitFor polls cond for up to 2s.
func waitFor(cond func() bool) bool {
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// relayedBytes reads kl_relayed_bytes_total of one exit by direction.
func relayedBytes(h *harness, exit string) map[string]float64 {
	got := map[string]float64{}
	mfs, _ := h.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "kl_relayed_bytes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var e, dir string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "exit":
					e = l.GetValue()
				case "direction":
					dir = l.GetValue()
				}
			}
			if e == exit {
				got[dir] = m.GetCounter().GetValue()
			}
		}
	}
	return got
}

// metricSum adds up the series of metric name (counters, gauges, or a histogram's
// observation count) whose labels include want.
func metricSum(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if !hasLabels(labels, want) {
				continue
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// TestProxyDialErrors: an exit's dial error reaches the proxy client as the right answer
// (the chain survives redaction) while neither the reply nor the audit record names the
// destination.
func TestProxyDialErrors(t *testing.T) {
	dst := netip.MustParseAddrPort("203.0.113.7:443")
	for _, tc := range []struct {
		name      string
		err       error
		http      string
		socksCode byte
	}{
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(dst), Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, " 502", 0x05},
		{"timeout", fmt.Errorf("connect to upstream: %w", &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(dst), Err: os.ErrDeadlineExceeded}), " 504", 0x04},
		{"host unreachable", &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(dst), Err: os.NewSyscallError("connect", syscall.EHOSTUNREACH)}, " 502", 0x04},
	} {
		t.Run(tc.name, func(t *testing.T) {
			exits := map[string]DialFunc{"proxy": func(context.Context, *api.Workload, Dest) (net.Conn, error) { return nil, tc.err }}
			h := newHarness(t, fakeDecider{7: "proxy"}, time.Minute, exits)
			w := workload("p")
			w.Mode = api.ModeProxy
			if _, err := h.r.Open(w); err != nil {
				t.Fatal(err)
			}
			target := netip.AddrPortFrom(dst.Addr(), 7).String()
			c, err := net.Dial("tcp4", h.addr(t, "/ns/p:15080"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
			resp, _ := io.ReadAll(c)
			if !strings.HasPrefix(string(resp), "HTTP/1.1"+tc.http) || strings.Contains(string(resp), "203.0.113") {
				t.Errorf("HTTP answer %q, want%s without the destination", resp, tc.http)
			}
			s, err := net.Dial("tcp4", h.addr(t, "/ns/p:15081"))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			s.SetDeadline(time.Now().Add(5 * time.Second))
			a4 := dst.Addr().As4()
			s.Write([]byte{5, 1, 0})
			s.Write(append([]byte{5, 1, 0, 1}, a4[0], a4[1], a4[2], a4[3], 0, 7))
			b := make([]byte, 4)
			if _, err := io.ReadFull(s, b[:2]); err != nil || b[1] != 0 {
				t.Fatalf("SOCKS method reply %v %v", b[:2], err)
			}
			if _, err := io.ReadFull(s, b[:2]); err != nil || b[1] != tc.socksCode {
				t.Errorf("SOCKS reply code %#x (%v), want %#x", b[1], err, tc.socksCode)
			}
			recs := h.aud.Recent(10)
			if len(recs) != 2 {
				t.Errorf("%d audit records, want one per request", len(recs))
			}
			for _, r := range recs {
				if r.Reason == "" || strings.Contains(r.Reason, "203.0.113") {
					t.Errorf("audit reason %q: want the cause without the destination", r.Reason)
				}
			}
		})
	}
}

// TestLabelRulesFollowReregistration decides with a real policy whose label rules are
// found through the workload's label keys (listed once per registration), and checks
// that a re-registration with other labels changes the next flow's decision.
func TestLabelRulesFollowReregistration(t *testing.T) {
	pol, err := rules.Parse("labels", []byte("default: direct\nrules:\n"+
		"  - label: team=red\n    action: deny\n"+
		"  - label: tier=db\n    action: deny\n"+
		"  - label: quarantine\n    action: deny\n"), rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarnessWith(t, nil, time.Minute, nil, func(o *Options) { o.Policy = func() Decider { return pol } })
	h.setDst(echoServer(t))
	echoes := func() bool {
		t.Helper()
		c, err := net.Dial("tcp4", h.addr(t, "/ns/a"))
		if err != nil {
			return false // reset as it was accepted: denied
		}
		defer c.Close()
		c.Write([]byte("hi"))
		c.(*net.TCPConn).CloseWrite()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, _ := io.ReadAll(c)
		return string(got) == "hibye"
	}
	for _, tc := range []struct {
		labels map[string]string
		echo   bool
	}{
		{map[string]string{"team": "red", "app": "x"}, false},
		{map[string]string{"team": "blue", "app": "x"}, true},
		{map[string]string{"app": "x", "quarantine": ""}, false},
		{nil, true},
	} {
		w := workload("a")
		w.Labels = tc.labels
		if _, err := h.r.Open(w); err != nil {
			t.Fatal(err)
		}
		if got := echoes(); got != tc.echo {
			t.Errorf("labels %v: flow carried = %v, want %v", tc.labels, got, tc.echo)
		}
	}
}

// A script's failure reason can quote what the script was given: the url, the host, the
// address dnsResolve answers. The relay's audit records must not carry them (SPEC §5).
func TestScriptReasonKeepsDestinationOut(t *testing.T) {
	backend := echoServer(t)
	pol, err := rules.Parse("t", []byte("script: |\n"+
		"  function FindProxyForURL(url, host) { throw 'no route for ' + url + ' (' + host.toUpperCase() + ' at ' + dnsResolve(host) + ')'; }\n"),
		rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarnessWith(t, nil, time.Minute, nil, func(o *Options) {
		o.Policy = func() Decider { return pol }
	})
	h.setDst(backend)
	if _, err := h.r.Open(workload("a")); err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp4", h.addr(t, "/ns/a"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: Secret.Example\r\n\r\n")
	if _, err := io.ReadAll(c); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("flow of a failing script: %v, want a reset", err)
	}
	if !waitFor(func() bool { return len(h.aud.Recent(10)) == 1 }) {
		t.Fatalf("audit records %+v, want one", h.aud.Recent(10))
	}
	rec := h.aud.Recent(1)[0]
	if rec.Exit != rules.ExitDeny || !strings.Contains(rec.Reason, "script threw: no route for") {
		t.Fatalf("record %+v, want a deny with the script's reason", rec)
	}
	for _, secret := range []string{"secret.example", "SECRET.EXAMPLE", backend.Addr().String()} {
		if strings.Contains(strings.ToLower(rec.Reason), strings.ToLower(secret)) {
			t.Errorf("audit reason %q names the destination %q", rec.Reason, secret)
		}
	}
}

func TestWithoutDestination(t *testing.T) {
	f := &rules.Flow{Host: "a.example.", Dst: netip.MustParseAddrPort("192.0.2.1:443")}
	for _, tt := range []struct{ in, want string }{
		{"", ""},
		{"no route for https://A.Example:443/ at 192.0.2.1", "no route for https://<host>:443/ at <address>"},
		{"x.a.example, a.examples, 192.0.2.10, ba.example", "x.<host>, a.examples, 192.0.2.10, ba.example"},
		{"exit proxy is not available in this relay", "exit proxy is not available in this relay"},
	} {
		if got := withoutDestination(tt.in, f); got != tt.want {
			t.Errorf("withoutDestination(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	one := &rules.Flow{Host: "a"}
	if got, want := withoutDestination("a script that failed at a", one), "<host> script that failed at <host>"; got != want {
		t.Errorf("withoutDestination with host %q = %q, want %q", one.Host, got, want)
	}
}

// TestCutWhileDialing closes a workload while its flow's exit is still dialing: the
// workload's connection is cut (reset), and when the dial then succeeds the decision's
// record says the flow was not carried, as the event loop records a flow it cut before
// its exit answered; transparent and proxy mode alike.
func TestCutWhileDialing(t *testing.T) {
	backend := echoServer(t)
	for _, proxyMode := range []bool{false, true} {
		t.Run(fmt.Sprintf("proxy mode %v", proxyMode), func(t *testing.T) {
			dialing, release := make(chan struct{}), make(chan struct{})
			exits := map[string]DialFunc{"slow": func(ctx context.Context, _ *api.Workload, _ Dest) (net.Conn, error) {
				close(dialing)
				<-release
				return net.Dial("tcp4", backend.String()) // the exit answers after all
			}}
			h := newHarness(t, fakeDecider{9: "slow"}, time.Minute, exits)
			dst := netip.AddrPortFrom(backend.Addr(), 9)
			h.setDst(dst)
			w := workload("a")
			if proxyMode {
				w.Mode = api.ModeProxy
			}
			if _, err := h.r.Open(w); err != nil {
				t.Fatal(err)
			}
			var addr string
			if proxyMode {
				addr = h.addr(t, "/ns/a:15080")
			} else {
				addr = h.addr(t, "/ns/a")
			}
			c, err := net.Dial("tcp4", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if proxyMode {
				fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", dst, dst)
			}
			select {
			case <-dialing:
			case <-time.After(5 * time.Second):
				t.Fatal("the exit was never dialed")
			}
			h.r.Close("a")
			close(release)
			if got, err := io.ReadAll(c); !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("workload read %q, %v; want a reset", got, err)
			}
			var recs []audit.Record
			waitFor(func() bool { recs = h.aud.Recent(10); return len(recs) > 0 })
			if len(recs) != 1 || recs[0].Exit != "slow" || recs[0].Reason == "" {
				t.Errorf("audit records %+v, want one for exit slow with the reason it was not carried", recs)
			}
			waitFor(func() bool { return h.r.Stats().Active == 0 })
			if s := h.r.Stats(); s.Active != 0 {
				t.Errorf("stats %+v, want none active", s)
			}
		})
	}
}

// TestShutdownProxyMode: Shutdown drains proxy-mode flows as it drains transparent ones.
// It waits for an open CONNECT tunnel until its context ends, then cuts it (a reset, not
// a clean end of stream); it returns as soon as a tunnel ends, or a forwarded request
// has its whole answer; a request that comes during the drain is refused.
func TestShutdownProxyMode(t *testing.T) {
	backend := echoServer(t)
	web, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	answering := make(chan struct{}) // closed as the origin starts its answer
	testutil.Serve(t, web, func(c net.Conn) {
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		time.Sleep(300 * time.Millisecond) // the answer comes during the drain
		close(answering)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nslow%s", req.URL.Path[1:])
	})
	open := func(t *testing.T) (*harness, string) {
		h := newHarness(t, fakeDecider{}, time.Minute, nil)
		w := workload("p")
		w.Mode = api.ModeProxy
		if _, err := h.r.Open(w); err != nil {
			t.Fatal(err)
		}
		return h, h.addr(t, "/ns/p:15080")
	}
	dial := func(t *testing.T, addr string) net.Conn {
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second))
		return c
	}
	tunnel := func(t *testing.T, addr string) net.Conn {
		c := dial(t, addr)
		if err := testutil.ConnectThrough(c, backend.String()); err != nil {
			t.Fatal(err)
		}
		if got, err := echo(c, "a"); err != nil || got != "a" {
			t.Fatalf("tunnel echoed %q, %v", got, err)
		}
		return c
	}
	// shutdown runs Shutdown with a context of d; it sends Shutdown's error, and took
	// says how long it ran, early whether it returned before the origin's answer began.
	var took time.Duration
	var early bool
	shutdown := func(h *harness, d time.Duration) chan error {
		shut := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			start := time.Now()
			err := h.r.Shutdown(ctx)
			took = time.Since(start)
			select {
			case <-answering:
				early = false
			default:
				early = true
			}
			shut <- err
		}()
		return shut
	}

	t.Run("tunnel cut when the drain is over", func(t *testing.T) {
		h, addr := open(t)
		c := tunnel(t, addr)
		idle := dial(t, addr) // accepted before the drain, its request comes during it
		shut := shutdown(h, 2*time.Second)
		time.Sleep(200 * time.Millisecond)
		if got, err := echo(c, "during the drain"); err != nil || got != "during the drain" {
			t.Errorf("tunnel during the drain echoed %q, %v", got, err)
		}
		if err := testutil.ConnectThrough(idle, backend.String()); err == nil {
			t.Error("a CONNECT during the drain was carried")
		}
		select {
		case err := <-shut:
			t.Fatalf("Shutdown returned %v after %v with a tunnel open", err, took)
		case <-time.After(500 * time.Millisecond):
		}
		if err := <-shut; !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Shutdown = %v, want its context's deadline", err)
		}
		if took < 1900*time.Millisecond {
			t.Errorf("Shutdown returned after %v, before its 2s context ended", took)
		}
		if got, err := io.ReadAll(c); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("tunnel after Shutdown: read %q, %v; want a reset", got, err)
		}
	})

	t.Run("tunnel ends during the drain", func(t *testing.T) {
		h, addr := open(t)
		c := tunnel(t, addr)
		shut := shutdown(h, 5*time.Second)
		time.Sleep(200 * time.Millisecond)
		c.(*net.TCPConn).CloseWrite()
		if got, err := io.ReadAll(c); string(got) != "bye" || err != nil {
			t.Errorf("tunnel's end: %q, %v; want bye", got, err)
		}
		select {
		case err := <-shut:
			if err != nil {
				t.Errorf("Shutdown = %v, want nil once the tunnel ended", err)
			}
		case <-time.After(3 * time.Second):
			t.Error("Shutdown still waiting after the only tunnel ended")
		}
	})

	t.Run("forwarded request answered during the drain", func(t *testing.T) {
		h, addr := open(t)
		c := dial(t, addr)
		fmt.Fprintf(c, "GET http://%s/x HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", web.Addr(), web.Addr())
		time.Sleep(100 * time.Millisecond) // the request is with the origin
		shut := shutdown(h, 5*time.Second)
		resp, err := io.ReadAll(c)
		if err != nil || !strings.HasSuffix(string(resp), "\r\n\r\nslowx") {
			t.Errorf("forwarded answer %q, %v; want it whole", resp, err)
		}
		select {
		case err := <-shut:
			if err != nil {
				t.Errorf("Shutdown = %v, want nil once the answer was delivered", err)
			}
			if early {
				t.Errorf("Shutdown returned after %v, before the origin answered", took)
			}
		case <-time.After(3 * time.Second):
			t.Error("Shutdown still waiting after the forwarded request was answered")
		}
	})
}

// echo writes s to c and reads as many bytes back.
func echo(c net.Conn, s string) (string, error) {
	if _, err := io.WriteString(c, s); err != nil {
		return "", err
	}
	b := make([]byte, len(s))
	_, err := io.ReadFull(c, b)
	return string(b), err
}
