package runtime

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	toml "github.com/pelletier/go-toml/v2"

	"github.com/kl-egress/kl/tests/testutil"
)

// snippet returns a packaging file's content with /usr/bin/kl-runtime replaced by the
// binary under test: the one change the tests make to the shipped files.
func snippet(t *testing.T, rel string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testutil.ModuleRoot(t), "packaging", rel))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "/usr/bin/kl-runtime") {
		t.Fatalf("packaging/%s does not name /usr/bin/kl-runtime", rel)
	}
	return strings.ReplaceAll(string(data), "/usr/bin/kl-runtime", filepath.Join(bins(t), "kl-runtime"))
}

// containerdRuntime reads runtime_type and options.BinaryName of the runtime "kl" from a
// containerd config snippet, under the CRI plugin key of its config version.
func containerdRuntime(t *testing.T, text string) (runtimeType, binary string) {
	t.Helper()
	var doc map[string]any
	if err := toml.Unmarshal([]byte(text), &doc); err != nil {
		t.Fatalf("containerd snippet: %v", err)
	}
	plugin := map[int64]string{2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}[doc["version"].(int64)]
	get := func(m any, k string) any {
		mm, ok := m.(map[string]any)
		if !ok {
			t.Fatalf("containerd snippet: no table %q", k)
		}
		return mm[k]
	}
	kl := get(get(get(get(get(doc, "plugins"), plugin), "containerd"), "runtimes"), "kl")
	rt, _ := get(kl, "runtime_type").(string)
	bin, _ := get(get(kl, "options"), "BinaryName").(string)
	return rt, bin
}

// daemon is a process the test started; stop ends it by PID.
type daemon struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startDaemon(t *testing.T, logPath string, env []string, name string, args ...string) *daemon {
	t.Helper()
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	lf.Close()
	d := &daemon{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { cmd.Wait(); close(d.done) }()
	return d
}

// stop sends SIGTERM, then SIGKILL after timeout, to the daemon's PID only.
func (d *daemon) stop(timeout time.Duration) {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(timeout):
		_ = d.cmd.Process.Kill()
		<-d.done
	}
}

func (d *daemon) tail() string {
	data, _ := os.ReadFile(d.log)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(data)
}

// containerd is a containerd started for one test.
type containerd struct {
	*daemon
	Dir, Address string
}

// startContainerd runs Debian's containerd with root, state and sockets under dir, the
// CRI plugin disabled, and the packaging snippet imported (so containerd itself parses
// it). env reaches kl-runtime through containerd and its shims.
func startContainerd(t *testing.T, dir string, env []string) *containerd {
	t.Helper()
	testutil.RequireTool(t, "containerd", "ctr", "containerd-shim-runc-v2")
	snip := filepath.Join(dir, "kl-runtime-v2.toml")
	if err := os.WriteFile(snip, []byte(snippet(t, "containerd/kl-runtime-v2.toml")), 0o644); err != nil {
		t.Fatal(err)
	}
	c := &containerd{Dir: dir, Address: filepath.Join(dir, "containerd.sock")}
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
imports = [%q]

[grpc]
  address = %q

[ttrpc]
  address = %q

[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), snip, c.Address, c.Address+".ttrpc", filepath.Join(dir, "opt"))
	cfgPath := filepath.Join(dir, "containerd.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	c.daemon = startDaemon(t, filepath.Join(dir, "containerd.log"), env, "containerd", "--config", cfgPath)
	t.Cleanup(func() {
		// Tasks first (their shims would outlive containerd), then containerd, then
		// whatever is still mounted under the test's directory.
		for _, ns := range []string{"kltest", "moby"} {
			out, _ := testutil.Output("ctr", "-a", c.Address, "-n", ns, "tasks", "ls", "-q")
			for _, id := range strings.Fields(out) {
				testutil.Output("ctr", "-a", c.Address, "-n", ns, "tasks", "kill", "-s", "KILL", id)
				time.Sleep(100 * time.Millisecond)
				testutil.Output("ctr", "-a", c.Address, "-n", ns, "tasks", "delete", "-f", id)
			}
		}
		c.stop(10 * time.Second)
		testutil.KillShims(c.Address)
		testutil.RemoveEmptyCgroups("kltest")
		for _, err := range testutil.UnmountUnder(dir) {
			t.Log(err)
		}
	})
	if !waitFor(20*time.Second, func() bool {
		_, err := testutil.Output("ctr", "-a", c.Address, "version")
		return err == nil
	}) {
		t.Fatalf("containerd did not come up:\n%s", c.tail())
	}
	return c
}

// ctr runs ctr against this containerd in namespace kltest.
func (c *containerd) ctr(t *testing.T, args ...string) result {
	t.Helper()
	return run(t, nil, "ctr", append([]string{"-a", c.Address, "-n", "kltest"}, args...)...)
}
