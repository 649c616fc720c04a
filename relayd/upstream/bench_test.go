package upstream

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"
)

// BenchmarkDial measures one Dial's handshake against canned answers (no network): its
// allocations are the per-flow cost of the client side of each protocol.
func BenchmarkDial(b *testing.B) {
	socksOK := []byte{5, 0, 0, 1, 127, 0, 0, 1, 0x1f, 0x90}
	socksAuthOK := []byte{1, 0, 5, 0, 0, 1, 127, 0, 0, 1, 0x1f, 0x90}
	tests := []struct {
		name   string
		url    string
		opts   []Option
		answer []byte
	}{
		{name: "socks5", url: "socks5://127.0.0.1:1", answer: append([]byte{5, 0}, socksOK...)},
		{name: "socks5 auth", url: "socks5://u:p@127.0.0.1:1", answer: append([]byte{5, 2}, socksAuthOK...)},
		{name: "socks5 pipelined auth", url: "socks5://u:p@127.0.0.1:1", opts: []Option{Pipeline()}, answer: append([]byte{5, 2}, socksAuthOK...)},
		{name: "http", url: "http://127.0.0.1:1", answer: []byte("HTTP/1.1 200 Connection established\r\n\r\n")},
		{name: "http auth early bytes", url: "http://u:p@127.0.0.1:1", answer: []byte("HTTP/1.1 200 OK\r\nVia: x\r\n\r\nSSH-2.0-x\r\n")},
	}
	target := Target{Host: "example.com", Port: 443}
	for _, tt := range tests {
		b.Run(tt.name, func(b *testing.B) {
			r := bytes.NewReader(nil)
			conn := &scriptConn{r: r}
			base := func(ctx context.Context, network, addr string) (net.Conn, error) {
				r.Reset(tt.answer)
				return conn, nil
			}
			d, err := New(tt.url, time.Second, base, tt.opts...)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := d.Dial(context.Background(), target); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
