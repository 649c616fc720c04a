package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestHTTPEarlyAnswer: an origin that answers a forwarded request before it has read
// the body (413, 401, 417: it will not take the body) gets its answer to the client,
// whether it then closes or just stops reading, and whatever the body's size; the rest
// of the body is not sent, and the client connection ends after the answer. (Before, the
// proxy wrote the whole body before it read anything: once the origin's socket buffers
// were full its writes failed, and the client got kl's 502 instead of the answer.) The
// client here is Go's own, which reads an answer while it still sends the body, as a
// client talking to the origin directly would.
func TestHTTPEarlyAnswer(t *testing.T) {
	const answer = "HTTP/1.1 413 Content Too Large\r\nContent-Length: 9\r\nConnection: close\r\n\r\ntoo large"
	answerThenClose := func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		_, _ = io.WriteString(c, answer)
	}
	answerThenWait := func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		_, _ = io.WriteString(c, answer)
		time.Sleep(5 * time.Second) // reads nothing more, and keeps the connection
	}
	tests := []struct {
		name   string
		origin func(c net.Conn)
		size   int
	}{
		{"answer and close, 16 KiB body", answerThenClose, 16 << 10},
		{"answer and close, 256 KiB body", answerThenClose, 256 << 10},
		{"answer and close, 8 MiB body", answerThenClose, 8 << 20},
		{"answer and stop reading, 16 KiB body", answerThenWait, 16 << 10},
		{"answer and stop reading, 8 MiB body", answerThenWait, 8 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld()
			w.origin(t, "up.test", tt.origin)
			// The idle timeout is far off: the answer must not wait for it.
			httpAddr, _ := w.serve(t, &Server{IdleTimeout: time.Minute})
			pc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
				Proxy: func(*http.Request) (*url.URL, error) { return url.Parse("http://" + httpAddr) }}}
			defer pc.CloseIdleConnections()
			start := time.Now()
			resp, err := pc.Post("http://up.test/upload", "application/octet-stream", strings.NewReader(strings.Repeat("x", tt.size)))
			if err != nil {
				t.Fatalf("POST of %d bytes: %v; want the origin's 413", tt.size, err)
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusRequestEntityTooLarge || string(body) != "too large" || err != nil {
				t.Fatalf("POST of %d bytes: %d %q, %v; want the origin's 413 %q", tt.size, resp.StatusCode, body, err, "too large")
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("the answer took %v", took)
			}
		})
	}
}

// TestHTTPEarlyAnswerRaw: with a client that sends the headers and part of a body, then
// waits (as curl does with a large upload), the origin's early answer comes through at
// once, marked as the last on the connection, and the connection then ends; the origin
// never sees the rest of the body.
func TestHTTPEarlyAnswerRaw(t *testing.T) {
	got := make(chan int, 1)
	w := newWorld()
	w.origin(t, "up.test", func(c net.Conn) {
		br := bufio.NewReader(c)
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 401 Unauthorized\r\nContent-Length: 4\r\n\r\nwho?")
		n, _ := io.Copy(io.Discard, br)
		got <- br.Buffered() + int(n)
	})
	httpAddr, _ := w.serve(t, &Server{IdleTimeout: time.Minute})
	c, br := dialProxy(t, httpAddr)
	if _, err := fmt.Fprintf(c, "PUT http://up.test/f HTTP/1.1\r\nHost: up.test\r\nContent-Length: 1000000\r\n\r\n%s", strings.Repeat("y", 1000)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("answer: %v; want the origin's 401", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusUnauthorized || string(body) != "who?" || !resp.Close {
		t.Fatalf("answer %d %q, close %v; want the origin's 401 %q, with Connection: close", resp.StatusCode, body, resp.Close, "who?")
	}
	// The proxy ends the connection after the answer: what the client sends now is
	// dropped, never forwarded.
	_, _ = c.Write([]byte(strings.Repeat("z", 1000)))
	if _, err := br.ReadByte(); err == nil {
		t.Errorf("the client connection is still open after the answer")
	}
	select {
	case n := <-got:
		if n > 1000 {
			t.Errorf("the origin got %d body bytes after the request headers, want at most the 1000 sent before the answer", n)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("the origin connection is still open after the answer")
	}
}

// TestHTTPBodyThenAnswer: an origin that reads the whole body before it answers keeps
// its connection for the client's next request, as before.
func TestHTTPBodyThenAnswer(t *testing.T) {
	w := newWorld()
	conns := make(chan struct{}, 4)
	w.origin(t, "up.test", func(c net.Conn) {
		conns <- struct{}{}
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			n, _ := io.Copy(io.Discard, req.Body)
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(fmt.Sprint(n)), fmt.Sprint(n))
		}
	})
	httpAddr, _ := w.serve(t, &Server{IdleTimeout: time.Minute})
	c, br := dialProxy(t, httpAddr)
	for i, size := range []int{0, 10, 1 << 20} {
		if _, err := fmt.Fprintf(c, "POST http://up.test/ HTTP/1.1\r\nHost: up.test\r\nContent-Length: %d\r\n\r\n%s", size, strings.Repeat("b", size)); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(body) != fmt.Sprint(size) || resp.Close {
			t.Fatalf("request %d: answer %d %q, close %v; want 200 %q on a kept connection", i, resp.StatusCode, body, resp.Close, fmt.Sprint(size))
		}
	}
	if n := len(conns); n != 1 {
		t.Errorf("%d origin connections for 3 requests, want 1 (kept alive)", n)
	}
}

// An origin that answers 2xx before it has read the body and then reads it (a
// full-duplex or streaming upload endpoint) gets the whole body, and its answer reaches
// the client whole; the connection stays fit for the next request.
func TestHTTPEarlyAnswerFullDuplex(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_ = rc.EnableFullDuplex()
		w.WriteHeader(http.StatusOK)
		_ = rc.Flush()
		n, err := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "got %d err %v", n, err)
	}))
	defer srv.Close()
	w := newWorld()
	w.names["up.test"] = strings.TrimPrefix(srv.URL, "http://")
	httpAddr, _ := w.serve(t, &Server{IdleTimeout: 3 * time.Second})
	c, br := dialProxy(t, httpAddr)
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	for i := range 2 { // the second request: the connection is kept
		fmt.Fprintf(c, "POST http://up.test/ HTTP/1.1\r\nHost: up.test\r\nContent-Length: 10\r\n\r\n12345")
		resp, err := http.ReadResponse(br, nil) // the origin answers before the rest
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		io.WriteString(c, "67890")
		body, err := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || string(body) != "got 10 err <nil>" || err != nil {
			t.Fatalf("request %d: status %d body %q err %v; want the origin's answer after the whole body", i, resp.StatusCode, body, err)
		}
	}
}
