package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/kl-egress/kl/relayd/upstream"
)

// TestTunnelEarlyBytes: the bytes a client sends right behind a CONNECT or an upgrade
// request, which the proxy read ahead with the request, reach the destination before
// anything else once the tunnel starts; and a destination that does not take them ends
// the exchange within the answer deadline instead of holding the handler and both
// connections. (Before, they were written with no deadline at all.)
func TestTunnelEarlyBytes(t *testing.T) {
	const early = "EARLY-BYTES-OF-THE-CLIENT"
	upgrade := "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"
	tests := []struct {
		name    string
		request string
		upgrade bool // the destination reads the request and answers 101 first
		reads   bool // the destination reads the tunnel
	}{
		{"CONNECT, the destination reads", "CONNECT c.test:443 HTTP/1.1\r\nHost: c.test:443\r\n\r\n", false, true},
		{"CONNECT, the destination does not read", "CONNECT c.test:443 HTTP/1.1\r\nHost: c.test:443\r\n\r\n", false, false},
		{"upgrade, the destination reads", "GET http://u.test/ HTTP/1.1\r\nHost: u.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", true, true},
		{"upgrade, the destination does not read", "GET http://u.test/ HTTP/1.1\r\nHost: u.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := make(chan string, 1)
			end := make(chan struct{})
			defer close(end)
			dial := func(ctx context.Context, _ upstream.Target) (net.Conn, error) {
				proxySide, dest := net.Pipe() // a write waits until the destination reads it
				go func() {
					defer dest.Close()
					if tt.upgrade {
						if _, err := http.ReadRequest(bufio.NewReader(dest)); err != nil {
							return
						}
						if _, err := io.WriteString(dest, upgrade); err != nil {
							return
						}
					}
					if tt.reads {
						b := make([]byte, len(early))
						_ = dest.SetReadDeadline(time.Now().Add(10 * time.Second))
						n, _ := io.ReadFull(dest, b)
						got <- string(b[:n])
					}
					<-end
				}()
				return proxySide, nil
			}
			w := newWorld()
			httpAddr, _ := w.serve(t, &Server{Dial: dial, HandshakeTimeout: 200 * time.Millisecond})
			c, br := dialProxy(t, httpAddr)
			if _, err := io.WriteString(c, tt.request+early); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("answer: %v", err)
			}
			if want := map[bool]int{false: 200, true: 101}[tt.upgrade]; resp.StatusCode != want {
				t.Fatalf("answer %d, want %d", resp.StatusCode, want)
			}
			if tt.reads {
				select {
				case g := <-got:
					if g != early {
						t.Errorf("the destination read %q first, want %q", g, early)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the destination never got the early bytes")
				}
				return
			}
			// The proxy gives up on the destination and ends the client's connection.
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, err = io.Copy(io.Discard, br)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("the exchange still holds the client: the early bytes' write has no deadline")
			}
		})
	}
}
