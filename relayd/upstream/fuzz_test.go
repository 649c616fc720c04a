package upstream

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
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

// handshakeKinds are the upstreams FuzzHandshake negotiates with, by its kind argument.
var handshakeKinds = []struct {
	url  string
	opts []Option
}{
	{url: "socks5://h:1"},
	{url: "socks5://u:p@h:1"},
	{url: "socks5://h:1", opts: []Option{Pipeline()}},
	{url: "socks5://u:p@h:1", opts: []Option{Pipeline()}},
	{url: "http://h:1"},
	{url: "http://u:p@h:1"},
}

// FuzzHandshake: an upstream's answer is untrusted and arrives in pieces of any size.
// Fed one byte at a time, in the pieces splits gives, or whole, it comes to the same
// (error, tunnel bytes, what was sent), Want is never negative, and a SOCKS5 handshake
// that keeps to Want never takes a tunnel byte.
func FuzzHandshake(f *testing.F) {
	f.Add(uint8(0), []byte("\x05\x00\x05\x00\x00\x01\x7f\x00\x00\x01\x1f\x90!"), []byte{3, 1})
	f.Add(uint8(1), []byte("\x05\x02\x01\x00\x05\x00\x00\x03\x04host\x00P"), []byte{0})
	f.Add(uint8(3), []byte("\x05\x02\x01\x00\x05\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00x"), []byte{5, 9})
	f.Add(uint8(4), []byte("HTTP/1.1 200 Connection established\r\n\r\nSSH-2.0-x\r\n"), []byte{7, 0, 30})
	f.Add(uint8(5), []byte("HTTP/1.0 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"x\"\r\n\r\n"), []byte{})
	f.Fuzz(func(t *testing.T, kind uint8, answer, splits []byte) {
		k := handshakeKinds[int(kind)%len(handshakeKinds)]
		hs := mustHandshaker(t, k.url, k.opts...)
		run := func(chunk func(i int) int, unbounded bool) result {
			h, err := hs.Handshake(Target{Host: "example.com", Port: 443})
			if err != nil {
				t.Fatal(err)
			}
			r := drive(t, h, answer, chunk, unbounded)
			if !unbounded && strings.HasPrefix(k.url, "socks5") && len(h.Rest()) != 0 {
				t.Fatalf("%s over %q: Rest %q, want none when fed up to Want", k.url, answer, h.Rest())
			}
			return r
		}
		one := run(func(int) int { return 1 }, false)
		for _, c := range []struct {
			name      string
			chunk     func(i int) int
			unbounded bool
		}{
			{"whole", func(int) int { return len(answer) }, false},
			{"split", func(i int) int {
				if len(splits) == 0 {
					return 1
				}
				return int(splits[i%len(splits)]) + 1
			}, false},
			{"whole past Want", func(int) int { return len(answer) }, true},
		} {
			got := run(c.chunk, c.unbounded)
			if got.err != one.err || got.done != one.done || !bytes.Equal(got.tunnel, one.tunnel) || (!c.unbounded && !bytes.Equal(got.out, one.out)) {
				t.Fatalf("%s over %q fed %s = %+v, byte by byte %+v", k.url, answer, c.name, got, one)
			}
		}
	})
}
