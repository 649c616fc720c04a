package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/tests/testutil"
)

// Upstream netns addresses (each its own netns, linked to the node).
const (
	squidAddr = "203.0.113.2"
	squidV6   = "fd00:3::2"
	danteAddr = "203.0.113.18"
	danteV6   = "fd00:4::2"
)

// peers records who connected to each test-host port.
type peers struct {
	mu   sync.Mutex
	seen map[int][]netip.Addr
}

func (p *peers) last(port int) (netip.Addr, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.seen[port]
	if len(s) == 0 {
		return netip.Addr{}, 0
	}
	return s[len(s)-1], len(s)
}

// servers listens on the test host on each port (dual-stack): every connection is
// recorded, gets one line with the peer address it came from, and then an echo.
func (n *node) servers(ports ...int) *peers {
	t := n.t
	p := &peers{seen: map[int][]netip.Addr{}}
	for _, port := range ports {
		ln, err := netns.Listen(n.host.Path, "tcp", fmt.Sprintf(":%d", port))
		must(t, err)
		testutil.Serve(t, ln, func(c net.Conn) {
			// Recorded before the greeting, so a client that has read it is in seen.
			ra := c.RemoteAddr().(*net.TCPAddr).AddrPort()
			p.mu.Lock()
			p.seen[port] = append(p.seen[port], ra.Addr().Unmap())
			p.mu.Unlock()
			fmt.Fprintf(c, "%s\n", netip.AddrPortFrom(ra.Addr().Unmap(), ra.Port()))
			io.Copy(c, c)
		})
	}
	return p
}

// upstreamNetns makes a netns linked to the node with the given addresses (v4/28, v6/64;
// the node side takes the first address of each) and a default route via the node.
func (n *node) upstreamNetns(prefix, v4, nodeV4, v6, nodeV6 string) *testutil.Netns {
	t := n.t
	u := testutil.NewNetns(t, prefix)
	testutil.Link(t, n.ns, []string{nodeV4 + "/28", nodeV6 + "/64"}, u, []string{v4 + "/28", v6 + "/64"})
	u.Exec(t, "ip", "route", "add", "default", "via", nodeV4)
	u.Exec(t, "ip", "-6", "route", "add", "default", "via", nodeV6)
	return u
}

// startSquid runs squid (a CONNECT upstream) in its own netns; app.example resolves to
// the test host through its hosts file.
func (n *node) startSquid() {
	t := n.t
	ns := n.upstreamNetns("klsq", squidAddr, "203.0.113.1", squidV6, "fd00:3::1")
	dir := filepath.Join(n.dir, "squid")
	must(t, os.MkdirAll(dir, 0o777))
	must(t, os.Chmod(dir, 0o777)) // squid drops privileges
	must(t, os.Chmod(n.dir, 0o755))
	must(t, os.Chmod(filepath.Dir(n.dir), 0o755)) // the test's temp root
	must(t, os.WriteFile(filepath.Join(dir, "hosts"), []byte("198.51.100.2 app.example\n"), 0o644))
	conf := filepath.Join(dir, "squid.conf")
	must(t, os.WriteFile(conf, []byte(fmt.Sprintf(`http_port %[1]s:3128
pid_filename %[2]s/squid.pid
cache_log %[2]s/cache.log
access_log none
coredump_dir %[2]s
cache deny all
shutdown_lifetime 0 seconds
hosts_file %[2]s/hosts
pinger_enable off
dns_nameservers 127.0.0.1
acl all_src src all
http_access allow all_src
`, squidAddr, dir)), 0o644))
	args, rm := testutil.SquidArgs(conf)
	t.Cleanup(rm) // after the stop Start registers
	ns.Start(t, "squid", args...)
	ns.WaitPort(t, "tcp", squidAddr+":3128", 30*time.Second)
}

// startDante runs dante (a SOCKS5 upstream) in its own netns.
func (n *node) startDante() {
	t := n.t
	ns := n.upstreamNetns("kldn", danteAddr, "203.0.113.17", danteV6, "fd00:4::1")
	conf := filepath.Join(n.dir, "danted.conf")
	must(t, os.WriteFile(conf, []byte(fmt.Sprintf(`logoutput: stderr
internal: %[1]s port = 1080
external: %[1]s
external: %[2]s
clientmethod: none
socksmethod: none
user.privileged: root
user.unprivileged: nobody
client pass { from: 0/0 to: 0/0 }
socks pass { from: 0/0 to: 0/0 command: connect }
`, danteAddr, danteV6)), 0o644))
	cmd := ns.Start(t, "danted", "-f", conf, "-p", filepath.Join(n.dir, "danted.pid"))
	// Runs before Start's kill: on SIGTERM dante's main process ends and reaps its
	// workers (killed outright they would be left to init as zombies).
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		stat := fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid)
		for range 40 { // until it has exited (a zombie until Start's cleanup waits for it)
			b, err := os.ReadFile(stat)
			if f := strings.Fields(string(b)); err != nil || len(f) > 2 && f[2] == "Z" {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	ns.WaitPort(t, "tcp", danteAddr+":1080", 30*time.Second)
}

const upstreamRules = `default: proxy
rules:
  - domain: app.example
    action: proxy
    note: sniffed
  - port: 8082
    exit: socks
  - port: 8083
    exit: down
  - port: 8080
    action: direct
`

// TestUpstreams carries transparent and proxy-mode flows through Debian's squid (the
// `proxy` exit, CONNECT) and dante (the named exit `socks`, SOCKS5), each in its own
// netns: IPv4 and IPv6, an SNI-sniffed domain rule, an upstream that is down (reset,
// audited reason, no fallback) and the metadata guard under `default: proxy`.
func TestUpstreams(t *testing.T) {
	testutil.RequireTool(t, "squid", "danted")
	n := newNode(t, true)
	must(t, os.WriteFile(n.rules, []byte(upstreamRules), 0o644))
	settings := filepath.Join(n.dir, "relayd.yaml")
	b, err := os.ReadFile(settings)
	must(t, err)
	b = append(b, fmt.Sprintf("proxy: {url: \"http://%s:3128\"}\nexits:\n  socks: {url: \"socks5://%s:1080\"}\n  down: {url: \"http://%s:3999\", connectTimeout: 2s}\nsniff: {wait: 300ms}\n",
		squidAddr, danteAddr, squidAddr)...)
	must(t, os.WriteFile(settings, b, 0o600))
	seen := n.servers(8081, 8082, 8083, 8443)
	n.server() // 8080, also on 169.254.169.254
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); n.startSquid() }()
	go func() { defer wg.Done(); n.startDante() }()
	wg.Wait()
	if t.Failed() {
		return
	}
	n.startRelay()
	a := n.newPod("up")
	if out, err := n.add(a); err != nil {
		t.Fatalf("ADD: %v\n%s\nrelay:\n%s", err, out, n.logs.String())
	}
	last := func(t *testing.T) (exit, dim, reason string) {
		t.Helper()
		r := n.lastRecord(t)
		return r.Exit, r.Dimension, r.Reason
	}

	for _, tc := range []struct {
		name, addr string
		port       int
		via        string // the address the destination must see
		exit, dim  string
	}{
		{"v4 via squid", "198.51.100.2:8081", 8081, squidAddr, "proxy", "default"},
		{"v6 via squid", "[fd00:51::2]:8081", 8081, squidV6, "proxy", "default"},
		{"v4 via dante", "198.51.100.2:8082", 8082, danteAddr, "socks", "port"},
		{"v6 via dante", "[fd00:51::2]:8082", 8082, danteV6, "socks", "port"},
	} {
		t.Run("transparent "+tc.name, func(t *testing.T) {
			got, _, err := visit(t, a, tc.addr)
			if err != nil {
				t.Fatalf("visit %s: %v\nrelay:\n%s", tc.addr, err, n.logs.String())
			}
			if got.Addr().String() != tc.via {
				t.Errorf("destination saw %v, want the upstream %s", got.Addr(), tc.via)
			}
			if exit, dim, _ := last(t); exit != tc.exit || dim != tc.dim {
				t.Errorf("decision %s/%s, want %s/%s", exit, dim, tc.exit, tc.dim)
			}
		})
	}

	t.Run("sniffed domain to squid", func(t *testing.T) {
		// Port 8083 alone would pick the dead exit; the SNI names app.example, whose
		// domain rule (a higher tier) sends it to squid, which is handed the name.
		_, before := seen.last(8083)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := netns.Dial(ctx, a.ns.Path, 0, "tcp", "198.51.100.2:8083")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		tls.Client(c, &tls.Config{ServerName: "app.example", InsecureSkipVerify: true}).Handshake() // the test server does not speak TLS
		from, after := seen.last(8083)
		if after != before+1 || from.String() != squidAddr {
			t.Errorf("destination saw %d new connections, last from %v; want one from squid %s", after-before, from, squidAddr)
		}
		if exit, dim, _ := last(t); exit != "proxy" || dim != "domain" {
			t.Errorf("decision %s/%s, want proxy/domain", exit, dim)
		}
	})

	t.Run("upstream down resets, no fallback", func(t *testing.T) {
		_, before := seen.last(8083)
		_, _, err := visit(t, a, "198.51.100.2:8083")
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("flow to a dead upstream: %v, want reset", err)
		}
		if _, after := seen.last(8083); after != before {
			t.Errorf("the destination got %d connections: the flow fell back to another exit", after-before)
		}
		exit, dim, reason := last(t)
		if exit != "down" || dim != "port" || !strings.Contains(reason, "refused") || strings.Contains(reason, "198.51.100") {
			t.Errorf("record %s/%s reason %q: want the dead exit's refusal without the destination", exit, dim, reason)
		}
	})

	t.Run("proxy mode", func(t *testing.T) {
		p := n.newPodAnnotated("upp", `{"kl.egress.mode":"proxy"}`)
		if out, err := n.add(p); err != nil {
			t.Fatalf("ADD: %v\n%s", err, out)
		}
		connect := func(t *testing.T, target string) (string, string) {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := netns.Dial(ctx, p.ns.Path, 0, "tcp", "127.0.0.1:15080")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
			br := bufio.NewReader(c)
			status, _ := br.ReadString('\n')
			for {
				l, err := br.ReadString('\n')
				if err != nil || l == "\r\n" {
					break
				}
			}
			line, _ := br.ReadString('\n')
			return status, strings.TrimSpace(line)
		}
		// A name only squid can resolve: the upstream gets the hostname.
		status, line := connect(t, "app.example:8081")
		if !strings.Contains(status, " 200") || !strings.HasPrefix(line, squidAddr+":") {
			t.Errorf("CONNECT app.example via squid: %q, destination saw %q", status, line)
		}
		if exit, dim, _ := last(t); exit != "proxy" || dim != "domain" {
			t.Errorf("CONNECT app.example decision %s/%s, want proxy/domain", exit, dim)
		}
		// SOCKS5 with a domain address: port 8082 alone would pick dante; the domain
		// rule (a higher tier) sends it to squid.
		t.Run("socks5 domain", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := netns.Dial(ctx, p.ns.Path, 0, "tcp", "127.0.0.1:15081")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			name := "app.example"
			req := append([]byte{5, 1, 0, 5, 1, 0, 3, byte(len(name))}, name...)
			req = append(req, 8082>>8, 8082&0xff)
			c.Write(req)
			rep := make([]byte, 2+10)
			if _, err := io.ReadFull(c, rep); err != nil || rep[1] != 0 || rep[3] != 0 {
				t.Fatalf("SOCKS5 replies %v: %v", rep, err)
			}
			line, _ := bufio.NewReader(c).ReadString('\n')
			if !strings.HasPrefix(line, squidAddr+":") {
				t.Errorf("destination saw %q, want squid %s", line, squidAddr)
			}
			if exit, dim, _ := last(t); exit != "proxy" || dim != "domain" {
				t.Errorf("decision %s/%s, want proxy/domain", exit, dim)
			}
		})
		// The metadata guard sends 169.254.169.254 direct even under default: proxy.
		status, line = connect(t, "169.254.169.254:8080")
		if !strings.Contains(status, " 200") || !strings.HasPrefix(line, p.v4.String()+":") {
			t.Errorf("CONNECT metadata: %q, destination saw %q, want the pod %v", status, line, p.v4)
		}
		if exit, dim, _ := last(t); exit != "direct" || dim != "guard" {
			t.Errorf("metadata decision %s/%s, want direct/guard", exit, dim)
		}
		// Upstream down: an error answer, never another exit.
		status, _ = connect(t, "198.51.100.2:8083")
		if !strings.Contains(status, " 502") {
			t.Errorf("CONNECT through the dead exit: %q, want 502", status)
		}
	})
}
