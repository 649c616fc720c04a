package runtime

import (
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

// dockerd is a dockerd started for one test, on its own containerd.
type dockerd struct {
	*daemon
	Host string // unix://…
}

// startDockerd runs Debian's dockerd with data-root, exec-root, pidfile and socket under
// dir, no iptables and no bridge, the vfs storage driver, the containerd c, and
// packaging/docker/daemon.json (kl-runtime's path set to the binary under test) as its
// config file.
func startDockerd(t *testing.T, dir string, c *containerd) *dockerd {
	t.Helper()
	testutil.RequireTool(t, "dockerd", "docker")
	daemonJSON := filepath.Join(dir, "daemon.json")
	if err := os.WriteFile(daemonJSON, []byte(snippet(t, "docker/daemon.json")), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "docker.sock")
	d := &dockerd{Host: "unix://" + sock}
	d.daemon = startDaemon(t, filepath.Join(dir, "dockerd.log"), nil, "dockerd",
		"--config-file", daemonJSON,
		"--data-root", filepath.Join(dir, "docker-data"),
		"--exec-root", filepath.Join(dir, "dx"),
		"--pidfile", filepath.Join(dir, "docker.pid"),
		"-H", d.Host,
		"--containerd", c.Address,
		"--iptables=false", "--ip-masq=false", "--bridge=none",
		"--storage-driver", "vfs",
		"--exec-opt", "native.cgroupdriver=cgroupfs")
	t.Cleanup(func() {
		out, _ := testutil.Output("docker", "-H", d.Host, "ps", "-aq")
		for _, id := range strings.Fields(out) {
			testutil.Output("docker", "-H", d.Host, "rm", "-f", id)
		}
		d.stop(20 * time.Second)
	})
	if !waitFor(30*time.Second, func() bool {
		_, err := testutil.Output("docker", "-H", d.Host, "version")
		return err == nil
	}) {
		t.Fatalf("dockerd did not come up:\n%s", d.tail())
	}
	return d
}

func (d *dockerd) docker(t *testing.T, args ...string) result {
	t.Helper()
	return run(t, nil, "docker", append([]string{"-H", d.Host}, args...)...)
}

// TestDockerRun runs containers with `docker run --runtime kl` on a dockerd the test
// starts: a Docker label picks proxy mode (read through the Docker API while dockerd is
// creating the container), the rules file is read-only inside, and the hook registers
// the container with its labels and normalized image; a transparent-mode container gets
// the capture table; a container run without kl gets nothing.
func TestDockerRun(t *testing.T) {
	t.Parallel() // each test has its own daemons, directories and names
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "busybox", "runc", "nft")
	dir := t.TempDir()
	sock := filepath.Join(dir, "docker.sock")
	env, relay := klEnv(t, dir, fmt.Sprintf("runtime: runc\nmode: transparent\ndockerSocket: %s\n", sock))
	c := startContainerd(t, dir, env)
	d := startDockerd(t, dir, c)

	img := filepath.Join(dir, "image.tar")
	buildImage(t, img)
	if r := d.docker(t, "load", "-i", img); r.code != 0 || !strings.Contains(r.stdout, imageTag) {
		t.Fatalf("docker load: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	script := `env; echo ---; cat /etc/kl/rules.yaml; if echo x >> /etc/kl/rules.yaml; then echo WRITE-OK; else echo WRITE-FAILED; fi`
	name := testutil.Name("kld")
	r := d.docker(t, "run", "--rm", "--name", name, "--runtime", "kl", "--network", "none",
		"--label", "kl.egress.mode=proxy", "--label", "kl.route=proxy", imageTag, "sh", "-c", script)
	if r.code != 0 {
		t.Fatalf("docker run: exit %d\n%s\n%s\ndockerd:\n%s", r.code, r.stdout, r.stderr, d.tail())
	}
	if m := contains(r.stdout, "HTTP_PROXY=http://127.0.0.1:15080", "http_proxy=http://127.0.0.1:15080",
		"ALL_PROXY=socks5h://127.0.0.1:15081", "NODE_USE_ENV_PROXY=1", rulesBody, "WRITE-FAILED"); len(m) > 0 {
		t.Errorf("container output lacks %q:\n%s", m, r.stdout)
	}
	var reg api.Registration
	for _, call := range relay.Calls() {
		if strings.HasPrefix(call, "register ") && strings.HasSuffix(call, " proxy") {
			reg.Workload.ID = strings.Fields(call)[1]
		}
	}
	if reg.Workload.ID == "" {
		t.Fatalf("no proxy registration; calls %q\nkl log:\n%s", relay.Calls(), readFile(filepath.Join(dir, "kl.log")))
	}
	logData := readFile(filepath.Join(dir, "kl.log"))
	if m := contains(logData, `"engine":"docker"`, `"image":"`+imageNorm+`"`, `"mode_from":"label"`); len(m) > 0 {
		t.Errorf("kl log lacks %q:\n%s", m, logData)
	}
	if !has(relay.Calls(), "deregister "+reg.Workload.ID) {
		t.Errorf("not deregistered after --rm; calls %q", relay.Calls())
	}

	// Transparent (node default): capture in the container's netns, labels and image
	// in the registration.
	name2 := testutil.Name("kld")
	r = d.docker(t, "run", "-d", "--name", name2, "--runtime", "kl", "--network", "none", "--label", "team=web", imageTag, "sleep", "60")
	if r.code != 0 {
		t.Fatalf("docker run -d: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	id := strings.TrimSpace(r.stdout)
	reg2, ok := relay.Registered(id)
	if !ok || reg2.Workload.Mode != api.ModeTransparent || reg2.Workload.Labels["team"] != "web" ||
		reg2.Workload.Image != imageNorm || reg2.Workload.Name != name2 {
		t.Fatalf("registration of %s = %+v, %v", id, reg2.Workload, ok)
	}
	t.Logf("annotations dockerd put in the spec: %v (labels come from the Docker API: %v)", reg2.Workload.Annotations, reg2.Workload.Labels)
	pid, _ := strconv.Atoi(strings.TrimSpace(d.docker(t, "inspect", "-f", "{{.State.Pid}}", id).stdout))
	want := netns.Capture{RedirectPort: api.DefaultRedirectPort, Mark: api.DefaultMark, IPv6: true, RejectQUIC: true}
	if err := netns.Verify(fmt.Sprintf("/proc/%d/ns/net", pid), want); err != nil {
		t.Errorf("capture in the docker container's netns: %v", err)
	}
	if r := d.docker(t, "rm", "-f", id); r.code != 0 {
		t.Errorf("docker rm: %s", r.stderr)
	}
	if !waitFor(10*time.Second, func() bool { _, still := relay.Registered(id); return !still }) {
		t.Errorf("%s still registered after docker rm; calls %q", id, relay.Calls())
	}

	t.Run("traffic", func(t *testing.T) {
		testDockerTraffic(t, dir, strings.TrimPrefix(env[0], "KL_RUNTIME_CONFIG="), d)
	})

	// Without --runtime kl nothing of kl is there.
	before := len(relay.Calls())
	r = d.docker(t, "run", "--rm", "--network", "none", imageTag, "sh", "-c", "env; ls /etc/kl 2>&1; true")
	if r.code != 0 || strings.Contains(r.stdout, "HTTP_PROXY") || strings.Contains(r.stdout, "rules.yaml") || len(relay.Calls()) != before {
		t.Errorf("plain runc container: exit %d, output %s, relay calls %q", r.code, r.stdout, relay.Calls()[before:])
	}
}

// testDockerTraffic sends real flows from two kl containers through the real kl-relayd:
// one labelled kl.route=proxy, whose flow the label rule sends to a squid upstream on a
// test host, and one without the label, whose flow goes direct. Each container gets a
// veth to the test host (its own /30); squid and an HTTP server live there.
func testDockerTraffic(t *testing.T, dir, cfgPath string, d *dockerd) {
	testutil.RequireTool(t, "squid", "nsenter")
	world := startWorld(t, dir)
	sq := startSquid(t, world)
	rl := startRelayd(t, dir, "http://192.0.2.1:3128")
	cfg := readFile(cfgPath)
	os.WriteFile(cfgPath, []byte(strings.Replace(cfg, "relaySocket: ", "relaySocket: "+rl.Socket+"\n# fake: ", 1)), 0o644)
	if r := run(t, nil, filepath.Join(bins(t), "kl-hook"), "--config", cfgPath, "check"); r.code != 0 ||
		len(contains(r.stdout, "ok   relay    "+rl.Socket, "ok   docker   "+filepath.Join(dir, "docker.sock"), "ok   runtime")) > 0 {
		t.Errorf("kl-hook check against the real relay and dockerd: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	start := func(net int, labels ...string) (id string) {
		args := []string{"run", "-d", "--runtime", "kl", "--network", "none"}
		for _, l := range labels {
			args = append(args, "--label", l)
		}
		r := d.docker(t, append(args, imageTag, "sleep", "120")...)
		if r.code != 0 {
			t.Fatalf("docker run -d: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
		}
		id = strings.TrimSpace(r.stdout)
		linkToWorld(t, world, strings.TrimSpace(d.docker(t, "inspect", "-f", "{{.State.Pid}}", id).stdout), net)
		return id
	}
	fetch := func(id, addr string) result {
		return d.docker(t, "exec", id, "sh", "-c", httpGet(addr, "8080", "/index.html"))
	}
	labelled := start(0, "kl.route=proxy")
	plain := start(4)

	r := fetch(labelled, "192.0.2.1")
	if r.code != 0 || !strings.HasSuffix(r.stdout, "\r\n\r\nhello-kl\n") {
		t.Fatalf("labelled container's fetch: exit %d %q %s\nsquid:\n%s\nrelay:\n%s", r.code, r.stdout, r.stderr, readFile(filepath.Join(sq, "access.log")), rl.tail())
	}
	if !waitFor(5*time.Second, func() bool { return strings.Contains(readFile(filepath.Join(sq, "access.log")), "192.0.2.1:8080") }) {
		t.Errorf("squid did not carry the labelled flow; access.log:\n%s\nrelay:\n%s", readFile(filepath.Join(sq, "access.log")), rl.tail())
	}
	r = fetch(plain, "192.0.2.5")
	if r.code != 0 || !strings.HasSuffix(r.stdout, "\r\n\r\nhello-kl\n") {
		t.Fatalf("plain container's fetch: exit %d %q %s\nrelay:\n%s", r.code, r.stdout, r.stderr, rl.tail())
	}
	if strings.Contains(readFile(filepath.Join(sq, "access.log")), "192.0.2.5") {
		t.Errorf("the unlabelled flow went through squid")
	}
	if l := rl.decision(labelled); !strings.Contains(l, "exit=proxy") || !strings.Contains(l, "dimension=label") {
		t.Errorf("labelled flow's decision = %q, want exit proxy by dimension label", l)
	}
	// The plain flow is direct by default: the kernel fast path may decide it (no relay log
	// line then), so its audit record is what proves the decision.
	if !rl.recorded(t, "label", "proxy") || !rl.recorded(t, "default", "direct") {
		t.Errorf("relay status lacks the label/proxy and default/direct audit records: %+v", rl.status(t).Recent)
	}
	for _, id := range []string{labelled, plain} {
		d.docker(t, "rm", "-f", id)
	}
}

func readFile(p string) string {
	data, _ := os.ReadFile(p)
	return string(data)
}
