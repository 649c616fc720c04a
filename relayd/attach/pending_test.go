package attach

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"
)

// addrConn is a pending connection from a given address that records its Close.
type addrConn struct {
	net.Conn
	addr   net.Addr
	closed bool
}

func (c *addrConn) RemoteAddr() net.Addr { return c.addr }
func (c *addrConn) Close() error         { c.closed = true; return nil }

// TestPendingEviction: a connection over a bound of pending connections evicts the
// oldest one of its own source when that source is at its bound, else the oldest one of
// the source with the most; it is never refused.
func TestPendingEviction(t *testing.T) {
	type fill struct {
		src string
		n   int
	}
	tests := []struct {
		name string
		fill []fill // pending connections, oldest first
		add  string
		want int // index (oldest first) of the connection evicted; -1 none
	}{
		{"room", []fill{{"192.0.2.1:1", 3}}, "192.0.2.1:2", -1},
		{"source at its bound", []fill{{"192.0.2.2:1", 1}, {"192.0.2.1:1", maxPendingPerSource}}, "192.0.2.1:9", 1},
		{"same /64", []fill{{"[2001:db8::1]:1", maxPendingPerSource}}, "[2001:db8::ffff]:2", 0},
		{"mapped IPv4", []fill{{"[::ffff:192.0.2.1]:1", maxPendingPerSource}}, "192.0.2.1:2", 0},
		{"other /64", []fill{{"[2001:db8::1]:1", maxPendingPerSource}}, "[2001:db8:0:1::1]:2", -1},
		{"all full: the busiest source pays", []fill{{"192.0.2.3:1", 1}, {"192.0.2.4:1", maxPendingPerSource}, {"192.0.2.5:1", maxPendingPerSource},
			{"192.0.2.6:1", maxPendingPerSource}, {"192.0.2.7:1", maxPending - 1 - 3*maxPendingPerSource}}, "198.51.100.1:1", 1},
	}
	from := func(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p pendingConns
			var conns []*addrConn
			for _, fl := range tt.fill {
				for range fl.n {
					c := &addrConn{addr: from(fl.src)}
					if _, ev := p.add(c); ev != nil {
						t.Fatalf("filling: %s evicted", ev.RemoteAddr())
					}
					conns = append(conns, c)
				}
			}
			_, ev := p.add(&addrConn{addr: from(tt.add)})
			got := -1
			for i, c := range conns {
				if !c.closed {
					continue
				}
				if got != -1 {
					t.Errorf("connections %d and %d both evicted", got, i)
				}
				got = i
				if ev != net.Conn(c) {
					t.Errorf("add closed connection %d but returned %v as the evicted one", i, ev)
				}
			}
			if got != tt.want {
				t.Errorf("a connection from %s evicted connection %d, want %d", tt.add, got, tt.want)
			}
			wantN := len(conns) + 1
			if tt.want >= 0 {
				wantN--
			}
			if len(p.conns) != wantN {
				t.Errorf("%d connections pending after the add, want %d", len(p.conns), wantN)
			}
		})
	}
}

// TestPreAuthSlots: connections that stay silent after connecting (or the whole pending
// bound of them, from the operator's own address) do not keep a valid client out.
func TestPreAuthSlots(t *testing.T) {
	f := newFixture(t, clientAll)
	for range maxPending {
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	time.Sleep(100 * time.Millisecond) // the daemon accepted them
	c, err := NewClient(ClientOptions{Server: f.addr, CAFile: f.pki.CAFile, Token: testToken, Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(5 * time.Second)
	for !f.srv.Live(payWorkload) {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("a valid token cannot attach behind %d silent connections: %v", maxPending, err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("a valid token did not attach behind %d silent connections within 5s", maxPending)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFirstBytesTimeout: a connection that sends nothing is closed after
// firstBytesTimeout, well before the handshake's own timeout.
func TestFirstBytesTimeout(t *testing.T) {
	// Restored after the fixture's cleanup, once its server stopped reading it.
	was := firstBytesTimeout
	t.Cleanup(func() { firstBytesTimeout = was })
	firstBytesTimeout = 100 * time.Millisecond
	f := newFixture(t, clientAll)
	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(8 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("read on a silent connection = %v, want the daemon's close (EOF)", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the daemon closed a silent connection after %v, want it near firstBytesTimeout (%v), not the handshake timeout", d, firstBytesTimeout)
	}
}

// TestShutdownClosesHandshakes: a connection still in its handshake or authentication
// does not hold the daemon's shutdown until its timeouts (10s) expire, whatever stage it
// stopped at.
func TestShutdownClosesHandshakes(t *testing.T) {
	// A policy larger than a stream's window: a peer that does not read it keeps the
	// daemon's first write blocked.
	big := clientAll + strings.Repeat("# "+strings.Repeat("x", 1021)+"\n", 2048)
	tests := []struct {
		name   string
		policy string
		stage  func(t *testing.T, raw net.Conn, tc *tls.Config)
	}{
		{"silent after connecting", clientAll, func(t *testing.T, raw net.Conn, tc *tls.Config) {}},
		{"silent after TLS", clientAll, func(t *testing.T, raw net.Conn, tc *tls.Config) {
			handshake(t, raw, tc)
		}},
		{"silent after opening the control stream", clientAll, func(t *testing.T, raw net.Conn, tc *tls.Config) {
			mux := muxClient(t, handshake(t, raw, tc))
			if _, err := mux.OpenStream(); err != nil {
				t.Fatal(err)
			}
		}},
		{"not reading the policy", big, func(t *testing.T, raw net.Conn, tc *tls.Config) {
			mux := muxClient(t, handshake(t, raw, tc))
			ctrl, err := mux.OpenStream()
			if err != nil {
				t.Fatal(err)
			}
			ctrl.SetDeadline(time.Now().Add(5 * time.Second))
			writeFrame(ctrl, Hello{Version: Version, Token: testToken})
			var w Welcome
			if err := readFrame(bufio.NewReader(ctrl), maxSmallFrame, &w); err != nil || w.Error != "" {
				t.Fatalf("welcome = %+v, %v", w, err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, tt.policy)
			c, err := NewClient(ClientOptions{Server: f.addr, CAFile: f.pki.CAFile, Token: testToken})
			if err != nil {
				t.Fatal(err)
			}
			raw, err := net.Dial("tcp", f.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			tt.stage(t, raw, c.tls)
			time.Sleep(100 * time.Millisecond) // the daemon is waiting on the peer
			start := time.Now()
			f.stop()
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("Serve took %v to return after its context ended", d)
			}
		})
	}
}

func handshake(t *testing.T, raw net.Conn, tc *tls.Config) *tls.Conn {
	t.Helper()
	c := tls.Client(raw, tc)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := c.Handshake(); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Time{})
	return c
}

func muxClient(t *testing.T, c net.Conn) *yamux.Session {
	t.Helper()
	cfg := yamux.DefaultConfig()
	cfg.LogOutput = io.Discard
	mux, err := yamux.Client(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mux.Close() })
	return mux
}
