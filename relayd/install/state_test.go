package install

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Apply writes the state file before the file on install and removes it after the file
// on uninstall. An install --default or uninstall that stops in between (a crash, a
// full disk) leaves the original file beside the state file of an install. From there
// every next install or uninstall still ends with the original file and no state file.
func TestDefaultAfterCrash(t *testing.T) {
	editors := []struct {
		name, file, base string
		e                func(def bool) Editor
	}{
		{"docker runc", "daemon-minimal.json", "daemon.json", func(def bool) Editor { return Docker{Default: def} }},
		{"docker absent", "daemon.json", "daemon.json", func(def bool) Editor { return Docker{Default: def} }},
		{"containerd v2", "containerd-v2-default.toml", "config.toml", func(def bool) Editor { return Containerd{Default: def} }},
		{"containerd v3", "containerd-v3-default.toml", "config.toml", func(def bool) Editor { return Containerd{Default: def} }},
	}
	nexts := [][]string{
		{stepUninstall},
		{stepDefault, stepUninstall},
		{stepInstall, stepUninstall},
		{stepDefault, stepDefault, stepUninstall},
	}
	for _, ed := range editors {
		orig := read(t, ed.file)
		// The state file an install --default of orig writes.
		scratch := filepath.Join(t.TempDir(), ed.base)
		if err := os.WriteFile(scratch, orig, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Apply(scratch, ed.e(true), Options{NoBackup: true}); err != nil {
			t.Fatal(err)
		}
		state := mustRead(t, StatePath(scratch))
		for _, steps := range nexts {
			t.Run(ed.name+"/"+strings.Join(steps, ", "), func(t *testing.T) {
				path := filepath.Join(t.TempDir(), ed.base)
				if err := os.WriteFile(path, orig, 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(StatePath(path), state, 0o644); err != nil {
					t.Fatal(err)
				}
				for i, step := range steps {
					o := Options{Uninstall: step == stepUninstall, NoBackup: true}
					if _, err := Apply(path, ed.e(step == stepDefault), o); err != nil {
						t.Fatalf("step %d (%s): %v", i, step, err)
					}
				}
				if cur := mustRead(t, path); !bytes.Equal(cur, orig) {
					t.Errorf("not the original:\n%s", UnifiedDiff("original", "now", orig, cur))
				}
				if _, err := os.Stat(StatePath(path)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("state file left: %v", err)
				}
			})
		}
	}
}

// The state file describes the default runtime only while it names kl's runtime: one
// left over after the operator changed the default (or from an edit that stopped half
// way) is not applied, and goes; one of another kl runtime (--runtime-name) stays.
func TestStaleState(t *testing.T) {
	const (
		hdr = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n"
		kl  = "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kl]\n  runtime_type = \"io.containerd.runc.v2\"\n  pod_annotations = [\"kl.egress.mode\"]\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kl.options]\n  BinaryName = \"/usr/bin/kl-runtime\"\n"
	)
	cases := []struct {
		name            string
		e               Editor
		base            string // the file's name
		in, state, want string
		uninstall       bool
		keep            bool // the state file stays as it was
	}{
		{"docker/operator changed the default", Docker{}, "daemon.json", `{"default-runtime": "crun", "runtimes": {"kl": {"path": "/usr/bin/kl-runtime"}}}`, `{"runtime": "kl", "default-runtime": "runc"}`, `{"default-runtime": "crun"}`, true, false},
		{"docker/not installed", Docker{}, "daemon.json", `{"default-runtime": "runc"}`, `{"runtime": "kl", "default-runtime": ""}`, `{"default-runtime": "runc"}`, true, false},
		{"docker/install without default", Docker{}, "daemon.json", `{"default-runtime": "runc"}`, `{"runtime": "kl", "default-runtime": ""}`, `{"default-runtime": "runc", "runtimes": {"kl":{"path":"/usr/bin/kl-runtime"}}}`, false, false},
		{"docker/no state: default removed", Docker{}, "daemon.json", `{"default-runtime": "kl"}`, "", `{}`, true, false},
		{"docker/another runtime's default", Docker{}, "daemon.json", `{"default-runtime": "kl-gpu", "runtimes": {"kl-gpu": {"path": "/usr/bin/kl-runtime"}, "kl": {"path": "/usr/bin/kl-runtime"}}}`, `{"runtime": "kl-gpu", "default-runtime": "runc"}`, `{"default-runtime": "kl-gpu", "runtimes": {"kl-gpu": {"path": "/usr/bin/kl-runtime"}}}`, true, true},
		{"containerd/operator changed the default", Containerd{}, "config.toml", hdr + "  default_runtime_name = \"crun\"\n" + kl, `{"runtime": "kl"}`, hdr + "  default_runtime_name = \"crun\"\n", true, false},
		{"containerd/not installed", Containerd{}, "config.toml", hdr + "  default_runtime_name = \"runc\"\n", `{"runtime": "kl", "default-runtime": ""}`, hdr + "  default_runtime_name = \"runc\"\n", true, false},
		{"containerd/install without default", Containerd{}, "config.toml", hdr + "  default_runtime_name = \"runc\"\n" + kl, `{"runtime": "kl"}`, hdr + "  default_runtime_name = \"runc\"\n" + kl, false, false},
		{"containerd/no state: back to runc", Containerd{}, "config.toml", hdr + "  default_runtime_name = \"kl\"\n" + kl, "", hdr + "  default_runtime_name = \"runc\"\n", true, false},
		{"containerd/another runtime's default", Containerd{}, "config.toml", hdr + "  default_runtime_name = \"kl-gpu\"\n" + kl, `{"runtime": "kl-gpu", "default-runtime": "runc"}`, hdr + "  default_runtime_name = \"kl-gpu\"\n", true, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), tc.base)
			if err := os.WriteFile(path, []byte(tc.in), 0o644); err != nil {
				t.Fatal(err)
			}
			if tc.state != "" {
				if err := os.WriteFile(StatePath(path), []byte(tc.state), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := Apply(path, tc.e, Options{Uninstall: tc.uninstall, NoBackup: true}); err != nil {
				t.Fatal(err)
			}
			if got := mustRead(t, path); string(got) != tc.want {
				t.Errorf("%s:\n%s", tc.base, UnifiedDiff("want", "got", []byte(tc.want), got))
			}
			state, err := os.ReadFile(StatePath(path))
			switch {
			case tc.keep && string(state) != tc.state:
				t.Errorf("state file after the edit = %q, %v; want %s", state, err, tc.state)
			case !tc.keep && !errors.Is(err, fs.ErrNotExist):
				t.Errorf("state file after the edit: %q, %v; want it gone", state, err)
			}
		})
	}
}
