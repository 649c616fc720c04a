package relay_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/relay"
	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/tests/testutil"
)

// setSysctl sets a sysctl inside ns for the rest of the test, then puts back the value
// it had (network sysctls are per netns: the host's own are never touched).
func setSysctl(t *testing.T, ns *testutil.Netns, key, value string) {
	t.Helper()
	old := strings.TrimSpace(ns.Exec(t, "sysctl", "-n", key))
	ns.Exec(t, "sysctl", "-qw", key+"="+value)
	t.Cleanup(func() {
		if out, err := ns.Command("sysctl", "-qw", key+"="+old).CombinedOutput(); err != nil {
			t.Errorf("restore %s=%s in %s: %v %s", key, old, ns.Name, err, out)
		}
	})
}

// TestBrokenDestinationIsReset: a destination that stops answering in mid-stream (every
// packet to it dropped, so the relay's retransmissions time out with ETIMEDOUT) cuts the
// flow, and the workload must see a cut: a reset, never a FIN that would make the bytes
// it has read so far pass for the whole stream.
func TestBrokenDestinationIsReset(t *testing.T) {
	n := newLoopNet(t)
	// The relay's sockets to destinations live in the pod netns: with two retransmissions
	// a connection whose peer went silent fails after about 1.4 s, not 15 minutes.
	setSysctl(t, n.pod, "net.ipv4.tcp_retries2", "2")
	const greeting = "twenty-eight bytes of hello\n"
	ln, err := netns.Listen(n.srv.Path, "tcp", "192.0.2.2:87")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Serve(t, ln, func(c net.Conn) {
		c.Write([]byte(greeting))
		io.Copy(io.Discard, c)
	})
	relayDirect(t, n)

	c, err := n.dial(t, "192.0.2.2:87")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := make([]byte, len(greeting))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != greeting {
		t.Fatalf("greeting: %q, %v", got, err)
	}
	n.srv.Exec(t, "nft", "add rule inet kltest in tcp dport 87 drop")
	if _, err := c.Write([]byte("more")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	rest, err := io.ReadAll(c)
	if !isReset(err) {
		t.Errorf("after the destination went silent: read %q, %v; want a reset", rest, err)
	}
}

// sendUrgent writes "abc", the urgent byte "X" (MSG_OOB) and "def\n" to c, corked so that
// they leave in one segment, the urgent mark in its middle.
func sendUrgent(c net.Conn) error {
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return err
	}
	var werr error
	err = rc.Write(func(fd uintptr) bool {
		s := int(fd)
		for _, step := range []func() error{
			func() error { return unix.SetsockoptInt(s, unix.IPPROTO_TCP, unix.TCP_CORK, 1) },
			func() error { _, err := unix.Write(s, []byte("abc")); return err },
			func() error { return unix.Sendto(s, []byte("X"), unix.MSG_OOB, nil) },
			func() error { _, err := unix.Write(s, []byte("def\n")); return err },
			func() error { return unix.SetsockoptInt(s, unix.IPPROTO_TCP, unix.TCP_CORK, 0) },
		} {
			if werr = step(); werr != nil {
				break
			}
		}
		return true
	})
	if err == nil {
		err = werr
	}
	return err
}

// serveUrgentAware echoes what c sends, and an urgent byte b as "[b]" where it stands in
// the stream: it reads up to the urgent mark, takes the byte with MSG_OOB there, and
// reads on past it.
func serveUrgentAware(c net.Conn) {
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		return
	}
	buf := make([]byte, 64<<10)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		var out []byte
		done := false
		rc.Control(func(fd uintptr) {
			s := int(fd)
			pfd := []unix.PollFd{{Fd: int32(s), Events: unix.POLLIN | unix.POLLPRI}}
			if n, err := unix.Poll(pfd, 100); err != nil || n == 0 {
				return
			}
			if pfd[0].Revents&unix.POLLPRI != 0 {
				if mark, err := unix.IoctlGetInt(s, unix.SIOCATMARK); err == nil && mark == 1 {
					var b [1]byte
					if n, _, err := unix.Recvfrom(s, b[:], unix.MSG_OOB); err == nil && n == 1 {
						out = []byte("[" + string(b[:]) + "]")
						return
					}
				}
			}
			n, err := unix.Read(s, buf)
			switch {
			case err == unix.EAGAIN:
			case err != nil || n == 0:
				done = true
			default:
				out = buf[:n]
			}
		})
		if done {
			return
		}
		if len(out) > 0 {
			if _, err := c.Write(out); err != nil {
				return
			}
		}
	}
}

// TestUrgentData: TCP urgent data (MSG_OOB) in the middle of a stream stalls no direction
// of a relayed flow: a plain reader gets through the relay what it gets connected
// directly (the stream without the urgent byte), and a reader that takes urgent data
// gets the byte as urgent data at its place. splice(2) stops at the urgent mark and
// never passes it, and a read stops just before it; the relay must step past it. With
// a prelude of 8 KiB, the event loop relays the direction by splice when the urgent
// byte comes, without it through its buffer.
func TestUrgentData(t *testing.T) {
	n := newLoopNet(t)
	ln, err := netns.Listen(n.srv.Path, "tcp", "192.0.2.2:84")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Serve(t, ln, func(c net.Conn) { // plain reads, as most programs do
		buf := make([]byte, 64<<10)
		for {
			k, err := c.Read(buf)
			if err != nil {
				return
			}
			if _, err := c.Write(buf[:k]); err != nil {
				return
			}
		}
	})
	ln, err = netns.Listen(n.srv.Path, "tcp", "192.0.2.2:85")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Serve(t, ln, serveUrgentAware)
	relayDirect(t, n)

	// exchange sends prelude (and reads its echo back), then the urgent sequence, and
	// returns what comes back up to the newline, or with end to the end of stream after
	// a half-close right behind the sequence.
	exchange := func(t *testing.T, c net.Conn, prelude int, end bool) (string, error) {
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if prelude > 0 {
			p := bytes.Repeat([]byte("p"), prelude)
			if _, err := c.Write(p); err != nil {
				return "", err
			}
			if _, err := io.ReadFull(c, p); err != nil {
				return "", fmt.Errorf("prelude: %w", err)
			}
		}
		if err := sendUrgent(c); err != nil {
			return "", err
		}
		// Within 2 s: a relay that stalls fails here, not at the deadline above.
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if end {
			if err := c.(*net.TCPConn).CloseWrite(); err != nil {
				return "", err
			}
			got, err := io.ReadAll(c)
			return string(got), err
		}
		got, err := bufio.NewReader(c).ReadString('\n')
		return got, err
	}
	for _, tc := range []struct {
		name    string
		port    string
		prelude int
		end     bool
	}{
		{"plain reader", "84", 0, false},
		{"plain reader, 8 KiB before", "84", 8 << 10, false},
		{"urgent-aware reader", "85", 0, false},
		{"urgent-aware reader, 8 KiB before", "85", 8 << 10, false},
		// A splice at the mark says 0 (the end of stream) once the FIN has come.
		{"end of stream behind", "84", 0, true},
		{"end of stream behind, 8 KiB before", "84", 8 << 10, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			to := "192.0.2.2:" + tc.port
			// Connected directly: the relay's mark is not captured.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			d, err := netns.Dial(ctx, n.pod.Path, loopMark, "tcp", to)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			want, err := exchange(t, d, tc.prelude, tc.end)
			if err != nil {
				t.Fatalf("connected directly: %q, %v", want, err)
			}
			c, err := n.dial(t, to)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := exchange(t, c, tc.prelude, tc.end); got != want || err != nil {
				t.Errorf("through the relay: %q, %v; connected directly: %q", got, err, want)
			}
		})
	}
}

// TestBothWritesBlocked: a flow whose two ends both write and neither reads is idle (no
// byte moves either way) and ends after the idle timeout with a reset, although no
// direction of the relay is waiting to read.
func TestBothWritesBlocked(t *testing.T) {
	n := newLoopNet(t)
	ln, err := netns.Listen(n.srv.Path, "tcp", "192.0.2.2:98")
	if err != nil {
		t.Fatal(err)
	}
	block := make([]byte, 64<<10)
	testutil.Serve(t, ln, func(c net.Conn) {
		c.SetWriteDeadline(time.Now().Add(10 * time.Second))
		for {
			if _, err := c.Write(block); err != nil {
				return
			}
		}
	})
	pol, err := rules.Parse("t", []byte("default: direct\n"), rules.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := relay.New(relay.Options{RedirectPort: loopRedirect, Mark: loopMark, Loops: testLoops(),
		IdleTimeout: 300 * time.Millisecond, Policy: func() relay.Decider { return pol }})
	defer testutil.Shutdown(t, r)
	if _, err := r.Open(api.Workload{ID: "w", Netns: n.pod.Path, Mode: api.ModeTransparent}); err != nil {
		t.Fatal(err)
	}
	c, err := n.dial(t, "192.0.2.2:98")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	c.SetWriteDeadline(start.Add(5 * time.Second))
	for {
		if _, err = c.Write(block); err != nil {
			break
		}
	}
	if !isReset(err) {
		t.Errorf("the client's writes ended after %v with %v, want a reset within 5s", time.Since(start), err)
	}
}
