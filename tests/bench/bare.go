package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
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
	bareSquidRow = "bare Go splice relay → squid"
)

// startBare puts the capture table in the pod and runs bareRelay there; args are the
// relay's (an upstream url, socks5:// or http://, or none).
func (b *relayBench) startBare(args ...string) error { return b.startRelayChild("bare-relay", args...) }

// startRelayChild puts the capture table in the pod and runs this binary's child mode
// child (a relay, which takes args) there.
func (b *relayBench) startRelayChild(child string, args ...string) error {
	// Everything before stops first: a bare relay's undo removes the capture table,
	// so stopping one after the Install below would leave the next one uncaptured.
	b.clear()
	return b.startRelayChildIn(b.pod, child, args...)
}

// startRelayChildIn is startRelayChild in netns ns (a name), stopping only the other
// relay before it (kl-relayd may go on relaying the first pod: pairs.go).
func (b *relayBench) startRelayChildIn(ns, child string, args ...string) error {
	b.stopOtherRelay()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	path := "/var/run/netns/" + ns
	if err := netns.Install(path, netns.Capture{RedirectPort: api.DefaultRedirectPort, Mark: api.DefaultMark}); err != nil {
		return fmt.Errorf("install capture: %w", err)
	}
	if err := b.startOtherIn(ns, func() { _ = netns.Remove(path) }, "env", append([]string{"KL_BENCH_CHILD=" + child, self}, args...)...); err != nil {
		_ = netns.Remove(path)
		return err
	}
	return waitTCP(path, fmt.Sprintf("127.0.0.1:%d", api.DefaultRedirectPort), 10*time.Second)
}

// bareRelay is the bare relay, run inside the pod netns: accept on the redirect port,
// read the original destination, dial it with the mark the capture exempts, and let
// io.Copy splice both ways, passing each end on as a half-close. Nothing else: no
// decision, audit, metrics, timeouts or limits, only the guard against dialing itself.
// With an argument (socks5://host:port or http://host:port) it dials that upstream
// instead and asks it for the original destination: SOCKS5 with no authentication and
// one round trip per message, or an HTTP CONNECT, as redsocks does. That is the same
// relay's cost in front of an upstream, what kl-relayd → dante and → squid are measured
// against besides redsocks.
func bareRelay(args []string) error {
	var via netip.AddrPort
	var handshake func(net.Conn, netip.AddrPort) error
	if len(args) > 0 {
		scheme, hp, _ := strings.Cut(args[0], "://")
		var err error
		if via, err = netip.ParseAddrPort(hp); err != nil {
			return err
		}
		switch scheme {
		case "socks5":
			handshake = socks5Connect
		case "http":
			handshake = httpConnect
		default:
			return fmt.Errorf("bare relay: upstream %q: want socks5:// or http://", args[0])
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
			if handshake != nil {
				to = via
			}
			u, err := self.DialAddrPort(context.Background(), api.DefaultMark, to)
			if err != nil {
				return
			}
			defer u.Close()
			if handshake != nil && handshake(u, dst) != nil {
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

// httpConnect asks the HTTP proxy at the other end of u for a tunnel to dst: one CONNECT,
// and its answer read up to the blank line (the proxy sends nothing more before the
// tunnel's own bytes, which start with the client's request here).
func httpConnect(u net.Conn, dst netip.AddrPort) error {
	if _, err := fmt.Fprintf(u, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", dst, dst); err != nil {
		return err
	}
	var head []byte
	b := make([]byte, 512)
	for !bytes.HasSuffix(head, []byte("\r\n\r\n")) {
		n, err := u.Read(b)
		if err != nil {
			return err
		}
		head = append(head, b[:n]...)
		if len(head) > 4096 {
			return errors.New("http connect: answer too long")
		}
	}
	if !bytes.HasPrefix(head, []byte("HTTP/1.1 200")) && !bytes.HasPrefix(head, []byte("HTTP/1.0 200")) {
		return fmt.Errorf("http connect: %q", bytes.SplitN(head, []byte("\r\n"), 2)[0])
	}
	return nil
}
