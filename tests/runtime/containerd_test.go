package runtime

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kl-egress/kl/netns"
	"github.com/kl-egress/kl/relayd/api"
	"github.com/kl-egress/kl/tests/testutil"
)

// TestContainerdSnippets checks both containerd snippets name the runc v2 shim with
// kl-runtime as its binary, under the CRI runtimes key of their config version.
func TestContainerdSnippets(t *testing.T) {
	for _, f := range []string{"containerd/kl-runtime-v2.toml", "containerd/kl-runtime-v3.toml"} {
		text, err := os.ReadFile(filepath.Join(testutil.ModuleRoot(t), "packaging", f))
		if err != nil {
			t.Fatal(err)
		}
		rt, bin := containerdRuntime(t, string(text))
		if rt != "io.containerd.runc.v2" || bin != "/usr/bin/kl-runtime" {
			t.Errorf("%s: runtime_type %q BinaryName %q", f, rt, bin)
		}
	}
}

// TestContainerdCtr runs containers with `ctr run --runc-binary kl-runtime` on a
// containerd the test starts: proxy mode (annotation) gets the variables, the read-only
// rules file and a hook registration; transparent mode (node default) gets the capture
// table in the container's netns. ctr puts neither the image nor the container's labels
// (--label) in the OCI spec, so the hook registers without them: kl-relayd adds both
// from containerd's API (its enrichment, TestContainerdEnrichment; the relay here is the
// test's recorder).
func TestContainerdCtr(t *testing.T) {
	t.Parallel() // each test has its own daemons, directories and names
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "busybox", "runc", "nft")
	dir := t.TempDir()
	env, relay := klEnv(t, dir, "runtime: runc\nmode: transparent\n")
	c := startContainerd(t, dir, env)
	rt, bin := containerdRuntime(t, snippet(t, "containerd/kl-runtime-v2.toml"))
	c.importImage(t, dir)
	ls := c.ctr(t, "images", "ls", "-q")
	ref := imageNorm
	if !strings.Contains(ls.stdout, imageNorm) {
		t.Fatalf("imported image not listed as %s:\n%s", imageNorm, ls.stdout)
	}

	id := testutil.Name("klc")
	script := `env; echo ---; cat /etc/kl/rules.yaml; if echo x >> /etc/kl/rules.yaml; then echo WRITE-OK; else echo WRITE-FAILED; fi`
	r := c.ctr(t, "run", "--rm", "--snapshotter", "native", "--runtime", rt, "--runc-binary", bin,
		"--annotation", "kl.egress.mode=proxy", "--label", "kl.route=proxy", ref, id, "sh", "-c", script)
	if r.code != 0 {
		t.Fatalf("ctr run: exit %d\n%s\n%s\ncontainerd:\n%s", r.code, r.stdout, r.stderr, c.tail())
	}
	if m := contains(r.stdout, "HTTP_PROXY=http://127.0.0.1:15080", "https_proxy=http://127.0.0.1:15080",
		"ALL_PROXY=socks5h://127.0.0.1:15081", "NODE_USE_ENV_PROXY=1", "no_proxy=localhost,127.0.0.1,::1,169.254.169.254,fd00:ec2::254", rulesBody, "WRITE-FAILED"); len(m) > 0 {
		t.Errorf("container output lacks %q:\n%s", m, r.stdout)
	}
	calls := relay.Calls()
	if !has(calls, "register "+id+" proxy") || !has(calls, "deregister "+id) {
		t.Errorf("relay calls %q: want a proxy registration of %s and its removal", calls, id)
	}
	logData, _ := os.ReadFile(filepath.Join(dir, "kl.log"))
	var registered map[string]any
	for _, line := range strings.Split(string(logData), "\n") {
		if strings.Contains(line, `"msg":"registered"`) && strings.Contains(line, id) {
			json.Unmarshal([]byte(line), &registered)
		}
	}
	if registered == nil || registered["mode"] != "proxy" || registered["engine"] != "oci" {
		t.Errorf("hook log for %s: %v; want a proxy registration of an oci (plain containerd) container", id, registered)
	}
	if img, _ := registered["image"].(string); img != "" {
		t.Errorf("hook registered image %q from a spec ctr wrote without one", img)
	}

	// Transparent (node default), detached: the capture is in the container's netns.
	id2 := testutil.Name("klc")
	r = c.ctr(t, "run", "-d", "--snapshotter", "native", "--runtime", rt, "--runc-binary", bin, ref, id2, "sleep", "60")
	if r.code != 0 {
		t.Fatalf("ctr run -d: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	reg, ok := relay.Registered(id2)
	if !ok || reg.Workload.Mode != api.ModeTransparent {
		t.Fatalf("transparent container not registered: %+v %v; calls %q", reg, ok, relay.Calls())
	}
	if reg.Workload.Image != "" || len(reg.Workload.Labels) != 0 {
		t.Errorf("registered image %q, labels %v from a spec ctr wrote without them (annotations %v)", reg.Workload.Image, reg.Workload.Labels, reg.Workload.Annotations)
	}
	pid := taskPid(t, c, id2)
	want := netns.Capture{RedirectPort: api.DefaultRedirectPort, Mark: api.DefaultMark, IPv6: true, RejectQUIC: true}
	if err := netns.Verify(fmt.Sprintf("/proc/%d/ns/net", pid), want); err != nil {
		t.Errorf("capture in the ctr container's netns: %v", err)
	}
	c.ctr(t, "tasks", "kill", "-s", "KILL", id2)
	if !waitFor(10*time.Second, func() bool { return c.ctr(t, "tasks", "delete", id2).code == 0 }) {
		t.Errorf("task %s not deleted", id2)
	}
	c.ctr(t, "containers", "delete", id2)
	if _, still := relay.Registered(id2); still {
		t.Errorf("still registered after the task was deleted; calls %q", relay.Calls())
	}

	// The relay not answering fails the container with a message that names it, through
	// runc's log, the shim and containerd, up to ctr.
	cfgPath := strings.TrimPrefix(env[0], "KL_RUNTIME_CONFIG=")
	cfg := readFile(cfgPath)
	os.WriteFile(cfgPath, []byte(strings.Replace(cfg, "relay.sock", "dead.sock", 1)), 0o644)
	id3 := testutil.Name("klc")
	r = c.ctr(t, "run", "--rm", "--snapshotter", "native", "--runtime", rt, "--runc-binary", bin, ref, id3, "true")
	if r.code == 0 || !strings.Contains(r.stderr, "kl-relayd unreachable") {
		t.Errorf("ctr run with the relay down: exit %d, stderr %s; want a failure naming kl-relayd", r.code, r.stderr)
	}
	t.Logf("ctr's error with the relay down: %s", strings.TrimSpace(r.stderr))
	c.ctr(t, "containers", "delete", id3)
}

// importImage builds the test image in dir and imports it into c (native snapshotter).
func (c *containerd) importImage(t *testing.T, dir string) {
	t.Helper()
	img := filepath.Join(dir, "image.tar")
	buildImage(t, img)
	if r := c.ctr(t, "images", "import", "--snapshotter", "native", img); r.code != 0 {
		t.Fatalf("ctr images import: %s %s", r.stdout, r.stderr)
	}
}

// TestContainerdStderr runs a proxy-mode container with `ctr run` (no terminal: the
// container's stdio is ctr's) while kl-runtime has a warning to log (the published rules
// directory is missing, so it mounts the rules file). containerd's runc shim hands `runc
// create` the container's stdio; kl-runtime's records go to the runtime log the shim
// names (--log) and to logFile, so the container's stderr is its own alone.
func TestContainerdStderr(t *testing.T) {
	t.Parallel()
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "busybox", "runc")
	dir := t.TempDir()
	env, relay := klEnv(t, dir, "runtime: runc\nmode: transparent\n")
	c := startContainerd(t, dir, env)
	rt, bin := containerdRuntime(t, snippet(t, "containerd/kl-runtime-v2.toml"))
	c.importImage(t, dir)
	id := testutil.Name("klc")
	r := c.ctr(t, "run", "--rm", "--snapshotter", "native", "--runtime", rt, "--runc-binary", bin,
		"--annotation", "kl.egress.mode=proxy", imageNorm, id, "sh", "-c", "echo APP-OUT; echo APP-ERR >&2")
	if r.code != 0 {
		t.Fatalf("ctr run: exit %d\n%s\n%s\ncontainerd:\n%s", r.code, r.stdout, r.stderr, c.tail())
	}
	if strings.TrimSpace(r.stdout) != "APP-OUT" || strings.TrimSpace(r.stderr) != "APP-ERR" {
		t.Errorf("container stdout %q, stderr %q; want exactly APP-OUT and APP-ERR", r.stdout, r.stderr)
	}
	if !has(relay.Calls(), "register "+id+" proxy") {
		t.Errorf("relay calls %q: want a proxy registration of %s", relay.Calls(), id)
	}
	logData := readFile(filepath.Join(dir, "kl.log"))
	if !strings.Contains(logData, "published rules directory unavailable") {
		t.Errorf("kl.log lacks kl-runtime's warning:\n%s", logData)
	}
}

func taskPid(t *testing.T, c *containerd, id string) int {
	t.Helper()
	out := c.ctr(t, "tasks", "ls").stdout
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == id {
			pid, err := strconv.Atoi(f[1])
			if err == nil {
				return pid
			}
		}
	}
	t.Fatalf("no task %s in:\n%s", id, out)
	return 0
}
