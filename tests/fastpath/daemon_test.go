package fastpath_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/relayd/audit"
	"github.com/kl-egress/kl/tests/testutil"
)

const proxyPort = 3128

// The daemon's policy before and after the reload: A relays one CIDR to the upstream
// proxy and decides the rest (direct) in the kernel; B is all direct (no redirect at all).
const (
	daemonRulesA = `default: direct
rules:
  - cidr: 198.51.100.0/24
    action: proxy
    note: via upstream
  - cidr: 192.0.2.0/25
    action: direct
    note: cluster
`
	daemonRulesB = `default: direct
rules:
  - cidr: 192.0.2.0/25
    action: direct
    note: cluster
`
)

// daemonNode is a pod and a test host (as newTopo) with the real kl-relayd serving the
// pod, and a CONNECT proxy on the host that answers "proxy <target>".
type daemonNode struct {
	pod, host *testutil.Netns
	dir       string
	rules     string
	sock      string
	client    *api.Client
	logs      *testutil.Buffer
	stop      func()
}

func newDaemonNode(t *testing.T) *daemonNode {
	t.Helper()
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "nft", "ip")
	bin := testutil.Bin(t, "kl-relayd")
	n := &daemonNode{pod: testutil.NewNetns(t, "klfdp"), host: testutil.NewNetns(t, "klfdh"), dir: t.TempDir(), logs: &testutil.Buffer{}}
	testutil.Link(t, n.pod, []string{"203.0.113.1/24", "fdff::1/64"}, n.host, []string{"203.0.113.254/24", "fdff::fe/64"})
	n.pod.Exec(t, "ip", "route", "add", "default", "via", "203.0.113.254")
	n.pod.Exec(t, "ip", "-6", "route", "add", "default", "via", "fdff::fe")
	for _, p := range reachable {
		if p.Addr().Is4() {
			n.host.Exec(t, "ip", "route", "add", "local", p.String(), "dev", "lo")
		} else {
			n.host.Exec(t, "ip", "-6", "route", "add", "local", p.String(), "dev", "lo")
		}
	}
	nft := filepath.Join(n.dir, "host.nft")
	must(t, os.WriteFile(nft, []byte(fmt.Sprintf("table inet klfdhost {\n chain pre {\n  type nat hook prerouting priority -100; policy accept;\n  tcp dport != %d redirect to :%d\n }\n}\n", proxyPort, serverPort)), 0o644))
	n.host.Exec(t, "nft", "-f", nft)
	serve(t, n.host.Path, serverPort, "host")
	connectProxy(t, n.host.Path)

	// The plain capture first, as kl-cni ADD does before it registers.
	c := netns.Capture{RedirectPort: api.DefaultRedirectPort, Mark: api.DefaultMark, IPv6: true, RejectQUIC: true}
	must(t, netns.Install(n.pod.Path, c))
	t.Cleanup(func() { _ = netns.Remove(n.pod.Path) })

	n.rules = filepath.Join(n.dir, "rules.yaml")
	must(t, os.WriteFile(n.rules, []byte(daemonRulesA), 0o644))
	n.sock = filepath.Join(n.dir, "relayd.sock")
	sock := n.sock
	settings := fmt.Sprintf("socket: %s\nstateDir: %s\nrules: %s\nrulesPoll: 1h\nconnectTimeout: 3s\naudit: {path: %s}\nproxy: {url: 'http://203.0.113.254:%d'}\n",
		sock, filepath.Join(n.dir, "state"), n.rules, filepath.Join(n.dir, "audit.jsonl"), proxyPort)
	must(t, os.WriteFile(filepath.Join(n.dir, "relayd.yaml"), []byte(settings), 0o600))
	n.client = api.NewClient(sock, 3*time.Second)
	n.start(t, bin)
	return n
}

// start runs kl-relayd (again) and waits until it answers.
func (n *daemonNode) start(t *testing.T, bin string) {
	t.Helper()
	cmd := n.host.Command(bin, "--settings", filepath.Join(n.dir, "relayd.yaml"))
	cmd.Stdout, cmd.Stderr = n.logs, n.logs
	must(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	var once sync.Once
	n.stop = func() { once.Do(func() { stopDaemon(cmd, done) }) }
	t.Cleanup(n.stop)
	deadline := time.Now().Add(10 * time.Second)
	for n.client.Ping(context.Background()) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("kl-relayd not ready after 10s:\n%s", n.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func stopDaemon(cmd *exec.Cmd, done chan struct{}) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// connectProxy is an HTTP CONNECT proxy that answers every tunnel itself with
// "proxy <target>\n" and then echoes.
func connectProxy(t *testing.T, nsPath string) {
	ln, err := netns.Listen(nsPath, "tcp", fmt.Sprintf("[::]:%d", proxyPort))
	must(t, err)
	testutil.Serve(t, ln, func(c net.Conn) {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		line, err := br.ReadString('\n')
		f := strings.Fields(line)
		if err != nil || len(f) < 2 || f[0] != "CONNECT" {
			fmt.Fprintf(c, "HTTP/1.1 400 Bad Request\r\n\r\n")
			return
		}
		for {
			h, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if h == "\r\n" || h == "\n" {
				break
			}
		}
		fmt.Fprintf(c, "HTTP/1.1 200 Connection established\r\n\r\nproxy %s\n", f[1])
		buf := make([]byte, 4096)
		for {
			k, err := br.Read(buf)
			if err != nil {
				return
			}
			if _, err := c.Write(buf[:k]); err != nil {
				return
			}
		}
	})
}

func (n *daemonNode) status(t *testing.T) api.Status {
	t.Helper()
	var st api.Status
	must(t, n.client.Call(context.Background(), "GET", "/v1/status", nil, &st))
	return st
}

// connect dials dst from the pod and returns who answered ("host", "proxy").
func (n *daemonNode) connect(t *testing.T, dst netip.AddrPort) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := netns.Dial(ctx, n.pod.Path, 0, "tcp", dst.String())
	if err != nil {
		t.Fatalf("dial %s: %v\nrelay:\n%s", dst, err, n.logs.String())
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("read from %s: %v\nrelay:\n%s", dst, err, n.logs.String())
	}
	who, at, _ := strings.Cut(strings.TrimSpace(line), " ")
	if at != dst.String() {
		t.Fatalf("%s answered for %q, want %s", who, at, dst)
	}
	return who
}

// kernelRecords waits (bounded) until the status shows at least want kernel records,
// then a little longer for any extra one.
func (n *daemonNode) kernelRecords(t *testing.T, want int) []audit.Record {
	t.Helper()
	get := func() []audit.Record {
		var out []audit.Record
		for _, d := range n.status(t).Recent {
			if d.Path == "kernel" {
				out = append(out, audit.Record{Rule: d.Rule, Priority: d.Priority, Dimension: d.Dimension, Exit: d.Exit, Note: d.Note, Reason: d.Reason, Path: d.Path})
			}
		}
		return out
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(get()) < want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	return get()
}

// TestDaemonFastPath: kl-relayd itself installs a registered transparent pod's kernel
// decisions; its direct flows never reach the relay yet each has exactly one audit record
// (path kernel, the engine's rule and dimension, no destination); a proxy-rule flow is
// still relayed; a reload swaps the pod's table (all direct: no redirect left); the
// status API shows the kernel share; deregistration drops the pod from it.
func TestDaemonFastPath(t *testing.T) {
	n := newDaemonNode(t)
	pA, pB := mustPolicy(t, daemonRulesA), mustPolicy(t, daemonRulesB)
	ctx := context.Background()
	id := testutil.Name("fpd")
	begin := time.Now()
	if _, err := n.client.Register(ctx, api.Workload{ID: id, Netns: n.pod.Path, Mode: api.ModeTransparent, Source: "test"}); err != nil {
		t.Fatalf("register: %v\n%s", err, n.logs.String())
	}
	t.Logf("registration with the kernel fast path: %v", time.Since(begin))

	table := n.pod.Exec(t, "nft", "list", "table", "inet", "kl")
	if !strings.Contains(table, "ct mark set") || !strings.Contains(table, fmt.Sprintf("redirect to :%d", api.DefaultRedirectPort)) {
		t.Fatalf("pod table after registration lacks the kernel decisions or the redirect:\n%s", table)
	}
	st := n.status(t)
	if !st.FastPath || len(st.Kernel) != 1 || st.Kernel[0].ID != id || st.Kernel[0].Error != "" {
		t.Fatalf("status fast path = %v %+v\n%s", st.FastPath, st.Kernel, n.logs.String())
	}
	if k := st.Kernel[0]; k.Share <= 0 || k.Share >= 1 || k.AllKernel || k.Policy != pA.Hash() || k.KernelEntries == 0 {
		t.Errorf("kernel status under A = %+v, want a share strictly between 0 and 1 of policy %s", k, pA.Hash())
	}

	const perDst = 5
	direct := []netip.AddrPort{netip.MustParseAddrPort("192.0.2.10:80"), netip.MustParseAddrPort("192.0.2.200:8080")}
	want := map[string]int{}
	for _, dst := range direct {
		e := pA.Plan(nil, "").Lookup(dst)
		if e == nil || e.Relay {
			t.Fatalf("policy A does not decide %s in the kernel: %v", dst, e)
		}
		want[key(recordOf(e.Decision))] += perDst
		for range perDst {
			if who := n.connect(t, dst); who != "host" {
				t.Fatalf("%s answered by %s, want the host directly", dst, who)
			}
		}
	}
	got := n.kernelRecords(t, perDst*len(direct))
	if !mapsEqual(multiset(got), want) {
		t.Errorf("kernel records = %v, want %v", multiset(got), want)
	}
	st = n.status(t)
	if st.Flows.Total != 0 {
		t.Errorf("relay carried %d flows, want 0: direct flows must not reach it", st.Flows.Total)
	}
	if k := st.Kernel[0]; k.Flows != uint64(perDst*len(direct)) {
		t.Errorf("kernel flows in status = %d, want %d", k.Flows, perDst*len(direct))
	}

	proxied := netip.MustParseAddrPort("198.51.100.7:443")
	if e := pA.Plan(nil, "").Lookup(proxied); e == nil || !e.Relay {
		t.Fatalf("policy A decides %s in the kernel, want the relay", proxied)
	}
	if who := n.connect(t, proxied); who != "proxy" {
		t.Fatalf("%s answered by %s, want the upstream proxy through the relay", proxied, who)
	}
	st = n.status(t)
	if st.Flows.Total != 1 || st.Flows.ByExit["proxy"] != 1 {
		t.Errorf("relay flows = %+v, want the one proxy flow", st.Flows)
	}
	if r := st.Recent[len(st.Recent)-1]; r.Path == "kernel" || r.Exit != "proxy" || r.Rule != 1 {
		t.Errorf("last record %+v, want the relay's proxy decision by rule 1", r)
	}

	// Reload to B: the pod's table swaps; every flow is direct, so no redirect is left.
	must(t, os.WriteFile(n.rules, []byte(daemonRulesB), 0o644))
	var rs api.RulesStatus
	must(t, n.client.Call(ctx, "POST", "/v1/reload", nil, &rs))
	if rs.Hash != pB.Hash() {
		t.Fatalf("reloaded hash %s, want %s", rs.Hash, pB.Hash())
	}
	table = n.pod.Exec(t, "nft", "list", "table", "inet", "kl")
	if strings.Contains(table, "redirect") || !strings.Contains(table, "ct mark set") {
		t.Fatalf("pod table after the reload to an all-direct policy:\n%s", table)
	}
	st = n.status(t)
	if k := st.Kernel[0]; !k.AllKernel || k.Share != 1 || k.Policy != pB.Hash() || k.Error != "" {
		t.Errorf("kernel status under B = %+v, want all kernel under %s", k, pB.Hash())
	}
	before := len(n.kernelRecords(t, 0))
	if who := n.connect(t, proxied); who != "host" {
		t.Fatalf("after the reload %s answered by %s, want the host directly", proxied, who)
	}
	e := pB.Plan(nil, "").Lookup(proxied)
	got = n.kernelRecords(t, before+1)
	if len(got) != before+1 || key(got[len(got)-1]) != key(recordOf(e.Decision)) {
		t.Errorf("after the reload: %d kernel records (last %+v), want %d, the last %+v", len(got), got[len(got)-1], before+1, recordOf(e.Decision))
	}
	if st := n.status(t); st.Flows.Total != 1 {
		t.Errorf("relay flows after the reload = %d, want still 1", st.Flows.Total)
	}

	// kl-ctl status shows the share; kl-ctl explain says where a flow is decided.
	ctl := testutil.Bin(t, "kl-ctl")
	out, err := exec.Command(ctl, "status", "--socket", n.sock).CombinedOutput()
	if wantLine := fmt.Sprintf("kernel: 100%% of policy, %d flows (every flow: no redirect)", perDst*len(direct)+1); err != nil || !strings.Contains(string(out), wantLine) {
		t.Errorf("kl-ctl status (%v) lacks %q:\n%s", err, wantLine, out)
	}
	for rulesSrc, want := range map[string]string{daemonRulesA: `"path":"relay"`, daemonRulesB: `"path":"kernel"`} {
		f := filepath.Join(n.dir, "explain.yaml")
		must(t, os.WriteFile(f, []byte(rulesSrc), 0o644))
		out, err := exec.Command(ctl, "explain", "--rules", f, "--ip", "198.51.100.7", "--port", "443", "--json").CombinedOutput()
		if err != nil || !strings.Contains(string(out), want) {
			t.Errorf("kl-ctl explain (%v) = %s, want %s", err, out, want)
		}
	}

	// A daemon restart restores the registration and installs its kernel decisions again.
	n.stop()
	// The stopped daemon flushed its audit log: no record names a destination.
	b, err := os.ReadFile(filepath.Join(n.dir, "audit.jsonl"))
	must(t, err)
	for _, s := range []string{"192.0.2.", "198.51.100.", "203.0.113."} {
		if strings.Contains(string(b), s) {
			t.Errorf("audit log names a destination (%s):\n%s", s, b)
		}
	}
	if c := strings.Count(string(b), `"path":"kernel"`); c != perDst*len(direct)+1 {
		t.Errorf("audit log holds %d kernel records, want %d", c, perDst*len(direct)+1)
	}

	n.start(t, testutil.Bin(t, "kl-relayd"))
	st = n.status(t)
	if len(st.Kernel) != 1 || st.Kernel[0].ID != id || !st.Kernel[0].AllKernel || st.Kernel[0].Policy != pB.Hash() {
		t.Fatalf("kernel status after a restart = %+v\n%s", st.Kernel, n.logs.String())
	}
	if who := n.connect(t, direct[0]); who != "host" {
		t.Fatalf("after a restart %s answered by %s, want the host directly", direct[0], who)
	}
	if got := n.kernelRecords(t, 1); len(got) != 1 || key(got[0]) != key(recordOf(pB.Plan(nil, "").Lookup(direct[0]).Decision)) {
		t.Errorf("kernel records after a restart = %v", got)
	}

	must(t, n.client.Deregister(ctx, id))
	if st := n.status(t); len(st.Kernel) != 0 {
		t.Errorf("kernel status after deregistration = %+v", st.Kernel)
	}
}
