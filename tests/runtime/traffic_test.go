package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/tests/testutil"
)

// startWorld makes the test host: a netns with an HTTP server on :8080 serving
// index.html = "hello-kl\n". Containers reach it over veths (linkToWorld).
func startWorld(t *testing.T, dir string) *testutil.Netns {
	t.Helper()
	world := testutil.NewNetns(t, "klw")
	www := filepath.Join(dir, "www")
	os.MkdirAll(www, 0o755)
	os.WriteFile(filepath.Join(www, "index.html"), []byte("hello-kl\n"), 0o644)
	world.Start(t, "busybox", "httpd", "-f", "-p", "8080", "-h", www)
	world.WaitPort(t, "tcp", ":8080", 10*time.Second)
	return world
}

// linkToWorld joins the netns of pid to the world with a veth: the world side gets
// 192.0.2.(net+1)/30, the container side 192.0.2.(net+2)/30.
func linkToWorld(t *testing.T, world *testutil.Netns, pid string, net int) {
	t.Helper()
	hostIf, ctrIf := testutil.Name("kv"), testutil.Name("kv")
	testutil.Run(t, "ip", "link", "add", hostIf, "netns", world.Name, "type", "veth", "peer", "name", ctrIf, "netns", pid)
	world.Exec(t, "ip", "addr", "add", fmt.Sprintf("192.0.2.%d/30", net+1), "dev", hostIf)
	world.Exec(t, "ip", "link", "set", hostIf, "up")
	testutil.Run(t, "nsenter", "--net=/proc/"+pid+"/ns/net", "ip", "addr", "add", fmt.Sprintf("192.0.2.%d/30", net+2), "dev", ctrIf)
	testutil.Run(t, "nsenter", "--net=/proc/"+pid+"/ns/net", "ip", "link", "set", ctrIf, "up")
}

// startSquid runs squid on the world's :3128, open to 192.0.2.0/24, and returns its
// log directory (access.log).
func startSquid(t *testing.T, world *testutil.Netns) string {
	t.Helper()
	sq, err := os.MkdirTemp("", "kl-squid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sq) })
	os.Chmod(sq, 0o777) // squid drops to its own user
	conf := fmt.Sprintf("http_port 3128\npid_filename %[1]s/squid.pid\ncache_log %[1]s/cache.log\naccess_log %[1]s/access.log\ncoredump_dir %[1]s\n"+
		"cache deny all\nshutdown_lifetime 0 seconds\ndns_nameservers 127.0.0.1\nacl test src 192.0.2.0/24\nhttp_access allow test\nhttp_access deny all\n", sq)
	os.WriteFile(filepath.Join(sq, "squid.conf"), []byte(conf), 0o644)
	args, rm := testutil.SquidArgs(filepath.Join(sq, "squid.conf"))
	t.Cleanup(rm) // after the stop Start registers
	world.Start(t, "squid", args...)
	world.WaitPort(t, "tcp", ":3128", 15*time.Second)
	return sq
}

// httpGet is a shell command that fetches path from addr:port with busybox nc (Debian's
// static busybox wget crashes in its resolver). stdin stays open two seconds after the
// request: squid tears a CONNECT tunnel down at the client's first FIN, which would drop
// the answer still on its way.
func httpGet(addr, port, path string) string {
	return fmt.Sprintf(`(printf 'GET %s HTTP/1.0\r\nHost: test\r\n\r\n'; sleep 2) | nc %s %s`, path, addr, port)
}

// relayd is a real kl-relayd started by a test.
type relayd struct {
	*daemon
	Socket string
	client *api.Client
}

// startRelayd runs kl-relayd with the test's rules.yaml (written by klEnv), debug logs
// (the decision lines) and, when proxyURL is set, that upstream behind the proxy exit.
func startRelayd(t *testing.T, dir, proxyURL string) *relayd {
	t.Helper()
	rl := &relayd{Socket: filepath.Join(dir, "relayd.sock")}
	settings := fmt.Sprintf("socket: %s\nstateDir: %s\nrules: %s\nconnectTimeout: 3s\ndebug: true\n",
		rl.Socket, filepath.Join(dir, "relayd-state"), filepath.Join(dir, "rules.yaml"))
	if proxyURL != "" {
		settings += "proxy:\n  url: " + proxyURL + "\n"
	}
	os.WriteFile(filepath.Join(dir, "relayd.yaml"), []byte(settings), 0o600)
	rl.daemon = startDaemon(t, filepath.Join(dir, "relayd.log"), nil, relaydBin(t), "--settings", filepath.Join(dir, "relayd.yaml"))
	t.Cleanup(func() { rl.stop(10 * time.Second) })
	rl.client = api.NewClient(rl.Socket, time.Second)
	if !waitFor(10*time.Second, func() bool { return rl.client.Ping(context.Background()) == nil }) {
		t.Fatalf("kl-relayd not ready:\n%s", rl.tail())
	}
	return rl
}

// decision returns the relay's last debug decision line for workload id.
func (rl *relayd) decision(id string) string {
	var last string
	for _, line := range strings.Split(readFile(rl.log), "\n") {
		if strings.Contains(line, "msg=decision") && strings.Contains(line, "workload="+id+" ") {
			last = line
		}
	}
	return last
}

// recorded reports whether the relay's status lists a recent audit record with this
// dimension and exit (what `kl-ctl status` shows).
func (rl *relayd) recorded(t *testing.T, dimension, exit string) bool {
	t.Helper()
	for _, d := range rl.status(t).Recent {
		if d.Dimension == dimension && d.Exit == exit {
			return true
		}
	}
	return false
}

// status is what `kl-ctl status --json` shows for the relay: the decisions a test checks
// are the ones an operator sees.
func (rl *relayd) status(t *testing.T) api.Status {
	t.Helper()
	var st api.Status
	r := run(t, nil, testutil.Bin(t, "kl-ctl"), "status", "--json", "--socket", rl.Socket)
	if r.code != 0 {
		t.Errorf("kl-ctl status: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		return st
	}
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Errorf("kl-ctl status --json: %v\n%s", err, r.stdout)
	}
	return st
}

// TestContainerdProxyTraffic: a ctr container in proxy mode reaches a test host through
// the relay's HTTP proxy, found through the HTTP_PROXY kl-runtime put in its environment,
// and the relay records the decision.
func TestContainerdProxyTraffic(t *testing.T) {
	t.Parallel()
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "busybox", "runc", "nft", "nsenter")
	dir := t.TempDir()
	world := startWorld(t, dir)
	env, _ := klEnv(t, dir, "runtime: runc\nmode: transparent\n")
	rl := startRelayd(t, dir, "")
	cfgPath := strings.TrimPrefix(env[0], "KL_RUNTIME_CONFIG=")
	os.WriteFile(cfgPath, []byte(strings.Replace(readFile(cfgPath), "relaySocket: ", "relaySocket: "+rl.Socket+"\n# fake: ", 1)), 0o644)
	c := startContainerd(t, dir, env)
	rt, bin := containerdRuntime(t, snippet(t, "containerd/kl-runtime-v2.toml"))
	img := filepath.Join(dir, "image.tar")
	buildImage(t, img)
	if r := c.ctr(t, "images", "import", "--snapshotter", "native", img); r.code != 0 {
		t.Fatalf("ctr images import: %s %s", r.stdout, r.stderr)
	}
	id := testutil.Name("klx")
	r := c.ctr(t, "run", "-d", "--snapshotter", "native", "--runtime", rt, "--runc-binary", bin,
		"--annotation", "kl.egress.mode=proxy", imageNorm, id, "sleep", "120")
	if r.code != 0 {
		t.Fatalf("ctr run -d: exit %d\n%s\n%s\nrelay:\n%s", r.code, r.stdout, r.stderr, rl.tail())
	}
	linkToWorld(t, world, fmt.Sprint(taskPid(t, c, id)), 0)
	// The HTTP proxy's address comes from HTTP_PROXY in the environment of the container's
	// main process (an exec'd process gets it too, from kl-runtime's edit of exec's process
	// file; reading pid 1's keeps this test about the relay, not about exec).
	script := `p=$(tr '\0' '\n' < /proc/1/environ | grep '^HTTP_PROXY=' | cut -d= -f2-); p=${p#http://}; p=${p%/}; (printf 'GET http://192.0.2.1:8080/index.html HTTP/1.0\r\nHost: 192.0.2.1:8080\r\n\r\n'; sleep 2) | nc ${p%:*} ${p##*:}`
	r = c.ctr(t, "tasks", "exec", "--exec-id", "fetch", id, "sh", "-c", script)
	if r.code != 0 || !strings.HasSuffix(r.stdout, "hello-kl\n") {
		t.Fatalf("fetch through HTTP_PROXY: exit %d %q %s\nrelay:\n%s", r.code, r.stdout, r.stderr, rl.tail())
	}
	if l := rl.decision(id); !strings.Contains(l, "exit=direct") || !strings.Contains(l, "dimension=default") {
		t.Errorf("decision = %q, want direct by default", l)
	}
	if !rl.recorded(t, "default", "direct") {
		t.Errorf("relay status has no default/direct audit record: %+v", rl.status(t).Recent)
	}
	c.ctr(t, "tasks", "kill", "-s", "KILL", id)
	waitFor(10*time.Second, func() bool { return c.ctr(t, "tasks", "delete", id).code == 0 })
	c.ctr(t, "containers", "delete", id)
}
