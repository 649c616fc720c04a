package relay_test

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
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
