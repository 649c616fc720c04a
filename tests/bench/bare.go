package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
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
	ln, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", api.DefaultRedirectPort))
	if err != nil {
		return err
	}
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_MARK, int(api.DefaultMark))
		})
		if err != nil {
			return err
		}
		return serr
	}}
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
			u, err := d.Dial("tcp4", dst.String())
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
