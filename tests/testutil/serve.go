package testutil

import (
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
