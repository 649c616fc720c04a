package upstream

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// FuzzReadResponseHead: an upstream's CONNECT answer is untrusted input.
func FuzzReadResponseHead(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 Connection established\r\n\r\n",
		"HTTP/1.0 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"x\"\r\n\r\n",
		"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\nextra",
		"HTTP/1.1 200\n\n",
		"SSH-2.0-x\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var p httpHead
		n, done, err := p.feed(b)
		if n < 0 || n > len(b) {
			t.Fatalf("httpHead.feed(%q) took %d bytes", b, n)
		}
		if err != nil || !done {
			return
		}
		if p.code < 100 || p.code > 999 {
			t.Fatalf("httpHead.feed(%q): status %d", b, p.code)
		}
	})
}

// scriptConn replays canned upstream bytes and swallows what the client writes.
type scriptConn struct {
	net.Conn
	r io.Reader
}

func (c *scriptConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *scriptConn) Write(p []byte) (int, error)      { return len(p), nil }
func (c *scriptConn) Close() error                     { return nil }
func (c *scriptConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }
func (c *scriptConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *scriptConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }

// FuzzSOCKSReply: a SOCKS5 upstream's answers are untrusted input; the client must
// either succeed having consumed exactly the handshake, or fail with a typed error.
func FuzzSOCKSReply(f *testing.F) {
	f.Add([]byte{5, 0, 5, 0, 0, 1, 127, 0, 0, 1, 0, 80, 'x'}, false)
	f.Add([]byte{5, 2, 1, 0, 5, 0, 0, 3, 4, 'h', 'o', 's', 't', 0, 80}, true)
	f.Add([]byte{5, 0xff}, false)
	f.Add([]byte{5, 0, 5, 5, 0, 1, 0, 0, 0, 0, 0, 0}, false)
	f.Add([]byte{5, 0, 5, 0, 0, 4}, false)
	f.Fuzz(func(t *testing.T, b []byte, auth bool) {
		url := "socks5://127.0.0.1:1"
		if auth {
			url = "socks5://u:p@127.0.0.1:1"
		}
		r := bytes.NewReader(b)
		base := func(ctx context.Context, network, addr string) (net.Conn, error) {
			return &scriptConn{r: r}, nil
		}
		d, err := New(url, time.Second, base)
		if err != nil {
			t.Fatal(err)
		}
		c, err := d.Dial(context.Background(), Target{Host: "example.com", Port: 443})
		if err != nil {
			if !errors.Is(err, ErrProtocol) && !errors.Is(err, ErrAuth) && !errors.Is(err, ErrRefused) &&
				!errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !bytes.Contains([]byte(err.Error()), []byte("closed the connection")) {
				t.Fatalf("Dial over % x: untyped error %v", b, err)
			}
			return
		}
		_ = c
	})
}
