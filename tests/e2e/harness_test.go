package e2e

import (
	"bufio"
	"context"
	"crypto/sha512"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/tests/testutil"
)

// cniBin is where tests/deps.sh puts the CNI reference plugins and cnitool.
func cniBin(t testing.TB) string {
	t.Helper()
	return testutil.CNIPlugins(t, "bridge", "host-local", "loopback", "portmap", "cnitool")
}

// node is a CNI node inside its own netns ("node"): the bridge, the veths' host ends and
// kl-relayd live there, so the test never touches the host's network. A second netns
// ("host") plays a machine beyond the node: 198.51.100.2, fd00:51::2 and the metadata
// address 169.254.169.254.
type node struct {
	t       testing.TB
	dir     string
	ns      *testutil.Netns
	host    *testutil.Netns
	cniPath string
	netName string
	socket  string
	rules   string
	relay   *exec.Cmd
	relayWG sync.WaitGroup
	logs    *testutil.Buffer
}

const rulesYAML = `default: direct
rules:
  - domain: blocked.example
    action: deny
    note: sni deny
  - cidr: 203.0.113.0/24
    action: deny
    note: test deny
`

func newNode(t testing.TB, ipv6 bool) *node {
	t.Helper()
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "nft", "ss")
	n := &node{t: t, dir: t.TempDir(), logs: &testutil.Buffer{}}
	n.cniPath = filepath.Dir(testutil.Bin(t, "kl-cni")) + ":" + cniBin(t)
	testutil.Bin(t, "kl-relayd")
	n.ns = testutil.NewNetns(t, "kln")
	n.host = testutil.NewNetns(t, "klh")
	for _, s := range []string{"net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1", "net.ipv6.conf.default.accept_dad=0"} {
		n.ns.Exec(t, "sysctl", "-qw", s)
	}
	testutil.Link(t, n.ns, []string{"198.51.100.1/24", "fd00:51::1/64"}, n.host, []string{"198.51.100.2/24", "169.254.169.254/32", "fd00:51::2/64"})
	n.host.Exec(t, "ip", "route", "add", "default", "via", "198.51.100.1")
	n.host.Exec(t, "ip", "-6", "route", "add", "default", "via", "fd00:51::1")
	n.ns.Exec(t, "ip", "route", "add", "169.254.169.254/32", "via", "198.51.100.2")

	n.netName = testutil.Name("kl")
	n.socket = filepath.Join(n.dir, "relayd.sock")
	n.rules = filepath.Join(n.dir, "rules.yaml")
	must(t, os.WriteFile(n.rules, []byte(rulesYAML), 0o644))
	settings := fmt.Sprintf("socket: %s\nstateDir: %s\nrules: %s\nidleTimeout: 30s\nconnectTimeout: 3s\naudit: {path: %s}\n",
		n.socket, filepath.Join(n.dir, "state"), n.rules, filepath.Join(n.dir, "audit.jsonl"))
	must(t, os.WriteFile(filepath.Join(n.dir, "relayd.yaml"), []byte(settings), 0o600))

	ranges := `[[{"subnet": "192.0.2.0/24"}]]`
	routes := `[{"dst": "0.0.0.0/0"}]`
	if ipv6 {
		ranges = `[[{"subnet": "192.0.2.0/24"}], [{"subnet": "fd00:c0::/64"}]]`
		routes = `[{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]`
	}
	conflist := fmt.Sprintf(`{
  "cniVersion": "1.1.0",
  "name": %q,
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false,
     "ipam": {"type": "host-local", "dataDir": %q, "ranges": %s, "routes": %s}},
    {"type": "loopback"},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "kl-cni", "socket": %q, "ipv6": %v, "timeout": "3s",
     "capabilities": {"io.kubernetes.cri.pod-annotations": true}}
  ]
}`, n.netName, testutil.Name("klbr"), filepath.Join(n.dir, "ipam"), ranges, routes, n.socket, ipv6)
	must(t, os.MkdirAll(filepath.Join(n.dir, "net.d"), 0o755))
	must(t, os.WriteFile(filepath.Join(n.dir, "net.d", "10-kl.conflist"), []byte(conflist), 0o644))
	return n
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// startRelay starts kl-relayd in the node netns and waits until it is ready.
func (n *node) startRelay() {
	t := n.t
	t.Helper()
	cmd := n.ns.Command(testutil.Bin(t, "kl-relayd"), "--settings", filepath.Join(n.dir, "relayd.yaml"))
	cmd.Stdout, cmd.Stderr = n.logs, n.logs
	must(t, cmd.Start())
	n.relay = cmd
	n.relayWG.Add(1)
	go func() { defer n.relayWG.Done(); cmd.Wait() }()
	t.Cleanup(func() { n.stopRelay() })
	c := n.client()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("kl-relayd not ready after 10s:\n%s", n.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stopRelay stops kl-relayd (SIGTERM by PID, then SIGKILL) and waits for it to exit.
func (n *node) stopRelay() {
	if n.relay == nil {
		return
	}
	cmd := n.relay
	n.relay = nil
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { n.relayWG.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func (n *node) client() *api.Client { return api.NewClient(n.socket, 3*time.Second) }

// cnitool runs cnitool in the node netns.
func (n *node) cnitool(env []string, args ...string) (string, error) {
	cmd := n.ns.Command(filepath.Join(cniBin(n.t), "cnitool"), args...)
	cmd.Env = append(os.Environ(), "CNI_PATH="+n.cniPath, "NETCONFPATH="+filepath.Join(n.dir, "net.d"))
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// pod is a sandbox netns attached to the node's network.
type pod struct {
	ns   *testutil.Netns
	id   string // the container id cnitool derives from the netns path
	v4   netip.Addr
	v6   netip.Addr
	args []string
}

func (n *node) newPod(name string) *pod {
	n.t.Helper()
	return n.newPodAnnotated(name, `{"team":"e2e"}`)
}

// newPodAnnotated makes a pod whose runtime passes the given pod annotations (JSON).
func (n *node) newPodAnnotated(name, annotations string) *pod {
	t := n.t
	t.Helper()
	p := &pod{ns: testutil.NewNetns(t, "klp")}
	p.ns.Exec(t, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0")
	sum := sha512.Sum512([]byte(p.ns.Path))
	p.id = fmt.Sprintf("cnitool-%x", sum[:10])
	p.args = []string{"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=e2e;K8S_POD_NAME=" + name + ";K8S_POD_INFRA_CONTAINER_ID=" + p.id,
		`CAP_ARGS={"io.kubernetes.cri.pod-annotations":` + annotations + `}`}
	return p
}

var ipRE = regexp.MustCompile(`"address":\s*"([^"/]+)/`)

// add runs ADD for the pod; on success it records the pod's addresses from the result.
func (n *node) add(p *pod) (string, error) {
	start := time.Now()
	out, err := n.cnitool(p.args, "add", n.netName, p.ns.Path)
	n.t.Logf("cnitool add %s: %v", p.ns.Name, time.Since(start))
	if err == nil {
		for _, m := range ipRE.FindAllStringSubmatch(out, -1) {
			a := netip.MustParseAddr(m[1])
			if a.Is4() {
				p.v4 = a
			} else {
				p.v6 = a
			}
		}
		n.t.Cleanup(func() { n.cnitool(p.args, "del", n.netName, p.ns.Path) })
	}
	return out, err
}

func (n *node) del(p *pod) (string, error) { return n.cnitool(p.args, "del", n.netName, p.ns.Path) }
func (n *node) check(p *pod) (string, error) {
	return n.cnitool(p.args, "check", n.netName, p.ns.Path)
}

// server listens on the test host (dual-stack, port 8080). Each connection gets one line,
// the peer address it saw, and then an echo.
func (n *node) server() {
	t := n.t
	ln, err := netns.Listen(n.host.Path, "tcp", ":8080")
	must(t, err)
	testutil.Serve(t, ln, func(c net.Conn) {
		ra := c.RemoteAddr().(*net.TCPAddr).AddrPort()
		fmt.Fprintf(c, "%s\n", netip.AddrPortFrom(ra.Addr().Unmap(), ra.Port()))
		io.Copy(c, c)
	})
}

// visit connects from inside the pod (an unmarked socket, so it is captured like any app's),
// reads the address the server saw and checks an echo. It returns that address and the
// client's own local address.
func visit(t *testing.T, p *pod, addr string) (seen, local netip.AddrPort, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := netns.Dial(ctx, p.ns.Path, 0, "tcp", addr)
	if err != nil {
		return seen, local, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	la := c.LocalAddr().(*net.TCPAddr).AddrPort()
	local = netip.AddrPortFrom(la.Addr().Unmap(), la.Port())
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		return seen, local, err
	}
	if seen, err = netip.ParseAddrPort(strings.TrimSpace(line)); err != nil {
		return seen, local, err
	}
	if _, err := c.Write([]byte("ping")); err != nil {
		return seen, local, err
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
		return seen, local, fmt.Errorf("echo: %q, %v", buf, err)
	}
	return seen, local, nil
}

func (n *node) status() api.Status {
	var st api.Status
	must(n.t, n.client().Call(context.Background(), "GET", "/v1/status", nil, &st))
	return st
}
