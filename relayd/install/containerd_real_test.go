package install

import (
	"os"
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

// The real containerd reads a config after install --default with kl as its default
// runtime, and after uninstall with runc again (its own default when the key was absent,
// or the whole [….containerd] table).
func TestContainerdReadsDefault(t *testing.T) {
	testutil.RequireTool(t, "containerd")
	dump := func(t *testing.T, path string) string {
		t.Helper()
		out, err := exec.Command("containerd", "--config", path, "config", "dump").CombinedOutput()
		if err != nil {
			t.Fatalf("containerd config dump: %v\n%s", err, out)
		}
		m := regexp.MustCompile(`(?m)^\s*default_runtime_name = "([^"]*)"`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("no default_runtime_name in containerd's dump of %s:\n%s", path, out)
		}
		return string(m[1])
	}
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"runc", read(t, "containerd-v2-default.toml")},
		{"absent", priorDefault(t, read(t, "containerd-v2-default.toml"), "absent")},
		{"no containerd table", read(t, "containerd-v2-minimal.toml")},
		{"version only", []byte("version = 2\n")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.toml")
			if err := os.WriteFile(path, tc.in, 0o644); err != nil {
				t.Fatal(err)
			}
			steps := []struct {
				e    Containerd
				o    Options
				want string
			}{
				{Containerd{Default: true}, Options{NoBackup: true}, "kl"},
				{Containerd{}, Options{Uninstall: true, NoBackup: true}, "runc"},
			}
			for i, s := range steps {
				if _, err := Apply(path, s.e, s.o); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if got := dump(t, path); got != s.want {
					t.Errorf("step %d: containerd's default_runtime_name = %q, want %q", i, got, s.want)
				}
			}
		})
	}
}
