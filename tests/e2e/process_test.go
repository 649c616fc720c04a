package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/tests/testutil"
)

// httpServer serves "ok <path>" on the test host at port.
func (n *node) httpServer(port int) {
	t := n.t
	ln, err := netns.Listen(n.host.Path, "tcp", fmt.Sprintf(":%d", port))
	must(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "ok %s", r.URL.Path)
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// lastRecord is the most recent decision record the daemon keeps.
func (n *node) lastRecord(t *testing.T) api.Decision {
	t.Helper()
	st := n.status()
	if len(st.Recent) == 0 {
		t.Fatal("no decision recorded")
	}
	return st.Recent[len(st.Recent)-1] // oldest first
}

// waitRecord waits (bounded) until the most recent decision record satisfies ok and
// returns it, or the last one seen. Flows the kernel fast path decides are recorded when
// their connection ends (from conntrack), a moment after the client is done.
func (n *node) waitRecord(t *testing.T, ok func(api.Decision) bool) api.Decision {
	t.Helper()
	var r api.Decision
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if r = n.lastRecord(t); ok(r) {
			break
		}
	}
	return r
}

// TestProcessRule tells curl from busybox wget in one pod: the relay finds the program
// behind each captured connection (sock_diag in the pod netns, /proc) and the process
// rule denies curl while busybox goes out by the default.
func TestProcessRule(t *testing.T) {
	testutil.RequireTool(t, "curl", "busybox")
	n := newNode(t, false)
	must(t, os.WriteFile(n.rules, []byte(`default: direct
rules:
  - process: curl
    action: deny
    note: no curl here
`), 0o644))
	n.httpServer(8081)
	n.startRelay()
	a := n.newPod("proc")
	if out, err := n.add(a); err != nil {
		t.Fatalf("ADD: %v\n%s", err, out)
	}
	url := "http://198.51.100.2:8081/x"

	out, err := a.ns.Command("curl", "-sS", "-m", "5", url).CombinedOutput()
	if err == nil || strings.Contains(string(out), "ok /x") {
		t.Errorf("curl was carried: %s", out)
	}
	if r := n.lastRecord(t); r.Exit != "deny" || r.Dimension != "process" || r.Note != "no curl here" {
		t.Errorf("curl's decision = %+v, want deny by the process rule\nrelay:\n%s", r, n.logs.String())
	}

	// Not -T: Debian's busybox 1.35 wget crashes with it; the command is bounded here.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err = exec.CommandContext(ctx, "ip", "netns", "exec", a.ns.Name, "busybox", "wget", "-q", "-O", "-", url).CombinedOutput()
	if err != nil || string(out) != "ok /x" {
		t.Errorf("busybox wget: %v %q", err, out)
	}
	if r := n.lastRecord(t); r.Exit != "direct" || r.Dimension != "default" {
		t.Errorf("busybox's decision = %+v, want direct by default", r)
	}

	// Proxy mode: the owner of the client connection to the pod's HTTP proxy.
	t.Run("proxy mode", func(t *testing.T) {
		p := n.newPodAnnotated("procp", `{"kl.egress.mode":"proxy"}`)
		if out, err := n.add(p); err != nil {
			t.Fatalf("ADD: %v\n%s", err, out)
		}
		out, err := p.ns.Command("curl", "-sS", "-m", "5", "-x", "http://127.0.0.1:15080", "-o", "/dev/null", "-w", "%{http_code}", url).CombinedOutput()
		if strings.TrimSpace(string(out)) != "403" {
			t.Errorf("curl through the proxy: %q %v, want 403", out, err)
		}
		if r := n.lastRecord(t); r.Exit != "deny" || r.Dimension != "process" {
			t.Errorf("curl's decision = %+v, want deny by the process rule", r)
		}
		cmd := exec.CommandContext(ctx, "ip", "netns", "exec", p.ns.Name, "busybox", "wget", "-q", "-O", "-", url)
		cmd.Env = append(os.Environ(), "http_proxy=http://127.0.0.1:15080")
		out, err = cmd.CombinedOutput()
		if err != nil || string(out) != "ok /x" {
			t.Errorf("busybox wget through the proxy: %v %q", err, out)
		}
		if r := n.lastRecord(t); r.Exit != "direct" || r.Dimension != "default" {
			t.Errorf("busybox's decision = %+v, want direct by default", r)
		}
	})
}
