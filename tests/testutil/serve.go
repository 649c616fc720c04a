package testutil

import (
	"bytes"
	"fmt"
	"net"
	"testing"
)

// Serve accepts connections on ln until the test ends (it closes ln then) and handles
// each on a goroutine of its own; the connection is closed when handle returns.
func Serve(tb testing.TB, ln net.Listener, handle func(net.Conn)) {
	tb.Cleanup(func() { ln.Close() })
	Accept(ln, handle)
}

// Accept is Serve for a caller that closes ln itself (the bench): it returns at once and
// serves until ln is closed.
func Accept(ln net.Listener, handle func(net.Conn)) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
}

// ConnectThrough asks the HTTP proxy at the other end of c for a tunnel to dst (host:port)
// and reads its answer byte by byte, so no tunnel byte is read ahead; it fails unless the
// answer is a 200.
func ConnectThrough(c net.Conn, dst string) error {
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", dst, dst); err != nil {
		return err
	}
	var head []byte
	for !bytes.HasSuffix(head, []byte("\r\n\r\n")) {
		b := make([]byte, 1)
		if _, err := c.Read(b); err != nil {
			return fmt.Errorf("CONNECT answer %q: %w", head, err)
		}
		head = append(head, b[0])
	}
	if !bytes.HasPrefix(head, []byte("HTTP/1.1 200")) {
		return fmt.Errorf("CONNECT answer %q, want 200", head)
	}
	return nil
}
