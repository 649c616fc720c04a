package runtime

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/tests/testutil"
)

// TestRuncEnvMode is env mode end to end (SPEC §2, issue 7): kl-runtime hands the
// container the operator's own proxy variables, the container's client reaches a
// destination it has no route to through that proxy (a real squid), and nothing of the
// relay is involved: no registration, no capture table.
func TestRuncEnvMode(t *testing.T) {
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "runc", "busybox", "squid", "nft")
	dir := t.TempDir()

	// The operator's proxy lives on the test host (192.0.2.1:3128); the destination
	// (198.51.100.10:8080) is reachable only from there, never from the container.
	world := startWorld(t, dir)
	world.Exec(t, "ip", "addr", "add", "198.51.100.10/32", "dev", "lo")
	sq := startSquid(t, world)
	ctr := testutil.NewNetns(t, "kle")
	testutil.Link(t, world, []string{"192.0.2.1/30"}, ctr, []string{"192.0.2.2/30"})

	// The operator's variables come from kl-runtime's own environment (no env: section).
	env, relay := klEnv(t, dir, "runtime: runc\nmode: env\n")
	env = append(env, "HTTP_PROXY=http://192.0.2.1:3128", "NO_PROXY=.corp.example")
	script := `env; echo ---; ` +
		`p=${http_proxy#http://}; (printf 'GET http://198.51.100.10:8080/index.html HTTP/1.0\r\nHost: 198.51.100.10\r\n\r\n'; sleep 2) | nc ${p%:*} ${p##*:}`
	b := newBundle(t, dir, []string{"sh", "-c", script}, func(s map[string]any) {
		linux := s["linux"].(map[string]any)
		var ns []any
		for _, n := range linux["namespaces"].([]any) {
			if n.(map[string]any)["type"] != "network" {
				ns = append(ns, n)
			}
		}
		linux["namespaces"] = append(ns, map[string]any{"type": "network", "path": ctr.Path})
	})
	root := filepath.Join(dir, "runc-root")
	id := testutil.Name("kle")
	cleanupContainer(t, root, id)
	r := run(t, env, filepath.Join(bins(t), "kl-runtime"), "--root", root, "run", "--bundle", b, id)
	if r.code != 0 {
		t.Fatalf("kl-runtime run: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	if m := contains(r.stdout,
		"HTTP_PROXY=http://192.0.2.1:3128\n", "http_proxy=http://192.0.2.1:3128\n",
		"NODE_USE_ENV_PROXY=1\n", "hello-kl\n"); len(m) > 0 {
		t.Errorf("container output lacks %q:\n%s\nstderr: %s", m, r.stdout, r.stderr)
	}
	if !strings.Contains(r.stdout, "NO_PROXY=") || !strings.Contains(r.stdout, "corp.example") {
		t.Errorf("the operator's NO_PROXY did not reach the container:\n%s", r.stdout)
	}
	if !waitFor(5*time.Second, func() bool { return strings.Contains(readFile(filepath.Join(sq, "access.log")), "198.51.100.10:8080") }) {
		t.Errorf("squid did not carry the flow; access.log:\n%s", readFile(filepath.Join(sq, "access.log")))
	}
	if calls := relay.Calls(); len(calls) != 0 {
		t.Errorf("env mode called the relay: %q", calls)
	}
	if out, _ := testutil.Output("ip", "netns", "exec", ctr.Name, "nft", "list", "tables"); strings.Contains(out, " kl") {
		t.Errorf("env mode installed a capture table:\n%s", out)
	}
}
