package attach

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/rules"
	"github.com/kl-egress/kl/tests/testutil"
)

const clientPolicy = `default: cluster
rules:
  - pattern: "203.0.113.0/24"
    route: client
  - pattern: "198.51.100.18:8080"
    route: gateway
`

// TestClientRoute walks the client route through a session's life: refused without a
// session, carried through the laptop while `kl-ctl attach` runs (the corp host sees the
// laptop's address), refused and audited once it stops, carried again by a background
// agent, all without touching the pod. A second pod the credential does not cover never
// gets its flows carried.
func TestClientRoute(t *testing.T) {
	tp := newTopo(t, clientPolicy)
	a := tp.addPod("pod-a", 1, map[string]string{"team": "pay"})
	b := tp.addPod("pod-b", 2, map[string]string{"team": "pay"})
	attachArgs := []string{"attach", "--server", attachAddr, "--ca", tp.pki.CAFile, "--token-file", tp.tokenFile}

	if _, err := visit(a, corpAddr); err == nil {
		t.Fatal("the pod reached the corp host with no session")
	}
	if tp.auditedNoSession() != 1 {
		t.Fatalf("refusal without a session not audited: %+v", tp.audit.Recent(5))
	}

	fg := tp.klctl(nil, attachArgs...)
	tp.waitLive(&a.w, true)
	seen, err := visit(a, corpAddr)
	if err != nil {
		t.Fatalf("client route with a live session: %v\nkl-ctl:\n%s", err, fg.out.String())
	}
	if seen != laptopCorp {
		t.Errorf("corp host saw %s, want the laptop's %s", seen, laptopCorp)
	}
	t.Run("unauthorised workload", func(t *testing.T) {
		if _, err := visit(b, corpAddr); err == nil {
			t.Fatal("pod-b's flow was carried by a session whose credential covers only pod-a")
		}
		if tp.auditedNoSession() != 2 {
			t.Errorf("pod-b's refusal not audited")
		}
	})
	if err := fg.stop(); err != nil {
		t.Errorf("kl-ctl attach ended with %v\n%s", err, fg.out.String())
	}
	if out := fg.out.String(); !strings.Contains(out, "attached: session") || !strings.Contains(out, "attach summary: 1 session(s)") || !strings.Contains(out, "1 flows, 0 refused") {
		t.Errorf("kl-ctl progress and summary:\n%s", out)
	}
	tp.waitLive(&a.w, false)
	if _, err := visit(a, corpAddr); err == nil {
		t.Fatal("the pod reached the corp host after the session stopped")
	}
	if tp.auditedNoSession() != 3 {
		t.Errorf("refusal after the session stopped not audited")
	}
	if !strings.Contains(tp.log.String(), "no live attach session for the workload") {
		t.Errorf("the relay's log lacks the refusal's reason")
	}

	control := filepath.Join(tp.dir, "run", "attach.sock")
	bg := tp.klctl(nil, append(attachArgs, "--background", "--control", control)...)
	if err, done := bg.wait(20 * time.Second); !done || err != nil {
		t.Fatalf("kl-ctl attach --background: %v (done %v)\n%s", err, done, bg.out.String())
	}
	if !strings.Contains(bg.out.String(), "attach agent running") {
		t.Errorf("--background said:\n%s", bg.out.String())
	}
	tp.waitLive(&a.w, true)
	if seen, err := visit(a, corpAddr); err != nil || seen != laptopCorp {
		t.Fatalf("client route through the agent: seen %s, %v", seen, err)
	}
	// The daemon's listener goes away and comes back: the agent reconnects by itself.
	tp.stopAttach()
	tp.waitLive(&a.w, false)
	if _, err := visit(a, corpAddr); err == nil {
		t.Fatal("the pod reached the corp host while the daemon's attach listener was down")
	}
	tp.serveAttach()
	tp.waitLive(&a.w, true)
	if seen, err := visit(a, corpAddr); err != nil || seen != laptopCorp {
		t.Fatalf("client route after the agent reconnected: seen %s, %v", seen, err)
	}
	st, err := tp.laptop.Command(bin(t, "kl-ctl"), "attach", "status", "--control", control).CombinedOutput()
	if err != nil || !strings.Contains(string(st), ": connected") || !strings.Contains(string(st), "flows 2 ") || !strings.Contains(string(st), "2 session(s)") || strings.Contains(string(st), " 0 reconnect(s)") {
		t.Errorf("attach status: %v\n%s", err, st)
	}
	stop, err := tp.laptop.Command(bin(t, "kl-ctl"), "attach", "stop", "--control", control).CombinedOutput()
	if err != nil || !strings.Contains(string(stop), "stopped the attach agent") {
		t.Errorf("attach stop: %v\n%s", err, stop)
	}
	tp.waitLive(&a.w, false)
	out, err := tp.laptop.Command(bin(t, "kl-ctl"), "attach", "status", "--control", control).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 || !strings.Contains(string(out), "no attach agent") {
		t.Errorf("status after stop: %v\n%s", err, out)
	}
}

// TestCredentials: a wrong or missing token is refused by the daemon and logged there;
// kl-ctl says so and does not retry forever.
func TestCredentials(t *testing.T) {
	tp := newTopo(t, clientPolicy)
	a := tp.addPod("pod-a", 1, nil)
	wrong := filepath.Join(tp.dir, "wrong")
	must(t, os.WriteFile(wrong, []byte("not-alices-token-at-all"), 0o600))
	for _, tt := range []struct {
		name   string
		args   []string
		env    []string
		status int
		said   string
		logged string
	}{
		{"wrong token", []string{"--token-file", wrong}, nil, 1, "authentication failed", `reason="wrong token"`},
		{"token from the environment, wrong", nil, []string{"KL_ATTACH_TOKEN=still-not-the-right-one"}, 1, "authentication failed", `reason="wrong token"`},
		{"no credentials", nil, nil, 2, "no credentials", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			k := tp.klctl(tt.env, append([]string{"attach", "--server", attachAddr, "--ca", tp.pki.CAFile}, tt.args...)...)
			err, done := k.wait(15 * time.Second)
			if !done {
				t.Fatalf("kl-ctl attach with %s still runs:\n%s", tt.name, k.out.String())
			}
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tt.status || !strings.Contains(k.out.String(), tt.said) {
				t.Errorf("kl-ctl attach: %v, want status %d saying %q\n%s", err, tt.status, tt.said, k.out.String())
			}
			if tt.logged != "" && !strings.Contains(tp.log.String(), tt.logged) {
				t.Errorf("daemon log lacks %q", tt.logged)
			}
		})
	}
	if tp.srv.Live(&a.w) {
		t.Error("a refused credential left a live session")
	}
	t.Run("client certificate", func(t *testing.T) {
		cert, key := tp.pki.Issue("bob@laptop", false)
		b := tp.addPod("pod-b", 2, map[string]string{"team": "pay"})
		k := tp.klctl(nil, "attach", "--server", attachAddr, "--ca", tp.pki.CAFile, "--cert", cert, "--key", key, "--selector", "team=pay")
		tp.waitLive(&b.w, true)
		if tp.srv.Live(&a.w) {
			t.Error("bob's session may carry pod-a, whose labels his credential does not match")
		}
		if seen, err := visit(b, corpAddr); err != nil || seen != laptopCorp {
			t.Errorf("client route with a certificate session: seen %s, %v\n%s", seen, err, k.out.String())
		}
		if !strings.Contains(tp.log.String(), "auth=certificate") {
			t.Error("the daemon did not log the certificate authentication")
		}
	})
}

// TestPACProxy: a PAC answering `PROXY host:port` for the corp network routes the flow
// to the client, and the attach side dials it through that proxy: a squid on the laptop.
// The policy arrives by reload, without touching the pod or restarting the session.
func TestPACProxy(t *testing.T) {
	testutil.RequireTool(t, "squid")
	tp := newTopo(t, clientPolicy)
	a := tp.addPod("pod-a", 1, nil)
	squidLog := startSquid(t, tp)
	fg := tp.klctl(nil, "attach", "--server", attachAddr, "--ca", tp.pki.CAFile, "--token-file", tp.tokenFile, "--verbose")
	tp.waitLive(&a.w, true)

	tp.policy.Store(mustPolicy(t, `default: direct
script: |
  function FindProxyForURL(url, host) {
    if (isInNet(host, "203.0.113.0", "255.255.255.0")) return "PROXY `+laptopCorp+`:3128; DIRECT";
    return "DIRECT";
  }
`, false))
	tp.srv.Reload()
	seen, err := visit(a, corpAddr)
	if err != nil {
		t.Fatalf("client route through squid: %v\nkl-ctl:\n%s", err, fg.out.String())
	}
	if seen != laptopCorp {
		t.Errorf("corp host saw %s, want the laptop (squid) at %s", seen, laptopCorp)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(squidLog)
		if strings.Contains(string(b), "CONNECT "+corpAddr) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("squid's access log has no CONNECT %s:\n%s", corpAddr, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if out := fg.out.String(); !strings.Contains(out, "via http://"+laptopCorp+":3128") {
		t.Errorf("kl-ctl progress does not show the proxy:\n%s", out)
	}
}

// startSquid runs squid in the laptop's namespace on the corp side and returns its
// access log.
func startSquid(t testing.TB, tp *topo) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kl-attach-squid-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	must(t, os.Chmod(dir, 0o777)) // squid drops to its own user
	conf := fmt.Sprintf(`http_port %[1]s:3128
pid_filename %[2]s/squid.pid
cache_log %[2]s/cache.log
access_log %[2]s/access.log
coredump_dir %[2]s
cache deny all
shutdown_lifetime 0 seconds
dns_nameservers 127.0.0.1
acl corp dst 203.0.113.0/24
http_access allow corp
http_access deny all
`, laptopCorp, dir)
	cf := filepath.Join(dir, "squid.conf")
	must(t, os.WriteFile(cf, []byte(conf), 0o644))
	args, rm := testutil.SquidArgs(cf)
	t.Cleanup(rm) // after the stop Start registers
	tp.laptop.Start(t, "squid", args...)
	tp.laptop.WaitPort(t, "tcp", laptopCorp+":3128", 15*time.Second)
	return filepath.Join(dir, "access.log")
}

// TestGateway: a host only the node's namespace can reach is reached through the
// gateway exit (it sees the node's address); the same policy is refused at load without
// the operator's KL_EGRESS_GATEWAY=1, by the engine and by kl-relayd itself.
func TestGateway(t *testing.T) {
	tp := newTopo(t, "default: direct\n")
	a := tp.addPod("pod-a", 1, nil)
	if _, err := visit(a, gwHostAddr); err == nil {
		t.Fatal("the pod reaches the gateway-only host directly; the topology proves nothing")
	}
	tp.policy.Store(mustPolicy(t, clientPolicy, true))
	seen, err := visit(a, gwHostAddr)
	if err != nil {
		t.Fatalf("gateway route: %v", err)
	}
	if seen != nodeGwSide {
		t.Errorf("gateway-only host saw %s, want the node's %s", seen, nodeGwSide)
	}

	_, err = rules.Parse("rules.yaml", []byte(clientPolicy), rules.LoadOptions{})
	var re *rules.Error
	if !errors.As(err, &re) || re.Code != rules.CodeGatewayOff {
		t.Errorf("load without the opt-in: %v, want %s", err, rules.CodeGatewayOff)
	}
	rulesPath := filepath.Join(tp.dir, "rules.yaml")
	must(t, os.WriteFile(rulesPath, []byte(clientPolicy), 0o644))
	settings := filepath.Join(tp.dir, "relayd.yaml")
	must(t, os.WriteFile(settings, []byte(fmt.Sprintf("socket: %s/relayd.sock\nstateDir: %s/state\nrules: %s\n", tp.dir, tp.dir, rulesPath)), 0o600))
	for _, tt := range []struct {
		env  string
		ok   bool
		want string
	}{{"KL_EGRESS_GATEWAY=0", false, string(rules.CodeGatewayOff)}, {"KL_EGRESS_GATEWAY=1", true, "rules ok"}} {
		cmd := exec.Command(bin(t, "kl-relayd"), "check", "--settings", settings)
		cmd.Env = append(os.Environ(), tt.env)
		out, err := cmd.CombinedOutput()
		if (err == nil) != tt.ok || !strings.Contains(string(out), tt.want) {
			t.Errorf("kl-relayd check with %s: %v\n%s", tt.env, err, out)
		}
	}
}
