package ctl

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstall runs kl-ctl install/uninstall --dry-run on a copy of a flannel conflist with
// a fake kl-cni that answers CNI VERSION: a diff is printed and nothing is written.
func TestInstall(t *testing.T) {
	src, err := os.ReadFile("testdata/cni/10-flannel.conflist")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
	}{
		{"install-cni-dry-run", []string{"install", "cni", "--dry-run"}},
		{"uninstall-cni-dry-run", []string{"uninstall", "cni", "--dry-run"}},
		{"install-unknown-target", []string{"install", "podman"}},
		{"install-no-target", []string{"install"}},
		// Command-line mistakes exit 2, each said once (the flag package prints its own).
		{"install-unknown-flag", []string{"install", "containerd", "--bogus"}},
		{"uninstall-extra-argument", []string{"uninstall", "docker", "extra"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			netd := filepath.Join(dir, "net.d")
			if err := os.MkdirAll(netd, 0o755); err != nil {
				t.Fatal(err)
			}
			conf := filepath.Join(netd, "10-flannel.conflist")
			if err := os.WriteFile(conf, src, 0o644); err != nil {
				t.Fatal(err)
			}
			plugin := filepath.Join(dir, "kl-cni")
			script := "#!/bin/sh\n[ \"$CNI_COMMAND\" = VERSION ] || exit 1\necho '{\"cniVersion\":\"1.0.0\",\"supportedVersions\":[\"0.3.1\",\"1.0.0\",\"1.1.0\"]}'\n"
			if err := os.WriteFile(plugin, []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
			args := tt.args
			if len(args) > 1 && args[1] == "cni" {
				args = append(args, "--cni-conf-dir", netd, "--cni-binary", plugin)
			}
			var stdout, stderr bytes.Buffer
			env := &Env{Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }}
			err := RunEnv(context.Background(), env, append([]string{"kl-ctl"}, args...))
			got := fmt.Sprintf("$ kl-ctl %s\nexit status %d\n--- stdout\n%s--- stderr\n%s", strings.Join(args, " "), ExitStatus(err), stdout.String(), stderr.String())
			checkGolden(t, tt.name, strings.ReplaceAll(got, dir, "DIR"))
			if after, _ := os.ReadFile(conf); !bytes.Equal(after, src) {
				t.Errorf("--dry-run changed %s:\n%s", conf, after)
			}
			if tt.name == "install-cni-dry-run" && !strings.Contains(stdout.String(), `+      "type": "kl-cni"`) {
				t.Errorf("no diff adding kl-cni:\n%s", stdout.String())
			}
		})
	}
}
