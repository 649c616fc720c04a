package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kl-egress/kl/tests/testutil"
)

// origin registers name as an origin served by handle, once per connection, and returns
// a channel closed when the first handle returns (the origin saw the proxy's connection
// end, or gave up).
func (w *world) origin(t *testing.T, name string, handle func(c net.Conn)) <-chan struct{} {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var once sync.Once
	testutil.Serve(t, ln, func(c net.Conn) {
		defer once.Do(func() { close(done) })
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		handle(c)
	})
	w.mu.Lock()
	w.names[name] = ln.Addr().String()
	w.mu.Unlock()
	return done
}

// TestHTTPForwardStalls: a forwarded request whose origin or client stops taking part
// ends within the idle timeout (the origin's answer headers: within it as a whole), and
// a client that leaves while the origin thinks ends the exchange at once, whatever the
// timeout; the origin connection is closed in every case. (Before, each of them held
// the handler and both connections until the origin gave up.)
func TestHTTPForwardStalls(t *testing.T) {
	silent := func(c net.Conn) { _, _ = io.Copy(io.Discard, c) } // reads, never answers
	const idle = 300 * time.Millisecond
	tests := []struct {
		name   string
		idle   time.Duration
		within time.Duration // the origin connection is closed this soon
		origin func(c net.Conn)
		client func(t *testing.T, c net.Conn, br *bufio.Reader)
	}{
		{"origin never answers", idle, 2 * time.Second, silent, func(t *testing.T, c net.Conn, br *bufio.Reader) {
			_, _ = io.WriteString(c, "GET http://o.test/ HTTP/1.1\r\nHost: o.test\r\n\r\n")
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != http.StatusGatewayTimeout {
				t.Errorf("answer %v, %v; want 504", resp, err)
			}
		}},
		{"origin trickles headers", idle, 2 * time.Second, func(c net.Conn) {
			_, _ = http.ReadRequest(bufio.NewReader(c))
			for _, b := range []byte("HTTP/1.1 200 OK\r\nX-Slow: 1234567890\r\n") {
				if _, err := c.Write([]byte{b}); err != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}, func(t *testing.T, c net.Conn, br *bufio.Reader) {
			_, _ = io.WriteString(c, "GET http://o.test/ HTTP/1.1\r\nHost: o.test\r\n\r\n")
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != http.StatusGatewayTimeout {
				t.Errorf("answer %v, %v; want 504", resp, err)
			}
		}},
		{"client leaves while the origin thinks", time.Minute, 2 * time.Second, silent, func(t *testing.T, c net.Conn, br *bufio.Reader) {
			_, _ = io.WriteString(c, "GET http://o.test/ HTTP/1.1\r\nHost: o.test\r\n\r\n")
			time.Sleep(100 * time.Millisecond)
			c.Close()
		}},
		// The socket buffers fill first (megabytes on loopback).
		{"client stops reading the answer", idle, 8 * time.Second, func(c net.Conn) {
			_, _ = http.ReadRequest(bufio.NewReader(c))
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
			big := make([]byte, 64<<10)
			for {
				if _, err := c.Write(big); err != nil {
					return
				}
			}
		}, func(t *testing.T, c net.Conn, br *bufio.Reader) {
			_ = c.(*net.TCPConn).SetReadBuffer(4096)
			_, _ = io.WriteString(c, "GET http://o.test/ HTTP/1.1\r\nHost: o.test\r\n\r\n")
			// and reads nothing
		}},
		{"client stalls in its body", idle, 2 * time.Second, silent, func(t *testing.T, c net.Conn, br *bufio.Reader) {
			_, _ = io.WriteString(c, "POST http://o.test/ HTTP/1.1\r\nHost: o.test\r\nContent-Length: 100\r\n\r\nonly ten b")
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != http.StatusBadGateway {
				t.Errorf("answer %v, %v; want 502", resp, err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld()
			closed := w.origin(t, "o.test", tt.origin)
			httpAddr, _ := w.serve(t, &Server{IdleTimeout: tt.idle})
			c, br := dialProxy(t, httpAddr)
			start := time.Now()
			tt.client(t, c, br)
			select {
			case <-closed:
			case <-time.After(tt.within):
				t.Errorf("origin connection still open %v later (idle timeout %v)", time.Since(start), tt.idle)
			}
		})
	}
}

// TestHTTPForwardPipelinedWhileWaiting: a request the client sends while the previous
// one waits for its answer is not mistaken for the client leaving, nor lost.
func TestHTTPForwardPipelinedWhileWaiting(t *testing.T) {
	w := newWorld()
	w.origin(t, "slow.origin.test", func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			time.Sleep(300 * time.Millisecond)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(req.URL.Path), req.URL.Path)
		}
	})
	httpAddr, _ := w.serve(t, &Server{IdleTimeout: time.Minute})
	c, br := dialProxy(t, httpAddr)
	_, _ = io.WriteString(c, "GET http://slow.origin.test/one HTTP/1.1\r\nHost: slow.origin.test\r\n\r\n")
	time.Sleep(100 * time.Millisecond) // the first is at the origin now
	_, _ = io.WriteString(c, "GET http://slow.origin.test/two HTTP/1.1\r\nHost: slow.origin.test\r\n\r\n")
	for _, want := range []string{"/one", "/two"} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer for %s: %v", want, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if string(body) != want {
			t.Fatalf("answer %q, want %q", body, want)
		}
	}
	if n := len(w.dialed()); n != 1 {
		t.Errorf("%d dials, want 1 (the origin connection kept)", n)
	}
}

// TestHTTPForwardHugeResponseHeader: an origin that sends an endless header block is cut
// off once the headers pass maxResponseHeaderBytes, with a 502 that says why. (Before,
// the proxy buffered all of it until the idle timeout: memory without bound, at the
// speed of the origin, in the daemon that serves every pod.)
func TestHTTPForwardHugeResponseHeader(t *testing.T) {
	for _, tt := range []struct{ name, start string }{
		{"endless header line", "HTTP/1.1 200 OK\r\nX-Big: "},
		{"endless status line", "HTTP/1.1 200 "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld()
			closed := w.origin(t, "big.test", func(c net.Conn) {
				_, _ = http.ReadRequest(bufio.NewReader(c))
				_, _ = io.WriteString(c, tt.start)
				big := []byte(strings.Repeat("a", 64<<10))
				for {
					if _, err := c.Write(big); err != nil {
						return
					}
				}
			})
			httpAddr, _ := w.serve(t, &Server{IdleTimeout: 20 * time.Second})
			c, br := dialProxy(t, httpAddr)
			start := time.Now()
			_, _ = io.WriteString(c, "GET http://big.test/ HTTP/1.1\r\nHost: big.test\r\n\r\n")
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), "response headers over") {
				t.Fatalf("answer %d %q after %v; want 502 about the response headers", resp.StatusCode, body, time.Since(start))
			}
			select {
			case <-closed:
			case <-time.After(5 * time.Second):
				t.Fatal("the origin connection stayed open")
			}
		})
	}
}

// TestHTTPForwardOriginClosedIdle: an origin that closes a kept-alive connection while it
// is idle (Node's default is 5s) is not used again: the next request to it is sent on a
// new connection instead of failing with a 502. (Before, every request that followed an
// origin's idle close got a 502.)
func TestHTTPForwardOriginClosedIdle(t *testing.T) {
	w := newWorld()
	w.origin(t, "idle.test", func(c net.Conn) {
		// One answer, kept alive as far as the headers say, then an idle close.
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(req.URL.Path), req.URL.Path)
		time.Sleep(50 * time.Millisecond)
		_ = c.Close()
	})
	httpAddr, _ := w.serve(t, nil)
	c, br := dialProxy(t, httpAddr)
	for _, path := range []string{"/one", "/two", "/three"} {
		_, _ = io.WriteString(c, "GET http://idle.test"+path+" HTTP/1.1\r\nHost: idle.test\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer for %s: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(body) != path {
			t.Fatalf("answer for %s: %d %q", path, resp.StatusCode, body)
		}
		time.Sleep(200 * time.Millisecond) // the origin closes meanwhile
	}
	if n := len(w.dialed()); n != 3 {
		t.Errorf("%d dials, want 3 (one per origin connection)", n)
	}
}

// TestHTTPForwardChunkedToHTTP10: an HTTP/1.0 client cannot read chunked framing (RFC
// 9112 §7.1: never sent to a 1.0 recipient), so a chunked answer reaches it unframed and
// ended by the close. (Before, the chunk sizes ended up in the body it saw.)
func TestHTTPForwardChunkedToHTTP10(t *testing.T) {
	w := newWorld()
	w.origin(t, "chunky.test", func(c net.Conn) {
		_, _ = http.ReadRequest(bufio.NewReader(c))
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
	})
	httpAddr, _ := w.serve(t, nil)
	c, br := dialProxy(t, httpAddr)
	_, _ = io.WriteString(c, "GET http://chunky.test/ HTTP/1.0\r\n\r\n")
	resp, err := http.ReadResponse(br, &http.Request{Method: "GET", ProtoMajor: 1, ProtoMinor: 0})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.TransferEncoding) > 0 || resp.Header.Get("Transfer-Encoding") != "" {
		t.Errorf("answer to an HTTP/1.0 request has Transfer-Encoding %v", resp.TransferEncoding)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil || string(body) != "hello world" {
		t.Fatalf("body %q, %v; want %q", body, err, "hello world")
	}
}

// TestAnswerToClientNotReading: a client that sends a request and then reads nothing
// does not hold the handler: every answer written after a dial (an error reply, the
// CONNECT's 200, the SOCKS5 reply) fails after a write deadline of its own and the
// connection ends. net.Pipe stands for a client whose socket buffers are full: a write
// to it waits until it reads. (Before, the CONNECT's error reply and 200, and a
// forwarded request's dial-failure and Expect replies, had no deadline: the handler
// waited as long as the client did.)
func TestAnswerToClientNotReading(t *testing.T) {
	w := newWorld()
	port := w.echoOrigin(t, "echo.test")
	socks := func(host string) []byte {
		req := append([]byte{5, 1, 0, 5, 1, 0, 3, byte(len(host))}, host...)
		return append(req, byte(port>>8), byte(port))
	}
	tests := []struct {
		name  string
		socks bool
		sent  []byte
		read  int // bytes the client reads before it stops (the SOCKS5 method selection)
	}{
		{"CONNECT denied", false, []byte("CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test:443\r\n\r\n"), 0},
		{"CONNECT to an unknown host", false, []byte("CONNECT nxdomain.test:443 HTTP/1.1\r\nHost: nxdomain.test:443\r\n\r\n"), 0},
		{"CONNECT established", false, []byte(fmt.Sprintf("CONNECT echo.test:%d HTTP/1.1\r\nHost: echo.test\r\n\r\n", port)), 0},
		{"forward denied", false, []byte("GET http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n\r\n"), 0},
		{"forward with an unsupported Expect", false, []byte("GET http://echo.test/ HTTP/1.1\r\nHost: echo.test\r\nExpect: nothing\r\n\r\n"), 0},
		{"SOCKS5 denied", true, socks("denied.test"), 2},
		{"SOCKS5 established", true, socks("echo.test"), 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &Server{Dial: w.dial, Log: w.logger(), HandshakeTimeout: 200 * time.Millisecond}
			handle := s.serveHTTPConn
			if tt.socks {
				handle = s.serveSOCKSConn
			}
			client, server := net.Pipe()
			t.Cleanup(func() { _ = client.Close() })
			done := make(chan struct{})
			go func() {
				defer close(done)
				handle(context.Background(), server)
			}()
			go func() { _, _ = client.Write(tt.sent) }()
			if _, err := io.ReadFull(client, make([]byte, tt.read)); err != nil {
				t.Fatalf("read the first %d bytes: %v", tt.read, err)
			}
			select { // and reads nothing more
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("the handler still waits for the client to read its answer")
			}
		})
	}
}
