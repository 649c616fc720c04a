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
