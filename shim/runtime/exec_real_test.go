package runtime

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kl-egress/kl/shim/config"
	"github.com/kl-egress/kl/shim/workload"
	"github.com/kl-egress/kl/tests/testutil"
)

// With the real runc: a container created from a spec kl edited, then a process exec'd
// the way containerd does it (a process file built from a spec without kl's variables)
// sees the variables once PrepareExec, finding the container through `runc state`, has
// edited the file.
func TestExecRealRunc(t *testing.T) {
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "runc", "busybox")
	dir := t.TempDir()
	bundle, root := filepath.Join(dir, "bundle"), filepath.Join(dir, "root")
	if err := os.MkdirAll(filepath.Join(bundle, "rootfs", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	bb, _ := exec.LookPath("busybox")
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "rootfs", "bin", "busybox"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, "runc", "spec", "--bundle", bundle)
	var spec map[string]any
	raw, _ := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	proc := spec["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = []string{"/bin/busybox", "sleep", "60"}
	spec["annotations"] = map[string]string{"kl.egress.mode": "env"}
	raw, _ = json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}

	cfg := testConfig(t, "mode: transparent\nenv:\n  httpProxy: http://corp.example:3128\n")
	cfg.Rules = "-"
	dockerFrom = func(*config.Config) workload.Lookup { return nil }
	id := testutil.Name("klexec")
	if err := Prepare(context.Background(), cfg, Invocation{Command: "create", ContainerID: id, Bundle: bundle}, nil, config.Discard()); err != nil {
		t.Fatal(err)
	}
	// The container's stdio must not be a pipe the test waits on.
	if err := exec.Command("runc", "--root", root, "run", "--detach", "--bundle", bundle, id).Run(); err != nil {
		t.Fatalf("runc run: %v", err)
	}
	t.Cleanup(func() { exec.Command("runc", "--root", root, "delete", "--force", id).Run() })

	pf := filepath.Join(dir, "runc-process")
	if err := os.WriteFile(pf, []byte(`{"args":["/bin/busybox","env"],"env":["PATH=/bin"],"cwd":"/","user":{"uid":0,"gid":0}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := PrepareExec(context.Background(), cfg, "runc", Invocation{Command: "exec", Root: root, ContainerID: id, ProcessFile: pf}, nil, config.Discard()); err != nil {
		t.Fatal(err)
	}
	out := testutil.Run(t, "runc", "--root", root, "exec", "--process", pf, id)
	for _, want := range []string{"HTTP_PROXY=http://corp.example:3128", "http_proxy=http://corp.example:3128", "NODE_USE_ENV_PROXY=1"} {
		if !strings.Contains(out, want) {
			t.Errorf("exec'd process env lacks %s:\n%s", want, out)
		}
	}
}
