// Package attach holds the end-to-end tests of client-side egress: a pod in transparent
// mode, a node running the relay with its attach listener, a "laptop" holding a
// `kl-ctl attach` session and a "corp" host only the laptop can reach, each in its own
// network namespace.
package attach

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/attach"
	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/relayd/relay"
	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/tests/testutil"
)

const (
	mark       = 0x4b4c
	attachAddr = "198.51.100.1:7443"
	corpAddr   = "203.0.113.10:8080"
	laptopCorp = "203.0.113.1" // the laptop's address on the corp network
	gwHostAddr = "198.51.100.18:8080"
	nodeGwSide = "198.51.100.17" // the node's address towards the gateway-only host
	token      = "alice-e2e-token-0123456789"
)

// topo is the whole topology. The node's relay and attach listener run in this test
// process with their sockets inside the node and pod namespaces (package netns), the
// way kl-relayd opens them; kl-ctl runs as a real process in the laptop's namespace.
type topo struct {
	t                      testing.TB
	dir                    string
	node, laptop, corp, gw *testutil.Netns
	pki                    *testutil.PKI
	policy                 atomic.Pointer[rules.Policy]
	srv                    *attach.Server
	rel                    *relay.Relay
	log                    *testutil.Buffer
	audit                  *audit.Log
	tokenFile              string
	stopAttach             func()
}

// serveAttach opens the attach listener in the node's netns and serves it until
// stopAttach.
func (tp *topo) serveAttach() {
	tp.t.Helper()
	ln, err := netns.Listen(tp.node.Path, "tcp4", attachAddr)
	must(tp.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { tp.srv.Serve(ctx, ln); close(served) }()
	tp.stopAttach = func() { cancel(); <-served }
}

type pod struct {
	ns *testutil.Netns
	w  api.Workload
}

func mustPolicy(t testing.TB, src string, gateway bool) *rules.Policy {
	t.Helper()
	p, err := rules.Parse("rules.yaml", []byte(src), rules.LoadOptions{AllowGateway: gateway})
	if err != nil {
		t.Fatalf("policy: %v", err)
	}
	return p
}

func newTopo(t testing.TB, policy string) *topo {
	t.Helper()
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "nft", "ss")
	tp := &topo{t: t, dir: t.TempDir(), log: &testutil.Buffer{}}
	tp.policy.Store(mustPolicy(t, policy, true))
	tp.node = testutil.NewNetns(t, "kan")
	tp.laptop = testutil.NewNetns(t, "kal")
	tp.corp = testutil.NewNetns(t, "kac")
	tp.gw = testutil.NewNetns(t, "kag")
	// The node does not forward: what the pod reaches beyond the node, it reaches through
	// the relay's own dials.
	testutil.Link(t, tp.node, []string{"198.51.100.1/28"}, tp.laptop, []string{"198.51.100.2/28"})
	testutil.Link(t, tp.laptop, []string{laptopCorp + "/24"}, tp.corp, []string{"203.0.113.10/24"})
	testutil.Link(t, tp.node, []string{nodeGwSide + "/28"}, tp.gw, []string{"198.51.100.18/28"})
	whoami(t, tp.corp, corpAddr)
	whoami(t, tp.gw, gwHostAddr)

	var err error
	if tp.audit, err = audit.New("", 0, 0, 256); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(tp.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	tp.pki = testutil.NewPKI(t)
	tp.pki.Cert, tp.pki.Key = tp.pki.Issue("kl-relayd", true, "198.51.100.1")
	tp.tokenFile = filepath.Join(tp.dir, "token")
	must(t, os.WriteFile(tp.tokenFile, []byte(token+"\n"), 0o600))
	tp.srv, err = attach.NewServer(attach.ServerOptions{
		Settings: &attach.Settings{Listen: attachAddr, Cert: tp.pki.Cert, Key: tp.pki.Key, ClientCA: tp.pki.CAFile,
			Credentials: []attach.Credential{
				{Name: "alice", Token: token, Workloads: []string{"pod-a"}},
				{Name: "bob", Subject: "bob@laptop", Selector: "team=pay"},
			}},
		Policy: tp.policy.Load, Log: log, Audit: tp.audit,
	})
	must(t, err)
	tp.serveAttach()

	tp.rel = relay.New(relay.Options{
		Mark: mark, ConnectTimeout: 3 * time.Second, IdleTimeout: 30 * time.Second, Debug: true, Log: log,
		Policy: func() relay.Decider { return tp.policy.Load() },
		Exits: map[string]relay.DialFunc{
			// As the daemon wires them: `client` asks the attach sessions and never falls
			// back; `gateway` dials from the node's own namespace.
			rules.ExitClient: tp.srv.Exit(),
			rules.ExitGateway: func(ctx context.Context, w *api.Workload, dst relay.Dest) (net.Conn, error) {
				return netns.Dial(ctx, tp.node.Path, mark, "tcp", dst.Addr.String())
			},
		},
	})
	t.Cleanup(func() {
		tp.stopAttach()
		sctx, c2 := context.WithTimeout(context.Background(), 2*time.Second)
		defer c2()
		tp.rel.Shutdown(sctx)
		if t.Failed() {
			t.Logf("relay and attach log:\n%s", tp.log.String())
		}
	})
	return tp
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// addPod makes a pod netns behind the node with transparent capture and opens its relay
// listener.
func (tp *topo) addPod(id string, n int, labels map[string]string) *pod {
	t := tp.t
	t.Helper()
	p := &pod{ns: testutil.NewNetns(t, "kap")}
	nodeIP, podIP := fmt.Sprintf("192.0.2.%d", 4*n+1), fmt.Sprintf("192.0.2.%d", 4*n+2)
	testutil.Link(t, tp.node, []string{nodeIP + "/30"}, p.ns, []string{podIP + "/30"})
	p.ns.Exec(t, "ip", "route", "add", "default", "via", nodeIP)
	must(t, netns.Install(p.ns.Path, netns.Capture{RedirectPort: api.DefaultRedirectPort, Mark: mark}))
	p.w = api.Workload{ID: id, Netns: p.ns.Path, Mode: api.ModeTransparent, Source: "cni", Labels: labels, Addrs: []netip.Addr{netip.MustParseAddr(podIP)}}
	_, err := tp.rel.Open(p.w)
	must(t, err)
	t.Cleanup(func() { tp.rel.Close(id); netns.Remove(p.ns.Path) })
	return p
}

// whoami serves addr inside ns: each connection gets the peer address it came from, one
// line, then an echo.
func whoami(t testing.TB, ns *testutil.Netns, addr string) {
	t.Helper()
	ln, err := netns.Listen(ns.Path, "tcp4", addr)
	must(t, err)
	testutil.Serve(t, ln, func(c net.Conn) {
		fmt.Fprintf(c, "%s\n", c.RemoteAddr())
		io.Copy(c, c)
	})
}

// visit connects from the pod as any application would (an unmarked socket, so it is
// captured) and returns the address the server saw.
func visit(p *pod, addr string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := netns.Dial(ctx, p.ns.Path, 0, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("no greeting: %w", err)
	}
	c.Write([]byte("ping"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
		return "", fmt.Errorf("echo %q: %v", buf, err)
	}
	host, _, _ := net.SplitHostPort(strings.TrimSpace(line))
	return host, nil
}

func (tp *topo) waitLive(w *api.Workload, want bool) {
	tp.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for tp.srv.Live(w) != want {
		if time.Now().After(deadline) {
			tp.t.Fatalf("attach session live for %s stayed %v\n%s", w.ID, !want, tp.log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// auditedNoSession reports whether an audit record says a client flow found no session.
func (tp *topo) auditedNoSession() int {
	n := 0
	for _, r := range tp.audit.Recent(256) {
		if r.Exit == rules.ExitClient && r.Reason == attach.ErrNoSession.Error() {
			n++
		}
	}
	return n
}

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// bin returns kl-ctl or kl-relayd: from KL_BIN when make built them, else built once here
// (only the two commands, not the whole tree).
func bin(t testing.TB, name string) string {
	t.Helper()
	if d := os.Getenv("KL_BIN"); d != "" {
		return filepath.Join(d, name)
	}
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "kl-attach-bin-")
		if binErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", binDir+"/", "./relayd/kl-ctl", "./relayd/kl-relayd")
		cmd.Dir = testutil.ModuleRoot(t)
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return filepath.Join(binDir, name)
}

// klctl is one kl-ctl process in the laptop's namespace.
type klctl struct {
	cmd  *exec.Cmd
	out  *testutil.Buffer
	done chan error
}

func (tp *topo) klctl(env []string, args ...string) *klctl {
	t := tp.t
	t.Helper()
	k := &klctl{out: &testutil.Buffer{}, done: make(chan error, 1)}
	k.cmd = tp.laptop.Command(bin(t, "kl-ctl"), args...)
	// The laptop's proxy environment is the test's to set: none unless env says so.
	k.cmd.Env = append(os.Environ(), "HOME="+tp.dir, "XDG_RUNTIME_DIR=")
	for _, v := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"} {
		k.cmd.Env = append(k.cmd.Env, v+"=", strings.ToLower(v)+"=")
	}
	k.cmd.Env = append(k.cmd.Env, env...)
	k.cmd.Stdout, k.cmd.Stderr = k.out, k.out
	must(t, k.cmd.Start())
	go func() { k.done <- k.cmd.Wait() }()
	t.Cleanup(func() { k.stop() })
	return k
}

// stop ends kl-ctl with SIGTERM (by PID, SIGKILL after 5s) and returns its exit error.
func (k *klctl) stop() error {
	if k.cmd.ProcessState != nil {
		return nil
	}
	k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-k.done:
		return err
	case <-time.After(5 * time.Second):
		k.cmd.Process.Kill()
		return <-k.done
	}
}

func (k *klctl) wait(d time.Duration) (error, bool) {
	select {
	case err := <-k.done:
		return err, true
	case <-time.After(d):
		return nil, false
	}
}
