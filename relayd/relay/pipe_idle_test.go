package relay

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// TestPipeIdleWrites checks the idle timeout when a direction is blocked writing to a
// client that reads nothing (the flow ends, whether the client's own direction has ended
// with a half-close or waits to read) or reads slowly but steadily for several idle
// timeouts (the flow is not ended, and every byte arrives in order), and when neither
// side sends anything. A flow the timeout ends is reset, so the client cannot take the
// cut for the server's clean end of the stream.
func TestPipeIdleWrites(t *testing.T) {
	// Every read of the slow client is a delivery, a few milliseconds apart: well inside
	// the idle timeout even on a loaded machine.
	const idle = 600 * time.Millisecond
	tests := []struct {
		name      string
		halfClose bool          // the client half-closes after its request
		size      int           // bytes the server sends before it closes; 0: until the relay closes; -1: none, it waits
		readEvery time.Duration // the client reads up to 32 KiB this often; 0: never
		wantErr   error
	}{
		{name: "half-closed, client not reading", halfClose: true, wantErr: errIdle},
		{name: "open, client not reading", wantErr: errIdle},
		{name: "half-closed, slow steady client", halfClose: true, size: 16 << 20, readEvery: 4 * time.Millisecond},
		{name: "open, slow steady client", size: 16 << 20, readEvery: 4 * time.Millisecond},
		{name: "open, both silent", size: -1, wantErr: errIdle},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client, ra := tcpPair(t)
			rb, server := tcpPair(t)
			// Small buffers between the relay and the client: the relay's writes block
			// after a few tens of KiB instead of after the kernel's autotuned megabytes.
			if err := client.SetReadBuffer(32 << 10); err != nil {
				t.Fatal(err)
			}
			if err := ra.SetWriteBuffer(32 << 10); err != nil {
				t.Fatal(err)
			}
			go serveStream(server, tt.size)

			type result struct {
				up, down int64
				err      error
				took     time.Duration
			}
			done := make(chan result, 1)
			r := &Relay{o: Options{IdleTimeout: idle}}
			start := time.Now()
			r.pipeAsync(ra, rb, func(up, down int64, err error) {
				done <- result{up, down, err, time.Since(start)}
			})

			if _, err := client.Write([]byte("GET")); err != nil {
				t.Fatal(err)
			}
			if tt.halfClose {
				if err := client.CloseWrite(); err != nil {
					t.Fatal(err)
				}
			}
			var read time.Duration
			if tt.readEvery > 0 {
				got, err := readSlowly(client, tt.readEvery)
				read = time.Since(start)
				if err != nil || got != tt.size {
					t.Errorf("client read %d bytes (%v), want %d intact", got, err, tt.size)
				}
				if read < 3*idle {
					t.Errorf("client read everything in %v, want a read that spans at least 3 idle timeouts (%v)", read, 3*idle)
				}
				if !tt.halfClose {
					client.CloseWrite() // ends the client's direction cleanly
				}
			}

			var res result
			select {
			case res = <-done:
			case <-time.After(read + 10*idle):
				t.Fatalf("flow still running %v after the idle timeout (%v)", 10*idle, idle)
			}
			if !errors.Is(res.err, tt.wantErr) || (tt.wantErr == nil && res.err != nil) {
				t.Errorf("pipe err = %v, want %v", res.err, tt.wantErr)
			}
			if res.up != 3 {
				t.Errorf("pipe up = %d bytes, want 3", res.up)
			}
			if tt.wantErr == errIdle && res.took > 3*idle {
				t.Errorf("idle flow ended after %v, want within 3 idle timeouts (%v)", res.took, 3*idle)
			}
			if tt.size > 0 && res.down != int64(tt.size) {
				t.Errorf("pipe down = %d bytes, want %d", res.down, tt.size)
			}
			if tt.wantErr == errIdle {
				client.SetReadDeadline(time.Now().Add(5 * time.Second))
				_, err := io.Copy(io.Discard, client)
				if !errors.Is(err, syscall.ECONNRESET) {
					t.Errorf("client's read after the idle timeout: %v, want a reset", err)
				}
			}
		})
	}
}

// tcpPair returns the two ends of a loopback TCP connection, closed at the end of the test.
func tcpPair(t *testing.T) (dialed, accepted *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// pattern fills p with the stream's bytes from offset off (a period of 251 bytes, which
// no buffer or chunk size divides).
func pattern(p []byte, off int) {
	for i := range p {
		p[i] = byte((off + i) % 251)
	}
}

// serveStream reads the 3-byte request, then writes size bytes of pattern and closes, or
// with size 0 writes until a write fails, or with size -1 waits for the relay to close.
func serveStream(c net.Conn, size int) {
	defer c.Close()
	if _, err := io.ReadFull(c, make([]byte, 3)); err != nil {
		return
	}
	if size < 0 {
		_, _ = io.Copy(io.Discard, c)
		return
	}
	buf := make([]byte, 64<<10)
	for off := 0; size == 0 || off < size; {
		n := len(buf)
		if size > 0 {
			n = min(n, size-off)
		}
		pattern(buf[:n], off)
		if _, err := c.Write(buf[:n]); err != nil {
			return
		}
		off += n
	}
}

// readSlowly reads c to EOF, at most 32 KiB every period, and returns how many bytes
// arrived in pattern order.
func readSlowly(c net.Conn, period time.Duration) (int, error) {
	buf := make([]byte, 32<<10)
	want := make([]byte, len(buf))
	got := 0
	for {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := c.Read(buf)
		pattern(want[:n], got)
		for i := range n {
			if buf[i] != want[i] {
				return got + i, errors.New("byte out of pattern")
			}
		}
		got += n
		if err == io.EOF {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		time.Sleep(period)
	}
}

// TestPipeBothWritesBlocked: when both ends write and neither reads, both directions
// of the relay end up blocked writing, and no read deadline is left to notice: the
// write deadlines end the flow as idle, with a reset.
func TestPipeBothWritesBlocked(t *testing.T) {
	const idle = 300 * time.Millisecond
	client, ra := tcpPair(t)
	rb, server := tcpPair(t)
	done := make(chan error, 1)
	r := &Relay{o: Options{IdleTimeout: idle}}
	start := time.Now()
	r.pipeAsync(ra, rb, func(_, _ int64, err error) { done <- err })
	block := make([]byte, 64<<10)
	writeAll := func(c net.Conn) error {
		c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		for {
			if _, err := c.Write(block); err != nil {
				return err
			}
		}
	}
	go writeAll(server)
	werr := writeAll(client)
	select {
	case err := <-done:
		if !errors.Is(err, errIdle) {
			t.Errorf("pipe err = %v, want the idle timeout", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("flow still running 5s after both ends stopped reading")
	}
	if !errors.Is(werr, syscall.ECONNRESET) && !errors.Is(werr, syscall.EPIPE) {
		t.Errorf("client's writes ended after %v with %v, want a reset", time.Since(start), werr)
	}
}
