package sniff

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// pair returns the server side of a loopback TCP connection and the client side.
func pair(t *testing.T) (srv *net.TCPConn, cli *net.TCPConn) {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	cli, err = net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		t.Fatal(err)
	}
	srv, err = ln.AcceptTCP()
	if err != nil {
		t.Fatal(err)
	}
	_ = cli.SetNoDelay(true)
	t.Cleanup(func() { _ = cli.Close(); _ = srv.Close() })
	return srv, cli
}

func TestHostLive(t *testing.T) {
	hello := clientHello(t, &tls.Config{ServerName: "live.example.com",
		CurvePreferences: []tls.CurveID{tls.X25519MLKEM768, tls.X25519}})
	split := resplit(t, hello, 300)
	tests := []struct {
		name   string
		chunks [][]byte // written with a pause between them
		close  bool     // client closes after writing
		wait   time.Duration
		want   string
		maxDur time.Duration
	}{
		{name: "tls in one segment", chunks: [][]byte{hello}, wait: time.Second, want: "live.example.com", maxDur: 500 * time.Millisecond},
		{name: "tls in three segments", chunks: [][]byte{hello[:3], hello[3:700], hello[700:]}, wait: 2 * time.Second, want: "live.example.com", maxDur: time.Second},
		{name: "tls records across segments", chunks: [][]byte{split[:310], split[310:900], split[900:]}, wait: 2 * time.Second, want: "live.example.com", maxDur: time.Second},
		{name: "http in two segments", chunks: [][]byte{[]byte("GET / HTTP/1.1\r\nAcc"), []byte("ept: */*\r\nHost: Web.Example:8080\r\n\r\n")}, wait: 2 * time.Second, want: "web.example", maxDur: time.Second},
		{name: "server-first protocol", wait: 150 * time.Millisecond, want: "", maxDur: 400 * time.Millisecond},
		{name: "something else", chunks: [][]byte{[]byte("\x00\x00\x00\x01binary")}, wait: 2 * time.Second, want: "", maxDur: 500 * time.Millisecond},
		{name: "stalls mid hello", chunks: [][]byte{hello[:100]}, wait: 200 * time.Millisecond, want: "", maxDur: 600 * time.Millisecond},
		{name: "client closes silently", close: true, wait: 2 * time.Second, want: "", maxDur: 500 * time.Millisecond},
		{name: "client closes mid hello", chunks: [][]byte{hello[:100]}, close: true, wait: 2 * time.Second, want: "", maxDur: 500 * time.Millisecond},
		{name: "zero wait sees what is there", chunks: [][]byte{hello}, wait: 0, want: "live.example.com", maxDur: 200 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, cli := pair(t)
			var sent []byte
			for _, c := range tt.chunks {
				sent = append(sent, c...)
			}
			go func() {
				for i, c := range tt.chunks {
					if i > 0 {
						time.Sleep(40 * time.Millisecond)
					}
					_, _ = cli.Write(c)
				}
				if tt.close {
					_ = cli.CloseWrite()
				}
			}()
			if tt.wait == 0 {
				time.Sleep(50 * time.Millisecond) // let the bytes arrive
			}
			start := time.Now()
			got, err := Host(srv, tt.wait)
			took := time.Since(start)
			if err != nil || got != tt.want {
				t.Fatalf("Host = %q, %v; want %q", got, err, tt.want)
			}
			if took > tt.maxDur {
				t.Fatalf("Host took %v, want at most %v", took, tt.maxDur)
			}
			// Nothing was consumed, and the deadline is cleared: the relay reads it all.
			if len(sent) > 0 {
				buf := make([]byte, len(sent))
				_ = srv.SetReadDeadline(time.Now().Add(2 * time.Second))
				if _, err := io.ReadFull(srv, buf); err != nil || !bytes.Equal(buf, sent) {
					t.Fatalf("after Host, read %d bytes, %v; want the %d sent bytes intact", len(buf), err, len(sent))
				}
				_ = srv.SetReadDeadline(time.Time{})
			}
			// The connection stays usable both ways.
			go func() { _, _ = cli.Write([]byte("z")) }()
			var one [1]byte
			_ = srv.SetReadDeadline(time.Now().Add(2 * time.Second))
			if !tt.close {
				if _, err := io.ReadFull(srv, one[:]); err != nil || one[0] != 'z' {
					t.Fatalf("read after Host = %q, %v", one, err)
				}
			}
		})
	}
}

// TestHostUnreadableName: a client that names a host the relay cannot read as one name
// gets ErrMalformed, never "" (a flow without a name, which domain rules let through):
// the relay refuses it. The error does not quote the name.
func TestHostUnreadableName(t *testing.T) {
	sni := []byte{0, 0}
	tests := []struct {
		name string
		send []byte
	}{
		{"two Host headers", []byte("GET / HTTP/1.1\r\nHost: ok.example\r\nHost: blocked.example\r\n\r\n")},
		{"Host with two ports", []byte("GET / HTTP/1.1\r\nHost: blocked.example:80:80\r\n\r\n")},
		{"Host name in brackets", []byte("GET / HTTP/1.1\r\nHost: [blocked.example]:80\r\n\r\n")},
		{"header line without a colon", []byte("GET / HTTP/1.1\r\nbogus\r\nHost: blocked.example\r\n\r\n")},
		{"two SNI host_names", rawHello(sni, serverNames("ok.example", "blocked.example"))},
		{"SNI not a DNS name", withServerName(t, "blocked.example:443")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, cli := pair(t)
			go func() { _, _ = cli.Write(tt.send) }()
			got, err := Host(srv, 2*time.Second)
			if got != "" || !errors.Is(err, ErrMalformed) {
				t.Fatalf("Host = %q, %v; want ErrMalformed", got, err)
			}
			if strings.Contains(err.Error(), "blocked.example") {
				t.Fatalf("Host's error %q quotes the name", err)
			}
		})
	}
}

// TestHostBeyondMaxPeek: a well-formed message whose name comes only after MaxPeek bytes
// (a long URL, big headers before Host) is decided without a name, not refused.
func TestHostBeyondMaxPeek(t *testing.T) {
	sni := []byte{0, 0}
	padding := []byte{0, 0x15}
	for _, tt := range []struct {
		name string
		send []byte
	}{
		{"Host after MaxPeek bytes", []byte("GET / HTTP/1.1\r\nX-Pad: " + strings.Repeat("p", MaxPeek) + "\r\nHost: api.example\r\n\r\n")},
		{"request line longer than MaxPeek", []byte("GET /search?q=" + strings.Repeat("a", 20<<10) + " HTTP/1.1\r\nHost: api.example\r\n\r\n")},
		{"SNI after MaxPeek bytes", rawHello(padding, make([]byte, MaxPeek), sni, serverNames("api.example"))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv, cli := pair(t)
			go func() { _, _ = cli.Write(tt.send) }()
			if got, err := Host(srv, 2*time.Second); got != "" || err != nil {
				t.Fatalf("Host = %q, %v; want no name and no error", got, err)
			}
		})
	}
}

func TestHostDeadlineCleared(t *testing.T) {
	srv, cli := pair(t)
	if h, err := Host(srv, 20*time.Millisecond); h != "" || err != nil {
		t.Fatalf("Host on a silent client = %q, %v", h, err)
	}
	// A read after the timed-out sniff must block for data, not fail on the old deadline.
	go func() {
		time.Sleep(100 * time.Millisecond)
		_, _ = cli.Write([]byte("late"))
	}()
	buf := make([]byte, 4)
	if _, err := io.ReadFull(srv, buf); err != nil || string(buf) != "late" {
		t.Fatalf("read after a timed-out sniff = %q, %v", buf, err)
	}
}

func BenchmarkHost(b *testing.B) {
	hello := clientHello(b, &tls.Config{ServerName: "bench.example.com"})
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	cli, err := net.DialTCP("tcp", nil, ln.Addr().(*net.TCPAddr))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cli.Close() }()
	srv, err := ln.AcceptTCP()
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = srv.Close() }()
	if _, err := cli.Write(hello); err != nil {
		b.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	b.ReportAllocs()
	for b.Loop() {
		if h, err := Host(srv, time.Second); h != "bench.example.com" || err != nil {
			b.Fatalf("Host = %q, %v", h, err)
		}
	}
}
