package main

import (
	"context"
	"fmt"
	"io"
	"net"
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

const bareRow = "bare Go splice relay (the issue's baseline)"

// startBare puts the capture table in the pod and runs bareRelay there.
func (b *relayBench) startBare() error {
	b.stopRelay()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if err := netns.Install(b.podPath, netns.Capture{RedirectPort: api.DefaultRedirectPort, Mark: api.DefaultMark}); err != nil {
		return fmt.Errorf("install capture: %w", err)
	}
	if err := b.startOther(func() { _ = netns.Remove(b.podPath) }, "env", "KL_BENCH_CHILD=bare-relay", self); err != nil {
		_ = netns.Remove(b.podPath)
		return err
	}
	return waitTCP(b.podPath, fmt.Sprintf("127.0.0.1:%d", api.DefaultRedirectPort), 10*time.Second)
}

// bareRelay is the bare relay, run inside the pod netns: accept on the redirect port,
// read the original destination, dial it with the mark the capture exempts, and let
// io.Copy splice both ways, passing each end on as a half-close. Nothing else: no
// decision, audit, metrics, timeouts or limits, only the guard against dialing itself.
func bareRelay([]string) error {
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
			u, err := self.DialAddrPort(context.Background(), api.DefaultMark, dst)
			if err != nil {
				return
			}
			defer u.Close()
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
