package runtime

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/kl-egress/kl/relayd/publish"
	"github.com/kl-egress/kl/tests/testutil"
)

// TestRuncRulesFollowPublish: with kl-relayd's published-rules directory present,
// kl-runtime mounts it read-only at /etc/kl, and a running container reads the rules
// published after it started (a file bind mount would keep showing the old ones). The
// directory holds nothing but the rules, and writing through the mount fails.
func TestRuncRulesFollowPublish(t *testing.T) {
	testutil.RequirePrivileged(t)
	testutil.RequireTool(t, "runc", "busybox")
	dir := t.TempDir()
	published := filepath.Join(dir, "published")
	v1 := rulesBody
	v2 := "# kl test rules, published later\ndefault: deny\n"
	if err := publish.Publish(published, []byte(v1)); err != nil {
		t.Fatal(err)
	}
	env, _ := klEnv(t, dir, "runtime: runc\nmode: env\npublishedRules: "+published+"\n")
	b := newBundle(t, dir, []string{"sleep", "60"}, func(s map[string]any) {
		// The workload's own mount at /etc/kl/rules.yaml is dropped for kl's.
		s["mounts"] = append(s["mounts"].([]any), map[string]any{
			"destination": "/etc/kl/rules.yaml", "type": "bind", "source": filepath.Join(dir, "runtime.yaml"), "options": toAny([]string{"rbind", "rw"}),
		})
	})
	root := filepath.Join(dir, "runc-root")
	rt := filepath.Join(bins(t), "kl-runtime")
	id := testutil.Name("klr")
	cleanupContainer(t, root, id)
	if r := run(t, env, rt, "--root", root, "run", "--detach", "--bundle", b, id); r.code != 0 {
		t.Fatalf("kl-runtime run: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	exec := func(args ...string) result {
		return run(t, nil, "runc", append([]string{"--root", root, "exec", id}, args...)...)
	}
	if r := exec("cat", "/etc/kl/rules.yaml"); r.code != 0 || r.stdout != v1 {
		t.Fatalf("rules at start: exit %d, %q, stderr %s", r.code, r.stdout, r.stderr)
	}
	if err := publish.Publish(published, []byte(v2)); err != nil {
		t.Fatal(err)
	}
	if r := exec("cat", "/etc/kl/rules.yaml"); r.code != 0 || r.stdout != v2 {
		t.Fatalf("rules after a publish: exit %d, %q, want %q; stderr %s", r.code, r.stdout, v2, r.stderr)
	}
	r := exec("sh", "-c", "if echo x >> /etc/kl/rules.yaml; then echo WRITE-OK; else echo WRITE-FAILED; fi; "+
		"if echo x > /etc/kl/extra; then echo CREATE-OK; else echo CREATE-FAILED; fi; ls -a /etc/kl; grep ' /etc/kl ' /proc/self/mounts")
	if m := contains(r.stdout, "WRITE-FAILED", "CREATE-FAILED", "..data\n", "rules.yaml\n", " ro,nosuid,nodev,noexec"); len(m) > 0 {
		t.Errorf("container output lacks %q:\n%s\nstderr: %s", m, r.stdout, r.stderr)
	}
	for _, line := range strings.Fields(r.stdout) {
		if strings.HasSuffix(line, ".yaml") && line != "rules.yaml" {
			t.Errorf("/etc/kl in the container holds %s:\n%s", line, r.stdout)
		}
	}
	if got, _ := publish.Read(published); string(got) != v2 {
		t.Errorf("the container changed the published rules: %q", got)
	}
}
