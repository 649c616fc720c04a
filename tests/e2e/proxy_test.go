package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
)

// TestCNIProxyMode: a pod annotated kl.egress.mode=proxy gets no capture table but an
// HTTP and a SOCKS5 proxy on its loopback, and its flows are decided like captured ones.
func TestCNIProxyMode(t *testing.T) {
	n := newNode(t, false)
	n.server()
	n.startRelay()
	p := n.newPodAnnotated("proxied", `{"kl.egress.mode":"proxy"}`)
	if out, err := n.add(p); err != nil {
		t.Fatalf("ADD: %v\n%s\nrelay:\n%s", err, out, n.logs.String())
	}
	if got := p.ns.Exec(t, "nft", "list", "tables"); strings.TrimSpace(got) != "" {
		t.Errorf("proxy mode installed a table: %s", got)
	}
	reg, found, err := n.client().Get(context.Background(), p.id)
	if err != nil || !found || reg.Workload.Mode != "proxy" || reg.Listeners.HTTP == 0 || reg.Listeners.SOCKS == 0 {
		t.Fatalf("registration = %+v %v %v", reg, found, err)
	}
	if out, err := n.check(p); err != nil {
		t.Errorf("CHECK: %v\n%s", err, out)
	}

	dial := func(port uint16) *bufio.ReadWriter {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := netns.Dial(ctx, p.ns.Path, 0, "tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(5 * time.Second))
		return bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))
	}
	t.Run("http connect", func(t *testing.T) {
		rw := dial(reg.Listeners.HTTP)
		fmt.Fprintf(rw, "CONNECT 198.51.100.2:8080 HTTP/1.1\r\nHost: 198.51.100.2:8080\r\n\r\n")
		rw.Flush()
		status, _ := rw.ReadString('\n')
		if !strings.Contains(status, " 200") {
			t.Fatalf("CONNECT: %q", status)
		}
		for {
			l, err := rw.ReadString('\n')
			if err != nil || l == "\r\n" {
				break
			}
		}
		seen, _ := rw.ReadString('\n')
		ap, err := netip.ParseAddrPort(strings.TrimSpace(seen))
		if err != nil || ap.Addr() != p.v4 {
			t.Errorf("server saw %q, want the pod's address %v", seen, p.v4)
		}
	})
	t.Run("http connect denied", func(t *testing.T) {
		rw := dial(reg.Listeners.HTTP)
		fmt.Fprintf(rw, "CONNECT 203.0.113.7:443 HTTP/1.1\r\nHost: 203.0.113.7:443\r\n\r\n")
		rw.Flush()
		if status, _ := rw.ReadString('\n'); !strings.Contains(status, " 403") {
			t.Errorf("CONNECT to a denied address: %q, want 403", status)
		}
	})
	t.Run("socks5", func(t *testing.T) {
		rw := dial(reg.Listeners.SOCKS)
		rw.Write([]byte{5, 1, 0})
		rw.Flush()
		hello := make([]byte, 2)
		if _, err := io.ReadFull(rw, hello); err != nil || hello[1] != 0 {
			t.Fatalf("greeting: %v %v", hello, err)
		}
		req := []byte{5, 1, 0, 1, 198, 51, 100, 2, 0, 0}
		binary.BigEndian.PutUint16(req[8:], 8080)
		rw.Write(req)
		rw.Flush()
		rep := make([]byte, 10)
		if _, err := io.ReadFull(rw, rep); err != nil || rep[1] != 0 {
			t.Fatalf("SOCKS reply %v %v", rep, err)
		}
		seen, _ := rw.ReadString('\n')
		ap, err := netip.ParseAddrPort(strings.TrimSpace(seen))
		if err != nil || ap.Addr() != p.v4 {
			t.Errorf("server saw %q, want the pod's address %v", seen, p.v4)
		}
	})
	if out, err := n.del(p); err != nil {
		t.Fatalf("DEL: %v\n%s", err, out)
	}
	if out := p.ns.Exec(t, "ss", "-Hltn"); strings.TrimSpace(out) != "" {
		t.Errorf("listeners left after DEL: %s", out)
	}
}
