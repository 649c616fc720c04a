package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// sendRefused sends msg in one go (from a goroutine: the proxy may stop reading it) and,
// once the proxy has had time to answer and close, reads everything it sent until the
// connection ends.
func sendRefused(t *testing.T, addr string, msg []byte) ([]byte, error) {
	t.Helper()
	c, br := dialProxy(t, addr)
	go func() { _, _ = c.Write(msg) }()
	// A client that is slow to read: by now the proxy has answered and is closing.
	time.Sleep(50 * time.Millisecond)
	return io.ReadAll(br)
}

// TestRefusalReachesClientWithBytesBehind: a request the proxy refuses while more of the
// client's bytes wait unread behind it (the rest of an oversized header, a body, tunnel
// bytes, pipelined requests) gets its whole answer and then an orderly end, not a reset
// that makes a client that reads late lose the answer.
func TestRefusalReachesClientWithBytesBehind(t *testing.T) {
	w := newWorld()
	w.httpOrigin(t, "a.test")
	w.origin(t, "garbage.test", func(c net.Conn) { // answers something not HTTP
		_, _ = c.Read(make([]byte, 4096))
		_, _ = io.WriteString(c, "garbage\r\n\r\n")
		_ = c.Close()
	})
	httpAddr, socksAddr := w.serve(t, &Server{MaxHeaderBytes: 4096})
	more := bytes.Repeat([]byte("m"), 32<<10)
	withMore := func(s string) []byte { return append([]byte(s), more...) }
	pipelined := bytes.Repeat([]byte("GET http://a.test/next HTTP/1.1\r\nHost: a.test\r\n\r\n"), 600)

	httpTests := []struct {
		name       string
		send       []byte
		wantStatus int
		wantBody   string // substring of the answer's body
	}{
		{"oversized header", withMore("GET http://x.test/ HTTP/1.1\r\nX: "), 431, "request header over 4096 bytes"},
		{"malformed request", withMore("\x16\x03\x01\x00\x05hello\r\n\r\n"), 400, "malformed request"},
		{"denied CONNECT with tunnel bytes", withMore("CONNECT denied.test:443 HTTP/1.1\r\nHost: denied.test:443\r\n\r\n"), 403, "rule 3"},
		{"unreachable CONNECT with tunnel bytes", withMore("CONNECT nowhere.test:443 HTTP/1.1\r\n\r\n"), 502, "host unreachable"},
		{"body of a denied POST", withMore("POST http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\nContent-Length: 32768\r\n\r\n"), 403, "rule 3"},
		{"body of an https POST", withMore("POST https://x.test/ HTTP/1.1\r\nHost: x.test\r\nContent-Length: 32768\r\n\r\n"), 501, "not supported"},
		{"requests pipelined behind one the origin botches", append([]byte("GET http://garbage.test/ HTTP/1.1\r\nHost: garbage.test\r\n\r\n"), pipelined...), 502, "no valid response"},
		{"rest of a malformed chunked body", withMore("POST http://a.test/ HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"), 502, "sending the request failed"},
		{"body behind an unsupported Expect", withMore("PUT http://a.test/ HTTP/1.1\r\nHost: a.test\r\nExpect: teapot\r\nContent-Length: 32768\r\n\r\n"), 417, "unsupported Expect"},
		{"requests pipelined behind Connection: close", append([]byte("GET http://a.test/last HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n"), pipelined...), 200, `"RequestURI":"/last"`},
	}
	for _, tt := range httpTests {
		t.Run("http/"+tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := sendRefused(t, httpAddr, tt.send)
			if err != nil {
				t.Fatalf("after %d bytes of the answer: %v (want the whole answer, then EOF)", len(got), err)
			}
			br := bufio.NewReader(bytes.NewReader(got))
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("answer %q: %v", got, err)
			}
			body, err := io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != tt.wantStatus || !strings.Contains(string(body), tt.wantBody) {
				t.Fatalf("got %d %q (%v), want %d containing %q", resp.StatusCode, body, err, tt.wantStatus, tt.wantBody)
			}
			if !resp.Close || br.Buffered() > 0 {
				t.Fatalf("answer %q: want one answer with Connection: close", got)
			}
		})
	}

	denied := append([]byte{5, 1, 0, 5, 1, 0, 3, byte(len("denied.test"))}, "denied.test"...)
	denied = append(denied, 1, 187)
	socksTests := []struct {
		name string
		send []byte
		want []byte // the whole answer before the proxy closes
	}{
		{"bind with bytes behind", append([]byte{5, 1, 0, 5, 2, 0, 1, 127, 0, 0, 1, 0, 80}, more...), []byte{5, 0, 5, 7, 0, 1, 0, 0, 0, 0, 0, 0}},
		{"denied with bytes behind", append(denied, more...), []byte{5, 0, 5, 2, 0, 1, 0, 0, 0, 0, 0, 0}},
		{"bad domain with bytes behind", append(append([]byte{5, 1, 0, 5, 1, 0, 3, 3}, "a b\x00\x50"...), more...), []byte{5, 0, 5, 4, 0, 1, 0, 0, 0, 0, 0, 0}},
		{"auth only with the request behind", append([]byte{5, 1, 2}, append(denied[3:], more...)...), []byte{5, 0xff}},
	}
	for _, tt := range socksTests {
		t.Run("socks5/"+tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := sendRefused(t, socksAddr, tt.send)
			if err != nil || !bytes.Equal(got, tt.want) {
				t.Fatalf("answer % x, %v; want % x, then EOF", got, err, tt.want)
			}
		})
	}
}

// TestLingerIsBounded: a client that keeps sending behind a refused request (and never
// closes) does not keep its connection open: the proxy stops discarding what it sends
// after lingerBytes, or after lingerTime.
func TestLingerIsBounded(t *testing.T) {
	httpReq := []byte("CONNECT denied.test:443 HTTP/1.1\r\n\r\n")
	socksReq := []byte{5, 1, 0, 5, 2, 0, 1, 127, 0, 0, 1, 0, 80}
	for _, tt := range []struct {
		name  string
		time  time.Duration
		bytes int64
	}{
		{"bytes", time.Hour, 1 << 10},
		{"time", 20 * time.Millisecond, 1 << 40},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := newWorld()
			httpAddr, socksAddr := w.serve(t, &Server{lingerTime: tt.time, lingerBytes: tt.bytes})
			for _, c := range []struct {
				addr string
				req  []byte
			}{{httpAddr, httpReq}, {socksAddr, socksReq}} {
				conn, br := dialProxy(t, c.addr)
				if _, err := conn.Write(c.req); err != nil {
					t.Fatal(err)
				}
				if _, err := io.Copy(io.Discard, br); err != nil { // the refusal, then the FIN
					t.Fatal(err)
				}
				chunk := bytes.Repeat([]byte("m"), 4<<10)
				var err error
				for range 1 << 20 { // ends by the proxy closing, or by the deadline
					if _, err = conn.Write(chunk); err != nil {
						break
					}
				}
				var ne net.Error
				if err == nil || errors.As(err, &ne) && ne.Timeout() {
					t.Fatalf("%s: the proxy still takes bytes behind its refusal (%v)", c.addr, err)
				}
			}
		})
	}
}
