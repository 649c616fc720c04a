package netns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// udpEcho answers every datagram to addr, in the netns at path, until the test ends.
func udpEcho(t *testing.T, path, network, addr string) {
	t.Helper()
	var pc net.PacketConn
	if err := Do(path, func() (err error) { pc, err = net.ListenPacket(network, addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		b := make([]byte, 64)
		for {
			n, from, err := pc.ReadFrom(b)
			if err != nil {
				return
			}
			pc.WriteTo(b[:n], from)
		}
	}()
}

// The filter chain's blocks (IPv6 TCP when IPv6 is not captured, QUIC) are for new flows
// only: the pod's own servers answer, over IPv6 too and to a client whose port is 443,
// and flows already established to an excluded destination live through reinstalls.
func TestCaptureRejectsOnlyNewFlows(t *testing.T) {
	tp := newTopology(t)
	c := Capture{RedirectPort: relayPort, Mark: 0x539, IPv6: false, RejectQUIC: true,
		ExcludeCIDRs: prefixes("fd00:1::/64", "198.51.100.0/24")}
	if err := Install(tp.pod.Path, c); err != nil {
		t.Fatal(err)
	}

	t.Run("inbound IPv6 to a pod server", func(t *testing.T) {
		ln, err := Listen(tp.pod.Path, "tcp", ":9090")
		if err != nil {
			t.Fatal(err)
		}
		echo(t, ln, "podserver")
		for _, addr := range []string{"192.0.2.1:9090", "[fd00::1]:9090"} {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			conn, err := Dial(ctx, tp.srv.Path, 0, "tcp", addr)
			cancel()
			if err != nil {
				t.Errorf("inbound to the pod's server at %s: %v", addr, err)
				continue
			}
			if got, err := readLine(conn); err != nil {
				t.Errorf("inbound to the pod's server at %s: read %q: %v", addr, got, err)
			}
		}
		// Outbound IPv6 TCP is still refused: that is the block.
		if _, err := tp.connect(0, "[fd00::2]:8080"); err == nil {
			t.Error("outbound IPv6 TCP went out uncaptured")
		}
	})

	t.Run("a pod UDP server answers a client whose port is 443", func(t *testing.T) {
		udpEcho(t, tp.pod.Path, "udp4", "192.0.2.1:5353")
		var cl net.PacketConn
		if err := Do(tp.srv.Path, func() (err error) { cl, err = net.ListenPacket("udp4", "192.0.2.2:443"); return err }); err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		to := &net.UDPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 5353}
		got := false
		for try := 0; try < 5 && !got; try++ { // UDP: a few tries
			cl.WriteTo([]byte("ping"), to)
			cl.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			b := make([]byte, 64)
			n, _, err := cl.ReadFrom(b)
			got = err == nil && string(b[:n]) == "ping"
		}
		if !got {
			t.Error("the pod's UDP server's answers to port 443 were rejected")
		}
	})

	t.Run("established flows to excluded destinations live through reinstalls", func(t *testing.T) {
		ln, err := Listen(tp.srv.Path, "tcp", "[fd00:1::2]:7000")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { io.Copy(c, c); c.Close() }()
			}
		}()
		udpEcho(t, tp.srv.Path, "udp", "198.51.100.2:443")
		var conns []net.Conn
		for range 4 {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			conn, err := Dial(ctx, tp.pod.Path, 0, "tcp", "[fd00:1::2]:7000")
			cancel()
			if err != nil {
				t.Fatalf("dial the excluded destination: %v", err)
			}
			defer conn.Close()
			conns = append(conns, conn)
		}
		var quic net.Conn
		if err := Do(tp.pod.Path, func() (err error) { quic, err = net.Dial("udp4", "198.51.100.2:443"); return err }); err != nil {
			t.Fatal(err)
		}
		defer quic.Close()

		// Reinstall in a loop (bounded in count and time) while every flow exchanges.
		var stop atomic.Bool
		installs := 0
		done := make(chan error, 1)
		go func() {
			deadline := time.Now().Add(3 * time.Second)
			for !stop.Load() && installs < 2000 && time.Now().Before(deadline) {
				if err := Install(tp.pod.Path, c); err != nil {
					done <- err
					return
				}
				installs++
			}
			done <- nil
		}()
		var wg sync.WaitGroup
		errs := make(chan error, len(conns)+1)
		for i, conn := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b := make([]byte, 5)
				for n := 0; !stop.Load(); n++ {
					conn.SetDeadline(time.Now().Add(3 * time.Second))
					if _, err := conn.Write([]byte("ping\n")); err != nil {
						errs <- fmt.Errorf("tcp flow %d, round trip %d: %w", i, n, err)
						return
					}
					if _, err := io.ReadFull(conn, b); err != nil {
						errs <- fmt.Errorf("tcp flow %d, round trip %d: %w", i, n, err)
						return
					}
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; !stop.Load(); n++ {
				if _, err := quic.Write([]byte("quic")); err != nil {
					errs <- fmt.Errorf("udp/443 flow, datagram %d: %w", n, err)
					return
				}
				time.Sleep(time.Millisecond)
			}
		}()
		ierr := <-done
		stop.Store(true)
		wg.Wait()
		close(errs)
		if ierr != nil {
			t.Fatal(ierr)
		}
		for err := range errs {
			if !errors.Is(err, context.Canceled) {
				t.Errorf("%v (after %d reinstalls)", err, installs)
			}
		}
		t.Logf("%d reinstalls", installs)
	})
}
