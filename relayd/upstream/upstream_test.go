package upstream

import (
	"bufio"
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

	"github.com/kl-egress/kl/tests/testutil"
)

func TestNew(t *testing.T) {
	tests := []struct {
		name    string
		url     string
		want    string // String() of the dialer
		wantErr string // substring of the error
		opts    []Option
	}{
		{name: "http", url: "http://127.0.0.1:3128", want: "http://127.0.0.1:3128"},
		{name: "http trailing slash", url: "http://proxy.example:3128/", want: "http://proxy.example:3128"},
		{name: "http creds hidden", url: "http://u:secret@proxy:3128", want: "http://proxy:3128"},
		{name: "socks5", url: "socks5://[::1]:1080", want: "socks5://[::1]:1080"},
		{name: "socks5 creds", url: "socks5://u:p@h:1080", want: "socks5://h:1080"},
		{name: "https unsupported", url: "https://h:443", wantErr: `unsupported scheme "https"`},
		{name: "socks4 unsupported", url: "socks4://h:1080", wantErr: `unsupported scheme "socks4"`},
		{name: "no scheme", url: "h:3128", wantErr: "want scheme://host:port"},
		{name: "no port", url: "http://h", wantErr: "want host:port"},
		{name: "zero port", url: "http://h:0", wantErr: "bad port"},
		{name: "big port", url: "http://h:70000", wantErr: "bad port"},
		{name: "path", url: "http://h:1/x", wantErr: "has a path"},
		{name: "query", url: "http://h:1?a=b", wantErr: "has a query"},
		{name: "fragment", url: "http://h:1#f", wantErr: "has a fragment"},
		{name: "empty", url: "", wantErr: "want scheme://host:port"},
		{name: "bad url keeps secret", url: "http://u:secret@h:1/%zz", wantErr: "does not parse"},
		{name: "empty socks user", url: "socks5://:p@h:1", wantErr: "empty socks5 username"},
		{name: "socks5 pipelined", url: "socks5://u:p@h:1080", want: "socks5://h:1080", opts: []Option{Pipeline()}},
		{name: "http pipelined", url: "http://u:secret@h:3128", want: "http://h:3128", opts: []Option{Pipeline()}},
		{name: "long socks user", url: "socks5://" + strings.Repeat("u", 256) + ":p@h:1", wantErr: "limited to 255"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := New(tt.url, time.Second, nil, tt.opts...)
			if tt.wantErr != "" {
				if err == nil {
					t.Fatalf("New(%q) = %v, want error containing %q", tt.url, d, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("New(%q) error = %q, want it to contain %q", tt.url, err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "secret") {
					t.Fatalf("New(%q) error leaks the password: %q", tt.url, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("New(%q): %v", tt.url, err)
			}
			if got := d.String(); got != tt.want {
				t.Fatalf("New(%q).String() = %q, want %q", tt.url, got, tt.want)
			}
		})
	}
}

// TestNewHidesMangledCredentials: a password with an unencoded '/', '?', '#' or '%'
// makes url.Parse put part of it in the path, query, fragment, the "port" or its own
// error message; New's error names the problem, never that text.
func TestNewHidesMangledCredentials(t *testing.T) {
	tests := []struct {
		url     string
		wantErr string
		hidden  []string
	}{
		{"http://kl:1234/Secr3t@proxy.example:3128", "has a path", []string{"1234", "Secr3t"}},
		{"socks5://kl:99#TopSecret@proxy.example:1080", "has a fragment", []string{"99", "TopSecret"}},
		{"socks5://kl:99#@proxy.example:1080", "has a fragment", []string{"99"}},
		{"http://kl:77#", "has a fragment", []string{"77"}},
		{"http://kl:abc/TopSecret@proxy.example:3128", "does not parse", []string{"abc", "TopSecret"}},
		{"http://kl:88?TopSecret@proxy.example:3128", "has a query", []string{"88", "TopSecret"}},
		{"http://kl:123456/", "bad port", []string{"123456"}},
		{"http://kl:T%pSecret@proxy.example:3128", "does not parse", []string{"pSecret", "%pS"}},
		{"http://kl:Top Secret@proxy.example:3128", "does not parse", []string{"Top", "Secret"}},
	}
	for _, tt := range tests {
		_, err := New(tt.url, time.Second, nil)
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("New(%q) = %v, want an error saying %q", tt.url, err, tt.wantErr)
			continue
		}
		for _, h := range tt.hidden {
			if strings.Contains(err.Error(), h) {
				t.Errorf("New(%q) = %q, shows %q", tt.url, err, h)
			}
		}
	}
}

func TestTargetString(t *testing.T) {
	tests := []struct {
		name string
		t    Target
		want string
	}{
		{"host", Target{Host: "example.com", Port: 443}, "example.com:443"},
		{"host wins", Target{Host: "example.com", Addr: netip.MustParseAddrPort("192.0.2.1:80"), Port: 443}, "example.com:443"},
		{"ipv4", Target{Addr: netip.MustParseAddrPort("192.0.2.1:80"), Port: 80}, "192.0.2.1:80"},
		{"mapped", Target{Addr: netip.MustParseAddrPort("[::ffff:192.0.2.1]:80"), Port: 80}, "192.0.2.1:80"},
		{"ipv6", Target{Addr: netip.MustParseAddrPort("[2001:db8::1]:443")}, "[2001:db8::1]:443"},
		{"ipv6 host literal", Target{Host: "::1", Port: 8080}, "[::1]:8080"},
	}
	for _, tt := range tests {
		if got := tt.t.String(); got != tt.want {
			t.Errorf("%s: %#v.String() = %q, want %q", tt.name, tt.t, got, tt.want)
		}
	}
}

// fakeServer accepts one connection at a time on loopback and runs handle on it.
func fakeServer(t *testing.T, handle func(c net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Serve(t, ln, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		handle(c)
	})
	return ln.Addr().String()
}

func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

func TestHTTPConnect(t *testing.T) {
	type result struct{ reqLine, auth string }
	seen := make(chan result, 1)
	reply := func(answer string) func(c net.Conn) {
		return func(c net.Conn) {
			br := bufio.NewReader(c)
			line, _ := br.ReadString('\n')
			var auth string
			for {
				h, err := br.ReadString('\n')
				if err != nil || h == "\r\n" {
					break
				}
				if v, ok := strings.CutPrefix(h, "Proxy-Authorization: "); ok {
					auth = strings.TrimSpace(v)
				}
			}
			select {
			case seen <- result{strings.TrimSpace(line), auth}:
			default:
			}
			if answer == "" {
				time.Sleep(3 * time.Second) // never answer
				return
			}
			_, _ = io.WriteString(c, answer)
			// Echo whatever comes next (the tunnel).
			_, _ = io.Copy(c, br)
		}
	}
	tests := []struct {
		name     string
		answer   string
		creds    string
		target   Target
		notText  string // the error must not contain it
		wantLine string
		wantAuth string
		wantErr  error
		errText  string
		early    string // bytes the upstream sent right after the 200
	}{
		{name: "ok host", answer: "HTTP/1.1 200 Connection established\r\n\r\n", target: Target{Host: "example.com", Port: 443},
			wantLine: "CONNECT example.com:443 HTTP/1.1"},
		{name: "ok ipv6 with auth", answer: "HTTP/1.0 200 OK\r\nProxy-Agent: x\r\n\r\n", creds: "alice:s3cret@",
			target:   Target{Addr: netip.MustParseAddrPort("[2001:db8::1]:443"), Port: 443},
			wantLine: "CONNECT [2001:db8::1]:443 HTTP/1.1", wantAuth: "Basic YWxpY2U6czNjcmV0"},
		{name: "early bytes kept", answer: "HTTP/1.1 200 OK\r\n\r\nSSH-2.0-banner\r\n", target: Target{Host: "h", Port: 22},
			wantLine: "CONNECT h:22 HTTP/1.1", early: "SSH-2.0-banner\r\n"},
		{name: "407 without creds", answer: "HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n",
			target: Target{Host: "h", Port: 443}, wantErr: ErrAuth, errText: "none are configured"},
		{name: "407 with creds", answer: "HTTP/1.1 407 Proxy Authentication Required\r\n\r\n", creds: "a:b@",
			target: Target{Host: "h", Port: 443}, wantErr: ErrAuth, errText: "credentials rejected"},
		{name: "403", answer: "HTTP/1.1 403 Forbidden\r\nContent-Length: 3\r\n\r\nno\n",
			target: Target{Host: "h", Port: 25}, wantErr: ErrRefused, errText: "403 Forbidden"},
		{name: "502", answer: "HTTP/1.1 502 Bad Gateway\r\n\r\n",
			target: Target{Host: "h", Port: 443}, wantErr: ErrRefused, errText: "502 Bad Gateway"},
		// The reason phrase is the upstream's own text and may name the target; errors
		// (audit reasons) give the standard text instead.
		{name: "502 naming the target", answer: "HTTP/1.1 502 cannot reach secret.example\r\n\r\n",
			target: Target{Host: "secret.example", Port: 443}, wantErr: ErrRefused, errText: "502 Bad Gateway", notText: "secret"},
		{name: "garbage naming the target", answer: "HTTP/1.1 5xx secret.example\r\n\r\n",
			target: Target{Host: "secret.example", Port: 443}, wantErr: ErrProtocol, errText: "bad status line", notText: "secret"},
		{name: "garbage", answer: "SSH-2.0-OpenSSH\r\n\r\n",
			target: Target{Host: "h", Port: 443}, wantErr: ErrProtocol, errText: "bad status line"},
		{name: "huge header", answer: "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", 5000) + "\r\n\r\n",
			target: Target{Host: "h", Port: 443}, wantErr: ErrProtocol, errText: "header line over 4096 bytes"},
		{name: "silent upstream", answer: "",
			target: Target{Host: "h", Port: 443}, errText: "timed out"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := fakeServer(t, reply(tt.answer))
			d, err := New("http://"+tt.creds+addr, 300*time.Millisecond, nil)
			if err != nil {
				t.Fatal(err)
			}
			c, err := d.Dial(context.Background(), tt.target)
			if tt.wantErr != nil || tt.errText != "" {
				if err == nil {
					_ = c.Close()
					t.Fatalf("Dial = nil error, want %v", tt.wantErr)
				}
				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
					t.Errorf("Dial error %q is not %v", err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.errText) || !strings.Contains(err.Error(), "upstream http://"+addr) {
					t.Errorf("Dial error %q, want it to name the upstream and contain %q", err, tt.errText)
				}
				if strings.Contains(err.Error(), tt.target.Host+":") || strings.Contains(err.Error(), "b@") ||
					(tt.notText != "" && strings.Contains(err.Error(), tt.notText)) {
					t.Errorf("Dial error %q names the target or credentials", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Dial: %v", err)
			}
			defer func() { _ = c.Close() }()
			r := <-seen
			if r.reqLine != tt.wantLine || r.auth != tt.wantAuth {
				t.Errorf("upstream saw %q auth %q, want %q auth %q", r.reqLine, r.auth, tt.wantLine, tt.wantAuth)
			}
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			if tt.early != "" {
				buf := make([]byte, len(tt.early))
				if _, err := io.ReadFull(c, buf); err != nil || string(buf) != tt.early {
					t.Fatalf("early bytes = %q, %v; want %q", buf, err, tt.early)
				}
			}
			if _, err := io.WriteString(c, "ping"); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 4)
			if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
				t.Fatalf("echo = %q, %v", buf, err)
			}
		})
	}
	// Drain in case a case left a result behind.
	select {
	case <-seen:
	default:
	}
}

func TestEarlyBytesThroughIOCopy(t *testing.T) {
	// With early bytes, io.Copy must deliver them and then the rest of the stream.
	addr := fakeServer(t, func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			l, err := br.ReadString('\n')
			if err != nil || l == "\r\n" {
				break
			}
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\n\r\nfirst-")
		time.Sleep(50 * time.Millisecond)
		_, _ = io.WriteString(c, "second")
	})
	d, err := New("http://"+addr, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.Dial(context.Background(), Target{Host: "h", Port: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close() }()
	var sb strings.Builder
	if _, err := io.Copy(&sb, c); err != nil {
		t.Fatal(err)
	}
	if sb.String() != "first-second" {
		t.Fatalf("copied %q, want %q", sb.String(), "first-second")
	}
}

// TestUnbuffer: the early bytes are handed over once, with the underlying connection;
// the wrapper's reads then go on with the stream after them.
func TestUnbuffer(t *testing.T) {
	a, b := net.Pipe()
	defer func() { _ = a.Close(); _ = b.Close() }()
	c := &bufferedConn{Conn: a, buf: []byte("early")}
	pending, rest := c.Unbuffer()
	if string(pending) != "early" || rest != a {
		t.Fatalf("Unbuffer = %q, %T; want %q and the underlying connection", pending, rest, "early")
	}
	go func() { _, _ = b.Write([]byte("late")) }()
	buf := make([]byte, 8)
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "late" {
		t.Fatalf("read after Unbuffer = %q, %v; want %q", buf[:n], err, "late")
	}
}

func TestDialErrors(t *testing.T) {
	for _, scheme := range []string{"http", "socks5"} {
		t.Run(scheme+" down", func(t *testing.T) {
			d, err := New(scheme+"://"+closedPort(t), time.Second, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = d.Dial(context.Background(), Target{Host: "h", Port: 1})
			if err == nil || !strings.Contains(err.Error(), "connection refused") || !strings.Contains(err.Error(), d.String()) {
				t.Fatalf("Dial via a closed port = %v, want a refused error naming %s", err, d)
			}
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("Dial via a closed port = %v, which does not wrap ECONNREFUSED", err)
			}
		})
		t.Run(scheme+" connect timeout", func(t *testing.T) {
			slow := func(ctx context.Context, network, addr string) (net.Conn, error) {
				<-ctx.Done()
				return nil, &net.OpError{Op: "dial", Net: network, Err: ctx.Err()}
			}
			d, err := New(scheme+"://192.0.2.1:1", 100*time.Millisecond, slow)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_, err = d.Dial(context.Background(), Target{Host: "h", Port: 1})
			if err == nil || !strings.Contains(err.Error(), "connect: timed out after 100ms") || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Dial through a silent network = %v", err)
			}
			// A bound far above 100ms: it tells a timeout from a hang, not speed (a loaded
			// machine has starved this goroutine for over a second).
			if took := time.Since(start); took > 10*time.Second {
				t.Fatalf("connect timeout of 100ms took %v", took)
			}
		})
		t.Run(scheme+" cancelled", func(t *testing.T) {
			addr := fakeServer(t, func(c net.Conn) { time.Sleep(2 * time.Second) })
			d, err := New(scheme+"://"+addr, 5*time.Second, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(100*time.Millisecond, cancel)
			start := time.Now()
			_, err = d.Dial(ctx, Target{Host: "h", Port: 1})
			if err == nil || time.Since(start) > time.Second {
				t.Fatalf("Dial with a cancelled context = %v after %v, want a prompt error", err, time.Since(start))
			}
		})
		t.Run(scheme+" bad target", func(t *testing.T) {
			d, _ := New(scheme+"://127.0.0.1:1", time.Second, nil)
			_, err := d.Dial(context.Background(), Target{Port: 80})
			if !errors.Is(err, ErrTarget) {
				t.Fatalf("Dial(no host) = %v, want ErrTarget", err)
			}
		})
	}
}

// TestTimeoutNamesTheBound: a caller's deadline that comes before the upstream's own
// timeout (kl-relayd's connect timeout in front of an upstream given a minute) is the
// bound that expires, and the error names it, in the connect and in the handshake.
func TestTimeoutNamesTheBound(t *testing.T) {
	silent := fakeServer(t, func(c net.Conn) { io.Copy(io.Discard, c) })
	slow := func(ctx context.Context, network, addr string) (net.Conn, error) {
		<-ctx.Done()
		return nil, &net.OpError{Op: "dial", Net: network, Err: ctx.Err()}
	}
	for _, tc := range []struct {
		name, url string
		base      DialFunc
		want      string
	}{
		{"http connect", "http://192.0.2.1:1", slow, "connect: timed out after 200ms"},
		{"socks5 connect", "socks5://192.0.2.1:1", slow, "connect: timed out after 200ms"},
		{"http handshake", "http://" + silent, nil, "read CONNECT reply: timed out after 200ms"},
		{"socks5 handshake", "socks5://" + silent, nil, "read SOCKS5 method: timed out after 200ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := New(tc.url, time.Minute, tc.base)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			_, err = d.Dial(ctx, Target{Host: "h", Port: 1})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Dial under a 200ms deadline = %v, want %q", err, tc.want)
			}
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("Dial under a 200ms deadline = %v, which wraps no deadline error", err)
			}
		})
	}
	// An event loop tells a Handshake its shorter bound itself.
	h, err := mustHandshaker(t, "http://h:1").Handshake(Target{Host: "example.com", Port: 443})
	if err != nil {
		t.Fatal(err)
	}
	h.Bound(time.Minute) // longer than the upstream's 300ms: changes nothing
	if got, want := h.ConnectError(os.ErrDeadlineExceeded).Error(), "upstream http://h:1: connect: timed out after 300ms"; got != want {
		t.Errorf("ConnectError after Bound(1m) = %q, want %q", got, want)
	}
	h.Bound(100 * time.Millisecond)
	if got, want := h.ConnectError(os.ErrDeadlineExceeded).Error(), "upstream http://h:1: connect: timed out after 100ms"; got != want {
		t.Errorf("ConnectError after Bound(100ms) = %q, want %q", got, want)
	}
	h.Sent()
	if got, want := h.IOError(os.ErrDeadlineExceeded).Error(), "upstream http://h:1: read CONNECT reply: timed out after 100ms: i/o timeout"; got != want {
		t.Errorf("IOError after Bound(100ms) = %q, want %q", got, want)
	}
}

func addrPort(t *testing.T, ip string, port int) netip.AddrPort {
	t.Helper()
	return netip.AddrPortFrom(netip.MustParseAddr(ip), uint16(port))
}
