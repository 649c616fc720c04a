package install

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/kl-egress/kl/tests/testutil"
)

// The installed configs are read by the real containerd (Debian's 1.x understands the
// version 1 and 2 layouts), which must see kl's runtime with kl-runtime as its binary and
// the mode annotation allow-listed for pods.
func TestContainerdReadsInstalledConfig(t *testing.T) {
	testutil.RequireTool(t, "containerd")
	want := regexp.MustCompile(`(?s)\.containerd\.runtimes\.kl\]\n(?:\s*[a-z_]+ = [^\n]*\n)*?\s*pod_annotations = \["kl\.egress\.mode"\]\n.*?\.containerd\.runtimes\.kl\.options\]\s*\n\s*BinaryName = "/usr/bin/kl-runtime"`)
	for _, name := range []string{"containerd-v1", "containerd-v2", "containerd-v2-kubeadm", "containerd-v2-minimal"} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join("testdata", "golden", name+".installed")
			out, err := exec.Command("containerd", "--config", path, "config", "dump").CombinedOutput()
			if err != nil {
				t.Fatalf("containerd config dump: %v\n%s", err, out)
			}
			if !want.Match(out) {
				t.Errorf("containerd does not see kl's runtime in %s:\n%s", path, out)
			}
		})
	}
}
