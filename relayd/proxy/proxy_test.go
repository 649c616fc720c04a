package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kl-egress/kl/relayd/upstream"
	"github.com/kl-egress/kl/tests/testutil"
)

// world is a test's set of loopback origins reachable by name, and the dial function
// the proxies are given: it maps names to origins, refuses "denied.test" like a policy
// would, and records every dial.
type world struct {
	mu    sync.Mutex
	names map[string]string // host name -> 127.0.0.1:port
	dials []string
	logs  *testutil.Buffer
}

func newWorld() *world { return &world{names: map[string]string{}, logs: &testutil.Buffer{}} }

func (w *world) dial(ctx context.Context, t upstream.Target) (net.Conn, error) {
	w.mu.Lock()
	w.dials = append(w.dials, t.String())
	addr, ok := w.names[t.Host]
	w.mu.Unlock()
	switch {
	case t.Host == "denied.test":
		return nil, fmt.Errorf("relay: %w", &Denied{Rule: 3, Dimension: "domain", Exit: "deny", Note: "no ads"})
	case t.Host == "plain-denied.test":
		return nil, ErrDenied
	case t.Host == "slow.test":
		<-ctx.Done()
		return nil, ctx.Err()
	case t.Host != "" && !ok:
		return nil, &net.DNSError{Err: "no such host", Name: t.Host, IsNotFound: true}
	case t.Host == "":
		addr = t.Addr.String()
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

func (w *world) dialed() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.dials...)
}

func (w *world) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(w.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// serve starts both proxies and returns their addresses. s dials through w unless it
// has a Dial of its own.
func (w *world) serve(t *testing.T, s *Server) (httpAddr, socksAddr string) {
	t.Helper()
	if s == nil {
		s = &Server{}
	}
	if s.Dial == nil {
		s.Dial = w.dial
	}
	s.Log = w.logger()
	ctx, cancel := context.WithCancel(context.Background())
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	go func() { errs <- s.ServeHTTP(ctx, hl) }()
	go func() { errs <- s.ServeSOCKS5(ctx, sl) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-errs; err != nil {
				t.Errorf("serve returned %v after cancel", err)
			}
		}
		if t.Failed() {
			t.Logf("proxy logs:\n%s", w.logs.String())
		}
	})
	return hl.Addr().String(), sl.Addr().String()
}

// echoOrigin greets, then echoes; it is the destination of tunnels.
func (w *world) echoOrigin(t *testing.T, name string) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Serve(t, ln, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.WriteString(c, "hello\n")
		_, _ = io.Copy(c, c)
	})
	w.mu.Lock()
	w.names[name] = ln.Addr().String()
	w.mu.Unlock()
	return ln.Addr().(*net.TCPAddr).Port
}

// seen is what an HTTP origin reports about the request it got.
type seen struct {
	Origin     string
	Method     string
	RequestURI string
	Host       string
	Proto      string
	Header     http.Header
	Body       string
}

// httpOrigin answers every request with a JSON description of it.
func (w *world) httpOrigin(t *testing.T, name string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/upgrade" {
			if r.Header.Get("Upgrade") != "echo" {
				http.Error(rw, "want Upgrade: echo", 400)
				return
			}
			c, brw, err := http.NewResponseController(rw).Hijack()
			if err != nil {
				return
			}
			defer func() { _ = c.Close() }()
			_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\nupgraded\n")
			_, _ = io.Copy(c, brw)
			return
		}
		body, _ := io.ReadAll(r.Body)
		_ = json.NewEncoder(rw).Encode(seen{Origin: name, Method: r.Method, RequestURI: r.RequestURI, Host: r.Host,
			Proto: r.Proto, Header: r.Header, Body: string(body)})
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	w.mu.Lock()
	w.names[name] = ln.Addr().String()
	w.mu.Unlock()
}

func dialProxy(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c, bufio.NewReader(c)
}

func TestHTTPConnect(t *testing.T) {
	w := newWorld()
	echoPort := w.echoOrigin(t, "echo.test")
	httpAddr, _ := w.serve(t, nil)
	tests := []struct {
		name       string
		req        string
		wantStatus int
		wantBody   string // substring of the error body
		wantDial   string
	}{
		{name: "name", req: "CONNECT Echo.Test:443 HTTP/1.1\r\nHost: echo.test:443\r\n\r\n", wantStatus: 200, wantDial: "echo.test:443"},
		{name: "ipv4", req: fmt.Sprintf("CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n", echoPort), wantStatus: 200, wantDial: fmt.Sprintf("127.0.0.1:%d", echoPort)},
		{name: "denied with rule", req: "CONNECT denied.test:443 HTTP/1.1\r\n\r\n", wantStatus: 403, wantBody: `denied by policy: rule 3 (domain), exit deny, "no ads"`},
		{name: "denied plain", req: "CONNECT plain-denied.test:443 HTTP/1.1\r\n\r\n", wantStatus: 403, wantBody: "kl: denied by policy\n"},
		{name: "unknown host", req: "CONNECT nowhere.test:443 HTTP/1.1\r\n\r\n", wantStatus: 502, wantBody: "host unreachable"},
		{name: "refused", req: "CONNECT 127.0.0.1:1 HTTP/1.1\r\n\r\n", wantStatus: 502, wantBody: "connection refused"},
		{name: "no port", req: "CONNECT echo.test HTTP/1.1\r\n\r\n", wantStatus: 400, wantBody: "bad CONNECT target"},
		{name: "port zero", req: "CONNECT echo.test:0 HTTP/1.1\r\n\r\n", wantStatus: 400, wantBody: "bad port"},
		{name: "bad host", req: "CONNECT ech%20o:443 HTTP/1.1\r\n\r\n", wantStatus: 400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, br := dialProxy(t, httpAddr)
			// The first tunnel bytes ride in the same write as the CONNECT.
			if _, err := io.WriteString(c, tt.req+"ping"); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			if tt.wantStatus != 200 {
				body, _ := io.ReadAll(resp.Body)
				if !strings.Contains(string(body), tt.wantBody) {
					t.Fatalf("body %q, want it to contain %q", body, tt.wantBody)
				}
				return
			}
			got := make([]byte, len("hello\nping"))
			if _, err := io.ReadFull(br, got); err != nil || string(got) != "hello\nping" {
				t.Fatalf("tunnel read %q, %v", got, err)
			}
			if d := w.dialed(); d[len(d)-1] != tt.wantDial {
				t.Fatalf("dialed %v, want %s last", d, tt.wantDial)
			}
		})
	}
}

func TestHTTPBadRequests(t *testing.T) {
	w := newWorld()
	httpAddr, _ := w.serve(t, &Server{MaxHeaderBytes: 4096, HandshakeTimeout: 300 * time.Millisecond})
	tests := []struct {
		name       string
		req        string
		wantStatus int
		wantWhy    string // in the body and the log
	}{
		{"garbage", "\x16\x03\x01\x00\x05hello\r\n\r\n", 400, "malformed request"},
		{"origin form", "GET / HTTP/1.1\r\nHost: x.test\r\n\r\n", 400, "not a proxy request"},
		{"https absolute", "GET https://x.test/ HTTP/1.1\r\nHost: x.test\r\n\r\n", 501, `scheme "https" is not supported`},
		{"ftp absolute", "GET ftp://x.test/ HTTP/1.1\r\n\r\n", 501, `scheme "ftp"`},
		{"credentials in uri", "GET http://u:p@x.test/ HTTP/1.1\r\n\r\n", 400, "credentials"},
		{"huge header", "GET http://x.test/ HTTP/1.1\r\nX: " + strings.Repeat("a", 5000) + "\r\n\r\n", 431, "request header over 4096 bytes"},
		{"bad header line", "GET http://x.test/ HTTP/1.1\r\nno colon here\r\n\r\n", 400, "malformed"},
		{"http2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, "HTTP/2.0 is not supported"},
		{"bad version", "GET http://x.test/ HTTP/9\r\n\r\n", 400, "malformed"},
		{"unsupported expect", "PUT http://x.test/ HTTP/1.1\r\nExpect: teapot\r\nContent-Length: 0\r\n\r\n", 417, "unsupported Expect"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name == "unsupported expect" {
				w.httpOrigin(t, "x.test")
			}
			c, br := dialProxy(t, httpAddr)
			if _, err := io.WriteString(c, tt.req); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.wantStatus || !strings.Contains(string(body), tt.wantWhy) {
				t.Fatalf("got %d %q, want %d containing %q", resp.StatusCode, body, tt.wantStatus, tt.wantWhy)
			}
			if !resp.Close {
				t.Fatalf("error response without Connection: close")
			}
			logged := strings.ReplaceAll(tt.wantWhy, `"`, `\"`) // as slog's text handler quotes it
			if tt.wantStatus != 417 && !strings.Contains(w.logs.String(), logged) {
				t.Fatalf("log does not say %q:\n%s", tt.wantWhy, w.logs.String())
			}
		})
	}
	if strings.Contains(w.logs.String(), "x.test") {
		t.Fatalf("logs name a destination:\n%s", w.logs.String())
	}
	t.Run("handshake timeout", func(t *testing.T) {
		c, _ := dialProxy(t, httpAddr)
		start := time.Now()
		_, _ = io.WriteString(c, "GET http://x.test/ HTTP/1.1\r\n") // and never finish
		_, err := io.ReadAll(c)
		if took := time.Since(start); err != nil || took > 3*time.Second {
			t.Fatalf("slow client: closed after %v (err %v), want about 300ms", took, err)
		}
	})
}

func readSeen(t *testing.T, resp *http.Response) seen {
	t.Helper()
	defer func() { _ = resp.Body.Close() }()
	var s seen
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatalf("origin answer: %v", err)
	}
	return s
}

func TestHTTPForward(t *testing.T) {
	w := newWorld()
	w.httpOrigin(t, "a.test")
	w.httpOrigin(t, "b.test")
	httpAddr, _ := w.serve(t, nil)
	c, br := dialProxy(t, httpAddr)

	send := func(req string) *http.Response {
		t.Helper()
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("read response to %q: %v", strings.SplitN(req, "\r\n", 2)[0], err)
		}
		return resp
	}
	// Hop-by-hop and Proxy-* headers go, the rest stays; origin-form on the wire.
	resp := send("GET http://a.test/path?q=1 HTTP/1.1\r\nHost: a.test\r\nProxy-Authorization: Basic eDp5\r\n" +
		"Proxy-Connection: keep-alive\r\nConnection: keep-alive, X-Hop\r\nX-Hop: gone\r\nX-Keep: kept\r\nTE: trailers\r\n\r\n")
	s := readSeen(t, resp)
	if s.Origin != "a.test" || s.RequestURI != "/path?q=1" || s.Host != "a.test" || s.Method != "GET" {
		t.Fatalf("origin saw %+v", s)
	}
	for _, h := range []string{"Proxy-Authorization", "Proxy-Connection", "X-Hop", "Te", "Connection"} {
		if v := s.Header.Get(h); v != "" {
			t.Errorf("origin got hop-by-hop header %s: %q", h, v)
		}
	}
	if s.Header.Get("X-Keep") != "kept" || s.Header.Get("User-Agent") != "" {
		t.Errorf("origin headers %v: want X-Keep kept and no User-Agent added", s.Header)
	}
	if resp.Close {
		t.Fatal("proxy closed a keep-alive connection")
	}
	// Same host again: the origin connection is reused. A body arrives intact.
	s = readSeen(t, send("POST http://a.test/p HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\n\r\nhello"))
	if s.Body != "hello" || s.Method != "POST" {
		t.Fatalf("origin saw %+v", s)
	}
	// Another host on the same client connection: a new dial to b.test.
	s = readSeen(t, send("PUT http://b.test:80/x HTTP/1.1\r\nHost: b.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"))
	if s.Origin != "b.test" || s.Body != "abcde" || s.Host != "b.test:80" { // the URI's authority wins (RFC 9112 §3.2.2)
		t.Fatalf("origin saw %+v", s)
	}
	// Back to a.test, with Expect: 100-continue answered by the proxy.
	if _, err := io.WriteString(c, "POST http://a.test/e HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	cont, err := http.ReadResponse(br, nil)
	if err != nil || cont.StatusCode != 100 {
		t.Fatalf("want 100 Continue, got %v, %v", cont, err)
	}
	_, _ = io.WriteString(c, "xyz")
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s = readSeen(t, resp); s.Body != "xyz" || s.Header.Get("Expect") != "" {
		t.Fatalf("origin saw %+v", s)
	}
	// HEAD: no body, connection stays usable.
	resp = send("HEAD http://a.test/h HTTP/1.1\r\nHost: a.test\r\n\r\n")
	if resp.StatusCode != 200 || resp.Close {
		t.Fatalf("HEAD: %d close=%v", resp.StatusCode, resp.Close)
	}
	// Connection: close from the client ends it after the answer.
	resp = send("GET http://b.test/last HTTP/1.1\r\nHost: b.test\r\nConnection: close\r\n\r\n")
	_ = readSeen(t, resp)
	if !resp.Close {
		t.Fatal("want Connection: close on the last answer")
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("connection still open after Connection: close (%v)", err)
	}
	want := []string{"a.test:80", "b.test:80", "a.test:80", "b.test:80"}
	if got := w.dialed(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("dials %v, want %v (reuse per host, re-dial on a host change)", got, want)
	}
}

func TestHTTPForwardDenied(t *testing.T) {
	w := newWorld()
	httpAddr, _ := w.serve(t, nil)
	c, br := dialProxy(t, httpAddr)
	_, _ = io.WriteString(c, "GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 403 || !strings.Contains(string(body), "rule 3") {
		t.Fatalf("got %d %q, want 403 naming rule 3", resp.StatusCode, body)
	}
}

func TestHTTPUpgrade(t *testing.T) {
	w := newWorld()
	w.httpOrigin(t, "ws.test")
	httpAddr, _ := w.serve(t, nil)
	c, br := dialProxy(t, httpAddr)
	_, _ = io.WriteString(c, "GET http://ws.test/upgrade HTTP/1.1\r\nHost: ws.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	_, _ = io.WriteString(c, "raw bytes")
	got := make([]byte, len("upgraded\nraw bytes"))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != "upgraded\nraw bytes" {
		t.Fatalf("after upgrade read %q, %v", got, err)
	}
}

func TestHTTPWithGoClient(t *testing.T) {
	w := newWorld()
	w.httpOrigin(t, "go.test")
	httpAddr, _ := w.serve(t, nil)
	cl := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(mustURL(t, "http://"+httpAddr))}, Timeout: 10 * time.Second}
	for i := range 3 {
		resp, err := cl.Get(fmt.Sprintf("http://go.test/n%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if s := readSeen(t, resp); s.RequestURI != fmt.Sprintf("/n%d", i) {
			t.Fatalf("origin saw %+v", s)
		}
	}
	if n := len(w.dialed()); n != 1 {
		t.Fatalf("%d dials for 3 keep-alive requests to one host, want 1", n)
	}
}

func TestSOCKS5(t *testing.T) {
	w := newWorld()
	echoPort := w.echoOrigin(t, "echo.test")
	ln6, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Fatalf("IPv6 loopback: %v", err)
	}
	t.Cleanup(func() { _ = ln6.Close() })
	go func() {
		for {
			c, err := ln6.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "hello\n")
			go func() { _, _ = io.Copy(c, c); _ = c.Close() }()
		}
	}()
	port6 := uint16(ln6.Addr().(*net.TCPAddr).Port)
	_, socksAddr := w.serve(t, nil)
	// kl's own upstream client is a strict RFC 1928 client.
	d, err := upstream.New("socks5://"+socksAddr, 5*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		target   upstream.Target
		wantDial string
		wantErr  upstream.SOCKSReply
	}{
		{name: "domain", target: upstream.Target{Host: "Echo.Test", Port: 7}, wantDial: "echo.test:7"},
		{name: "ipv4", target: upstream.Target{Addr: netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", echoPort))}, wantDial: fmt.Sprintf("127.0.0.1:%d", echoPort)},
		{name: "ipv6", target: upstream.Target{Addr: netip.AddrPortFrom(netip.IPv6Loopback(), port6)}, wantDial: fmt.Sprintf("[::1]:%d", port6)},
		{name: "denied", target: upstream.Target{Host: "denied.test", Port: 443}, wantErr: upstream.ReplyNotAllowed},
		{name: "refused", target: upstream.Target{Addr: netip.MustParseAddrPort("127.0.0.1:1")}, wantErr: upstream.ReplyConnectionRefused},
		{name: "unknown name", target: upstream.Target{Host: "nowhere.test", Port: 443}, wantErr: upstream.ReplyHostUnreachable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := d.Dial(context.Background(), tt.target)
			if tt.wantErr != 0 {
				var re *upstream.ReplyError
				if !errors.As(err, &re) || re.Code != tt.wantErr {
					t.Fatalf("Dial = %v, want reply %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = c.Close() }()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			_, _ = io.WriteString(c, "ping")
			got := make([]byte, 10)
			if _, err := io.ReadFull(c, got); err != nil || string(got) != "hello\nping" {
				t.Fatalf("tunnel read %q, %v", got, err)
			}
			if dl := w.dialed(); dl[len(dl)-1] != tt.wantDial {
				t.Fatalf("dialed %v, want %s last", dl, tt.wantDial)
			}
		})
	}
}

func TestSOCKS5BadRequests(t *testing.T) {
	w := newWorld()
	w.echoOrigin(t, "echo.test")
	_, socksAddr := w.serve(t, &Server{HandshakeTimeout: 300 * time.Millisecond})
	tests := []struct {
		name    string
		send    []byte
		want    []byte // the whole answer before the proxy closes
		wantLog string
	}{
		{"bind", []byte{5, 1, 0, 5, 2, 0, 1, 127, 0, 0, 1, 0, 80}, []byte{5, 0, 5, 7, 0, 1, 0, 0, 0, 0, 0, 0}, "command 0x02 is not supported"},
		{"udp associate", []byte{5, 1, 0, 5, 3, 0, 1, 0, 0, 0, 0, 0, 0}, []byte{5, 0, 5, 7, 0, 1, 0, 0, 0, 0, 0, 0}, "command 0x03"},
		{"bad atyp", []byte{5, 1, 0, 5, 1, 0, 9, 1, 2}, []byte{5, 0, 5, 8, 0, 1, 0, 0, 0, 0, 0, 0}, "unknown address type 0x09"},
		{"auth only", []byte{5, 1, 2}, []byte{5, 0xff}, "does not offer the no-auth method"},
		{"no methods", []byte{5, 0}, []byte{5, 0xff}, "no auth methods"},
		{"socks4", []byte{4, 1, 0, 80, 127, 0, 0, 1, 0}, nil, "SOCKS4 is not supported"},
		{"http to socks port", []byte("GET / HTTP/1.1\r\n\r\n"), nil, "not a SOCKS5 greeting (version byte 0x47)"},
		{"empty domain", []byte{5, 1, 0, 5, 1, 0, 3, 0, 0, 80}, []byte{5, 0, 5, 4, 0, 1, 0, 0, 0, 0, 0, 0}, "empty hostname"},
		{"bad domain", append(append([]byte{5, 1, 0, 5, 1, 0, 3, 3}, "a b"...), 0, 80), []byte{5, 0, 5, 4, 0, 1, 0, 0, 0, 0, 0, 0}, "hostname has byte 0x20"},
		{"domain with a port", append(append([]byte{5, 1, 0, 5, 1, 0, 3, 11}, "echo.test:7"...), 0, 80), []byte{5, 0, 5, 4, 0, 1, 0, 0, 0, 0, 0, 0}, "hostname has ':'"},
		{"domain with two trailing dots", append(append([]byte{5, 1, 0, 5, 1, 0, 3, 11}, "echo.test.."...), 0, 80), []byte{5, 0, 5, 4, 0, 1, 0, 0, 0, 0, 0, 0}, "hostname has an empty label"},
		{"port zero", append(append([]byte{5, 1, 0, 5, 1, 0, 3, 9}, "echo.test"...), 0, 0), []byte{5, 0, 5, 4, 0, 1, 0, 0, 0, 0, 0, 0}, "destination port 0"},
		{"truncated", []byte{5, 1, 0, 5, 1, 0, 1, 127}, []byte{5, 0}, "timed out"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := dialProxy(t, socksAddr)
			if _, err := c.Write(tt.send); err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(c)
			if !bytes.Equal(got, tt.want) {
				t.Fatalf("answer % x, want % x", got, tt.want)
			}
			if !strings.Contains(w.logs.String(), tt.wantLog) {
				t.Fatalf("log does not say %q:\n%s", tt.wantLog, w.logs.String())
			}
		})
	}
}

// TestSOCKS5SlowDial: a dial that takes longer than the handshake timeout but succeeds
// gets its success reply and a working tunnel (the handshake deadline does not span the
// dial, which has its own timeout).
func TestSOCKS5SlowDial(t *testing.T) {
	w := newWorld()
	port := w.echoOrigin(t, "echo.test")
	_, socksAddr := w.serve(t, &Server{HandshakeTimeout: 200 * time.Millisecond,
		Dial: func(ctx context.Context, tg upstream.Target) (net.Conn, error) {
			time.Sleep(500 * time.Millisecond) // slow, then fine
			return w.dial(ctx, tg)
		}})
	c, br := dialProxy(t, socksAddr)
	host := "echo.test"
	req := append([]byte{5, 1, 0, 5, 1, 0, 3, byte(len(host))}, host...)
	_, _ = c.Write(append(req, byte(port>>8), byte(port)))
	reply := make([]byte, 2+10) // method selection, then the reply with an IPv4 address
	if _, err := io.ReadFull(br, reply); err != nil || reply[3] != 0x00 {
		t.Fatalf("replies % x, %v; want success", reply, err)
	}
	_, _ = io.WriteString(c, "ping\n")
	for _, want := range []string{"hello\n", "ping\n"} {
		if line, err := br.ReadString('\n'); err != nil || line != want {
			t.Fatalf("through the tunnel: %q, %v; want %q", line, err, want)
		}
	}
	if logs := w.logs.String(); strings.Contains(logs, "echo.test") {
		t.Errorf("log names the destination:\n%s", logs)
	}
}

func TestServeStopsOnCancel(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeSOCKS5(ctx, ln, newWorld().dial, nil) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ServeSOCKS5 after cancel = %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("ServeSOCKS5 did not return after cancel")
	}
	if err := ServeHTTP(context.Background(), ln, nil, nil); err == nil {
		t.Fatal("ServeHTTP without a dial function succeeded")
	}
}

// A connection on which the timeout passes with nothing of a request sent (idle between
// kept-alive requests, or never used) ends with no answer: a 408 there could be read as
// the answer to a request the client sends at that moment. A request cut short by the
// timeout gets its answer (written under a deadline of its own: the one that ran out
// would fail the write).
func TestHTTPTimeoutAnswers(t *testing.T) {
	w := newWorld()
	httpAddr, _ := w.serve(t, &Server{HandshakeTimeout: 200 * time.Millisecond})
	tests := []struct {
		name string
		sent string
		want string // what the client reads before the end of the connection
	}{
		{"nothing sent", "", ""},
		// bufio hands the partial line over as a line, which then reads as malformed.
		{"half a request line", "GET http://x.te", "HTTP/1.1 400 "},
		{"header without its end", "GET http://x.test/ HTTP/1.1\r\nHost: x.test\r\n", "HTTP/1.1 408 "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, br := dialProxy(t, httpAddr)
			if _, err := io.WriteString(c, tt.sent); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			got, err := io.ReadAll(br)
			if err != nil {
				t.Fatalf("read: %v (after %q)", err, got)
			}
			if tt.want == "" && len(got) != 0 || !strings.HasPrefix(string(got), tt.want) {
				t.Fatalf("got %q, want an answer starting %q", got, tt.want)
			}
		})
	}
}

// closeNotingConn reports its first Close on closed.
type closeNotingConn struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (c *closeNotingConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// readNotingListener accepts connections that report on read every read that returned
// bytes.
type readNotingListener struct {
	net.Listener
	read chan struct{}
}

func (l readNotingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return readNotingConn{c, l.read}, nil
}

type readNotingConn struct {
	net.Conn
	read chan struct{}
}

func (c readNotingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		select {
		case c.read <- struct{}{}:
		default:
		}
	}
	return n, err
}

// TestHTTPKeptAliveClosedOnCancel: once the server's context is done (the relay drains),
// a client connection kept alive between requests is closed, and with it the origin
// connection kept for it, as net/http's Server.Shutdown closes idle connections. One
// that has begun to send its next request is not cut: it gets an answer.
func TestHTTPKeptAliveClosedOnCancel(t *testing.T) {
	w := newWorld()
	w.httpOrigin(t, "a.test")
	origins := make(chan *closeNotingConn, 4)
	s := &Server{Log: w.logger(), Dial: func(ctx context.Context, t upstream.Target) (net.Conn, error) {
		c, err := w.dial(ctx, t)
		if err != nil {
			return nil, err
		}
		nc := &closeNotingConn{Conn: c, closed: make(chan struct{})}
		origins <- nc
		return nc, nil
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	read := make(chan struct{}, 1)
	go s.ServeHTTP(ctx, readNotingListener{ln, read})

	idle, idleBr := dialProxy(t, ln.Addr().String())
	busy, busyBr := dialProxy(t, ln.Addr().String())
	for _, c := range []struct {
		c  net.Conn
		br *bufio.Reader
	}{{idle, idleBr}, {busy, busyBr}} {
		_, _ = io.WriteString(c.c, "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n")
		resp, err := http.ReadResponse(c.br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	idleOrigin := <-origins
	select { // the reads so far
	case <-read:
	default:
	}
	_, _ = io.WriteString(busy, "GET http://a.test/ HTTP/1.1\r\n") // the next request, begun
	<-read                                                         // the proxy has it
	cancel()

	if _, err := idleBr.ReadByte(); err != io.EOF {
		t.Errorf("idle kept-alive connection after cancel: read %v, want EOF", err)
	}
	select {
	case <-idleOrigin.closed:
	case <-time.After(5 * time.Second):
		t.Error("the origin connection kept for the idle client is still open after cancel")
	}
	_, _ = io.WriteString(busy, "Host: a.test\r\n\r\n")
	if resp, err := http.ReadResponse(busyBr, nil); err != nil {
		t.Errorf("connection in the middle of a request at cancel: %v, want an answer", err)
	} else {
		resp.Body.Close()
	}
}
