package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
)

// The relay issue's own reference: "a bare 60-line Go splice relay" measured before any
// kl code existed (0.65x direct throughput, 0.43x conn/s). It runs here in the same
// rounds as kl-relayd, behind the same capture table, so the target "at least what the
// bare relay does" is measured, not remembered.

func init() { children["bare-relay"] = bareRelay }

const (
	bareRow      = "bare Go splice relay (the issue's baseline)"
	bareDanteRow = "bare Go splice relay → dante"
)

// startBare puts the capture table in the pod and runs bareRelay there; args are the
// relay's (a SOCKS5 upstream address, or none).
func (b *relayBench) startBare(args ...string) error {
	b.stopRelay()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if err := netns.Install(b.podPath, netns.Capture{RedirectPort: api.DefaultRedirectPort, Mark: api.DefaultMark}); err != nil {
		return fmt.Errorf("install capture: %w", err)
	}
	if err := b.startOther(func() { _ = netns.Remove(b.podPath) }, "env", append([]string{"KL_BENCH_CHILD=bare-relay", self}, args...)...); err != nil {
		_ = netns.Remove(b.podPath)
		return err
	}
	return waitTCP(b.podPath, fmt.Sprintf("127.0.0.1:%d", api.DefaultRedirectPort), 10*time.Second)
}

// bareRelay is the bare relay, run inside the pod netns: accept on the redirect port,
// read the original destination, dial it with the mark the capture exempts, and let
// io.Copy splice both ways, passing each end on as a half-close. Nothing else: no
// decision, audit, metrics, timeouts or limits, only the guard against dialing itself.
// With an argument (host:port of a SOCKS5 server) it dials that instead and asks it for
// the original destination, with no authentication and one round trip per message (as
// redsocks does): the same relay's cost in front of an upstream, what kl-relayd → dante
// is measured against besides redsocks.
func bareRelay(args []string) error {
	var socks netip.AddrPort
	if len(args) > 0 {
		var err error
		if socks, err = netip.ParseAddrPort(args[0]); err != nil {
			return err
		}
	}
	// Plain TCP, as kl-relayd listens: Go's default for listeners is MPTCP, which would
	// slow the baseline down for nothing.
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(context.Background(), "tcp4", fmt.Sprintf("127.0.0.1:%d", api.DefaultRedirectPort))
	if err != nil {
		return err
	}
	// The current netns: a net.Dialer whose Control sets the mark the capture exempts
	// (what every Go relay writes for itself), with no setns.
	self, err := netns.Open("")
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			dst, err := netns.OriginalDst(c.(*net.TCPConn))
			// A connection made to the port itself (waitTCP's probe) was not redirected: its
			// original destination is this listener, and dialing it would loop.
			if err != nil || dst.String() == ln.Addr().String() {
				return
			}
			to := dst
			if socks.IsValid() {
				to = socks
			}
			u, err := self.DialAddrPort(context.Background(), api.DefaultMark, to)
			if err != nil {
				return
			}
			defer u.Close()
			if socks.IsValid() && socks5Connect(u, dst) != nil {
				return
			}
			done := make(chan struct{})
			go func() {
				_, _ = io.Copy(u, c)
				_ = u.(*net.TCPConn).CloseWrite()
				close(done)
			}()
			_, _ = io.Copy(c, u)
			_ = c.(*net.TCPConn).CloseWrite()
			<-done
		}()
	}
}

// socks5Connect asks the SOCKS5 server at the other end of u for a connection to dst
// (IPv4), no authentication: greeting, method reply, request, reply.
func socks5Connect(u net.Conn, dst netip.AddrPort) error {
	if _, err := u.Write([]byte{5, 1, 0}); err != nil {
		return err
	}
	var rep [10]byte
	if _, err := io.ReadFull(u, rep[:2]); err != nil {
		return err
	}
	if rep[0] != 5 || rep[1] != 0 {
		return fmt.Errorf("socks5: method %d refused", rep[1])
	}
	a := dst.Addr().As4()
	req := []byte{5, 1, 0, 1, a[0], a[1], a[2], a[3], byte(dst.Port() >> 8), byte(dst.Port())}
	if _, err := u.Write(req); err != nil {
		return err
	}
	// An IPv4 bound address: dante answers with the one it connected from.
	if _, err := io.ReadFull(u, rep[:]); err != nil {
		return err
	}
	if rep[1] != 0 {
		return fmt.Errorf("socks5: request failed (%d)", rep[1])
	}
	return nil
}
