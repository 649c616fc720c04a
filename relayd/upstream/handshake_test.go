package upstream

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// result is what driving a Handshake over an answer came to.
type result struct {
	out    []byte // everything Out gave, in order
	err    string // Feed's error, or IOError(io.EOF) when the answer ran out first
	done   bool
	tunnel []byte // Rest, then the answer's bytes not fed: what the client gets
}

// drive runs h over answer: it sends every Out, then feeds the next chunk(i) bytes
// (bounded by Want unless unbounded), until the handshake is done, fails, or the answer
// runs out (read as EOF).
func drive(t testing.TB, h *Handshake, answer []byte, chunk func(i int) int, unbounded bool) result {
	t.Helper()
	var r result
	fed := 0
	for i := 0; i <= len(answer)+1; i++ {
		if o := h.Out(); o != nil {
			r.out = append(r.out, o...)
			h.Sent()
		}
		w := h.Want()
		if w < 0 || (w == 0 && !h.Done()) {
			t.Fatalf("Want() = %d before the handshake is done", w)
		}
		if h.Done() || fed == len(answer) {
			break
		}
		n := min(chunk(i), len(answer)-fed)
		if !unbounded {
			n = min(n, w)
		}
		err := h.Feed(answer[fed : fed+n])
		fed += n
		if err != nil {
			if w := h.Want(); w != 0 {
				t.Fatalf("Want() = %d after Feed failed", w)
			}
			r.err = err.Error()
			return r
		}
	}
	if r.done = h.Done(); r.done {
		r.tunnel = append(append([]byte{}, h.Rest()...), answer[fed:]...)
	} else {
		r.err = h.IOError(io.EOF).Error()
	}
	return r
}

func mustHandshaker(t testing.TB, url string, opts ...Option) Handshaker {
	t.Helper()
	d, err := New(url, 300*time.Millisecond, nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	hs, ok := d.(Handshaker)
	if !ok {
		t.Fatalf("New(%q) = %T, not a Handshaker", url, d)
	}
	return hs
}

// socksOK is a SOCKS5 success reply with an IPv4 bound address and a tunnel byte.
var socksOK = "\x05\x00\x00\x01\x7f\x00\x00\x01\x1f\x90!"

// TestHandshakeSplits: an answer gives the same result (error, tunnel bytes, what was
// sent) whether it comes whole or one byte at a time, and the result is the expected
// one. These are the answers of TestHTTPConnect and TestSOCKS5, and the bounds.
func TestHandshakeSplits(t *testing.T) {
	tests := []struct {
		name    string
		url     string
		opts    []Option
		answer  string
		errText string // "" for success
		tunnel  string
	}{
		{name: "http ok", url: "http://h:1", answer: "HTTP/1.1 200 Connection established\r\n\r\n"},
		{name: "http ok with auth", url: "http://alice:s3cret@h:1", answer: "HTTP/1.0 200 OK\r\nProxy-Agent: x\r\n\r\n"},
		{name: "http early bytes", url: "http://h:1", answer: "HTTP/1.1 200 OK\r\n\r\nSSH-2.0-banner\r\n", tunnel: "SSH-2.0-banner\r\n"},
		{name: "http bare LF", url: "http://h:1", answer: "HTTP/1.1 200\n\nx", tunnel: "x"},
		{name: "http 407 without creds", url: "http://h:1", answer: "HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n",
			errText: "upstream http://h:1: authentication failed: upstream requires credentials and none are configured (407 Proxy Authentication Required)"},
		{name: "http 407 with creds", url: "http://a:b@h:1", answer: "HTTP/1.1 407 Proxy Authentication Required\r\n\r\n",
			errText: "upstream http://h:1: authentication failed: credentials rejected (407 Proxy Authentication Required)"},
		{name: "http 403", url: "http://h:1", answer: "HTTP/1.1 403 Forbidden\r\nContent-Length: 3\r\n\r\nno\n",
			errText: "upstream http://h:1: refused by upstream: CONNECT answered 403 Forbidden"},
		{name: "http 502 naming the target", url: "http://h:1", answer: "HTTP/1.1 502 cannot reach secret.example\r\n\r\n",
			errText: "upstream http://h:1: refused by upstream: CONNECT answered 502 Bad Gateway"},
		{name: "http garbage code", url: "http://h:1", answer: "HTTP/1.1 5xx secret.example\r\n\r\n",
			errText: "upstream http://h:1: read CONNECT reply: protocol error: bad status line (no 3-digit status code)"},
		{name: "http not http", url: "http://h:1", answer: "SSH-2.0-OpenSSH\r\n\r\n",
			errText: "upstream http://h:1: read CONNECT reply: protocol error: bad status line (15 bytes, not HTTP/1.x NNN)"},
		{name: "http code glued to reason", url: "http://h:1", answer: "HTTP/1.1 200OK\r\n\r\n",
			errText: "upstream http://h:1: read CONNECT reply: protocol error: bad status line (no 3-digit status code)"},
		{name: "http huge header line", url: "http://h:1", answer: "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", 5000) + "\r\n\r\n",
			errText: "upstream http://h:1: read CONNECT reply: protocol error: header line over 4096 bytes"},
		{name: "http longest header line", url: "http://h:1", answer: "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", 4092) + "\n\r\n"},
		{name: "http header line one over", url: "http://h:1", answer: "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", 4093) + "\n\r\n",
			errText: "upstream http://h:1: read CONNECT reply: protocol error: header line over 4096 bytes"},
		{name: "http head over 32KiB", url: "http://h:1", answer: "HTTP/1.1 200 OK\r\n" + strings.Repeat("X: "+strings.Repeat("a", 4000)+"\r\n", 9) + "\r\n",
			errText: "upstream http://h:1: read CONNECT reply: protocol error: reply header over 32768 bytes"},
		{name: "http 99 headers", url: "http://h:1", answer: "HTTP/1.1 200 OK\r\n" + strings.Repeat("X: y\r\n", 99) + "\r\n"},
		{name: "http 100 headers", url: "http://h:1", answer: "HTTP/1.1 200 OK\r\n" + strings.Repeat("X: y\r\n", 100) + "\r\n",
			errText: "upstream http://h:1: read CONNECT reply: protocol error: 100 header lines or more"},
		{name: "http cut short", url: "http://h:1", answer: "HTTP/1.1 200 OK\r\n",
			errText: "upstream http://h:1: read CONNECT reply: upstream closed the connection"},

		{name: "socks ok", url: "socks5://h:1", answer: "\x05\x00" + socksOK, tunnel: "!"},
		{name: "socks domain reply", url: "socks5://h:1", answer: "\x05\x00\x05\x00\x00\x03\x09localhost\x1f\x90!", tunnel: "!"},
		{name: "socks ipv6 reply with auth", url: "socks5://u:p@h:1", answer: "\x05\x02\x01\x00\x05\x00\x00\x04" + strings.Repeat("\x00", 16) + "\x1f\x90!", tunnel: "!"},
		{name: "socks auth reply version 5", url: "socks5://u:p@h:1", answer: "\x05\x02\x05\x00" + socksOK, tunnel: "!"},
		{name: "socks no-auth over offered credentials", url: "socks5://u:p@h:1", answer: "\x05\x00" + socksOK, tunnel: "!"},
		{name: "socks pipelined", url: "socks5://h:1", opts: []Option{Pipeline()}, answer: "\x05\x00" + socksOK, tunnel: "!"},
		{name: "socks pipelined auth", url: "socks5://u:p@h:1", opts: []Option{Pipeline()}, answer: "\x05\x02\x01\x00" + socksOK, tunnel: "!"},
		{name: "socks auth rejected", url: "socks5://u:bad@h:1", answer: "\x05\x02\x01\x01",
			errText: "upstream socks5://h:1: authentication failed: username/password rejected (status 0x01)"},
		{name: "socks auth required", url: "socks5://h:1", answer: "\x05\xff",
			errText: "upstream socks5://h:1: authentication failed: upstream requires authentication and no credentials are configured"},
		{name: "socks no acceptable method", url: "socks5://u:p@h:1", answer: "\x05\xff",
			errText: "upstream socks5://h:1: authentication failed: upstream accepts neither no-auth nor username/password"},
		{name: "socks not allowed", url: "socks5://h:1", answer: "\x05\x00\x05\x02\x00\x01\x00\x00\x00\x00\x00\x00",
			errText: "upstream socks5://h:1: refused by upstream: SOCKS reply 0x02 (connection not allowed by ruleset)"},
		{name: "socks unknown code", url: "socks5://h:1", answer: "\x05\x00\x05\x42\x00\x01",
			errText: "upstream socks5://h:1: refused by upstream: SOCKS reply 0x42 (unknown reply 0x42)"},
		{name: "socks method not offered", url: "socks5://h:1", answer: "\x05\x02",
			errText: "upstream socks5://h:1: protocol error: upstream chose username/password authentication, which we did not offer"},
		{name: "socks pipelined no-auth over credentials", url: "socks5://u:p@h:1", opts: []Option{Pipeline()}, answer: "\x05\x00",
			errText: "upstream socks5://h:1: protocol error: upstream chose auth method 0x00, which we did not offer"},
		{name: "socks not socks", url: "socks5://h:1", answer: "\x04\x00",
			errText: "upstream socks5://h:1: protocol error: not a SOCKS5 server (version byte 0x04)"},
		{name: "socks bad address type", url: "socks5://h:1", answer: "\x05\x00\x05\x00\x00\x07",
			errText: "upstream socks5://h:1: protocol error: bad address type 0x07 in SOCKS5 reply"},
		{name: "socks cut short", url: "socks5://h:1", answer: "\x05\x00\x05\x00\x00\x03\x09local",
			errText: "upstream socks5://h:1: read SOCKS5 reply: upstream closed the connection"},
	}
	target := Target{Host: "example.com", Port: 443}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hs := mustHandshaker(t, tt.url, tt.opts...)
			run := func(chunk func(int) int, unbounded bool) result {
				h, err := hs.Handshake(target)
				if err != nil {
					t.Fatal(err)
				}
				return drive(t, h, []byte(tt.answer), chunk, unbounded)
			}
			one := run(func(int) int { return 1 }, false)
			if one.err != tt.errText || (tt.errText == "" && (!one.done || string(one.tunnel) != tt.tunnel)) {
				t.Fatalf("fed byte by byte: error %q, done %v, tunnel %q; want error %q, tunnel %q", one.err, one.done, one.tunnel, tt.errText, tt.tunnel)
			}
			for _, whole := range []struct {
				name      string
				unbounded bool
			}{{"up to Want", false}, {"all in one Feed", true}} {
				got := run(func(int) int { return len(tt.answer) }, whole.unbounded)
				// A Feed past Want may fail with messages released but not yet sent.
				sameOut := whole.unbounded || bytes.Equal(got.out, one.out)
				if got.err != one.err || got.done != one.done || !bytes.Equal(got.tunnel, one.tunnel) || !sameOut {
					t.Errorf("fed whole (%s) = %+v, byte by byte %+v", whole.name, got, one)
				}
			}
			// Without Want's bound, the whole answer in one Feed leaves the tunnel bytes in
			// Rest whatever the protocol.
			if tt.errText == "" {
				h, _ := hs.Handshake(target)
				if err := h.Feed([]byte(tt.answer)); err != nil || !h.Done() || string(h.Rest()) != tt.tunnel {
					t.Errorf("one Feed of the whole answer: %v, done %v, Rest %q; want Rest %q", err, h.Done(), h.Rest(), tt.tunnel)
				}
			}
		})
	}
}

// TestHandshakeOut: what each kind of upstream is sent, and when; and Want's exact
// counts for SOCKS5.
func TestHandshakeOut(t *testing.T) {
	req := "\x05\x01\x00\x03\x0bexample.com\x01\xbb"
	type step struct {
		out  string // Out before the read
		want int    // Want before the read
		feed string
	}
	tests := []struct {
		name  string
		url   string
		opts  []Option
		steps []step
	}{
		{name: "socks", url: "socks5://h:1", steps: []step{
			{out: "\x05\x01\x00", want: 2, feed: "\x05\x00"},
			{out: req, want: 4, feed: "\x05\x00\x00\x03"},
			{want: 1, feed: "\x02"},
			{want: 4, feed: "ab\x00\x01"},
		}},
		{name: "socks auth", url: "socks5://us:pw@h:1", steps: []step{
			{out: "\x05\x02\x00\x02", want: 2, feed: "\x05\x02"},
			{out: "\x01\x02us\x02pw", want: 2, feed: "\x01\x00"},
			{out: req, want: 4, feed: "\x05\x00\x00\x04"},
			{want: 18, feed: strings.Repeat("\x00", 18)},
		}},
		{name: "socks credentials not asked for", url: "socks5://us:pw@h:1", steps: []step{
			{out: "\x05\x02\x00\x02", want: 2, feed: "\x05\x00"},
			{out: req, want: 4, feed: "\x05\x00\x00\x01"},
			{want: 6, feed: "\x7f\x00\x00\x01\x00\x01"},
		}},
		{name: "socks pipelined auth", url: "socks5://us:pw@h:1", opts: []Option{Pipeline()}, steps: []step{
			{out: "\x05\x01\x02" + "\x01\x02us\x02pw" + req, want: 2, feed: "\x05\x02"},
			{want: 2, feed: "\x01\x00"},
			{want: 4, feed: "\x05\x00\x00\x01"},
			{want: 6, feed: "\x7f\x00\x00\x01\x00\x01"},
		}},
		{name: "socks pipelined", url: "socks5://h:1", opts: []Option{Pipeline()}, steps: []step{
			{out: "\x05\x01\x00" + req, want: 2, feed: "\x05\x00"},
			{want: 4, feed: "\x05\x00\x00\x01"},
			{want: 6, feed: "\x7f\x00\x00\x01\x00\x01"},
		}},
		{name: "http", url: "http://h:1", steps: []step{
			{out: "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", want: readBufSize, feed: "HTTP/1.1 200 OK\r\n\r\n"},
		}},
		{name: "http auth", url: "http://alice:s3cret@h:1", steps: []step{
			{out: "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nProxy-Authorization: Basic YWxpY2U6czNjcmV0\r\n\r\n", want: readBufSize, feed: "HTTP/1.1 200 OK\r\n\r\n"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := mustHandshaker(t, tt.url, tt.opts...).Handshake(Target{Host: "example.com", Port: 443})
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tt.steps {
				if h.Done() {
					t.Fatalf("step %d: done early", i)
				}
				if got := string(h.Out()); got != s.out {
					t.Fatalf("step %d: Out() = %q, want %q", i, got, s.out)
				}
				h.Sent()
				if h.Out() != nil {
					t.Fatalf("step %d: Out() = %q after Sent", i, h.Out())
				}
				if got := h.Want(); got != s.want {
					t.Fatalf("step %d: Want() = %d, want %d", i, got, s.want)
				}
				if err := h.Feed([]byte(s.feed)); err != nil {
					t.Fatalf("step %d: Feed: %v", i, err)
				}
			}
			if !h.Done() || h.Want() != 0 || h.Out() != nil || len(h.Rest()) != 0 {
				t.Fatalf("after the answer: done %v, Want %d, Out %q, Rest %q; want done, 0, nothing, nothing", h.Done(), h.Want(), h.Out(), h.Rest())
			}
		})
	}
}

// TestHandshakeIOError: the words of a connection's error at each stage are those of the
// blocking Dialer, which reads the same answer over a connection that then ends.
func TestHandshakeIOError(t *testing.T) {
	tests := []struct {
		name    string
		url     string
		opts    []Option
		answer  string // read before the error
		unsent  bool   // the error comes while sending Out
		err     error
		want    string
		dialToo bool // the blocking Dial over answer then EOF says the same
	}{
		{name: "socks greeting", url: "socks5://h:1", unsent: true, err: io.ErrClosedPipe,
			want: "upstream socks5://h:1: send SOCKS5 greeting: io: read/write on closed pipe"},
		{name: "socks pipelined greeting", url: "socks5://h:1", opts: []Option{Pipeline()}, unsent: true, err: io.ErrClosedPipe,
			want: "upstream socks5://h:1: send SOCKS5 greeting and CONNECT: io: read/write on closed pipe"},
		{name: "socks method", url: "socks5://h:1", err: io.EOF, dialToo: true,
			want: "upstream socks5://h:1: read SOCKS5 method: upstream closed the connection"},
		{name: "socks method half", url: "socks5://h:1", answer: "\x05", err: io.EOF, dialToo: true,
			want: "upstream socks5://h:1: read SOCKS5 method: upstream closed the connection"},
		{name: "socks credentials", url: "socks5://u:p@h:1", answer: "\x05\x02", unsent: true, err: io.ErrClosedPipe,
			want: "upstream socks5://h:1: send SOCKS5 credentials: io: read/write on closed pipe"},
		{name: "socks auth reply", url: "socks5://u:p@h:1", answer: "\x05\x02", err: io.EOF, dialToo: true,
			want: "upstream socks5://h:1: read SOCKS5 auth reply: upstream closed the connection"},
		{name: "socks request", url: "socks5://h:1", answer: "\x05\x00", unsent: true, err: io.ErrClosedPipe,
			want: "upstream socks5://h:1: send SOCKS5 CONNECT: io: read/write on closed pipe"},
		{name: "socks reply", url: "socks5://h:1", answer: "\x05\x00\x05\x00\x00\x01\x7f", err: io.EOF, dialToo: true,
			want: "upstream socks5://h:1: read SOCKS5 reply: upstream closed the connection"},
		{name: "socks reply timeout", url: "socks5://h:1", answer: "\x05\x00", err: os.ErrDeadlineExceeded,
			want: "upstream socks5://h:1: read SOCKS5 reply: timed out after 300ms: i/o timeout"},
		{name: "socks method cancelled", url: "socks5://h:1", err: context.Canceled,
			want: "upstream socks5://h:1: read SOCKS5 method: cancelled: context canceled"},
		{name: "http send", url: "http://h:1", unsent: true, err: io.ErrClosedPipe,
			want: "upstream http://h:1: send CONNECT: io: read/write on closed pipe"},
		{name: "http reply", url: "http://h:1", answer: "HTTP/1.1 200 OK\r\n", err: io.EOF, dialToo: true,
			want: "upstream http://h:1: read CONNECT reply: upstream closed the connection"},
		{name: "http reply timeout", url: "http://h:1", err: context.DeadlineExceeded,
			want: "upstream http://h:1: read CONNECT reply: timed out after 300ms: context deadline exceeded"},
		{name: "http reply over the bound when cut", url: "http://h:1", err: io.EOF, dialToo: true,
			answer: "HTTP/1.1 200 OK\r\n" + strings.Repeat("X: "+strings.Repeat("a", 4000)+"\r\n", 8) + "X: " + strings.Repeat("a", 3000),
			want:   "upstream http://h:1: read CONNECT reply: protocol error: reply header over 32768 bytes"},
	}
	target := Target{Host: "example.com", Port: 443}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hs := mustHandshaker(t, tt.url, tt.opts...)
			h, err := hs.Handshake(target)
			if err != nil {
				t.Fatal(err)
			}
			// Send what is due before each read; at the end, unless the error comes while
			// sending.
			for b := []byte(tt.answer); len(b) > 0; {
				h.Sent()
				n := min(len(b), h.Want())
				if err := h.Feed(b[:n]); err != nil {
					t.Fatal(err)
				}
				b = b[n:]
			}
			if !tt.unsent {
				h.Sent()
			}
			if unsent := h.Out() != nil; unsent != tt.unsent {
				t.Fatalf("Out() = %q after %q, want something to send: %v", h.Out(), tt.answer, tt.unsent)
			}
			got := h.IOError(tt.err)
			if got.Error() != tt.want {
				t.Errorf("IOError(%v) = %q, want %q", tt.err, got, tt.want)
			}
			if !errors.Is(got, tt.err) && !strings.Contains(tt.want, "closed the connection") && !strings.Contains(tt.want, "protocol error") {
				t.Errorf("IOError(%v) = %v, which does not wrap it", tt.err, got)
			}
			if !tt.dialToo {
				return
			}
			r := bytes.NewReader([]byte(tt.answer))
			base := func(ctx context.Context, network, addr string) (net.Conn, error) { return &scriptConn{r: r}, nil }
			d, err := New(tt.url, 300*time.Millisecond, base, tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := d.Dial(context.Background(), target); err == nil || err.Error() != tt.want {
				t.Errorf("Dial over %q then EOF = %v, want %q", tt.answer, err, tt.want)
			}
		})
	}
}

// TestHandshakeConnectError: a loop's connect failures read as a Dialer's.
func TestHandshakeConnectError(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, "upstream http://h:1: connect: connection refused"},
		{"timeout", os.ErrDeadlineExceeded, "upstream http://h:1: connect: timed out after 300ms"},
		{"cancelled", context.Canceled, "upstream http://h:1: connect: cancelled"},
	}
	h, err := mustHandshaker(t, "http://h:1").Handshake(Target{Host: "example.com", Port: 443})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		got := h.ConnectError(tt.err)
		if got.Error() != tt.want || !errors.Is(got, tt.err) {
			t.Errorf("%s: ConnectError(%v) = %q, want %q wrapping it", tt.name, tt.err, got, tt.want)
		}
	}
}

// TestHandshaker: the blocking Dialers hand out their settings and handshakes, and a
// bad target fails Handshake as it fails Dial.
func TestHandshaker(t *testing.T) {
	tests := []struct {
		url    string
		target Target
	}{
		{"socks5://proxy.example:1080", Target{Port: 80}},
		{"socks5://proxy.example:1080", Target{Host: strings.Repeat("a", 256), Port: 1}},
		{"socks5://proxy.example:1080", Target{Host: "h"}},
		{"http://proxy.example:3128", Target{Port: 80}},
		{"http://proxy.example:3128", Target{Host: "h"}},
	}
	for _, tt := range tests {
		hs := mustHandshaker(t, tt.url)
		if host := strings.TrimPrefix(strings.TrimPrefix(tt.url, "socks5://"), "http://"); hs.Addr() != host || hs.Timeout() != 300*time.Millisecond {
			t.Errorf("%s: Addr() = %q, Timeout() = %v; want %q, 300ms", tt.url, hs.Addr(), hs.Timeout(), host)
		}
		h, herr := hs.Handshake(tt.target)
		_, derr := hs.Dial(context.Background(), tt.target)
		if h != nil || !errors.Is(herr, ErrTarget) || derr == nil || herr.Error() != derr.Error() {
			t.Errorf("%s: Handshake(%+v) = %v, %v; want nil and Dial's error %v", tt.url, tt.target, h, herr, derr)
		}
	}
}

// TestHandshakeEarlyData: only an http upstream made with Pipeline lets its caller send
// the tunnel's first bytes with the request.
func TestHandshakeEarlyData(t *testing.T) {
	for _, tt := range []struct {
		url   string
		opts  []Option
		early bool
	}{
		{"http://h:3128", []Option{Pipeline()}, true},
		{"http://h:3128", nil, false},
		{"socks5://h:1080", []Option{Pipeline()}, false},
		{"socks5://h:1080", nil, false},
	} {
		d, err := New(tt.url, time.Second, nil, tt.opts...)
		if err != nil {
			t.Fatal(err)
		}
		h, err := d.(Handshaker).Handshake(Target{Addr: netip.MustParseAddrPort("192.0.2.1:443"), Port: 443})
		if err != nil {
			t.Fatal(err)
		}
		if h.EarlyData() != tt.early {
			t.Errorf("%s (%d options): EarlyData() = %v, want %v", tt.url, len(tt.opts), h.EarlyData(), tt.early)
		}
	}
}
