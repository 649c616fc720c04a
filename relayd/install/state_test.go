package install

import (
	"bytes"
	"encoding/json"
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

// A file install created (and the directories it made for it) is recorded in the state
// file, and uninstall removes it again once nothing but what install started it with is
// left: daemon.json's "{}", config.toml's "version = N". A directory goes only when it
// holds nothing else (a backup of the file keeps it); a file the operator has put
// something in since stays.
func TestCreatedFile(t *testing.T) {
	cases := []struct {
		name     string
		base     string   // path below the test's directory
		e        Editor   // installs, with --default when the step says so
		steps    []string // after them, uninstall with backups as o says
		backup   bool     // keep backups
		existing bool     // the file's directory exists before install
		edit     string   // written over the installed file by the operator ("" none)
		wantFile string   // the file after uninstall; "" removed
		wantDir  bool     // the directory is still there after uninstall
	}{
		{name: "docker", base: "etc/docker/daemon.json", e: Docker{}, steps: []string{stepInstall, stepInstall}},
		{name: "docker default", base: "etc/docker/daemon.json", e: Docker{}, steps: []string{stepDefault, stepInstall}},
		{name: "docker in existing dir", base: "daemon.json", e: Docker{}, steps: []string{stepInstall}, existing: true, wantDir: true},
		{name: "docker with backups", base: "etc/docker/daemon.json", e: Docker{}, steps: []string{stepInstall}, backup: true, wantDir: true},
		{name: "docker edited since", base: "etc/docker/daemon.json", e: Docker{}, steps: []string{stepInstall},
			edit: "{\n  \"debug\": true,\n  \"runtimes\": {\n    \"kl\": {\n      \"path\": \"/usr/bin/kl-runtime\"\n    }\n  }\n}\n", wantFile: "{\n  \"debug\": true\n}\n", wantDir: true},
		{name: "containerd v3", base: "etc/containerd/config.toml", e: Containerd{Version: 3}, steps: []string{stepInstall, stepInstall}},
		{name: "containerd v2 default", base: "etc/containerd/config.toml", e: Containerd{Version: 2}, steps: []string{stepDefault, stepDefault}},
		{name: "containerd edited since", base: "etc/containerd/config.toml", e: Containerd{Version: 3}, steps: []string{stepInstall},
			edit:     "version = 3\nroot = \"/srv/containerd\"\n\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.kl]\n  runtime_type = \"io.containerd.runc.v2\"\n",
			wantFile: "version = 3\nroot = \"/srv/containerd\"\n", wantDir: true},
	}
	withDefault := func(e Editor, def bool) Editor {
		switch e := e.(type) {
		case Docker:
			e.Default = def
			return e
		case Containerd:
			e.Default = def
			return e
		}
		return e
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			path := filepath.Join(root, tc.base)
			if tc.existing {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for i, step := range tc.steps {
				if _, err := Apply(path, withDefault(tc.e, step == stepDefault), Options{NoBackup: !tc.backup}); err != nil {
					t.Fatalf("step %d (%s): %v", i, step, err)
				}
			}
			if tc.edit != "" {
				if err := os.WriteFile(path, []byte(tc.edit), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var st defaultState
			if err := json.Unmarshal(mustRead(t, StatePath(path)), &st); err != nil || !st.Created {
				t.Fatalf("state file %+v, %v: want it to record that install created the file", st, err)
			}
			ch, err := Apply(path, withDefault(tc.e, false), Options{Uninstall: true, NoBackup: !tc.backup})
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			switch {
			case tc.wantFile == "" && (!errors.Is(err, fs.ErrNotExist) || !ch.Removed):
				t.Errorf("after uninstall the file holds %q (%v), Removed %v; want it removed", got, err, ch.Removed)
			case tc.wantFile != "" && (string(got) != tc.wantFile || ch.Removed):
				t.Errorf("after uninstall the file is %q (%v), Removed %v; want %q", got, err, ch.Removed, tc.wantFile)
			}
			if _, err := os.Stat(StatePath(path)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("state file after uninstall: %v, want it gone", err)
			}
			_, err = os.Stat(filepath.Dir(path))
			if dir := err == nil; dir != tc.wantDir {
				t.Errorf("directory %s there after uninstall = %v, want %v", filepath.Dir(path), dir, tc.wantDir)
			}
			if !tc.wantDir {
				// Every directory install made (etc/ too) is gone, and only those.
				if ents, err := os.ReadDir(root); err != nil || len(ents) != 0 {
					var names []string
					for _, e := range ents {
						names = append(names, e.Name())
					}
					t.Errorf("left in %s: %q, %v; want nothing", root, names, err)
				}
			}
		})
	}
}
