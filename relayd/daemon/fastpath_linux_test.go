package daemon

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/tests/testutil"
)

// greeterPod makes a pod netns (prefix) linked to a server netns whose server on
// 192.0.2.1:7070 greets every connection with "hi\n" and counts them.
func greeterPod(t *testing.T, prefix string) (*testutil.Netns, *atomic.Int64) {
	t.Helper()
	pod, srv := testutil.NewNetns(t, prefix), testutil.NewNetns(t, prefix+"s")
	testutil.Link(t, pod, []string{"192.0.2.2/24"}, srv, []string{"192.0.2.1/24"})
	ln, err := netns.Listen(srv.Path, "tcp4", "192.0.2.1:7070")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	testutil.Serve(t, ln, func(c net.Conn) {
		n.Add(1)
		_, _ = io.WriteString(c, "hi\n")
		c.Close()
	})
	return pod, &n
}

// greeted connects from the pod to the greeter and says whether the greeting came back:
// the flow reached the server (out directly, or through the relay, which refuses it when
// the rules deny it).
func greeted(t *testing.T, pod *testutil.Netns) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := netns.Dial(ctx, pod.Path, 0, "tcp4", "192.0.2.1:7070")
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	line, _ := bufio.NewReader(c).ReadString('\n')
	return line == "hi\n"
}

// A workload registered while the fast path was on keeps its kernel decisions in its
// table across a restart. Restarted with noFastPath, the daemon watches and reloads
// nothing of them: the flows they send out would have no record, and a destination the
// new rules deny would stay reachable. Restore puts the plain capture back, so the relay
// decides (and here refuses) every flow.
func TestNoFastPathRestartRemovesKernelDecisions(t *testing.T) {
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "nft")
	pod, accepted := greeterPod(t, "klnfp")
	cfg := testConfig(t, t.TempDir()) // default: direct
	plain := netns.Capture{RedirectPort: cfg.RedirectPort, Mark: cfg.Mark, IPv6: true}
	if err := netns.Install(pod.Path, plain); err != nil {
		t.Fatal(err)
	}
	table := func() string { return pod.Exec(t, "nft", "list", "table", "inet", netns.TableName) }

	c, stop := start(t, cfg)
	w := api.Workload{ID: "fp", Netns: pod.Path, Mode: api.ModeTransparent, Source: "cni"}
	if _, err := c.Register(context.Background(), w); err != nil {
		t.Fatal(err)
	}
	if tb := table(); !strings.Contains(tb, "ct mark set") {
		t.Fatalf("no kernel decisions with the fast path on:\n%s", tb)
	}
	if !greeted(t, pod) {
		t.Fatal("default direct: the flow did not reach the server")
	}
	stop()

	if err := os.WriteFile(cfg.Rules, []byte("default: deny\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.NoFastPath = true
	c2, _ := start(t, cfg)
	if _, found, err := c2.Get(context.Background(), "fp"); err != nil || !found {
		t.Fatalf("registration not restored: found %v, %v", found, err)
	}
	if tb := table(); strings.Contains(tb, "ct mark set") {
		t.Errorf("restored with noFastPath, the table still carries kernel decisions:\n%s", tb)
	}
	if err := netns.Verify(pod.Path, plain); err != nil {
		t.Errorf("restored with noFastPath, the table is not the pod's plain capture: %v", err)
	}
	before := accepted.Load()
	if greeted(t, pod) || accepted.Load() != before {
		t.Errorf("default: deny and noFastPath, yet the flow reached the server (%d connections); table:\n%s", accepted.Load()-before, table())
	}
}

// A transparent workload refreshed into proxy mode leaves the fast path: its watcher
// stops, so its table must not keep the kernel decisions, which would send flows out
// with no record and no reload ever changing them. The capture underneath stays.
func TestProxyRefreshRemovesKernelDecisions(t *testing.T) {
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "nft")
	pod, _ := greeterPod(t, "klpxr")
	cfg := testConfig(t, t.TempDir())
	plain := netns.Capture{RedirectPort: cfg.RedirectPort, Mark: cfg.Mark, IPv6: true}
	if err := netns.Install(pod.Path, plain); err != nil {
		t.Fatal(err)
	}
	d, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer d.fastClose()
	defer d.relay.Close("fp")
	table := func() string { return pod.Exec(t, "nft", "list", "table", "inet", netns.TableName) }
	w := api.Workload{ID: "fp", Netns: pod.Path, Mode: api.ModeTransparent, Source: "cni"}
	if _, err := d.Register(w); err != nil {
		t.Fatal(err)
	}
	if tb := table(); !strings.Contains(tb, "ct mark set") {
		t.Fatalf("no kernel decisions after the transparent registration:\n%s", tb)
	}
	w.Mode = api.ModeProxy
	if _, err := d.Register(w); err != nil {
		t.Fatal(err)
	}
	if tb := table(); strings.Contains(tb, "ct mark set") {
		t.Errorf("refreshed into proxy mode, the table still carries kernel decisions:\n%s", tb)
	}
	if err := netns.Verify(pod.Path, plain); err != nil {
		t.Errorf("refreshed into proxy mode, the table is not the pod's plain capture: %v", err)
	}
}

// The sweep keeps a registration whose netns path has gone for one interval (the netns
// may live on under another path: containers sharing one, until kl-hook moves the
// registration). Its check of the fast path's tables must leave that workload alone:
// adding it again under the gone path stopped its watcher while its table went on
// deciding flows, which then had no record until the registration moved.
func TestSweepGraceKeepsWatcher(t *testing.T) {
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "nft")
	pod, _ := greeterPod(t, "klsg")
	cfg := testConfig(t, t.TempDir()) // default: direct, all in the kernel
	if err := netns.Install(pod.Path, netns.Capture{RedirectPort: cfg.RedirectPort, Mark: cfg.Mark}); err != nil {
		t.Fatal(err)
	}
	var logs testutil.Buffer
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	defer d.fastClose()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = d.relay.Shutdown(ctx)
	})
	first := bindNetns(t, pod.Path)
	w := api.Workload{ID: "shared", Netns: first, Mode: api.ModeTransparent, Source: "oci"}
	if _, err := d.Register(w); err != nil {
		t.Fatal(err)
	}
	records := func() (n uint64) {
		for _, h := range d.fast.Hits() {
			n += h.Count
		}
		return n
	}
	flows := func(n int, want uint64, when string) {
		t.Helper()
		for i := range n {
			if !greeted(t, pod) {
				t.Fatalf("%s: flow %d did not reach the server", when, i)
			}
		}
		for deadline := time.Now().Add(3 * time.Second); records() < want && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		if got := records(); got != want {
			t.Errorf("%s: %d kernel records, want %d (one per kernel-decided flow); logs:\n%s", when, got, want, logs.String())
		}
	}
	flows(3, 3, "registered")

	if err := unix.Unmount(first, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	d.sweep(nil)
	d.mu.Lock()
	_, kept := d.regs["shared"]
	d.mu.Unlock()
	if !kept {
		t.Fatal("the first sweep that found the path gone dropped the registration")
	}
	if st := d.fast.Status(); len(st) != 1 {
		t.Errorf("fast path pods in the sweep's grace: %+v, want the workload, still watched", st)
	}
	if strings.Contains(logs.String(), "kernel decisions missing or changed") {
		t.Errorf("the sweep's check tried to install the kernel decisions under the gone path; logs:\n%s", logs.String())
	}
	flows(5, 8, "in the sweep's grace")

	w.Netns = pod.Path
	if _, err := d.Register(w); err != nil {
		t.Fatal(err)
	}
	flows(1, 9, "moved")
}
