package netns

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/tests/testutil"
	"golang.org/x/sys/unix"
)

func inode(t testing.TB, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func TestDoEntersAndReturns(t *testing.T) {
	ns := testutil.NewNetns(t, "kldo")
	want := inode(t, ns.Path)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := inode(t, threadNetns)

	var inside uint64
	if err := Do(ns.Path, func() error { inside = inode(t, threadNetns); return nil }); err != nil {
		t.Fatal(err)
	}
	if inside != want {
		t.Errorf("inside Do the thread's netns is %d, want %d", inside, want)
	}
	if got := inode(t, threadNetns); got != before {
		t.Errorf("after Do the caller's netns is %d, want %d", got, before)
	}

	boom := errors.New("boom")
	if err := Do(ns.Path, func() error { return boom }); !errors.Is(err, boom) {
		t.Errorf("Do returned %v, want fn's error", err)
	}
	if err := Do(ns.Path, func() error { panic("oops") }); err == nil || !strings.Contains(err.Error(), "oops") {
		t.Errorf("Do with a panicking fn returned %v, want the panic as an error", err)
	}
	if err := Do("/nonexistent/netns", func() error { t.Error("fn ran"); return nil }); err == nil {
		t.Error("Do on a missing netns returned nil")
	}

	// Every thread the runtime hands out afterwards is back in the original netns, even
	// after many Do calls (a leaked thread would be visible here).
	host := inode(t, "/proc/self/ns/net")
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = Do(ns.Path, func() error { return nil })
		}()
	}
	wg.Wait()
	errs := make(chan error, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var st unix.Stat_t
			if err := unix.Stat(threadNetns, &st); err != nil {
				errs <- err
				return
			}
			if st.Ino != host {
				errs <- fmt.Errorf("a thread is in netns %d, not the host's %d", st.Ino, host)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestSameNetns(t *testing.T) {
	a := testutil.NewNetns(t, "klsa")
	b := testutil.NewNetns(t, "klsb")
	for _, tc := range []struct {
		x, y string
		want bool
	}{
		{a.Path, a.Path, true},
		{a.Path, b.Path, false},
		{"/proc/self/ns/net", a.Path, false},
	} {
		got, err := SameNetns(tc.x, tc.y)
		if err != nil || got != tc.want {
			t.Errorf("SameNetns(%s, %s) = %v, %v; want %v", tc.x, tc.y, got, err, tc.want)
		}
	}
	var inside bool
	err := Do(a.Path, func() error {
		var err error
		inside, err = SameNetns(threadNetns, a.Path)
		return err
	})
	if err != nil || !inside {
		t.Errorf("SameNetns(thread inside %s, %s) = %v, %v; want true", a.Name, a.Path, inside, err)
	}
	if _, err := SameNetns("/nonexistent", a.Path); err == nil {
		t.Error("SameNetns on a missing file returned no error")
	}
}

// echo serves ln until it is closed: each connection gets one line "<tag> <remote addr>".
func echo(t testing.TB, ln net.Listener, tag string) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s %s\n", tag, c.RemoteAddr())
			c.Close()
		}
	}()
}

func readLine(c net.Conn) (string, error) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	s, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(s), err
}

func TestListenDialConcurrent(t *testing.T) {
	ns := testutil.NewNetns(t, "klld")
	const n = 40
	lns := make([]net.Listener, n)
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ln, err := Listen(ns.Path, "tcp", "127.0.0.1:0")
			if err != nil {
				errs <- err
				return
			}
			lns[i] = ln
		}()
	}
	wg.Wait()
	for _, ln := range lns {
		if ln != nil {
			echo(t, ln, "ok")
		}
	}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if lns[i] == nil {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			c, err := Dial(ctx, ns.Path, 0x539, "tcp", lns[i].Addr().String())
			if err != nil {
				errs <- err
				return
			}
			if line, err := readLine(c); err != nil || !strings.HasPrefix(line, "ok ") {
				errs <- fmt.Errorf("read from listener %d: %q, %v", i, line, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// The listeners live in the netns, not in the test's own: from here the port is closed.
	if c, err := net.DialTimeout("tcp", lns[0].Addr().String(), time.Second); err == nil {
		c.Close()
		t.Errorf("listener opened in %s is reachable from the host netns", ns.Name)
	}
	// A cancelled context stops a dial.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Dial(ctx, ns.Path, 0, "tcp", lns[0].Addr().String()); err == nil {
		t.Error("Dial with a cancelled context succeeded")
	}
	if _, err := Listen(ns.Path, "udp", ":0"); err == nil {
		t.Error("Listen accepted udp")
	}
}

func TestDialSetsMark(t *testing.T) {
	ns := testutil.NewNetns(t, "klmk")
	ln, err := Listen(ns.Path, "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	echo(t, ln, "ok")
	c, err := Dial(context.Background(), ns.Path, 0x4242, "tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if mark := sockopt(t, c.(*net.TCPConn), unix.SOL_SOCKET, unix.SO_MARK); mark != 0x4242 {
		t.Errorf("SO_MARK = %#x; want 0x4242", mark)
	}
}

// TestDialSharesEphemeralPorts: a dial leaves the choice of its local port to connect,
// which may give one port to connections to different destinations; a socket bound to
// port 0 first would hold its port alone. With one port in the netns's ephemeral range,
// two dials to two destinations both succeed from that port.
func TestDialSharesEphemeralPorts(t *testing.T) {
	ns := testutil.NewNetns(t, "klport")
	ns.Exec(t, "sysctl", "-qw", "net.ipv4.ip_local_port_range=40000 40000")
	h, err := Open(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, port := range []uint16{7001, 7002} {
		ln, err := Listen(ns.Path, "tcp4", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatal(err)
		}
		echo(t, ln, "ok")
		c, err := h.DialAddrPort(context.Background(), 0x4242, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port))
		if err != nil {
			t.Fatalf("dial port %d with one ephemeral port in the range: %v", port, err)
		}
		defer c.Close()
		if got := c.LocalAddr().(*net.TCPAddr).Port; got != 40000 {
			t.Errorf("dial to port %d left from port %d, want 40000 (the range's only port)", port, got)
		}
	}
}

// topology is a pod netns linked to a server netns, with the capture program installed
// in the pod and plain TCP servers (tag "server") on the server side.
type topology struct {
	pod, srv *testutil.Netns
}

const relayPort = 15001

func newTopology(t *testing.T) *topology {
	t.Helper()
	testutil.RequireTool(t, "nft")
	pod := testutil.NewNetns(t, "klpod")
	srv := testutil.NewNetns(t, "klsrv")
	podIf, srvIf := testutil.Link(t, pod, []string{"192.0.2.1/24", "fd00::1/64"},
		srv, []string{"192.0.2.2/24", "fd00::2/64", "169.254.169.254/32", "198.51.100.2/32", "fd00:1::2/128", "fd00:ec2::254/128"})
	_ = srvIf
	pod.Exec(t, "ip", "route", "add", "169.254.169.254/32", "dev", podIf)
	pod.Exec(t, "ip", "-6", "route", "add", "fd00:ec2::254/128", "dev", podIf)
	pod.Exec(t, "ip", "route", "add", "198.51.100.0/24", "dev", podIf)
	pod.Exec(t, "ip", "-6", "route", "add", "fd00:1::/64", "dev", podIf)
	for _, port := range []string{"8080", "2222"} {
		ln, err := Listen(srv.Path, "tcp", ":"+port)
		if err != nil {
			t.Fatal(err)
		}
		echo(t, ln, "server")
	}
	return &topology{pod: pod, srv: srv}
}

// relay listens on the redirect port in the pod and answers "relay <original dst>".
// With dualStack it opens one [::] socket, otherwise one per family on loopback only.
func (tp *topology) relay(t *testing.T, dualStack bool) []net.Listener {
	t.Helper()
	if dualStack {
		return []net.Listener{tp.relayOn(t, "tcp", fmt.Sprintf(":%d", relayPort))}
	}
	return []net.Listener{
		tp.relayOn(t, "tcp4", fmt.Sprintf("127.0.0.1:%d", relayPort)),
		tp.relayOn(t, "tcp6", fmt.Sprintf("[::1]:%d", relayPort)),
	}
}

func (tp *topology) relayOn(t *testing.T, network, addr string) net.Listener {
	t.Helper()
	ln, err := Listen(tp.pod.Path, network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dst, err := OriginalDst(c.(*net.TCPConn))
			if err != nil {
				fmt.Fprintf(c, "relay error %v\n", err)
			} else {
				fmt.Fprintf(c, "relay %s\n", dst)
			}
			c.Close()
		}
	}()
	return ln
}

// connect opens a TCP connection from the pod (unmarked unless mark != 0) and returns the
// first line it reads.
func (tp *topology) connect(mark uint32, addr string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := Dial(ctx, tp.pod.Path, mark, "tcp", addr)
	if err != nil {
		return "", err
	}
	return readLine(c)
}

func TestCaptureRedirects(t *testing.T) {
	for _, dual := range []bool{true, false} {
		t.Run(fmt.Sprintf("dual-stack=%v", dual), func(t *testing.T) { testCaptureRedirects(t, dual) })
	}
}

func testCaptureRedirects(t *testing.T, dualStack bool) {
	tp := newTopology(t)
	c := Capture{RedirectPort: relayPort, Mark: 0x539, IPv6: true, RejectQUIC: true,
		ExcludeCIDRs: prefixes("198.51.100.0/24", "fd00:1::/64"), ExcludePorts: []uint16{2222}}
	if err := Install(tp.pod.Path, c); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Remove(tp.pod.Path) })
	if err := Verify(tp.pod.Path, c); err != nil {
		t.Fatalf("Verify right after Install: %v", err)
	}
	relay := tp.relay(t, dualStack)

	tests := []struct {
		name string
		mark uint32
		addr string
		want string // prefix of the line read
	}{
		{"ipv4 captured", 0, "192.0.2.2:8080", "relay 192.0.2.2:8080"},
		{"ipv6 captured", 0, "[fd00::2]:8080", "relay [fd00::2]:8080"},
		{"ipv4 other port captured", 0, "192.0.2.2:443", "relay 192.0.2.2:443"},
		{"marked socket not captured", 0x539, "192.0.2.2:8080", "server 192.0.2.1:"},
		{"marked ipv6 socket not captured", 0x539, "[fd00::2]:8080", "server [fd00::1]:"},
		{"other mark captured", 0x538, "192.0.2.2:8080", "relay 192.0.2.2:8080"},
		{"metadata address not captured", 0, "169.254.169.254:8080", "server 192.0.2.1:"},
		{"ipv6 metadata address not captured", 0, "[fd00:ec2::254]:8080", "server [fd00::1]:"},
		{"excluded cidr not captured", 0, "198.51.100.2:8080", "server 192.0.2.1:"},
		{"excluded ipv6 cidr not captured", 0, "[fd00:1::2]:8080", "server [fd00::1]:"},
		{"excluded port not captured", 0, "192.0.2.2:2222", "server 192.0.2.1:"},
		{"excluded port not captured ipv6", 0, "[fd00::2]:2222", "server [fd00::1]:"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tp.connect(tc.mark, tc.addr)
			if err != nil || !strings.HasPrefix(got, tc.want) {
				t.Errorf("connect(mark %#x, %s) = %q, %v; want %q...", tc.mark, tc.addr, got, err, tc.want)
			}
		})
	}

	// The relay goes away: captured flows of both families are refused, exempt ones are not.
	for _, ln := range relay {
		ln.Close()
	}
	for _, addr := range []string{"192.0.2.2:8080", "[fd00::2]:8080"} {
		if got, err := tp.connect(0, addr); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("relay down: connect(%s) = %q, %v; want connection refused", addr, got, err)
		}
	}
	for _, addr := range []string{"169.254.169.254:8080", "[fd00:ec2::254]:8080"} {
		if got, err := tp.connect(0, addr); err != nil || !strings.HasPrefix(got, "server ") {
			t.Errorf("relay down: metadata address %s = %q, %v; want the server", addr, got, err)
		}
	}
}

func TestCaptureFailsClosed(t *testing.T) {
	tp := newTopology(t)
	c := Capture{RedirectPort: relayPort, Mark: 0x539, IPv6: false, RejectQUIC: true,
		ExcludeCIDRs: prefixes("fd00:1::/64")}
	if err := Install(tp.pod.Path, c); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Remove(tp.pod.Path) })

	// No relay listens: a captured connection is refused, it never reaches the server.
	if got, err := tp.connect(0, "192.0.2.2:8080"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("with the relay down, connect = %q, %v; want connection refused", got, err)
	}
	// IPv6 capture off: IPv6 TCP is rejected, not let out uncaptured.
	start := time.Now()
	if got, err := tp.connect(0, "[fd00::2]:8080"); err == nil {
		t.Errorf("IPv6 TCP with IPv6 capture off reached %q, want it rejected", got)
	} else if !immediateRefusal(err) || time.Since(start) > time.Second {
		t.Errorf("IPv6 TCP with IPv6 capture off failed with %v after %v, want an immediate refusal", err, time.Since(start))
	}
	// ...except what is exempt anyway.
	for _, addr := range []string{"[fd00:1::2]:8080", "[fd00:ec2::254]:8080"} {
		if got, err := tp.connect(0, addr); err != nil || !strings.HasPrefix(got, "server ") {
			t.Errorf("exempt IPv6 %s = %q, %v; want the server", addr, got, err)
		}
	}
	if got, err := tp.connect(0x539, "[fd00::2]:8080"); err != nil || !strings.HasPrefix(got, "server ") {
		t.Errorf("marked IPv6 with IPv6 capture off = %q, %v; want the server", got, err)
	}

	// QUIC: UDP to 443 is refused at once, other UDP passes.
	var udpPorts []string
	for _, port := range []string{"443", "444"} {
		udpEcho(t, tp.srv.Path, "udp", "192.0.2.2:"+port)
		udpPorts = append(udpPorts, port)
	}
	for _, port := range udpPorts {
		var got string
		var err error
		derr := Do(tp.pod.Path, func() error {
			u, derr := net.Dial("udp", "192.0.2.2:"+port)
			if derr != nil {
				return derr
			}
			defer u.Close()
			u.SetDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 64)
			// The first write triggers the ICMP answer; the error shows on a later call.
			for range 3 {
				if _, err = u.Write([]byte("ping")); err != nil {
					return nil
				}
				var n int
				n, err = u.Read(buf)
				if err == nil {
					got = string(buf[:n])
					return nil
				}
				if immediateRefusal(err) {
					return nil
				}
			}
			return nil
		})
		if derr != nil {
			t.Fatal(derr)
		}
		if port == "443" && (got != "" || !immediateRefusal(err)) {
			t.Errorf("UDP/443 from the pod = %q, %v; want an immediate refusal", got, err)
		}
		if port == "444" && got != "ping" {
			t.Errorf("UDP/444 from the pod = %q, %v; want the echo", got, err)
		}
	}
}

func TestInstallMatchesNft(t *testing.T) {
	testutil.RequireTool(t, "nft")
	for _, tc := range goldenCaptures {
		t.Run(tc.name, func(t *testing.T) {
			ns := testutil.NewNetns(t, "klnft")
			if err := Install(ns.Path, tc.c); err != nil {
				t.Fatal(err)
			}
			listed := ns.Exec(t, "nft", "list", "table", "inet", "kl")
			golden(t, "nft-"+tc.name, listed)
			// nft wraps long element lists; apart from white space it prints what Render does.
			// It also prints counter values, which Render leaves out.
			plain := counterValues.ReplaceAllString(listed, "counter")
			if a, b := strings.Join(strings.Fields(plain), " "), strings.Join(strings.Fields(tc.c.Render()), " "); a != b {
				t.Errorf("nft lists\n%s\nbut Render gives\n%s", listed, tc.c.Render())
			}
			if err := Verify(ns.Path, tc.c); err != nil {
				t.Errorf("Verify: %v", err)
			}
			// Reinstalling another program replaces it atomically and completely.
			other := goldenCaptures[(slicesIndex(tc.name)+1)%len(goldenCaptures)].c
			if err := Install(ns.Path, other); err != nil {
				t.Fatal(err)
			}
			if err := Verify(ns.Path, other); err != nil {
				t.Errorf("Verify after reinstall: %v", err)
			}
			if err := Verify(ns.Path, tc.c); err == nil && other.Render() != tc.c.Render() {
				t.Errorf("Verify of the replaced program passed")
			}
		})
	}
}

var counterValues = regexp.MustCompile(`counter packets \d+ bytes \d+`)

func slicesIndex(name string) int {
	for i, tc := range goldenCaptures {
		if tc.name == name {
			return i
		}
	}
	return -1
}

// handle returns the handle of the first rule in chain whose text contains what.
func handle(t *testing.T, ns *testutil.Netns, chain, what string) string {
	t.Helper()
	out := ns.Exec(t, "nft", "-a", "list", "chain", "inet", "kl", chain)
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, what) {
			if i := strings.LastIndex(line, "# handle "); i >= 0 {
				return strings.TrimSpace(line[i+len("# handle "):])
			}
		}
	}
	t.Fatalf("no rule %q in chain %s:\n%s", what, chain, out)
	return ""
}

func TestVerifyCatchesHandEdits(t *testing.T) {
	testutil.RequireTool(t, "nft")
	c := goldenCaptures[4].c // exclusions
	tests := []struct {
		name string
		edit []string // nft arguments
		want []string
	}{
		{"rule deleted", nil, []string{"chain nat_output is missing rule 4: ip daddr 169.254.0.0/16 return"}},
		{"rule added", []string{"insert", "rule", "inet", "kl", "filter_output", "tcp", "dport", "22", "accept"},
			[]string{"chain filter_output has unexpected rule 1: tcp dport 22 accept"}},
		{"element deleted", []string{"delete", "element", "inet", "kl", "exclude_ports", "{", "22", "}"},
			[]string{"set exclude_ports is missing element 22"}},
		{"element added", []string{"add", "element", "inet", "kl", "exclude_v4", "{", "192.0.2.0/24", "}"},
			[]string{"set exclude_v4 has unexpected element 192.0.2.0/24"}},
		{"chain deleted", []string{"delete", "chain", "inet", "kl", "filter_output"}, []string{"chain filter_output is missing"}},
		{"table deleted", []string{"delete", "table", "inet", "kl"}, []string{"no kl table"}},
		{"policy changed", []string{"chain", "inet", "kl", "filter_output", "{", "policy", "drop", ";", "}"},
			[]string{"chain filter_output is type filter (hook output, policy drop) priority 0, want type filter priority 0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ns := testutil.NewNetns(t, "klver")
			if err := Install(ns.Path, c); err != nil {
				t.Fatal(err)
			}
			edit := tc.edit
			if edit == nil {
				h := handle(t, ns, "nat_output", "ip daddr 169.254.0.0/16 return")
				edit = []string{"delete", "rule", "inet", "kl", "nat_output", "handle", h}
			}
			ns.Exec(t, "nft", edit...)
			err := Verify(ns.Path, c)
			if err == nil {
				t.Fatalf("Verify after `nft %s` = nil", strings.Join(edit, " "))
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Verify = %v\nwant it to say %q", err, w)
				}
			}
			if n := strings.Count(err.Error(), "\n  "); tc.name != "table deleted" && n != 1 {
				t.Errorf("Verify reported %d differences, want 1:\n%v", n, err)
			}
		})
	}
}

func TestRemove(t *testing.T) {
	testutil.RequireTool(t, "nft")
	ns := testutil.NewNetns(t, "klrm")
	c := goldenCaptures[0].c
	if err := Install(ns.Path, c); err != nil {
		t.Fatal(err)
	}
	// Someone else's table in the same netns is left alone.
	ns.Exec(t, "nft", "add", "table", "inet", "other")
	for i := range 2 {
		if err := Remove(ns.Path); err != nil {
			t.Fatalf("Remove #%d: %v", i+1, err)
		}
	}
	if out := ns.Exec(t, "nft", "list", "tables"); strings.TrimSpace(out) != "table inet other" {
		t.Errorf("tables after Remove:\n%s", out)
	}
	if err := Verify(ns.Path, c); !errors.Is(err, ErrNoTable) {
		t.Errorf("Verify after Remove = %v, want ErrNoTable", err)
	}

	// The netns itself is gone: Remove is still fine, Install and Verify are not.
	gone := testutil.NewNetns(t, "klgone")
	if err := Install(gone.Path, c); err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, "ip", "netns", "del", gone.Name)
	if err := Remove(gone.Path); err != nil {
		t.Errorf("Remove on a deleted netns = %v, want nil", err)
	}
	if err := Install(gone.Path, c); err == nil {
		t.Error("Install on a deleted netns succeeded")
	}
	if err := Verify(gone.Path, c); err == nil {
		t.Error("Verify on a deleted netns succeeded")
	}
	testutil.Run(t, "ip", "netns", "add", gone.Name) // for the cleanup's delete

	// A mount point whose namespace was unmounted (a runtime cleaning up half-way) is gone
	// too, and so is a /proc path of a process that exited.
	stale := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{stale, "/proc/999999999/ns/net"} {
		if err := Remove(p); err != nil {
			t.Errorf("Remove(%s) = %v, want nil", p, err)
		}
		if err := Install(p, c); err == nil {
			t.Errorf("Install(%s) succeeded", p)
		}
	}
}

func TestOriginalDstUnredirected(t *testing.T) {
	ns := testutil.NewNetns(t, "klod")
	ln, err := Listen(ns.Path, "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := Dial(context.Background(), ns.Path, 0, "tcp", ln.Addr().String())
		if err == nil {
			io.Copy(io.Discard, c)
			c.Close()
		}
	}()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Without a nat rule conntrack still knows the flow: the original destination is the
	// listener itself (or, without conntrack, an error); never garbage.
	dst, err := OriginalDst(c.(*net.TCPConn))
	if err == nil && dst != netip.MustParseAddrPort(ln.Addr().String()) {
		t.Errorf("OriginalDst of an unredirected flow = %v, want %v", dst, ln.Addr())
	}
	if _, err := OriginalDst(nil); err == nil {
		t.Error("OriginalDst(nil) returned no error")
	}
}

// immediateRefusal reports an error a local reject produces: the dropped packet fails the
// send (EPERM), or the ICMP/RST answer arrives (ECONNREFUSED, EACCES, EHOSTUNREACH).
func immediateRefusal(err error) bool {
	for _, e := range []error{syscall.EPERM, syscall.ECONNREFUSED, syscall.EACCES, syscall.EHOSTUNREACH} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func BenchmarkInstall(b *testing.B) {
	testutil.RequireTool(b, "nft")
	ns := testutil.NewNetns(b, "klbi")
	c := goldenCaptures[4].c
	for b.Loop() {
		if err := Install(ns.Path, c); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	testutil.RequireTool(b, "nft")
	ns := testutil.NewNetns(b, "klbv")
	c := goldenCaptures[4].c
	if err := Install(ns.Path, c); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := Verify(ns.Path, c); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkInstallRemove(b *testing.B) {
	testutil.RequireTool(b, "nft")
	ns := testutil.NewNetns(b, "klbr")
	c := goldenCaptures[0].c
	for b.Loop() {
		if err := Install(ns.Path, c); err != nil {
			b.Fatal(err)
		}
		if err := Remove(ns.Path); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDo(b *testing.B) {
	ns := testutil.NewNetns(b, "klbd")
	for b.Loop() {
		if err := Do(ns.Path, func() error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkListen(b *testing.B) {
	ns := testutil.NewNetns(b, "klbl")
	for b.Loop() {
		ln, err := Listen(ns.Path, "tcp4", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		ln.Close()
	}
}

func BenchmarkDial(b *testing.B) {
	ns := testutil.NewNetns(b, "klbdl")
	ln, err := Listen(ns.Path, "tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	ctx := context.Background()
	for b.Loop() {
		c, err := Dial(ctx, ns.Path, 0x539, "tcp4", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

// BenchmarkInstallFresh measures what a CNI ADD and DEL pay: Install into a netns that has
// never had a nat chain (the kernel sets up conntrack and nat for it), then Remove.
func BenchmarkInstallFresh(b *testing.B) {
	testutil.RequireTool(b, "nft")
	c := goldenCaptures[0].c
	var install, remove []time.Duration
	for b.Loop() {
		b.StopTimer()
		name := testutil.Name("klbf")
		testutil.Run(b, "ip", "netns", "add", name)
		path := "/var/run/netns/" + name
		b.StartTimer()
		t0 := time.Now()
		if err := Install(path, c); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := Remove(path); err != nil {
			b.Fatal(err)
		}
		install = append(install, t1.Sub(t0))
		remove = append(remove, time.Since(t1))
		b.StopTimer()
		testutil.Run(b, "ip", "netns", "del", name)
		b.StartTimer()
	}
	for _, m := range []struct {
		name string
		d    []time.Duration
	}{{"install", install}, {"remove", remove}} {
		slices.Sort(m.d)
		b.ReportMetric(float64(m.d[len(m.d)/2].Microseconds()), m.name+"-p50-µs")
		b.ReportMetric(float64(m.d[len(m.d)*99/100].Microseconds()), m.name+"-p99-µs")
	}
}

// The kernel backend applies and reads back an extended program exactly.
func TestExtensionRoundTrip(t *testing.T) {
	testutil.RequireTool(t, "nft")
	ns := testutil.NewNetns(t, "klext")
	p := goldenCaptures[1].c.build(extension{
		sets: []Set{{Name: "direct_v4", Type: SetIPv4, Addrs: mergeRanges(prefixes("203.0.113.0/24", "192.0.2.64/26"))}},
		decisions: []Rule{
			{Match: []Match{MatchDaddrSet{4, "direct_v4"}}, Action: Accept},
			{Match: []Match{MatchDaddr{netip.MustParsePrefix("198.51.100.0/22")}, MatchDport{ProtoTCP, 5432}}, Action: Accept},
			{Match: []Match{MatchDaddr{netip.MustParsePrefix("fd00:ab::/33")}}, Action: Drop},
			{Match: []Match{MatchDaddr{netip.MustParsePrefix("203.0.113.9/32")}, MatchL4Proto{ProtoTCP}}, Action: Reject{RejectAdminProhibited}},
			{Match: []Match{MatchDaddr{netip.MustParsePrefix("203.0.113.10/32")}, MatchL4Proto{ProtoTCP}}, Action: Reject{RejectTCPReset}},
		},
	})
	if err := defaultBackend.Apply(ns.Path, p); err != nil {
		t.Fatal(err)
	}
	got, err := defaultBackend.Get(ns.Path, TableName)
	if err != nil {
		t.Fatal(err)
	}
	if d := Diff(p, got); len(d) != 0 {
		t.Errorf("read back differs: %q\n%s", d, got)
	}
	listed := counterValues.ReplaceAllString(ns.Exec(t, "nft", "list", "table", "inet", "kl"), "counter")
	if a, b := strings.Join(strings.Fields(listed), " "), strings.Join(strings.Fields(p.Render()), " "); a != b {
		t.Errorf("nft lists\n%s\nbut Render gives\n%s", listed, p.Render())
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// Many add/check/delete cycles leave no file descriptor or goroutine behind.
func TestNoLeaks(t *testing.T) {
	testutil.RequireTool(t, "nft")
	ns := testutil.NewNetns(t, "klleak")
	c := goldenCaptures[4].c
	cycle := func() {
		if err := Install(ns.Path, c); err != nil {
			t.Fatal(err)
		}
		if err := Verify(ns.Path, c); err != nil {
			t.Fatal(err)
		}
		ln, err := Listen(ns.Path, "tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		conn, err := Dial(context.Background(), ns.Path, c.Mark, "tcp4", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conn.Close()
		ln.Close()
		if err := Remove(ns.Path); err != nil {
			t.Fatal(err)
		}
	}
	cycle() // warm up lazily opened descriptors (netpoll, etc.)
	fds, gs := openFDs(t), runtime.NumGoroutine()
	for range 50 {
		cycle()
	}
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > gs && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := openFDs(t); got > fds {
		t.Errorf("open fds grew from %d to %d over 50 cycles", fds, got)
	}
	if got := runtime.NumGoroutine(); got > gs {
		t.Errorf("goroutines grew from %d to %d over 50 cycles", gs, got)
	}
}

// A dial to an address nobody answers (no ARP reply) ends when ctx does, by deadline or by
// cancellation, and does not hold an OS thread while it waits.
func TestDialHonoursContext(t *testing.T) {
	pod := testutil.NewNetns(t, "klctx")
	srv := testutil.NewNetns(t, "klctxs")
	testutil.Link(t, pod, []string{"192.0.2.1/24"}, srv, []string{"192.0.2.2/24"})

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Dial(ctx, pod.Path, 0x539, "tcp", "192.0.2.99:80")
	if el := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || el > 2*time.Second {
		t.Errorf("Dial with a 300ms deadline = %v after %v, want the deadline", err, el)
	}

	ctx2, cancel2 := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel2)
	start = time.Now()
	_, err = Dial(ctx2, pod.Path, 0x539, "tcp", "192.0.2.99:80")
	if el := time.Since(start); !errors.Is(err, context.Canceled) || el > 2*time.Second {
		t.Errorf("Dial cancelled after 200ms = %v after %v, want context.Canceled", err, el)
	}

	// Many slow dials at once: the threads stay few, since none is locked while waiting.
	ctx3, cancel3 := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel3()
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			Dial(ctx3, pod.Path, 0, "tcp", "192.0.2.99:80")
		}()
	}
	time.Sleep(250 * time.Millisecond)
	threads := countThreads(t)
	wg.Wait()
	if threads > 40 {
		t.Errorf("%d OS threads while 64 dials wait, want the waits not to pin threads", threads)
	}
	if _, err := Dial(context.Background(), pod.Path, 0, "tcp4", "[fd00::1]:80"); err == nil {
		t.Error("tcp4 dial to an IPv6 address succeeded")
	}
}

func countThreads(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestHandle: a handle dials and listens in its netns like the path-based calls, marks
// its sockets, leaves accepted connections without keepalive, returns every thread to the
// process's netns, and fails cleanly once closed.
func TestHandle(t *testing.T) {
	ns := testutil.NewNetns(t, "klhd")
	h, err := Open(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	if h.Path() != ns.Path {
		t.Errorf("Path() = %q, want %q", h.Path(), ns.Path)
	}
	ln, err := h.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// Plain TCP, not an MPTCP listener (Go's default).
	if proto := sockopt(t, ln.(*net.TCPListener), unix.SOL_SOCKET, unix.SO_PROTOCOL); proto != unix.IPPROTO_TCP {
		t.Errorf("listener protocol %d, want IPPROTO_TCP (%d)", proto, unix.IPPROTO_TCP)
	}
	accepted := make(chan *net.TCPConn, 64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			fmt.Fprintf(c, "ok\n")
			accepted <- c.(*net.TCPConn)
		}
	}()
	// The listener is in the netns: not reachable from the host's.
	if c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Errorf("listener opened through the handle is reachable from the host netns")
	}

	host := inode(t, "/proc/self/ns/net")
	const n = 32
	var wg sync.WaitGroup
	errs := make(chan error, n)
	conns := make(chan net.Conn, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			// Half by text, half by address (DialAddrPort, what the relay's direct exit uses).
			var c net.Conn
			var err error
			if i%2 == 0 {
				c, err = h.Dial(ctx, 0x4243, "tcp4", ln.Addr().String())
			} else {
				c, err = h.DialAddrPort(ctx, 0x4243, ln.Addr().(*net.TCPAddr).AddrPort())
			}
			if err != nil {
				errs <- err
				return
			}
			conns <- c
			_ = c.SetDeadline(time.Now().Add(3 * time.Second))
			if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "ok\n" {
				errs <- fmt.Errorf("read: %q, %v", line, err)
			}
			// The goroutine's thread is back in the host netns.
			runtime.LockOSThread()
			got := inode(t, threadNetns)
			runtime.UnlockOSThread()
			if got != host {
				errs <- fmt.Errorf("after Dial the thread is in netns %d, want %d", got, host)
			}
		}()
	}
	wg.Wait()
	close(errs)
	close(conns)
	for err := range errs {
		t.Error(err)
	}
	for c := range conns {
		if m := sockopt(t, c.(*net.TCPConn), unix.SOL_SOCKET, unix.SO_MARK); m != 0x4243 {
			t.Errorf("SO_MARK = %#x, want 0x4243", m)
		}
		if ka := sockopt(t, c.(*net.TCPConn), unix.SOL_SOCKET, unix.SO_KEEPALIVE); ka != 0 {
			t.Errorf("dialed socket has SO_KEEPALIVE %d", ka)
		}
		if c.RemoteAddr() == nil || c.RemoteAddr().String() != ln.Addr().String() {
			t.Errorf("RemoteAddr = %v, want %v", c.RemoteAddr(), ln.Addr())
		}
		c.Close()
	}
	for range n {
		select {
		case c := <-accepted:
			if ka := sockopt(t, c, unix.SOL_SOCKET, unix.SO_KEEPALIVE); ka != 0 {
				t.Errorf("accepted socket has SO_KEEPALIVE %d", ka)
			}
			c.Close()
		case <-time.After(3 * time.Second):
			t.Fatal("accepted connections missing")
		}
	}

	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := h.Dial(context.Background(), 0, "tcp4", ln.Addr().String()); !errors.Is(err, errHandleClosed) {
		t.Errorf("Dial after Close: %v, want %v", err, errHandleClosed)
	}
	if _, err := h.Listen("tcp4", "127.0.0.1:0"); !errors.Is(err, errHandleClosed) {
		t.Errorf("Listen after Close: %v, want %v", err, errHandleClosed)
	}
	if _, err := Open("/nonexistent/netns"); err == nil {
		t.Error("Open of a missing netns succeeded")
	}
	// The current netns needs no descriptor.
	cur, err := Open("")
	if err != nil {
		t.Fatal(err)
	}
	if err := cur.Do(func() error {
		if got := inode(t, threadNetns); got != host {
			return fmt.Errorf("Do on the current handle ran in netns %d, want %d", got, host)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	cur.Close()
}

// sockopt reads an integer socket option of c.
func sockopt(t *testing.T, c syscall.Conn, level, opt int) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := rc.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), level, opt) }); err != nil {
		t.Fatal(err)
	}
	if gerr != nil {
		t.Fatal(gerr)
	}
	return v
}

// TestDialErrorsNameNoDestination: what a failed dial says, once audit.Reason has cleaned
// it, names neither the destination's address nor its name, whichever way the dial went
// (by address or by name, through a handle or a path, one address or several). The relay
// writes exactly that text into audit records and its log (SPEC §5).
func TestDialErrorsNameNoDestination(t *testing.T) {
	ns := testutil.NewNetns(t, "klerr")
	ln, err := Listen(ns.Path, "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().(*net.TCPAddr).AddrPort() // nothing listens there once closed
	ln.Close()
	port := fmt.Sprint(closed.Port())
	h, err := Open(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := Open(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	gone.Close()
	t.Cleanup(func() { h.Close() })
	// localhost: a name /etc/hosts answers (with 127.0.0.1, and ::1 where listed).
	secrets := []string{"127.0.0.1", "::1", "fd00::", "192.0.2.", "localhost", "no-such-name.invalid", ":" + port}
	for _, tt := range []struct {
		name string
		dial func(context.Context) (net.Conn, error)
	}{
		{"handle, address, refused", func(ctx context.Context) (net.Conn, error) { return h.DialAddrPort(ctx, 0x539, closed) }},
		{"handle, text, refused", func(ctx context.Context) (net.Conn, error) { return h.Dial(ctx, 0x539, "tcp", closed.String()) }},
		{"handle, name, all refused", func(ctx context.Context) (net.Conn, error) { return h.Dial(ctx, 0x539, "tcp", "localhost:"+port) }},
		{"handle, name, wrong family", func(ctx context.Context) (net.Conn, error) { return h.Dial(ctx, 0x539, "tcp6", "localhost:"+port) }},
		{"handle, address, unreachable", func(ctx context.Context) (net.Conn, error) {
			return h.DialAddrPort(ctx, 0x539, netip.MustParseAddrPort("192.0.2.7:"+port))
		}},
		{"handle, closed", func(ctx context.Context) (net.Conn, error) { return gone.DialAddrPort(ctx, 0x539, closed) }},
		{"path, text, refused", func(ctx context.Context) (net.Conn, error) { return Dial(ctx, ns.Path, 0x539, "tcp", closed.String()) }},
		{"path, name, all refused", func(ctx context.Context) (net.Conn, error) {
			return Dial(ctx, ns.Path, 0x539, "tcp", "localhost:"+port)
		}},
		{"path, wrong family", func(ctx context.Context) (net.Conn, error) {
			return Dial(ctx, ns.Path, 0x539, "tcp4", "[fd00::1]:"+port)
		}},
		{"path, unknown name", func(ctx context.Context) (net.Conn, error) {
			return Dial(ctx, ns.Path, 0x539, "tcp", "no-such-name.invalid:"+port)
		}},
		{"path, unknown port", func(ctx context.Context) (net.Conn, error) {
			return Dial(ctx, ns.Path, 0x539, "tcp", "localhost:no-such-name.invalid")
		}},
		{"path, no port", func(ctx context.Context) (net.Conn, error) { return Dial(ctx, ns.Path, 0x539, "tcp", "localhost") }},
		{"current netns, name", func(ctx context.Context) (net.Conn, error) { return Dial(ctx, "", 0x539, "tcp", "localhost:"+port) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			c, err := tt.dial(ctx)
			if err == nil {
				c.Close()
				t.Fatal("dial succeeded")
			}
			got := audit.Reason(err)
			t.Logf("%q", got)
			for _, s := range secrets {
				if strings.Contains(got, s) {
					t.Errorf("audit.Reason(%q) = %q, names %q", err, got, s)
				}
			}
		})
	}
}

// TestDoCurrentPanic: a panic in fn is an error also when fn runs in the current netns
// (no setns), as Do's doc says, for Do and for a handle of the current netns.
func TestDoCurrentPanic(t *testing.T) {
	h, err := Open("")
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, tt := range []struct {
		name string
		do   func(func() error) error
	}{
		{"Do empty path", func(fn func() error) error { return Do("", fn) }},
		{"Do /proc/self/ns/net", func(fn func() error) error { return Do("/proc/self/ns/net", fn) }},
		{"Handle.Do current", h.Do},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.do(func() error { panic("oops") })
			if err == nil || !strings.Contains(err.Error(), "oops") {
				t.Errorf("panicking fn returned %v, want the panic as an error", err)
			}
		})
	}
}
