package attach

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/tests/testutil"
)

// TestDaemon runs the whole path with the real kl-relayd in the node's netns: its attach
// listener from the settings file, the pod registered through its API, kl-ctl attach in
// the laptop; the gateway exit dials from the daemon's own netns (KL_EGRESS_GATEWAY=1).
func TestDaemon(t *testing.T) {
	testutil.RequireTool(t, "squid")
	tp := newTopo(t, clientPolicy)
	tp.stopAttach() // the daemon's listener takes the address
	rulesPath := filepath.Join(tp.dir, "rules.yaml")
	must(t, os.WriteFile(rulesPath, []byte(clientPolicy), 0o644))
	socket := filepath.Join(tp.dir, "relayd.sock")
	settings := filepath.Join(tp.dir, "relayd.yaml")
	must(t, os.WriteFile(settings, []byte(fmt.Sprintf(`socket: %s
stateDir: %s/state
rules: %s
connectTimeout: 3s
`, socket, tp.dir, rulesPath)), 0o600))
	attachSettings := filepath.Join(tp.dir, "attach.yaml")
	must(t, os.WriteFile(attachSettings, []byte(fmt.Sprintf(`listen: %q
cert: %s
key: %s
credentials:
  - name: alice
    token: %q
    workloads: [pod-a]
`, attachAddr, tp.pki.Cert, tp.pki.Key, token)), 0o600))
	if out, err := exec.Command(bin(t, "kl-relayd"), "check", "--settings", settings, "--attach", attachSettings).CombinedOutput(); err == nil || !strings.Contains(string(out), string(rules.CodeGatewayOff)) {
		t.Errorf("kl-relayd check without KL_EGRESS_GATEWAY=1: %v\n%s", err, out)
	}
	check := exec.Command(bin(t, "kl-relayd"), "check", "--settings", settings, "--attach", attachSettings)
	check.Env = append(os.Environ(), "KL_EGRESS_GATEWAY=1")
	if out, err := check.CombinedOutput(); err != nil || !strings.Contains(string(out), "attach ok: listen "+attachAddr+", 1 credentials") {
		t.Errorf("kl-relayd check: %v\n%s", err, out)
	}
	logs := &testutil.Buffer{}
	cmd := tp.node.Command(bin(t, "kl-relayd"), "--settings", settings, "--attach", attachSettings)
	cmd.Env = append(os.Environ(), "KL_EGRESS_GATEWAY=1")
	cmd.Stdout, cmd.Stderr = logs, logs
	must(t, cmd.Start())
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("kl-relayd:\n%s", logs.String())
		}
	})
	client := api.NewClient(socket, 3*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for client.Ping(context.Background()) != nil {
		if time.Now().After(deadline) {
			t.Fatalf("kl-relayd not ready:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	p := &pod{ns: testutil.NewNetns(t, "kap")}
	testutil.Link(t, tp.node, []string{"192.0.2.5/30"}, p.ns, []string{"192.0.2.6/30"})
	p.ns.Exec(t, "ip", "route", "add", "default", "via", "192.0.2.5")
	must(t, netns.Install(p.ns.Path, netns.Capture{RedirectPort: api.DefaultRedirectPort, Mark: mark}))
	p.w = api.Workload{ID: "pod-a", Netns: p.ns.Path, Mode: api.ModeTransparent, Source: "cni", Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.6")}}
	if _, err := client.Register(context.Background(), p.w); err != nil {
		t.Fatalf("register: %v\n%s", err, logs.String())
	}

	if _, err := visit(p, corpAddr); err == nil {
		t.Fatal("client route without a session reached the corp host")
	}
	fg := tp.klctl(nil, "attach", "--server", attachAddr, "--ca", tp.pki.CAFile, "--token-file", tp.tokenFile)
	deadline = time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "attach session started") {
		if time.Now().After(deadline) {
			t.Fatalf("no session:\n%s\nkl-ctl:\n%s", logs.String(), fg.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if seen, err := visit(p, corpAddr); err != nil || seen != laptopCorp {
		t.Fatalf("client route through kl-relayd: seen %s, %v\nkl-ctl:\n%s", seen, err, fg.out.String())
	}
	if seen, err := visit(p, gwHostAddr); err != nil || seen != nodeGwSide {
		t.Fatalf("gateway route through kl-relayd: seen %s, %v", seen, err)
	}
	// The live session shows in the daemon's status (kl-ctl status lists it).
	var live api.Status
	must(t, client.Call(context.Background(), "GET", "/v1/status", nil, &live))
	if len(live.Attach) != 1 || live.Attach[0].Flows < 1 || live.Attach[0].Policy != live.Rules.Hash {
		t.Errorf("status attach sessions = %+v, want one live session that carried a flow with the live policy %s", live.Attach, live.Rules.Hash)
	}
	// A reload hands the session the new rules: a PAC sending the corp network through
	// the laptop's squid.
	squidLog := startSquid(t, tp)
	must(t, os.WriteFile(rulesPath, []byte(`default: direct
script: |
  function FindProxyForURL(url, host) {
    if (isInNet(host, "203.0.113.0", "255.255.255.0")) return "PROXY `+laptopCorp+`:3128";
    return "DIRECT";
  }
`), 0o644))
	must(t, client.Call(context.Background(), "POST", "/v1/reload", nil, nil))
	if seen, err := visit(p, corpAddr); err != nil || seen != laptopCorp {
		t.Fatalf("client route through squid after a reload: seen %s, %v\nkl-ctl:\n%s", seen, err, fg.out.String())
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(squidLog)
		if strings.Contains(string(b), "CONNECT "+corpAddr) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("squid's access log has no CONNECT %s:\n%s", corpAddr, b)
		}
	}
	fg.stop()
	deadline = time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "attach session ended") {
		if time.Now().After(deadline) {
			t.Fatal("the session did not end")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := visit(p, corpAddr); err == nil {
		t.Fatal("client route after the session stopped reached the corp host")
	}
	var st api.Status
	must(t, client.Call(context.Background(), "GET", "/v1/status", nil, &st))
	n := 0
	for _, r := range st.Recent {
		if r.Exit == rules.ExitClient && strings.Contains(r.Reason, "no live attach session") {
			n++
		}
		if strings.Contains(r.Reason, "203.0.113") {
			t.Errorf("an audit record names the destination: %+v", r)
		}
	}
	if n != 2 {
		t.Errorf("%d audit records of client flows refused for want of a session, want 2: %+v", n, st.Recent)
	}
}

// TestRandomScript: a script routing corp flows to the client by Math.random and Date;
// every flow the relay routed client is carried (the attach side drew the same number
// from the same flow id), every other one was denied.
func TestRandomScript(t *testing.T) {
	tp := newTopo(t, `default: direct
script: |
  function FindProxyForURL(url, host) {
    if (!isInNet(host, "203.0.113.0", "255.255.255.0")) return "DIRECT";
    var d = new Date();
    return (Math.random() < 0.5 || d.getUTCMilliseconds() % 3 == 0) ? "CLIENT" : "DENY";
  }
`)
	a := tp.addPod("pod-a", 1, nil)
	tp.klctl(nil, "attach", "--server", attachAddr, "--ca", tp.pki.CAFile, "--token-file", tp.tokenFile, "--quiet")
	tp.waitLive(&a.w, true)
	carried := 0
	for range 30 {
		if _, err := visit(a, corpAddr); err == nil {
			carried++
		}
	}
	st := tp.rel.Stats()
	if uint64(carried) != st.ByExit[rules.ExitClient] || carried == 0 || carried == 30 {
		t.Errorf("%d flows carried, relay routed %d to the client (%v)", carried, st.ByExit[rules.ExitClient], st.ByExit)
	}
	if strings.Contains(tp.log.String(), "E_ROUTE_MISMATCH") || strings.Contains(tp.log.String(), "does not route this flow") {
		t.Errorf("a hop disagreed with the relay:\n%s", tp.log.String())
	}
}
