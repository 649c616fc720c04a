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

// install --default remembers the default-runtime it replaces (beside daemon.json, in
// StatePath) and uninstall puts exactly that back: the file is byte for byte what it
// was, however many times kl was installed in between. The installed daemon.json and
// state file are golden, per prior default.
func TestDockerDefaultRestore(t *testing.T) {
	cases := []struct {
		name  string
		prior string // the golden: the default-runtime install --default replaces
		file  string
		steps []string
	}{
		{"prior-runc", "runc", "daemon-minimal.json", []string{stepDefault, stepUninstall}},
		{"prior-absent", "absent", "daemon.json", []string{stepDefault, stepUninstall}},
		{"prior-empty", "empty", "daemon-default-empty.json", []string{stepDefault, stepUninstall}},
		{"reinstall-twice", "runc", "daemon-minimal.json", []string{stepDefault, stepDefault, stepDefault, stepUninstall}},
		{"reinstall-without-default", "runc", "daemon-minimal.json", []string{stepDefault, stepInstall, stepUninstall}},
		{"reinstall-twice-absent", "absent", "daemon.json", []string{stepDefault, stepDefault, stepDefault, stepUninstall}},
		{"uninstall-twice", "runc", "daemon-minimal.json", []string{stepDefault, stepUninstall, stepUninstall}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "daemon.json")
			restoreSteps(t, path, read(t, tc.file), "docker-state/prior-"+tc.prior+".installed", tc.steps,
				func(def bool) Editor { return Docker{Default: def} })
		})
	}
}

// The steps of a restoreSteps run.
const (
	stepDefault   = "install --default"
	stepInstall   = "install"
	stepUninstall = "uninstall"
)

// restoreSteps writes orig to path and applies steps to it, the first an install (with
// or without --default), with the editor newEditor(step is install --default). The file
// and state file after the first are golden (name); every later install leaves both as
// they are, and every uninstall gives back orig, with no state file. Nothing but path
// (and its lock file) is left in its directory.
func restoreSteps(t *testing.T, path string, orig []byte, name string, steps []string, newEditor func(def bool) Editor) {
	t.Helper()
	if err := os.WriteFile(path, orig, 0o644); err != nil {
		t.Fatal(err)
	}
	var first []byte // path and its state file after the first install
	for i, step := range steps {
		o := Options{Uninstall: step == stepUninstall, NoBackup: true}
		if _, err := Apply(path, newEditor(step == stepDefault), o); err != nil {
			t.Fatalf("step %d (%s): %v", i, step, err)
		}
		cur := mustRead(t, path)
		state, err := os.ReadFile(StatePath(path))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		if state == nil {
			state = []byte("(none)\n")
		}
		got := append(append(bytes.Clone(cur), "--- "+filepath.Base(StatePath(path))+"\n"...), state...)
		switch {
		case i == 0:
			if step == stepUninstall {
				t.Fatalf("step 0 is %s, want an install", step)
			}
			golden(t, name, got)
			first = got
		case step == stepUninstall:
			if want := append(append(bytes.Clone(orig), "--- "+filepath.Base(StatePath(path))+"\n"...), "(none)\n"...); !bytes.Equal(got, want) {
				t.Errorf("step %d (%s) did not give back the original:\n%s", i, step, UnifiedDiff("original", "uninstalled", want, got))
			}
		case !bytes.Equal(got, first):
			t.Errorf("step %d (%s) changed the installed file or its state:\n%s", i, step, UnifiedDiff("first", "now", first, got))
		}
	}
	if ents, _ := readConfigDir(filepath.Dir(path)); len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("files left beside %s: %q, want none", filepath.Base(path), names)
	}
}

// install --default into a daemon.json (and directory) that does not exist yet records
// that there was no default-runtime, and that it created the file and its directory;
// uninstall removes the file again (its backup stays, and so the directory).
func TestDockerDefaultCreated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "docker", "daemon.json")
	if _, err := Apply(path, Docker{Default: true}, Options{}); err != nil {
		t.Fatal(err)
	}
	want := "{\n  \"runtime\": \"kl\",\n  \"created\": true,\n  \"created-dir\": \"" + filepath.Dir(path) + "\"\n}\n"
	if got := string(mustRead(t, StatePath(path))); got != want {
		t.Errorf("state = %q, want %q", got, want)
	}
	ch, err := Apply(path, Docker{}, Options{Uninstall: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) || !ch.Removed || ch.Backup == "" {
		t.Errorf("daemon.json after uninstall: %v, Removed %v, Backup %q; want it removed, with a backup", err, ch.Removed, ch.Backup)
	}
	if _, err := os.Stat(StatePath(path)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("state file after uninstall: %v, want it gone", err)
	}
}

// An empty "runtimes" object that was there before install is there after uninstall, and
// kl's runtime goes into it indented one level deeper than "runtimes" (the golden files).
// Only a "runtimes" install added is taken out.
func TestDockerEmptyRuntimes(t *testing.T) {
	cases := []struct {
		name  string
		in    string
		steps []string
	}{
		{"empty-runtimes", string(read(t, "daemon-empty-runtimes.json")), []string{stepInstall, stepInstall, stepUninstall, stepUninstall}},
		{"empty-runtimes-default", string(read(t, "daemon-empty-runtimes.json")), []string{stepDefault, stepInstall, stepDefault, stepUninstall}},
		{"empty-runtimes-compact", `{"debug": true, "runtimes": {}}`, []string{stepInstall, stepUninstall}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "daemon.json")
			restoreSteps(t, path, []byte(tc.in), "docker-state/"+tc.name+".installed", tc.steps,
				func(def bool) Editor { return Docker{Default: def} })
		})
	}
}

// A state file kl cannot read is named, and nothing is written.
func TestDockerBadState(t *testing.T) {
	for _, state := range []string{`[]`, `{"runtime": "kl", "default-runtime": 5}`, `{"runtime": "kl", "default-runtime": "crun"}`, `{"runtime": "kl", "prior": "runc"}`, `{"default-runtime": "runc"}`, `{`} {
		t.Run(state, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "daemon.json")
			in := []byte(`{"default-runtime": "kl", "runtimes": {"kl": {"path": "/usr/bin/kl-runtime"}}}`)
			if err := os.WriteFile(path, in, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(StatePath(path), []byte(state), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Apply(path, Docker{}, Options{Uninstall: true, NoBackup: true})
			if err == nil || !strings.Contains(err.Error(), StatePath(path)) {
				t.Errorf("Apply error = %v, want one naming %s", err, StatePath(path))
			}
			if got := mustRead(t, path); !bytes.Equal(got, in) {
				t.Errorf("daemon.json written despite the error: %s", got)
			}
		})
	}
}
