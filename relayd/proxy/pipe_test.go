package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"
)

type wrapped struct {
	net.Conn
	closed *atomic.Int32
}

func (w *wrapped) NetConn() net.Conn { return w.Conn }
func (w *wrapped) Close() error      { w.closed.Add(1); return w.Conn.Close() }

type withWriterTo struct{ net.Conn }

func (w *withWriterTo) WriteTo(dst io.Writer) (int64, error) { return io.Copy(dst, w.Conn) }
func (w *withWriterTo) NetConn() net.Conn                    { return w.Conn }

func TestRaw(t *testing.T) {
	a, b := net.Pipe()
	defer func() { _ = a.Close(); _ = b.Close() }()
	var n atomic.Int32
	if got := Raw(&wrapped{Conn: &wrapped{Conn: a, closed: &n}, closed: &n}); got != a {
		t.Fatalf("raw did not unwrap two NetConn wrappers: %T", got)
	}
	keep := &withWriterTo{Conn: a}
	if got := Raw(&wrapped{Conn: keep, closed: &n}); got != keep {
		t.Fatalf("raw unwrapped past a connection with its own WriteTo: %T", got)
	}
}

type wrapListener struct {
	net.Listener
	closed *atomic.Int32
}

func (l wrapListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &wrapped{Conn: c, closed: l.closed}, nil
}

// A tunnel through a wrapped client connection carries a large payload both ways and
// closes the wrapper (the relay's bookkeeping) when it ends.
func TestTunnelThroughWrappers(t *testing.T) {
	w := newWorld()
	w.echoOrigin(t, "echo.test")
	var closed atomic.Int32
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &Server{Dial: w.dial, Log: w.logger()}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = srv.ServeSOCKS5(ctx, wrapListener{ln, &closed}) }()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	req := append(append([]byte{5, 1, 0, 5, 1, 0, 3, 9}, "echo.test"...), 0, 7)
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 2+10+len("hello\n"))
	if _, err := io.ReadFull(c, head); err != nil || head[3] != 0 {
		t.Fatalf("socks answer % x, %v", head, err)
	}
	payload := make([]byte, 4<<20)
	_, _ = rand.Read(payload)
	go func() {
		_, _ = c.Write(payload)
		_ = c.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("echoed %d bytes (%v), want the %d sent", len(got), err, len(payload))
	}
	deadline := time.Now().Add(2 * time.Second)
	for closed.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the wrapped client connection was never closed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
